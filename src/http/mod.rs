//! The HTTP(S) proxy: what is specific to HTTP around the shared invocation lifecycle
//! (`crate::lifecycle`).
//!
//! A request's path: `front` (absolute-form or `CONNECT` + `mitm` TLS, agent identity) →
//! `drive`: validate and route (before DNS or secrets), `intake` the body, preflight,
//! `approval` → `upstream` connection setup (through the route's `via` hop, if any) or a
//! `pool`ed connection → `dispatch`:
//! `DISPATCH_STARTED` durable, request written (`tap`/`body` observe it) → `receive`:
//! head classified, body to its framing end (or `stream`ed; a `grpc` call to its trailers),
//! `guard`ed, `RESULT_COMMITTED` with the result → delivery (`RESULT_DELIVERED` once the
//! agent's connection `flushed` the response's end). A `CONNECT` on an `intercept = false`
//! route is a `tunnel` instead: one invocation whose bytes are relayed unread. Invariant: no request byte reaches the origin
//! before `DISPATCH_STARTED` is durable.
mod approval;
mod body;
pub mod budget;
pub mod busy;
mod decode;
mod dispatch;
mod drive;
mod exchange;
mod flushed;
mod front;
mod grpc;
mod headers;
mod inject;
mod intake;
mod internal;
mod keyed;
pub mod mitm;
mod outgoing;
mod pool;
mod receive;
mod relay;
pub mod respond;
pub mod retry;
mod sniff;
mod stream;
mod tap;
mod tunnel;
mod twin;
mod upgrade;
pub mod upstream;
mod wire;
mod wsframe;

use std::sync::Arc;

use crate::admin::metrics::FrontMetrics;
use crate::config::Config;
use crate::journal::Journal;

pub use drive::handle_leased;
pub use exchange::Inbound;
pub use front::serve;
pub use keyed::POSTERN_REPLAYED;

/// Everything a request needs on its way through postern.
pub struct Proxy {
    /// The config in force; an exchange keeps the snapshot it started with.
    pub live: Arc<crate::config::Live>,
    pub journal: Journal,
    pub authority: Arc<mitm::Authority>,
    pub tls: upstream::TlsClients,
    pub dns: Arc<crate::dns::Dns>,
    pub pool: pool::Pool,
    pub vault: Arc<crate::vault::Vault>,
    pub metrics: FrontMetrics,
    /// Requests held on `approval = "required"` routes, shared with the admin API.
    pub approvals: Arc<crate::policy::approvals::Approvals>,
    /// Wrong-token refusals journaled per source address (bounded).
    pub failed_logins: crate::lifecycle::refusals::RefusalRate,
    /// Refusals before any route (ROUTE_DENIED, INVALID_TARGET, …) journaled per agent.
    pub refusals: crate::lifecycle::refusals::RefusalRate,
    /// Reflection guards, one per credential version.
    pub guards: crate::guard::GuardCache,
    /// Memory for buffered bodies, shared by requests and responses.
    pub budget: budget::Budget,
    /// Connections each agent keeps busy (requests, tunnels, WebSockets).
    pub busy: Arc<crate::listen::BusyPerAgent>,
}

impl Proxy {
    /// The config in force now (a snapshot: a reload after this does not change it).
    pub fn config(&self) -> Arc<Config> {
        self.live.current()
    }

    /// After a reload: upstream TLS settings and idle connections were made for the old
    /// routes (their `upstream_ca`, `resolve`, `via`), so the next request builds anew.
    pub fn forget_upstreams(&self) {
        self.tls.forget();
        self.pool.forget();
    }
}
