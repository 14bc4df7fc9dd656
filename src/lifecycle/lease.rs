//! Leases and generations (SPEC §3.4, §5.5): one active attempt per invocation.
//!
//! A retry of an unresolved invocation is a new generation of that same invocation:
//! `RETRY_LEASED` (durable) raises `generation`, and the transport runs preflight →
//! dispatch → commit on the `Invocation` this returns, as it would on a fresh one. A
//! generation's worker holds its lease until the generation closes; before it crosses the
//! dispatch boundary its lease runs out after `LeaseTerms::ttl`, and a later lease may
//! supersede it (naming it and `lease_expired`): its `DISPATCH_STARTED` then names a stale
//! generation and is refused, so it sends nothing. Budgets count generations in the
//! journal, so a restart resets neither the count nor the lease history.
//!
//! Used by same-key requests (`lifecycle::idempotency`) and by `postern retry`.

use std::time::Duration;

use super::Invocation;
use crate::contract::{Code, Envelope, FailureContext, Phase, is_resolved, resolve_failure};
use crate::journal::{
    Adoption, Body, Draft, Failure, Journal, JournalError, Lease, Leased, Source, State,
    SupersedeReason, Supersession, unix_ms,
};

/// What a caller asks a new generation to be held to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTerms {
    /// Retries the invocation may have: generations beyond the first (the route's or the
    /// SSH target's `retry_budget`). Spent → `RETRY_BUDGET_EXHAUSTED`, journaled. The
    /// budget the invocation bound at preflight wins (see `no_generation_left`); this one
    /// counts only for journals written before budgets were bound.
    pub budget: u32,
    /// How long the new generation's worker may take to reach the dispatch boundary; past
    /// it, a later lease may supersede that worker. Also how long a live generation that
    /// has not dispatched counts as in progress. See `lease_ttl`.
    pub ttl: Duration,
    /// The caller retries against the verdict (`postern retry --i-have-reconciled`):
    /// journaled on the lease as such.
    pub unsafe_override: bool,
    /// Who asked and why, journaled on the lease (no secrets: it is shown to operators).
    pub note: Option<String>,
}

impl LeaseTerms {
    /// An HTTP route's terms: its `retry_budget`, and a lease covering its approval wait,
    /// connection stages and response timeout.
    pub fn for_route(route: &crate::config::Route, note: Option<String>) -> Self {
        Self::of(
            route.retry_budget,
            route.approval,
            route.approval_timeout,
            route.connect_timeout,
            route.response_timeout,
            note,
        )
    }

    /// An SSH target's terms, as a route's.
    pub fn for_ssh_target(target: &crate::config::SshTarget, note: Option<String>) -> Self {
        Self::of(
            target.retry_budget,
            target.approval,
            target.approval_timeout,
            target.connect_timeout,
            target.response_timeout,
            note,
        )
    }

    fn of(
        budget: u32,
        approval: crate::config::Approval,
        approval_timeout: Duration,
        connect: Duration,
        response: Duration,
        note: Option<String>,
    ) -> Self {
        let wait = match approval {
            crate::config::Approval::Required => approval_timeout,
            crate::config::Approval::None => Duration::ZERO,
        };
        Self {
            budget,
            ttl: lease_ttl(wait, connect, response),
            unsafe_override: false,
            note,
        }
    }
}

/// A lease long enough for a worker to get from its lease to the dispatch boundary: the
/// approval hold (if any), every connection stage (dns, tcp, tls, tunnel) at its timeout,
/// the response timeout and some slack. `POSTERN_LEASE_TTL_MS` (failpoints builds)
/// shortens it for tests.
pub fn lease_ttl(
    approval_wait: Duration,
    connect_timeout: Duration,
    response: Duration,
) -> Duration {
    crate::journal::lease_ttl_override()
        .unwrap_or(approval_wait + connect_timeout * 4 + response + Duration::from_secs(5))
}

/// Why no new generation was leased.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseError {
    /// No invocation has this id.
    NotFound,
    /// The invocation is committed or rejected: there is nothing to retry; its record
    /// (and stored result) is the answer.
    Resolved(Box<State>),
    /// Answer this envelope; nothing was dispatched: `ATTEMPT_IN_PROGRESS` (another
    /// generation holds the lease), `RETRY_BUDGET_EXHAUSTED` (journaled on the record) or
    /// `JOURNAL_UNAVAILABLE`.
    Refused(Box<Envelope>),
}

/// What `lease` will do with an invocation's current state (pure: the time is passed in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeasePlan {
    /// Write `RETRY_LEASED` for the next generation, superseding the live one if named.
    Take { supersedes: Option<u32> },
    /// A live generation holds the lease.
    InProgress,
    /// The outcome is resolved.
    Resolved,
    /// No retry left.
    Exhausted,
}

/// One active attempt per invocation: a live generation holds its lease once it crossed
/// the dispatch boundary (it ends when the generation closes) or while its ttl runs.
pub fn in_progress(state: &State, now_ms: i64, ttl: Duration) -> bool {
    let p = &state.progress;
    !p.closed && (p.dispatched_this_generation || now_ms < lease_expiry_ms(state, ttl))
}

fn lease_expiry_ms(state: &State, ttl: Duration) -> i64 {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    state.progress.lease_started_ms.saturating_add(ttl_ms)
}

/// The invocation has used up its retry budget. The budget is the one bound at preflight
/// (snapshot binding), so a config reload changes neither the lease nor the `retry` the
/// record computed from it (`contract::Generations`).
pub fn no_generation_left(state: &State, terms: &LeaseTerms) -> bool {
    let budget = state.progress.retry_budget.unwrap_or(terms.budget);
    state.record.generation > budget
}

/// Decides what `lease` does, before any write.
pub fn plan(state: &State, now_ms: i64, terms: &LeaseTerms) -> LeasePlan {
    let spent = no_generation_left(state, terms);
    if is_resolved(state.record.outcome) {
        LeasePlan::Resolved
    } else if in_progress(state, now_ms, terms.ttl) {
        LeasePlan::InProgress
    } else if !state.progress.closed {
        // An expired worker with no retry left keeps its generation: it may still dispatch.
        match spent {
            true => LeasePlan::InProgress,
            false => LeasePlan::Take {
                supersedes: Some(state.record.generation),
            },
        }
    } else if spent {
        LeasePlan::Exhausted
    } else {
        LeasePlan::Take { supersedes: None }
    }
}

impl Invocation {
    /// Leases the next generation of `invocation_id`: checks that no live generation holds
    /// the lease (`ATTEMPT_IN_PROGRESS`) and that the budget allows another retry (else
    /// journals `RETRY_BUDGET_EXHAUSTED` on the record), writes `RETRY_LEASED` durably and
    /// returns the invocation positioned in the new generation, not yet dispatched: the
    /// transport runs preflight → dispatch → commit on it as on `accept`'s.
    ///
    /// It does not judge whether a retry is *safe* (`decide`, safe-until windows): callers
    /// do, and say so with `terms.unsafe_override` when they go against the verdict.
    pub async fn lease(
        journal: Journal,
        invocation_id: &str,
        terms: LeaseTerms,
    ) -> Result<Invocation, LeaseError> {
        // A lost race (another lease won between read and write) reads once more.
        for _ in 0..2 {
            let state = match journal.state(invocation_id) {
                Ok(Some(s)) => s,
                Ok(None) => return Err(LeaseError::NotFound),
                Err(_) => return Err(unavailable(invocation_id)),
            };
            let now = unix_ms(journal.now());
            let supersedes = match plan(&state, now, &terms) {
                LeasePlan::Resolved => return Err(LeaseError::Resolved(Box::new(state))),
                LeasePlan::InProgress => {
                    return Err(LeaseError::Refused(Box::new(attempt_in_progress(&state))));
                }
                LeasePlan::Exhausted => return Err(exhausted(&journal, state).await),
                LeasePlan::Take { supersedes } => supersedes,
            };
            let lease = Lease {
                generation: state.record.generation + 1,
                unsafe_override: terms.unsafe_override,
                supersedes: supersedes.map(|generation| Supersession {
                    generation,
                    reason: SupersedeReason::LeaseExpired,
                }),
                ttl_ms: Some(u64::try_from(terms.ttl.as_millis()).unwrap_or(u64::MAX)),
                note: terms.note.clone(),
            };
            // In a fleet the shared store decides first: another node may hold it by now.
            match journal
                .lease_shared(invocation_id, state.record.generation, terms.ttl)
                .await
            {
                Ok(Leased::Won | Leased::Unshared) => {}
                Ok(Leased::Lost) => {
                    return Err(LeaseError::Refused(Box::new(attempt_in_progress(&state))));
                }
                Err(_) => return Err(unavailable(invocation_id)),
            }
            // An operator vouching against the verdict is the source of this lease.
            let source = match terms.unsafe_override {
                true => Source::OperatorAttested,
                false => Source::TransportObserved,
            };
            let draft = Draft::observed(Body::RetryLeased(lease.clone())).source(source);
            match journal.append(invocation_id, vec![draft]).await {
                Ok(_) => return Ok(leased(journal, invocation_id, &state, &lease)),
                Err(JournalError::Refused(_)) => continue,
                Err(JournalError::Unavailable | JournalError::SharedUnavailable) => {
                    return Err(unavailable(invocation_id));
                }
            }
        }
        match journal.state(invocation_id) {
            Ok(Some(s)) => Err(LeaseError::Refused(Box::new(attempt_in_progress(&s)))),
            _ => Err(unavailable(invocation_id)),
        }
    }
}

impl Invocation {
    /// Takes another fleet node's invocation over for its next generation (SPEC §7).
    /// `state` is what that node published, brought up to the shared lease. The shared
    /// lease is won first — the store's generation must still be this one, settled by its
    /// node or not dispatched within the ttl — then `INVOCATION_ADOPTED` (the state) and
    /// `RETRY_LEASED` are journaled here together. The new generation runs as any other.
    pub async fn adopt(
        journal: Journal,
        state: State,
        from_node: &str,
        terms: LeaseTerms,
    ) -> Result<Invocation, LeaseError> {
        let id = state.record.invocation_id.clone();
        let now = unix_ms(journal.now());
        let supersedes = match plan(&state, now, &terms) {
            LeasePlan::Resolved => return Err(LeaseError::Resolved(Box::new(state))),
            LeasePlan::Take { supersedes } => supersedes,
            // Spent or running there: the record says so (its node journals a spent budget).
            LeasePlan::InProgress | LeasePlan::Exhausted => {
                let env = match &state.record.envelope {
                    Some(env) if state.progress.closed => env.clone(),
                    _ => attempt_in_progress(&state),
                };
                return Err(LeaseError::Refused(Box::new(env)));
            }
        };
        match journal
            .lease_shared(&id, state.record.generation, terms.ttl)
            .await
        {
            Ok(Leased::Won) => {}
            Ok(Leased::Lost | Leased::Unshared) => {
                return Err(LeaseError::Refused(Box::new(attempt_in_progress(&state))));
            }
            Err(_) => return Err(unavailable(&id)),
        }
        let lease = Lease {
            generation: state.record.generation + 1,
            unsafe_override: false,
            supersedes: supersedes.map(|generation| Supersession {
                generation,
                reason: SupersedeReason::LeaseExpired,
            }),
            ttl_ms: Some(u64::try_from(terms.ttl.as_millis()).unwrap_or(u64::MAX)),
            note: terms.note.clone(),
        };
        let Ok(snapshot) = serde_json::to_string(&state) else {
            return Err(unavailable(&id));
        };
        let mut adopted = Draft::observed(Body::InvocationAdopted(Adoption {
            from_node: from_node.to_owned(),
            snapshot,
        }));
        adopted.generation = Some(state.record.generation);
        let leased_draft = Draft::observed(Body::RetryLeased(lease.clone()));
        match journal.append(&id, vec![adopted, leased_draft]).await {
            Ok(_) => {
                tracing::warn!(invocation = %id, from = from_node, generation = lease.generation, "took over another node's invocation for its next generation");
                Ok(leased(journal, &id, &state, &lease))
            }
            Err(_) => Err(unavailable(&id)),
        }
    }
}

/// The invocation in its new generation, once `RETRY_LEASED` is durable.
fn leased(journal: Journal, id: &str, before: &State, lease: &Lease) -> Invocation {
    if let Some(s) = &lease.supersedes {
        tracing::warn!(
            invocation = %id,
            superseded = s.generation,
            generation = lease.generation,
            reason = s.reason.as_str(),
            "a new generation superseded a worker whose lease expired before dispatch"
        );
    }
    Invocation {
        journal,
        id: id.to_owned(),
        pending: Vec::new(),
        dispatched: false,
        dispatched_before: before.progress.dispatched_ever,
        last_attempt: 0,
        generation: lease.generation,
        leased: true,
        journaled: true,
        keyed: false,
    }
}

/// `RETRY_BUDGET_EXHAUSTED` on the record (once), with its last evidence.
async fn exhausted(journal: &Journal, state: State) -> LeaseError {
    if state.record.code == Some(Code::RetryBudgetExhausted)
        && let Some(env) = state.record.envelope
    {
        return LeaseError::Refused(Box::new(env));
    }
    let id = state.record.invocation_id.clone();
    let draft = Draft::observed(Body::Failed(Failure::of(Code::RetryBudgetExhausted)));
    match journal.append(&id, vec![draft]).await {
        Ok(a) => match &a.state.record.envelope {
            Some(env) => LeaseError::Refused(Box::new(env.clone())),
            None => unavailable(&id),
        },
        Err(_) => unavailable(&id),
    }
}

/// The journal could not be read or written: this request did nothing.
fn unavailable(id: &str) -> LeaseError {
    LeaseError::Refused(Box::new(super::unrecorded(
        id,
        Code::JournalUnavailable,
        false,
    )))
}

/// `ATTEMPT_IN_PROGRESS` for a live invocation: its own phase and outcome, retry
/// `fetch_result`, its evidence. Not journaled (a record in flight is not closed by it).
pub fn attempt_in_progress(state: &State) -> Envelope {
    let p = &state.progress;
    let r = &state.record;
    let ctx = FailureContext {
        phase_reached: p.phase_reached.unwrap_or(Phase::Validation),
        current_outcome: r.outcome,
        dispatched: p.dispatched_ever,
        result_stored: p.result_stored,
        operation: state.operation(),
        now_ms: 0,
        hop_status: None,
    };
    let mut evidence = r.evidence.clone();
    evidence.generation = Some(r.generation);
    Envelope::new(
        &r.invocation_id,
        resolve_failure(Code::AttemptInProgress, &ctx),
        None,
        evidence,
    )
}

#[cfg(test)]
#[path = "lease/tests.rs"]
mod tests;
