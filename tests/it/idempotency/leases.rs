//! Leases and generations: one active attempt per invocation, a superseded worker stopped
//! before dispatch, retry budgets in the journal, safe-until and key expiry.

use std::time::Duration;

use super::{CONTRACT, Cell, Reply, count, four, generations_of};
use crate::retry_origins::{Answer, KeyedOrigin, Policy, closed_port};

#[test]
fn a_same_key_request_while_the_first_is_in_flight_is_attempt_in_progress() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::After(Duration::from_secs(2)));
    let c = std::sync::Arc::new(Cell::start(origin.port(), CONTRACT, &[]));
    let c1 = c.clone();
    let first = std::thread::spawn(move || c1.post("a", Some("k-slow"), "{}"));
    std::thread::sleep(Duration::from_millis(700));
    let second = c.post("a", Some("k-slow"), "{}");
    let first = first.join().unwrap();
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(second.status, 409, "{}", second.body);
    assert_eq!(
        second.error(),
        four(
            "ATTEMPT_IN_PROGRESS",
            "validation",
            "unknown",
            "fetch_result"
        )
    );
    assert_eq!(second.id(), first.id(), "the original invocation");
    assert_eq!(second.envelope()["invocation_id"], first.id().as_str());
    assert_eq!(second.envelope()["evidence"]["generation"], 1);
    assert_eq!((origin.hits(), origin.effects()), (1, 1));
    let kinds = c.kinds(&first.id());
    assert_eq!(count(&kinds, "DISPATCH_STARTED"), 1);
    assert_eq!(
        count(&kinds, "FAILED"),
        0,
        "the refusal is not written on a live record"
    );
}

#[test]
fn a_worker_whose_lease_expired_is_superseded_and_stopped_before_dispatch() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::Always);
    let envs = [
        ("POSTERN_PAUSE_AFTER_LEASE_MS", "3000"),
        ("POSTERN_LEASE_TTL_MS", "1000"),
    ];
    let c = std::sync::Arc::new(Cell::start(origin.port(), CONTRACT, &envs));
    let c1 = c.clone();
    // The first worker claims the key, then stalls past its lease.
    let stalled = std::thread::spawn(move || c1.post("a", Some("k-lease"), "{}"));
    std::thread::sleep(Duration::from_millis(1500));
    let second = c.post("a", Some("k-lease"), "{}");
    assert_eq!(second.status, 201, "{}", second.body);
    let id = second.id();
    let stalled = stalled.join().unwrap();
    assert_eq!(stalled.id(), id, "both answers name the one invocation");
    assert_eq!(stalled.status, 409, "{}", stalled.body);
    assert_eq!(
        stalled.error(),
        four(
            "ATTEMPT_IN_PROGRESS",
            "validation",
            "committed",
            "fetch_result"
        )
    );
    assert_eq!(
        (origin.hits(), origin.effects()),
        (1, 1),
        "exactly one dispatch"
    );
    let kinds = c.kinds(&id);
    assert_eq!(generations_of(&kinds, "DISPATCH_STARTED"), vec![2]);
    assert_eq!(generations_of(&kinds, "PREFLIGHT_VALIDATED"), vec![1, 2]);
    let lease = c
        .events(&id)
        .into_iter()
        .find(|e| e["kind"] == "RETRY_LEASED")
        .unwrap_or_default();
    assert_eq!(lease["generation"], 2);
    assert_eq!(
        lease["data"]["supersedes"],
        serde_json::json!({"generation": 1, "reason": "lease_expired"})
    );
    let r = c.record(&id);
    assert_eq!(
        (r["generation"].as_u64(), r["outcome"].as_str()),
        (Some(2), Some("committed"))
    );
    let log = c.daemon.stderr();
    assert!(
        log.contains("lease expired") && log.contains("lease_expired"),
        "{log}"
    );
    assert!(log.contains("stopped by the generation check"), "{log}");
}

#[test]
fn the_retry_budget_counts_generations_in_the_journal_across_a_restart() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::DropsAll);
    let extra = format!("{CONTRACT}\nretry_budget = 1");
    let c = Cell::start(origin.port(), &extra, &[]);
    let first = c.post("a", Some("k-budget"), "{}");
    let id = first.id();
    assert_eq!(first.error().3, "same_idempotency_key");
    let second = c.post("a", Some("k-budget"), "{}");
    assert_eq!((second.status, second.id()), (502, id.clone()));
    assert_eq!(c.record(&id)["generation"], 2);
    let spent = c.post("a", Some("k-budget"), "{}");
    assert_eq!(spent.status, 409, "{}", spent.body);
    assert_eq!(
        spent.error(),
        four(
            "RETRY_BUDGET_EXHAUSTED",
            "remote_execution",
            "unknown",
            "reconcile"
        )
    );
    assert_eq!(spent.id(), id);
    assert_eq!(
        spent.envelope()["evidence"]["dispatch_started"],
        true,
        "the last evidence"
    );
    assert_eq!(origin.hits(), 2);
    let r = c.record(&id);
    assert_eq!(r["code"], "RETRY_BUDGET_EXHAUSTED");
    assert_eq!(c.decide(&id), "RECONCILE");

    let c = c.restart(&extra);
    let after = c.post("a", Some("k-budget"), "{}");
    assert_eq!(
        (after.status, after.id()),
        (409, id.clone()),
        "{}",
        after.body
    );
    assert_eq!(after.error().0, "RETRY_BUDGET_EXHAUSTED");
    assert_eq!(origin.hits(), 2, "a restart gave no budget back");
    let kinds = c.kinds(&id);
    let spent_events = c
        .events(&id)
        .iter()
        .filter(|e| e["data"]["code"] == "RETRY_BUDGET_EXHAUSTED")
        .count();
    assert_eq!((spent_events, count(&kinds, "RETRY_LEASED")), (1, 1));
}

#[test]
fn the_last_generation_the_budget_allows_says_reconcile_not_same_key() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::DropsAll);
    let extra = format!("{CONTRACT}\nretry_budget = 2");
    let c = Cell::start(origin.port(), &extra, &[]);
    let first = c.post("a", Some("k-last"), "{}");
    let id = first.id();
    assert_eq!(first.error().3, "same_idempotency_key", "{}", first.body);
    let second = c.post("a", Some("k-last"), "{}");
    assert_eq!(second.id(), id);
    assert_eq!(
        second.error().3,
        "same_idempotency_key",
        "one generation is left: {}",
        second.body
    );
    let last = c.post("a", Some("k-last"), "{}");
    assert_eq!((last.status, last.id()), (502, id.clone()), "{}", last.body);
    assert_eq!(
        last.error(),
        four(
            "REMOTE_OUTCOME_UNKNOWN",
            "remote_execution",
            "unknown",
            "reconcile"
        ),
        "generation 3 of a budget of 2 retries: no same-key retry is left"
    );
    assert!(last.outcome().contains("retry=reconcile"), "{}", last.head);
    let r = c.record(&id);
    assert_eq!(
        (r["generation"].as_u64(), r["retry"].as_str()),
        (Some(3), Some("reconcile"))
    );
    assert_eq!(c.decide(&id), "RECONCILE");
    // Whoever repeats anyway is refused, and nothing is sent.
    let refused = c.post("a", Some("k-last"), "{}");
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert_eq!(
        refused.error(),
        four(
            "RETRY_BUDGET_EXHAUSTED",
            "remote_execution",
            "unknown",
            "reconcile"
        )
    );
    assert_eq!(origin.hits(), 3);
}

#[test]
fn an_idempotent_method_under_a_key_with_no_generation_left_says_reconcile() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::DropsAll);
    let extra = format!("{CONTRACT}\nidempotent_methods = [\"POST\"]\nretry_budget = 1");
    let c = Cell::start(origin.port(), &extra, &[]);
    let first = c.post("a", Some("k-idem"), "{}");
    assert_eq!(first.error().3, "backoff", "{}", first.body);
    let second = c.post("a", Some("k-idem"), "{}");
    assert_eq!((second.status, second.id()), (502, first.id()));
    // Backoff would send the agent back with its key, into RETRY_BUDGET_EXHAUSTED.
    assert_eq!(second.error().3, "reconcile", "{}", second.body);
    let refused = c.post("a", Some("k-idem"), "{}");
    assert_eq!(
        refused.error().0,
        "RETRY_BUDGET_EXHAUSTED",
        "{}",
        refused.body
    );
    assert_eq!(origin.hits(), 2);
}

#[test]
fn an_unknown_past_safe_until_reconciles_and_an_expired_key_starts_over() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::DropsAll);
    let contract = "idempotency = { header = \"Idempotency-Key\", scope = \"s\", retention = \"3s\", safe_margin = \"2s\" }";
    let c = Cell::start(origin.port(), contract, &[]);
    let first = c.post("a", Some("k-window"), "{}");
    assert_eq!(first.error().3, "same_idempotency_key");
    let decide = |c: &Cell| {
        let out = c.daemon.cli(&["decide", &first.id()], &[]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(decide(&c), "RETRY_SAME_KEY");
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(decide(&c), "RECONCILE", "the verdict lapses at safe-until");
    let late = c.post("a", Some("k-window"), "{}");
    assert_eq!((late.status, late.id()), (502, first.id()), "{}", late.body);
    assert_eq!(
        late.error(),
        four(
            "REMOTE_OUTCOME_UNKNOWN",
            "remote_execution",
            "unknown",
            "reconcile"
        )
    );
    assert!(late.outcome().contains("retry=reconcile"));
    assert_eq!(origin.hits(), 1, "not dispatched past safe-until");
    // The key lives `retention` after its last use, then it is unseen.
    std::thread::sleep(Duration::from_millis(3300));
    let fresh = c.post("a", Some("k-window"), "{}");
    assert_ne!(fresh.id(), first.id());
    assert_eq!(origin.hits(), 2);
}

#[test]
fn a_not_attempted_invocation_is_retried_as_its_next_generation() {
    let port = closed_port();
    let c = Cell::start(port, CONTRACT, &[]);
    let refused = c.post("a", Some("k-refused"), "{}");
    assert_eq!(
        refused.error(),
        four(
            "CONNECTION_REFUSED",
            "connection_setup",
            "not_attempted",
            "backoff"
        )
    );
    let origin = KeyedOrigin::on_port(port, Policy::Honours, Answer::Always);
    let retried = c.post("a", Some("k-refused"), "{}");
    assert_eq!(
        (retried.status, retried.id()),
        (201, refused.id()),
        "{}",
        retried.body
    );
    let r = c.record_when(&refused.id(), |r| r["outcome"] == "committed");
    assert_eq!(r["generation"], 2);
    let kinds = c.kinds(&refused.id());
    assert_eq!(generations_of(&kinds, "DISPATCH_STARTED"), vec![2]);
    assert_eq!((origin.hits(), origin.effects()), (1, 1));
}

#[test]
fn concurrent_first_uses_of_one_key_dispatch_once() {
    let origin = KeyedOrigin::start(Policy::Ignores, Answer::After(Duration::from_millis(800)));
    let c = std::sync::Arc::new(Cell::start(origin.port(), CONTRACT, &[]));
    let racers: Vec<_> = (0..6)
        .map(|_| {
            let c = c.clone();
            std::thread::spawn(move || c.post("a", Some("k-race"), "{}"))
        })
        .collect();
    let replies: Vec<Reply> = racers.into_iter().map(|t| t.join().unwrap()).collect();
    let won: Vec<&Reply> = replies.iter().filter(|r| r.status == 201).collect();
    assert_eq!(
        won.len(),
        1,
        "{:?}",
        replies
            .iter()
            .map(|r| (r.status, r.body.clone()))
            .collect::<Vec<_>>()
    );
    let id = won[0].id();
    for r in replies.iter().filter(|r| r.status != 201) {
        // Either still in flight, or already settled and replayed: never a second dispatch.
        let in_progress = r.status == 409 && r.error().0 == "ATTEMPT_IN_PROGRESS";
        let replayed = r.header("postern-replayed") == Some("true");
        assert!(in_progress || replayed, "{} {}", r.status, r.body);
        assert_eq!(r.id(), id);
    }
    assert_eq!((origin.hits(), origin.effects()), (1, 1));
}

#[test]
fn concurrent_same_key_retries_lease_one_generation() {
    let slow = Answer::DropsFirstThenAfter(Duration::from_millis(800));
    let origin = KeyedOrigin::start(Policy::Ignores, slow);
    let c = std::sync::Arc::new(Cell::start(origin.port(), CONTRACT, &[]));
    let lost = c.post("a", Some("k-retries"), "{}");
    assert_eq!(lost.error().3, "same_idempotency_key");
    let racers: Vec<_> = (0..5)
        .map(|_| {
            let c = c.clone();
            std::thread::spawn(move || c.post("a", Some("k-retries"), "{}"))
        })
        .collect();
    let replies: Vec<Reply> = racers.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(replies.iter().filter(|r| r.status == 201).count(), 1);
    assert!(replies.iter().all(|r| r.id() == lost.id()));
    let r = c.record_when(&lost.id(), |r| r["outcome"] == "committed");
    assert_eq!(r["generation"], 2, "one lease won");
    assert_eq!(count(&c.kinds(&lost.id()), "RETRY_LEASED"), 1);
    assert_eq!(origin.hits(), 2, "the lost try and one retry");
}

#[test]
fn a_key_refused_at_its_credential_names_that_invocation_for_the_next_try() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::Always);
    let extra = format!(
        "{CONTRACT}\ncredential = \"c\"\n[[credentials]]\nid = \"c\"\nsecret = \"absent\"\n\
         inject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}"
    );
    let c = Cell::start(origin.port(), &extra, &[]);
    let locked = c.post("a", Some("k-locked"), "{}");
    assert_eq!(locked.status, 503, "{}", locked.body);
    assert_eq!(
        locked.error(),
        four(
            "VAULT_LOCKED",
            "credential_injection",
            "not_attempted",
            "after_correction"
        )
    );
    let again = c.post("a", Some("k-locked"), "{}");
    assert_eq!(
        (again.status, again.id()),
        (503, locked.id()),
        "{}",
        again.body
    );
    let r = c.record(&locked.id());
    assert_eq!(
        (r["generation"].as_u64(), r["outcome"].as_str()),
        (Some(2), Some("not_attempted"))
    );
    assert_eq!(origin.hits(), 0);
}
