//! Event retention (`journal.event_retention`): the oldest events are pruned behind a
//! checkpoint, so a journal at a constant rate stops growing and the audit still holds.
//!
//! A cut is a seq prefix: it goes from the previous checkpoint up to the last event older
//! than the retention, and stops early at an event whose invocation is still live (its
//! record must stay replayable). Settled records with no event left go with it, unless an
//! idempotency key or resend twin still names them: those go when that entry expires. The
//! cut's `JOURNAL_PRUNED` event is chained after it, so the checkpoint it leaves (the seq
//! and hash of the last pruned event) is confirmed by the chain `audit verify` walks.

use std::collections::{BTreeMap, HashMap, HashSet};

use tokio::sync::oneshot;

use super::event::{Body, Checkpoint, Draft, Event, EventKind, Source};
use super::keys::KeySlot;
use super::projection::{State, replay};
use super::store::{Cut, StoreError, StoredRow, WriteSet};
use super::twins::TwinSlot;
use super::writer::{Request, Writer};
use super::{Journal, JournalError, unix_ms};
use crate::contract::Outcome;

/// Events one cut looks at: a pass stays short, so appends queued behind it do not wait.
const EVENTS_PER_CUT: usize = 4096;
/// Cuts one sweep makes at most: enough for a busy day's backlog, and still bounded
/// (each cut is its own write: appends queued behind one go before the next).
const CUTS_PER_SWEEP: usize = 4096;

impl Journal {
    /// Prunes events older than `journal.event_retention` behind checkpoints; how many.
    pub async fn prune_events(&self) -> Result<u64, JournalError> {
        let mut pruned = 0;
        for _ in 0..CUTS_PER_SWEEP {
            let before_ms = unix_ms(self.now()) - self.options.event_retention_ms;
            let (reply, rx) = oneshot::channel();
            self.tx
                .send(Request::Prune { before_ms, reply })
                .await
                .map_err(|_| JournalError::Unavailable)?;
            match rx.await.map_err(|_| JournalError::Unavailable)?? {
                Some(cp) => pruned += cp.events,
                None => break,
            }
        }
        Ok(pruned)
    }
}

impl Writer {
    /// One cut, written and synced alone; `None` when nothing is old enough.
    pub(super) fn prune(&mut self, before_ms: i64) -> Result<Option<Checkpoint>, JournalError> {
        let planned = self.plan_cut(before_ms).or_else(|e| match e {
            // A record that does not read back stays, and so does all after it: the
            // sweep is no reason to stop postern (`audit verify` reports such damage).
            StoreError::Corrupt { what, detail } => {
                tracing::warn!(what, detail, "retention cut stopped at unreadable data");
                Ok(None)
            }
            other => Err(self.storage_fault(other)),
        })?;
        let Some(mut cut) = planned else {
            return Ok(None);
        };
        let id = format!("prn_{}", ulid::Ulid::generate());
        let draft = Draft::observed(Body::JournalPruned(cut.checkpoint.clone()))
            .source(Source::OperatorAttested);
        let start = self.head();
        let note = self.seal_note(&id, draft);
        let checkpoint = cut.checkpoint.clone();
        // Records the cut removes or marks pruned are read from the store again.
        let changed: Vec<String> = (cut.states.iter().cloned())
            .chain(cut.kept.iter().map(|s| s.record.invocation_id.clone()))
            .collect();
        let set = WriteSet {
            events: vec![note],
            states: std::mem::take(&mut cut.kept),
            cut: Some(cut),
            ..WriteSet::default()
        };
        match self.persist_synced(set) {
            Ok(()) => {
                self.settled.forget(changed.iter().map(String::as_str));
                self.metrics.pruned(checkpoint.events);
                Ok(Some(checkpoint))
            }
            Err(e) => {
                self.rewind(start);
                Err(e)
            }
        }
    }

    /// Which events, index runs and records a cut removes.
    fn plan_cut(&self, before_ms: i64) -> Result<Option<Cut>, StoreError> {
        let previous = self.store.checkpoint()?;
        let first_seq = previous.as_ref().map_or(1, |c| c.seq + 1);
        let mut touched = Vec::new();
        let mut seen = HashSet::new();
        // Records not settled (live, or `unknown` until reconciled): the cut passes them,
        // their events kept aside (islands), so one long relay or one unreconciled record
        // holds no one's retention back and loses none of its evidence.
        let mut unsettled = HashSet::new();
        let mut islands = Vec::new();
        // The settled records' events as read here: replaying them costs no second read.
        let mut scanned: HashMap<String, Vec<Event>> = HashMap::new();
        // A cut of nothing but the previous cut's note would only chain another.
        let mut substantive = false;
        let mut keys = Vec::new();
        // The cut so far, taken only where a stored value ends (a run is cut whole).
        let mut whole = None;
        for raw in self.store.raw_events(first_seq, EVENTS_PER_CUT)? {
            // An unreadable event stays: `audit verify` must still see it.
            let Ok(event) = raw.event else {
                break;
            };
            let old = event_ms(&event.ts).is_some_and(|ms| ms < before_ms);
            if !old || event.seq != raw.seq {
                break;
            }
            if seen.insert(event.invocation_id.clone()) {
                if !is_note(event.kind) && !self.settled(&event.invocation_id)? {
                    unsettled.insert(event.invocation_id.clone());
                }
                touched.push((event.invocation_id.clone(), event.seq));
            }
            substantive |= event.kind != EventKind::JournalPruned;
            let (seq, hash) = (event.seq, event.hash.clone());
            if unsettled.contains(&event.invocation_id) {
                islands.push(event);
            } else if !is_note(event.kind) {
                scanned
                    .entry(event.invocation_id.clone())
                    .or_default()
                    .push(event);
            }
            if raw.ends_value {
                keys.push(raw.key);
                whole = Some((seq, hash, substantive));
            }
        }
        let last = whole.and_then(|(seq, hash, substantive)| substantive.then_some((seq, hash)));
        let Some((seq, hash)) = last else {
            return Ok(None);
        };
        islands.retain(|e| e.seq <= seq);
        let previous_islands = (
            previous.as_ref().map_or(0, |c| c.islands),
            previous.map(|c| c.islands_digest).unwrap_or_default(),
        );
        let mut cut = Cut {
            checkpoint: Checkpoint {
                seq,
                hash,
                events: seq + 1 - first_seq,
                records: 0,
                islands: previous_islands.0,
                islands_digest: previous_islands.1,
            },
            first_seq,
            keys,
            runs: Vec::new(),
            states: Vec::new(),
            kept: Vec::new(),
            islands,
            islands_released: Vec::new(),
        };
        for (id, _) in touched.iter().filter(|(_, at)| *at <= seq) {
            match unsettled.contains(id) {
                true => {
                    self.plan_runs(id, seq, &mut cut)?;
                }
                false => self.plan_invocation(id, seq, &mut cut, scanned.get(id))?,
            }
        }
        if !cut.islands.is_empty() || !cut.islands_released.is_empty() {
            self.vouch_for_islands(&mut cut)?;
        }
        cut.checkpoint.records = cut.states.len() as u64;
        Ok(Some(cut))
    }

    /// An invocation the cut goes through: its runs that end at or before `seq` go, and its
    /// settled record goes when nothing of it is left and no index entry names it.
    fn plan_invocation(
        &self,
        id: &str,
        seq: u64,
        cut: &mut Cut,
        scanned: Option<&Vec<Event>>,
    ) -> Result<(), StoreError> {
        let left = self.plan_runs(id, seq, cut)?;
        let kept_aside = self.store.islands_of(id)?;
        let Some(mut state) = self
            .settled_state(id, left, &kept_aside, scanned)?
            .filter(|s| s.progress.closed)
        else {
            return Ok(());
        };
        // Settled now: what an earlier cut kept aside of it goes with its last events.
        if !left && !kept_aside.is_empty() {
            cut.islands_released.push(id.to_owned());
        }
        if !left && !self.held_by_index(&state)? {
            cut.states.push(id.to_owned());
        } else if !state.progress.events_pruned {
            state.progress.events_pruned = true;
            cut.kept.push(std::sync::Arc::new(state));
        }
        Ok(())
    }

    /// The index rows of `id` whose runs all end at or before `seq` go; whether any run is
    /// left (a row that lists one stays whole).
    fn plan_runs(&self, id: &str, seq: u64, cut: &mut Cut) -> Result<bool, StoreError> {
        let mut rows: BTreeMap<u64, bool> = BTreeMap::new();
        for run in self.store.runs_of(id)? {
            let passed = run.end() <= seq + 1;
            *rows.entry(run.row).or_insert(true) &= passed;
        }
        let mut left = false;
        for (row, passed) in rows {
            match passed {
                true => cut.runs.push((id.to_owned(), row)),
                false => left = true,
            }
        }
        Ok(left)
    }

    /// Nothing will be appended to it, and nothing waits on it: not live, closed, and not
    /// `unknown` (an operator must still reconcile it from its evidence). A resolved mark
    /// says so without replaying the record's events (a cut looks at thousands).
    fn settled(&self, id: &str) -> Result<bool, StoreError> {
        if self.is_live(id) {
            return Ok(false);
        }
        let state = match self.store.stored_row(id)? {
            None => return Ok(false),
            Some(StoredRow::Resolved) => return Ok(true),
            Some(StoredRow::Full(s)) => Some(*s),
            Some(StoredRow::Settled) => self.store.state(id)?,
        };
        Ok(state.is_some_and(|s| s.progress.closed && s.record.outcome != Outcome::Unknown))
    }

    /// A settled record's state. Marked settled with nothing of it left after this cut, all
    /// its events are the ones kept aside and the ones this cut read (a record some of whose
    /// events an earlier cut took is stored whole): replayed from memory, not read again.
    fn settled_state(
        &self,
        id: &str,
        left: bool,
        kept_aside: &[Event],
        scanned: Option<&Vec<Event>>,
    ) -> Result<Option<State>, StoreError> {
        match (self.store.stored_row(id)?, scanned) {
            (None, _) => Ok(None),
            (Some(StoredRow::Full(s)), _) => Ok(Some(*s)),
            (Some(StoredRow::Resolved | StoredRow::Settled), Some(events)) if !left => {
                let all: Vec<Event> = kept_aside.iter().chain(events).cloned().collect();
                Ok(replay(&all))
            }
            (Some(_), _) => self.store.state(id),
        }
    }

    /// The checkpoint names how many events are kept aside after this cut, and a digest of
    /// their hashes: `audit verify` checks each against its contents and all against it.
    fn vouch_for_islands(&self, cut: &mut Cut) -> Result<(), StoreError> {
        let released: HashSet<&str> = cut.islands_released.iter().map(String::as_str).collect();
        let mut all: Vec<Event> = self
            .store
            .islands()?
            .into_iter()
            .filter(|e| !released.contains(e.invocation_id.as_str()))
            .collect();
        all.extend(cut.islands.iter().cloned());
        let (count, digest) = islands_digest(&mut all);
        cut.checkpoint.islands = count;
        cut.checkpoint.islands_digest = digest;
        Ok(())
    }

    /// A live idempotency key or resend twin names this record: a request that finds the
    /// entry must still find the record (a missing one would read as never sent).
    fn held_by_index(&self, state: &State) -> Result<bool, StoreError> {
        let r = &state.record;
        let now = unix_ms((self.clock)());
        let names = |id: Option<(String, i64)>| {
            id.is_some_and(|(id, at)| id == r.invocation_id && at > now)
        };
        if let Some(k) = &r.evidence.idempotency {
            let slot = KeySlot {
                scope: k.scope.clone(),
                agent: r.agent.clone(),
                key: k.key.clone(),
            };
            let entry = self.store.key_entry(&slot.index_key())?;
            if names(entry.map(|e| (e.invocation_id, e.expires_at_ms))) {
                return Ok(true);
            }
        }
        if let (Some(route), Some(fingerprint)) = (&r.route, &r.evidence.fingerprint) {
            let slot = TwinSlot {
                agent: r.agent.clone(),
                route: route.clone(),
                fingerprint: fingerprint.clone(),
            };
            let entry = self.store.twin_entry(&slot.index_key())?;
            if names(entry.map(|e| (e.invocation_id, e.expires_at_ms))) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// How many events are kept aside, and `sha256:` over their seqs and hashes in seq order
/// (empty when none).
pub(super) fn islands_digest(events: &mut [Event]) -> (u64, String) {
    if events.is_empty() {
        return (0, String::new());
    }
    events.sort_by_key(|e| e.seq);
    let mut text = String::new();
    for e in events.iter() {
        text.push_str(&format!("{} {}\n", e.seq, e.hash));
    }
    (
        events.len() as u64,
        super::event::sha256_tagged(text.as_bytes()),
    )
}

/// The daemon's own events: no record is projected from them.
fn is_note(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::ConfigReloaded
            | EventKind::JournalPruned
            | EventKind::AgentSuspended
            | EventKind::AgentResumed
    )
}

/// An event's `ts` as unix ms (`None` if it does not parse: such an event is kept).
fn event_ms(ts: &str) -> Option<i64> {
    let format = time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::parse(ts, &format).ok().map(unix_ms)
}
