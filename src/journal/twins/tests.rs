//! The twin index over a real journal: claimed with an append, compare-and-set on the
//! entry the lookup saw, refreshed only for its own invocation, kept over a restart and
//! swept after its window.

use super::*;
use crate::contract::Code;
use crate::journal::{
    Accepted, Body, Claims, Dispatch, Draft, Failure, Journal, JournalError, JournalOptions,
    Protocol, Refusal,
};

fn open(dir: &std::path::Path) -> Journal {
    crate::journal::open_for_test(dir, JournalOptions::default()).0
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

fn accepted() -> Vec<Draft> {
    vec![Draft::observed(Body::ActionAccepted(Accepted {
        agent: "ci".into(),
        protocol: Protocol::Https,
        method: Some("POST".into()),
        target: "https://api.test/pay".into(),
        command: None,
    }))]
}

fn slot() -> TwinSlot {
    TwinSlot {
        agent: "ci".into(),
        route: "pay".into(),
        fingerprint: "sha256:f".into(),
    }
}

fn claim(id: &str, saw: Option<&str>, expires_at_ms: i64) -> Claims {
    Claims {
        key: None,
        twin: Some(TwinClaim {
            slot: slot(),
            entry: TwinEntry {
                invocation_id: id.into(),
                expires_at_ms,
            },
            saw: saw.map(str::to_owned),
        }),
        reserved: false,
    }
}

#[test]
fn index_keys_separate_their_parts() {
    let a = TwinSlot {
        agent: "a".into(),
        route: "bc".into(),
        fingerprint: "f".into(),
    };
    let b = TwinSlot {
        agent: "ab".into(),
        route: "c".into(),
        fingerprint: "f".into(),
    };
    assert_ne!(a.index_key(), b.index_key());
}

fn settled(code: Code) -> Vec<Draft> {
    let mut drafts = accepted();
    drafts.push(Draft::observed(Body::Failed(Failure::of(code))));
    drafts
}

fn cancelled() -> Vec<Draft> {
    let mut drafts = accepted();
    drafts.push(Draft::observed(Body::DispatchStarted(Dispatch::default())).hop("origin"));
    drafts.push(Draft::observed(Body::Failed(Failure::of(
        Code::CallerCancelled,
    ))));
    drafts
}

#[test]
fn a_claim_over_a_stale_view_loses_to_a_holder_not_awaited_and_writes_nothing() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let rt = rt();
    let later = i64::MAX / 2;
    let ids: Vec<String> = (0..4)
        .map(|_| crate::journal::new_invocation_id())
        .collect();
    {
        let j = open(dir.path());
        // Both saw an empty slot; the first took it and settled, the second loses to it.
        let first = rt.block_on(j.append_with(
            &ids[0],
            settled(Code::RouteDenied),
            claim(&ids[0], None, later),
        ));
        assert!(first.is_ok(), "{first:?}");
        let lost = rt.block_on(j.append_with(&ids[1], accepted(), claim(&ids[1], None, later)));
        assert_eq!(
            lost.err(),
            Some(JournalError::Refused(Refusal::TwinMoved(ids[0].clone())))
        );
        assert_eq!(j.events(&ids[1]).map(|e| e.len()).ok(), Some(0));
        // Judged again against the holder, it takes the slot over it.
        let again =
            rt.block_on(j.append_with(&ids[1], accepted(), claim(&ids[1], Some(&ids[0]), later)));
        assert!(again.is_ok(), "{again:?}");
        // A holder whose caller left is not awaited either.
        let gone =
            rt.block_on(j.append_with(&ids[2], cancelled(), claim(&ids[2], Some(&ids[1]), later)));
        assert!(gone.is_ok(), "{gone:?}");
        let stale =
            rt.block_on(j.append_with(&ids[3], accepted(), claim(&ids[3], Some(&ids[1]), later)));
        assert_eq!(
            stale.err(),
            Some(JournalError::Refused(Refusal::TwinMoved(ids[2].clone())))
        );
        // A claim riding another invocation's append is refused outright.
        let foreign = rt.block_on(j.append_with(&ids[3], accepted(), claim(&ids[1], None, later)));
        assert_eq!(
            foreign.err(),
            Some(JournalError::Refused(Refusal::UnknownInvocation))
        );
    }
    // It survives a restart.
    let j = open(dir.path());
    assert_eq!(
        j.twin_entry(&slot())
            .ok()
            .flatten()
            .map(|e| e.invocation_id),
        Some(ids[2].clone())
    );
}

#[test]
fn identical_requests_in_parallel_do_not_queue_behind_each_other() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let rt = rt();
    let j = open(dir.path());
    let ids: Vec<String> = (0..3)
        .map(|_| crate::journal::new_invocation_id())
        .collect();
    let later = i64::MAX / 2;
    // In one group and across groups: the slot's holder is served to a waiting caller.
    let (ra, rb) = rt.block_on(async {
        tokio::join!(
            j.append_with(&ids[0], accepted(), claim(&ids[0], None, later)),
            j.append_with(&ids[1], accepted(), claim(&ids[1], None, later)),
        )
    });
    assert!(ra.is_ok() && rb.is_ok(), "{ra:?} {rb:?}");
    let rc = rt.block_on(j.append_with(&ids[2], accepted(), claim(&ids[2], None, later)));
    assert!(rc.is_ok(), "{rc:?}");
    assert_eq!(
        j.twin_entry(&slot())
            .ok()
            .flatten()
            .map(|e| e.invocation_id),
        Some(ids[2].clone())
    );
}

#[test]
fn a_touch_moves_only_its_own_entry_and_the_sweep_forgets_expired_ones() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let rt = rt();
    let j = open(dir.path());
    let (a, b) = (
        crate::journal::new_invocation_id(),
        crate::journal::new_invocation_id(),
    );
    let first = rt.block_on(j.append_with(&a, accepted(), claim(&a, None, 5)));
    assert!(first.is_ok(), "{first:?}");
    // Expired: reads as none, and a claim that saw none takes it.
    assert_eq!(j.twin_entry(&slot()).ok().flatten(), None);
    let later = i64::MAX / 2;
    let second = rt.block_on(j.append_with(&b, accepted(), claim(&b, None, later)));
    assert!(second.is_ok(), "{second:?}");
    // A touch naming the old twin leaves the new one alone.
    let Some(stale) = claim(&a, Some(&a), later + 1).twin else {
        return;
    };
    rt.block_on(j.touch_twin(stale));
    let Some(own) = claim(&b, Some(&b), later + 2).twin else {
        return;
    };
    rt.block_on(j.touch_twin(own));
    let _ = rt.block_on(j.flush());
    assert_eq!(
        j.twin_entry(&slot())
            .ok()
            .flatten()
            .map(|e| (e.invocation_id, e.expires_at_ms)),
        Some((b.clone(), later + 2))
    );
    // The sweep takes the rows of the first entry's expiry and of the refreshed ones'
    // old expiries; the live entry stays.
    let swept = rt.block_on(j.expire_twins());
    assert!(swept.is_ok(), "{swept:?}");
    assert!(j.twin_entry(&slot()).ok().flatten().is_some());
    let Some(gone) = claim(&b, Some(&b), 7).twin else {
        return;
    };
    rt.block_on(j.touch_twin(gone));
    let _ = rt.block_on(j.flush());
    assert_eq!(rt.block_on(j.expire_twins()).ok(), Some(1));
    assert_eq!(j.store.twin_entry(&slot().index_key()).ok().flatten(), None);
}
