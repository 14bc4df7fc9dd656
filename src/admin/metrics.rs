//! The Prometheus registry: journal metrics plus front-end counters.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::journal::JournalMetrics;

/// Front-end counters that are not journal events.
#[derive(Clone, Debug, Default)]
pub struct FrontMetrics {
    /// `407` challenges to requests that carried no `Proxy-Authorization` (not journaled).
    pub auth_challenges: Counter,
}

/// Builds the registry served at `/metrics`.
pub fn registry(journal: &JournalMetrics, front: &FrontMetrics) -> Registry {
    let mut registry = Registry::default();
    journal.register(&mut registry);
    registry.register(
        "postern_proxy_auth_challenges",
        "407 challenges answered to requests without Proxy-Authorization",
        front.auth_challenges.clone(),
    );
    registry
}

/// Prometheus text exposition.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}
