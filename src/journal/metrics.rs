//! Journal metrics; `admin::metrics` registers them.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::projection::Record;
use super::store::IndexEntries;

/// Labels of a settled invocation: phase and outcome kept apart, and its route (or SSH
/// target; "" for a request no route took): as many values as the config has routes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SettledLabels {
    pub route: String,
    pub phase: String,
    pub outcome: String,
    pub code: String,
}

/// Cheap to clone: every field is an `Arc` inside.
#[derive(Clone, Debug)]
pub struct JournalMetrics {
    pub events: Counter,
    pub syncs: Counter,
    pub sync_seconds: Histogram,
    pub invocations: Family<SettledLabels, Counter>,
    /// Requests refused without a record while the journal refused new work (low disk).
    pub unrecorded_refusals: Counter,
    /// Events removed by retention cuts.
    pub pruned: Counter,
    /// Entries the idempotency key index holds (expired ones until swept).
    pub index_keys: Gauge,
    /// Entries the resend twin index holds (expired ones until swept).
    pub index_twins: Gauge,
}

impl Default for JournalMetrics {
    fn default() -> Self {
        Self {
            events: Counter::default(),
            syncs: Counter::default(),
            sync_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            invocations: Family::default(),
            unrecorded_refusals: Counter::default(),
            pruned: Counter::default(),
            index_keys: Gauge::default(),
            index_twins: Gauge::default(),
        }
    }
}

impl JournalMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "postern_journal_events",
            "Events appended to the journal",
            self.events.clone(),
        );
        registry.register(
            "postern_journal_syncs",
            "Journal fdatasync calls (group commits that waited for a sync)",
            self.syncs.clone(),
        );
        registry.register(
            "postern_journal_sync_seconds",
            "Duration of journal syncs",
            self.sync_seconds.clone(),
        );
        registry.register(
            "postern_invocations",
            "Invocations settled, by route, phase, outcome and code",
            self.invocations.clone(),
        );
        registry.register(
            "postern_journal_refusals_unrecorded",
            "Requests refused without a journal record because the journal refused new work (low disk space or a storage fault)",
            self.unrecorded_refusals.clone(),
        );
        registry.register(
            "postern_journal_events_pruned",
            "Events removed by journal.event_retention, behind a checkpoint",
            self.pruned.clone(),
        );
        registry.register(
            "postern_journal_idempotency_keys",
            "Entries in the idempotency key index, expired ones until the sweep removes them",
            self.index_keys.clone(),
        );
        registry.register(
            "postern_journal_resend_twins",
            "Entries in the resend twin index, expired ones until the sweep removes them",
            self.index_twins.clone(),
        );
    }

    pub fn indexed(&self, held: IndexEntries) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.index_keys.set(gauge(held.keys));
        self.index_twins.set(gauge(held.twins));
    }

    pub fn pruned(&self, n: u64) {
        self.pruned.inc_by(n);
    }

    pub fn appended(&self, n: usize) {
        self.events.inc_by(n as u64);
    }

    pub fn synced(&self, took: Duration) {
        self.syncs.inc();
        self.sync_seconds.observe(took.as_secs_f64());
    }

    pub fn settled(&self, record: &Record) {
        let labels = SettledLabels {
            route: record.route.clone().unwrap_or_default(),
            phase: record.phase.as_str().to_owned(),
            outcome: record.outcome.as_str().to_owned(),
            code: record.code.map_or("none", |c| c.as_str()).to_owned(),
        };
        self.invocations.get_or_create(&labels).inc();
    }
}
