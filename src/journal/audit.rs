//! `postern audit verify`: walk the hash chain from the first event, or from the newest
//! retention checkpoint when older events were pruned (the checkpoint must be confirmed by
//! the `JOURNAL_PRUNED` event chained after its cut).

use serde::Serialize;

use super::event::{Checkpoint, Event, EventKind, GENESIS_HASH};
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
    /// The first seq verified: 1, or the one after the checkpoint.
    pub from_seq: u64,
    /// The retention checkpoint the walk starts from (none while nothing was pruned).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,
    pub head_seq: u64,
    pub head_hash: String,
    /// Events of records not settled at a cut (live, or `unknown`), kept aside and checked
    /// against the checkpoint's digest.
    #[serde(skip_serializing_if = "is_zero")]
    pub islands: u64,
    #[serde(rename = "break", skip_serializing_if = "Option::is_none")]
    pub chain_break: Option<ChainBreak>,
}

const PAGE: usize = 4096;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why the events kept aside do not match what the checkpoint vouches for, if they do not:
/// each must hash to its own `hash`, and all of them to the checkpoint's digest.
fn islands_break(mut islands: Vec<Event>, checkpoint: Option<&Checkpoint>) -> Option<String> {
    if let Some(e) = islands.iter().find(|e| e.compute_hash() != e.hash) {
        return Some(format!(
            "kept-aside event {} (invocation {}): hash does not match its contents",
            e.seq, e.invocation_id
        ));
    }
    let (count, digest) = super::retention::islands_digest(&mut islands);
    let (want_count, want) = checkpoint.map_or((0, ""), |c| (c.islands, c.islands_digest.as_str()));
    (count != want_count || digest != want).then(|| {
        format!(
            "{count} kept-aside events do not match the checkpoint's {want_count} (islands_digest)"
        )
    })
}

/// Verifies seq continuity, `prev_hash` links and every `hash`.
pub fn verify(store: &dyn EventStore) -> Result<AuditReport, StoreError> {
    let checkpoint = store.checkpoint()?;
    let mut walk = Walk {
        from_seq: checkpoint.as_ref().map_or(1, |c| c.seq + 1),
        expected_seq: 0,
        prev: checkpoint
            .as_ref()
            .map_or_else(|| GENESIS_HASH.to_owned(), |c| c.hash.clone()),
        count: 0,
        confirmed: checkpoint.is_none(),
        checkpoint,
    };
    walk.expected_seq = walk.from_seq;
    loop {
        let page = store.raw_events(walk.expected_seq, PAGE)?;
        if page.is_empty() {
            break;
        }
        for raw in page {
            if let Err(report) = walk.step(&raw) {
                return Ok(*report);
            }
        }
    }
    if !walk.confirmed {
        let seq = walk.expected_seq;
        return Ok(walk.broken(seq, "checkpoint not confirmed by a JOURNAL_PRUNED event"));
    }
    let islands = store.islands()?;
    let kept = islands.len() as u64;
    if let Some(reason) = islands_break(islands, walk.checkpoint.as_ref()) {
        let seq = walk.from_seq;
        return Ok(walk.broken(seq, &reason));
    }
    Ok(AuditReport {
        ok: true,
        events: walk.count,
        islands: kept,
        from_seq: walk.from_seq,
        head_seq: walk.expected_seq - 1,
        head_hash: walk.prev,
        chain_break: None,
        checkpoint: walk.checkpoint,
    })
}

struct Walk {
    from_seq: u64,
    expected_seq: u64,
    prev: String,
    count: u64,
    checkpoint: Option<Checkpoint>,
    /// Whether the kept chain holds the event that vouches for the checkpoint.
    confirmed: bool,
}

impl Walk {
    fn step(&mut self, raw: &super::store::RawEvent) -> Result<(), Box<AuditReport>> {
        let fail = |walk: &Self, reason: &str| Box::new(walk.broken(raw.seq, reason));
        if raw.seq != self.expected_seq {
            let seq = self.expected_seq;
            return Err(Box::new(self.broken(seq, "missing event (seq gap)")));
        }
        let event = match &raw.event {
            Ok(event) => event,
            Err(e) => return Err(fail(self, &format!("event bytes do not parse: {e}"))),
        };
        if event.seq != raw.seq {
            return Err(fail(self, "event seq differs from its key"));
        }
        if event.prev_hash != self.prev {
            return Err(fail(self, "prev_hash does not link to the previous event"));
        }
        if event.compute_hash() != event.hash {
            return Err(fail(self, "hash does not match the event's contents"));
        }
        if event.kind == EventKind::JournalPruned && !self.confirmed {
            let vouched = serde_json::from_value::<Checkpoint>(event.data.clone()).ok();
            self.confirmed = vouched.is_some() && vouched == self.checkpoint;
        }
        self.prev = event.hash.clone();
        self.count += 1;
        self.expected_seq += 1;
        Ok(())
    }
    fn broken(&self, seq: u64, reason: &str) -> AuditReport {
        AuditReport {
            ok: false,
            events: self.count,
            from_seq: self.from_seq,
            head_seq: seq.saturating_sub(1),
            head_hash: self.prev.clone(),
            islands: 0,
            chain_break: Some(ChainBreak {
                seq,
                reason: reason.to_owned(),
            }),
            checkpoint: self.checkpoint.clone(),
        }
    }
}
