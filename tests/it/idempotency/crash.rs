//! Crash cells for idempotency (`POSTERN_CRASH_AFTER`): after a restart the record and
//! the key index say what the journal proves, and a same-key request does the right thing.

use super::{CONTRACT, Cell, GENERATING, generations_of};
use crate::retry_origins::{Answer, KeyedOrigin, Policy, closed_port, header};
use crate::support::get_json;

#[test]
fn a_crash_right_after_retry_leased_keeps_a_dispatched_invocation_unknown() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::DropsFirst);
    let c = Cell::start(
        origin.port(),
        CONTRACT,
        &[("POSTERN_CRASH_AFTER", "RETRY_LEASED")],
    );
    let lost = c.post("a", Some("k-crash"), "{}");
    let id = lost.id();
    assert_eq!(lost.error().3, "same_idempotency_key");
    let cut = c.post("a", Some("k-crash"), "{}");
    assert_eq!(
        cut.status, 0,
        "the daemon died after RETRY_LEASED: {}",
        cut.head
    );
    let c = c.restart(CONTRACT);
    let r = c.record(&id);
    assert_eq!(r["generation"], 2, "{r}");
    assert_eq!(r["code"], "BROKER_RESTARTED_BEFORE_DISPATCH");
    // Dispatched in generation 1: never again not_attempted.
    assert_eq!(r["outcome"], "unknown");
    assert_eq!(r["retry"], "same_idempotency_key");
    assert_eq!(c.decide(&id), "RETRY_SAME_KEY");
    let events = c.events(&id);
    let last = events.last().cloned().unwrap_or_default();
    assert_eq!(
        (
            last["kind"].as_str(),
            last["source"].as_str(),
            last["generation"].as_u64()
        ),
        (Some("FAILED"), Some("recovery"), Some(2))
    );
    assert_eq!(generations_of(&c.kinds(&id), "DISPATCH_STARTED"), vec![1]);
    assert_eq!(origin.hits(), 1);

    let retried = c.post("a", Some("k-crash"), "{}");
    assert_eq!(
        (retried.status, retried.id()),
        (201, id.clone()),
        "{}",
        retried.body
    );
    assert_eq!(
        c.record_when(&id, |r| r["outcome"] == "committed")["generation"],
        3
    );
    assert_eq!((origin.hits(), origin.effects()), (2, 1));
}

#[test]
fn a_crash_right_after_retry_leased_of_a_never_sent_invocation_stays_not_attempted() {
    let port = closed_port();
    let c = Cell::start(port, CONTRACT, &[("POSTERN_CRASH_AFTER", "RETRY_LEASED")]);
    let refused = c.post("a", Some("k-never"), "{}");
    let id = refused.id();
    assert_eq!(refused.error().2, "not_attempted");
    let cut = c.post("a", Some("k-never"), "{}");
    assert_eq!(cut.status, 0, "{}", cut.head);
    let c = c.restart(CONTRACT);
    let r = c.record(&id);
    assert_eq!(
        (
            r["generation"].as_u64(),
            r["code"].as_str(),
            r["outcome"].as_str(),
            r["retry"].as_str()
        ),
        (
            Some(2),
            Some("BROKER_RESTARTED_BEFORE_DISPATCH"),
            Some("not_attempted"),
            Some("backoff")
        ),
        "{r}"
    );
    let origin = KeyedOrigin::on_port(port, Policy::Honours, Answer::Always);
    let retried = c.post("a", Some("k-never"), "{}");
    assert_eq!(
        (retried.status, retried.id()),
        (201, id.clone()),
        "{}",
        retried.body
    );
    assert_eq!(
        c.record_when(&id, |r| r["outcome"] == "committed")["generation"],
        3
    );
    assert_eq!(origin.effects(), 1);
}

#[test]
fn a_crash_after_a_generated_key_was_journaled_leaves_it_retryable_by_that_key() {
    let origin = KeyedOrigin::start(Policy::Honours, Answer::Always);
    let c = Cell::start(
        origin.port(),
        GENERATING,
        &[("POSTERN_CRASH_AFTER", "PREFLIGHT_VALIDATED")],
    );
    let cut = c.post("a", None, "{\"amount\":3}");
    assert_eq!(cut.status, 0, "{}", cut.head);
    let c = c.restart(GENERATING);
    let (_, list) = get_json(&c.daemon.url("/v1/invocations"), &[]);
    let r = list["invocations"][0].clone();
    let id = r["invocation_id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(
        (r["code"].as_str(), r["outcome"].as_str()),
        (
            Some("BROKER_RESTARTED_BEFORE_DISPATCH"),
            Some("not_attempted")
        ),
        "{r}"
    );
    // The agent never saw the key; the journal (and its index) did.
    let key = r["evidence"]["idempotency"]["key"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(key.starts_with("pk_"), "{r}");
    assert_eq!(origin.hits(), 0);
    let retried = c.post("a", Some(&key), "{\"amount\":3}");
    assert_eq!(
        (retried.status, retried.id()),
        (201, id.clone()),
        "{}",
        retried.body
    );
    assert_eq!(
        c.record_when(&id, |r| r["outcome"] == "committed")["generation"],
        2
    );
    assert_eq!(
        header(&origin.requests()[0], "idempotency-key").as_deref(),
        Some(key.as_str())
    );
    assert_eq!((origin.hits(), origin.effects()), (1, 1));
}
