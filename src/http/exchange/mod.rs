//! One request driven through the lifecycle, before and around the origin: validate and
//! route (`drive`), the agent's body (`intake`), idempotency keys (`keyed`), resends
//! (`twin`), approval, busy limits, retries the admin API asks for (`retry`), and the two
//! other kinds of exchange: a WebSocket `upgrade` and an unread `CONNECT` `tunnel`. It
//! computes no outcome itself: the lifecycle and `contract` do. Here: making an `Exchange`
//! (its state is in `http`'s `mod.rs`) and failing one.

pub(crate) mod approval;
pub mod busy;
pub(crate) mod drive;
pub(crate) mod intake;
pub(crate) mod keyed;
pub mod retry;
pub(crate) mod tunnel;
pub(crate) mod twin;
pub(crate) mod upgrade;

use std::sync::Arc;

use http::{Response, header};

use super::{Exchange, Inbound, Proxy};
use crate::config::Scheme;
use crate::contract::Code;
use crate::http::deliver::budget::Reservation;
use crate::http::deliver::flushed::FlushWatch;
use crate::http::message::respond::{self, ProxyBody};
use crate::journal::{Accepted, Draft, Failure, Protocol};
use crate::lifecycle::Invocation;
use crate::policy::Target;

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

    /// This request as the dispatch of `inv`.
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
        ex.grpc = h2 && crate::http::message::grpc::is_grpc(request.headers());
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
            neighbours: Vec::new(),
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
            line: None,
            key_reserved: false,
            aws_route: false,
            matched: None,
        }
    }

    /// Shows the agent the key postern added to its request, under the route's header name.
    pub(super) fn with_added_key(&self, mut resp: Response<ProxyBody>) -> Response<ProxyBody> {
        if let Some((name, value)) = &self.added_key {
            resp.headers_mut().insert(name.clone(), value.clone());
        }
        if self.aws_route {
            respond::name_code_for_aws(resp.headers_mut());
        }
        resp
    }

    /// Records a failure and answers with the envelope the projection computed.
    pub(super) async fn fail(
        &mut self,
        drafts: Vec<Draft>,
        mut failure: Failure,
    ) -> Response<ProxyBody> {
        // A refusal before the preflight (a resend, a key) still names the route it matched.
        failure.route = failure.route.or_else(|| self.matched.clone());
        respond::envelope(&self.inv.fail(drafts, failure).await)
    }

    /// An envelope computed without the journal (it could not record).
    pub(super) fn fallback(&self, code: Code) -> Response<ProxyBody> {
        respond::envelope(&self.inv.fallback(code))
    }
}
