//! How many relays (tunnels, WebSockets) each agent holds open at once, bounded by
//! `[proxy] max_relays_per_agent` (default: a quarter of the connection cap): a relay lives
//! as long as its peers keep it busy, so without a bound one agent could hold every
//! connection postern has and lock the others out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::gauge::Gauge;

use crate::contract::{Code, Envelope};
use crate::journal::Failure;
use crate::lifecycle::Invocation;

pub struct Relays {
    limit: usize,
    held: Mutex<HashMap<String, usize>>,
    /// All agents' relays open now.
    open: Gauge,
}

/// One relay of one agent; dropping it frees the place.
pub struct RelayHold {
    relays: Arc<Relays>,
    agent: String,
}

impl Relays {
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

    /// A place for one more relay of `agent`, or `None` at its limit.
    pub fn hold(self: &Arc<Self>, agent: &str) -> Option<RelayHold> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(agent.to_owned()).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        self.open.inc();
        Some(RelayHold {
            relays: self.clone(),
            agent: agent.to_owned(),
        })
    }
}

/// Records the refusal of a relay over the agent's limit: nothing was connected. The code
/// is the one for a capacity postern ran out of (`JOURNAL_UNAVAILABLE`, `backoff`), its
/// message names the limit.
pub async fn refuse(inv: &mut Invocation, limit: usize) -> Envelope {
    let mut failure = Failure::of(Code::JournalUnavailable);
    failure.field = Some("agent".into());
    failure
        .evidence
        .insert("reason".into(), "max_relays_per_agent".into());
    let mut env = inv.fail(vec![], failure).await;
    env.error.message = format!(
        "This agent already holds {limit} tunnels and WebSockets open, the most [proxy] max_relays_per_agent allows; close one, or retry later."
    );
    env
}

impl Drop for RelayHold {
    fn drop(&mut self) {
        self.relays.open.dec();
        let mut held = self.relays.held.lock().unwrap_or_else(|p| p.into_inner());
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
    fn each_agent_holds_at_most_the_limit_and_a_dropped_hold_frees_its_place() {
        let relays = Relays::new(2, Gauge::default());
        let a1 = relays.hold("a");
        let a2 = relays.hold("a");
        assert!(a1.is_some() && a2.is_some());
        assert!(relays.hold("a").is_none(), "a third for the same agent");
        assert!(relays.hold("b").is_some(), "another agent has its own");
        drop(a1);
        assert!(relays.hold("a").is_some());
    }
}
