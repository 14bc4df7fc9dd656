//! One sweep over many more expired index entries than one batch removes them all, and
//! leaves the live ones and an exact count of them.

use super::*;
use crate::contract::Code;
use crate::journal::{
    Accepted, Body, Claims, Draft, Durability, EventStore, Failure, FjallStore, IndexEntries,
    JournalOptions, KeyClaim, KeyEntry, KeySlot, Protocol, TwinClaim, TwinEntry, TwinSlot,
    TwinWrite, WriteSet, new_invocation_id,
};

/// More than two batches, and not a whole number of them.
const MANY: usize = 2 * SWEEP_BATCH + 100;
const LIVE: usize = 10;

fn open(dir: &std::path::Path) -> Journal {
    let options = JournalOptions {
        durability: Durability::Buffered,
        ..JournalOptions::default()
    };
    crate::journal::open_for_test(dir, options).0
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

/// A request refused before dispatch: settled, so a restart has nothing to recover.
fn refused() -> Vec<Draft> {
    let accepted = Draft::observed(Body::ActionAccepted(Accepted {
        agent: "ci".into(),
        protocol: Protocol::Https,
        method: Some("POST".into()),
        target: "https://api.test/pay".into(),
        command: None,
    }));
    let failed = Draft::observed(Body::Failed(Failure::of(Code::RouteDenied)));
    vec![accepted, failed]
}

/// A key and a twin for request `n` of invocation `id`, both expiring at `expires_at_ms`.
fn claims(n: usize, id: &str, expires_at_ms: i64) -> Claims {
    let key = KeyClaim {
        slot: KeySlot {
            scope: "payments".into(),
            agent: "ci".into(),
            key: format!("k{n}"),
        },
        entry: KeyEntry {
            invocation_id: id.into(),
            fingerprint: format!("sha256:{n}"),
            expires_at_ms,
        },
    };
    let twin = TwinClaim {
        slot: TwinSlot {
            agent: "ci".into(),
            route: "pay".into(),
            fingerprint: format!("sha256:{n}"),
        },
        entry: TwinEntry {
            invocation_id: id.into(),
            expires_at_ms,
        },
        saw: None,
    };
    Claims {
        key: Some(key),
        twin: Some(twin),
        reserved: false,
    }
}

/// `MANY` requests whose windows closed long ago, then `LIVE` whose windows are open.
async fn claim_all(j: &Journal) {
    let later = i64::MAX / 2;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..MANY + LIVE {
        let j = j.clone();
        let expires = if n < MANY { 1 } else { later };
        tasks.spawn(async move {
            let id = new_invocation_id();
            j.append_with(&id, refused(), claims(n, &id, expires)).await
        });
    }
    while let Some(done) = tasks.join_next().await {
        assert!(matches!(done, Ok(Ok(_))), "{done:?}");
    }
}

#[test]
fn one_sweep_removes_every_expired_key_and_twin_however_many() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let rt = rt();
    {
        let j = open(dir.path());
        rt.block_on(claim_all(&j));
        let all = (MANY + LIVE) as u64;
        let held = IndexEntries {
            keys: all,
            twins: all,
        };
        assert_eq!(j.store.index_entries(), held);
        assert_eq!(rt.block_on(j.expire_twins()), Ok(MANY));
        assert_eq!(rt.block_on(j.expire_keys()), Ok(MANY));
        let now = unix_ms(j.now());
        let due = (
            j.store
                .expired_twins(now, None, usize::MAX)
                .map(|d| d.len()),
            j.store.expired_keys(now, None, usize::MAX).map(|d| d.len()),
        );
        assert_eq!(due, (Ok(0), Ok(0)), "no expired entry is left");
        let live = IndexEntries {
            keys: LIVE as u64,
            twins: LIVE as u64,
        };
        assert_eq!(j.store.index_entries(), live);
        let gauges = (j.metrics().index_keys.get(), j.metrics().index_twins.get());
        assert_eq!(gauges, (LIVE as i64, LIVE as i64));
        // Nothing more is due: a second sweep finds nothing.
        assert_eq!(rt.block_on(j.expire_twins()), Ok(0));
    }
    // The count kept with every write is the one a scan finds at open.
    let j = open(dir.path());
    let live = IndexEntries {
        keys: LIVE as u64,
        twins: LIVE as u64,
    };
    assert_eq!(j.store.index_entries(), live);
}

#[test]
fn an_entry_expired_and_claimed_again_in_one_write_is_counted_once() {
    let Ok(dir) = tempfile::tempdir() else { return };
    let Ok(store) = FjallStore::open(dir.path()) else {
        panic!("store")
    };
    let key = b"ci\0pay\0sha256:f".to_vec();
    let write = |expires_at_ms: Option<i64>, replaces_expiry, expired: &[i64]| {
        let twins = expires_at_ms.map(|at| TwinWrite {
            index_key: key.clone(),
            entry: TwinEntry {
                invocation_id: "act_1".into(),
                expires_at_ms: at,
            },
            replaces_expiry,
        });
        let set = WriteSet {
            twins: twins.into_iter().collect(),
            expired_twins: expired.iter().map(|at| (*at, key.clone())).collect(),
            ..WriteSet::default()
        };
        assert_eq!(store.write(set), Ok(()));
        let held = store.index_entries().twins;
        let expiry = store
            .twin_entry(&key)
            .ok()
            .flatten()
            .map(|e| e.expires_at_ms);
        (held, expiry)
    };
    assert_eq!(write(Some(5), None, &[]), (1, Some(5)));
    // The sweep's batch and a claim over the expired entry, in one group commit.
    assert_eq!(write(Some(9), Some(5), &[5]), (1, Some(9)));
    assert_eq!(write(None, None, &[9]), (0, None));
}
