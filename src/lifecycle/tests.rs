//! The dispatch boundary while the journal is low on disk space.

use super::*;
use crate::contract::{Outcome, Phase};
use crate::journal::{EventKind, JournalOptions, Preflight, Protocol};

fn accepted() -> Accepted {
    Accepted {
        agent: "ci".into(),
        protocol: Protocol::Https,
        method: Some("POST".into()),
        target: "https://api.test/pay".into(),
        command: None,
    }
}

fn preflight() -> Draft {
    Draft::observed(Body::PreflightValidated(Preflight {
        route: "r".into(),
        fingerprint: "sha256:f".into(),
        idempotent: false,
        credential: None,
        idempotency: None,
        safe_until_ms: None,
        retry_budget: None,
        credential_placeholder: false,
        resend: None,
    }))
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
fn an_invocation_admitted_before_the_disk_ran_low_is_not_dispatched_and_its_failure_is_recorded() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let Ok((journal, _)) = Journal::open(dir.path(), JournalOptions::default()) else {
        panic!("journal");
    };
    let mut inv = Invocation::accept(journal.clone(), accepted());
    rt().block_on(async {
        assert!(inv.record(vec![preflight()]).await.is_ok());
        journal.health().set_low_space(true);
        let crossed = inv
            .dispatch_boundary(vec![], Dispatch::default(), "origin")
            .await;
        let Err(env) = crossed else {
            panic!("dispatched while low on space");
        };
        assert_eq!(env.error.code, Code::JournalUnavailable);
        assert_eq!(env.invocation_id.as_deref(), Some(inv.id()));
    });
    assert!(!inv.dispatched());
    let kinds: Vec<EventKind> = match journal.events(inv.id()) {
        Ok(events) => events.iter().map(|e| e.kind).collect(),
        Err(e) => panic!("events: {e}"),
    };
    assert!(!kinds.contains(&EventKind::DispatchStarted), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&EventKind::Failed));
    let Ok(Some(record)) = journal.record(inv.id()) else {
        panic!("no record");
    };
    assert_eq!(record.outcome, Outcome::NotAttempted);
    assert_eq!(record.phase, Phase::Validation);
}

#[test]
fn nothing_of_an_invocation_the_journal_refused_is_named_in_its_envelope() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let Ok((journal, _)) = Journal::open(dir.path(), JournalOptions::default()) else {
        panic!("journal");
    };
    journal.health().set_low_space(true);
    let mut inv = Invocation::accept(journal.clone(), accepted());
    let env = rt().block_on(inv.fail(vec![preflight()], Failure::of(Code::RouteDenied)));
    assert_eq!(env.error.code, Code::JournalUnavailable);
    assert_eq!(
        env.invocation_id, None,
        "names an id the journal does not hold"
    );
    assert!(matches!(journal.record(inv.id()), Ok(None)));
}
