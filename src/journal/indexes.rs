//! The indexes as the journal's callers reach them: reads go to the store, index-only
//! writes (a key's or twin's expiry moved on) to the writer. The index types themselves
//! (`keys`, `twins`) depend on nothing above them. In a fleet (`shared`) the shared index
//! answers instead, and an invocation this node does not hold is looked up in its
//! directory.

use tokio::sync::oneshot;

use super::keys::{KeyClaim, KeyEntry, KeySlot};
use super::projection::{Record, State};
use super::result::StoredResult;
use super::shared::{Leased, SharedError, SharedLease};
use super::twins::{TwinClaim, TwinEntry, TwinSlot};
use super::writer::Request;
use super::{Journal, JournalError, StoreError, unix_ms};

/// Where an invocation is: in this node's journal, or (in a fleet) another node's.
#[derive(Debug, Clone, PartialEq)]
pub enum Whereabouts {
    Here(State),
    /// Held by `node`; `state` is what it published, brought up to the store's lease
    /// (none: nothing published yet).
    There {
        node: String,
        state: Option<State>,
        lease: SharedLease,
    },
}

/// A record as a listing shows it: this node's, or another fleet node's as it published it.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub record: Record,
    /// The node that published it; none for this node's own.
    pub node: Option<String>,
}

impl Listed {
    pub fn json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(&self.record).unwrap_or_default();
        if let Some(node) = &self.node {
            v["node"] = serde_json::Value::String(node.clone());
        }
        v
    }
}

/// A published state as the store's lease says it is now: dispatched once the lease says
/// so, and a later generation (leased since, not published yet) open, from its lease.
fn current(mut state: State, lease: SharedLease) -> State {
    let p = &mut state.progress;
    if lease.generation > state.record.generation {
        state.record.generation = lease.generation;
        p.closed = false;
        p.dispatched_this_generation = false;
        p.lease_started_ms = lease.started_ms;
    }
    if lease.generation == state.record.generation && lease.dispatched {
        p.dispatched_this_generation = true;
        p.dispatched_ever = true;
    }
    // Once anything was dispatched, nothing reads `not_attempted` again (SPEC §1).
    if p.dispatched_ever && state.record.outcome == crate::contract::Outcome::NotAttempted {
        state.record.outcome = crate::contract::Outcome::Unknown;
    }
    state
}

impl From<SharedError> for StoreError {
    fn from(e: SharedError) -> Self {
        StoreError::Io(e.to_string())
    }
}

impl Journal {
    /// The live index entry of a key (an expired one reads as none).
    pub fn key_entry(&self, slot: &KeySlot) -> Result<Option<KeyEntry>, StoreError> {
        let now = unix_ms(self.now());
        Ok(self
            .store
            .key_entry(&slot.index_key())?
            .filter(|e| e.expires_at_ms > now))
    }

    /// The live entry of a key, from the fleet's index when there is one.
    pub async fn find_key(&self, slot: &KeySlot) -> Result<Option<KeyEntry>, StoreError> {
        match self.shared() {
            Some(shared) => Ok(shared.key_entry(slot, unix_ms(self.now())).await?),
            None => self.key_entry(slot),
        }
    }

    /// Moves a key's expiry on without an event (a replay is a use, not a transition).
    pub async fn touch_key(&self, claim: KeyClaim) -> Result<(), JournalError> {
        if let Some(shared) = self.shared() {
            return shared
                .touch_key(&claim)
                .await
                .map_err(|_| JournalError::SharedUnavailable);
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Touch { claim, reply })
            .await
            .map_err(|_| JournalError::Unavailable)?;
        rx.await.map_err(|_| JournalError::Unavailable)?
    }
}

impl Journal {
    /// The live twin of a slot (an expired entry reads as none).
    pub fn twin_entry(&self, slot: &TwinSlot) -> Result<Option<TwinEntry>, StoreError> {
        let now = unix_ms(self.now());
        Ok(self
            .store
            .twin_entry(&slot.index_key())?
            .filter(|e| e.expires_at_ms > now))
    }

    /// Moves a twin's expiry on (a resend answered from it is a use), without an event
    /// and without waiting: losing it on a crash only shortens the window. A slot that
    /// names another invocation by now is left as it is.
    pub async fn touch_twin(&self, claim: TwinClaim) {
        if let Some(shared) = self.shared() {
            let _ = shared.touch_twin(&claim).await;
            return;
        }
        let _ = self.tx.send(Request::TouchTwin { claim }).await;
    }

    /// The live twin of a slot, from the fleet's index when there is one.
    pub async fn find_twin(&self, slot: &TwinSlot) -> Result<Option<TwinEntry>, StoreError> {
        match self.shared() {
            Some(shared) => Ok(shared.twin_entry(slot, unix_ms(self.now())).await?),
            None => self.twin_entry(slot),
        }
    }
}

impl Journal {
    /// An invocation wherever it lives: here, or (in a fleet) with the node that holds its
    /// current generation, whose copy wins over an older one here.
    pub async fn locate(&self, invocation_id: &str) -> Result<Option<Whereabouts>, StoreError> {
        let Some(shared) = self.shared() else {
            return Ok(self.state(invocation_id)?.map(Whereabouts::Here));
        };
        match shared.lookup(invocation_id).await? {
            Some(d) if d.node != shared.node() => Ok(Some(Whereabouts::There {
                node: d.node,
                state: d.state.map(|s| current(s, d.lease)),
                lease: d.lease,
            })),
            _ => Ok(self.state(invocation_id)?.map(Whereabouts::Here)),
        }
    }

    /// Leases the next generation in the fleet's store before it is journaled here.
    pub async fn lease_shared(
        &self,
        invocation_id: &str,
        generation: u32,
        ttl: std::time::Duration,
    ) -> Result<Leased, JournalError> {
        let Some(shared) = self.shared() else {
            return Ok(Leased::Unshared);
        };
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        shared
            .lease(invocation_id, generation, ttl_ms, unix_ms(self.now()))
            .await
            .map_err(|_| JournalError::SharedUnavailable)
    }

    /// Whether this node still holds `generation` as it crosses the dispatch boundary
    /// (always, alone).
    pub async fn confirm_dispatch(
        &self,
        invocation_id: &str,
        generation: u32,
    ) -> Result<bool, JournalError> {
        let Some(shared) = self.shared() else {
            return Ok(true);
        };
        shared
            .confirm_dispatch(invocation_id, generation)
            .await
            .map_err(|_| JournalError::SharedUnavailable)
    }

    /// Records newest first, strictly older than `before`: this node's and, in a fleet, the
    /// other nodes' (as published; the node holding an invocation's current generation wins).
    pub async fn fleet_records_before(
        &self,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, StoreError> {
        let own = self.records_before(before, limit)?;
        let mut all: Vec<Listed> = own
            .into_iter()
            .map(|record| Listed { record, node: None })
            .collect();
        if let Some(shared) = self.shared() {
            for (node, state) in shared.published_before(before, limit).await? {
                // Taken over by another node: its copy is the current one.
                all.retain(|l| l.record.invocation_id != state.record.invocation_id);
                all.push(Listed {
                    record: state.record,
                    node: Some(node),
                });
            }
        }
        all.sort_by(|a, b| b.record.invocation_id.cmp(&a.record.invocation_id));
        all.truncate(limit);
        Ok(all)
    }

    /// An invocation's record wherever it lives (another node's: as it last published it).
    pub async fn find_record(&self, invocation_id: &str) -> Result<Option<Record>, StoreError> {
        Ok(match self.locate(invocation_id).await? {
            Some(Whereabouts::Here(s)) => Some(s.record),
            Some(Whereabouts::There { state, .. }) => state.map(|s| s.record),
            None => None,
        })
    }

    /// A stored result wherever it lives, until its retention ends.
    pub async fn find_result(
        &self,
        invocation_id: &str,
    ) -> Result<Option<StoredResult>, StoreError> {
        if let Some(result) = self.result(invocation_id)? {
            return Ok(Some(result));
        }
        let Some(shared) = self.shared() else {
            return Ok(None);
        };
        let now = unix_ms(self.now());
        Ok(shared
            .result(invocation_id)
            .await?
            .filter(|r| r.expires_at_ms > now))
    }
}
