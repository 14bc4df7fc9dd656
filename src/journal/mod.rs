//! The durable, hash-chained action journal.
//!
//! Lifecycle of an invocation: `ACTION_ACCEPTED` → `PREFLIGHT_VALIDATED` →
//! (`CREDENTIAL_AUTHORIZED`, `APPROVAL_*`, `CONNECT_ATTEMPT`…) → `DISPATCH_STARTED`
//! (durable before the first request byte) → `REQUEST_SENT` →
//! `REMOTE_RESPONSE_STARTED` → `REMOTE_RESPONSE_COMPLETE` → `RESULT_COMMITTED`
//! (with its result, durable) → `RESULT_DELIVERED`; or `FAILED` at any point.
//! Transports append observations; `projection` folds them into the record.

mod access;
mod audit;
mod bodies;
mod encoding;
mod event;
mod export;
pub use export::{ExportPage, Exported, page as export_page};
mod failpoints;
pub use failpoints::{lease_ttl_override, pause_after_lease, pause_before_send};
mod fjall_store;
mod health;
mod indexes;
pub use indexes::{Listed, Whereabouts};
mod keys;
mod metrics;
mod prefill;
mod projection;
mod request;
mod result;
mod retention;
mod shared;
pub use shared::{
    Directory, Leased, Lost, MintShared, Shared, SharedError, SharedIndex, SharedLease,
};
mod space;
mod store;
mod suspensions;
pub use suspensions::{Suspension, SuspensionWrite};
mod sweep;
mod twins;
mod writer;

use std::path::Path;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

pub use audit::{AuditReport, ChainBreak, verify};
pub use encoding::{DecodeError, decode as decode_event, decode_stored, unpack as unpack_record};
pub use event::{
    Accepted, Adoption, AgentSwitch, ApprovalAnswer, ApprovalRequest, Body, Checkpoint,
    ConfigReload, ConnectAttempt, Delivered, Dispatch, Draft, Event, EventKind, Failure,
    GENESIS_HASH, Lease, Preflight, Protocol, Reconciliation, RequestSent, ResponseComplete,
    ResponseStarted, ResultCommitted, Source, SupersedeReason, Supersession, TlsIdentity,
    sha256_tagged, sha256_tagged_digest,
};
pub use event::{ResendEvidence, TwinRef};
pub use fjall_store::FjallStore;
pub use health::Health;
pub use keys::{KeyClaim, KeyEntry, KeySlot, KeyWrite};
pub use metrics::JournalMetrics;
pub use projection::{
    BODY_STORED, Progress, Record, Refusal, ResultSummary, State, apply, apply_body, replay,
};
pub use request::StoredRequest;
pub use result::{HttpResult, Payload, SshResult, StoredResult, TunnelResult, as_text, b64, unb64};
pub use space::SpaceGuard;
pub use store::{Cut, EventStore, IndexEntries, RawEvent, StoreError, WriteSet};
pub use twins::{TwinClaim, TwinEntry, TwinSlot, TwinWrite};
pub use writer::{Appended, LiveStates, SettledStates, needs_sync_rule, rfc3339};

use crate::contract::{Code, RecoveryFacts, recovery_code};
use writer::{Request, Writer};

/// `journal.durability` (SPEC §5.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fdatasync before acking sync events (default).
    Fsync,
    /// Reach the OS only; loses the last writes on power loss.
    Buffered,
}

/// A journal failure as callers see it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// The journal cannot record: answer `JOURNAL_UNAVAILABLE`.
    #[error("the journal is unavailable")]
    Unavailable,
    /// The projection refused the events: a transport bug, nothing was written.
    #[error("the journal refused the events: {0}")]
    Refused(Refusal),
    /// A claim needed the fleet's shared store and it did not answer (SPEC §7): nothing
    /// was written, nothing may be sent.
    #[error("the cluster store is unavailable")]
    SharedUnavailable,
}

impl From<StoreError> for JournalError {
    fn from(_: StoreError) -> Self {
        JournalError::Unavailable
    }
}

/// What recovery did at open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub recovered: Vec<(String, Code)>,
}

/// Options for opening a journal.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    pub durability: Durability,
    pub result_retention_ms: i64,
    /// How long events (and the settled records they make) are kept.
    pub event_retention_ms: i64,
    pub clock: fn() -> time::OffsetDateTime,
    /// The free-space guard, watched on its timer and before every group commit.
    pub space: Option<SpaceGuard>,
    /// What a fleet shares (SPEC §7); none on a node alone.
    pub shared: Option<SharedHandle>,
}

/// A fleet's shared index, as the options carry it.
#[derive(Clone)]
pub struct SharedHandle(pub Arc<dyn SharedIndex>);

impl std::fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedHandle(node {})", self.0.node())
    }
}

impl Default for JournalOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Fsync,
            result_retention_ms: 7 * 24 * 3600 * 1000,
            event_retention_ms: 30 * 24 * 3600 * 1000,
            clock: time::OffsetDateTime::now_utc,
            space: None,
            shared: None,
        }
    }
}

/// The handle every part of postern appends through. Cheap to clone.
#[derive(Clone)]
pub struct Journal {
    tx: mpsc::Sender<Request>,
    live: LiveStates,
    settled: SettledStates,
    store: Arc<dyn EventStore>,
    health: Arc<Health>,
    metrics: JournalMetrics,
    options: JournalOptions,
}

/// Index entries written in the same batch as an append (nothing is written if one is
/// refused).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// An idempotency key (refused with `Refusal::KeyHeld`).
    pub key: Option<KeyClaim>,
    /// A resend twin (refused with `Refusal::TwinMoved`).
    pub twin: Option<TwinClaim>,
    /// The key was claimed in the fleet's index already, for this invocation
    /// (`Journal::reserve_key`): it is not claimed again.
    pub reserved: bool,
}

/// A test's journal over `dir`: a journal dropped just before may leave fjall's threads
/// holding the lock for a moment, so a locked journal is tried again for up to 10 s.
#[cfg(test)]
pub(crate) fn open_for_test(dir: &Path, options: JournalOptions) -> (Journal, RecoveryReport) {
    let mut tries = 0;
    loop {
        match Journal::open(dir, options.clone()) {
            Ok(opened) => return opened,
            Err(StoreError::Locked) if tries < 200 => tries += 1,
            Err(e) => panic!("journal: {e}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A fresh invocation id: `act_<ULID>`.
pub fn new_invocation_id() -> String {
    format!("act_{}", ulid::Ulid::generate())
}

impl Journal {
    /// Opens the fjall journal under `dir`, runs recovery, starts the writer.
    pub fn open(dir: &Path, options: JournalOptions) -> Result<(Self, RecoveryReport), StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Io(e.to_string()))?;
        let store: Arc<dyn EventStore> = Arc::new(FjallStore::open(dir)?);
        Self::with_store(store, options)
    }

    /// Starts a journal over any store.
    pub fn with_store(
        store: Arc<dyn EventStore>,
        options: JournalOptions,
    ) -> Result<(Self, RecoveryReport), StoreError> {
        let health = Arc::new(Health::default());
        let metrics = JournalMetrics::default();
        let live = LiveStates::default();
        let mut writer = Writer::new(
            store.clone(),
            options.durability,
            health.clone(),
            metrics.clone(),
            options.clock,
            live.clone(),
        )?;
        writer.shared = options.shared.as_ref().map(|h| h.0.clone());
        let settled = writer.settled.clone();
        if let Some(guard) = &options.space {
            guard.clone().spawn(health.clone());
            writer.space = Some(guard.clone());
        }
        let (tx, rx) = mpsc::channel(8192);
        std::thread::Builder::new()
            .name("postern-journal".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let journal = Self {
            tx,
            live,
            settled,
            store,
            health,
            metrics,
            options,
        };
        let report = journal.recover()?;
        Ok((journal, report))
    }

    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    pub fn metrics(&self) -> &JournalMetrics {
        &self.metrics
    }

    pub fn now(&self) -> time::OffsetDateTime {
        (self.options.clock)()
    }

    /// Unix ms after which a result committed now is removed.
    pub fn result_expiry_ms(&self) -> i64 {
        unix_ms(self.now()) + self.options.result_retention_ms
    }

    /// Appends drafts for one invocation atomically; acked once durable per the sync rule.
    pub async fn append(
        &self,
        invocation_id: &str,
        drafts: Vec<Draft>,
    ) -> Result<Appended, JournalError> {
        self.submit(invocation_id, drafts, None, Claims::default())
            .await
    }

    /// `append`, writing an idempotency key's index entry in the same batch; refused
    /// (`Refusal::KeyHeld`, nothing written) while another invocation holds the key.
    pub async fn append_claiming(
        &self,
        invocation_id: &str,
        drafts: Vec<Draft>,
        claim: KeyClaim,
    ) -> Result<Appended, JournalError> {
        let claims = Claims {
            key: Some(claim),
            ..Claims::default()
        };
        self.submit(invocation_id, drafts, None, claims).await
    }

    /// `append`, writing index entries in the same batch; refused, with nothing written,
    /// when a claim is (`Refusal::KeyHeld`, `Refusal::TwinMoved`).
    pub async fn append_with(
        &self,
        invocation_id: &str,
        drafts: Vec<Draft>,
        claims: Claims,
    ) -> Result<Appended, JournalError> {
        self.submit(invocation_id, drafts, None, claims).await
    }

    /// Queues drafts that need no ack on the hot path; order with later appends is kept
    /// (one writer, one queue), and a refusal or fault shows in the next acked append.
    pub async fn enqueue(&self, invocation_id: &str, drafts: Vec<Draft>) {
        let (reply, _ignored) = oneshot::channel();
        let request = Request::Append {
            invocation_id: invocation_id.to_owned(),
            drafts,
            result: None,
            claim: None,
            twin: None,
            shared: false,
            reply,
        };
        let _ = self.tx.send(request).await;
    }

    /// Appends the resolving event together with the retrievable result.
    pub async fn commit_result(
        &self,
        invocation_id: &str,
        drafts: Vec<Draft>,
        result: StoredResult,
    ) -> Result<Appended, JournalError> {
        self.submit(invocation_id, drafts, Some(result), Claims::default())
            .await
    }

    async fn submit(
        &self,
        invocation_id: &str,
        drafts: Vec<Draft>,
        result: Option<StoredResult>,
        claims: Claims,
    ) -> Result<Appended, JournalError> {
        let claimed = claims.key.is_some() || claims.twin.is_some();
        let Some(shared) = self.shared().filter(|_| claimed) else {
            return self
                .write(invocation_id, drafts, result, claims, false)
                .await;
        };
        // The fleet's index decides; this node's own is not written beside it.
        let now = unix_ms(self.now());
        let won = match claims.reserved && claims.twin.is_none() {
            true => Ok(Ok(())),
            false => {
                shared
                    .claim(
                        invocation_id,
                        claims.key.as_ref(),
                        claims.twin.as_ref(),
                        now,
                    )
                    .await
            }
        };
        match won {
            Ok(Ok(())) => {}
            Ok(Err(Lost::Key(holder))) => {
                return Err(JournalError::Refused(Refusal::KeyHeld(holder)));
            }
            Ok(Err(Lost::Twin(holder))) => {
                return Err(JournalError::Refused(Refusal::TwinMoved(holder)));
            }
            Err(SharedError::Unavailable) => return Err(JournalError::SharedUnavailable),
        }
        let written = self
            .write(invocation_id, drafts, result, Claims::default(), true)
            .await;
        if written.is_err() {
            // Nothing of it is in this journal: the claim must not stand for it.
            let _ = shared.release(invocation_id).await;
        }
        written
    }

    /// In a fleet, claims an agent's key for `invocation_id` before its preflight is built:
    /// the claim is the lookup (one round trip), and the preflight then records it
    /// without claiming again (`Claims::reserved`). `Ok(Err(holder))`: another invocation
    /// holds the key (judge it: `find_key`). Alone: `Ok(Err(""))` (look it up instead).
    pub async fn reserve_key(
        &self,
        invocation_id: &str,
        claim: &KeyClaim,
    ) -> Result<Result<(), String>, JournalError> {
        let Some(shared) = self.shared() else {
            return Ok(Err(String::new()));
        };
        let now = unix_ms(self.now());
        match shared.claim(invocation_id, Some(claim), None, now).await {
            Ok(Ok(())) => Ok(Ok(())),
            Ok(Err(Lost::Key(holder) | Lost::Twin(holder))) => Ok(Err(holder)),
            Err(SharedError::Unavailable) => Err(JournalError::SharedUnavailable),
        }
    }

    /// The fleet's shared index, if this node is one of several.
    pub fn shared(&self) -> Option<&Arc<dyn SharedIndex>> {
        self.options.shared.as_ref().map(|h| &h.0)
    }

    async fn write(
        &self,
        invocation_id: &str,
        drafts: Vec<Draft>,
        result: Option<StoredResult>,
        claims: Claims,
        shared: bool,
    ) -> Result<Appended, JournalError> {
        let (reply, rx) = oneshot::channel();
        let request = Request::Append {
            invocation_id: invocation_id.to_owned(),
            drafts,
            result,
            claim: claims.key,
            twin: claims.twin.map(Box::new),
            shared,
            reply,
        };
        self.tx
            .send(request)
            .await
            .map_err(|_| JournalError::Unavailable)?;
        rx.await.map_err(|_| JournalError::Unavailable)?
    }

    /// The blocking form of `append`, for code outside the runtime.
    pub fn append_blocking(
        &self,
        invocation_id: &str,
        drafts: Vec<Draft>,
    ) -> Result<Appended, JournalError> {
        let (reply, rx) = oneshot::channel();
        let request = Request::Append {
            invocation_id: invocation_id.to_owned(),
            drafts,
            result: None,
            claim: None,
            twin: None,
            shared: false,
            reply,
        };
        self.tx
            .blocking_send(request)
            .map_err(|_| JournalError::Unavailable)?;
        rx.blocking_recv().map_err(|_| JournalError::Unavailable)?
    }

    /// Appends an event of the daemon's own (a config reload), belonging to no invocation's
    /// record; `id` names it in the chain. Acked with its seq once durable.
    pub async fn note(&self, id: &str, draft: Draft) -> Result<u64, JournalError> {
        let (reply, rx) = oneshot::channel();
        let request = Request::Note {
            id: id.to_owned(),
            draft,
            reply,
        };
        self.tx
            .send(request)
            .await
            .map_err(|_| JournalError::Unavailable)?;
        rx.await.map_err(|_| JournalError::Unavailable)?
    }

    /// Makes everything appended so far durable.
    pub async fn flush(&self) -> Result<(), JournalError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Flush { reply })
            .await
            .map_err(|_| JournalError::Unavailable)?;
        rx.await.map_err(|_| JournalError::Unavailable)?
    }

    /// Refuses new dispatches while the journal is degraded. A refusal here is answered
    /// without a record (on a full disk, recording it could be the write that fails) and
    /// counted instead.
    pub fn admit(&self) -> Result<(), Code> {
        match self.records_refusals() {
            true => Ok(()),
            false => Err(Code::JournalUnavailable),
        }
    }

    /// Whether a refusal may be journaled now: not while the journal refuses new work,
    /// when it is counted in `postern_journal_refusals_unrecorded` instead.
    pub fn records_refusals(&self) -> bool {
        if self.health.refusing_dispatch() {
            self.metrics.unrecorded_refusals.inc();
            return false;
        }
        true
    }

    pub fn record(&self, invocation_id: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.state(invocation_id)?.map(|s| s.record))
    }

    /// The current state: live ones from memory, settled ones from the store, and an
    /// unsettled one (after a crash) replayed from its events.
    pub fn state(&self, invocation_id: &str) -> Result<Option<State>, StoreError> {
        if let Some(s) = self
            .live
            .lock()
            .ok()
            .and_then(|l| l.get(invocation_id).cloned())
        {
            return Ok(Some(State::clone(&s)));
        }
        if let Some(s) = self.settled.get(invocation_id) {
            return Ok(Some(State::clone(&s)));
        }
        match self.store.state(invocation_id)? {
            Some(s) if s.progress.closed => Ok(Some(s)),
            _ => Ok(replay(&self.store.events_of(invocation_id)?)),
        }
    }

    pub fn events(&self, invocation_id: &str) -> Result<Vec<Event>, StoreError> {
        self.store.events_of(invocation_id)
    }

    /// Records newest first, strictly older than `before`.
    pub fn records_before(
        &self,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        // Live invocations are only in memory; settled ones only in the store.
        let mut live: Vec<Record> = match self.live.lock() {
            Ok(l) => l
                .values()
                .filter(|s| before.is_none_or(|b| s.record.invocation_id.as_str() < b))
                .map(|s| s.record.clone())
                .collect(),
            Err(_) => Vec::new(),
        };
        let mut out = Vec::new();
        for s in self.store.states_before(before, limit)? {
            let id = &s.record.invocation_id;
            if live.iter().any(|l| &l.invocation_id == id) {
                continue;
            }
            // An open record stored by an older postern is stale: replay its events.
            let current = match s.progress.closed {
                false => replay(&self.store.events_of(id)?).map_or(s.record, |r| r.record),
                true => s.record,
            };
            out.push(current);
        }
        out.append(&mut live);
        out.sort_by(|a, b| b.invocation_id.cmp(&a.invocation_id));
        out.truncate(limit);
        Ok(out)
    }

    /// The stored result, until its retention ends (the sweep removes it later).
    pub fn result(&self, invocation_id: &str) -> Result<Option<StoredResult>, StoreError> {
        let now = unix_ms(self.now());
        let result = self.store.result(invocation_id)?;
        Ok(result.filter(|r| r.expires_at_ms > now))
    }

    /// The request an invocation bound at preflight, if it was kept and its retention has
    /// not ended.
    pub fn request(&self, invocation_id: &str) -> Result<Option<StoredRequest>, StoreError> {
        let now = unix_ms(self.now());
        let request = self.store.request(invocation_id)?;
        Ok(request.filter(|r| r.expires_at_ms > now))
    }

    /// The kept request whether or not its retention has ended (until the sweep removes
    /// it), to say why it cannot be sent again.
    pub fn request_as_kept(
        &self,
        invocation_id: &str,
    ) -> Result<Option<StoredRequest>, StoreError> {
        self.store.request(invocation_id)
    }

    /// Keeps a request for `postern retry`. No ack: it is queued before the invocation's
    /// next append, so it is durable once that append's sync is (`DISPATCH_STARTED` syncs).
    pub async fn keep_request(&self, request: StoredRequest) {
        let keep = Request::Keep {
            request: Box::new(request),
        };
        let _ = self.tx.send(keep).await;
    }

    /// The chain head: the newest event's seq and hash.
    pub fn head(&self) -> Result<Option<(u64, String)>, StoreError> {
        Ok(self.store.head()?.map(|e| (e.seq, e.hash)))
    }

    /// The first seq still in the chain (events before it were pruned behind a checkpoint).
    pub fn oldest_seq(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.store.checkpoint()?.map(|c| c.seq + 1))
    }

    /// The stored hash of the event at `seq`, if it is still there.
    pub fn hash_at(&self, seq: u64) -> Result<Option<String>, StoreError> {
        Ok(self
            .store
            .raw_events(seq, 1)?
            .into_iter()
            .filter_map(|r| r.event.ok())
            .find(|e| e.seq == seq)
            .map(|e| e.hash))
    }

    pub fn verify(&self) -> Result<AuditReport, StoreError> {
        verify(self.store.as_ref())
    }

    /// Events from `since` for the audit export (SPEC §5.8), at most `limit`.
    pub fn export(&self, since: u64, limit: usize) -> Result<ExportPage, StoreError> {
        export::page(self.store.as_ref(), since, limit)
    }

    /// Whether a result can be fetched. A damaged one (a body file changed on disk) cannot,
    /// and must not keep postern from starting.
    fn retrievable(&self, id: &str) -> Result<bool, StoreError> {
        match self.result(id) {
            Ok(result) => Ok(result.is_some()),
            Err(e @ StoreError::Corrupt { .. }) => {
                tracing::error!(invocation = %id, error = %e, "a stored result is damaged; recovered as not retrievable");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// SPEC §2 recovery: every exchange that was live when postern stopped is settled.
    fn recover(&self) -> Result<RecoveryReport, StoreError> {
        let mut report = RecoveryReport::default();
        for id in self.store.open_invocations()? {
            // The stored record of a live invocation may be stale: replay its events.
            let Some(state) = replay(&self.store.events_of(&id)?) else {
                continue;
            };
            let result_committed = state.progress.result_stored;
            let facts = RecoveryFacts {
                dispatched: state.progress.dispatched_this_generation,
                result_committed,
                // Checked in the store itself: its retention may have run out meanwhile.
                result_retrievable: result_committed && self.retrievable(&id)?,
            };
            let code = recovery_code(facts);
            let draft = Draft::observed(Body::Failed(Failure::of(code))).source(Source::Recovery);
            match self.append_blocking(&id, vec![draft]) {
                Ok(_) => report.recovered.push((id, code)),
                Err(e) => {
                    tracing::error!(invocation = %id, error = %e, "recovery could not settle an invocation")
                }
            }
        }
        Ok(report)
    }
}

/// Unix milliseconds of a time.
pub fn unix_ms(t: time::OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

#[cfg(test)]
mod tests;
