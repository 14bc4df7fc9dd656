//! Idempotency contracts, leases, generations and retry budgets (SPEC §3.4, §1.7) against
//! loopback origins that count their side effects, driven by real curl through the daemon.
//! Keys, replays and hostile origins here; what the fingerprint covers in `headers`; leases,
//! generations and budgets in `leases`; crash cells in `crash`.

mod crash;
mod headers;
mod leases;

use std::time::Duration;

use serde_json::Value;

use crate::retry_origins::{Answer, KeyedOrigin, Policy, header};
use crate::support::{Daemon, Home, TEST_CONFIG, curl, get_json, stdout};

pub(super) const CONTRACT: &str = "idempotency = { header = \"Idempotency-Key\", scope = \"payments.create\", retention = \"1h\", safe_margin = \"10m\", generate = false }";
pub(super) const GENERATING: &str = "idempotency = { header = \"Idempotency-Key\", scope = \"payments.create\", retention = \"1h\", safe_margin = \"10m\", generate = true }";

/// Two agents and one POST route to `pay.test:<port>`, pinned to loopback.
pub(super) fn config(port: u16, route_extra: &str) -> String {
    format!(
        "{TEST_CONFIG}\n[[agents]]\nid = \"a\"\ntoken = \"ta-0123456789abcdef\"\n[[agents]]\nid = \"b\"\ntoken = \"tb-0123456789abcdef\"\n\
         [[routes]]\nid = \"payments\"\nmatch = {{ scheme = \"http\", host = \"pay.test\", port = {port}, methods = [\"POST\"] }}\n\
         resolve = \"127.0.0.1:{port}\"\n{route_extra}\n"
    )
}

pub(super) struct Cell {
    pub home: Home,
    pub daemon: Daemon,
    pub port: u16,
}

/// What the agent saw.
pub(super) struct Reply {
    pub status: u16,
    pub body: String,
    pub head: String,
}

impl Reply {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    pub(super) fn id(&self) -> String {
        self.header("postern-invocation")
            .unwrap_or_default()
            .to_owned()
    }

    pub(super) fn outcome(&self) -> &str {
        self.header("postern-outcome").unwrap_or_default()
    }

    pub(super) fn envelope(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// (code, phase, outcome, retry) of the envelope.
    pub(super) fn error(&self) -> (String, String, String, String) {
        let e = &self.envelope()["error"];
        let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
        (s("code"), s("phase"), s("outcome"), s("retry"))
    }
}

pub(super) fn four(
    code: &str,
    phase: &str,
    outcome: &str,
    retry: &str,
) -> (String, String, String, String) {
    (code.into(), phase.into(), outcome.into(), retry.into())
}

impl Cell {
    pub(super) fn start(port: u16, route_extra: &str, envs: &[(&str, &str)]) -> Self {
        let home = Home::new();
        let daemon = Daemon::start_with(&home, Some(&config(port, route_extra)), envs);
        Self { home, daemon, port }
    }

    /// Stops the daemon (if it still runs) and starts a new one on the same journal.
    pub(super) fn restart(self, route_extra: &str) -> Self {
        let Cell { home, daemon, port } = self;
        let _ = daemon.terminate();
        let daemon = Daemon::start(&home, Some(&config(port, route_extra)));
        Self { home, daemon, port }
    }

    /// POST through the proxy as `agent`, with an idempotency key if given.
    pub(super) fn post(&self, agent: &str, key: Option<&str>, body: &str) -> Reply {
        self.post_with(agent, key, &[], body)
    }

    /// `post` with more request headers (`Name: value`).
    pub(super) fn post_with(
        &self,
        agent: &str,
        key: Option<&str>,
        headers: &[&str],
        body: &str,
    ) -> Reply {
        let proxy = self.daemon.proxy.replacen(
            "http://",
            &format!("http://{agent}:t{agent}-0123456789abcdef@"),
            1,
        );
        let url = format!("http://pay.test:{}/v1/charges", self.port);
        let key_header = key.map(|k| format!("Idempotency-Key: {k}"));
        let mut args = vec![
            "-x",
            proxy.as_str(),
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
        ];
        if let Some(h) = &key_header {
            args.extend(["-H", h.as_str()]);
        }
        for h in headers {
            args.extend(["-H", h]);
        }
        args.push(&url);
        let (status, body, head) = curl(&args);
        Reply { status, body, head }
    }

    pub(super) fn record(&self, id: &str) -> Value {
        get_json(&self.daemon.url(&format!("/v1/invocations/{id}")), &[]).1
    }

    pub(super) fn events(&self, id: &str) -> Vec<Value> {
        let (_, v) = get_json(
            &self.daemon.url(&format!("/v1/invocations/{id}/events")),
            &[],
        );
        v["events"].as_array().cloned().unwrap_or_default()
    }

    /// (kind, generation) of every event.
    pub(super) fn kinds(&self, id: &str) -> Vec<(String, u64)> {
        self.events(id)
            .iter()
            .map(|e| {
                let kind = e["kind"].as_str().unwrap_or_default().to_owned();
                (kind, e["generation"].as_u64().unwrap_or(0))
            })
            .collect()
    }

    pub(super) fn decide(&self, id: &str) -> String {
        stdout(&self.daemon.cli(&["decide", id], &[]))
            .trim()
            .to_owned()
    }

    /// Waits until the record satisfies `pred` (an exchange settles in its own task).
    pub(super) fn record_when(&self, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..100 {
            let r = self.record(id);
            if pred(&r) {
                return r;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.record(id)
    }
}

pub(super) fn count(kinds: &[(String, u64)], kind: &str) -> usize {
    kinds.iter().filter(|(k, _)| k == kind).count()
}

pub(super) fn generations_of(kinds: &[(String, u64)], kind: &str) -> Vec<u64> {
    kinds
        .iter()
        .filter(|(k, _)| k == kind)
        .map(|(_, g)| *g)
        .collect()
}

#[test]
fn a_generated_key_is_journaled_sent_upstream_shown_to_the_agent_and_replays() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::Always);
    let c = Cell::start(origin.port(), GENERATING, &[]);
    let first = c.post("a", None, "{\"amount\":5}");
    assert_eq!(first.status, 201, "{}", first.head);
    let key = first
        .header("idempotency-key")
        .unwrap_or_default()
        .to_owned();
    assert!(key.starts_with("pk_") && key.len() == 29, "{}", first.head);
    let sent = header(&origin.requests()[0], "idempotency-key");
    assert_eq!(
        sent.as_deref(),
        Some(key.as_str()),
        "the origin got the key"
    );
    let id = first.id();
    let r = c.record(&id);
    let idem = &r["evidence"]["idempotency"];
    assert_eq!(idem["key"], key.as_str(), "{r}");
    assert_eq!(idem["scope"], "payments.create");
    assert_eq!(idem["remote_contract"], "configured");
    assert_eq!(idem["fingerprint"], r["evidence"]["fingerprint"]);
    assert!(idem["safe_until"].is_string(), "{r}");
    let preflight = c
        .events(&id)
        .into_iter()
        .find(|e| e["kind"] == "PREFLIGHT_VALIDATED")
        .unwrap_or_default();
    assert_eq!(preflight["data"]["idempotency"]["key"], key.as_str());
    assert!(preflight["data"]["safe_until_ms"].is_i64());

    // The agent reuses the key it was shown: the stored result, nothing dispatched.
    let again = c.post("a", Some(&key), "{\"amount\":5}");
    assert_eq!(
        (again.status, again.body.as_str()),
        (201, first.body.as_str())
    );
    assert_eq!(again.id(), id);
    assert_eq!(again.header("postern-replayed"), Some("true"));
    assert_eq!(
        again.outcome(),
        "outcome=committed, phase=remote_execution, retry=never"
    );
    assert_eq!((origin.hits(), origin.effects()), (1, 1));
    assert_eq!(first.header("postern-replayed"), None);
}

#[test]
fn a_route_without_a_contract_neither_adds_nor_trusts_a_key() {
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::DropsAll);
    // Resend checks off: this is about the key alone (an identical resend would be refused).
    let c = Cell::start(origin.port(), "resend_window = \"0s\"", &[]);
    let first = c.post("a", Some("agent-key-1"), "{}");
    assert_eq!(first.status, 502, "{}", first.body);
    assert_eq!(
        first.error(),
        four(
            "REMOTE_OUTCOME_UNKNOWN",
            "remote_execution",
            "unknown",
            "reconcile"
        )
    );
    assert!(first.envelope()["evidence"].get("idempotency").is_none());
    assert_eq!(
        header(&origin.requests()[0], "idempotency-key").as_deref(),
        Some("agent-key-1"),
        "forwarded untouched"
    );
    assert_eq!(c.decide(&first.id()), "RECONCILE");
    let second = c.post("a", Some("agent-key-1"), "{}");
    assert_ne!(second.id(), first.id(), "no key index on this route");
    assert_eq!(second.header("postern-replayed"), None);
    let third = c.post("a", None, "{}");
    assert_eq!(third.status, 502);
    assert_eq!(header(&origin.requests()[2], "idempotency-key"), None);
    assert_eq!(third.header("idempotency-key"), None, "postern adds none");
    assert_eq!((origin.hits(), origin.effects()), (3, 3));
}

#[test]
fn an_origin_that_honours_keys_runs_a_same_key_retry_after_a_lost_answer_once() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::DropsFirst);
    let c = Cell::start(origin.port(), CONTRACT, &[]);
    let lost = c.post("a", Some("k-honour"), "{\"amount\":7}");
    assert_eq!(lost.status, 502, "{}", lost.body);
    assert_eq!(
        lost.error(),
        four(
            "REMOTE_OUTCOME_UNKNOWN",
            "remote_execution",
            "unknown",
            "same_idempotency_key"
        )
    );
    assert!(lost.outcome().contains("retry=same_idempotency_key"));
    let id = lost.id();
    assert_eq!(
        lost.envelope()["evidence"]["idempotency"]["key"],
        "k-honour"
    );
    assert_eq!(c.decide(&id), "RETRY_SAME_KEY");

    let retried = c.post("a", Some("k-honour"), "{\"amount\":7}");
    assert_eq!(retried.status, 201, "{}", retried.body);
    assert_eq!(retried.id(), id, "the same invocation");
    assert_eq!(
        retried.header("postern-replayed"),
        None,
        "it was dispatched"
    );
    assert_eq!(
        retried.outcome(),
        "outcome=committed, phase=remote_execution, retry=never"
    );
    let r = c.record_when(&id, |r| r["outcome"] == "committed");
    assert_eq!(
        (r["generation"].as_u64(), r["outcome"].as_str()),
        (Some(2), Some("committed"))
    );
    let kinds = c.kinds(&id);
    assert_eq!(generations_of(&kinds, "RETRY_LEASED"), vec![2]);
    assert_eq!(generations_of(&kinds, "DISPATCH_STARTED"), vec![1, 2]);
    assert_eq!(generations_of(&kinds, "RESULT_COMMITTED"), vec![2]);
    let lease = c
        .events(&id)
        .into_iter()
        .find(|e| e["kind"] == "RETRY_LEASED")
        .unwrap_or_default();
    assert_eq!(lease["data"]["generation"], 2);
    assert!(lease["data"]["ttl_ms"].is_u64(), "{lease}");
    // Both tries went out with the key; the origin ran the charge once.
    let keys: Vec<_> = origin
        .requests()
        .iter()
        .map(|r| header(r, "idempotency-key"))
        .collect();
    assert_eq!(keys, vec![Some("k-honour".into()), Some("k-honour".into())]);
    assert_eq!((origin.hits(), origin.effects()), (2, 1));

    let replayed = c.post("a", Some("k-honour"), "{\"amount\":7}");
    assert_eq!((replayed.status, replayed.id()), (201, id));
    assert_eq!(replayed.header("postern-replayed"), Some("true"));
    assert_eq!(origin.hits(), 2);
}

#[test]
fn an_origin_that_ignores_keys_runs_twice_when_postern_must_retry() {
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::DropsFirst);
    let c = Cell::start(origin.port(), CONTRACT, &[]);
    let lost = c.post("a", Some("k-ignore"), "{}");
    assert_eq!(lost.error().3, "same_idempotency_key");
    let retried = c.post("a", Some("k-ignore"), "{}");
    assert_eq!((retried.status, retried.id()), (201, lost.id()));
    // The contract is configuration, not a verified promise: this origin ran it twice.
    assert_eq!((origin.hits(), origin.effects()), (2, 2));
    let r = c.record(&lost.id());
    assert_eq!(r["generation"], 2);
    assert_eq!(
        r["evidence"]["idempotency"]["remote_contract"],
        "configured"
    );
    // A settled key never reaches it again.
    let replayed = c.post("a", Some("k-ignore"), "{}");
    assert_eq!(replayed.header("postern-replayed"), Some("true"));
    assert_eq!((origin.hits(), origin.effects()), (2, 2));
}

#[test]
fn a_changed_payload_under_a_key_is_refused_locally_and_rejected_by_the_origin() {
    let origin = KeyedOrigin::start(Policy::RejectsChangedPayload, Answer::Always);
    let c = Cell::start(origin.port(), CONTRACT, &[]);
    let first = c.post("a", Some("k-pay"), "{\"amount\":1}");
    assert_eq!(first.status, 201);

    let changed = c.post("a", Some("k-pay"), "{\"amount\":1000}");
    assert_eq!(changed.status, 422, "{}", changed.body);
    assert_eq!(
        changed.error(),
        four(
            "IDEMPOTENCY_MISMATCH",
            "validation",
            "not_attempted",
            "after_correction"
        )
    );
    let env = changed.envelope();
    assert_eq!(env["error"]["field"], "headers.idempotency-key");
    let conflict = &env["evidence"]["idempotency_conflict"];
    assert_eq!(conflict["invocation_id"], first.id().as_str(), "{env}");
    assert_ne!(conflict["fingerprint"], conflict["recorded_fingerprint"]);
    assert!(
        changed
            .header("proxy-status")
            .unwrap_or_default()
            .contains("error=proxy_internal_response")
    );
    assert_ne!(changed.id(), first.id(), "journaled as its own invocation");
    let own = c.record(&changed.id());
    assert_eq!(
        (own["outcome"].as_str(), own["code"].as_str()),
        (Some("not_attempted"), Some("IDEMPOTENCY_MISMATCH"))
    );
    assert!(own["route"].is_string(), "the route it matched: {own}");
    assert_eq!(own["route"], c.record(&first.id())["route"], "{own}");
    assert_eq!(origin.hits(), 1, "nothing sent");

    // Keys are scoped per agent: b's use of the same key is b's own, and the origin,
    // which saw the key with another payload, rejects it.
    let other = c.post("b", Some("k-pay"), "{\"amount\":1000}");
    assert_eq!(other.status, 422, "{}", other.body);
    assert_eq!(
        other.body, "{\"error\":\"key reused\"}",
        "the origin's own answer"
    );
    assert_eq!(
        other.outcome(),
        "outcome=rejected, phase=remote_execution, retry=after_correction"
    );
    let r = c.record_when(&other.id(), |r| r["outcome"] == "rejected");
    assert_eq!(r["outcome"], "rejected");
    assert_eq!((origin.hits(), origin.effects()), (2, 1));

    // Two values for the key are not a key.
    let proxy = c
        .daemon
        .proxy
        .replacen("http://", "http://a:ta-0123456789abcdef@", 1);
    let url = format!("http://pay.test:{}/v1/charges", c.port);
    let post = |one: &str, two: &str| {
        let (status, body, _) = curl(&[
            "-x",
            &proxy,
            "-X",
            "POST",
            "-H",
            one,
            "-H",
            two,
            "--data-binary",
            "{}",
            &url,
        ]);
        (status, body)
    };
    let (status, body) = post("Idempotency-Key: x", "Idempotency-Key: y");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("MALFORMED_REQUEST") && body.contains("headers.idempotency-key"));
    assert_eq!(origin.hits(), 2);

    // A key `Connection` names is hop-by-hop: it would never reach the origin, so a retry
    // "with the same key" would be a second, keyless charge.
    let (status, body) = post(
        "Idempotency-Key: hop-1",
        "Connection: keep-alive, Idempotency-KEY",
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("MALFORMED_REQUEST") && body.contains("headers.connection"));
    assert_eq!(origin.hits(), 2, "nothing is sent");
}
