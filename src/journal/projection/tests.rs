//! Property tests over random event sequences: the transition rules hold whatever
//! order transports (or bugs) report observations in.

use proptest::prelude::*;

use super::*;
use crate::contract::{Completion, Stage};
use crate::journal::event::*;

#[derive(Debug, Clone)]
enum Move {
    Accept,
    Preflight(bool),
    /// A preflight that binds an idempotency key (open window) and a retry budget.
    KeyedPreflight(bool, Option<u32>),
    Connect(bool),
    Dispatch,
    Sent,
    Started,
    Complete,
    Commit(Outcome, Source),
    Delivered,
    Fail(Code, Source),
    Reconcile(Outcome, Source),
    Lease(u32),
    Supersede,
    WrongGeneration,
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop::sample::select(Outcome::ALL.to_vec())
}

fn source() -> impl Strategy<Value = Source> {
    prop::sample::select(Source::ALL.to_vec())
}

fn code() -> impl Strategy<Value = Code> {
    prop::sample::select(Code::ALL.to_vec())
}

fn a_move() -> impl Strategy<Value = Move> {
    prop_oneof![
        1 => Just(Move::Accept),
        2 => any::<bool>().prop_map(Move::Preflight),
        1 => any::<bool>().prop_map(|i| Move::KeyedPreflight(i, Some(1))),
        2 => any::<bool>().prop_map(Move::Connect),
        3 => Just(Move::Dispatch),
        2 => Just(Move::Sent),
        2 => Just(Move::Started),
        2 => Just(Move::Complete),
        3 => (outcome(), source()).prop_map(|(o, s)| Move::Commit(o, s)),
        2 => Just(Move::Delivered),
        4 => (code(), source()).prop_map(|(c, s)| Move::Fail(c, s)),
        2 => (outcome(), source()).prop_map(|(o, s)| Move::Reconcile(o, s)),
        2 => (0u32..3).prop_map(Move::Lease),
        1 => Just(Move::Supersede),
        1 => Just(Move::WrongGeneration),
    ]
}

fn body_of(m: &Move, generation: u32) -> (Body, Source, u32) {
    let observed = Source::TransportObserved;
    let b = match m {
        Move::Accept => Body::ActionAccepted(Accepted {
            agent: "a".into(),
            protocol: Protocol::Https,
            method: Some("POST".into()),
            target: "https://x.test/".into(),
            command: None,
        }),
        Move::Preflight(idempotent) => Body::PreflightValidated(Preflight {
            route: "r".into(),
            fingerprint: "sha256:f".into(),
            idempotent: *idempotent,
            credential: None,
            idempotency: None,
            safe_until_ms: None,
            retry_budget: None,
            credential_placeholder: false,
            resend: None,
        }),
        Move::KeyedPreflight(idempotent, budget) => Body::PreflightValidated(Preflight {
            route: "r".into(),
            fingerprint: "sha256:f".into(),
            idempotent: *idempotent,
            credential: None,
            idempotency: None,
            safe_until_ms: Some(i64::MAX),
            retry_budget: *budget,
            credential_placeholder: false,
            resend: None,
        }),
        Move::Connect(ok) => Body::ConnectAttempt(ConnectAttempt {
            n: 1,
            stage: Stage::TcpConnect,
            ok: *ok,
            code: None,
            address: None,
            diagnostic: None,
            hop: None,
        }),
        Move::Dispatch => Body::DispatchStarted(Dispatch::default()),
        Move::Sent => Body::RequestSent(super::super::event::RequestSent { bytes: 1 }),
        Move::Started => Body::RemoteResponseStarted(ResponseStarted { status: Some(200) }),
        Move::Complete => Body::RemoteResponseComplete(ResponseComplete {
            completion: Completion::ContentLength,
            bytes: 1,
            digest: "sha256:d".into(),
        }),
        Move::Commit(o, s) => {
            return (
                Body::ResultCommitted(ResultCommitted {
                    outcome: *o,
                    retry: Retry::Never,
                    status: Some(200),
                    exit_status: None,
                    exit_signal: None,
                    grpc_status: None,
                    digest: "sha256:d".into(),
                    bytes: 1,
                    complete: true,
                    completion: None,
                    evidence: serde_json::Map::new(),
                }),
                *s,
                generation,
            );
        }
        Move::Delivered => Body::ResultDelivered(Delivered::default()),
        Move::Fail(c, s) => return (Body::Failed(Failure::of(*c)), *s, generation),
        Move::Reconcile(o, s) => {
            return (
                Body::Reconciled(Reconciliation {
                    outcome: *o,
                    note: "n".into(),
                    unsafe_retry: None,
                    via: None,
                }),
                *s,
                generation,
            );
        }
        Move::Lease(delta) => {
            let g = generation + delta;
            return (
                Body::RetryLeased(Lease {
                    generation: g,
                    ..Lease::default()
                }),
                observed,
                g,
            );
        }
        Move::Supersede => {
            let lease = Lease {
                generation: generation + 1,
                supersedes: Some(Supersession {
                    generation,
                    reason: SupersedeReason::LeaseExpired,
                }),
                ..Lease::default()
            };
            return (Body::RetryLeased(lease), observed, generation + 1);
        }
        Move::WrongGeneration => {
            return (
                Body::RequestSent(super::super::event::RequestSent { bytes: 1 }),
                observed,
                generation + 7,
            );
        }
    };
    (b, observed, generation)
}

fn event(seq: u64, body: &Body, source: Source, generation: u32) -> Event {
    let (kind, data) = split_body(body);
    Event {
        seq,
        invocation_id: "act_p".into(),
        attempt: 0,
        generation,
        ts: "2026-01-01T00:00:00.000Z".into(),
        kind,
        source,
        hop: "origin".into(),
        data,
        prev_hash: GENESIS_HASH.into(),
        hash: String::new(),
    }
}

fn check_transition(
    before: &Option<State>,
    after: &State,
    ev: &Event,
) -> Result<(), TestCaseError> {
    let r = &after.record;
    prop_assert!(
        !(after.progress.dispatched_ever && r.outcome == Outcome::NotAttempted),
        "not_attempted after DISPATCH_STARTED"
    );
    prop_assert_eq!(r.code.is_some(), r.envelope.is_some());
    if r.code == Some(Code::ResultDeliveryFailed) || after.progress.delivered {
        prop_assert!(
            after.progress.result_stored,
            "fetch_result without a stored result"
        );
    }
    if let Some(env) = &r.envelope {
        prop_assert_eq!(env.error.outcome, r.outcome);
        prop_assert_eq!(env.error.retry, r.retry);
    }
    if let Some(prev) = before {
        let was = prev.record.outcome;
        if is_resolved(was) {
            prop_assert_eq!(r.outcome, was, "a resolved outcome changed");
        }
        if was == Outcome::Unknown && is_resolved(r.outcome) {
            prop_assert!(
                ev.source.can_resolve_unknown(),
                "unknown resolved by {:?}",
                ev.source
            );
        }
        if prev.progress.dispatched_ever {
            prop_assert!(after.progress.dispatched_ever);
        }
        prop_assert!(r.generation >= prev.record.generation);
        prop_assert!(r.attempts >= prev.record.attempts);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn transition_rules_hold_for_any_sequence(moves in prop::collection::vec(a_move(), 1..40)) {
        let mut state: Option<State> = None;
        let mut seq = 0;
        for m in &moves {
            let generation = state.as_ref().map_or(1, |s| s.record.generation);
            let (body, source, g) = body_of(m, generation);
            seq += 1;
            let ev = event(seq, &body, source, g);
            if let Ok(next) = apply(state.clone(), &ev) {
                    check_transition(&state, &next, &ev)?;
                    if let Body::RetryLeased(Lease { supersedes: Some(_), .. }) = &body {
                        let prev = state.as_ref().map(|s| &s.progress);
                        prop_assert!(prev.is_some_and(|p| !p.closed && !p.dispatched_this_generation),
                            "superseded a closed or dispatched generation");
                    }
                    if let Body::Failed(f) = &body {
                        let same_gen_dispatch = state.as_ref().is_some_and(|s| s.progress.dispatched_this_generation);
                        prop_assert!(!(f.code.is_pre_dispatch() && same_gen_dispatch));
                        // SPEC §1.7: with no generation left, a keyed repeat is never offered.
                        let spent = next.operation().generations.is_some_and(Generations::spent);
                        if spent && next.progress.safe_until_ms.is_some() {
                            prop_assert!(!matches!(next.record.retry,
                                Retry::SameIdempotencyKey | Retry::Backoff), "{:?}", f.code);
                        }
                    }
                    state = Some(next);
            }
        }
    }

    #[test]
    fn a_dispatched_invocation_never_reads_not_attempted(
        codes in prop::collection::vec(code(), 1..6),
        idempotent in any::<bool>(),
    ) {
        let mut seq = 0;
        let mut next = |m: Move, st: &Option<State>| {
            seq += 1;
            let g = st.as_ref().map_or(1, |s| s.record.generation);
            let (b, s, g) = body_of(&m, g);
            event(seq, &b, s, g)
        };
        let mut st = None;
        for m in [Move::Accept, Move::Preflight(idempotent), Move::Dispatch] {
            let e = next(m, &st);
            st = apply(st.clone(), &e).ok();
        }
        prop_assert!(st.is_some());
        for c in codes {
            let e = next(Move::Fail(c, Source::TransportObserved), &st);
            if let Ok(s) = apply(st.clone(), &e) {
                prop_assert_ne!(s.record.outcome, Outcome::NotAttempted);
                st = Some(s);
                let lease = next(Move::Lease(1), &st);
                if let Ok(s) = apply(st.clone(), &lease) {
                    st = Some(s);
                }
            }
        }
    }
}

fn run(moves: &[Move]) -> Result<State, Refusal> {
    let mut state: Option<State> = None;
    for (i, m) in moves.iter().enumerate() {
        let g = state.as_ref().map_or(1, |s| s.record.generation);
        let (body, source, g) = body_of(m, g);
        state = Some(apply(state, &event(i as u64 + 1, &body, source, g))?);
    }
    state.ok_or(Refusal::UnknownInvocation)
}

#[test]
fn a_clean_exchange_resolves_committed_without_a_code() {
    let s = run(&[
        Move::Accept,
        Move::Preflight(false),
        Move::Connect(true),
        Move::Dispatch,
        Move::Sent,
        Move::Started,
        Move::Complete,
        Move::Commit(Outcome::Committed, Source::RemoteResponse),
        Move::Delivered,
    ]);
    let s = s.ok();
    assert!(
        s.as_ref()
            .is_some_and(|s| s.record.outcome == Outcome::Committed
                && s.record.phase == Phase::RemoteExecution
                && s.record.code.is_none()
                && s.record.envelope.is_none()
                && s.progress.closed
                && s.record.attempts == 1)
    );
}

#[test]
fn refusals_name_the_impossible_move() {
    use Move::*;
    let pre = [Accept, Preflight(false), Dispatch];
    let with = |m: Move| {
        let mut v = pre.to_vec();
        v.push(m);
        run(&v).err()
    };
    assert_eq!(
        with(Fail(Code::ConnectionRefused, Source::TransportObserved)),
        Some(Refusal::NotAttemptedAfterDispatch(Code::ConnectionRefused))
    );
    assert_eq!(
        with(Commit(Outcome::Committed, Source::TransportObserved)),
        Some(Refusal::SourceCannotResolve(Source::TransportObserved))
    );
    assert_eq!(
        with(Commit(Outcome::Unknown, Source::RemoteResponse)),
        Some(Refusal::UnresolvedResult)
    );
    assert_eq!(
        with(Dispatch),
        Some(Refusal::AfterDispatch(EventKind::DispatchStarted))
    );
    assert_eq!(with(Accept), Some(Refusal::AlreadyAccepted));
    assert_eq!(run(&[Dispatch]).err(), Some(Refusal::UnknownInvocation));
    assert_eq!(
        run(&[Accept, Sent]).err(),
        Some(Refusal::NotDispatched(EventKind::RequestSent))
    );
    assert_eq!(
        run(&[
            Accept,
            Preflight(false),
            Dispatch,
            Fail(Code::RemoteTimeout, Source::TransportObserved),
            Reconcile(Outcome::Committed, Source::Recovery)
        ])
        .err(),
        Some(Refusal::SourceCannotResolve(Source::Recovery))
    );
}

#[test]
fn reconciliation_resolves_an_unknown_with_its_source() {
    use Move::*;
    let s = run(&[
        Accept,
        Preflight(false),
        Dispatch,
        Fail(Code::RemoteOutcomeUnknown, Source::TransportObserved),
        Reconcile(Outcome::Rejected, Source::OperatorAttested),
    ])
    .ok();
    let r = s.map(|s| s.record);
    assert!(
        r.as_ref()
            .is_some_and(|r| r.outcome == Outcome::Rejected && r.retry == Retry::AfterCorrection)
    );
    assert!(r.is_some_and(|r| r.evidence.extra["reconciled"]["source"] == "operator_attested"));
}

#[test]
fn a_cancelled_caller_leaves_the_exchange_to_resolve() {
    use Move::*;
    let s = run(&[
        Accept,
        Preflight(false),
        Dispatch,
        Sent,
        Fail(Code::CallerCancelled, Source::TransportObserved),
        Started,
        Complete,
        Commit(Outcome::Committed, Source::RemoteResponse),
        Fail(Code::ResultDeliveryFailed, Source::TransportObserved),
    ])
    .ok();
    let r = s.map(|s| s.record);
    assert!(r.as_ref().is_some_and(|r| r.outcome == Outcome::Committed
        && r.code == Some(Code::ResultDeliveryFailed)
        && r.phase == Phase::ResultDelivery
        && r.retry == Retry::FetchResult));
}

#[test]
fn a_retry_lease_keeps_unknown_and_counts_generations() {
    use Move::*;
    let s = run(&[
        Accept,
        Preflight(true),
        Dispatch,
        Fail(Code::RemoteTimeout, Source::TransportObserved),
        Lease(1),
        Connect(false),
        Fail(Code::ConnectionRefused, Source::TransportObserved),
    ])
    .ok();
    let r = s.map(|s| s.record);
    assert!(r.as_ref().is_some_and(|r| r.generation == 2
        && r.outcome == Outcome::Unknown
        && r.code == Some(Code::ConnectionRefused)
        && r.retry == Retry::Backoff));
}

#[test]
fn a_request_held_for_approval_stopped_at_credential_injection() {
    let cred = crate::contract::CredentialEvidence {
        id: "pay".into(),
        version: 1.into(),
        mode: "header".into(),
    };
    let held = [
        Body::CredentialAuthorized(cred),
        Body::ApprovalRequested(ApprovalRequest {
            fingerprint: "sha256:f".into(),
            expires_at: "2026-01-01T00:05:00.000Z".into(),
        }),
    ];
    let granted = Body::ApprovalGranted(ApprovalAnswer {
        by: None,
        note: None,
        via: None,
    });
    let restarted = Body::Failed(Failure::of(Code::BrokerRestartedBeforeDispatch));
    for (answered, phase) in [
        (false, Phase::CredentialInjection),
        (true, Phase::ConnectionSetup),
    ] {
        let Ok(mut state) = run(&[Move::Accept, Move::Preflight(false)]) else {
            panic!("accept");
        };
        let mut bodies: Vec<Body> = held.to_vec();
        if answered {
            bodies.push(granted.clone());
        }
        bodies.push(restarted.clone());
        for (i, b) in bodies.iter().enumerate() {
            let e = event(10 + i as u64, b, Source::TransportObserved, 1);
            state = match apply(Some(state), &e) {
                Ok(s) => s,
                Err(r) => panic!("{r}"),
            };
        }
        let r = &state.record;
        assert_eq!(
            (r.phase, r.outcome, r.retry),
            (phase, Outcome::NotAttempted, Retry::Backoff),
            "answered={answered}"
        );
    }
}

#[test]
fn a_lease_supersedes_only_a_live_generation_short_of_dispatch() {
    use Move::*;
    let s = run(&[
        Accept,
        Preflight(false),
        Supersede,
        Preflight(false),
        Dispatch,
    ])
    .ok();
    assert!(s.is_some_and(|s| s.record.generation == 2 && s.progress.dispatched_this_generation));
    assert_eq!(
        run(&[Accept, Preflight(false), Dispatch, Supersede]).err(),
        Some(Refusal::LeaseRefused)
    );
    assert_eq!(
        run(&[
            Accept,
            Preflight(false),
            Fail(Code::DnsError, Source::TransportObserved),
            Supersede
        ])
        .err(),
        Some(Refusal::LeaseRefused)
    );
}

#[test]
fn a_spent_budget_is_recorded_on_a_closed_unresolved_generation() {
    use Move::*;
    let s = run(&[
        Accept,
        Preflight(false),
        Dispatch,
        Fail(Code::RemoteOutcomeUnknown, Source::TransportObserved),
        Fail(Code::RetryBudgetExhausted, Source::TransportObserved),
    ])
    .ok();
    let r = s.map(|s| s.record);
    assert!(r.as_ref().is_some_and(|r| r.outcome == Outcome::Unknown
        && r.code == Some(Code::RetryBudgetExhausted)
        && r.retry == Retry::Reconcile));
    assert_eq!(
        run(&[
            Accept,
            Preflight(false),
            Dispatch,
            Commit(Outcome::Committed, Source::RemoteResponse),
            Delivered,
            Fail(Code::RetryBudgetExhausted, Source::TransportObserved),
        ])
        .err(),
        Some(Refusal::Closed(EventKind::Failed))
    );
}

#[test]
fn the_last_generation_the_budget_allows_offers_no_keyed_repeat() {
    use Move::*;
    let unknown = Fail(Code::RemoteOutcomeUnknown, Source::TransportObserved);
    let try_once = |keyed: Move| [keyed, Dispatch, unknown.clone()];
    let mut moves = vec![Accept];
    moves.extend(try_once(KeyedPreflight(false, Some(1))));
    let retry_of = |moves: &[Move]| run(moves).ok().map(|s| s.record.retry);
    assert_eq!(
        retry_of(&moves),
        Some(Retry::SameIdempotencyKey),
        "one left"
    );
    moves.push(Lease(1));
    moves.extend(try_once(KeyedPreflight(false, Some(1))));
    assert_eq!(retry_of(&moves), Some(Retry::Reconcile), "none left");
    // An idempotent method under a key: its repeat would be refused all the same.
    let idempotent: Vec<Move> = moves
        .iter()
        .map(|m| match m {
            KeyedPreflight(_, b) => KeyedPreflight(true, *b),
            m => m.clone(),
        })
        .collect();
    assert_eq!(retry_of(&idempotent), Some(Retry::Reconcile));
    // A journal from before budgets were bound: as it was computed then.
    let old: Vec<Move> = moves
        .iter()
        .map(|m| match m {
            KeyedPreflight(i, _) => KeyedPreflight(*i, None),
            m => m.clone(),
        })
        .collect();
    assert_eq!(retry_of(&old), Some(Retry::SameIdempotencyKey));
}

#[test]
fn records_and_preflights_written_before_budgets_were_bound_still_read() {
    let pf = serde_json::json!({"route": "r", "fingerprint": "sha256:f", "idempotent": false});
    let pf: Result<Preflight, _> = serde_json::from_value(pf);
    assert!(pf.is_ok_and(|p| p.retry_budget.is_none()));
    let Ok(state) = run(&[Move::Accept, Move::Preflight(false)]) else {
        panic!("accept");
    };
    let mut progress = serde_json::to_value(&state.progress).unwrap_or_default();
    if let Some(map) = progress.as_object_mut() {
        map.remove("retry_budget");
    }
    let back: Result<Progress, _> = serde_json::from_value(progress);
    assert!(back.is_ok_and(|p| p.retry_budget.is_none()));
}

/// SPEC §7: another node's published state, adopted for the next generation, keeps what
/// earlier generations proved; a snapshot of another invocation or an older generation is
/// refused.
#[test]
fn an_adopted_invocation_keeps_its_dispatch_and_only_a_newer_generation_replaces_a_copy() {
    use Move::*;
    let Ok(published) = run(&[
        Accept,
        Preflight(true),
        Dispatch,
        Fail(Code::RemoteTimeout, Source::TransportObserved),
    ]) else {
        panic!("a published state")
    };
    let adopt = |snapshot: &State, generation: u32| {
        let body = Body::InvocationAdopted(crate::journal::Adoption {
            from_node: "a".into(),
            snapshot: serde_json::to_string(snapshot).unwrap_or_default(),
        });
        (
            event(40, &body, Source::TransportObserved, generation),
            body,
        )
    };
    let (e, body) = adopt(&published, 1);
    let adopted = apply_body(None, &e, body);
    let Ok(adopted) = adopted else {
        panic!("adopted: {adopted:?}")
    };
    assert!(adopted.progress.dispatched_ever && adopted.record.outcome == Outcome::Unknown);
    assert_eq!(adopted.progress.last_seq, 40);
    // Its next generation leases as any other.
    let lease = Body::RetryLeased(crate::journal::Lease {
        generation: 2,
        unsafe_override: false,
        supersedes: None,
        ttl_ms: None,
        note: None,
    });
    let next = apply_body(
        Some(adopted.clone()),
        &event(41, &lease, Source::TransportObserved, 2),
        lease,
    );
    assert!(
        next.as_ref()
            .is_ok_and(|s| s.record.generation == 2 && s.progress.dispatched_ever)
    );
    // The same generation again, or another invocation's state, is refused.
    let (e, body) = adopt(&published, 1);
    assert_eq!(
        apply_body(Some(adopted), &e, body),
        Err(Refusal::LeaseRefused)
    );
    let mut other = published.clone();
    other.record.invocation_id = "act_other".into();
    let (e, body) = adopt(&other, 1);
    assert_eq!(
        apply_body(None, &e, body),
        Err(Refusal::BadData(EventKind::InvocationAdopted))
    );
}
