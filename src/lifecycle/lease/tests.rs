//! Leases over a real journal in a temp dir: who may lease, when a worker is superseded,
//! and that a superseded worker's dispatch is refused.

use std::time::Duration;

use super::*;
use crate::contract::{Outcome, Retry};
use crate::journal::{
    Accepted, Appended, Dispatch, JournalOptions, Preflight, Protocol, Refusal, new_invocation_id,
};

fn journal(dir: &std::path::Path) -> Journal {
    crate::journal::open_for_test(dir, JournalOptions::default()).0
}

fn accepted() -> Draft {
    Draft::observed(Body::ActionAccepted(Accepted {
        agent: "ci".into(),
        protocol: Protocol::Https,
        method: Some("POST".into()),
        target: "https://api.test/pay".into(),
        command: None,
    }))
}

fn preflight(safe_until_ms: Option<i64>) -> Draft {
    Draft::observed(Body::PreflightValidated(Preflight {
        route: "r".into(),
        fingerprint: "sha256:f".into(),
        idempotent: false,
        credential: None,
        idempotency: None,
        safe_until_ms,
        retry_budget: None,
        credential_placeholder: false,
        resend: None,
    }))
}

fn failed(code: Code) -> Draft {
    Draft::observed(Body::Failed(Failure::of(code)))
}

fn dispatch() -> Draft {
    Draft::observed(Body::DispatchStarted(Dispatch::default())).hop("origin")
}

fn terms(budget: u32, ttl_ms: u64) -> LeaseTerms {
    LeaseTerms {
        budget,
        ttl: Duration::from_millis(ttl_ms),
        unsafe_override: false,
        note: None,
    }
}

fn state(a: Result<Appended, JournalError>) -> State {
    match a {
        Ok(a) => State::clone(&a.state),
        Err(e) => panic!("append: {e}"),
    }
}

fn rt() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    }
}

#[test]
fn the_plan_follows_liveness_budget_and_outcome() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let j = journal(dir.path());
    let id = new_invocation_id();
    let live = state(j.append_blocking(&id, vec![accepted(), preflight(None)]));
    let t0 = live.progress.lease_started_ms;
    assert_eq!(
        plan(&live, t0 + 10, &terms(3, 1_000)),
        LeasePlan::InProgress
    );
    assert_eq!(
        plan(&live, t0 + 1_000, &terms(3, 1_000)),
        LeasePlan::Take {
            supersedes: Some(1)
        }
    );
    // No retry left: an expired worker keeps its generation.
    assert_eq!(
        plan(&live, t0 + 1_000, &terms(0, 1_000)),
        LeasePlan::InProgress
    );
    let dispatched = state(j.append_blocking(&id, vec![dispatch()]));
    // Past the boundary the lease lasts until the generation closes.
    assert_eq!(
        plan(&dispatched, t0 + 60_000, &terms(3, 1_000)),
        LeasePlan::InProgress
    );
    let unknown = state(j.append_blocking(&id, vec![failed(Code::RemoteOutcomeUnknown)]));
    assert_eq!(
        plan(&unknown, t0, &terms(3, 1_000)),
        LeasePlan::Take { supersedes: None }
    );
    assert_eq!(plan(&unknown, t0, &terms(0, 1_000)), LeasePlan::Exhausted);
}

#[test]
fn the_budget_bound_at_preflight_outlives_a_config_reload() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let j = journal(dir.path());
    let id = new_invocation_id();
    let bound = Draft::observed(Body::PreflightValidated(Preflight {
        route: "r".into(),
        fingerprint: "sha256:f".into(),
        idempotent: false,
        credential: None,
        idempotency: None,
        safe_until_ms: Some(i64::MAX),
        retry_budget: Some(0),
        credential_placeholder: false,
        resend: None,
    }));
    let _ = state(j.append_blocking(&id, vec![accepted(), bound, dispatch()]));
    let unknown = state(j.append_blocking(&id, vec![failed(Code::RemoteOutcomeUnknown)]));
    // The record's retry and the lease agree, whatever the route says now.
    assert_eq!(unknown.record.retry, Retry::Reconcile);
    let t0 = unknown.progress.lease_started_ms;
    assert_eq!(plan(&unknown, t0, &terms(5, 1_000)), LeasePlan::Exhausted);
}

#[test]
fn a_spent_budget_is_journaled_once_and_reconciles_an_unknown() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let j = journal(dir.path());
    let id = new_invocation_id();
    let _ = state(j.append_blocking(&id, vec![accepted(), preflight(None), dispatch()]));
    let _ = state(j.append_blocking(&id, vec![failed(Code::RemoteOutcomeUnknown)]));
    let rt = rt();
    for _ in 0..2 {
        let refused = rt.block_on(Invocation::lease(j.clone(), &id, terms(0, 1_000)));
        let Err(LeaseError::Refused(env)) = refused else {
            panic!("leased past the budget");
        };
        assert_eq!(
            (env.error.code, env.error.outcome, env.error.retry),
            (
                Code::RetryBudgetExhausted,
                Outcome::Unknown,
                Retry::Reconcile
            )
        );
    }
    let events = j.events(&id).unwrap_or_default();
    let spent = events
        .iter()
        .filter(|e| e.data["code"] == "RETRY_BUDGET_EXHAUSTED")
        .count();
    assert_eq!(spent, 1, "journaled once");
    let r = j.record(&id).ok().flatten().map(|r| (r.code, r.outcome));
    assert_eq!(
        r,
        Some((Some(Code::RetryBudgetExhausted), Outcome::Unknown))
    );
}

#[test]
fn a_lease_raises_the_generation_and_a_superseded_worker_cannot_dispatch() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let j = journal(dir.path());
    let rt = rt();
    let Body::ActionAccepted(a) = accepted().body else {
        return;
    };
    let mut first = Invocation::accept(j.clone(), a);
    let id = first.id().to_owned();
    let recorded = rt.block_on(first.record(vec![preflight(None)]));
    assert!(recorded.is_ok(), "{recorded:?}");
    // The first worker's lease is long gone (ttl 0): a second request supersedes it.
    let second = rt.block_on(Invocation::lease(j.clone(), &id, terms(3, 0)));
    let Ok(mut second) = second else {
        panic!("no lease: {second:?}", second = second.err());
    };
    assert_eq!((second.generation(), second.leased()), (2, true));
    let stopped = rt.block_on(first.dispatch_boundary(vec![], Dispatch::default(), "origin"));
    let Err(env) = stopped else {
        panic!("a superseded worker crossed the dispatch boundary");
    };
    assert_eq!(
        (
            env.error.code,
            env.error.retry,
            env.invocation_id.as_deref()
        ),
        (
            Code::AttemptInProgress,
            Retry::FetchResult,
            Some(id.as_str())
        )
    );
    let crossed = rt.block_on(second.dispatch_boundary(vec![], Dispatch::default(), "origin"));
    assert!(crossed.is_ok(), "{crossed:?}");
    let events = j.events(&id).unwrap_or_default();
    let lease = events.iter().find(|e| e.kind.as_str() == "RETRY_LEASED");
    assert_eq!(
        lease.map(|e| (e.generation, e.data["supersedes"].clone())),
        Some((
            2,
            serde_json::json!({"generation": 1, "reason": "lease_expired"})
        ))
    );
    let dispatches: Vec<u32> = events
        .iter()
        .filter(|e| e.kind.as_str() == "DISPATCH_STARTED")
        .map(|e| e.generation)
        .collect();
    assert_eq!(dispatches, vec![2]);
    // A live generation past its boundary is in progress for everyone else.
    let third = rt.block_on(Invocation::lease(j.clone(), &id, terms(3, 0)));
    assert!(
        matches!(third, Err(LeaseError::Refused(ref e)) if e.error.code == Code::AttemptInProgress)
    );
}

#[test]
fn a_stale_draft_is_refused_by_the_generation_check() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let j = journal(dir.path());
    let id = new_invocation_id();
    let _ = state(j.append_blocking(&id, vec![accepted(), preflight(None)]));
    let _ = state(j.append_blocking(&id, vec![failed(Code::ConnectionRefused)]));
    let lease = Draft::observed(Body::RetryLeased(Lease {
        generation: 2,
        ..Lease::default()
    }));
    let _ = state(j.append_blocking(&id, vec![lease]));
    let stale = j.append_blocking(&id, vec![dispatch().generation(1)]);
    assert_eq!(
        stale.err(),
        Some(JournalError::Refused(Refusal::WrongGeneration {
            expected: 2,
            got: 1
        }))
    );
}

#[test]
fn a_same_key_retry_is_allowed_only_while_the_journal_says_it_is_safe() {
    use crate::lifecycle::idempotency::retry_allowed;
    let Ok(dir) = tempfile::tempdir() else { return };
    let j = journal(dir.path());
    let id = new_invocation_id();
    let window = state(j.append_blocking(&id, vec![accepted(), preflight(Some(i64::MAX))]));
    let t0 = window.progress.lease_started_ms;
    let refused = state(j.append_blocking(&id, vec![failed(Code::ConnectionRefused)]));
    assert!(
        retry_allowed(&refused, t0),
        "not_attempted: nothing was sent"
    );
    let id = new_invocation_id();
    let _ = state(j.append_blocking(
        &id,
        vec![accepted(), preflight(Some(t0 + 1_000)), dispatch()],
    ));
    let unknown = state(j.append_blocking(&id, vec![failed(Code::RemoteOutcomeUnknown)]));
    assert_eq!(unknown.record.retry, Retry::SameIdempotencyKey);
    assert!(retry_allowed(&unknown, t0 + 999));
    assert!(
        !retry_allowed(&unknown, t0 + 1_000),
        "safe-until has passed"
    );
    let id = new_invocation_id();
    let _ = state(j.append_blocking(&id, vec![accepted(), preflight(Some(i64::MAX)), dispatch()]));
    let lost = state(j.append_blocking(&id, vec![failed(Code::ResultStoreFailed)]));
    assert!(
        !retry_allowed(&lost, t0),
        "a lost result is reconciled, never re-sent"
    );
}

#[test]
fn a_lease_that_reopens_a_settled_invocation_is_what_recovery_finds_after_a_crash() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let id = new_invocation_id();
    {
        let j = journal(dir.path());
        let _ = state(j.append_blocking(&id, vec![accepted(), preflight(None), dispatch()]));
        let _ = state(j.append_blocking(&id, vec![failed(Code::RemoteOutcomeUnknown)]));
        let leased = rt().block_on(Invocation::lease(j.clone(), &id, terms(3, 1_000)));
        assert!(leased.is_ok(), "{:?}", leased.err());
        // The process stops here, before the new generation dispatches.
    }
    let (j, report) = crate::journal::open_for_test(dir.path(), JournalOptions::default());
    assert_eq!(
        report.recovered,
        vec![(id.clone(), Code::BrokerRestartedBeforeDispatch)]
    );
    let r = j.record(&id).ok().flatten();
    let r = r.map(|r| (r.generation, r.code, r.outcome));
    assert_eq!(
        r,
        Some((
            2,
            Some(Code::BrokerRestartedBeforeDispatch),
            Outcome::Unknown
        )),
        "dispatched in generation 1: never not_attempted"
    );
}
