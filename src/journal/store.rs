//! The narrow storage trait the journal writes through.
//!
//! After any `StoreError::Poisoned` the store accepts no further writes; the
//! process must exit and recover from what is durable.

use super::event::{Checkpoint, Event, Sealed};
use super::keys::{KeyEntry, KeyWrite};
use super::projection::State;
use super::request::StoredRequest;
use super::result::StoredResult;
use super::twins::{TwinEntry, TwinWrite};

/// A storage failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("the journal is locked by another process")]
    Locked,
    #[error("a previous sync failed; the journal accepts no writes")]
    Poisoned,
    #[error("storage I/O failed: {0}")]
    Io(String),
    #[error("stored {what} is corrupt: {detail}")]
    Corrupt { what: &'static str, detail: String },
}

/// Everything one group commit writes, atomically.
#[derive(Debug, Default)]
pub struct WriteSet {
    /// Chained events, each with the `data` JSON its hash was computed over.
    pub events: Vec<Sealed>,
    pub states: Vec<std::sync::Arc<State>>,
    /// Invocations with a live exchange (recovery looks at these).
    pub opened: Vec<String>,
    pub closed: Vec<String>,
    pub results: Vec<StoredResult>,
    /// Requests kept for `postern retry` (they expire with the results).
    pub requests: Vec<StoredRequest>,
    pub expired_results: Vec<(i64, String)>,
    /// Idempotency key index entries claimed or refreshed.
    pub keys: Vec<KeyWrite>,
    /// Expiry rows of the key index that came due: (expiry, index key). The entry goes
    /// with its row only if it was not refreshed meanwhile.
    pub expired_keys: Vec<(i64, Vec<u8>)>,
    /// Twin index entries claimed or refreshed (SPEC §3.7).
    pub twins: Vec<TwinWrite>,
    /// Expiry rows of the twin index that came due, as `expired_keys`.
    pub expired_twins: Vec<(i64, Vec<u8>)>,
    /// A retention cut (its `JOURNAL_PRUNED` event rides `events`).
    pub cut: Option<Cut>,
    /// Kill switch rows set or removed (their `AGENT_*` events ride `events`).
    pub suspensions: Vec<super::suspensions::SuspensionWrite>,
    /// Result bodies written to files of their own are synced before the write
    /// (`durability = "fsync"`).
    pub sync_bodies: bool,
}

/// What one retention cut removes, and the checkpoint it leaves in its place.
#[derive(Debug)]
pub struct Cut {
    pub checkpoint: Checkpoint,
    /// The seqs removed: from the previous checkpoint's next to `checkpoint.seq`.
    pub first_seq: u64,
    /// The keys of the stored values holding them.
    pub keys: Vec<u64>,
    /// Index rows removed: (invocation id, the row's key seq, `Run::row`).
    pub runs: Vec<(String, u64)>,
    /// Settled records removed (none of their events is left).
    pub states: Vec<String>,
    /// Settled records kept with some of their events cut, marked `events_pruned`.
    pub kept: Vec<std::sync::Arc<State>>,
    /// Cut events of records that are not settled (live, or waiting for reconciliation):
    /// kept aside, their hashes vouched for by the checkpoint's `islands_digest`.
    pub islands: Vec<Event>,
    /// Records whose kept-aside events go now (settled, nothing of them left in the chain).
    pub islands_released: Vec<String>,
}

impl WriteSet {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.results.is_empty()
            && self.requests.is_empty()
            && self.expired_results.is_empty()
            && self.keys.is_empty()
            && self.expired_keys.is_empty()
            && self.twins.is_empty()
            && self.expired_twins.is_empty()
            && self.cut.is_none()
            && self.suspensions.is_empty()
    }

    /// Whether this write touches an invocation's events or stored state: the sweeps must
    /// not remove the state of one (a write may reopen a settled record).
    pub fn touches(&self, invocation_id: &str) -> bool {
        self.events
            .iter()
            .any(|e| e.event.invocation_id == invocation_id)
            || self
                .states
                .iter()
                .any(|s| s.record.invocation_id == invocation_id)
    }
}

/// Consecutive events of one invocation, as its index lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The key seq of the index row that lists it: a settled invocation's runs share one
    /// row, and a retention cut removes a row only when it passes all of them.
    pub row: u64,
    pub first: u64,
    pub count: u32,
}

impl Run {
    /// The seq after its last event.
    pub fn end(&self) -> u64 {
        self.first.saturating_add(u64::from(self.count))
    }
}

/// How many entries the key and twin indexes hold, expired ones included until swept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexEntries {
    pub keys: u64,
    pub twins: u64,
}

/// One stored event as read back, for the audit walk (which must see unparsable values
/// too) and retention cuts.
pub struct RawEvent {
    /// The seq this event holds: its value's key plus its place in a run.
    pub seq: u64,
    /// The key of the stored value it came from (a run holds several events).
    pub key: u64,
    /// Whether it is the last event of that value (a cut ends only there).
    pub ends_value: bool,
    /// The event, or why its value does not decode (then it stands for the whole value).
    pub event: Result<Event, super::encoding::DecodeError>,
}

/// A states row: a settled record's mark (its events are its projection) or its state.
#[derive(Debug)]
pub enum StoredRow {
    /// Settled and resolved (not `unknown`).
    Resolved,
    /// Settled; replay its events to see how.
    Settled,
    /// Stored whole (open, or some of its events were cut).
    Full(Box<State>),
}

/// The journal's storage. Implementations must make `write` atomic.
pub trait EventStore: Send + Sync + 'static {
    /// Writes a set atomically; it reaches the OS before this returns.
    fn write(&self, set: WriteSet) -> Result<(), StoreError>;
    /// Makes every earlier `write` durable (fdatasync).
    fn sync(&self) -> Result<(), StoreError>;
    /// The event with the highest seq.
    fn head(&self) -> Result<Option<Event>, StoreError>;
    /// Stored events with seq >= `from`, at most `limit` (or to the end of the last value
    /// read), in seq order.
    fn raw_events(&self, from: u64, limit: usize) -> Result<Vec<RawEvent>, StoreError>;
    /// The index runs of one invocation, in seq order.
    fn runs_of(&self, invocation_id: &str) -> Result<Vec<Run>, StoreError>;
    /// The newest retention checkpoint: the kept chain starts after it.
    fn checkpoint(&self) -> Result<Option<Checkpoint>, StoreError>;
    /// Every event kept aside by a retention cut (`Cut::islands`), by invocation then seq.
    fn islands(&self) -> Result<Vec<Event>, StoreError>;
    /// The events kept aside of one invocation.
    fn islands_of(&self, invocation_id: &str) -> Result<Vec<Event>, StoreError>;
    /// The events of one invocation, kept aside or not, in seq order.
    fn events_of(&self, invocation_id: &str) -> Result<Vec<Event>, StoreError>;
    /// One invocation's states row as stored, without replaying its events.
    fn stored_row(&self, invocation_id: &str) -> Result<Option<StoredRow>, StoreError>;
    /// The projected state of one invocation.
    fn state(&self, invocation_id: &str) -> Result<Option<State>, StoreError>;
    /// States newest first, strictly older than `before` when given.
    fn states_before(&self, before: Option<&str>, limit: usize) -> Result<Vec<State>, StoreError>;
    /// Invocations whose exchange may still have been running.
    fn open_invocations(&self) -> Result<Vec<String>, StoreError>;
    /// The stored result of one invocation.
    fn result(&self, invocation_id: &str) -> Result<Option<StoredResult>, StoreError>;
    /// The request one invocation bound at preflight.
    fn request(&self, invocation_id: &str) -> Result<Option<StoredRequest>, StoreError>;
    /// Results whose retention ended at or before `now_ms`, oldest first: (expiry, id),
    /// from after the row `after` (a sweep's previous batch) or from the oldest.
    fn expired_results(
        &self,
        now_ms: i64,
        after: Option<&(i64, String)>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError>;
    /// The idempotency key index entry under `index_key`, expired or not.
    fn key_entry(&self, index_key: &[u8]) -> Result<Option<KeyEntry>, StoreError>;
    /// Key index expiry rows due at or before `now_ms`: (expiry, index key), as
    /// `expired_results`.
    fn expired_keys(
        &self,
        now_ms: i64,
        after: Option<&(i64, Vec<u8>)>,
        limit: usize,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError>;
    /// The twin index entry under `index_key`, expired or not.
    fn twin_entry(&self, index_key: &[u8]) -> Result<Option<TwinEntry>, StoreError>;
    /// Twin index expiry rows due at or before `now_ms`, as `expired_keys`.
    fn expired_twins(
        &self,
        now_ms: i64,
        after: Option<&(i64, Vec<u8>)>,
        limit: usize,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError>;
    /// How many entries the indexes hold now (kept count, not a scan).
    fn index_entries(&self) -> IndexEntries;
    /// The suspended agents (SPEC §5.8 kill switch).
    fn suspensions(&self) -> Result<Vec<super::suspensions::Suspension>, StoreError>;
    /// Removes stored result bodies whose results have all expired before `now_ms`; how
    /// many files.
    fn reclaim_bodies(&self, _now_ms: i64) -> Result<usize, StoreError> {
        Ok(0)
    }
    /// After each group with `fsync`: readies the store for the next small one (fjall: zeros
    /// ahead of its journal file, see `prefill`).
    fn prefill(&self, _small: bool) {}
}
