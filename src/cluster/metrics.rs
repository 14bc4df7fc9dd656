//! Per shared operation: latency and failures (`postern_cluster_*`).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: String,
}

/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct ClusterMetrics {
    pub seconds: Family<OpLabels, Histogram>,
    pub failures: Family<OpLabels, Counter>,
    /// Directory publications dropped because the queue was full (the store was away).
    pub dropped: Counter,
    pub reachable: Gauge,
}

impl Default for ClusterMetrics {
    fn default() -> Self {
        Self {
            seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
            }),
            failures: Family::default(),
            dropped: Counter::default(),
            reachable: Gauge::default(),
        }
    }
}

impl ClusterMetrics {
    pub fn observe(&self, op: &str, took: Duration, ok: bool) {
        let labels = OpLabels { op: op.to_owned() };
        self.seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if !ok {
            self.failures.get_or_create(&labels).inc();
        }
        self.reachable.set(i64::from(ok));
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "postern_cluster_operation_seconds",
            "Latency of each shared operation on the cluster store",
            self.seconds.clone(),
        );
        registry.register(
            "postern_cluster_operation_failures",
            "Shared operations that failed or timed out",
            self.failures.clone(),
        );
        registry.register(
            "postern_cluster_publications_dropped",
            "Directory publications dropped while the cluster store was away",
            self.dropped.clone(),
        );
        registry.register(
            "postern_cluster_reachable",
            "1 while the cluster store answered its last call",
            self.reachable.clone(),
        );
    }
}
