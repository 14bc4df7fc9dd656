//! The buffer budget: one byte semaphore shared by request bodies buffered before
//! dispatch (the fingerprint needs the whole body) and responses buffered for delivery,
//! so the memory postern holds for bodies stays under `[proxy] buffer_budget` however
//! many agents upload at once or stop reading.
//!
//! A reservation is held until the bytes it covers are released: a request body's once
//! it was handed to the origin, a buffered response's once its delivery ended.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admin::metrics::FrontMetrics;

/// The shared budget and its metrics.
#[derive(Debug)]
pub struct Budget {
    bytes: Arc<Semaphore>,
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
    gauge: Option<Gauge>,
}

impl Reservation {
    /// Folds `other` into this reservation (both come from the one budget).
    pub fn merge(&mut self, mut other: Reservation) {
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
    pub fn new(total: u64, wait: Duration, metrics: &FrontMetrics) -> Self {
        let total = usize::try_from(total)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Self {
            bytes: Arc::new(Semaphore::new(total)),
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
            gauge: Some(self.in_use.clone()),
        }
    }

    /// Waits up to `wait` for `n` bytes; `None` when they did not free up in time.
    pub async fn reserve(&self, n: u64) -> Option<Reservation> {
        let n = u32::try_from(n).ok()?;
        let acquire = self.bytes.clone().acquire_many_owned(n);
        match tokio::time::timeout(self.wait, acquire).await {
            Ok(Ok(permit)) => Some(self.taken(permit)),
            _ => None,
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
        let budget = Budget::new(100, Duration::from_millis(10), &metrics);
        let mut held = budget.try_reserve(60).unwrap_or_default();
        assert_eq!(held.bytes(), 60);
        assert!(budget.try_reserve(50).is_none());
        assert!(budget.reserve(50).await.is_none(), "waits, then gives up");
        held.merge(budget.try_reserve(40).unwrap_or_default());
        assert_eq!((held.bytes(), metrics.budget_in_use.get()), (100, 100));
        drop(held);
        assert_eq!(metrics.budget_in_use.get(), 0);
        assert!(budget.reserve(100).await.is_some());
    }
}
