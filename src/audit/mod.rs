//! The audit export (SPEC §5.8): every journal event leaves postern as an OTLP log record.
//!
//! One batch, in order: `cursor` (the last seq the receiver acknowledged, durable) →
//! `Journal::export` from the seq after it (a page of at most `BATCH` events; a gap left by
//! retention is counted, not waited for) → `otlp` (the page as an `ExportLogsServiceRequest`,
//! only the exported fields) → `receiver` (one POST; a 2xx is the ack, a timeout bounds it)
//! → the cursor moves past the page. A failed POST sends the same batch again after a
//! backoff, so a receiver that acked gets every event once, in seq order; a restart resends
//! at most the batch that was in flight (at-least-once: receivers dedupe by `postern.seq`).
//!
//! The exporter is a task of its own that reads the store: it never holds a request back,
//! and a receiver that is down or never answers only delays the export.

mod cursor;
mod exporter;
mod otlp;
mod receiver;

pub use exporter::{BATCH, Exporter};
pub use otlp::encode;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The export's progress on `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct ExportMetrics {
    /// The last seq the receiver acknowledged.
    pub acked_seq: Gauge,
    /// Events the receiver acknowledged.
    pub events: Counter,
    /// POSTs that got no 2xx (each is retried).
    pub failures: Counter,
    /// Events gone before they were exported: removed by retention, or not decodable.
    pub skipped: Counter,
}

impl ExportMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "postern_audit_export_acked_seq",
            "the last journal seq the OTLP receiver acknowledged",
            self.acked_seq.clone(),
        );
        let counters = [
            (
                "postern_audit_export_events",
                "journal events the OTLP receiver acknowledged",
                &self.events,
            ),
            (
                "postern_audit_export_failures",
                "audit export requests that got no 2xx (each is retried)",
                &self.failures,
            ),
            (
                "postern_audit_export_skipped",
                "journal events removed by retention (or undecodable) before they were exported",
                &self.skipped,
            ),
        ];
        for (name, help, counter) in counters {
            registry.register(name, help, counter.clone());
        }
    }
}
