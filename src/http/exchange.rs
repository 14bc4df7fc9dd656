//! One HTTP exchange: the request as the front handed it over, and the state it carries
//! through its phases — `drive` (validate, preflight, approval, connect), `dispatch`
//! (the boundary, sending), `receive` and `stream` (the response), each reporting what
//! it observed to the invocation's lifecycle.

use std::sync::Arc;

use http::{HeaderName, HeaderValue, Request, Response, header};
use hyper::body::Incoming;

use super::Proxy;
use super::budget::Reservation;
use super::flushed::FlushWatch;
use super::inject::Injection;
use super::respond::{self, ProxyBody};
use super::upstream::Hop;
use crate::config::Scheme;
use crate::contract::Code;
use crate::journal::{Accepted, Draft, Failure, Protocol};
use crate::lifecycle::Invocation;
use crate::policy::Target;

/// A request as the front received it, with the agent already identified.
pub struct Inbound {
    pub agent: String,
    pub target: Target,
    pub request: Request<Incoming>,
    /// The raw head carried both `Content-Length` and `Transfer-Encoding`.
    pub framing_conflict: bool,
}

pub(super) struct Exchange {
    pub(super) proxy: Arc<Proxy>,
    /// The config this exchange started under, kept to its end (a reload does not change it).
    pub(super) config: Arc<crate::config::Config>,
    /// The invocation this exchange drives through the lifecycle.
    pub(super) inv: Invocation,
    pub(super) agent: String,
    pub(super) target: Target,
    pub(super) method: String,
    pub(super) framing_conflict: bool,
    /// The credential bound at preflight; used unchanged at dispatch.
    pub(super) injection: Option<Injection>,
    /// The route's `via` hop, its credential bound at preflight.
    pub(super) hop: Option<Hop>,
    /// The agent can take trailers (h2, or HTTP/1.1 with `TE: trailers`).
    pub(super) agent_trailers: bool,
    /// The request is a gRPC call (h2, `content-type: application/grpc…`).
    pub(super) grpc: bool,
    /// Body bytes handed to the origin (`REQUEST_SENT`) and to the agent (`RESULT_DELIVERED`).
    pub(super) request_bytes: u64,
    pub(super) delivered_bytes: u64,
    /// Buffer budget held for this exchange's bodies; released when it ends.
    pub(super) held: Reservation,
    /// An idempotency key postern put on the request (generated, or the one a leased
    /// invocation recorded): sent upstream and shown to the agent on the response.
    pub(super) added_key: Option<(HeaderName, HeaderValue)>,
    /// The agent's connection, whose flush makes a response delivered (`None`: not known,
    /// e.g. a retry the admin API runs: handed over counts as delivered).
    pub(super) flush: Option<FlushWatch>,
    /// The agent asked for a WebSocket: its side of the switch, once the origin agrees.
    pub(super) agent_upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// The agent connection's place under the cap, held by a WebSocket relay.
    pub(super) agent_slot: Option<crate::listen::HeldSlot>,
    /// The agent's place under `max_busy_per_agent`, held while the exchange runs.
    pub(super) busy: Option<crate::listen::Busy>,
    /// The twin slot this request claims with its preflight (SPEC §3.7 resends).
    pub(super) twin: Option<crate::journal::TwinClaim>,
}

impl Exchange {
    /// A new invocation for this request.
    pub(super) fn new(proxy: Arc<Proxy>, inbound: &Inbound) -> Self {
        let protocol = match inbound.target.scheme {
            Scheme::Https => Protocol::Https,
            Scheme::Http => Protocol::Http,
        };
        let accepted = Accepted {
            agent: inbound.agent.clone(),
            protocol,
            method: Some(inbound.request.method().as_str().to_owned()),
            target: inbound.target.url(),
            command: None,
        };
        let inv = Invocation::accept(proxy.journal.clone(), accepted);
        Self::for_inbound(proxy, inbound, inv)
    }

    /// This request as the dispatch of `inv` (a fresh invocation, or a leased generation).
    pub(super) fn for_inbound(proxy: Arc<Proxy>, inbound: &Inbound, inv: Invocation) -> Self {
        let request = &inbound.request;
        let mut ex = Self::on(
            proxy,
            inv,
            &inbound.agent,
            &inbound.target,
            request.method(),
            request.headers(),
        );
        ex.framing_conflict = inbound.framing_conflict;
        let h2 = request.version() == http::Version::HTTP_2;
        ex.agent_trailers |= h2;
        ex.grpc = h2 && super::grpc::is_grpc(request.headers());
        ex.flush = request.extensions().get::<FlushWatch>().cloned();
        ex
    }

    /// An exchange driving `inv`, a new invocation or a new generation of one.
    pub(super) fn on(
        proxy: Arc<Proxy>,
        inv: Invocation,
        agent: &str,
        target: &Target,
        method: &http::Method,
        headers: &http::HeaderMap,
    ) -> Self {
        Self {
            inv,
            config: proxy.config(),
            proxy,
            agent: agent.to_owned(),
            target: target.clone(),
            method: method.as_str().to_owned(),
            framing_conflict: false,
            injection: None,
            hop: None,
            agent_trailers: headers.get_all(header::TE).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|t| t.to_ascii_lowercase().contains("trailers"))
            }),
            grpc: false,
            request_bytes: 0,
            delivered_bytes: 0,
            held: Reservation::default(),
            added_key: None,
            flush: None,
            agent_upgrade: None,
            agent_slot: None,
            busy: None,
            twin: None,
        }
    }

    /// Shows the agent the key postern added to its request, under the route's header name.
    pub(super) fn with_added_key(&self, mut resp: Response<ProxyBody>) -> Response<ProxyBody> {
        if let Some((name, value)) = &self.added_key {
            resp.headers_mut().insert(name.clone(), value.clone());
        }
        resp
    }

    /// Records a failure and answers with the envelope the projection computed.
    pub(super) async fn fail(
        &mut self,
        drafts: Vec<Draft>,
        failure: Failure,
    ) -> Response<ProxyBody> {
        respond::envelope(&self.inv.fail(drafts, failure).await)
    }

    /// An envelope computed without the journal (it could not record).
    pub(super) fn fallback(&self, code: Code) -> Response<ProxyBody> {
        respond::envelope(&self.inv.fallback(code))
    }
}
