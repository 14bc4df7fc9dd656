//! `postern retry` of SSH execs: the recorded command and the stdin the remote got run
//! again as a new generation of the same invocation, with no agent attached; the output is
//! the stored result. Real `ssh` through `ssh-connect` to a real sshd; the remote command
//! appends to a run counter and a stdin log, so every side effect is counted.

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::ssh::{Front, TOKEN, envelope, target_config};
use crate::sshd::keygen;
use crate::support::{Home, get_json, stderr};

fn retry(f: &Front, args: &[&str]) -> Output {
    let mut all = vec!["retry"];
    all.extend_from_slice(args);
    f.daemon.cli(&all, &[])
}

fn record(f: &Front, id: &str) -> Value {
    get_json(&f.daemon.url(&format!("/v1/invocations/{id}")), &[]).1
}

fn event_kinds(f: &Front, id: &str) -> Vec<String> {
    let url = f.daemon.url(&format!("/v1/invocations/{id}/events"));
    let events = get_json(&url, &[]).1["events"].as_array().cloned();
    events
        .unwrap_or_default()
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("").to_owned())
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Runs `command` through postern with `stdin` written and closed, or never closed.
fn ssh_with_stdin(f: &Front, command: &str, stdin: &[u8], close: bool) -> Output {
    let mut child = f
        .ssh_command(TOKEN, &["--", "", command])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ssh");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).expect("write stdin");
    let held = if close {
        drop(input);
        None
    } else {
        Some(input)
    };
    let out = child.wait_with_output().expect("ssh output");
    drop(held);
    out
}

#[test]
fn an_exec_that_timed_out_is_retried_only_when_vouched_for_with_the_stdin_the_remote_got() {
    let f = Front::start("response_timeout = \"2s\"\n");
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path().display();
    // The first run hangs past the timeout; the second finds the marker and finishes.
    let command = format!(
        "cat >> {w}/stdin.log; echo run >> {w}/runs; \
         if [ -f {w}/done ]; then echo finished; exit 0; fi; touch {w}/done; sleep 6"
    );
    let out = ssh_with_stdin(&f, &command, b"payload-1\n", true);
    let env = envelope(&stderr(&out));
    assert_eq!(env["error"]["code"], "REMOTE_TIMEOUT", "{}", stderr(&out));
    let id = env["invocation_id"]
        .as_str()
        .expect("invocation id")
        .to_owned();
    let first = record(&f, &id);
    assert_eq!(first["outcome"], "unknown", "{first}");
    assert_eq!(first["retry"], "reconcile", "{first}");
    assert_eq!(read(&work.path().join("runs")), "run\n");

    let refused = retry(&f, &[&id]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    let said = String::from_utf8_lossy(&refused.stdout).into_owned() + &stderr(&refused);
    assert!(said.contains("RECONCILE"), "{said}");
    assert_eq!(read(&work.path().join("runs")), "run\n", "nothing was sent");

    // SPEC §5.1: the flag alone is enough (a note is optional).
    let vouched = retry(&f, &[&id, "--i-have-reconciled"]);
    assert_eq!(vouched.status.code(), Some(0), "{}", stderr(&vouched));
    let second = record(&f, &id);
    assert_eq!(second["generation"], 2, "{second}");
    assert_eq!(second["outcome"], "committed", "{second}");
    assert_eq!(second["result"]["exit_status"], 0, "{second}");
    assert_eq!(read(&work.path().join("runs")), "run\nrun\n");
    assert_eq!(
        read(&work.path().join("stdin.log")),
        "payload-1\npayload-1\n",
        "the retry gave the command the stdin the first run got"
    );
    let kinds = event_kinds(&f, &id);
    let leased = kinds
        .iter()
        .position(|k| k == "RETRY_LEASED")
        .expect("RETRY_LEASED");
    let dispatched = kinds
        .iter()
        .rposition(|k| k == "DISPATCH_STARTED")
        .expect("dispatch");
    assert!(leased < dispatched, "{kinds:?}");
    let result = f.daemon.cli(&["result", &id, "--json"], &[]);
    let result: Value = serde_json::from_slice(&result.stdout).expect("result json");
    assert_eq!(result["stdout_base64"], "ZmluaXNoZWQK", "{result}");
    assert_eq!(result["exit_status"], 0, "{result}");

    // Committed now: a further retry returns the stored result and runs nothing.
    let again = retry(&f, &[&id]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(read(&work.path().join("runs")), "run\nrun\n");
}

#[test]
fn an_exec_refused_before_dispatch_is_retried_only_when_its_stdin_had_ended() {
    // Nothing listens on the target's port: every try ends at tcp_connect.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let home = Home::new();
    let client = keygen(home.dir.path(), "client_key");
    let known = home.dir.path().join("known_hosts");
    std::fs::write(&known, format!("app1.internal {}\n", client.public)).expect("known_hosts");
    let text = target_config("agent", port, &known, "");
    let f = Front::serve(home, &text, "agent".into(), client.private, None);

    // `ssh -n`, or stdin written and closed: it ended before anything could be sent, so
    // the request is kept whole, and the retry (RETRY_NEW_ATTEMPT) runs generation 2.
    let empty = f.ssh(TOKEN, &["-n", "--", "", "echo hi"]);
    let whole = ssh_with_stdin(&f, "cat", b"whole", true);
    for out in [empty, whole] {
        let env = envelope(&stderr(&out));
        assert_eq!(env["error"]["outcome"], "not_attempted", "{}", stderr(&out));
        let kept = env["invocation_id"].as_str().expect("id").to_owned();
        let again = retry(&f, &[&kept]);
        let said = String::from_utf8_lossy(&again.stdout).into_owned() + &stderr(&again);
        let r = record(&f, &kept);
        assert_eq!(r["generation"], 2, "{said}\n{r}");
        assert_eq!(r["outcome"], "not_attempted", "{r}");
        assert!(event_kinds(&f, &kept).contains(&"RETRY_LEASED".to_owned()));
    }

    // stdin still open when it failed: what the command would have read is unknown.
    let out = ssh_with_stdin(&f, "cat", b"half", false);
    let env = envelope(&stderr(&out));
    assert_eq!(env["error"]["outcome"], "not_attempted", "{}", stderr(&out));
    let open = env["invocation_id"].as_str().expect("id").to_owned();
    let refused = retry(&f, &[&open]);
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8_lossy(&refused.stdout).into_owned() + &stderr(&refused);
    assert!(said.contains("REQUEST_NOT_KEPT"), "{said}");
    assert_eq!(record(&f, &open)["generation"], 1);
}

#[test]
fn an_exec_cut_by_a_crash_after_dispatch_started_is_retried_once_vouched_for() {
    let crash = [("POSTERN_CRASH_AFTER", "DISPATCH_STARTED")];
    let mut f = Front::start_with("", |text| text, &crash);
    let work = tempfile::tempdir().expect("tempdir");
    let runs = work.path().join("runs");
    let command = format!("echo run >> {}; echo done", runs.display());
    // `ssh -n`: its stdin ended during the connection setup, so the request was kept with
    // DISPATCH_STARTED, the write the crash followed.
    let _ = f.ssh(TOKEN, &["-n", "--", "", &command]);
    let exit = f.daemon.wait_exit(Duration::from_secs(20));
    assert!(exit.is_some_and(|s| s.code().is_none()), "{exit:?}");
    f.restart_unlocked();
    let list = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).expect("list json");
    let id = list["invocations"][0]["invocation_id"]
        .as_str()
        .expect("the invocation")
        .to_owned();
    let r = record(&f, &id);
    assert_eq!(
        (&r["outcome"], &r["code"]),
        (&Value::from("unknown"), &Value::from("BROKER_RESTARTED")),
        "{r}"
    );
    assert_eq!(read(&runs), "", "the crash came before the exec was sent");
    let refused = retry(&f, &[&id]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    let vouched = retry(
        &f,
        &[&id, "--i-have-reconciled", "--note", "no run on the host"],
    );
    assert_eq!(vouched.status.code(), Some(0), "{}", stderr(&vouched));
    let r = record(&f, &id);
    assert_eq!(
        (&r["generation"], &r["outcome"]),
        (&Value::from(2), &Value::from("committed")),
        "{r}"
    );
    assert_eq!(read(&runs), "run\n");
    let result = f.daemon.cli(&["result", &id, "--json"], &[]);
    let result: Value = serde_json::from_slice(&result.stdout).expect("result json");
    assert_eq!(result["stdout_base64"], "ZG9uZQo=", "{result}");
}

/// An exec with `-n` whose first run outlives `response_timeout = "3s"` and whose later
/// runs finish after `later` seconds; every run appends to `runs`. Returns its id.
fn timed_out_exec(f: &Front, w: &Path, later: u32) -> String {
    let w = w.display();
    let command = format!(
        "echo run >> {w}/runs; if [ -f {w}/done ]; then sleep {later}; echo finished; exit 0; fi; \
         touch {w}/done; sleep 10"
    );
    let out = f.ssh(TOKEN, &["-n", "--", "", &command]);
    let env = envelope(&stderr(&out));
    assert_eq!(env["error"]["code"], "REMOTE_TIMEOUT", "{}", stderr(&out));
    env["invocation_id"].as_str().expect("id").to_owned()
}

const VOUCH: [&str; 3] = ["--i-have-reconciled", "--note", "the host shows no deploy"];

#[test]
fn a_retry_whose_cli_was_killed_still_runs_to_a_recorded_result() {
    let f = Front::start("response_timeout = \"3s\"\n");
    let work = tempfile::tempdir().expect("tempdir");
    let id = timed_out_exec(&f, work.path(), 1);
    let mut args = vec!["retry", id.as_str()];
    args.extend_from_slice(&VOUCH);
    let mut cli = f.daemon.cli_command(&args).spawn().expect("postern retry");
    // Kill the operator's CLI once the remote runs the second time.
    let deadline = Instant::now() + Duration::from_secs(20);
    while read(&work.path().join("runs")) != "run\nrun\n" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(read(&work.path().join("runs")), "run\nrun\n");
    cli.kill().expect("kill the CLI");
    let _ = cli.wait();
    let settled = (0..200).find_map(|_| {
        let r = record(&f, &id);
        if r["outcome"] == "committed" {
            return Some(r);
        }
        std::thread::sleep(Duration::from_millis(100));
        None
    });
    let r = settled.unwrap_or_else(|| record(&f, &id));
    assert_eq!(r["outcome"], "committed", "the generation ran on: {r}");
    assert_eq!(r["generation"], 2, "{r}");
    let result = f.daemon.cli(&["result", &id, "--json"], &[]);
    let result: Value = serde_json::from_slice(&result.stdout).expect("result json");
    assert_eq!(result["stdout_base64"], "ZmluaXNoZWQK", "{result}");
}

#[test]
fn a_retry_is_not_sent_for_an_agent_no_longer_configured() {
    // No `agents` list on the target: any configured agent may use it.
    let mut f = Front::start_with(
        "response_timeout = \"3s\"\n",
        |text| text.replace("agents = [\"ci\"]\n", ""),
        &[],
    );
    let work = tempfile::tempdir().expect("tempdir");
    let id = timed_out_exec(&f, work.path(), 0);
    f.daemon.kill();
    f.restart_edited(|text| text.replace("id = \"ci\"", "id = \"other\""));
    let mut args = vec![id.as_str()];
    args.extend_from_slice(&VOUCH);
    let refused = retry(&f, &args);
    let said = String::from_utf8_lossy(&refused.stdout).into_owned() + &stderr(&refused);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("FINGERPRINT_CHANGED"), "{said}");
    assert_eq!(
        read(&work.path().join("runs")),
        "run\n",
        "nothing ran again"
    );
    assert_eq!(record(&f, &id)["generation"], 1);
}

#[test]
fn an_exec_that_timed_out_with_its_stdin_still_open_is_not_replayed() {
    let f = Front::start("response_timeout = \"2s\"\n");
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path().display();
    // The remote read all the agent sent so far; the agent never said it was done.
    let command = format!("head -c 8 >> {w}/stdin.log; echo run >> {w}/runs; sleep 6");
    let out = ssh_with_stdin(&f, &command, b"payload\n", false);
    let env = envelope(&stderr(&out));
    assert_eq!(env["error"]["code"], "REMOTE_TIMEOUT", "{}", stderr(&out));
    let id = env["invocation_id"].as_str().expect("id").to_owned();
    let mut args = vec![id.as_str()];
    args.extend_from_slice(&VOUCH);
    let refused = retry(&f, &args);
    let said = String::from_utf8_lossy(&refused.stdout).into_owned() + &stderr(&refused);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("REQUEST_NOT_KEPT"), "{said}");
    assert_eq!(
        read(&work.path().join("runs")),
        "run\n",
        "nothing ran again"
    );
}
