//! Resends (SPEC §3.7): an agent (or its SDK) sends the same request again on the same
//! route. Real curl through the daemon to loopback origins that count what reached them;
//! each test says which state of the twin it sets up and what the resend must get.

use std::time::Duration;

use serde_json::Value;

use crate::idempotency::{GENERATING, Reply, four};
use crate::origins;
use crate::retry_origins::{Answer, KeyedOrigin, Policy};
use crate::support::{Daemon, Home, TEST_CONFIG, curl, get_json};

const BODY: &str = "{\"amount\":5}";

/// One agent and a POST/GET route to `pay.test:<port>`, pinned to loopback.
fn config(port: u16, route_extra: &str) -> String {
    format!(
        "{TEST_CONFIG}\n[[agents]]\nid = \"a\"\ntoken = \"agent-a-token-0123\"\n\
         [[routes]]\nid = \"payments\"\nmatch = {{ scheme = \"http\", host = \"pay.test\", port = {port}, methods = [\"POST\", \"GET\"] }}\n\
         resolve = \"127.0.0.1:{port}\"\n{route_extra}\n"
    )
}

struct Agent {
    home: Home,
    daemon: Daemon,
    port: u16,
}

impl Agent {
    fn start(port: u16, route_extra: &str, envs: &[(&str, &str)]) -> Self {
        let home = Home::new();
        let daemon = Daemon::start_with(&home, Some(&config(port, route_extra)), envs);
        Self { home, daemon, port }
    }

    /// A new daemon on the same journal (the old one killed if it still runs).
    fn restart(self, route_extra: &str) -> Self {
        let Agent {
            home,
            mut daemon,
            port,
        } = self;
        daemon.kill();
        drop(daemon);
        let daemon = Daemon::start(&home, Some(&config(port, route_extra)));
        Self { home, daemon, port }
    }

    fn post(&self, body: &str) -> Reply {
        self.send("POST", body, &[], &[])
    }

    /// One request through the proxy: extra request headers and extra curl arguments.
    fn send(&self, method: &str, body: &str, headers: &[&str], extra: &[&str]) -> Reply {
        let proxy = self
            .daemon
            .proxy
            .replacen("http://", "http://a:agent-a-token-0123@", 1);
        let url = format!("http://pay.test:{}/v1/charges", self.port);
        let mut args = vec!["-x", proxy.as_str(), "-X", method];
        if method == "POST" {
            args.extend([
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                body,
            ]);
        }
        for h in headers {
            args.extend(["-H", h]);
        }
        args.extend(extra);
        args.push(&url);
        let (status, body, head) = curl(&args);
        Reply { status, body, head }
    }

    fn record(&self, id: &str) -> Value {
        get_json(&self.daemon.url(&format!("/v1/invocations/{id}")), &[]).1
    }

    /// Waits until the record satisfies `pred` (an exchange settles in its own task).
    fn record_when(&self, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..200 {
            let r = self.record(id);
            if pred(&r) {
                return r;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.record(id)
    }

    fn kinds(&self, id: &str) -> Vec<String> {
        let (_, v) = get_json(
            &self.daemon.url(&format!("/v1/invocations/{id}/events")),
            &[],
        );
        v["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// The newest invocation's record (a request curl gave up on has no id to read).
    fn newest(&self) -> Value {
        let (_, v) = get_json(&self.daemon.url("/v1/invocations?limit=1"), &[]);
        v["invocations"][0].clone()
    }
}

/// RESEND_REFUSED, naming `twin` with its code and outcome; its own journaled record.
fn assert_refused(agent: &Agent, r: &Reply, twin: &str, code: Value, outcome: &str) {
    assert_eq!(r.status, 409, "{}\n{}", r.head, r.body);
    assert_eq!(
        r.error(),
        four("RESEND_REFUSED", "validation", "not_attempted", "reconcile"),
        "{}",
        r.body
    );
    let of = &r.envelope()["evidence"]["resend_of"];
    assert_eq!(of["invocation_id"], twin, "{}", r.body);
    assert_eq!(of["code"], code, "{}", r.body);
    assert_eq!(of["outcome"], outcome, "{}", r.body);
    let status = r.header("proxy-status").unwrap_or_default();
    assert!(status.contains("proxy_internal_response"), "{}", r.head);
    let id = r.id();
    assert!(id.starts_with("act_") && id != twin, "{}", r.head);
    let rec = agent.record(&id);
    assert_eq!(rec["code"], "RESEND_REFUSED", "{rec}");
    assert_eq!(rec["route"], "payments", "the route it matched: {rec}");
    assert_eq!(rec["evidence"]["resend_of"]["invocation_id"], twin, "{rec}");
    // Nothing of this one is to repeat: the operator is sent to the twin.
    let retry = agent.daemon.cli(&["retry", &id], &[]);
    let said = String::from_utf8_lossy(&retry.stderr);
    assert_eq!(retry.status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("postern decide {twin}")), "{said}");
}

#[test]
fn a_resend_of_an_unknown_twin_is_refused_another_body_or_a_deliberate_one_goes_out() {
    let origin = origins::closes_without_response();
    let a = Agent::start(origin.port(), "", &[]);
    let first = a.post(BODY);
    assert_eq!(first.status, 502, "{}", first.head);
    let twin = first.id();
    let again = a.post(BODY);
    assert_refused(
        &a,
        &again,
        &twin,
        Value::from("REMOTE_OUTCOME_UNKNOWN"),
        "unknown",
    );
    assert_eq!(origin.hits(), 1, "the resend reached the origin");
    // The refusal is never itself a twin: a third try still names the first.
    let third = a.post(BODY);
    assert_refused(
        &a,
        &third,
        &twin,
        Value::from("REMOTE_OUTCOME_UNKNOWN"),
        "unknown",
    );
    assert_eq!(origin.hits(), 1);

    let other = a.post("{\"amount\":6}");
    assert_eq!(other.status, 502, "{}", other.body);
    assert_eq!(origin.hits(), 2, "another request is not a resend");

    let deliberate = a.send("POST", BODY, &["Postern-Resend: deliberate"], &[]);
    assert_eq!(deliberate.status, 502, "{}", deliberate.body);
    assert_eq!(origin.hits(), 3, "a deliberate resend goes out");
    assert!(
        !origin
            .last_request()
            .to_ascii_lowercase()
            .contains("postern-resend"),
        "{}",
        origin.last_request()
    );
    let rec = a.record(&deliberate.id());
    assert_eq!(rec["evidence"]["resend_deliberate"], true, "{rec}");
    assert_eq!(rec["evidence"]["resend_of"]["invocation_id"], twin, "{rec}");
    assert_eq!(
        rec["evidence"]["resend_of"]["code"], "REMOTE_OUTCOME_UNKNOWN",
        "{rec}"
    );
    // The deliberate one is the twin now.
    let after = a.post(BODY);
    assert_refused(
        &a,
        &after,
        &deliberate.id(),
        Value::from("REMOTE_OUTCOME_UNKNOWN"),
        "unknown",
    );
    // Any other value of the header is malformed, and nothing goes out.
    let odd = a.send("POST", BODY, &["Postern-Resend: please"], &[]);
    assert_eq!(odd.status, 400, "{}", odd.body);
    assert_eq!(odd.envelope()["error"]["field"], "headers.postern-resend");
    assert_eq!(origin.hits(), 3);
}

#[test]
fn an_unknown_get_resent_is_dispatched() {
    let origin = origins::closes_without_response();
    let a = Agent::start(origin.port(), "", &[]);
    let first = a.send("GET", "", &[], &[]);
    assert_eq!(first.status, 502, "{}", first.head);
    let again = a.send("GET", "", &[], &[]);
    assert_eq!(again.status, 502, "{}", again.body);
    assert_eq!(
        origin.hits(),
        2,
        "an idempotent method is never resend-checked"
    );
}

#[test]
fn a_window_of_zero_turns_the_resend_check_off() {
    let origin = origins::closes_without_response();
    let a = Agent::start(origin.port(), "resend_window = \"0s\"", &[]);
    assert_eq!(a.post(BODY).status, 502);
    let again = a.post(BODY);
    assert_eq!(again.status, 502, "{}", again.body);
    assert_eq!(origin.hits(), 2);
}

/// Entries the twin index holds, from the daemon's `/metrics`.
fn twins_held(a: &Agent) -> Option<u64> {
    let (_, text, _) = curl(&[&a.daemon.url("/metrics")]);
    text.lines()
        .find_map(|l| l.strip_prefix("postern_journal_resend_twins "))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn the_twin_index_counts_each_request_and_forgets_it_once_its_window_closes() {
    let origin = origins::responds("200 OK", &[], "{}");
    let a = Agent::start(origin.port(), "resend_window = \"1s\"", &[]);
    assert_eq!(a.post(BODY).status, 200);
    assert_eq!(a.post("{\"amount\":6}").status, 200);
    assert_eq!(twins_held(&a), Some(2), "one entry per distinct request");
    // The daemon sweeps the index every 10 s.
    let forgotten = (0..150).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        twins_held(&a) == Some(0)
    });
    assert!(forgotten, "still held: {:?}", twins_held(&a));
}

#[test]
fn a_resend_after_kill_and_restart_is_still_refused() {
    let origin = origins::closes_without_response();
    let a = Agent::start(origin.port(), "", &[]);
    let first = a.post(BODY);
    assert_eq!(first.status, 502, "{}", first.head);
    let a = a.restart("");
    let again = a.post(BODY);
    assert_refused(
        &a,
        &again,
        &first.id(),
        Value::from("REMOTE_OUTCOME_UNKNOWN"),
        "unknown",
    );
    assert_eq!(origin.hits(), 1);
}

#[test]
fn a_twin_committed_with_a_500_refuses_the_resend() {
    let origin = origins::responds("500 Internal Server Error", &[], "{\"error\":\"boom\"}");
    let a = Agent::start(origin.port(), "", &[]);
    let first = a.post(BODY);
    assert_eq!(first.status, 500, "{}", first.head);
    let again = a.post(BODY);
    assert_refused(&a, &again, &first.id(), Value::Null, "committed");
    assert_eq!(origin.hits(), 1);
}

#[test]
fn a_delivered_answer_leaves_the_resend_free_and_the_new_one_is_the_twin() {
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::Always);
    let a = Agent::start(origin.port(), "", &[]);
    let first = a.post(BODY);
    assert_eq!(first.status, 201, "{}", first.head);
    let second = a.post(BODY);
    assert_eq!(second.status, 201, "{}", second.body);
    assert_ne!(first.id(), second.id());
    assert_eq!(second.header("postern-replayed"), None);
    assert_eq!(origin.effects(), 2);
    let third = a.post(BODY);
    assert_eq!(third.status, 201, "{}", third.body);
    assert_eq!(origin.effects(), 3);
}

#[test]
fn a_twin_whose_agent_left_before_the_answer_replays_its_stored_result() {
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::After(Duration::from_millis(1500)));
    let a = Agent::start(origin.port(), "", &[]);
    let gave_up = a.send("POST", BODY, &[], &["--max-time", "0.5"]);
    assert_eq!(gave_up.status, 0, "{}", gave_up.head);
    let twin = a.newest()["invocation_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let rec = a.record_when(&twin, |r| r["code"] == "RESULT_DELIVERY_FAILED");
    assert_eq!(rec["outcome"], "committed", "{rec}");
    let again = a.post(BODY);
    assert_eq!(again.status, 201, "{}\n{}", again.head, again.body);
    assert_eq!(
        again.header("postern-replayed"),
        Some("true"),
        "{}",
        again.head
    );
    assert_eq!(again.id(), twin);
    assert_eq!(again.body, "{\"charge\":\"ch_1\"}");
    assert_eq!(origin.effects(), 1, "the resend ran the charge again");
}

#[test]
fn two_identical_posts_in_parallel_both_go_out() {
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::After(Duration::from_millis(1000)));
    let a = std::sync::Arc::new(Agent::start(origin.port(), "", &[]));
    let first = {
        let a = a.clone();
        std::thread::spawn(move || a.post(BODY))
    };
    std::thread::sleep(Duration::from_millis(300));
    let second = a.post(BODY);
    let first = first.join().unwrap();
    assert_eq!(
        (first.status, second.status),
        (201, 201),
        "{}\n{}",
        first.body,
        second.body
    );
    assert_ne!(first.id(), second.id());
    assert_eq!(origin.effects(), 2);
}

#[test]
fn many_identical_posts_at_once_all_go_out() {
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::After(Duration::from_millis(300)));
    let a = std::sync::Arc::new(Agent::start(origin.port(), "", &[]));
    let posts: Vec<_> = (0..12)
        .map(|_| {
            let a = a.clone();
            std::thread::spawn(move || a.post(BODY))
        })
        .collect();
    let replies: Vec<Reply> = posts.into_iter().map(|t| t.join().unwrap()).collect();
    for r in &replies {
        assert_eq!(r.status, 201, "{}\n{}", r.head, r.body);
    }
    assert_eq!(origin.effects(), 12);
}

/// Agents that close after each answer (`Connection: close`): a twin whose agent read its
/// answer and left while postern still records the delivery is no departure, so an identical
/// request beside it goes out (the kernel shows that close as a hang-up).
#[test]
fn identical_posts_from_agents_that_close_after_each_answer_all_go_out() {
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::After(Duration::ZERO));
    let a = std::sync::Arc::new(Agent::start(origin.port(), "", &[]));
    let agents: Vec<_> = (0..4)
        .map(|_| {
            let a = a.clone();
            std::thread::spawn(move || {
                (0..25)
                    .map(|_| a.send("POST", BODY, &["Connection: close"], &[]))
                    .filter(|r| r.status != 201)
                    .map(|r| format!("{}\n{}", r.head, r.body))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let refused: Vec<String> = agents
        .into_iter()
        .flat_map(|t| t.join().unwrap_or_default())
        .collect();
    assert!(
        refused.is_empty(),
        "{} refused: {:?}",
        refused.len(),
        refused.first()
    );
    assert_eq!(origin.effects(), 100);
}

#[test]
fn an_sdk_that_timed_out_resends_while_its_twin_runs_and_gets_attempt_in_progress() {
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::After(Duration::from_millis(2500)));
    let a = Agent::start(origin.port(), "", &[]);
    let gave_up = a.send("POST", BODY, &[], &["--max-time", "0.5"]);
    assert_eq!(gave_up.status, 0, "{}", gave_up.head);
    let twin = a.newest()["invocation_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let rec = a.record_when(&twin, |r| r["code"] == "CALLER_CANCELLED");
    assert_eq!(rec["code"], "CALLER_CANCELLED", "{rec}");
    let again = a.post(BODY);
    assert_eq!(again.status, 409, "{}\n{}", again.head, again.body);
    assert_eq!(again.error().0, "ATTEMPT_IN_PROGRESS", "{}", again.body);
    assert_eq!(again.header("retry-after"), Some("1"), "{}", again.head);
    assert_eq!(again.id(), twin);
    assert_eq!(origin.hits(), 1, "the resend reached the origin");
    // Once the twin's answer is stored, the next resend gets it.
    a.record_when(&twin, |r| r["code"] == "RESULT_DELIVERY_FAILED");
    let later = a.post(BODY);
    assert_eq!(later.status, 201, "{}", later.body);
    assert_eq!(later.header("postern-replayed"), Some("true"));
    assert_eq!(origin.effects(), 1);
}

#[test]
fn an_unknown_twin_with_a_generated_key_is_retried_with_that_key() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::DropsFirst);
    let a = Agent::start(origin.port(), GENERATING, &[]);
    let first = a.post(BODY);
    assert_eq!(first.status, 502, "{}", first.head);
    assert_eq!(first.error().3, "same_idempotency_key", "{}", first.body);
    let key = first
        .header("idempotency-key")
        .unwrap_or_default()
        .to_owned();
    assert!(key.starts_with("pk_"), "{}", first.head);
    let again = a.post(BODY);
    assert_eq!(again.status, 201, "{}\n{}", again.head, again.body);
    assert_eq!(
        again.id(),
        first.id(),
        "the answer is the twin's new generation"
    );
    assert_eq!(again.header("idempotency-key"), Some(key.as_str()));
    assert_eq!(origin.hits(), 2);
    assert_eq!(origin.effects(), 1, "the origin applied the charge twice");
    let sent: Vec<_> = origin
        .requests()
        .iter()
        .map(|r| crate::retry_origins::header(r, "idempotency-key"))
        .collect();
    assert_eq!(sent, vec![Some(key.clone()), Some(key)]);
    let rec = a.record_when(&first.id(), |r| r["outcome"] == "committed");
    assert_eq!(rec["generation"], 2, "{rec}");
    let leased = a
        .kinds(&first.id())
        .iter()
        .filter(|k| *k == "RETRY_LEASED")
        .count();
    assert_eq!(leased, 1);
}

#[test]
fn two_identical_resends_at_once_do_not_both_go_out() {
    // The origin ignores keys: every request that reaches it runs the charge.
    let origin = KeyedOrigin::start(
        Policy::Ignores,
        Answer::DropsFirstThenAfter(Duration::from_millis(800)),
    );
    let a = std::sync::Arc::new(Agent::start(origin.port(), GENERATING, &[]));
    let first = a.post(BODY);
    assert_eq!(first.status, 502, "{}", first.head);
    let resends: Vec<_> = (0..2)
        .map(|_| {
            let a = a.clone();
            std::thread::spawn(move || a.post(BODY))
        })
        .collect();
    let replies: Vec<Reply> = resends.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(origin.hits(), 2, "both resends went out");
    let mut statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        vec![201, 409],
        "{:?}",
        replies.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    let refused = replies.iter().find(|r| r.status == 409).map(Reply::error);
    assert_eq!(refused.map(|e| e.0), Some("ATTEMPT_IN_PROGRESS".to_owned()));
    assert!(replies.iter().all(|r| r.id() == first.id()));
}

#[cfg(feature = "failpoints")]
mod crash {
    use super::*;

    /// The preflight and the twin entry are one write: a crash right after it, before
    /// dispatch, leaves a `not_attempted` twin, so the resend goes out.
    #[test]
    fn a_crash_after_the_twin_entry_before_dispatch_leaves_the_resend_free() {
        let origin = KeyedOrigin::start(Policy::Ignores, Answer::Always);
        let mut a = Agent::start(
            origin.port(),
            "",
            &[("POSTERN_CRASH_AFTER", "PREFLIGHT_VALIDATED")],
        );
        let crashed = a.post(BODY);
        assert_eq!(crashed.status, 0, "{}", crashed.head);
        assert!(a.daemon.wait_exit(Duration::from_secs(5)).is_some());
        let a = a.restart("");
        let twin = a.newest();
        assert_eq!(twin["code"], "BROKER_RESTARTED_BEFORE_DISPATCH", "{twin}");
        assert_eq!(origin.hits(), 0);
        let again = a.post(BODY);
        assert_eq!(again.status, 201, "{}", again.body);
        assert_eq!(origin.effects(), 1);
    }

    /// A crash once `DISPATCH_STARTED` is durable: the twin is `unknown` after the
    /// restart (BROKER_RESTARTED) and the resend is refused.
    #[test]
    fn a_crash_after_dispatch_refuses_the_resend_after_the_restart() {
        let origin = KeyedOrigin::start(Policy::Ignores, Answer::Always);
        let mut a = Agent::start(
            origin.port(),
            "",
            &[("POSTERN_CRASH_AFTER", "DISPATCH_STARTED")],
        );
        let crashed = a.post(BODY);
        assert_eq!(crashed.status, 0, "{}", crashed.head);
        assert!(a.daemon.wait_exit(Duration::from_secs(5)).is_some());
        let a = a.restart("");
        let twin = a.newest();
        assert_eq!(twin["code"], "BROKER_RESTARTED", "{twin}");
        let id = twin["invocation_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let again = a.post(BODY);
        assert_refused(&a, &again, &id, Value::from("BROKER_RESTARTED"), "unknown");
        assert_eq!(origin.hits(), 0);
    }
}

#[test]
fn a_placeholder_spelt_another_way_is_still_the_same_request() {
    let origin = origins::closes_without_response();
    let home = Home::new();
    let key = "resend-placeholder-vault-key";
    assert!(
        crate::support::secret_set(&home, "k", "resend-secret-value", Some(key))
            .status
            .success()
    );
    let extra = "credential = \"k\"\n[[credentials]]\nid = \"k\"\nsecret = \"k\"\ninject = { header = \"Authorization\", format = \"Bearer {secret}\" }";
    let daemon = Daemon::start_with(
        &home,
        Some(&config(origin.port(), extra)),
        &[("POSTERN_VAULT_KEY", key)],
    );
    let a = Agent {
        home,
        daemon,
        port: origin.port(),
    };
    let first = a.send("POST", BODY, &["Authorization: Bearer postern:k"], &[]);
    assert_eq!(first.status, 502, "{}", first.head);
    for spelt in [
        "Authorization: postern:k",
        "Authorization: bearer postern:k",
        "Authorization: token postern:k",
    ] {
        let again = a.send("POST", BODY, &[spelt], &[]);
        assert_eq!(again.status, 409, "{spelt}: {}", again.head);
        assert!(
            again.head.contains("RESEND_REFUSED"),
            "{spelt}: {}",
            again.head
        );
    }
    // Without the placeholder the secret is injected all the same: the same operation.
    let bare = a.post(BODY);
    assert_eq!(bare.status, 409, "{}", bare.head);
    assert_eq!(origin.hits(), 1, "one dispatch, however the key was spelt");
}

/// Issue 40 (low 4): a route can take `Postern-Resend: deliberate` away from agents.
#[test]
fn a_route_that_forbids_deliberate_resends_judges_them_like_any_other() {
    let origin = origins::closes_without_response();
    let a = Agent::start(origin.port(), "allow_deliberate_resend = false", &[]);
    let first = a.post(BODY);
    assert_eq!(first.status, 502, "{}", first.head);
    let deliberate = a.send("POST", BODY, &["Postern-Resend: deliberate"], &[]);
    assert_refused(
        &a,
        &deliberate,
        &first.id(),
        Value::from("REMOTE_OUTCOME_UNKNOWN"),
        "unknown",
    );
    assert_eq!(origin.hits(), 1, "nothing went out again");
}

/// Issue 40 (low 3): a resend sent within a millisecond of its twin's agent leaving was
/// judged a parallel request and sent (3 of 15 trials). Each trial: the twin reaches a slow
/// origin, its agent closes, and the identical request goes at once; the twin still runs
/// and its agent left, so the resend must get `ATTEMPT_IN_PROGRESS` and send nothing.
/// Measured before the fix: all 15 sent again (a resend 10 ms after the close: none).
#[test]
fn a_resend_right_after_its_twins_agent_left_is_not_sent_again() {
    use std::io::{Read, Write};
    const TRIALS: usize = 15;
    let origin = origins::slow_head(Duration::from_secs(4), "slow");
    let a = Agent::start(origin.port(), "", &[]);
    let addr = a.daemon.proxy.trim_start_matches("http://").to_owned();
    let request = |n: usize| {
        let body = format!("{{\"trial\":{n}}}");
        format!(
            "POST http://pay.test:{port}/v1/charges HTTP/1.1\r\nHost: pay.test:{port}\r\n\
             Proxy-Authorization: Basic YTphZ2VudC1hLXRva2VuLTAxMjM=\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len(),
            port = origin.port()
        )
    };
    let mut sent_twice = Vec::new();
    for n in 0..TRIALS {
        let mut twin = std::net::TcpStream::connect(&addr).unwrap();
        twin.write_all(request(n).as_bytes()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while origin.hits() < n + 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(twin);
        let mut resend = std::net::TcpStream::connect(&addr).unwrap();
        resend.write_all(request(n).as_bytes()).unwrap();
        resend
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut head = [0u8; 12];
        let _ = resend.read_exact(&mut head);
        if !head.starts_with(b"HTTP/1.1 409") {
            sent_twice.push((n, String::from_utf8_lossy(&head).into_owned()));
        }
    }
    assert!(
        sent_twice.is_empty(),
        "resends not held back: {sent_twice:?}"
    );
    assert_eq!(
        origin.hits(),
        TRIALS,
        "each trial's request reached the origin once"
    );
}
