//! One invocation's lifecycle, whatever the transport (HTTP exchange, SSH `exec`):
//!
//! `ACTION_ACCEPTED` → `PREFLIGHT_VALIDATED` (+ `CREDENTIAL_AUTHORIZED`) → approval hold →
//! `CONNECT_ATTEMPT`s → `DISPATCH_STARTED` (durable: the dispatch boundary) → remote
//! evidence → `RESULT_COMMITTED` with the result → `RESULT_DELIVERED`, or `FAILED`
//! (`CALLER_CANCELLED`, `RESULT_DELIVERY_FAILED`, …) at any step.
//!
//! Transports drive it with what they observed; it records the events and hands back the
//! envelope the journal's projection computed (`contract` decides, the transport renders).
//! Invariant: nothing is sent after `dispatch_boundary` fails, and once it succeeded the
//! invocation is never again `not_attempted`.
//!
//! Generations (`lease`): a retry of an unresolved invocation is a new generation of the
//! same invocation (`RETRY_LEASED`), and every draft carries the generation its worker
//! holds, so a worker whose generation was superseded is refused at the dispatch boundary.
//! `idempotency` decides what a request with a known idempotency key gets; `twin` what an
//! identical resend gets (SPEC §3.7).

mod approval;
pub mod idempotency;
pub mod lease;
pub mod rate_limit;
pub mod refusals;
pub mod resources;
pub mod retry;
pub mod suspended;
pub mod twin;

pub use lease::LeaseTerms;

use crate::contract::{Code, Envelope, UpgradeEvidence};
use crate::journal::{
    Accepted, Appended, Body, Claims, ConnectAttempt, Delivered, Dispatch, Draft, Failure, Journal,
    JournalError, KeyClaim, Refusal, StoredResult, new_invocation_id,
};

/// Why the dispatch boundary was not crossed (nothing may be sent).
#[derive(Debug)]
pub enum Boundary {
    /// Answer this envelope.
    Answer(Box<Envelope>),
    /// The resend twin slot names this invocation now: judge the resend again against it.
    TwinMoved(String),
}

/// An invocation on its way through the lifecycle.
pub struct Invocation {
    journal: Journal,
    id: String,
    /// Drafts not yet appended: they travel with the next append.
    pending: Vec<Draft>,
    dispatched: bool,
    /// An earlier generation crossed the dispatch boundary.
    dispatched_before: bool,
    /// The last connection-setup attempt recorded (numbers those of a later connection).
    last_attempt: u32,
    /// The generation this worker holds; every draft it appends names it.
    generation: u32,
    /// Made by `lease` (a new generation), not by `accept`.
    leased: bool,
    /// Some append of this invocation is in the journal: an envelope may name its id.
    journaled: bool,
    /// It holds an idempotency key: in a fleet, another node may lease it, so its
    /// generation is confirmed in the shared store at the dispatch boundary.
    keyed: bool,
}

impl Invocation {
    /// A new invocation; `ACTION_ACCEPTED` rides the first append.
    pub fn accept(journal: Journal, accepted: Accepted) -> Self {
        Self {
            journal,
            id: new_invocation_id(),
            pending: vec![Draft::observed(Body::ActionAccepted(accepted))],
            dispatched: false,
            dispatched_before: false,
            last_attempt: 0,
            generation: 1,
            leased: false,
            journaled: false,
            keyed: false,
        }
    }

    /// The generation this worker holds.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// A new generation of an existing invocation (`lease`), not a fresh one.
    pub fn leased(&self) -> bool {
        self.leased
    }

    /// Some generation before this one crossed the dispatch boundary.
    pub fn dispatched_before(&self) -> bool {
        self.dispatched_before
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// `DISPATCH_STARTED` is durable for this invocation.
    pub fn dispatched(&self) -> bool {
        self.dispatched
    }

    /// Nothing of this invocation is in the journal yet (`ACTION_ACCEPTED` still pending).
    pub fn unrecorded(&self) -> bool {
        matches!(
            self.pending.first().map(|d| &d.body),
            Some(Body::ActionAccepted(_))
        )
    }

    /// Caps the target the pending `ACTION_ACCEPTED` will store (refusals before any
    /// route keep a bounded record); true if it was cut.
    pub fn cap_target(&mut self) -> bool {
        match self.pending.first_mut().map(|d| &mut d.body) {
            Some(Body::ActionAccepted(a)) => {
                let (capped, cut) = refusals::capped_target(&a.target);
                a.target = capped;
                cut
            }
            _ => false,
        }
    }

    /// Holds drafts back so they ride the next append (one write instead of two).
    pub fn defer(&mut self, mut drafts: Vec<Draft>) {
        self.pending.append(&mut drafts);
    }

    /// The deferred drafts and these, each naming this worker's generation.
    fn take_drafts(&mut self, mut drafts: Vec<Draft>) -> Vec<Draft> {
        let mut all = std::mem::take(&mut self.pending);
        all.append(&mut drafts);
        for d in &mut all {
            d.generation.get_or_insert(self.generation);
        }
        all
    }

    /// Appends the deferred drafts and these, waiting for what the sync rule requires.
    pub async fn record(&mut self, drafts: Vec<Draft>) -> Result<Appended, JournalError> {
        let all = self.take_drafts(drafts);
        let recorded = self.journal.append(&self.id, all).await;
        self.note_superseded(&recorded);
        self.journaled |= recorded.is_ok();
        recorded
    }

    /// `record`, claiming (or refreshing) an idempotency key in the same write; refused
    /// with `Refusal::KeyHeld` while another invocation holds the key.
    pub async fn record_claiming(
        &mut self,
        drafts: Vec<Draft>,
        claim: KeyClaim,
    ) -> Result<Appended, JournalError> {
        let claims = Claims {
            key: Some(claim),
            ..Claims::default()
        };
        self.record_with(drafts, claims).await
    }

    /// `record`, writing index entries in the same batch. A refused claim writes nothing
    /// and keeps the drafts pending, so the caller may judge again and retry.
    pub async fn record_with(
        &mut self,
        drafts: Vec<Draft>,
        claims: Claims,
    ) -> Result<Appended, JournalError> {
        let all = self.take_drafts(drafts);
        let claimed = claims.key.is_some() || claims.twin.is_some();
        let kept = claimed.then(|| all.clone());
        let keyed = claims.key.is_some();
        let recorded = self.journal.append_with(&self.id, all, claims).await;
        self.note_superseded(&recorded);
        self.journaled |= recorded.is_ok();
        self.keyed |= keyed && recorded.is_ok();
        if let Err(JournalError::Refused(Refusal::KeyHeld(_) | Refusal::TwinMoved(_))) = &recorded
            && let Some(kept) = kept
        {
            self.pending = kept;
        } else if let (Err(JournalError::SharedUnavailable), Some(kept)) = (&recorded, kept) {
            self.refused_by_cluster(kept).await;
        }
        recorded
    }

    /// The fleet's store did not answer a claim: nothing was sent, and this node's own
    /// journal records the refusal (without the `DISPATCH_STARTED` that did not happen).
    async fn refused_by_cluster(&mut self, mut drafts: Vec<Draft>) {
        drafts.retain(|d| !matches!(d.body, Body::DispatchStarted(_)));
        let mut failure = Failure::of(Code::JournalUnavailable);
        failure.evidence.insert("store".into(), "cluster".into());
        drafts.push(Draft::observed(Body::Failed(failure)));
        let recorded = self.journal.append(&self.id, drafts).await;
        self.journaled |= recorded.is_ok();
    }

    /// Appends without waiting: for events nothing acts on.
    pub async fn observe(&mut self, drafts: Vec<Draft>) {
        let all = self.take_drafts(drafts);
        self.journal.enqueue(&self.id, all).await;
        // Unacked: taken as written (a refusal shows in the next acked append).
        self.journaled = true;
    }

    /// Logs a worker stopped by the generation check (a later generation took over).
    fn note_superseded(&self, recorded: &Result<Appended, JournalError>) {
        if let Err(JournalError::Refused(Refusal::WrongGeneration { expected, got })) = recorded {
            tracing::warn!(
                invocation = %self.id,
                generation = got,
                current = expected,
                "a superseded worker was stopped by the generation check; nothing was sent"
            );
        }
    }

    /// Records a failure; the envelope is the projection's.
    pub async fn fail(&mut self, mut drafts: Vec<Draft>, failure: Failure) -> Envelope {
        let code = failure.code;
        drafts.push(Draft::observed(Body::Failed(failure)));
        let recorded = self.record(drafts).await;
        self.envelope(&recorded, code)
    }

    /// Records a failure of `code` with the transport's own words for operators.
    pub async fn fail_with(&mut self, code: Code, diagnostic: String) -> Envelope {
        let mut f = Failure::of(code);
        f.diagnostic = Some(diagnostic);
        self.fail(vec![], f).await
    }

    /// The envelope the projection computed for a recorded failure, or one computed
    /// without the journal when it could not record.
    pub fn envelope(&self, recorded: &Result<Appended, JournalError>, code: Code) -> Envelope {
        match recorded {
            Ok(a) => match &a.state.record.envelope {
                Some(env) => env.clone(),
                None => self.fallback(code),
            },
            Err(JournalError::Refused(Refusal::WrongGeneration { .. })) => self.superseded(),
            Err(_) if self.dispatched => self.fallback(code),
            Err(_) => self.fallback(Code::JournalUnavailable),
        }
    }

    /// The answer of a worker whose generation was superseded: the invocation belongs to
    /// a later attempt now (`ATTEMPT_IN_PROGRESS`, fetch its result by id).
    fn superseded(&self) -> Envelope {
        match self.journal.state(&self.id) {
            Ok(Some(state)) => lease::attempt_in_progress(&state),
            _ => self.fallback(Code::JournalUnavailable),
        }
    }

    /// An envelope computed without the journal (it could not record).
    pub fn fallback(&self, code: Code) -> Envelope {
        let d = self.dispatched || self.dispatched_before;
        let mut env = unrecorded(&self.id, code, d);
        env.evidence.dispatch_started = d;
        if self.journal.shared().is_some_and(|s| !s.reachable()) {
            // A fleet's node whose shared store is away (SPEC §7).
            env.evidence.extra.insert("store".into(), "cluster".into());
        }
        if !self.journaled && !d {
            // Nothing of it was recorded (a journal refusing new work): no id to look up.
            env.invocation_id = None;
        }
        env
    }

    /// Connection-setup stages as events. Stages of a connection set up after
    /// `DISPATCH_STARTED` (a request handed back unwritten) continue the numbering.
    pub fn attempt_drafts(&mut self, attempts: &[ConnectAttempt]) -> Vec<Draft> {
        let offset = if self.dispatched {
            self.last_attempt
        } else {
            0
        };
        attempts
            .iter()
            .map(|a| {
                let mut a = a.clone();
                a.n += offset;
                self.last_attempt = self.last_attempt.max(a.n);
                let n = a.n;
                let hop = a.hop.take();
                let draft = Draft::observed(Body::ConnectAttempt(a)).attempt(n);
                match hop {
                    Some(h) => draft.hop(&h),
                    None => draft,
                }
            })
            .collect()
    }

    /// The dispatch boundary: `DISPATCH_STARTED` (with `drafts` before it) made durable.
    /// From here on nothing is ever `not_attempted`; on `Err` nothing may be sent.
    pub async fn dispatch_boundary(
        &mut self,
        drafts: Vec<Draft>,
        dispatch: Dispatch,
        hop: &str,
    ) -> Result<(), Envelope> {
        let crossed = self
            .dispatch_boundary_with(drafts, dispatch, hop, Claims::default())
            .await;
        crossed.map_err(|refused| match refused {
            Boundary::Answer(env) => *env,
            Boundary::TwinMoved(_) => self.fallback(Code::JournalUnavailable),
        })
    }

    /// `dispatch_boundary` with index claims riding the same write (a resend twin slot on
    /// a pooled connection, where the preflight rides there too). A lost slot leaves the
    /// deferred drafts pending and nothing written: the caller judges again.
    pub async fn dispatch_boundary_with(
        &mut self,
        mut drafts: Vec<Draft>,
        dispatch: Dispatch,
        hop: &str,
        claims: Claims,
    ) -> Result<(), Boundary> {
        if self.journal.health().refusing_dispatch() {
            // Low on disk space since this one was admitted: a new dispatch is refused
            // (and its results never written); the failure is recorded if it can be.
            let failure = Failure::of(Code::JournalUnavailable);
            return Err(Boundary::Answer(Box::new(self.fail(drafts, failure).await)));
        }
        if self.keyed {
            self.still_held().await?;
        }
        drafts.push(Draft::observed(Body::DispatchStarted(dispatch)).hop(hop));
        match self.record_with(drafts, claims).await {
            Ok(_) => {
                self.dispatched = true;
                Ok(())
            }
            Err(JournalError::Refused(Refusal::TwinMoved(holder))) => {
                // Kept pending by `record_with`; a retry brings its own DISPATCH_STARTED.
                self.pending.pop();
                Err(Boundary::TwinMoved(holder))
            }
            // The generation check: a later generation owns the invocation now.
            Err(JournalError::Refused(Refusal::WrongGeneration { .. })) => {
                Err(Boundary::Answer(Box::new(self.superseded())))
            }
            Err(_) => Err(Boundary::Answer(Box::new(
                self.fallback(Code::JournalUnavailable),
            ))),
        }
    }

    /// In a fleet: this worker's generation is still the one the shared store holds (and is
    /// marked dispatched there, so nobody supersedes it from here on). A generation another
    /// node superseded meanwhile sends nothing.
    async fn still_held(&mut self) -> Result<(), Boundary> {
        match self
            .journal
            .confirm_dispatch(&self.id, self.generation)
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::warn!(invocation = %self.id, generation = self.generation, "another node superseded this generation before its dispatch; nothing was sent");
                // This node's record of the generation ends here (another node runs the
                // next): it is not left open until a restart settles it.
                let mut failure = Failure::of(Code::AttemptInProgress);
                let superseded =
                    serde_json::json!({"generation": self.generation, "by": "another node"});
                failure.evidence.insert("superseded".into(), superseded);
                let _ = self
                    .record(vec![Draft::observed(Body::Failed(failure))])
                    .await;
                Err(Boundary::Answer(Box::new(self.superseded())))
            }
            Err(_) => Err(Boundary::Answer(Box::new(
                self.fallback(Code::JournalUnavailable),
            ))),
        }
    }

    /// `RESULT_COMMITTED` (the resolving event, in `drafts`) with its result, durable.
    pub async fn commit_result(
        &mut self,
        drafts: Vec<Draft>,
        result: StoredResult,
    ) -> Result<Appended, JournalError> {
        let all = self.take_drafts(drafts);
        self.journal.commit_result(&self.id, all, result).await
    }

    /// The remote completed but its result could not be committed: recorded when the journal
    /// still takes it, so the record settles as `RESULT_STORE_FAILED` (unknown, reconcile)
    /// now instead of at the next start; never `fetch_result`, never a second dispatch.
    pub async fn result_store_failed(&mut self) -> Envelope {
        self.fail(vec![], Failure::of(Code::ResultStoreFailed))
            .await
    }

    /// The caller left before the remote answered; the exchange runs on.
    pub async fn caller_cancelled(&mut self) {
        let _ = self.record_failure(Code::CallerCancelled).await;
    }

    /// The result is stored but the caller did not take all of it.
    pub async fn delivery_failed(&mut self) {
        let _ = self.record_failure(Code::ResultDeliveryFailed).await;
    }

    /// The relay after a protocol switch ended before every origin byte was handed on.
    pub async fn delivery_failed_upgrade(&mut self, upgrade: UpgradeEvidence) {
        let mut failure = Failure::of(Code::ResultDeliveryFailed);
        let upgrade = serde_json::to_value(upgrade).unwrap_or_default();
        failure.evidence.insert("upgrade".into(), upgrade);
        let _ = self
            .record(vec![Draft::observed(Body::Failed(failure))])
            .await;
    }

    async fn record_failure(&mut self, code: Code) -> Result<Appended, JournalError> {
        self.record(vec![Draft::observed(Body::Failed(Failure::of(code)))])
            .await
    }

    /// Nothing acts on `RESULT_DELIVERED`: it rides the next write without an ack.
    pub async fn delivered(&mut self, bytes: u64) {
        self.observe_delivered(bytes, None).await;
    }

    /// The agent read every body byte, then closed before the stream's end reached it.
    pub async fn delivered_unended(&mut self, bytes: u64) {
        self.observe_delivered(bytes, Some(false)).await;
    }

    async fn observe_delivered(&mut self, bytes: u64, end_of_stream_delivered: Option<bool>) {
        let done = Body::ResultDelivered(Delivered {
            bytes,
            upgrade: None,
            end_of_stream_delivered,
        });
        self.observe(vec![Draft::observed(done)]).await;
    }

    /// The relay after a protocol switch ended with every origin byte handed on.
    pub async fn delivered_upgrade(&mut self, upgrade: UpgradeEvidence) {
        let done = Body::ResultDelivered(Delivered {
            bytes: upgrade.bytes_down,
            upgrade: Some(upgrade),
            end_of_stream_delivered: None,
        });
        self.observe(vec![Draft::observed(done)]).await;
    }
}

/// The contract's envelope for an invocation no record here answers for (the journal could
/// not record it, or another fleet node holds it): `dispatched` says whether a dispatch may
/// have happened, and the contract computes phase, outcome and retry from that alone.
pub fn unrecorded(id: &str, code: Code, dispatched: bool) -> Envelope {
    crate::contract::unrecorded_invocation(id, code, dispatched)
}

#[cfg(test)]
mod tests;
