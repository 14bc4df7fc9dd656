//! The Prometheus registry: journal metrics plus front-end counters.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
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
    /// Refusals before any route past an agent's journaling rate: refused, not journaled.
    pub refusals_unjournaled: Counter,
    /// Refusals inside SSH sessions past an agent's journaling rate: refused, not journaled.
    pub ssh_refusals_unjournaled: Counter,
    /// Agent connections refused at `[proxy] max_connections`.
    pub proxy_refused: Counter,
    /// Admin connections refused at `[admin] max_connections`.
    pub admin_refused: Counter,
    /// Admin API requests and console sign-ins with a missing or wrong admin token: a
    /// guesser shows here (it is not logged per request, which would let it flood the log).
    pub admin_auth_failures: Counter,
    /// Failed `accept` calls on either listener (EMFILE, ENFILE…).
    pub accept_errors: Counter,
    /// Intercepted tunnels closed for `[proxy] tls_handshake_timeout`.
    pub tls_handshake_timeouts: Counter,
    /// Requests refused because the buffer budget stayed exhausted.
    pub budget_refusals: Counter,
    /// Responses streamed instead of buffered because the budget was exhausted.
    pub budget_streamed: Counter,
    /// Bytes currently reserved from `[proxy] buffer_budget`.
    pub budget_in_use: Gauge,
    /// Agent connections open on the proxy listener (tunnels included).
    pub proxy_open: Gauge,
    /// Connections agents keep busy: requests running, tunnels and WebSockets open (each
    /// agent's bounded by `max_busy_per_agent`).
    pub busy: Gauge,
}

/// Builds the registry served at `/metrics`.
pub fn registry(
    journal: &JournalMetrics,
    front: &FrontMetrics,
    reloads: &super::reload::ReloadCounter,
) -> Registry {
    let mut registry = Registry::default();
    journal.register(&mut registry);
    registry.register(
        "postern_config_reloads",
        "config reloads, by result (applied, refused)",
        reloads.clone(),
    );
    let counters = [
        (
            "postern_proxy_auth_challenges",
            "407 challenges answered to requests without Proxy-Authorization",
            &front.auth_challenges,
        ),
        (
            "postern_proxy_connections_refused",
            "agent connections refused at [proxy] max_connections",
            &front.proxy_refused,
        ),
        (
            "postern_admin_connections_refused",
            "admin connections refused at [admin] max_connections",
            &front.admin_refused,
        ),
        (
            "postern_admin_auth_failures",
            "admin API requests and console sign-ins with a missing or wrong admin token",
            &front.admin_auth_failures,
        ),
        (
            "postern_accept_errors",
            "failed accept calls on the proxy and admin listeners",
            &front.accept_errors,
        ),
        (
            "postern_proxy_tls_handshake_timeouts",
            "intercepted tunnels closed without a TLS handshake in time",
            &front.tls_handshake_timeouts,
        ),
        (
            "postern_buffer_budget_refusals",
            "requests refused because the buffer budget was exhausted",
            &front.budget_refusals,
        ),
        (
            "postern_buffer_budget_streamed",
            "responses streamed because the buffer budget was exhausted",
            &front.budget_streamed,
        ),
        (
            "postern_proxy_auth_failures",
            "requests refused for a wrong Proxy-Authorization",
            &front.auth_failures,
        ),
        (
            "postern_proxy_auth_failures_unjournaled",
            "wrong-token refusals past the per-source journaling rate (not journaled)",
            &front.auth_failures_unjournaled,
        ),
        (
            "postern_proxy_refusals_unjournaled",
            "refusals before any route past the per-agent journaling rate (not journaled)",
            &front.refusals_unjournaled,
        ),
        (
            "postern_ssh_refusals_unjournaled",
            "refusals inside SSH sessions past the per-agent journaling rate (not journaled)",
            &front.ssh_refusals_unjournaled,
        ),
    ];
    for (name, help, counter) in counters {
        registry.register(name, help, counter.clone());
    }
    let gauges = [
        (
            "postern_buffer_budget_bytes_in_use",
            "bytes reserved from [proxy] buffer_budget",
            &front.budget_in_use,
        ),
        (
            "postern_proxy_connections_open",
            "agent connections open on the proxy listener, tunnels included",
            &front.proxy_open,
        ),
        (
            "postern_agent_busy_connections",
            "connections agents keep busy: requests running, tunnels and WebSockets open",
            &front.busy,
        ),
    ];
    for (name, help, gauge) in gauges {
        registry.register(name, help, gauge.clone());
    }
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
