//! A fleet (SPEC §7): two postern nodes on one PostgreSQL the test starts, each with its
//! own journal. What must hold across them: one key is dispatched once whichever node
//! gets it, a resend on the other node is not sent again, any node answers for any
//! invocation (also with its owner down), a store that does not answer refuses what needs
//! it and serves the rest, and the anchors catch a node whose history was rewritten.

mod balancer;
pub(crate) mod pg;

use std::time::Duration;

use serde_json::Value;

use crate::idempotency::CONTRACT;
use crate::retry_origins::{Answer, KeyedOrigin, Policy};
use crate::support::{Daemon, Home, TEST_CONFIG, curl, get_json};
use pg::Postgres;

const AGENT: &str = "a";
const TOKEN: &str = "ta-0123456789abcdef";

/// One node's config: a keyed POST route and a plain route (GET) to the origin.
fn config(node: &str, url: &str, port: u16) -> String {
    format!(
        "{TEST_CONFIG}\n[cluster]\npostgres = \"{url}\"\nnode = \"{node}\"\n\
         [[agents]]\nid = \"{AGENT}\"\ntoken = \"{TOKEN}\"\n\
         [[routes]]\nid = \"payments\"\nmatch = {{ scheme = \"http\", host = \"pay.test\", port = {port}, methods = [\"POST\"] }}\n\
         resolve = \"127.0.0.1:{port}\"\n{CONTRACT}\n\
         [[routes]]\nid = \"orders\"\nmatch = {{ scheme = \"http\", host = \"pay.test\", port = {port}, path_prefix = \"/v1/orders\", methods = [\"POST\"] }}\n\
         resolve = \"127.0.0.1:{port}\"\n\
         [[routes]]\nid = \"reads\"\nmatch = {{ scheme = \"http\", host = \"pay.test\", port = {port}, methods = [\"GET\"] }}\n\
         resolve = \"127.0.0.1:{port}\"\n"
    )
}

struct Node {
    home: Home,
    daemon: Daemon,
    id: &'static str,
}

impl Node {
    fn start(id: &'static str, pg: &Postgres, port: u16) -> Self {
        Self::start_with(id, pg, port, &[])
    }

    fn start_with(id: &'static str, pg: &Postgres, port: u16, envs: &[(&str, &str)]) -> Self {
        let home = Home::new();
        let daemon = Daemon::start_with(&home, Some(&config(id, &pg.url(), port)), envs);
        Self { home, daemon, id }
    }

    /// The same node (its journal) started again, after it stopped or crashed.
    fn restart(self, pg: &Postgres, port: u16) -> Self {
        let Node {
            home,
            mut daemon,
            id,
        } = self;
        if daemon.wait_exit(Duration::from_millis(100)).is_none() {
            daemon.kill();
        }
        let daemon = Daemon::start(&home, Some(&config(id, &pg.url(), port)));
        Self { home, daemon, id }
    }

    fn send(&self, method: &str, port: u16, key: Option<&str>, body: &str) -> Reply {
        self.send_to("/v1/charges", method, port, key, body)
    }

    fn send_to(&self, path: &str, method: &str, port: u16, key: Option<&str>, body: &str) -> Reply {
        let proxy = self
            .daemon
            .proxy
            .replacen("http://", &format!("http://{AGENT}:{TOKEN}@"), 1);
        let url = format!("http://pay.test:{port}{path}");
        let key = key.map(|k| format!("Idempotency-Key: {k}"));
        let mut args = vec!["-x", proxy.as_str(), "-X", method];
        if method == "POST" {
            args.extend([
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                body,
            ]);
        }
        if let Some(k) = &key {
            args.extend(["-H", k.as_str()]);
        }
        args.push(&url);
        let (status, body, head) = curl(&args);
        Reply { status, body, head }
    }

    fn admin(&self, path: &str) -> (u16, Value) {
        get_json(&self.daemon.url(path), &[])
    }

    /// `http://postern.internal/…` through this node's proxy, as the agent.
    fn internal(&self, path: &str) -> (u16, Value) {
        let proxy = self
            .daemon
            .proxy
            .replacen("http://", &format!("http://{AGENT}:{TOKEN}@"), 1);
        let url = format!("http://postern.internal{path}");
        let (status, body, _) = curl(&["-x", proxy.as_str(), &url]);
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }
}

struct Reply {
    status: u16,
    body: String,
    head: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn id(&self) -> String {
        self.header("postern-invocation")
            .unwrap_or_default()
            .to_owned()
    }

    fn envelope(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    fn code(&self) -> String {
        self.envelope()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

#[test]
fn one_key_sent_to_two_nodes_at_the_same_moment_is_dispatched_once() {
    let pg = Postgres::start();
    // A slow origin keeps the first dispatch open while the other node judges the key.
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::After(Duration::from_millis(30)));
    let port = origin.port();
    let a = Node::start("a", &pg, port);
    let b = Node::start("b", &pg, port);
    let rounds = 50;
    let mut answered = Vec::new();
    for n in 0..rounds {
        let key = format!("fleet-key-{n}");
        let (ra, rb) = std::thread::scope(|s| {
            let ta = s.spawn(|| a.send("POST", port, Some(&key), "{\"amount\":1}"));
            let tb = s.spawn(|| b.send("POST", port, Some(&key), "{\"amount\":1}"));
            (ta.join().unwrap(), tb.join().unwrap())
        });
        answered.push((ra.status, ra.code(), rb.status, rb.code()));
    }
    assert_eq!(
        origin.hits(),
        rounds,
        "one dispatch per key across both nodes: {answered:?}"
    );
    // Each round: one node dispatched (200), the other was told so (in progress, or the
    // stored result replayed), never a second dispatch.
    for (sa, ca, sb, cb) in &answered {
        let ok = |s: &u16, c: &str| *s == 201 || c == "ATTEMPT_IN_PROGRESS";
        assert!(ok(sa, ca) && ok(sb, cb), "{answered:?}");
        assert!(*sa == 201 || *sb == 201, "{answered:?}");
    }
    let keys = pg.sql("SELECT count(*) FROM postern_keys");
    assert_eq!(keys.trim(), rounds.to_string());
}

#[test]
fn a_lost_answer_resent_to_the_other_node_is_not_sent_again() {
    let pg = Postgres::start();
    // The origin acts, then closes without answering: the agent never learns the outcome.
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::DropsFirst);
    let port = origin.port();
    let a = Node::start("a", &pg, port);
    let b = Node::start("b", &pg, port);
    let lost = a.send("POST", port, None, "{\"amount\":7}");
    assert_eq!(lost.status, 502, "{}", lost.body);
    assert_eq!(origin.hits(), 1);
    let first = lost.id();
    // Published behind the request: give it a moment to reach the store.
    let resend = eventually(|| {
        let r = b.send("POST", port, None, "{\"amount\":7}");
        (r.code() == "RESEND_REFUSED").then_some(r)
    });
    assert_eq!(origin.hits(), 1, "the resend on b was not sent again");
    assert_eq!(
        resend.envelope()["evidence"]["resend_of"]["invocation_id"],
        first.as_str()
    );
}

/// On a route without a key contract the twin claim is the lookup (one round trip): the
/// slot a's request holds comes back from the claim and is judged then.
/// Identical requests sent at once, each agent waiting for its own, contend for one twin
/// slot in the store: each goes out (parallel, not a resend), none is refused as if the
/// journal were down (it was 503 `JOURNAL_UNAVAILABLE` under a load test's identical POSTs).
#[test]
fn identical_requests_sent_at_once_to_a_fleet_node_all_go_out() {
    let pg = Postgres::start();
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::After(Duration::from_millis(20)));
    let port = origin.port();
    let a = Node::start("a", &pg, port);
    let n = 24;
    let replies: Vec<Reply> = std::thread::scope(|s| {
        let sent: Vec<_> = (0..n)
            .map(|_| s.spawn(|| a.send_to("/v1/orders", "POST", port, None, "{\"same\":1}")))
            .collect();
        sent.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let statuses: Vec<(u16, String)> = replies.iter().map(|r| (r.status, r.code())).collect();
    assert!(replies.iter().all(|r| r.status == 201), "{statuses:?}");
    assert_eq!(origin.hits(), n, "{statuses:?}");
}

#[test]
fn a_lost_answer_on_a_route_without_a_key_contract_is_not_sent_again_elsewhere() {
    let pg = Postgres::start();
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::DropsFirst);
    let port = origin.port();
    let a = Node::start("a", &pg, port);
    let b = Node::start("b", &pg, port);
    let lost = a.send_to("/v1/orders", "POST", port, None, "{\"n\":1}");
    assert_eq!(lost.status, 502, "{}", lost.body);
    let resend = eventually(|| {
        let r = b.send_to("/v1/orders", "POST", port, None, "{\"n\":1}");
        (r.code() == "RESEND_REFUSED").then_some(r)
    });
    assert_eq!(
        resend.envelope()["evidence"]["resend_of"]["invocation_id"],
        lost.id().as_str()
    );
    assert_eq!(origin.hits(), 1, "not sent again");
    // Another request goes out.
    let other = b.send_to("/v1/orders", "POST", port, None, "{\"n\":2}");
    assert_eq!(other.status, 201, "{}", other.body);
    assert_eq!(origin.hits(), 2);
}

#[test]
fn any_node_answers_for_an_invocation_of_another_also_with_its_owner_down() {
    let pg = Postgres::start();
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::Always);
    let port = origin.port();
    let a = Node::start("a", &pg, port);
    let b = Node::start("b", &pg, port);
    let done = a.send("POST", port, Some("k-answers"), "{\"amount\":3}");
    assert_eq!(done.status, 201, "{}", done.body);
    let id = done.id();
    let record = eventually(|| {
        let (status, v) = b.admin(&format!("/v1/invocations/{id}"));
        (status == 200 && v["outcome"] == "committed").then_some(v)
    });
    assert_eq!(record["node"], "a", "{record}");
    // b's listing shows a's invocation beside its own, naming a.
    let (_, listed) = b.admin("/v1/invocations?limit=10");
    let entry = listed["invocations"].as_array().and_then(|l| {
        l.iter()
            .find(|r| r["invocation_id"] == id.as_str())
            .cloned()
    });
    assert_eq!(
        entry.map(|e| e["node"].clone()),
        Some(Value::from("a")),
        "{listed}"
    );
    let (status, result) = b.admin(&format!("/v1/invocations/{id}/result"));
    assert_eq!(status, 200, "{result}");
    let (status, own) = b.internal(&format!("/v1/invocations/{id}/result"));
    assert_eq!(status, 200, "fetch_result on b: {own}");
    // The same key on b: the stored result, replayed under a's invocation.
    let again = b.send("POST", port, Some("k-answers"), "{\"amount\":3}");
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(again.id(), id);
    assert_eq!(again.header("postern-replayed"), Some("true"));
    assert_eq!(origin.hits(), 1);
    // An action on it is a's to journal: b names the node instead of "not found".
    for action in ["retry", "reconcile"] {
        let url = b.daemon.url(&format!("/v1/invocations/{id}/{action}"));
        let body = r#"{"outcome":"committed","note":"checked"}"#;
        let (status, text, _) = curl(&["-X", "POST", "--data", body, &url]);
        assert_eq!(status, 409, "{action}: {text}");
        assert!(
            text.contains("HELD_BY_ANOTHER_NODE") && text.contains("Node a"),
            "{action}: {text}"
        );
    }
    assert_eq!(origin.hits(), 1);
    // a is gone: b still answers from what a published.
    let _ = a.daemon.terminate();
    let (status, v) = b.admin(&format!("/v1/invocations/{id}"));
    assert_eq!(
        (status, v["outcome"].as_str()),
        (200, Some("committed")),
        "{v}"
    );
    let (status, _) = b.admin(&format!("/v1/invocations/{id}/result"));
    assert_eq!(status, 200);
    drop(a.home);
}

#[test]
fn the_store_away_refuses_what_needs_it_before_dispatch_and_serves_the_rest() {
    let pg = Postgres::start();
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::Always);
    let port = origin.port();
    let a = Node::start("a", &pg, port);
    let ok = a.send("POST", port, Some("k-before"), "{}");
    assert_eq!(ok.status, 201, "{}", ok.body);
    pg.stop();
    let refused = a.send("POST", port, Some("k-during"), "{}");
    assert_eq!(refused.status, 503, "{}", refused.body);
    let env = refused.envelope();
    assert_eq!(env["error"]["code"], "JOURNAL_UNAVAILABLE", "{env}");
    assert_eq!(env["error"]["outcome"], "not_attempted", "{env}");
    assert_eq!(env["evidence"]["store"], "cluster", "{env}");
    // A POST without a key is resend-checked: that needs the store too.
    let resend_checked = a.send("POST", port, None, "{}");
    assert_eq!(
        resend_checked.code(),
        "JOURNAL_UNAVAILABLE",
        "{}",
        resend_checked.body
    );
    assert_eq!(origin.hits(), 1, "nothing dispatched on a guess");
    let read = a.send("GET", port, None, "");
    assert_eq!(
        read.status, 201,
        "an idempotent request needs no shared check: {}",
        read.body
    );
    let (status, health) = a.admin("/healthz");
    assert_eq!(
        (status, health["status"].as_str()),
        (200, Some("degraded")),
        "{health}"
    );
    assert_eq!(health["cluster"], "unreachable");
    pg.start_again();
    let back = eventually(|| {
        let r = a.send("POST", port, Some("k-after"), "{}");
        (r.status == 201).then_some(r)
    });
    assert_eq!(back.status, 201);
    let (_, health) = a.admin("/healthz");
    assert_eq!(health["cluster"], "ok", "{health}");
    assert_eq!(health["status"], "ok", "{health}");
}

#[test]
fn a_node_lost_after_dispatch_started_is_answered_for_by_the_other_and_settled_by_its_recovery() {
    let pg = Postgres::start();
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::Always);
    let port = origin.port();
    // a dies the moment DISPATCH_STARTED is durable, as under kill -9.
    let a = Node::start_with(
        "a",
        &pg,
        port,
        &[("POSTERN_CRASH_AFTER", "DISPATCH_STARTED")],
    );
    let b = Node::start("b", &pg, port);
    let lost = a.send("POST", port, Some("k-crash"), "{\"amount\":9}");
    assert_eq!(
        lost.status, 0,
        "the agent's connection died with a: {}",
        lost.body
    );
    // b: the key is a's, unsettled there; it may have been sent, so nothing is sent again.
    let meanwhile = b.send("POST", port, Some("k-crash"), "{\"amount\":9}");
    assert_eq!(
        meanwhile.code(),
        "ATTEMPT_IN_PROGRESS",
        "{}",
        meanwhile.body
    );
    assert_eq!(meanwhile.envelope()["evidence"]["node"], "a");
    assert_ne!(meanwhile.envelope()["error"]["outcome"], "not_attempted");
    let id = meanwhile.envelope()["invocation_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let a = a.restart(&pg, port);
    // a's recovery settles it (unknown, BROKER_RESTARTED) and publishes that.
    let record = eventually(|| {
        let (_, v) = b.admin(&format!("/v1/invocations/{id}"));
        (v["code"] == "BROKER_RESTARTED").then_some(v)
    });
    assert_eq!(record["outcome"], "unknown", "{record}");
    assert_eq!(record["node"], "a");
    // The same key on b: a new generation of a's invocation, taken over and sent by b.
    let on_b = b.send("POST", port, Some("k-crash"), "{\"amount\":9}");
    assert_eq!(on_b.status, 201, "{}", on_b.body);
    assert_eq!(on_b.id(), id, "a new generation of the same invocation");
    assert_eq!(origin.hits(), 1);
    let record = eventually(|| {
        let (_, v) = a.admin(&format!("/v1/invocations/{id}"));
        (v["outcome"] == "committed").then_some(v)
    });
    assert_eq!(record["node"], "b", "{record}");
    assert_eq!(record["generation"], 2, "{record}");
    // And on a, the key's invocation is settled now: its result, not a third dispatch.
    let on_a = a.send("POST", port, Some("k-crash"), "{\"amount\":9}");
    assert_eq!(on_a.status, 201, "{}", on_a.body);
    assert_eq!(on_a.header("postern-replayed"), Some("true"));
    assert_eq!(origin.hits(), 1);
}

#[test]
fn a_lease_that_ran_out_on_one_node_is_superseded_by_the_other_and_never_dispatched() {
    let pg = Postgres::start();
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::Always);
    let port = origin.port();
    let ttl = ("POSTERN_LEASE_TTL_MS", "400");
    // a's worker stalls 3 s after claiming the key, past its 400 ms lease.
    let a = Node::start_with(
        "a",
        &pg,
        port,
        &[ttl, ("POSTERN_PAUSE_AFTER_LEASE_MS", "3000")],
    );
    let b = Node::start_with("b", &pg, port, &[ttl]);
    let stalled = std::thread::scope(|s| {
        let first = s.spawn(|| a.send("POST", port, Some("k-lapse"), "{}"));
        std::thread::sleep(Duration::from_millis(1000));
        let taken = b.send("POST", port, Some("k-lapse"), "{}");
        assert_eq!(
            taken.status, 201,
            "b superseded the lapsed worker: {}",
            taken.body
        );
        assert_eq!(origin.hits(), 1);
        let stalled = first.join().unwrap();
        assert_eq!(stalled.id(), taken.id(), "one invocation, two generations");
        stalled
    });
    assert_eq!(stalled.code(), "ATTEMPT_IN_PROGRESS", "{}", stalled.body);
    assert_eq!(origin.hits(), 1, "the superseded worker on a sent nothing");
    let record = eventually(|| {
        let (_, v) = a.admin(&format!("/v1/invocations/{}", stalled.id()));
        (v["outcome"] == "committed").then_some(v)
    });
    assert_eq!(record["generation"], 2, "{record}");
    // a's own record of generation 1 was closed then: its restart has nothing to recover.
    let a = a.restart(&pg, port);
    assert!(
        !a.daemon.stderr().contains(&stalled.id()),
        "{}",
        a.daemon.stderr()
    );
}

/// The openai SDK (its own retries) behind a round-robin balancer: the first connection,
/// to a, is cut while a's dispatch runs; the SDK's retry reaches b, which replays a's result
/// from the directory or says the attempt is in progress; the action runs once.
#[test]
fn an_sdk_retry_that_lands_on_the_other_node_does_not_run_the_action_again() {
    let pg = Postgres::start();
    let origin = crate::origins::Origin::script(|stream, _request| {
        std::thread::sleep(Duration::from_millis(300));
        let body = r#"{"id":"chatcmpl-fleet","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[]}"#;
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = std::io::Write::write_all(stream, head.as_bytes());
        let _ = std::io::Write::write_all(stream, body.as_bytes());
    });
    let port = origin.port();
    let a = Node::start("a", &pg, port);
    let b = Node::start("b", &pg, port);
    let balancer = balancer::RoundRobin::start(&[&a.daemon.proxy, &b.daemon.proxy]);
    let proxy = format!("http://{AGENT}:{TOKEN}@127.0.0.1:{}", balancer.port());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/agent.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script)
        .arg("openai")
        .arg(format!("http://pay.test:{port}/v1"));
    for var in [
        "NO_PROXY",
        "no_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "OPENAI_BASE_URL",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd
        .env("HTTP_PROXY", &proxy)
        .env("http_proxy", &proxy)
        .env("OPENAI_API_KEY", "sk-agent-own-key")
        .output()
        .expect("python3 with the openai SDK (tests/run installs it)");
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let result: Value =
        serde_json::from_str(line.lines().last().unwrap_or("")).unwrap_or_else(|_| {
            panic!(
                "no result line: {line} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(
        balancer.connections() >= 2,
        "the SDK retried through the balancer: {result}"
    );
    assert_eq!(
        origin.hits(),
        1,
        "one execution across both nodes: {result}"
    );
    let answered = result["ok"] == true && result["id"] == "chatcmpl-fleet";
    let refused =
        ["ATTEMPT_IN_PROGRESS", "RESEND_REFUSED"].contains(&result["code"].as_str().unwrap_or(""));
    assert!(answered || refused, "{result}");
}

/// The database URL is the daemon's secret, read from its environment: `postern env` (and
/// `postern jail`, which reads the config the same way and withholds every variable it
/// names) works in a shell that does not hold it, and never prints it.
#[test]
fn a_fleet_nodes_config_is_read_by_the_cli_without_the_database_url() {
    let home = Home::new();
    let file = home.config(&config("a", "env:POSTERN_PG_URL", 9));
    let file = file.to_str().unwrap();
    let init = home.cli(&["init"], &[]);
    assert!(init.status.success(), "{}", crate::support::stderr(&init));
    let out = home.cli(&["env", "--agent", AGENT, "--config", file], &[]);
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    let url = "postgres://postern:pg-secret-7f3a@127.0.0.1:5/postgres";
    let out = home.cli(
        &["env", "--agent", AGENT, "--config", file],
        &[("POSTERN_PG_URL", url)],
    );
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    let printed = format!(
        "{}{}",
        crate::support::stdout(&out),
        crate::support::stderr(&out)
    );
    assert!(!printed.contains("pg-secret-7f3a"), "{printed}");
}

/// Retries `f` for up to 10 s until it answers.
fn eventually<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "not within 10 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}
