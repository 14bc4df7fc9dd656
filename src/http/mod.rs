//! The HTTP(S) proxy: what is specific to HTTP around the shared invocation lifecycle
//! (`crate::lifecycle`). Its rooms, in the order a request goes down them:
//!
//! - `agent`: the listener, identity, `CONNECT` + TLS interception → hands an `Inbound` on;
//! - `exchange`: validate and route (before DNS or secrets), the body, keys, resends,
//!   approval, preflight — or a `tunnel` / WebSocket `upgrade` instead;
//! - `origin`: connect (through a `via` hop) or a pooled connection, `DISPATCH_STARTED`
//!   durable, the request written, the response read, guarded and `RESULT_COMMITTED`;
//! - `deliver`: what goes back to the agent, buffered or streamed, `RESULT_DELIVERED`
//!   once the agent's connection flushed its end;
//! - under them, shared: `relay` (bytes both ways after a handover) and `message`
//!   (header rules, postern's own answers, content codings, gRPC framing).
//!
//! A room imports only rooms below it; `Proxy` and `Exchange`, which all of them carry,
//! live here. Invariant: no request byte reaches the origin before `DISPATCH_STARTED` is
//! durable.
pub mod agent;
pub mod deliver;
pub mod exchange;
pub mod message;
pub mod origin;
pub mod relay;

use std::sync::Arc;

use http::{HeaderName, HeaderValue, Request};
use hyper::body::Incoming;

use crate::admin::metrics::FrontMetrics;
use crate::config::Config;
use crate::journal::Journal;
use crate::lifecycle::Invocation;
use crate::policy::Target;
use deliver::budget::Reservation;
use deliver::flushed::FlushWatch;
use origin::inject::Injection;
use origin::upstream::Hop;

pub use agent::front::serve;

/// Everything a request needs on its way through postern.
pub struct Proxy {
    /// The config in force; an exchange keeps the snapshot it started with.
    pub live: Arc<crate::config::Live>,
    pub journal: Journal,
    pub authority: Arc<agent::mitm::Authority>,
    pub tls: origin::upstream::TlsClients,
    pub dns: Arc<crate::dns::Dns>,
    pub pool: origin::pool::Pool,
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
    /// OAuth2 access tokens minted for credentials (SPEC §3.8), one in flight per credential.
    pub minter: origin::mint::Minter,
    /// Memory for buffered bodies, shared by requests and responses.
    pub budget: deliver::budget::Budget,
    /// `rate_limit` buckets of agents and routes (SPEC §5.8).
    pub rates: Arc<crate::lifecycle::rate_limit::RateLimits>,
    /// Agents an operator suspended (SPEC §5.8 kill switch), shared with the SSH front.
    pub suspended: Arc<crate::lifecycle::suspended::Suspended>,
    /// Connections each agent keeps busy (requests, tunnels, WebSockets).
    pub busy: Arc<crate::listen::BusyPerAgent>,
    /// Agents that left an exchange a moment ago (SPEC §3.7 resends).
    pub departures: crate::lifecycle::twin::Departures,
}

/// A request as the front received it, with the agent already identified.
pub struct Inbound {
    pub agent: String,
    pub target: Target,
    pub request: Request<Incoming>,
    /// The raw head carried both `Content-Length` and `Transfer-Encoding`.
    pub framing_conflict: bool,
}

/// One HTTP exchange: the state a request carries down the rooms — `exchange` (validate,
/// preflight, approval), `origin` (the boundary, sending, the response) and `deliver` —
/// each phase reporting what it observed to the invocation's lifecycle. Private to `http`:
/// every room reads its fields, nothing outside does.
struct Exchange {
    proxy: Arc<Proxy>,
    /// The config this exchange started under, kept to its end (a reload does not change it).
    config: Arc<crate::config::Config>,
    /// The invocation this exchange drives through the lifecycle.
    inv: Invocation,
    agent: String,
    target: Target,
    method: String,
    framing_conflict: bool,
    /// The credential bound at preflight; used unchanged at dispatch.
    injection: Option<Injection>,
    /// The other credentials routes inject into this host: the origin may have kept them
    /// and echo them on this route, so its responses are guarded against them too.
    neighbours: Vec<Injection>,
    /// The route's `via` hop, its credential bound at preflight.
    hop: Option<Hop>,
    /// The agent can take trailers (h2, or HTTP/1.1 with `TE: trailers`).
    agent_trailers: bool,
    /// The request is a gRPC call (h2, `content-type: application/grpc…`).
    grpc: bool,
    /// Body bytes handed to the origin (`REQUEST_SENT`) and to the agent (`RESULT_DELIVERED`).
    request_bytes: u64,
    delivered_bytes: u64,
    /// Buffer budget held for this exchange's bodies; released when it ends.
    held: Reservation,
    /// An idempotency key postern put on the request (generated, or the one a leased
    /// invocation recorded): sent upstream and shown to the agent on the response.
    added_key: Option<(HeaderName, HeaderValue)>,
    /// The agent's connection, whose flush makes a response delivered (`None`: not known,
    /// e.g. a retry the admin API runs: handed over counts as delivered).
    flush: Option<FlushWatch>,
    /// The agent asked for a WebSocket: its side of the switch, once the origin agrees.
    agent_upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// The agent connection's place under the cap, held by a WebSocket relay.
    agent_slot: Option<crate::listen::HeldSlot>,
    /// The agent's place under `max_busy_per_agent`, held while the exchange runs.
    busy: Option<crate::listen::Busy>,
    /// The twin slot this request claims with its preflight (SPEC §3.7 resends).
    twin: Option<crate::journal::TwinClaim>,
    /// The agent's connection, listed for resends judged against this invocation.
    line: Option<crate::lifecycle::twin::Watched>,
    /// The agent's key is claimed in the fleet's index already (`Journal::reserve_key`):
    /// the preflight records it without claiming it again.
    key_reserved: bool,
    /// The route signs with SigV4: postern's own answers also name their code as AWS SDKs
    /// read it (SPEC §3.8).
    aws_route: bool,
    /// The route this request matched, named by a refusal before its preflight.
    matched: Option<String>,
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
