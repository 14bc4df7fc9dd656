//! The upstream SSH session before the dispatch boundary: a kept session that died is
//! replaced by a fresh login, a target named by DNS resolves through `[dns] servers` (the
//! `dns` stage recorded), and what the evidence says about an answered exec.

use serde_json::Value;

use crate::dns::dns_server;
use crate::ssh::{Front, TOKEN, envelope, target_config};
use crate::ssh_peer::Peer;
use crate::sshd::keygen;
use crate::support::{Home, stderr, stdout};

/// postern with the key credential for `peer`; `more` is appended to the config.
fn key_front(peer: &Peer, home: Home, more: &str) -> Front {
    let client = keygen(home.dir.path(), "client_key");
    let text = target_config("deploy", peer.port, &peer.known_hosts, "") + more;
    Front::serve(home, &text, "deploy".into(), client.private, None)
}

/// Every exec record, newest first, each with its events (`actions show --json`).
pub fn exec_records(f: &Front) -> Vec<Value> {
    let out = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let ids: Vec<String> = list["invocations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["method"] == "exec")
        .filter_map(|r| r["invocation_id"].as_str().map(str::to_owned))
        .collect();
    ids.iter()
        .map(|id| {
            let out = f.daemon.cli(&["actions", "show", id, "--json"], &[]);
            serde_json::from_slice(&out.stdout).unwrap()
        })
        .collect()
}

pub fn kinds(shown: &Value) -> Vec<String> {
    shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// The `CONNECT_ATTEMPT` events' data, in order.
fn connect_attempts(shown: &Value) -> Vec<Value> {
    shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "CONNECT_ATTEMPT")
        .map(|e| e["data"].clone())
        .collect()
}

fn stage_summary(attempts: &[Value]) -> Vec<(u64, String, bool)> {
    attempts
        .iter()
        .map(|a| {
            (
                a["n"].as_u64().unwrap_or(0),
                a["stage"].as_str().unwrap_or("").to_owned(),
                a["ok"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

#[test]
fn a_kept_session_that_died_is_replaced_by_a_fresh_login() {
    let home = Home::new();
    let peer = Peer::drops_a_kept_session(home.dir.path());
    let f = key_front(&peer, home, "");
    for word in ["first", "second"] {
        let out = f.ssh(TOKEN, &["--", "", word]);
        assert_eq!(stdout(&out), format!("ran {word}\n"), "{}", stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert_eq!(
        peer.connections(),
        2,
        "one fresh login after the kept session died"
    );
    let records = exec_records(&f);
    let (second, first) = (&records[0], &records[1]);
    assert_eq!(first["outcome"], "committed", "{first}");
    assert_eq!(second["outcome"], "committed", "{second}");
    assert!(
        second["evidence"]["reused_connection"].is_null(),
        "it ran on the fresh login: {second}"
    );
    assert_eq!(
        second["attempts"], 2,
        "the kept session and the fresh login: {second}"
    );
    let failed = &second["evidence"]["attempts"];
    assert_eq!(failed.as_array().map(Vec::len), Some(1), "{second}");
    assert_eq!(failed[0]["n"], 1, "{second}");
    assert_eq!(failed[0]["stage"], "channel_open", "{second}");
    assert_eq!(failed[0]["outcome"], "not_attempted", "{second}");
    let stages = stage_summary(&connect_attempts(second));
    assert_eq!(
        stages,
        [
            (1, "channel_open".into(), false),
            (2, "tcp_connect".into(), true),
            (2, "ssh_transport".into(), true),
            (2, "host_key".into(), true),
            (2, "user_auth".into(), true),
            (2, "channel_open".into(), true),
        ],
        "{second}"
    );
    let k = kinds(second);
    let dispatched = k.iter().position(|k| k == "DISPATCH_STARTED").unwrap();
    let last_attempt = k.iter().rposition(|k| k == "CONNECT_ATTEMPT").unwrap();
    assert!(last_attempt < dispatched, "all before the boundary: {k:?}");
}

#[test]
fn a_target_named_by_dns_resolves_through_the_configured_servers() {
    let dns_port = dns_server("ssh.test");
    let home = Home::new();
    let peer = Peer::named(&["ssh.test"], home.dir.path());
    let port = peer.port;
    let kh = peer.known_hosts.display().to_string();
    let more = format!(
        "[[ssh_targets]]\nid = \"named\"\nhost = \"ssh.test\"\nport = {port}\nuser = \"deploy\"\n\
         agents = [\"ci\"]\ncredential = \"deploy-key\"\nknown_hosts = \"{kh}\"\nconnect_timeout = \"5s\"\n\
         [[ssh_targets]]\nid = \"missing\"\nhost = \"missing.test\"\nport = {port}\nuser = \"deploy\"\n\
         agents = [\"ci\"]\ncredential = \"deploy-key\"\nknown_hosts = \"{kh}\"\nconnect_timeout = \"5s\"\n\
         [dns]\nservers = [\"127.0.0.1:{dns_port}\"]\n"
    );
    let f = key_front(&peer, home, &more);
    let p = port.to_string();
    let out = f.ssh(TOKEN, &["-p", &p, "--", "deploy@ssh.test", "hello"]);
    assert_eq!(stdout(&out), "ran hello\n", "{}", stderr(&out));
    let r = &exec_records(&f)[0];
    assert_eq!(r["route"], "named", "{r}");
    assert_eq!(r["outcome"], "committed", "{r}");
    let attempts = connect_attempts(r);
    assert_eq!(attempts[0]["stage"], "dns", "{r}");
    assert_eq!(attempts[0]["ok"], true, "{r}");
    assert_eq!(attempts[0]["address"], format!("127.0.0.1:{port}"), "{r}");

    let out = f.ssh(TOKEN, &["-p", &p, "--", "deploy@missing.test", "hello"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(255), "{err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["code"], "DNS_ERROR", "{err}");
    assert_eq!(env["error"]["phase"], "connection_setup", "{err}");
    assert_eq!(env["error"]["outcome"], "not_attempted", "{err}");
    assert_eq!(env["error"]["retry"], "backoff", "{err}");
    assert_eq!(env["evidence"]["attempts"][0]["stage"], "dns", "{err}");
    let r = &exec_records(&f)[0];
    assert_eq!(r["route"], "missing", "{r}");
    let attempts = connect_attempts(r);
    assert_eq!(stage_summary(&attempts), [(1, "dns".into(), false)], "{r}");
    assert_eq!(attempts[0]["code"], "DNS_ERROR", "{r}");
    assert_eq!(peer.connections(), 1, "the unresolved name never connected");
}

/// SPEC §1.8 evidence for SSH: `request_complete` once the exec request is handed over,
/// `response_headers_received` once the remote answered it with channel success.
#[test]
fn an_answered_exec_says_so_in_its_evidence() {
    let home = Home::new();
    let peer = Peer::named(&[], home.dir.path());
    let f = key_front(&peer, home, "");
    let out = f.ssh(TOKEN, &["--", "", "uptime"]);
    assert_eq!(stdout(&out), "ran uptime\n", "{}", stderr(&out));
    let r = &exec_records(&f)[0];
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["evidence"]["dispatch_started"], true, "{r}");
    assert_eq!(r["evidence"]["request_complete"], true, "{r}");
    assert_eq!(r["evidence"]["response_headers_received"], true, "{r}");
    assert_eq!(r["evidence"]["response_complete"], true, "{r}");
    let k = kinds(r);
    let at = |kind: &str| k.iter().position(|k| k == kind).unwrap();
    assert!(at("DISPATCH_STARTED") < at("REQUEST_SENT"), "{k:?}");
    assert!(at("REQUEST_SENT") < at("REMOTE_RESPONSE_STARTED"), "{k:?}");
    assert!(
        at("REMOTE_RESPONSE_STARTED") < at("RESULT_COMMITTED"),
        "{k:?}"
    );
}
