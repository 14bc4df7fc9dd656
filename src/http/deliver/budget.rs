//! The buffer budget: one byte semaphore shared by request bodies buffered before
//! dispatch (the fingerprint needs the whole body) and responses buffered for delivery,
//! so the memory postern holds for bodies stays under `[proxy] buffer_budget` however
//! many agents upload at once or stop reading.
//!
//! A reservation is held until the bytes it covers are released: a request body's once
//! it was handed to the origin, a buffered response's once its delivery ended.
//!
//! Request bodies also take from their agent's share (`agent_buffer_budget`), so one agent
//! uploading slowly on many connections cannot hold the whole budget (issue 40).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admin::metrics::FrontMetrics;

/// The shared budget and its metrics.
#[derive(Debug)]
pub struct Budget {
    bytes: Arc<Semaphore>,
    /// Each agent's share of `bytes`, made on its first upload (agents are the config's).
    shares: Mutex<HashMap<String, Arc<Semaphore>>>,
    share: usize,
    /// How long a request body waits for bytes before it is refused.
    pub wait: Duration,
    in_use: Gauge,
    pub refused: Counter,
    pub streamed: Counter,
}

/// Bytes taken from the budget; given back on drop.
#[derive(Debug, Default)]
pub struct Reservation {
    permit: Option<OwnedSemaphorePermit>,
    /// The same bytes, from the agent's share (request bodies only).
    share: Option<OwnedSemaphorePermit>,
    gauge: Option<Gauge>,
}

/// What ran out when a request body got no budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhausted {
    /// The agent's own share: its other uploads hold it.
    AgentShare,
    /// The budget all agents share.
    Budget,
}

impl Reservation {
    /// Folds `other` into this reservation (both come from the one budget).
    pub fn merge(&mut self, mut other: Reservation) {
        if let Some(s) = other.share.take() {
            match &mut self.share {
                Some(mine) => mine.merge(s),
                None => self.share = Some(s),
            }
        }
        let Some(p) = other.permit.take() else { return };
        match &mut self.permit {
            Some(mine) => mine.merge(p),
            None => {
                self.permit = Some(p);
                self.gauge = other.gauge.take();
            }
        }
    }

    pub fn bytes(&self) -> u64 {
        self.permit.as_ref().map_or(0, |p| p.num_permits() as u64)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.dec_by(self.bytes() as i64);
        }
    }
}

impl Budget {
    pub fn new(total: u64, share: u64, wait: Duration, metrics: &FrontMetrics) -> Self {
        let permits = |n: u64| {
            usize::try_from(n)
                .unwrap_or(usize::MAX)
                .min(Semaphore::MAX_PERMITS)
        };
        Self {
            bytes: Arc::new(Semaphore::new(permits(total))),
            shares: Mutex::default(),
            share: permits(share),
            wait,
            in_use: metrics.budget_in_use.clone(),
            refused: metrics.budget_refusals.clone(),
            streamed: metrics.budget_streamed.clone(),
        }
    }

    fn taken(&self, permit: OwnedSemaphorePermit) -> Reservation {
        self.in_use.inc_by(permit.num_permits() as i64);
        Reservation {
            permit: Some(permit),
            share: None,
            gauge: Some(self.in_use.clone()),
        }
    }

    fn share_of(&self, agent: &str) -> Arc<Semaphore> {
        let mut shares = match self.shares.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        shares
            .entry(agent.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
            .clone()
    }

    /// Waits up to `wait` for `n` bytes of `agent`'s share and of the whole budget.
    pub async fn reserve(&self, agent: &str, n: u64) -> Result<Reservation, Exhausted> {
        let n = u32::try_from(n).map_err(|_| Exhausted::AgentShare)?;
        let deadline = tokio::time::Instant::now() + self.wait;
        let share = self.share_of(agent).acquire_many_owned(n);
        let share = match tokio::time::timeout_at(deadline, share).await {
            Ok(Ok(permit)) => permit,
            _ => return Err(Exhausted::AgentShare),
        };
        let whole = self.bytes.clone().acquire_many_owned(n);
        match tokio::time::timeout_at(deadline, whole).await {
            Ok(Ok(permit)) => {
                let mut r = self.taken(permit);
                r.share = Some(share);
                Ok(r)
            }
            _ => Err(Exhausted::Budget),
        }
    }

    /// Takes `n` bytes only if they are free now.
    pub fn try_reserve(&self, n: u64) -> Option<Reservation> {
        let n = u32::try_from(n).ok()?;
        let permit = self.bytes.clone().try_acquire_many_owned(n).ok()?;
        Some(self.taken(permit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_come_back_when_dropped_and_the_budget_never_overcommits() {
        let metrics = FrontMetrics::default();
        let budget = Budget::new(100, 100, Duration::from_millis(10), &metrics);
        let mut held = budget.try_reserve(60).unwrap_or_default();
        assert_eq!(held.bytes(), 60);
        assert!(budget.try_reserve(50).is_none());
        assert_eq!(
            budget.reserve("a", 50).await.err(),
            Some(Exhausted::Budget),
            "waits, then gives up"
        );
        held.merge(budget.try_reserve(40).unwrap_or_default());
        assert_eq!((held.bytes(), metrics.budget_in_use.get()), (100, 100));
        drop(held);
        assert_eq!(metrics.budget_in_use.get(), 0);
        assert!(budget.reserve("a", 100).await.is_ok());
    }

    #[tokio::test]
    async fn one_agent_holds_at_most_its_share_and_others_still_get_budget() {
        let metrics = FrontMetrics::default();
        let budget = Budget::new(100, 40, Duration::from_millis(10), &metrics);
        let mut hog = budget.reserve("hog", 30).await.unwrap_or_default();
        assert_eq!(
            budget.reserve("hog", 20).await.err(),
            Some(Exhausted::AgentShare)
        );
        hog.merge(budget.reserve("hog", 10).await.unwrap_or_default());
        assert_eq!(hog.bytes(), 40);
        assert!(budget.reserve("other", 40).await.is_ok());
        drop(hog);
        assert!(
            budget.reserve("hog", 40).await.is_ok(),
            "the share came back"
        );
    }
}
