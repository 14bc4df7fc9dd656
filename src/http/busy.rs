//! How many connections each agent keeps busy at once (requests running, tunnels and
//! WebSockets open), bounded by `[proxy] max_busy_per_agent` (default: a quarter of the
//! connection cap). Idle connections make room at the cap; busy ones cannot, so without a
//! bound one agent could keep every connection postern has busy and lock the others out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http::{HeaderValue, Response, header};
use prometheus_client::metrics::gauge::Gauge;

use super::respond::{self, ProxyBody};
use crate::contract::{Code, Envelope, unjournaled_refusal};
use crate::journal::Failure;
use crate::lifecycle::Invocation;

pub struct BusyPerAgent {
    limit: usize,
    held: Mutex<HashMap<String, usize>>,
    /// All agents' busy connections now.
    open: Gauge,
}

/// One busy connection of one agent; dropping it frees the place.
pub struct Busy {
    busy: Arc<BusyPerAgent>,
    agent: String,
}

impl BusyPerAgent {
    pub fn new(limit: usize, open: Gauge) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(1),
            held: Mutex::default(),
            open,
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A place for one more busy connection of `agent`, or `None` at its limit.
    pub fn hold(self: &Arc<Self>, agent: &str) -> Option<Busy> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(agent.to_owned()).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        self.open.inc();
        Some(Busy {
            busy: self.clone(),
            agent: agent.to_owned(),
        })
    }
}

/// Records the refusal of a tunnel or WebSocket over the agent's limit: nothing was
/// connected. The code
/// is the one for a capacity postern ran out of (`JOURNAL_UNAVAILABLE`, `backoff`), its
/// message names the limit.
pub async fn refuse(inv: &mut Invocation, limit: usize) -> Envelope {
    let mut failure = Failure::of(Code::JournalUnavailable);
    failure.field = Some("agent".into());
    failure
        .evidence
        .insert("reason".into(), "max_busy_per_agent".into());
    let mut env = inv.fail(vec![], failure).await;
    env.error.message = over_limit(limit);
    env
}

/// A request over the agent's limit, refused before it becomes an invocation (so a flood
/// of them writes nothing): `503`, `Retry-After: 1`, the capacity code and the limit.
pub fn over_limit_answer(limit: usize) -> Response<ProxyBody> {
    let mut env = unjournaled_refusal(Code::JournalUnavailable, "agent");
    env.error.message = over_limit(limit);
    let mut resp = respond::envelope(&env);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// What an agent over its limit is told.
pub fn over_limit(limit: usize) -> String {
    format!(
        "This agent already keeps {limit} connections busy (requests running, tunnels and WebSockets open), the most [proxy] max_busy_per_agent allows; let one finish, or retry later."
    )
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.busy.open.dec();
        let mut held = self.busy.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.agent);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_agent_keeps_at_most_the_limit_busy_and_a_dropped_hold_frees_its_place() {
        let busy = BusyPerAgent::new(2, Gauge::default());
        let a1 = busy.hold("a");
        let a2 = busy.hold("a");
        assert!(a1.is_some() && a2.is_some());
        assert!(busy.hold("a").is_none(), "a third for the same agent");
        assert!(busy.hold("b").is_some(), "another agent has its own");
        drop(a1);
        assert!(busy.hold("a").is_some());
    }
}
