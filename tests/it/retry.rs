//! `postern retry` / `POST …/retry` against loopback origins that count what they were
//! asked: only RETRY_NEW_ATTEMPT and RETRY_SAME_KEY send anything (a new generation of the
//! same invocation), RECONCILE only when an operator vouches (journaled), and a stored
//! result is fetched, never re-executed.

use std::io::Write;
use std::net::TcpStream;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

use crate::origins::{self, Origin};
use crate::support::{Daemon, Home, curl, get_json, secret_set, stderr, stdout};

const VAULT_KEY: &str = "retry-vault-key";

/// Closes the first `failures` requests without a response, then answers `200 done-<n>`.
fn fails_then_answers(failures: usize) -> Origin {
    let seen = Arc::new(AtomicUsize::new(0));
    Origin::script(move |s: &mut TcpStream, _| {
        let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= failures {
            let _ = s.shutdown(std::net::Shutdown::Both);
            return;
        }
        let body = format!("done-{n}");
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(format!("{head}{body}").as_bytes());
    })
}

struct Setup {
    home: Home,
    daemon: Daemon,
    port: u16,
    config: String,
}

fn setup(port: u16, extra: &str, vault: bool) -> Setup {
    let home = Home::new();
    let config = format!(
        "{}\n[[credentials]]\nid = \"api\"\nsecret = \"api-token\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\n[[routes]]\nid = \"origin\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n{extra}\n",
        crate::support::TEST_CONFIG
    );
    let mut envs = vec![];
    if vault {
        assert!(
            secret_set(&home, "api-token", "tok-v1", Some(VAULT_KEY))
                .status
                .success()
        );
        envs.push(("POSTERN_VAULT_KEY", VAULT_KEY));
    }
    let daemon = Daemon::start_with(&home, Some(&config), &envs);
    Setup {
        home,
        daemon,
        port,
        config,
    }
}

impl Setup {
    fn send(&self, args: &[&str], path: &str) -> (u16, String, String) {
        let url = format!("http://origin.test:{}{path}", self.port);
        let mut all = vec!["-x", self.daemon.proxy.as_str()];
        all.extend_from_slice(args);
        all.push(&url);
        curl(&all)
    }

    fn retry(&self, args: &[&str]) -> Output {
        let mut all = vec!["retry"];
        all.extend_from_slice(args);
        self.daemon.cli(&all, &[])
    }

    fn record(&self, id: &str) -> Value {
        get_json(&self.daemon.url(&format!("/v1/invocations/{id}")), &[]).1
    }

    fn events(&self, id: &str) -> Vec<Value> {
        let url = self.daemon.url(&format!("/v1/invocations/{id}/events"));
        get_json(&url, &[]).1["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

fn invocation(head: &str) -> String {
    head.lines()
        .find_map(|l| l.strip_prefix("postern-invocation:"))
        .map(|v| v.trim().to_owned())
        .expect("postern-invocation header")
}

#[test]
fn reconcile_is_refused_until_an_operator_vouches_and_then_runs_as_generation_two() {
    let origin = fails_then_answers(1);
    let s = setup(origin.port(), "", false);
    let (status, _, head) = s.send(&["-X", "POST", "--data", "amount=5"], "/pay");
    assert_eq!(status, 502);
    let id = invocation(&head);

    let out = s.retry(&[&id]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("RECONCILE") && err.contains("postern reconcile"),
        "{err}"
    );
    assert_eq!(origin.hits(), 1, "a refused retry sends nothing");

    let note = "ledger shows no charge";
    let out = s.retry(&[&id, "--i-have-reconciled", "--note", note]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("generation 2"), "{}", stdout(&out));
    assert_eq!(origin.hits(), 2);
    assert!(
        origin.last_request().ends_with("amount=5"),
        "the kept body is sent"
    );

    let r = s.record(&id);
    assert_eq!(r["invocation_id"], id.as_str(), "the same invocation");
    assert_eq!(
        (r["generation"].as_u64(), r["outcome"].as_str()),
        (Some(2), Some("committed"))
    );
    let lease = s
        .events(&id)
        .into_iter()
        .find(|e| e["kind"] == "RETRY_LEASED")
        .expect("RETRY_LEASED journaled");
    assert_eq!(lease["source"], "operator_attested");
    assert_eq!(lease["data"]["unsafe_override"], true);
    assert_eq!(lease["data"]["note"], note);
    assert_eq!(lease["generation"], 2);

    let out = s.retry(&[&id]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains("nothing was sent"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        origin.hits(),
        2,
        "a stored result is fetched, never re-executed"
    );
    let result = s.daemon.cli(&["result", &id], &[]);
    assert!(stdout(&result).contains("done-2"), "{}", stdout(&result));
}

#[test]
fn an_idempotent_request_that_stayed_unknown_is_retried_through_the_api() {
    let origin = fails_then_answers(1);
    let s = setup(origin.port(), "", false);
    let (status, _, head) = s.send(&[], "/balance");
    assert_eq!(status, 502);
    let id = invocation(&head);
    let decide = s.daemon.cli(&["decide", &id], &[]);
    assert_eq!(stdout(&decide).trim(), "RETRY_NEW_ATTEMPT");

    let url = s.daemon.url(&format!("/v1/invocations/{id}/retry"));
    let (status, body, head) = curl(&["-X", "POST", &url]);
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("postern-verdict: RETRIED"), "{head}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (r["generation"].as_u64(), r["outcome"].as_str()),
        (Some(2), Some("committed"))
    );
    assert_eq!(r["result"]["status"], 200);
    assert_eq!(origin.hits(), 2);
    let kinds: Vec<String> = s
        .events(&id)
        .iter()
        .map(|e| format!("{}@{}", e["kind"].as_str().unwrap(), e["generation"]))
        .collect();
    let lease = kinds
        .iter()
        .position(|k| k == "RETRY_LEASED@2")
        .expect("lease");
    let dispatch = kinds
        .iter()
        .rposition(|k| k == "DISPATCH_STARTED@2")
        .expect("dispatch");
    assert!(lease < dispatch, "{kinds:?}");
    assert!(
        kinds.contains(&"RESULT_COMMITTED@2".to_owned()),
        "{kinds:?}"
    );
}

#[test]
fn a_rotated_credential_means_the_snapshot_no_longer_holds_and_nothing_is_sent() {
    let origin = fails_then_answers(1);
    let s = setup(origin.port(), "credential = \"api\"", true);
    let (status, _, head) = s.send(&[], "/balance");
    assert_eq!(status, 502);
    let id = invocation(&head);
    assert!(
        secret_set(&s.home, "api-token", "tok-v2", Some(VAULT_KEY))
            .status
            .success()
    );
    let url = s.daemon.url(&format!("/v1/invocations/{id}/retry"));
    let (status, body, _) = curl(&["-X", "POST", &url]);
    assert_eq!(status, 409, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "FINGERPRINT_CHANGED");
    assert_eq!(origin.hits(), 1, "nothing sent");
    assert_eq!(s.record(&id)["generation"], 1, "no generation was opened");
}

#[test]
fn a_retry_binds_the_agent_and_is_not_sent_once_it_no_longer_acts() {
    let origin = fails_then_answers(1);
    let mut s = setup(origin.port(), "", false);
    let (status, _, head) = s.send(&[], "/balance");
    assert_eq!(status, 502);
    let id = invocation(&head);
    // The invocation was the loopback `anonymous` agent's; now agents are configured.
    s.daemon.kill();
    let config = format!(
        "{}[[agents]]\nid = \"ci\"\ntoken = \"tok-0123456789abcdef\"\n",
        s.config
    );
    s.daemon = Daemon::start(&s.home, Some(&config));
    let out = s.retry(&[&id]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = stdout(&out) + &stderr(&out);
    assert!(said.contains("FINGERPRINT_CHANGED"), "{said}");
    assert_eq!(origin.hits(), 1, "nothing sent");
    assert_eq!(s.record(&id)["generation"], 1, "no generation was opened");
}

#[test]
fn a_polite_rejection_and_a_refusal_before_dispatch_are_not_repeated() {
    let origin = origins::responds("429 Too Many Requests", &["retry-after: 7"], "slow down");
    let s = setup(origin.port(), "", false);
    let (status, _, head) = s.send(&[], "/balance");
    assert_eq!(status, 429);
    let id = invocation(&head);
    let out = s.retry(&[&id]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("Retry-After: 7"), "{}", stderr(&out));
    assert_eq!(origin.hits(), 1);

    let url = format!("http://elsewhere.test:{}/x", s.port);
    let (status, _, head) = curl(&["-x", s.daemon.proxy.as_str(), &url]);
    assert_eq!(status, 403);
    let denied = invocation(&head);
    let out = s.retry(&[&denied, "--i-have-reconciled", "--note", "trust me"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr(&out).contains("STOP_FOR_CORRECTION"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_retry_budget_of_the_route_bounds_operator_retries_too() {
    let origin = origins::closes_without_response();
    let s = setup(origin.port(), "retry_budget = 1", false);
    let (status, _, head) = s.send(&[], "/balance");
    assert_eq!(status, 502);
    let id = invocation(&head);
    let out = s.retry(&[&id]);
    assert_eq!(out.status.code(), Some(1), "still unknown: {out:?}");
    assert!(stdout(&out).contains("generation 2"), "{}", stdout(&out));
    assert_eq!(origin.hits(), 2);
    // No generation is left, but without a key the agent's repeat is a new invocation of
    // an idempotent method: backoff stays true for it.
    assert_eq!(s.record(&id)["retry"], "backoff");

    let url = s.daemon.url(&format!("/v1/invocations/{id}/retry"));
    let (status, body, _) = curl(&["-X", "POST", &url]);
    assert_eq!(status, 409, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "RETRY_BUDGET_EXHAUSTED");
    assert_eq!(v["invocation_id"], id.as_str());
    assert_eq!(origin.hits(), 2, "a spent budget sends nothing");
    let decide = s.daemon.cli(&["decide", &id], &[]);
    assert_eq!(stdout(&decide).trim(), "RECONCILE");
    // Spent is spent: an operator's word does not buy another generation, and the answer
    // does not suggest it would.
    let vouched = s.retry(&[&id, "--i-have-reconciled", "--note", "checked"]);
    assert_eq!(vouched.status.code(), Some(1), "{vouched:?}");
    let said = stderr(&vouched);
    assert!(said.contains("RETRY_BUDGET_EXHAUSTED"), "{said}");
    assert!(!said.contains("--i-have-reconciled"), "{said}");
    assert_eq!(origin.hits(), 2);
}

#[test]
fn an_attempt_in_flight_cannot_be_reconciled_or_retried_and_settles_from_its_own_evidence() {
    let origin = origins::slow_head(std::time::Duration::from_secs(3), "charged");
    let s = setup(origin.port(), "", false);
    let proxy = s.daemon.proxy.clone();
    let url = format!("http://origin.test:{}/pay", s.port);
    let agent = std::thread::spawn(move || {
        curl(&[
            "-x",
            proxy.as_str(),
            "-X",
            "POST",
            "--data",
            "amount=5",
            &url,
        ])
    });
    let id = loop {
        let (_, list) = get_json(&s.daemon.url("/v1/invocations"), &[]);
        let first = &list["invocations"][0];
        if first["evidence"]["dispatch_started"] == true {
            break first["invocation_id"].as_str().unwrap().to_owned();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let out = s.daemon.cli(
        &[
            "reconcile",
            &id,
            "--outcome",
            "rejected",
            "--note",
            "nothing happened",
        ],
        &[],
    );
    assert!(!out.status.success(), "reconciled in flight: {out:?}");
    assert!(stderr(&out).contains("in flight"), "{}", stderr(&out));
    assert_eq!(stdout(&s.daemon.cli(&["decide", &id], &[])).trim(), "FETCH");
    let out = s.retry(&[&id, "--i-have-reconciled", "--note", "sure"]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains("ATTEMPT_IN_PROGRESS"),
        "{}",
        stderr(&out)
    );

    let (status, body, _) = agent.join().unwrap();
    assert_eq!((status, body.as_str()), (200, "charged"));
    let r = s.record(&id);
    assert_eq!(
        (r["outcome"].as_str(), r["generation"].as_u64()),
        (Some("committed"), Some(1))
    );
    assert_eq!(origin.hits(), 1);
    let kinds: Vec<Value> = s
        .events(&id)
        .into_iter()
        .map(|e| e["kind"].clone())
        .collect();
    assert!(!kinds.contains(&Value::from("RECONCILED")), "{kinds:?}");
}

/// The agent loop in docs/retries.md, run as written against an origin that drops
/// the first answer: it retries with the same key and settles once, on the same invocation.
#[test]
fn the_readme_agent_loop_settles_a_dropped_answer_with_one_same_key_retry() {
    let readme = include_str!("../../docs/retries.md");
    let start = readme
        .find("An agent step that pays at most once")
        .expect("the docs/retries.md loop");
    let block = &readme[start..];
    let code = block
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block");
    let origin = fails_then_answers(1);
    let contract = "idempotency = { header = \"Idempotency-Key\", scope = \"charges\", retention = \"1h\", safe_margin = \"10m\" }";
    let s = setup(origin.port(), contract, false);
    let url = format!("http://origin.test:{}/v1/charges", s.port);
    let script = code.replace("https://api.example.com/v1/charges", &url);
    assert_ne!(script, code, "the docs loop names its URL");
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("sh")
        .args(["-c", &script])
        .current_dir(dir.path())
        .env("http_proxy", &s.daemon.proxy)
        .env_remove("HTTP_PROXY")
        .output()
        .unwrap();
    let said = stdout(&out);
    assert!(out.status.success(), "{said}{}", stderr(&out));
    let id = said
        .trim()
        .strip_prefix("settled: ")
        .expect("settled: <id>");
    let r = s.record(id);
    assert_eq!(
        (r["generation"].as_u64(), r["outcome"].as_str()),
        (Some(2), Some("committed"))
    );
    assert_eq!(origin.hits(), 2, "one retry, same key");
}

#[test]
fn an_agents_own_credential_headers_are_never_kept_so_that_request_is_not_resent() {
    let origin = fails_then_answers(3);
    let mut s = setup(origin.port(), "", false);
    let own = [
        ("Authorization", "Bearer agent-own-canary-7731"),
        ("Cookie", "session=agent-own-canary-7732"),
        ("X-Api-Key", "agent-own-canary-7733"),
    ];
    for (name, value) in own {
        let (status, _, head) = s.send(&["-H", &format!("{name}: {value}")], "/balance");
        assert_eq!(status, 502);
        let id = invocation(&head);
        let out = s.retry(&[&id]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            stderr(&out).contains("REQUEST_NOT_KEPT")
                && stderr(&out).contains("credential of the agent's own"),
            "{name}: {}",
            stderr(&out)
        );
    }
    assert_eq!(origin.hits(), 3, "nothing was resent");
    let stored = crate::support::stored_text(&mut s.daemon);
    assert!(
        !stored.contains("agent-own-canary"),
        "the journal holds an agent's own credential"
    );
}
