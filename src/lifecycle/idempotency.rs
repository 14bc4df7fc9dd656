//! Idempotency keys (SPEC §3.4): what a request on a route with an idempotency contract
//! gets, decided from the key index and the record of the key's invocation before
//! anything is sent.
//!
//! Unseen key → a new invocation claims it with its preflight. Known key: another
//! request (different fingerprint) → `IDEMPOTENCY_MISMATCH`; `committed`/`rejected` →
//! the stored result, replayed under the original invocation id; a live generation →
//! `ATTEMPT_IN_PROGRESS`; no generation left in the retry budget → `RETRY_BUDGET_EXHAUSTED`
//! (journaled by `lease`); `not_attempted`, or `unknown` while a same-key retry is safe
//! (before safe-until, or an idempotent method) → a new generation of that invocation
//! (`lease`); `unknown` otherwise → the record's envelope with retry `reconcile`.
//! Transports render these; no route without a contract ever gets here.

use std::time::Duration;

use super::Invocation;
use super::lease::{LeaseError, LeaseTerms, attempt_in_progress, in_progress, no_generation_left};
use crate::contract::{Envelope, IdempotencyEvidence, Outcome, Retry};
use crate::journal::{Journal, KeyClaim, KeyEntry, KeySlot, State, Whereabouts, rfc3339, unix_ms};

/// A route's idempotency contract, as the lifecycle needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyContract {
    pub scope: String,
    /// The remote's promised deduplication window; the index keeps a key this long after
    /// its last use.
    pub retention: Duration,
    /// How long before the end of `retention` postern stops calling a retry safe.
    pub safe_margin: Duration,
}

/// A request's key and the fingerprint of the request (which never covers the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedRequest {
    pub slot: KeySlot,
    pub fingerprint: String,
}

/// What a request with a known (or unseen) key gets.
pub enum Turn {
    /// The key is unseen (or expired): a new invocation claims it with its preflight.
    Fresh,
    /// The key's invocation is resolved: answer its stored result under its id.
    Replay(Box<State>),
    /// A new generation of the key's invocation, leased and not yet dispatched.
    /// `safe_until_ms` is the window an earlier dispatch of the key opened, if any.
    Leased {
        inv: Box<Invocation>,
        safe_until_ms: Option<i64>,
    },
    /// Answer this envelope of the key's invocation; nothing is sent.
    Refuse(Box<Envelope>),
    /// The key stands for another request: `IDEMPOTENCY_MISMATCH` (the transport records it).
    Mismatch(KeyEntry),
    /// The journal could not be read.
    Unavailable,
}

/// Decides the turn of a keyed request, leasing a new generation when that is the answer.
pub async fn take_turn(
    journal: &Journal,
    request: &KeyedRequest,
    contract: &KeyContract,
    terms: LeaseTerms,
) -> Turn {
    let entry = match journal.find_key(&request.slot).await {
        Ok(Some(e)) => e,
        Ok(None) => return Turn::Fresh,
        Err(_) => return Turn::Unavailable,
    };
    if entry.fingerprint != request.fingerprint {
        return Turn::Mismatch(entry);
    }
    let now = unix_ms(journal.now());
    let state = match journal.locate(&entry.invocation_id).await {
        Ok(Some(Whereabouts::Here(s))) => s,
        Ok(Some(Whereabouts::There { node, state, .. })) => {
            return elsewhere(journal, &entry.invocation_id, &node, state, now, terms).await;
        }
        Ok(None) => return Turn::Fresh,
        Err(_) => return Turn::Unavailable,
    };
    let answer = match answer_without_lease(state.clone(), now, &terms) {
        Some(turn) => turn,
        None => lease(journal, &state, terms).await,
    };
    if matches!(answer, Turn::Replay(_) | Turn::Refuse(_)) {
        // A use moves the key's expiry on; losing that on a crash only shortens it.
        let claim = claim(journal, request, contract, &entry.invocation_id);
        let _ = journal.touch_key(claim).await;
    }
    answer
}

/// `take_turn`, in a fleet by claiming the key for `invocation_id` first: the claim is the
/// lookup (one round trip), so an unseen key costs no read before it. True: the key is
/// claimed (`Claims::reserved`). A key another invocation holds is judged as `take_turn`
/// judges it.
pub async fn reserve_or_take_turn(
    journal: &Journal,
    request: &KeyedRequest,
    contract: &KeyContract,
    invocation_id: &str,
    terms: LeaseTerms,
) -> (Turn, bool) {
    if journal.shared().is_some() {
        let claim = claim(journal, request, contract, invocation_id);
        match journal.reserve_key(invocation_id, &claim).await {
            Ok(Ok(())) => return (Turn::Fresh, true),
            Ok(Err(_held)) => {}
            Err(_) => return (Turn::Unavailable, false),
        }
    }
    (take_turn(journal, request, contract, terms).await, false)
}

/// The key's invocation is held by another node of the fleet (SPEC §7). What that node
/// published, brought up to the shared lease, answers like a local record; a retry that
/// needs a new generation takes it over here (`Invocation::adopt`), if the shared lease
/// lets it. Nothing published yet: in progress there.
async fn elsewhere(
    journal: &Journal,
    id: &str,
    node: &str,
    state: Option<State>,
    now_ms: i64,
    terms: LeaseTerms,
) -> Turn {
    let Some(state) = state else {
        return Turn::Refuse(Box::new(in_progress_on(id, node)));
    };
    match answer_without_lease(state.clone(), now_ms, &terms) {
        Some(Turn::Refuse(env)) => return Turn::Refuse(Box::new(owned_elsewhere(*env, node))),
        Some(turn) => return turn,
        None => {}
    }
    let safe_until_ms = state
        .progress
        .dispatched_ever
        .then_some(state.progress.safe_until_ms)
        .flatten();
    match Invocation::adopt(journal.clone(), state, node, terms).await {
        Ok(inv) => Turn::Leased {
            inv: Box::new(inv),
            safe_until_ms,
        },
        Err(LeaseError::Resolved(s)) => Turn::Replay(s),
        Err(LeaseError::NotFound) => Turn::Refuse(Box::new(in_progress_on(id, node))),
        Err(LeaseError::Refused(env)) => Turn::Refuse(Box::new(owned_elsewhere(*env, node))),
    }
}

/// `ATTEMPT_IN_PROGRESS` for an invocation another node runs and has not settled: it may
/// have dispatched, so nothing here calls it safe to repeat; its result is fetched by id.
pub fn in_progress_on(id: &str, node: &str) -> Envelope {
    let env = super::unrecorded(id, crate::contract::Code::AttemptInProgress, true);
    owned_elsewhere(env, node)
}

/// An answer about another node's invocation, naming that node.
fn owned_elsewhere(mut env: Envelope, node: &str) -> Envelope {
    env.evidence
        .extra
        .insert("node".into(), serde_json::Value::String(node.to_owned()));
    env
}

/// The turns that need no lease: resolved, in progress, or not safe to repeat now. A
/// repeat past the budget goes on to `lease`, which journals `RETRY_BUDGET_EXHAUSTED`
/// (SPEC §1.7: the spent budget, with the last evidence).
fn answer_without_lease(state: State, now_ms: i64, terms: &LeaseTerms) -> Option<Turn> {
    if crate::contract::is_resolved(state.record.outcome) {
        return Some(Turn::Replay(Box::new(state)));
    }
    if in_progress(&state, now_ms, terms.ttl) {
        return Some(Turn::Refuse(Box::new(attempt_in_progress(&state))));
    }
    let spent = state.progress.closed && no_generation_left(&state, terms);
    if spent || retry_allowed(&state, now_ms) {
        return None;
    }
    Some(Turn::Refuse(Box::new(match state.progress.closed {
        true => not_safe_now(&state, now_ms),
        // A lapsed worker nobody may supersede still holds its generation.
        false => attempt_in_progress(&state),
    })))
}

async fn lease(journal: &Journal, state: &State, terms: LeaseTerms) -> Turn {
    let id = &state.record.invocation_id;
    // A key's safe window opened with its first dispatch; none yet: it opens with this one.
    let safe_until_ms = state
        .progress
        .dispatched_ever
        .then_some(state.progress.safe_until_ms)
        .flatten();
    match Invocation::lease(journal.clone(), id, terms).await {
        Ok(inv) => Turn::Leased {
            inv: Box::new(inv),
            safe_until_ms,
        },
        Err(LeaseError::Resolved(s)) => Turn::Replay(s),
        Err(LeaseError::NotFound) => Turn::Fresh,
        Err(LeaseError::Refused(env)) => Turn::Refuse(env),
    }
}

/// SPEC §3.4: nothing was sent (`not_attempted`), or the record says a same-key retry
/// (or, for an idempotent method, any retry) is safe and the key's window is still open.
pub fn retry_allowed(state: &State, now_ms: i64) -> bool {
    let p = &state.progress;
    let r = &state.record;
    match r.outcome {
        Outcome::NotAttempted => true,
        Outcome::Unknown => {
            // A closed generation's retry says what its failure allows (not RESULT_STORE_FAILED
            // or a spent budget, which are `reconcile` whatever the window).
            let allowed =
                !p.closed || matches!(r.retry, Retry::Backoff | Retry::SameIdempotencyKey);
            let window_open = p.safe_until_ms.is_some_and(|s| now_ms < s);
            allowed && (p.idempotent || window_open)
        }
        Outcome::Committed | Outcome::Rejected => false,
    }
}

/// The record's envelope, its retry re-read at `now`: a same-key retry past safe-until
/// is `reconcile`.
fn not_safe_now(state: &State, now_ms: i64) -> Envelope {
    let Some(mut env) = state.record.envelope.clone() else {
        return attempt_in_progress(state);
    };
    let window_open = state.progress.safe_until_ms.is_some_and(|s| now_ms < s);
    if env.error.retry == Retry::SameIdempotencyKey && !window_open {
        env.error.retry = Retry::Reconcile;
    }
    env
}

/// What preflight records for a key: the evidence, its safe-until, and the index claim.
pub struct KeyBinding {
    pub evidence: IdempotencyEvidence,
    pub safe_until_ms: i64,
    pub claim: KeyClaim,
}

/// Binds a key to `invocation_id` at preflight. `kept_safe_until_ms`: the window an earlier
/// dispatch of the key opened; else it opens now (safe-until = first dispatch + retention −
/// safe_margin, and preflight comes before that dispatch, so this never overstates it).
pub fn bind(
    journal: &Journal,
    request: &KeyedRequest,
    contract: &KeyContract,
    invocation_id: &str,
    kept_safe_until_ms: Option<i64>,
) -> KeyBinding {
    let now = journal.now();
    let window = contract.retention.saturating_sub(contract.safe_margin);
    let safe_until_ms = kept_safe_until_ms.unwrap_or(unix_ms(now + window));
    let safe_until =
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(safe_until_ms) * 1_000_000)
            .map(rfc3339)
            .ok();
    KeyBinding {
        evidence: IdempotencyEvidence {
            key: request.slot.key.clone(),
            scope: request.slot.scope.clone(),
            fingerprint: request.fingerprint.clone(),
            remote_contract: "configured".into(),
            safe_until,
        },
        safe_until_ms,
        claim: claim(journal, request, contract, invocation_id),
    }
}

/// The index entry of a key's use now: it lives `retention` from here.
fn claim(
    journal: &Journal,
    request: &KeyedRequest,
    contract: &KeyContract,
    invocation_id: &str,
) -> KeyClaim {
    KeyClaim {
        slot: request.slot.clone(),
        entry: KeyEntry {
            invocation_id: invocation_id.to_owned(),
            fingerprint: request.fingerprint.clone(),
            expires_at_ms: unix_ms(journal.now() + contract.retention),
        },
    }
}
