//! The Prometheus registry: journal metrics plus front-end counters.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::journal::JournalMetrics;

/// Front-end counters that are not journal events.
#[derive(Clone, Debug, Default)]
pub struct FrontMetrics {
    /// `407` challenges to requests that carried no `Proxy-Authorization` (not journaled).
    pub auth_challenges: Counter,
    /// Requests with a wrong `Proxy-Authorization` (journaled or not).
    pub auth_failures: Counter,
    /// Of those, the ones past the per-source journaling rate: refused, not journaled.
    pub auth_failures_unjournaled: Counter,
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
    registry.register(
        "postern_proxy_auth_failures",
        "requests refused for a wrong Proxy-Authorization",
        front.auth_failures.clone(),
    );
    registry.register(
        "postern_proxy_auth_failures_unjournaled",
        "wrong-token refusals past the per-source journaling rate (not journaled)",
        front.auth_failures_unjournaled.clone(),
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
