//! The kill switch (SPEC §5.8): `postern agents suspend|resume ID`. A suspended agent's new
//! requests and SSH execs are `AGENT_SUSPENDED` before anything is sent, its held approvals
//! are denied, the action is journaled (`operator_attested`) and survives a restart.

use std::time::Duration;

use serde_json::Value;

use crate::origins::{self, Origin};
use crate::ssh::{Front, TOKEN as SSH_TOKEN, envelope};
use crate::support::{Daemon, Home, TEST_CONFIG, curl, get_json, stderr, stdout};

const TOKENS: [(&str, &str); 2] = [
    ("a", "tok-a-0123456789abcdef"),
    ("b", "tok-b-0123456789abcdef"),
];
const ADMIN_TOKEN: &str = "kill-switch-admin-token-0123456789";

fn config(port: u16) -> String {
    let admin = "[admin]\nlisten = \"127.0.0.1:0\"";
    let mut text = TEST_CONFIG.replace(admin, &format!("{admin}\ntoken = \"{ADMIN_TOKEN}\""));
    for (id, token) in TOKENS {
        text.push_str(&format!("[[agents]]\nid = \"{id}\"\ntoken = \"{token}\"\n"));
    }
    for (id, prefix, extra) in [
        ("open", "/open", ""),
        (
            "held",
            "/held",
            "approval = \"required\"\napproval_timeout = \"30s\"\n",
        ),
    ] {
        text.push_str(&format!(
            "[[routes]]\nid = \"{id}\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port}, path_prefix = \"{prefix}\" }}\nresolve = \"127.0.0.1:{port}\"\n{extra}"
        ));
    }
    text
}

struct Setup {
    home: Home,
    daemon: Daemon,
    origin: Origin,
}

fn setup() -> Setup {
    let origin = origins::responds("200 OK", &["content-type: text/plain"], "hello");
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port())));
    Setup {
        home,
        daemon,
        origin,
    }
}

/// A request of `agent` through the proxy: (status, body, head).
fn send(
    daemon: &Daemon,
    port: u16,
    agent: &str,
    path: &str,
    extra: &[&str],
) -> (u16, String, String) {
    let token = TOKENS.iter().find(|(id, _)| *id == agent).unwrap().1;
    let proxy = daemon
        .proxy
        .replace("http://", &format!("http://{agent}:{token}@"));
    let url = format!("http://origin.test:{port}{path}");
    let mut args = vec!["-x", proxy.as_str()];
    args.extend_from_slice(extra);
    args.push(&url);
    curl(&args)
}

/// `postern agents …` with the admin token; must succeed; its stdout.
fn agents(daemon: &Daemon, args: &[&str]) -> String {
    let mut all = vec!["agents"];
    all.extend_from_slice(args);
    let out = daemon.cli(&all, &[("POSTERN_ADMIN_TOKEN", ADMIN_TOKEN)]);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    stdout(&out)
}

/// The admin API's JSON at `path`, with the token.
fn admin_get(daemon: &Daemon, path: &str) -> Value {
    let bearer = format!("Authorization: Bearer {ADMIN_TOKEN}");
    let (status, v) = get_json(&daemon.url(path), &["-H", &bearer]);
    assert_eq!(status, 200, "{path}: {v}");
    v
}

/// The `sus_…` / `rsm_…` id a CLI line names.
fn event_id(line: &str, prefix: &str) -> String {
    let at = line
        .find(prefix)
        .unwrap_or_else(|| panic!("{prefix} in {line}"));
    line[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

fn suspended_envelope(reply: (u16, String, String)) -> Value {
    let (status, body, head) = reply;
    assert_eq!(status, 403, "{head}\n{body}");
    let env: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(env["error"]["code"], "AGENT_SUSPENDED", "{body}");
    assert_eq!(env["error"]["phase"], "validation", "{body}");
    assert_eq!(env["error"]["outcome"], "not_attempted", "{body}");
    assert_eq!(env["error"]["retry"], "after_correction", "{body}");
    assert_eq!(env["error"]["field"], "agent", "{body}");
    assert_eq!(env["evidence"]["dispatch_started"], false, "{body}");
    let proxy_status = head.to_ascii_lowercase();
    assert!(proxy_status.contains("error=http_request_denied"), "{head}");
    env
}

#[test]
fn a_suspended_agent_is_refused_before_anything_is_sent_and_resume_lifts_it() {
    let s = setup();
    let port = s.origin.port();
    assert_eq!(send(&s.daemon, port, "a", "/open/x", &[]).0, 200);
    assert_eq!(s.origin.hits(), 1);

    let said = agents(&s.daemon, &["suspend", "a", "--note", "runaway loop"]);
    assert!(said.contains("agent a suspended"), "{said}");
    let sus = event_id(&said, "sus_");

    let env = suspended_envelope(send(&s.daemon, port, "a", "/open/x", &[]));
    assert_eq!(
        env["evidence"]["suspension"]["event_id"],
        sus.as_str(),
        "{env}"
    );
    assert_eq!(
        s.origin.hits(),
        1,
        "nothing of a suspended agent reaches the origin"
    );
    // Another agent is not held back.
    assert_eq!(send(&s.daemon, port, "b", "/open/x", &[]).0, 200);
    assert_eq!(s.origin.hits(), 2);

    // Idempotent: a second suspend changes and journals nothing.
    let again = agents(&s.daemon, &["suspend", "a"]);
    assert!(again.contains("already suspended"), "{again}");
    let list = agents(&s.daemon, &["list"]);
    assert!(list.contains("a  SUSPENDED since"), "{list}");
    assert!(
        list.contains(&sus) && list.contains("runaway loop"),
        "{list}"
    );
    assert!(list.contains("b  active"), "{list}");

    // The operator's action is a journal event of its own; the refusal's record names it.
    let events = admin_get(&s.daemon, &format!("/v1/invocations/{sus}/events"));
    let ev = &events["events"][0];
    assert_eq!(
        events["events"].as_array().map(Vec::len),
        Some(1),
        "{events}"
    );
    assert_eq!(ev["kind"], "AGENT_SUSPENDED", "{ev}");
    assert_eq!(ev["source"], "operator_attested", "{ev}");
    assert_eq!(ev["data"]["agent"], "a", "{ev}");
    assert_eq!(ev["data"]["note"], "runaway loop", "{ev}");
    let id = env["invocation_id"].as_str().unwrap();
    let record = admin_get(&s.daemon, &format!("/v1/invocations/{id}"));
    assert_eq!(record["code"], "AGENT_SUSPENDED", "{record}");
    assert_eq!(record["agent"], "a", "{record}");
    assert_eq!(record["route"], "open", "the route it matched: {record}");

    let said = agents(&s.daemon, &["resume", "a"]);
    assert!(said.contains("agent a resumed"), "{said}");
    let rsm = event_id(&said, "rsm_");
    let events = admin_get(&s.daemon, &format!("/v1/invocations/{rsm}/events"));
    assert_eq!(events["events"][0]["kind"], "AGENT_RESUMED", "{events}");
    assert_eq!(events["events"][0]["source"], "operator_attested");
    assert_eq!(send(&s.daemon, port, "a", "/open/x", &[]).0, 200);
    assert_eq!(s.origin.hits(), 3);
    let again = agents(&s.daemon, &["resume", "a"]);
    assert!(again.contains("was not suspended"), "{again}");
    assert!(admin_get(&s.daemon, "/v1/audit/verify")["ok"] == true);
}

#[test]
fn suspending_an_agent_denies_its_held_approval_and_nothing_is_sent() {
    let s = setup();
    let (daemon, port) = (std::sync::Arc::new(s.daemon), s.origin.port());
    let waiting = {
        let daemon = daemon.clone();
        std::thread::spawn(move || send(&daemon, port, "a", "/held/pay", &["--data", "amount=5"]))
    };
    let held = (0..200)
        .find_map(|_| {
            let list = admin_get(&daemon, "/v1/approvals");
            let first = list["approvals"]
                .as_array()
                .and_then(|a| a.first().cloned());
            if first.is_none() {
                std::thread::sleep(Duration::from_millis(25));
            }
            first
        })
        .expect("the request is held for approval");
    let held_id = held["invocation_id"].as_str().unwrap().to_owned();

    let said = agents(&daemon, &["suspend", "a"]);
    assert!(
        said.contains(&format!("held approval {held_id} denied")),
        "{said}"
    );
    let (status, body, head) = waiting.join().unwrap();
    assert_eq!(status, 403, "{head}\n{body}");
    let env: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(env["error"]["code"], "APPROVAL_DENIED", "{body}");
    assert_eq!(env["error"]["outcome"], "not_attempted", "{body}");
    assert_eq!(env["invocation_id"], held_id.as_str(), "{body}");
    let sus = event_id(&said, "sus_");
    assert_eq!(
        env["evidence"]["suspension"]["event_id"],
        sus.as_str(),
        "{body}"
    );
    assert_eq!(s.origin.hits(), 0, "a denied request is never sent");
    let list = admin_get(&daemon, "/v1/approvals");
    assert_eq!(
        list["approvals"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
    // A request of the suspended agent is refused before it could be held.
    suspended_envelope(send(
        &daemon,
        port,
        "a",
        "/held/pay",
        &["--data", "amount=5"],
    ));
    assert_eq!(s.origin.hits(), 0);
    drop(s.home);
}

/// SPEC §5.8: in-flight exchanges finish and are recorded. A response streaming when its
/// agent is suspended reaches the agent whole and is committed; the next request is refused.
#[test]
fn a_response_streaming_when_its_agent_is_suspended_finishes_and_is_recorded() {
    use std::io::Write;
    let origin = Origin::script(|s, _| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n");
        let _ = s.flush();
        std::thread::sleep(Duration::from_millis(1500));
        let _ = s.write_all(b"4\r\nlast\r\n0\r\n\r\n");
    });
    let home = Home::new();
    let daemon = std::sync::Arc::new(Daemon::start(&home, Some(&config(origin.port()))));
    let port = origin.port();
    let streaming = {
        let daemon = daemon.clone();
        std::thread::spawn(move || send(&daemon, port, "a", "/open/stream", &["-N"]))
    };
    for _ in 0..200 {
        if origin.hits() == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    agents(&daemon, &["suspend", "a"]);
    let (status, body, head) = streaming.join().unwrap();
    assert_eq!((status, body.as_str()), (200, "firstlast"), "{head}");
    let id = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("postern-invocation: ")
                .or_else(|| l.strip_prefix("Postern-Invocation: "))
        })
        .map(|v| v.trim().to_owned())
        .expect("the invocation header");
    let record = admin_get(&daemon, &format!("/v1/invocations/{id}"));
    assert_eq!(record["outcome"], "committed", "{record}");
    let events = admin_get(&daemon, &format!("/v1/invocations/{id}/events"));
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"RESULT_COMMITTED"), "{kinds:?}");
    suspended_envelope(send(&daemon, port, "a", "/open/x", &[]));
    assert_eq!(origin.hits(), 1);
}

#[test]
fn a_suspension_survives_a_restart() {
    let s = setup();
    let port = s.origin.port();
    let said = agents(&s.daemon, &["suspend", "a"]);
    let sus = event_id(&said, "sus_");
    assert_eq!(s.daemon.terminate(), Some(0));

    let daemon = Daemon::start(&s.home, Some(&config(port)));
    let env = suspended_envelope(send(&daemon, port, "a", "/open/x", &[]));
    assert_eq!(
        env["evidence"]["suspension"]["event_id"],
        sus.as_str(),
        "{env}"
    );
    assert_eq!(s.origin.hits(), 0);
    let list = agents(&daemon, &["list"]);
    assert!(list.contains("a  SUSPENDED since"), "{list}");
    assert_eq!(send(&daemon, port, "b", "/open/x", &[]).0, 200);
    agents(&daemon, &["resume", "a"]);
    assert_eq!(send(&daemon, port, "a", "/open/x", &[]).0, 200);
    assert_eq!(s.origin.hits(), 2);
}

#[test]
fn the_api_needs_the_admin_token_and_names_an_unknown_agent() {
    let s = setup();
    let port = s.origin.port();
    let url = s.daemon.url("/v1/agents/a/suspend");
    let (status, body, _) = curl(&["-X", "POST", &url]);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("ADMIN_UNAUTHENTICATED"), "{body}");
    let (status, _, _) = curl(&["-X", "POST", "-H", "Authorization: Bearer wrong", &url]);
    assert_eq!(status, 401);
    assert_eq!(
        send(&s.daemon, port, "a", "/open/x", &[]).0,
        200,
        "not suspended"
    );

    let bearer = format!("Authorization: Bearer {ADMIN_TOKEN}");
    let unknown = s.daemon.url("/v1/agents/nobody/suspend");
    let (status, body, _) = curl(&["-X", "POST", "-H", &bearer, &unknown]);
    assert_eq!(status, 404, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(v["error"]["code"], "AGENT_NOT_FOUND", "{body}");
    let out = s.daemon.cli(
        &["agents", "suspend", "nobody"],
        &[("POSTERN_ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("AGENT_NOT_FOUND"), "{}", stderr(&out));
    let out = s.daemon.cli(&["agents", "suspend", "a"], &[]);
    assert!(
        !out.status.success(),
        "the CLI without the token is refused too"
    );
    assert_eq!(send(&s.daemon, port, "a", "/open/x", &[]).0, 200);
}

/// SPEC §5.8 over SSH: a suspended agent's exec is `AGENT_SUSPENDED` before any connection
/// to the target; resumed, it runs again.
#[test]
fn an_ssh_exec_of_a_suspended_agent_is_refused() {
    let f = Front::start_with("", |text| text, &[]);
    let out = f.ssh(SSH_TOKEN, &["--", "", "echo hi"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hi\n",
        "{}",
        stderr(&out)
    );
    let said = f.daemon.cli(&["agents", "suspend", "ci"], &[]);
    assert!(said.status.success(), "{}", stderr(&said));

    let out = f.ssh(SSH_TOKEN, &["--", "", "echo hi"]);
    let err = stderr(&out);
    assert!(out.stdout.is_empty(), "{err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["code"], "AGENT_SUSPENDED", "{err}");
    assert_eq!(env["error"]["outcome"], "not_attempted", "{err}");
    assert_eq!(env["error"]["field"], "agent", "{err}");

    let resumed = f.daemon.cli(&["agents", "resume", "ci"], &[]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let out = f.ssh(SSH_TOKEN, &["--", "", "echo hi"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hi\n",
        "{}",
        stderr(&out)
    );
}

/// A session opened before the suspension (an OpenSSH control master keeps it) runs no new
/// exec: each is refused on its channel, before any connection to the target.
#[test]
fn an_exec_in_a_session_opened_before_the_suspension_is_refused() {
    let f = Front::start_with("", |text| text, &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = format!("ControlPath={}", dir.path().join("cm").display());
    let master = [
        "-o",
        "ControlMaster=yes",
        "-o",
        &path,
        "-o",
        "ControlPersist=60",
        "-f",
        "-N",
        "--",
        "",
    ];
    let out = f.ssh(SSH_TOKEN, &master);
    assert!(out.status.success(), "{}", stderr(&out));
    let reuse = ["-o", "ControlMaster=no", "-o", &path, "--", "", "echo hi"];
    let out = f.ssh(SSH_TOKEN, &reuse);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hi\n",
        "{}",
        stderr(&out)
    );

    let said = f.daemon.cli(&["agents", "suspend", "ci"], &[]);
    assert!(said.status.success(), "{}", stderr(&said));
    let out = f.ssh(SSH_TOKEN, &reuse);
    let err = stderr(&out);
    assert!(out.stdout.is_empty(), "{err}");
    assert_eq!(envelope(&err)["error"]["code"], "AGENT_SUSPENDED", "{err}");
    // Refused on the kept session's channel (an `exec` record), not at a new preamble.
    let out = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let refused: Vec<&Value> = list["invocations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["code"] == "AGENT_SUSPENDED")
        .collect();
    assert_eq!(refused.len(), 1, "{list}");
    assert_eq!(refused[0]["method"], "exec", "{list}");
    let _ = f.ssh(SSH_TOKEN, &["-o", &path, "-O", "exit", "--", ""]);
}
