//! `postern audit verify`: walk the hash chain from the first event.

use serde::Serialize;

use super::event::GENESIS_HASH;
use super::store::{EventStore, StoreError};

/// The first break in the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainBreak {
    pub seq: u64,
    pub reason: String,
}

/// The result of a chain walk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditReport {
    pub ok: bool,
    pub events: u64,
    pub head_seq: u64,
    pub head_hash: String,
    #[serde(rename = "break", skip_serializing_if = "Option::is_none")]
    pub chain_break: Option<ChainBreak>,
}

const PAGE: usize = 4096;

/// Verifies seq continuity, `prev_hash` links and every `hash`.
pub fn verify(store: &dyn EventStore) -> Result<AuditReport, StoreError> {
    let mut expected_seq = 1;
    let mut prev = GENESIS_HASH.to_owned();
    let mut count = 0;
    loop {
        let page = store.raw_events(expected_seq, PAGE)?;
        if page.is_empty() {
            break;
        }
        for raw in page {
            let fail = |reason: &str| broken(count, raw.key_seq, reason, &prev);
            if raw.key_seq != expected_seq {
                return Ok(broken(
                    count,
                    expected_seq,
                    "missing event (seq gap)",
                    &prev,
                ));
            }
            let Ok(event) = super::encoding::decode(&raw.bytes) else {
                return Ok(fail("event bytes do not parse"));
            };
            if event.seq != raw.key_seq {
                return Ok(fail("event seq differs from its key"));
            }
            if event.prev_hash != prev {
                return Ok(fail("prev_hash does not link to the previous event"));
            }
            if event.compute_hash() != event.hash {
                return Ok(fail("hash does not match the event's contents"));
            }
            prev = event.hash;
            count += 1;
            expected_seq += 1;
        }
    }
    Ok(AuditReport {
        ok: true,
        events: count,
        head_seq: expected_seq - 1,
        head_hash: prev,
        chain_break: None,
    })
}

fn broken(count: u64, seq: u64, reason: &str, prev: &str) -> AuditReport {
    AuditReport {
        ok: false,
        events: count,
        head_seq: seq.saturating_sub(1),
        head_hash: prev.to_owned(),
        chain_break: Some(ChainBreak {
            seq,
            reason: reason.to_owned(),
        }),
    }
}
