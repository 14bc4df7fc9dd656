//! Recovery at start (SPEC §2) over a real fjall store: what a live invocation becomes
//! depends on what is durable, and `fetch_result` only ever points at a stored result.

use super::*;
use crate::contract::{OperationView, RecordFacts, Verdict, decide};

pub(super) fn reopen(dir: &Path) -> (Journal, RecoveryReport) {
    open_for_test(dir, JournalOptions::default())
}

/// What `postern decide` answers: the record's facts plus whether a result is stored.
fn verdict(journal: &Journal, id: &str) -> Option<Verdict> {
    let r = journal.record(id).ok().flatten()?;
    let facts = RecordFacts {
        code: r.code,
        outcome: r.outcome,
        retry: r.retry,
        result_stored: journal.result(id).ok().flatten().is_some(),
    };
    Some(decide(facts, OperationView::default()))
}

fn last_is_recovery(journal: &Journal, id: &str) -> bool {
    let events = journal.events(id).unwrap_or_default();
    events
        .last()
        .is_some_and(|e| e.source == Source::Recovery && e.kind == EventKind::Failed)
}

#[test]
fn recovery_settles_every_live_invocation_by_what_is_durable() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let (before, dispatched, resolved, idempotent) = (
        new_invocation_id(),
        new_invocation_id(),
        new_invocation_id(),
        new_invocation_id(),
    );
    {
        let journal = open(dir.path());
        let rt = rt();
        let (draft, result) = committed(&resolved, journal.result_expiry_ms());
        let r = rt.block_on(async {
            journal
                .append(&before, vec![accepted("POST"), preflight(false)])
                .await?;
            journal
                .append(
                    &dispatched,
                    vec![accepted("POST"), preflight(false), dispatch()],
                )
                .await?;
            journal
                .append(
                    &idempotent,
                    vec![accepted("GET"), preflight(true), dispatch()],
                )
                .await?;
            journal
                .append(
                    &resolved,
                    vec![accepted("POST"), preflight(false), dispatch()],
                )
                .await?;
            journal.commit_result(&resolved, vec![draft], result).await
        });
        assert!(r.is_ok());
    }
    let (journal, report) = reopen(dir.path());
    assert_eq!(report.recovered.len(), 4);
    let get = |id: &str| journal.record(id).ok().flatten();
    let b = get(&before);
    assert!(
        b.is_some_and(|r| r.code == Some(Code::BrokerRestartedBeforeDispatch)
            && r.outcome == Outcome::NotAttempted
            && r.phase == Phase::CredentialInjection
            && r.retry == Retry::Backoff)
    );
    let d = get(&dispatched);
    assert!(d.is_some_and(|r| r.code == Some(Code::BrokerRestarted)
        && r.outcome == Outcome::Unknown
        && r.retry == Retry::Reconcile));
    let i = get(&idempotent);
    assert!(i.is_some_and(|r| r.code == Some(Code::BrokerRestarted) && r.retry == Retry::Backoff));
    let c = get(&resolved);
    assert!(c.is_some_and(|r| r.code == Some(Code::ResultDeliveryFailed)
        && r.outcome == Outcome::Committed
        && r.retry == Retry::FetchResult));
    assert_eq!(verdict(&journal, &resolved), Some(Verdict::Fetch));
    assert!(last_is_recovery(&journal, &dispatched));
    // A second restart finds nothing live.
    drop(journal);
    assert_eq!(reopen(dir.path()).1.recovered.len(), 0);
}

/// SPEC §5.5: `REMOTE_RESPONSE_COMPLETE` alone resolves nothing. A crash after it and before
/// `RESULT_COMMITTED` is `BROKER_RESTARTED` (unknown); the received status and digest stay
/// as evidence, and nothing tells the caller to fetch a result that was never stored.
#[test]
fn a_response_received_but_not_committed_recovers_as_unknown_with_its_evidence() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let id = new_invocation_id();
    let digest = sha256_tagged(b"hi");
    {
        let journal = open(dir.path());
        let remote = |body| {
            Draft::observed(body)
                .source(Source::RemoteResponse)
                .hop("origin")
        };
        // One append per event, as a transport writing them apart would.
        let steps = vec![
            vec![accepted("POST"), preflight(false)],
            vec![dispatch()],
            vec![Draft::observed(Body::RequestSent(RequestSent { bytes: 9 })).hop("origin")],
            vec![remote(Body::RemoteResponseStarted(ResponseStarted {
                status: Some(201),
            }))],
            vec![remote(Body::RemoteResponseComplete(ResponseComplete {
                completion: Completion::ContentLength,
                bytes: 2,
                digest: digest.clone(),
            }))],
        ];
        for drafts in steps {
            let r = journal.append_blocking(&id, drafts);
            assert!(r.is_ok(), "{r:?}");
        }
    }
    let (journal, report) = reopen(dir.path());
    assert_eq!(report.recovered, vec![(id.clone(), Code::BrokerRestarted)]);
    let r = journal.record(&id).ok().flatten();
    let Some(r) = r else { panic!("no record") };
    assert_eq!(
        (r.code, r.phase, r.outcome, r.retry),
        (
            Some(Code::BrokerRestarted),
            Phase::RemoteExecution,
            Outcome::Unknown,
            Retry::Reconcile
        )
    );
    assert!(r.evidence.response_headers_received && r.evidence.response_complete);
    assert_eq!(r.evidence.extra.get("response_status"), Some(&201.into()));
    assert_eq!(r.evidence.response_digest.as_deref(), Some(digest.as_str()));
    assert_eq!(r.evidence.completion, Some(Completion::ContentLength));
    assert!(r.result.is_none());
    assert_eq!(journal.result(&id).ok().flatten(), None);
    assert_eq!(verdict(&journal, &id), Some(Verdict::Reconcile));
    assert!(last_is_recovery(&journal, &id));
}

/// A committed invocation whose result is gone by the restart (its retention ran out while
/// the delivery hung) keeps its outcome, but is not sent to fetch what is not there.
#[test]
fn recovery_never_points_at_a_result_that_is_gone() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let id = new_invocation_id();
    {
        let journal = open(dir.path());
        let (draft, result) = committed(&id, 1);
        let removed = rt().block_on(async {
            journal
                .append(&id, vec![accepted("POST"), preflight(false), dispatch()])
                .await?;
            journal.commit_result(&id, vec![draft], result).await?;
            journal.expire_results().await
        });
        assert_eq!(removed, Ok(1));
    }
    let (journal, report) = reopen(dir.path());
    assert_eq!(
        report.recovered,
        vec![(id.clone(), Code::ResultStoreFailed)]
    );
    let r = journal.record(&id).ok().flatten();
    assert!(
        r.as_ref().is_some_and(|r| r.outcome == Outcome::Committed
            && r.retry == Retry::Reconcile
            && r.phase == Phase::ResultDelivery),
        "{r:?}"
    );
    assert_eq!(verdict(&journal, &id), Some(Verdict::ReturnRecordedOutcome));
}

#[test]
fn result_committed_and_its_result_are_one_write_or_none() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let journal = open(dir.path());
    let id = new_invocation_id();
    let ok = journal.append_blocking(&id, vec![accepted("POST"), preflight(false), dispatch()]);
    assert!(ok.is_ok());
    let (draft, result) = committed(&id, journal.result_expiry_ms());
    let refused = Err(JournalError::Refused(Refusal::ResultWithoutCommit));
    // The resolving event without its result.
    let alone = journal.append_blocking(&id, vec![draft.clone()]);
    assert_eq!(alone.map(|_| ()), refused);
    let rt = rt();
    // A result without its resolving event, and one filed under another invocation.
    let stray = rt.block_on(journal.commit_result(&id, vec![], result.clone()));
    assert_eq!(stray.map(|_| ()), refused);
    let mut elsewhere = result.clone();
    elsewhere.invocation_id = new_invocation_id();
    let misfiled = rt.block_on(journal.commit_result(&id, vec![draft.clone()], elsewhere));
    assert_eq!(misfiled.map(|_| ()), refused);
    assert_eq!(journal.result(&id).ok().flatten(), None);
    // Nothing was written: the invocation still resolves normally.
    let done = rt.block_on(journal.commit_result(&id, vec![draft], result));
    assert!(done.is_ok_and(|a| a.state.record.outcome == Outcome::Committed));
    assert!(journal.verify().is_ok_and(|r| r.ok && r.events == 4));
}

/// RESULT_STORE_FAILED: a result write that failed leaves the invocation `unknown` after the
/// restart; a write that landed but whose sync failed is there to fetch.
#[test]
fn a_failed_result_write_recovers_unknown_and_a_landed_one_is_fetchable() {
    for landed in [false, true] {
        let Ok(dir) = tempfile::tempdir() else {
            panic!("no temp dir");
        };
        let id = new_invocation_id();
        {
            let Some(store) = FailingSync::open(dir.path()) else {
                panic!("store");
            };
            let Ok((journal, _)) = Journal::with_store(store.clone(), JournalOptions::default())
            else {
                panic!("journal");
            };
            let ok =
                journal.append_blocking(&id, vec![accepted("POST"), preflight(false), dispatch()]);
            assert!(ok.is_ok());
            let fault = if landed {
                &store.fail
            } else {
                &store.fail_result_writes
            };
            fault.store(true, Ordering::SeqCst);
            let (draft, result) = committed(&id, journal.result_expiry_ms());
            let r = rt().block_on(journal.commit_result(&id, vec![draft], result));
            assert_eq!(r.map(|_| ()), Err(JournalError::Unavailable));
            assert!(journal.health().is_fatal());
        }
        let (journal, report) = reopen(dir.path());
        let (code, outcome, retry, verdict_now) = if landed {
            let fetch = (Retry::FetchResult, Verdict::Fetch);
            (
                Code::ResultDeliveryFailed,
                Outcome::Committed,
                fetch.0,
                fetch.1,
            )
        } else {
            let reconcile = (Retry::Reconcile, Verdict::Reconcile);
            (
                Code::BrokerRestarted,
                Outcome::Unknown,
                reconcile.0,
                reconcile.1,
            )
        };
        assert_eq!(
            report.recovered,
            vec![(id.clone(), code)],
            "landed={landed}"
        );
        let r = journal.record(&id).ok().flatten();
        assert!(
            r.as_ref()
                .is_some_and(|r| r.outcome == outcome && r.retry == retry),
            "landed={landed}: {r:?}"
        );
        assert_eq!(journal.result(&id).ok().flatten().is_some(), landed);
        assert_eq!(verdict(&journal, &id), Some(verdict_now));
    }
}
