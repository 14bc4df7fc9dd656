//! Group commit: one thread owns seq, the hash chain and every write.
//!
//! Requests queued while a sync runs form the next group; all of a group's
//! events go into one atomic write and share one fdatasync. A caller is acked
//! only after the write (and, for sync events, the sync) returned.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::event::{Body, Checkpoint, Draft, Event, EventKind, GENESIS_HASH, Sealed};
use super::failpoints::Failpoints;
use super::health::Health;
use super::keys::{KeyClaim, KeyEntry, KeyWrite};
use super::metrics::JournalMetrics;
use super::projection::{Refusal, State, apply_body, replay};
use super::request::StoredRequest;
use super::result::StoredResult;
use super::shared::SharedIndex;
use super::space::SpaceGuard;
use super::store::{EventStore, StoreError, WriteSet};
use super::suspensions::SuspensionWrite;
use super::twins::{TwinClaim, TwinEntry, TwinWrite};
use super::{Durability, JournalError};

/// Open invocations' current states, shared by the writer (which updates them after
/// each durable write) and readers.
pub type LiveStates = Arc<std::sync::Mutex<HashMap<String, Arc<State>>>>;

/// States of invocations that settled lately. A twin check or a reused key reads the same
/// settled record again and again, and the store replays its events for each read. Only the
/// writer changes a state, so only it fills and empties this.
#[derive(Clone, Default)]
pub struct SettledStates(Arc<std::sync::Mutex<Settled>>);

#[derive(Default)]
struct Settled {
    states: HashMap<String, Arc<State>>,
    /// Ids in the order they came, oldest first (one forgotten since may still be here).
    order: std::collections::VecDeque<String>,
}

/// How many settled states are kept.
const SETTLED_KEPT: usize = 1024;

impl SettledStates {
    pub fn get(&self, id: &str) -> Option<Arc<State>> {
        self.0.lock().ok()?.states.get(id).cloned()
    }

    fn keep(&self, state: &Arc<State>) {
        let Ok(mut s) = self.0.lock() else { return };
        let id = &state.record.invocation_id;
        if s.states.insert(id.clone(), state.clone()).is_none() {
            s.order.push_back(id.clone());
        }
        while s.order.len() > SETTLED_KEPT {
            if let Some(old) = s.order.pop_front() {
                s.states.remove(&old);
            }
        }
    }

    pub(super) fn forget<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        if let Ok(mut s) = self.0.lock() {
            for id in ids {
                s.states.remove(id);
            }
        }
    }
}

/// What one append produced.
#[derive(Debug, Clone)]
pub struct Appended {
    pub seqs: Vec<u64>,
    pub state: Arc<State>,
}

// Each request is moved once through the writer's channel: boxing the large variant buys nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Request {
    Append {
        invocation_id: String,
        drafts: Vec<Draft>,
        result: Option<StoredResult>,
        /// An idempotency key index entry written in the same batch.
        claim: Option<KeyClaim>,
        /// A twin index entry written in the same batch (SPEC §3.7).
        twin: Option<Box<TwinClaim>>,
        /// A fleet's store holds a claim of it (SPEC §7): the directory hears of it as soon
        /// as it opens, so another node can supersede a lapsed worker of it.
        shared: bool,
        reply: oneshot::Sender<Result<Appended, JournalError>>,
    },
    /// A twin's expiry moved on, if the slot still names it; rides the next sync.
    TouchTwin { claim: TwinClaim },
    /// Twin index expiry rows that came due: (expiry, index key).
    ExpireTwins {
        twins: Vec<(i64, Vec<u8>)>,
        reply: Swept,
    },
    /// A key index entry alone (a replay moves its expiry on).
    Touch {
        claim: KeyClaim,
        reply: oneshot::Sender<Result<(), JournalError>>,
    },
    Expire {
        results: Vec<(i64, String)>,
        keys: Vec<(i64, Vec<u8>)>,
        reply: Swept,
    },
    /// A request kept for `postern retry`; rides the next write (and its sync).
    Keep { request: Box<StoredRequest> },
    /// The daemon's own event (no invocation's state); acked with its seq once durable.
    Note {
        id: String,
        draft: Draft,
        reply: oneshot::Sender<Result<u64, JournalError>>,
    },
    Flush {
        reply: oneshot::Sender<Result<(), JournalError>>,
    },
    /// One retention cut of the events older than `before_ms` (unix ms), written alone.
    Prune {
        before_ms: i64,
        reply: oneshot::Sender<Result<Option<Checkpoint>, JournalError>>,
    },
}

/// Answers a sweep's batch once it is written (not synced: a removal lost in a crash is
/// only made again by the next sweep).
pub(super) type Swept = oneshot::Sender<Result<(), JournalError>>;

const MAX_GROUP: usize = 1024;

/// How the writer waits for its next request. While groups stay small (requests come one at
/// a time, as from one agent) it polls for a short while before it sleeps: waking a sleeping
/// thread costs more than that on a VM (measured at c=1, repo bench: p50 with fsync
/// 717-749 -> 585-696 µs, buffered 319-414 -> 235-238 µs). Busy, it never waits (its groups are large), so spinning cannot
/// take a core from the workers when they need it; idle, it spins once per group.
struct Pace {
    /// Average group size, in sixteenths (an exponential average over ~8 groups).
    average: u32,
}

const SPIN_FOR: Duration = Duration::from_micros(200);
/// Spin while groups average fewer than 1.5 requests.
const SPIN_BELOW: u32 = 24;

impl Default for Pace {
    fn default() -> Self {
        Self { average: 16 }
    }
}

impl Pace {
    fn saw(&mut self, group: usize) {
        let size = u32::try_from(group.min(64)).unwrap_or(64) * 16;
        self.average = (self.average * 7 + size) / 8;
    }

    /// Requests come about one at a time.
    fn small(&self) -> bool {
        self.average < SPIN_BELOW
    }

    fn next(&self, rx: &mut mpsc::Receiver<Request>) -> Option<Request> {
        if self.small() {
            let start = Instant::now();
            while start.elapsed() < SPIN_FOR {
                match rx.try_recv() {
                    Ok(r) => return Some(r),
                    Err(mpsc::error::TryRecvError::Empty) => std::hint::spin_loop(),
                    Err(mpsc::error::TryRecvError::Disconnected) => return None,
                }
            }
        }
        rx.blocking_recv()
    }
}

const BUFFERED_SYNC_EVERY: Duration = Duration::from_secs(1);

pub(super) struct Writer {
    pub store: Arc<dyn EventStore>,
    pub durability: Durability,
    pub health: Arc<Health>,
    pub metrics: JournalMetrics,
    pub failpoints: Failpoints,
    pub clock: fn() -> time::OffsetDateTime,
    head_seq: u64,
    head_hash: String,
    live: LiveStates,
    pub settled: SettledStates,
    last_sync: Instant,
    /// Checked before each group: the timer alone lets a burst fill the disk between ticks.
    pub space: Option<SpaceGuard>,
    /// A fleet's directory, told of each settled state once it is durable (SPEC §7).
    pub shared: Option<Arc<dyn SharedIndex>>,
}

/// What a durable append tells a fleet's directory.
struct Publish {
    result: Option<StoredResult>,
    opened: bool,
}

struct Staged {
    events: Vec<Sealed>,
    state: Arc<State>,
    was_open: bool,
    /// The invocation was not closed before this request.
    was_live: bool,
    needs_sync: bool,
}

impl Writer {
    pub fn new(
        store: Arc<dyn EventStore>,
        durability: Durability,
        health: Arc<Health>,
        metrics: JournalMetrics,
        clock: fn() -> time::OffsetDateTime,
        live: LiveStates,
    ) -> Result<Self, StoreError> {
        let (head_seq, head_hash) = match store.head()? {
            Some(e) => (e.seq, e.hash),
            None => (0, GENESIS_HASH.to_owned()),
        };
        metrics.indexed(store.index_entries());
        Ok(Self {
            store,
            durability,
            health,
            metrics,
            failpoints: Failpoints::from_env(),
            clock,
            head_seq,
            head_hash,
            live,
            settled: SettledStates::default(),
            last_sync: Instant::now(),
            space: None,
            shared: None,
        })
    }

    /// Serves requests until every sender is gone.
    pub fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut pace = Pace::default();
        while let Some(first) = pace.next(&mut rx) {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(r) => group.push(r),
                    Err(_) => break,
                }
            }
            pace.saw(group.len());
            self.commit_with_cuts(group);
            // After the acks. Zeros only ahead of small groups: a large one's sync writes
            // whole blocks, and zeros ahead would double what it writes.
            if self.durability == Durability::Fsync && !self.health.is_fatal() {
                self.store.prefill(pace.small());
            }
        }
        let _ = self.sync_now();
    }

    /// A group, with any retention cut in it written on its own between the requests
    /// before and after it: a cut reads the store, which must hold what came before.
    fn commit_with_cuts(&mut self, group: Vec<Request>) {
        let mut pending = Vec::with_capacity(group.len());
        for request in group {
            match request {
                Request::Prune { before_ms, reply } => {
                    self.commit_group(std::mem::take(&mut pending));
                    let _ = reply.send(self.prune(before_ms));
                }
                other => pending.push(other),
            }
        }
        self.commit_group(pending);
    }

    fn commit_group(&mut self, group: Vec<Request>) {
        if group.is_empty() {
            return;
        }
        if let Some(guard) = &self.space {
            guard.check_low(&self.health);
        }
        let mut set = WriteSet::default();
        let mut overlay: HashMap<String, Arc<State>> = HashMap::new();
        let mut keys: HashMap<Vec<u8>, KeyEntry> = HashMap::new();
        let mut twins: HashMap<Vec<u8>, TwinEntry> = HashMap::new();
        let mut touches = Vec::new();
        let mut swept = Vec::new();
        let mut acks = Vec::new();
        // Answered after the group is written: a refused claim's caller reads the holder next.
        let mut refused = Vec::new();
        let mut flushes = Vec::new();
        let mut notes = Vec::new();
        let mut needs_sync = false;
        let start = (self.head_seq, self.head_hash.clone());
        for request in group {
            match request {
                Request::Append {
                    invocation_id,
                    drafts,
                    result,
                    claim,
                    twin,
                    shared,
                    reply,
                } => match self.stage_claimed(
                    &invocation_id,
                    drafts,
                    (result.as_ref(), claim, twin),
                    &overlay,
                    (&keys, &twins),
                ) {
                    Ok((staged, key, twin)) => {
                        if let Some(w) = key {
                            keys.insert(w.index_key.clone(), w.entry.clone());
                            set.keys.push(w);
                        }
                        if let Some(w) = twin {
                            twins.insert(w.index_key.clone(), w.entry.clone());
                            set.twins.push(w);
                        }
                        needs_sync |= staged.needs_sync;
                        let seqs: Vec<u64> = staged.events.iter().map(|e| e.event.seq).collect();
                        let closed = staged.state.progress.closed;
                        if closed && staged.was_open {
                            set.closed.push(invocation_id.clone());
                        } else if !closed && !staged.was_open {
                            set.opened.push(invocation_id.clone());
                        }
                        set.events.extend(staged.events);
                        // Live states are served from memory and replayed from events after a
                        // crash: the record is stored once, when it settles — and again when a
                        // retry lease reopens a settled one, so no reader (or recovery) takes
                        // the stale settled copy for the truth.
                        let reopened = !closed && !staged.was_live;
                        if closed || reopened {
                            set.states.push(staged.state.clone());
                        }
                        let published = self.shared.as_ref().and(result.clone());
                        if let Some(r) = result {
                            set.results.push(r);
                        }
                        overlay.insert(invocation_id, staged.state.clone());
                        let newly_closed = closed && staged.was_live;
                        // A fleet hears of an invocation when it opens (a lapsed worker can be
                        // superseded from there), when its result is stored, and when it settles.
                        let opened = shared && !closed && (!staged.was_open || reopened);
                        let publish = Publish {
                            result: published,
                            opened,
                        };
                        acks.push((reply, staged.state, seqs, newly_closed, publish));
                    }
                    Err(e) => refused.push((reply, e)),
                },
                Request::Touch { claim, reply } => match self.claim(&claim, &keys) {
                    Ok(w) => {
                        keys.insert(w.index_key.clone(), w.entry.clone());
                        set.keys.push(w);
                        touches.push(reply);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                },
                Request::TouchTwin { claim } => {
                    if let Ok(Some(w)) = self.twin_touch(&claim, &twins) {
                        twins.insert(w.index_key.clone(), w.entry.clone());
                        set.twins.push(w);
                    }
                }
                Request::ExpireTwins { twins, reply } => {
                    set.expired_twins.extend(twins);
                    swept.push(reply);
                }
                Request::Expire {
                    results,
                    keys,
                    reply,
                } => {
                    set.expired_results.extend(results);
                    set.expired_keys.extend(keys);
                    swept.push(reply);
                }
                Request::Keep { request } => {
                    if self.keeps(&request.invocation_id, &overlay) {
                        set.requests.push(*request);
                    }
                }
                Request::Note { id, draft, reply } => {
                    let switch = match &draft.body {
                        Body::AgentSuspended(s) => Some((s.clone(), true)),
                        Body::AgentResumed(s) => Some((s.clone(), false)),
                        _ => None,
                    };
                    let event = self.seal_note(&id, draft);
                    if let Some((switch, suspend)) = switch {
                        let write = SuspensionWrite::of(&event.event, &switch, suspend);
                        set.suspensions.push(write);
                    }
                    notes.push((reply, event.event.seq));
                    set.events.push(event);
                    needs_sync = true;
                }
                Request::Flush { reply } => {
                    needs_sync = true;
                    flushes.push(reply);
                }
                Request::Prune { reply, .. } => {
                    // `commit_with_cuts` takes cuts out of every group.
                    let _ = reply.send(Err(JournalError::Unavailable));
                }
            }
        }
        let outcome = self.persist(set, needs_sync);
        if outcome.is_err() {
            (self.head_seq, self.head_hash) = start;
        }
        for (reply, state, seqs, newly_closed, publish) in acks {
            let result = match &outcome {
                Ok(()) => {
                    self.settle(&state, newly_closed);
                    self.publish(&state, &seqs, publish);
                    Ok(Appended { seqs, state })
                }
                Err(e) => Err(e.clone()),
            };
            let _ = reply.send(result);
        }
        for reply in flushes.into_iter().chain(touches).chain(swept) {
            let _ = reply.send(outcome.clone());
        }
        for (reply, seq) in notes {
            let _ = reply.send(outcome.clone().map(|()| seq));
        }
        for (reply, e) in refused {
            let _ = reply.send(Err(e));
        }
    }

    /// The chain head, to rewind to when a write fails.
    pub(super) fn head(&self) -> (u64, String) {
        (self.head_seq, self.head_hash.clone())
    }

    pub(super) fn rewind(&mut self, (seq, hash): (u64, String)) {
        (self.head_seq, self.head_hash) = (seq, hash);
    }

    /// Whether an invocation has a live exchange (its events must stay replayable).
    pub(super) fn is_live(&self, id: &str) -> bool {
        self.live.lock().map_or(true, |l| l.contains_key(id))
    }

    /// Writes and syncs a set whatever the durability (a cut removes events: the
    /// checkpoint that stands for them must be durable with it).
    pub(super) fn persist_synced(&mut self, set: WriteSet) -> Result<(), JournalError> {
        self.persist(set, true)?;
        if self.durability == Durability::Buffered {
            self.sync_now().map_err(|e| self.storage_fault(e))?;
        }
        Ok(())
    }

    /// Chains one event of the daemon's own, outside any invocation's projection.
    pub(super) fn seal_note(&mut self, id: &str, draft: Draft) -> Sealed {
        let data_json = draft.body.data_json();
        let sealed = Event {
            seq: self.head_seq + 1,
            invocation_id: id.to_owned(),
            attempt: draft.attempt,
            generation: draft.generation.unwrap_or(1),
            ts: rfc3339((self.clock)()),
            kind: draft.body.kind(),
            source: draft.source,
            hop: draft.hop,
            data: serde_json::Value::Null,
            prev_hash: self.head_hash.clone(),
            hash: String::new(),
        }
        .sealed_over(data_json);
        self.head_seq = sealed.event.seq;
        self.head_hash = sealed.event.hash.clone();
        sealed
    }

    /// `stage`, after checking the index claims riding it; a refused claim writes nothing.
    #[allow(clippy::type_complexity)]
    fn stage_claimed(
        &mut self,
        id: &str,
        drafts: Vec<Draft>,
        (result, claim, twin): (
            Option<&StoredResult>,
            Option<KeyClaim>,
            Option<Box<TwinClaim>>,
        ),
        overlay: &HashMap<String, Arc<State>>,
        (keys, twins): (&HashMap<Vec<u8>, KeyEntry>, &HashMap<Vec<u8>, TwinEntry>),
    ) -> Result<(Staged, Option<KeyWrite>, Option<TwinWrite>), JournalError> {
        let names_other = |claimed: &str| claimed != id;
        if claim
            .as_ref()
            .is_some_and(|c| names_other(&c.entry.invocation_id))
            || twin
                .as_ref()
                .is_some_and(|t| names_other(&t.entry.invocation_id))
        {
            return Err(JournalError::Refused(Refusal::UnknownInvocation));
        }
        let key = match claim {
            Some(c) => Some(self.claim(&c, keys)?),
            None => None,
        };
        let twin = match twin {
            Some(t) => Some(self.twin_claim(&t, twins, overlay)?),
            None => None,
        };
        Ok((self.stage(id, drafts, result, overlay)?, key, twin))
    }

    /// The live twin entry under `index_key`, from this group or the store.
    fn live_twin(
        &self,
        index_key: &[u8],
        twins: &HashMap<Vec<u8>, TwinEntry>,
    ) -> Result<Option<TwinEntry>, JournalError> {
        match twins.get(index_key) {
            Some(e) => Ok(Some(e.clone())),
            None => self
                .store
                .twin_entry(index_key)
                .map_err(|e| self.storage_fault(e)),
        }
    }

    /// The compare-and-set of a twin claim: refused when the slot names, live, an
    /// invocation other than the one the lookup saw and the claiming one — unless that one
    /// is a first generation still served to its waiting caller (it took the slot since the
    /// lookup, so it just started): judged again, this request would be a parallel one
    /// anyway, and identical requests in parallel must not queue behind each other.
    fn twin_claim(
        &self,
        claim: &TwinClaim,
        twins: &HashMap<Vec<u8>, TwinEntry>,
        overlay: &HashMap<String, Arc<State>>,
    ) -> Result<TwinWrite, JournalError> {
        let index_key = claim.slot.index_key();
        let current = self.live_twin(&index_key, twins)?;
        let now = super::unix_ms((self.clock)());
        let awaited = |id: &str| {
            let state = overlay
                .get(id)
                .cloned()
                .or_else(|| self.live.lock().ok().and_then(|l| l.get(id).cloned()));
            state.is_some_and(|s| s.awaited())
        };
        if let Some(held) = current.as_ref().filter(|e| {
            e.expires_at_ms > now
                && Some(&e.invocation_id) != claim.saw.as_ref()
                && e.invocation_id != claim.entry.invocation_id
                && !awaited(&e.invocation_id)
        }) {
            return Err(JournalError::Refused(Refusal::TwinMoved(
                held.invocation_id.clone(),
            )));
        }
        Ok(TwinWrite {
            index_key,
            entry: claim.entry.clone(),
            replaces_expiry: current.map(|e| e.expires_at_ms),
        })
    }

    /// A twin's refresh: only while the slot still names that invocation.
    fn twin_touch(
        &self,
        claim: &TwinClaim,
        twins: &HashMap<Vec<u8>, TwinEntry>,
    ) -> Result<Option<TwinWrite>, JournalError> {
        let index_key = claim.slot.index_key();
        let current = self.live_twin(&index_key, twins)?;
        Ok(current
            .filter(|e| e.invocation_id == claim.entry.invocation_id)
            .map(|e| TwinWrite {
                index_key,
                entry: claim.entry.clone(),
                replaces_expiry: Some(e.expires_at_ms),
            }))
    }

    /// The index write for a claim, unless a live entry names another invocation.
    fn claim(
        &self,
        claim: &KeyClaim,
        keys: &HashMap<Vec<u8>, KeyEntry>,
    ) -> Result<KeyWrite, JournalError> {
        let index_key = claim.slot.index_key();
        let current = match keys.get(&index_key) {
            Some(e) => Some(e.clone()),
            None => self
                .store
                .key_entry(&index_key)
                .map_err(|e| self.storage_fault(e))?,
        };
        let now = super::unix_ms((self.clock)());
        if let Some(held) = current
            .as_ref()
            .filter(|e| e.expires_at_ms > now && e.invocation_id != claim.entry.invocation_id)
        {
            return Err(JournalError::Refused(Refusal::KeyHeld(
                held.invocation_id.clone(),
            )));
        }
        Ok(KeyWrite {
            index_key,
            entry: claim.entry.clone(),
            replaces_expiry: current.map(|e| e.expires_at_ms),
        })
    }

    /// Writes a group; syncs it if any event needs it; fires failpoints.
    fn persist(&mut self, mut set: WriteSet, needs_sync: bool) -> Result<(), JournalError> {
        set.sync_bodies = self.durability == Durability::Fsync;
        if set.is_empty() && !needs_sync {
            return Ok(());
        }
        if self.health.is_fatal() {
            return Err(JournalError::Unavailable);
        }
        let kinds: Vec<EventKind> = set.events.iter().map(|e| e.event.kind).collect();
        let count = set.events.len();
        if let Err(e) = self.store.write(set) {
            return Err(self.storage_fault(e));
        }
        self.metrics.indexed(self.store.index_entries());
        let due = self.durability == Durability::Buffered
            && self.last_sync.elapsed() >= BUFFERED_SYNC_EVERY;
        if (needs_sync && self.durability == Durability::Fsync) || due {
            self.sync_now().map_err(|e| self.storage_fault(e))?;
        }
        self.metrics.appended(count);
        for kind in kinds {
            self.failpoints.after_durable_write(kind);
        }
        Ok(())
    }

    fn sync_now(&mut self) -> Result<(), StoreError> {
        let started = Instant::now();
        self.store.sync()?;
        self.metrics.synced(started.elapsed());
        self.last_sync = Instant::now();
        Ok(())
    }

    /// A kept request is written unless the journal refuses new work and its invocation
    /// is not live yet (it is queued before the append that `admit_new` will refuse).
    fn keeps(&self, id: &str, overlay: &HashMap<String, Arc<State>>) -> bool {
        !self.health.refusing_dispatch()
            || overlay.contains_key(id)
            || self.live.lock().is_ok_and(|l| l.contains_key(id))
    }

    /// A new invocation while the journal refuses new work (low disk) writes nothing;
    /// those in flight still record their resolutions.
    fn admit_new(&self) -> Result<(), JournalError> {
        if self.health.refusing_dispatch() {
            self.metrics.unrecorded_refusals.inc();
            return Err(JournalError::Unavailable);
        }
        Ok(())
    }

    /// A failed write or sync: fjall is poisoned, postern must restart.
    pub(super) fn storage_fault(&self, e: StoreError) -> JournalError {
        tracing::error!(error = %e, "journal storage fault; postern stops accepting work");
        self.health.set_fatal(e.to_string());
        JournalError::Unavailable
    }

    /// Tells the fleet's directory of a durable state that settled or stored a result
    /// (another node answers for it from there).
    fn publish(&self, state: &Arc<State>, seqs: &[u64], publish: Publish) {
        let Some(shared) = &self.shared else { return };
        // A result is copied where repeating the request is not safe (what a replay or a
        // fetch_result elsewhere stands in for); an idempotent one is simply asked again.
        let copied = !state.progress.idempotent || state.record.evidence.idempotency.is_some();
        let result = publish.result.filter(|_| copied);
        if !(state.progress.closed || publish.opened || result.is_some()) {
            return;
        }
        let version = seqs.iter().copied().max().unwrap_or(self.head_seq);
        shared.publish(state.clone(), result, version);
    }

    fn settle(&mut self, state: &Arc<State>, newly_closed: bool) {
        let id = &state.record.invocation_id;
        if newly_closed {
            self.metrics.settled(&state.record);
            super::access::settled(&state.record);
        }
        // Kept settled before it leaves the live map: a reader finds it in one or the other.
        match state.progress.closed {
            true => self.settled.keep(state),
            false => self.settled.forget([id.as_str()]),
        }
        if let Ok(mut live) = self.live.lock() {
            if state.progress.closed {
                live.remove(id);
            } else {
                live.insert(id.clone(), state.clone());
            }
        }
    }

    fn current(
        &self,
        id: &str,
        overlay: &HashMap<String, Arc<State>>,
        fresh: bool,
    ) -> Result<Option<(Arc<State>, bool)>, JournalError> {
        if let Some(s) = overlay.get(id) {
            return Ok(Some((s.clone(), !s.progress.closed)));
        }
        if let Some(s) = self.live.lock().ok().and_then(|l| l.get(id).cloned()) {
            return Ok(Some((s, true)));
        }
        if fresh {
            return Ok(None);
        }
        let stored = self.store.state(id).map_err(|e| self.storage_fault(e))?;
        if let Some(stored) = stored.filter(|s| s.progress.closed) {
            return Ok(Some((Arc::new(stored), false)));
        }
        // Not settled (or never seen): the events say what is true.
        let events = self
            .store
            .events_of(id)
            .map_err(|e| self.storage_fault(e))?;
        Ok(replay(&events).map(|s| (Arc::new(s), true)))
    }

    /// Chains and projects a request's drafts; refuses the whole request on any refusal.
    fn stage(
        &mut self,
        id: &str,
        drafts: Vec<Draft>,
        result: Option<&StoredResult>,
        overlay: &HashMap<String, Arc<State>>,
    ) -> Result<Staged, JournalError> {
        // The projection counts RESULT_COMMITTED as a stored result (recovery and
        // `fetch_result` rely on it): the two go into one atomic write or neither does.
        let commits = drafts
            .iter()
            .any(|d| matches!(d.body, super::event::Body::ResultCommitted(_)));
        if commits != result.is_some() || result.is_some_and(|r| r.invocation_id != id) {
            return Err(JournalError::Refused(Refusal::ResultWithoutCommit));
        }
        // `ACTION_ACCEPTED` opens an invocation whose id was just minted (a ULID): the store
        // holds nothing under it, and reading that costs two lookups per request.
        let fresh = matches!(
            drafts.first().map(|d| &d.body),
            Some(super::event::Body::ActionAccepted(_))
        );
        let (mut state, was_open, was_live) = match self.current(id, overlay, fresh)? {
            Some((s, open)) => (Some(s), open, open),
            None => {
                self.admit_new()?;
                (None, false, true)
            }
        };
        let mut seq = self.head_seq;
        let mut prev = self.head_hash.clone();
        let mut events = Vec::with_capacity(drafts.len());
        let mut needs_sync = false;
        let ts = rfc3339((self.clock)());
        for draft in drafts {
            seq += 1;
            let (kind, data_json) = (draft.body.kind(), draft.body.data_json());
            // A draft names the generation its writer holds; the projection refuses a stale one.
            let generation = match (&draft.body, draft.generation, &state) {
                (super::event::Body::RetryLeased(l), _, _) => l.generation,
                (_, Some(g), _) => g,
                (_, None, Some(s)) => s.record.generation,
                (_, None, None) => 1,
            };
            let sealed = Event {
                seq,
                invocation_id: id.to_owned(),
                attempt: draft.attempt,
                generation,
                ts: ts.clone(),
                kind,
                source: draft.source,
                hop: draft.hop,
                data: serde_json::Value::Null,
                prev_hash: prev,
                hash: String::new(),
            }
            .sealed_over(data_json);
            let dispatched_before = state.as_ref().is_some_and(|s| s.progress.dispatched_ever);
            let next = apply_body(
                state.take().map(Arc::unwrap_or_clone),
                &sealed.event,
                draft.body,
            )
            .map_err(JournalError::Refused)?;
            needs_sync |= needs_sync_rule(kind, dispatched_before);
            prev = sealed.event.hash.clone();
            events.push(sealed);
            state = Some(Arc::new(next));
        }
        let state = state.ok_or(JournalError::Refused(Refusal::UnknownInvocation))?;
        self.head_seq = seq;
        self.head_hash = prev;
        Ok(Staged {
            events,
            state,
            was_open,
            was_live,
            needs_sync,
        })
    }
}

/// SPEC §2: which writes wait for a sync. Everything else rides the next one.
pub fn needs_sync_rule(kind: EventKind, dispatched: bool) -> bool {
    match kind {
        EventKind::DispatchStarted
        | EventKind::ResultCommitted
        | EventKind::RetryLeased
        | EventKind::Reconciled
        | EventKind::ApprovalGranted
        | EventKind::ApprovalDenied => true,
        EventKind::Failed => dispatched,
        _ => false,
    }
}

/// RFC 3339 UTC with milliseconds.
pub fn rfc3339(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    t.format(&format).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_spins_only_while_its_groups_stay_small() {
        let mut pace = Pace::default();
        assert!(
            pace.average < SPIN_BELOW,
            "one agent at a time from the start"
        );
        for _ in 0..8 {
            pace.saw(6);
        }
        assert!(pace.average >= SPIN_BELOW, "busy: {}", pace.average);
        pace.saw(1);
        assert!(
            pace.average >= SPIN_BELOW,
            "one small group is not a quiet spell"
        );
        for _ in 0..16 {
            pace.saw(1);
        }
        assert!(pace.average < SPIN_BELOW, "quiet again: {}", pace.average);
        pace.saw(usize::MAX);
        assert!(pace.average <= 64 * 16);
    }

    #[test]
    fn a_spinning_writer_still_takes_a_request_and_sees_the_channel_close() {
        let (tx, mut rx) = mpsc::channel(4);
        let pace = Pace::default();
        let (reply, _rx) = oneshot::channel();
        let sent = tx.try_send(Request::Flush { reply });
        assert!(sent.is_ok());
        assert!(matches!(pace.next(&mut rx), Some(Request::Flush { .. })));
        drop(tx);
        assert!(pace.next(&mut rx).is_none());
    }
}
