//! The resend verdict for each state of the twin (SPEC §3.7), one case per branch.

use super::*;
use crate::contract::{Code, IdempotencyEvidence, Retry};
use crate::journal::{
    Accepted, Body, Draft, Journal, JournalOptions, Preflight, Protocol, ResultSummary,
    new_invocation_id,
};

/// A recorded, not yet dispatched invocation, as the journal projects it.
fn base() -> State {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir")
    };
    let Ok((j, _)) = Journal::open(dir.path(), JournalOptions::default()) else {
        panic!("journal")
    };
    let accepted = Draft::observed(Body::ActionAccepted(Accepted {
        agent: "ci".into(),
        protocol: Protocol::Https,
        method: Some("POST".into()),
        target: "https://api.test/pay".into(),
        command: None,
    }));
    let preflight = Draft::observed(Body::PreflightValidated(Preflight {
        route: "r".into(),
        fingerprint: "sha256:f".into(),
        idempotent: false,
        credential: None,
        idempotency: None,
        safe_until_ms: None,
        retry_budget: Some(3),
        credential_placeholder: false,
        resend: None,
    }));
    let id = new_invocation_id();
    match j.append_blocking(&id, vec![accepted, preflight]) {
        Ok(a) => State::clone(&a.state),
        Err(e) => panic!("append: {e}"),
    }
}

fn closed(outcome: Outcome, code: Option<Code>, retry: Retry) -> State {
    let mut s = base();
    s.progress.closed = true;
    s.progress.dispatched_ever = outcome != Outcome::NotAttempted;
    s.record.outcome = outcome;
    s.record.code = code;
    s.record.retry = retry;
    s
}

fn with_status(mut s: State, status: u16, delivered: bool) -> State {
    s.record.result = Some(ResultSummary {
        status: Some(status),
        exit_status: None,
        exit_signal: None,
        grpc_status: None,
        digest: "sha256:d".into(),
        bytes: 2,
        complete: true,
    });
    s.progress.result_stored = true;
    s.progress.delivered = delivered;
    s
}

fn keyed(mut s: State, safe_until_ms: i64) -> State {
    s.record.evidence.idempotency = Some(IdempotencyEvidence {
        key: "pk_1".into(),
        scope: "pay".into(),
        fingerprint: "sha256:f".into(),
        remote_contract: "configured".into(),
        safe_until: None,
    });
    s.progress.safe_until_ms = Some(safe_until_ms);
    s
}

const NOW: i64 = 1_000_000;

#[test]
fn a_running_twin_whose_agent_waits_is_a_parallel_request() {
    let mut s = base();
    s.progress.dispatched_ever = true;
    s.record.outcome = Outcome::Unknown;
    assert_eq!(judge(&s, NOW, false), Verdict::Parallel);
    assert!(Verdict::Parallel.dispatches_anew());
    // Its agent left a moment ago, before the record says so: nobody waits for it.
    assert_eq!(judge_departed(&s, NOW, false), Verdict::InProgress);
}

#[test]
fn a_departure_changes_no_verdict_but_parallel() {
    let s = closed(Outcome::NotAttempted, None, Retry::AfterCorrection);
    assert_eq!(judge_departed(&s, NOW, false), judge(&s, NOW, false));
}

#[test]
fn a_departure_counts_only_while_the_twin_is_awaited() {
    let running = base();
    assert_eq!(judge(&running, NOW, false), Verdict::Parallel);
    assert_eq!(judge_departed(&running, NOW, false), Verdict::InProgress);
    // Committed and being delivered: an agent that read its answer and closed left nothing.
    let mut delivering = with_status(base(), 201, false);
    delivering.record.outcome = Outcome::Committed;
    assert_eq!(judge(&delivering, NOW, false), Verdict::Parallel);
    assert_eq!(judge_departed(&delivering, NOW, false), Verdict::Parallel);
}

#[test]
fn a_running_twin_whose_agent_left_is_in_progress() {
    let mut s = base();
    s.record.outcome = Outcome::Unknown;
    s.record.code = Some(Code::CallerCancelled);
    assert_eq!(judge(&s, NOW, true), Verdict::InProgress);
    assert!(!Verdict::InProgress.dispatches_anew());
}

#[test]
fn a_running_retry_of_the_twin_is_in_progress_whoever_waits() {
    let mut s = base();
    s.record.outcome = Outcome::Unknown;
    s.record.generation = 2;
    s.progress.dispatched_ever = true;
    assert_eq!(judge(&s, NOW, true), Verdict::InProgress);
}

#[test]
fn a_twin_that_never_crossed_the_boundary_leaves_the_resend_free() {
    let s = closed(
        Outcome::NotAttempted,
        Some(Code::ConnectionRefused),
        Retry::Backoff,
    );
    assert_eq!(judge(&s, NOW, false), Verdict::New);
}

#[test]
fn an_unknown_twin_is_refused_unless_its_key_window_is_open() {
    let unknown = closed(
        Outcome::Unknown,
        Some(Code::RemoteOutcomeUnknown),
        Retry::Reconcile,
    );
    assert_eq!(judge(&unknown, NOW, true), Verdict::Refuse);
    let mut with_key = keyed(unknown.clone(), NOW + 1);
    with_key.record.retry = Retry::SameIdempotencyKey;
    assert_eq!(judge(&with_key, NOW, true), Verdict::SameKey);
    // The route lost its contract: the key would not be sent.
    assert_eq!(judge(&with_key, NOW, false), Verdict::Refuse);
    // Past safe-until.
    assert_eq!(judge(&with_key, NOW + 1, true), Verdict::Refuse);
    // A failure whose retry is reconcile whatever the window (a spent budget).
    let mut spent = with_key.clone();
    spent.record.retry = Retry::Reconcile;
    spent.record.code = Some(Code::RetryBudgetExhausted);
    assert_eq!(judge(&spent, NOW, true), Verdict::Refuse);
}

#[test]
fn a_committed_5xx_is_refused_delivered_or_not_and_while_delivering() {
    let c = closed(Outcome::Committed, None, Retry::Never);
    assert_eq!(
        judge(&with_status(c.clone(), 500, true), NOW, false),
        Verdict::Refuse
    );
    assert_eq!(
        judge(&with_status(c.clone(), 503, false), NOW, false),
        Verdict::Refuse
    );
    let mut delivering = with_status(c, 502, false);
    delivering.progress.closed = false;
    assert_eq!(judge(&delivering, NOW, false), Verdict::Refuse);
}

#[test]
fn an_answer_the_agent_never_got_is_replayed_and_one_it_got_leaves_it_free() {
    let c = closed(
        Outcome::Committed,
        Some(Code::ResultDeliveryFailed),
        Retry::FetchResult,
    );
    assert_eq!(
        judge(&with_status(c.clone(), 201, false), NOW, false),
        Verdict::Replay
    );
    let r = closed(Outcome::Rejected, None, Retry::AfterCorrection);
    assert_eq!(
        judge(&with_status(r.clone(), 422, false), NOW, false),
        Verdict::Replay
    );
    assert_eq!(judge(&with_status(r, 404, true), NOW, false), Verdict::New);
    let delivered = closed(Outcome::Committed, None, Retry::Never);
    assert_eq!(
        judge(&with_status(delivered, 200, true), NOW, false),
        Verdict::New
    );
}

#[test]
fn the_twin_ref_names_id_code_and_outcome() {
    let s = closed(
        Outcome::Unknown,
        Some(Code::RemoteOutcomeUnknown),
        Retry::Reconcile,
    );
    let v = serde_json::to_value(twin_ref(&s)).unwrap_or_default();
    assert_eq!(v["invocation_id"], s.record.invocation_id.as_str());
    assert_eq!(v["code"], "REMOTE_OUTCOME_UNKNOWN");
    assert_eq!(v["outcome"], "unknown");
}

struct Flag(std::sync::atomic::AtomicBool);

impl Line for Flag {
    fn hung_up(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn a_watched_line_tells_a_departure_before_any_mark() {
    let departures = Departures::default();
    let line = Arc::new(Flag(false.into()));
    assert!(!departures.watched("act_1"));
    let watched = departures.watch("act_1", line.clone());
    assert!(departures.watched("act_1"));
    assert!(!departures.left("act_1"), "the agent still holds its line");
    line.0.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(departures.left("act_1"), "hung up, nothing marked yet");
    assert!(!departures.left("act_2"));
    drop(watched);
    assert!(
        !departures.watched("act_1"),
        "listed only while its exchange lives"
    );
    assert!(!departures.left("act_1"));
    let _marked = departures.mark("act_1");
    assert!(departures.left("act_1"), "a mark alone still counts");
}
