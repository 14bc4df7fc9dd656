//! Resends (SPEC §3.7): a request an agent sends again, on the same route with the same
//! fingerprint, while an earlier invocation (its *twin*) is in the twin index. Vendor SDKs
//! resend on their own after a timeout or a connection error; what the resend gets is
//! decided here from the twin's record alone (pure: the time is passed in), so an action
//! that may have happened is not sent a second time behind the agent's back.
//!
//! Not resend-checked (the transport skips the lookup): a method idempotent on the route,
//! a request carrying the route's idempotency key header (§3.4 decides), a route with
//! `resend_window = "0s"`, a leased generation, SSH execs. `Postern-Resend: deliberate`
//! makes a new invocation whatever the twin.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::contract::Outcome;
use crate::journal::{State, TwinRef};

use super::idempotency::retry_allowed;

/// What an identical resend gets, by its twin's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing stands in the way (`not_attempted`, or resolved and delivered): a new
    /// invocation, which becomes the twin of later resends.
    New,
    /// The twin still runs and its agent still waits: a parallel request, a new invocation.
    Parallel,
    /// The twin still runs and its agent left (`CALLER_CANCELLED`): `ATTEMPT_IN_PROGRESS`
    /// for the twin, `Retry-After: 1`, nothing sent.
    InProgress,
    /// The twin is `unknown` with an idempotency key still before its safe-until: a
    /// same-key retry, a new generation of the twin (`RETRY_LEASED`).
    SameKey,
    /// The twin is resolved but its agent never got the answer: its stored result is the
    /// answer (`RESEND_REFUSED` when no result is stored).
    Replay,
    /// `RESEND_REFUSED`: the twin may have run and nothing proves a repeat is safe.
    Refuse,
}

impl Verdict {
    /// The resend goes out as a new invocation.
    pub fn dispatches_anew(self) -> bool {
        matches!(self, Verdict::New | Verdict::Parallel)
    }
}

/// SPEC §3.7 by the twin's state. `keyed_route`: the route still has an idempotency
/// contract (a same-key retry sends the key only then).
pub fn judge(twin: &State, now_ms: i64, keyed_route: bool) -> Verdict {
    let r = &twin.record;
    if !twin.progress.closed {
        return running(twin);
    }
    match r.outcome {
        Outcome::NotAttempted => Verdict::New,
        Outcome::Unknown => {
            let keyed = r.evidence.idempotency.is_some() && keyed_route;
            match keyed && retry_allowed(twin, now_ms) {
                true => Verdict::SameKey,
                false => Verdict::Refuse,
            }
        }
        Outcome::Committed | Outcome::Rejected => resolved(twin),
    }
}

/// `judge` for a twin whose agent left a moment ago (`Departures`), before its record says
/// so: not a parallel request, since nobody waits for the twin. Only while the twin is
/// awaited: one resolved and being delivered has its answer, and an agent that read it and
/// closed (`Connection: close`) did not leave anything behind.
pub fn judge_departed(twin: &State, now_ms: i64, keyed_route: bool) -> Verdict {
    match judge(twin, now_ms, keyed_route) {
        Verdict::Parallel if departure_matters(twin) => Verdict::InProgress,
        v => v,
    }
}

/// Whether the twin's agent leaving could change a resend's verdict: only while the twin is
/// awaited. One nobody awaits (resolved, a retry, cancelled) stays so, so a transport need
/// not wait to learn of a departure.
pub fn departure_matters(twin: &State) -> bool {
    twin.awaited()
}

/// A generation still appends: its agent waits, or left while the exchange runs on. A
/// retry of the twin (a later generation) is in progress whoever waits for it: an earlier
/// generation may have run, so a parallel request would repeat it.
fn running(twin: &State) -> Verdict {
    if twin.awaited() {
        return Verdict::Parallel;
    }
    if !crate::contract::is_resolved(twin.record.outcome) {
        return Verdict::InProgress;
    }
    // Resolved, its delivery still running: a 5xx the agent has seen in full is what an
    // SDK resends at once.
    match committed_5xx(twin) {
        true => Verdict::Refuse,
        false => Verdict::Parallel,
    }
}

/// `committed` with a 5xx (the application may have acted before it failed, §1.5) is
/// refused; an answer the agent never got is replayed; one it got leaves it free.
fn resolved(twin: &State) -> Verdict {
    if committed_5xx(twin) {
        Verdict::Refuse
    } else if !twin.progress.delivered {
        Verdict::Replay
    } else {
        Verdict::New
    }
}

fn committed_5xx(twin: &State) -> bool {
    let status = twin.record.result.as_ref().and_then(|r| r.status);
    twin.record.outcome == Outcome::Committed && status.is_some_and(|s| s >= 500)
}

/// Invocations whose agent left a moment ago, while their `CALLER_CANCELLED` is being
/// journaled: a resend judged meanwhile must not read the twin as still awaited (an SDK
/// resends at once after it closes). Marked before the write, cleared after it.
///
/// Where a twin's agent holds a connection of its own (HTTP/1), its `Line` asks the kernel
/// instead: a closed connection shows there before any task noticed it.
#[derive(Default)]
pub struct Departures {
    leaving: Mutex<HashSet<String>>,
    lines: Arc<Mutex<HashMap<String, Arc<dyn Line>>>>,
}

/// The connection an invocation's agent waits on, asked directly.
pub trait Line: Send + Sync {
    /// The agent closed or reset it (true also once it is gone).
    fn hung_up(&self) -> bool;
}

/// An invocation's line, listed until the exchange holding it is dropped.
pub struct Watched {
    lines: Arc<Mutex<HashMap<String, Arc<dyn Line>>>>,
    id: String,
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Ok(mut l) = self.lines.lock() {
            l.remove(&self.id);
        }
    }
}

/// A departure marked until it is dropped (its `CALLER_CANCELLED` written, or the
/// exchange gone): the set never keeps an entry past its exchange.
pub struct Departing<'a> {
    departures: &'a Departures,
    id: String,
}

impl Drop for Departing<'_> {
    fn drop(&mut self) {
        if let Ok(mut l) = self.departures.leaving.lock() {
            l.remove(&self.id);
        }
    }
}

impl Departures {
    pub fn mark(&self, invocation_id: &str) -> Departing<'_> {
        if let Ok(mut l) = self.leaving.lock() {
            l.insert(invocation_id.to_owned());
        }
        Departing {
            departures: self,
            id: invocation_id.to_owned(),
        }
    }

    /// Lists the line `invocation_id`'s agent waits on.
    pub fn watch(&self, invocation_id: &str, line: Arc<dyn Line>) -> Watched {
        if let Ok(mut l) = self.lines.lock() {
            l.insert(invocation_id.to_owned(), line);
        }
        Watched {
            lines: self.lines.clone(),
            id: invocation_id.to_owned(),
        }
    }

    /// The agent left: marked, or its line hung up.
    pub fn left(&self, invocation_id: &str) -> bool {
        let marked = self
            .leaving
            .lock()
            .map(|l| l.contains(invocation_id))
            .unwrap_or(false);
        marked || self.line(invocation_id).is_some_and(|l| l.hung_up())
    }

    /// Whether the agent's line can be asked: then `left` is already the whole truth, and a
    /// judge need not wait for a task to notice a close.
    pub fn watched(&self, invocation_id: &str) -> bool {
        self.line(invocation_id).is_some()
    }

    fn line(&self, invocation_id: &str) -> Option<Arc<dyn Line>> {
        self.lines.lock().ok()?.get(invocation_id).cloned()
    }
}

/// The twin as a resend's evidence names it (`resend_of`).
pub fn twin_ref(twin: &State) -> TwinRef {
    TwinRef {
        invocation_id: twin.record.invocation_id.clone(),
        code: twin.record.code,
        outcome: twin.record.outcome,
    }
}

#[cfg(test)]
#[path = "twin/tests.rs"]
mod tests;
