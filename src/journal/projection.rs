//! The current record of an invocation, as a pure fold over its events.
//!
//! `apply` is the one place the journal's transition rules live: nothing returns
//! to `not_attempted` once `DISPATCH_STARTED` exists; `committed`/`rejected` are
//! final; `unknown` is resolved only by later evidence from a named source.

use serde::{Deserialize, Serialize};

use super::event::{Body, Event, EventKind, Protocol, Source};
use crate::contract::{
    AttemptEvidence, Code, Envelope, Evidence, FailureContext, Generations, KeyWindow,
    OperationFacts, Outcome, OutcomeRule, Phase, Resolution, Retry, is_resolved, resolve_failure,
};

/// A record, exactly the shape of SPEC §5.5.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub invocation_id: String,
    pub agent: String,
    pub protocol: Protocol,
    pub route: Option<String>,
    pub method: Option<String>,
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    pub phase: Phase,
    pub outcome: Outcome,
    pub retry: Retry,
    pub code: Option<Code>,
    pub generation: u32,
    pub attempts: u32,
    pub created_at: String,
    pub evidence: Evidence,
    pub result: Option<ResultSummary>,
    pub envelope: Option<Envelope>,
}

/// The summary of a stored result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_signal: Option<String>,
    /// A gRPC call's `grpc-status`, beside the HTTP `status` (SPEC §3.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<u32>,
    pub digest: String,
    pub bytes: u64,
    pub complete: bool,
}

/// Evidence key of `RESULT_COMMITTED`: `false` when the stored result keeps no body.
pub const BODY_STORED: &str = "body_stored";
/// What the projection tracks beyond the public record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub phase_reached: Option<Phase>,
    pub dispatched_ever: bool,
    pub dispatched_this_generation: bool,
    /// No live exchange appends to this generation any more.
    pub closed: bool,
    /// `RESULT_COMMITTED` is recorded; the writer only takes it together with its result.
    pub result_stored: bool,
    /// The committed result keeps no body (over `max_result_bytes`): nothing to fetch.
    #[serde(default)]
    pub body_not_kept: bool,
    pub delivered: bool,
    pub idempotent: bool,
    pub safe_until_ms: Option<i64>,
    pub last_seq: u64,
    /// The connection-setup attempt the latest `CONNECT_ATTEMPT` belongs to (0: none yet in
    /// this generation): stages of one attempt (dns → tcp → tls) count once.
    #[serde(default)]
    pub attempt_n: u32,
    /// When the live generation's lease began (`ACTION_ACCEPTED` or `RETRY_LEASED`), unix ms.
    #[serde(default)]
    pub lease_started_ms: i64,
    /// The retry budget the latest preflight bound (none in older journals).
    #[serde(default)]
    pub retry_budget: Option<u32>,
    /// A retention cut took some of its events: it cannot be replayed, so it never reopens.
    #[serde(default)]
    pub events_pruned: bool,
}

/// Record plus progress: what the journal stores per invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub record: Record,
    pub progress: Progress,
}

impl State {
    /// A first generation still being served to a caller who waits for it: not resolved,
    /// not closed, its caller not gone (SPEC §3.7: an identical request now is a parallel
    /// one, not a resend of something that may have run).
    pub fn awaited(&self) -> bool {
        !self.progress.closed
            && self.record.generation == 1
            && self.record.code != Some(Code::CallerCancelled)
            && !is_resolved(self.record.outcome)
    }

    /// What the journal proves about the operation's retry semantics, for `contract`.
    pub fn operation(&self) -> OperationFacts {
        let p = &self.progress;
        OperationFacts {
            idempotent: p.idempotent,
            idempotency_key: p.safe_until_ms.map(|ms| KeyWindow { safe_until_ms: ms }),
            generations: p.retry_budget.map(|budget| Generations {
                current: self.record.generation,
                budget,
            }),
        }
    }
}

/// Why the projection refused an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the invocation has no ACTION_ACCEPTED event")]
    UnknownInvocation,
    #[error("the invocation was already accepted")]
    AlreadyAccepted,
    #[error("event data does not fit {0:?}")]
    BadData(EventKind),
    #[error("event generation {got} is not the invocation's generation {expected}")]
    WrongGeneration { expected: u32, got: u32 },
    #[error("{0:?} after the generation closed")]
    Closed(EventKind),
    #[error("{0:?} before DISPATCH_STARTED")]
    NotDispatched(EventKind),
    #[error("{0:?} after DISPATCH_STARTED")]
    AfterDispatch(EventKind),
    #[error("{0} claims not_attempted after DISPATCH_STARTED")]
    NotAttemptedAfterDispatch(Code),
    #[error("the outcome is already resolved")]
    AlreadyResolved,
    #[error("{0:?} needs RESULT_COMMITTED with its result")]
    NoResult(EventKind),
    #[error("RESULT_COMMITTED and its result are written together or not at all")]
    ResultWithoutCommit,
    #[error("source {0:?} cannot resolve an unknown outcome")]
    SourceCannotResolve(Source),
    #[error("only an unknown outcome can be reconciled")]
    NotUnknown,
    #[error("the invocation is still in flight; its own evidence will settle it")]
    InFlight,
    #[error("a RESULT_COMMITTED outcome must be committed or rejected")]
    UnresolvedResult,
    #[error("a retry lease needs a closed generation that is not resolved")]
    LeaseRefused,
    #[error("the idempotency key is held by {0}")]
    KeyHeld(String),
    #[error("the resend twin slot names {0} by now")]
    TwinMoved(String),
}

/// The time of an event in unix ms; 0 if `ts` is not RFC 3339.
pub fn event_ms(event: &Event) -> i64 {
    time::OffsetDateTime::parse(&event.ts, &time::format_description::well_known::Rfc3339)
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
        .unwrap_or(0)
}

/// Replays an invocation's stored events (all accepted once, so none is refused).
pub fn replay(events: &[Event]) -> Option<State> {
    events
        .iter()
        .try_fold(None, |state, e| apply(state, e).ok().map(Some))
        .flatten()
}

/// Folds one event into the state; refuses impossible moves.
pub fn apply(state: Option<State>, event: &Event) -> Result<State, Refusal> {
    let body = event.body().ok_or(Refusal::BadData(event.kind))?;
    apply_body(state, event, body)
}

/// `apply` with the event's data already typed (the writer has it from the draft).
pub fn apply_body(state: Option<State>, event: &Event, body: Body) -> Result<State, Refusal> {
    if body.kind() != event.kind {
        return Err(Refusal::BadData(event.kind));
    }
    let Some(mut state) = state else {
        return match body {
            Body::ActionAccepted(a) => Ok(accepted(event, a)),
            Body::InvocationAdopted(a) => adopted(event, &a),
            _ => Err(Refusal::UnknownInvocation),
        };
    };
    if let Body::InvocationAdopted(a) = &body {
        // A later generation another node published replaces an older copy here.
        let newer = adopted(event, a)?;
        return match newer.record.generation > state.record.generation {
            true => Ok(newer),
            false => Err(Refusal::LeaseRefused),
        };
    }
    let expected = match body {
        Body::RetryLeased(_) => state.record.generation + 1,
        _ => state.record.generation,
    };
    if event.generation != expected {
        return Err(Refusal::WrongGeneration {
            expected,
            got: event.generation,
        });
    }
    step(&mut state, event, body)?;
    state.progress.last_seq = event.seq;
    Ok(state)
}

/// The owner's published state, for this node's next generation of it: its own id and
/// generation, or refused.
fn adopted(event: &Event, a: &super::event::Adoption) -> Result<State, Refusal> {
    let mut state: State = serde_json::from_str(&a.snapshot)
        .map_err(|_| Refusal::BadData(EventKind::InvocationAdopted))?;
    let r = &state.record;
    if r.invocation_id != event.invocation_id || r.generation != event.generation {
        return Err(Refusal::BadData(EventKind::InvocationAdopted));
    }
    state.progress.last_seq = event.seq;
    Ok(state)
}

fn accepted(event: &Event, a: super::event::Accepted) -> State {
    State {
        record: Record {
            invocation_id: event.invocation_id.clone(),
            agent: a.agent,
            protocol: a.protocol,
            route: None,
            method: a.method,
            target: a.target,
            command: a.command,
            phase: Phase::Validation,
            outcome: Outcome::NotAttempted,
            retry: Retry::FetchResult,
            code: None,
            generation: event.generation,
            attempts: 0,
            created_at: event.ts.clone(),
            evidence: Evidence {
                hop: event.hop.clone(),
                ..Evidence::default()
            },
            result: None,
            envelope: None,
        },
        progress: Progress {
            phase_reached: Some(Phase::Validation),
            last_seq: event.seq,
            lease_started_ms: event_ms(event),
            ..Progress::default()
        },
    }
}

fn step(state: &mut State, event: &Event, body: Body) -> Result<(), Refusal> {
    let kind = body.kind();
    if event.hop != "postern" || matches!(kind, EventKind::DispatchStarted) {
        state.record.evidence.hop = event.hop.clone();
    }
    let p = &mut state.progress;
    let r = &mut state.record;
    match body {
        Body::ActionAccepted(_) => return Err(Refusal::AlreadyAccepted),
        Body::PreflightValidated(pf) => {
            before_dispatch(p, kind)?;
            r.route = Some(pf.route);
            r.evidence.fingerprint = Some(pf.fingerprint);
            r.evidence.credential = pf.credential;
            r.evidence.idempotency = pf.idempotency;
            p.idempotent = pf.idempotent;
            r.evidence.idempotent = Some(pf.idempotent);
            p.safe_until_ms = pf.safe_until_ms;
            p.retry_budget = pf.retry_budget;
            r.evidence.credential_placeholder = pf.credential_placeholder.then_some(true);
            if let Some(resend) = pf.resend {
                resend_evidence(&mut r.evidence, resend);
            }
            reach(p, Phase::CredentialInjection);
        }
        Body::CredentialAuthorized(cred) => {
            before_dispatch(p, kind)?;
            r.evidence.credential = Some(cred);
            reach(p, Phase::ConnectionSetup);
        }
        Body::ApprovalRequested(_) => {
            before_dispatch(p, kind)?;
            // SPEC §1.1: a held request stopped where the credential awaits approval, even
            // though the credential itself was already authorized.
            p.phase_reached = Some(Phase::CredentialInjection);
        }
        Body::ApprovalGranted(_) => {
            before_dispatch(p, kind)?;
            reach(p, Phase::ConnectionSetup);
        }
        Body::ApprovalDenied(_) => {
            before_dispatch(p, kind)?;
            reach(p, Phase::CredentialInjection);
        }
        Body::ConnectAttempt(c) => {
            if p.closed {
                return Err(Refusal::Closed(kind));
            }
            if p.dispatched_this_generation {
                // Only a request the transport handed back unwritten goes out again on a
                // fresh connection: its stages are evidence and change no outcome.
                r.evidence
                    .extra
                    .insert("resent_unwritten".into(), true.into());
            } else {
                reach(p, Phase::ConnectionSetup);
            }
            if c.n != p.attempt_n {
                p.attempt_n = c.n;
                r.attempts += 1;
            }
            r.evidence.attempt = Some(c.n);
            if !c.ok {
                r.evidence.attempts.push(AttemptEvidence {
                    n: c.n,
                    stage: c.stage,
                    outcome: Outcome::NotAttempted,
                    code: c.code,
                });
            }
        }
        Body::DispatchStarted(d) => {
            before_dispatch(p, kind)?;
            if is_resolved(r.outcome) {
                return Err(Refusal::AlreadyResolved);
            }
            p.dispatched_ever = true;
            p.dispatched_this_generation = true;
            reach(p, Phase::RemoteExecution);
            r.phase = Phase::RemoteExecution;
            r.outcome = Outcome::Unknown;
            r.evidence.dispatch_started = true;
            r.evidence.dispatch_seq = Some(event.seq);
            if let Some(tls) = &d.tls {
                r.evidence
                    .extra
                    .insert("tls".into(), serde_json::json!(tls));
            }
            if let Some(address) = &d.address {
                r.evidence
                    .extra
                    .insert("address".into(), address.clone().into());
            }
            if d.reused_connection {
                r.evidence
                    .extra
                    .insert("reused_connection".into(), true.into());
            }
            if let Some(id) = d.connection_id {
                r.evidence.extra.insert("connection_id".into(), id.into());
            }
        }
        Body::RequestSent(_) => {
            during_dispatch(p, kind)?;
            r.evidence.request_complete = true;
        }
        Body::RemoteResponseStarted(started) => {
            during_dispatch(p, kind)?;
            r.evidence.response_headers_received = true;
            // Evidence only (SPEC §5.5): a status without RESULT_COMMITTED resolves nothing.
            if let Some(status) = started.status {
                r.evidence
                    .extra
                    .insert("response_status".into(), status.into());
            }
        }
        Body::RemoteResponseComplete(c) => {
            during_dispatch(p, kind)?;
            r.evidence.response_complete = true;
            r.evidence.completion = Some(c.completion);
            r.evidence.response_digest = Some(c.digest);
        }
        Body::ResultCommitted(rc) => {
            if !p.dispatched_this_generation {
                return Err(Refusal::NotDispatched(kind));
            }
            if is_resolved(r.outcome) {
                return Err(Refusal::AlreadyResolved);
            }
            if !is_resolved(rc.outcome) {
                return Err(Refusal::UnresolvedResult);
            }
            if !event.source.can_resolve_unknown() {
                return Err(Refusal::SourceCannotResolve(event.source));
            }
            r.outcome = rc.outcome;
            r.retry = rc.retry;
            r.phase = Phase::RemoteExecution;
            r.code = None;
            r.envelope = None;
            r.evidence.response_digest = Some(rc.digest.clone());
            r.evidence.exit_status = rc.exit_status;
            r.evidence.result_id = Some(event.invocation_id.clone());
            if rc.completion.is_some() {
                r.evidence.completion = rc.completion;
            }
            p.body_not_kept = [BODY_STORED, "output_stored"]
                .iter()
                .any(|k| rc.evidence.get(*k) == Some(&serde_json::Value::Bool(false)));
            for (k, v) in rc.evidence {
                r.evidence.extra.insert(k, v);
            }
            r.result = Some(ResultSummary {
                status: rc.status,
                exit_status: rc.exit_status,
                exit_signal: rc.exit_signal,
                grpc_status: rc.grpc_status,
                digest: rc.digest,
                bytes: rc.bytes,
                complete: rc.complete,
            });
            p.result_stored = true;
        }
        Body::ResultDelivered(d) => {
            if !p.result_stored {
                return Err(Refusal::NoResult(kind));
            }
            if p.closed {
                return Err(Refusal::Closed(kind));
            }
            if let Some(u) = d.upgrade {
                let upgrade = serde_json::to_value(u).unwrap_or_default();
                r.evidence.extra.insert("upgrade".into(), upgrade);
            }
            if let Some(end) = d.end_of_stream_delivered {
                let key = "end_of_stream_delivered";
                r.evidence.extra.insert(key.into(), end.into());
            }
            p.delivered = true;
            p.closed = true;
        }
        Body::Failed(f) => {
            // A hop's refusal, or the token endpoint's answer to a failed mint: both decide
            // whether a correction is needed before a retry (SPEC §1.4).
            let hop_status = ["hop_status", "token_status"]
                .iter()
                .find_map(|k| f.evidence.get(*k))
                .and_then(serde_json::Value::as_u64)
                .and_then(|s| u16::try_from(s).ok());
            if r.route.is_none() {
                r.route = f.route;
            }
            r.evidence.extra.extend(f.evidence);
            return fail(state, event, f.code, f.field, hop_status);
        }
        Body::Reconciled(rec) => {
            if !event.source.can_resolve_unknown() {
                return Err(Refusal::SourceCannotResolve(event.source));
            }
            if r.outcome != Outcome::Unknown {
                return Err(Refusal::NotUnknown);
            }
            // A live attempt resolves itself from what the remote says: an operator's word
            // must not pre-empt (and then hide) that evidence.
            if !p.closed {
                return Err(Refusal::InFlight);
            }
            if !is_resolved(rec.outcome) {
                return Err(Refusal::UnresolvedResult);
            }
            r.outcome = rec.outcome;
            r.retry = match rec.outcome {
                Outcome::Rejected => Retry::AfterCorrection,
                _ => Retry::Never,
            };
            if let Some(env) = r.envelope.as_mut() {
                env.error.outcome = r.outcome;
                env.error.retry = r.retry;
            }
            r.evidence.extra.insert(
                "reconciled".into(),
                serde_json::json!({"source": event.source, "note": rec.note, "seq": event.seq}),
            );
            p.closed = true;
        }
        Body::RetryLeased(lease) => {
            if !may_lease(p, r, &lease) {
                return Err(Refusal::LeaseRefused);
            }
            r.generation = lease.generation;
            p.lease_started_ms = event_ms(event);
            // The earlier failure stays in the events; the record shows the live attempt.
            r.retry = Retry::FetchResult;
            r.code = None;
            r.envelope = None;
            r.evidence.attempts.clear();
            r.evidence.attempt = None;
            r.evidence.generation = Some(lease.generation);
            p.closed = false;
            p.dispatched_this_generation = false;
            p.attempt_n = 0;
        }
        // The daemon's own event never belongs to an invocation.
        Body::ConfigReloaded(_)
        | Body::JournalPruned(_)
        | Body::AgentSuspended(_)
        | Body::AgentResumed(_)
        | Body::InvocationAdopted(_) => return Err(Refusal::BadData(kind)),
    }
    Ok(())
}

/// A new generation needs the live one closed and unresolved, or — when it supersedes
/// that one by name — the live one still short of the dispatch boundary.
fn may_lease(p: &Progress, r: &Record, lease: &super::event::Lease) -> bool {
    if p.events_pruned || is_resolved(r.outcome) || lease.generation != r.generation + 1 {
        return false;
    }
    match &lease.supersedes {
        None => p.closed,
        Some(s) => s.generation == r.generation && !p.closed && !p.dispatched_this_generation,
    }
}

/// SPEC §3.7: a resend sent anyway names its twin.
fn resend_evidence(evidence: &mut Evidence, resend: super::event::ResendEvidence) {
    if let Some(twin) = resend.resend_of {
        let twin = serde_json::to_value(twin).unwrap_or_default();
        evidence.extra.insert("resend_of".into(), twin);
    }
    if resend.resend_deliberate {
        evidence
            .extra
            .insert("resend_deliberate".into(), true.into());
    }
}

fn reach(p: &mut Progress, phase: Phase) {
    if p.phase_reached.is_none_or(|reached| reached < phase) {
        p.phase_reached = Some(phase);
    }
}

fn before_dispatch(p: &Progress, kind: EventKind) -> Result<(), Refusal> {
    if p.closed {
        return Err(Refusal::Closed(kind));
    }
    if p.dispatched_this_generation {
        return Err(Refusal::AfterDispatch(kind));
    }
    Ok(())
}

fn during_dispatch(p: &Progress, kind: EventKind) -> Result<(), Refusal> {
    if !p.dispatched_this_generation {
        return Err(Refusal::NotDispatched(kind));
    }
    Ok(())
}

/// Records a failure: `contract` computes what it means.
fn fail(
    state: &mut State,
    event: &Event,
    code: Code,
    field: Option<String>,
    hop_status: Option<u16>,
) -> Result<(), Refusal> {
    let operation = state.operation();
    let p = &mut state.progress;
    let r = &mut state.record;
    let live_result = code == Code::ResultDeliveryFailed || code == Code::ResultStoreFailed;
    // A spent budget is found when a retry is asked for: the last generation is closed.
    let spent_budget = code == Code::RetryBudgetExhausted && !is_resolved(r.outcome);
    if p.closed && !(live_result && p.result_stored && !p.delivered) && !spent_budget {
        return Err(Refusal::Closed(EventKind::Failed));
    }
    if code.is_pre_dispatch() && p.dispatched_this_generation {
        return Err(Refusal::NotAttemptedAfterDispatch(code));
    }
    // `fetch_result` points at a stored result: never without one, nor at one whose body
    // was too large to keep.
    if code == Code::ResultDeliveryFailed && (!p.result_stored || p.body_not_kept) {
        return Err(Refusal::NoResult(EventKind::Failed));
    }
    let keeps_outcome = matches!(
        code.row().outcome,
        OutcomeRule::Own | OutcomeRule::CommittedIfProvable
    );
    if is_resolved(r.outcome) && !keeps_outcome {
        return Err(Refusal::AlreadyResolved);
    }
    let ctx = FailureContext {
        phase_reached: p.phase_reached.unwrap_or(Phase::Validation),
        current_outcome: r.outcome,
        dispatched: p.dispatched_ever,
        result_stored: p.result_stored,
        operation,
        now_ms: event_ms(event),
        hop_status,
    };
    let resolution: Resolution = resolve_failure(code, &ctx);
    if r.outcome == Outcome::Unknown
        && is_resolved(resolution.outcome)
        && !event.source.can_resolve_unknown()
    {
        return Err(Refusal::SourceCannotResolve(event.source));
    }
    r.code = Some(code);
    r.phase = resolution.phase;
    r.outcome = resolution.outcome;
    r.retry = resolution.retry;
    r.evidence.generation = Some(r.generation);
    r.envelope = Some(Envelope::new(
        &r.invocation_id,
        resolution,
        field,
        r.evidence.clone(),
    ));
    // A cancelled caller leaves the exchange running in its own task.
    p.closed = code != Code::CallerCancelled;
    Ok(())
}

#[cfg(test)]
#[path = "projection/tests.rs"]
mod tests;
