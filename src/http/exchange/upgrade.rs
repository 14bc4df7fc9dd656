//! WebSocket (SPEC §3.6): an HTTP/1.1 `Upgrade: websocket` on a route postern reads. The
//! handshake is the invocation — matched, credential-injected and journaled like any `GET`
//! — sent on a fresh HTTP/1.1 connection (it never returns to the pool) without
//! `Sec-WebSocket-Extensions`, so no compression hides a payload from the guard. The
//! origin's `101` commits it (`classify_upgrade`); any other answer is an ordinary response.
//! After the `101` the agent's bytes go to the origin unparsed; the origin's are read as
//! frames (`wsframe`): each message's payload passes the reflection guard with same-length
//! masks, and a frame the origin may not send ends the relay with close `1002`. When the
//! relay ends `RESULT_DELIVERED` carries what it saw (evidence `upgrade`).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use crate::config::Route;
use crate::contract::{Code, Completion, UpgradeEvidence, classify_upgrade};
use crate::http::Exchange;
use crate::http::deliver::outgoing::{Outgoing, Switch};
use crate::http::message::headers::{redact_headers, strip_hop_by_hop};
use crate::http::message::respond::{
    self, POSTERN_INVOCATION, POSTERN_OUTCOME, ProxyBody, Relayed,
};
use crate::http::origin::dispatch::HeadError;
use crate::http::origin::pool::Sender;
use crate::http::origin::receive::{Whole, origin_committed};
use crate::http::origin::tap::Tap;
use crate::http::origin::upstream::{Offer, dial_offering};
use crate::http::relay::pump;
use crate::http::relay::wsframe::Frames;
use crate::journal::{
    Body, Dispatch, Draft, Failure, ResponseStarted, Source, sha256_tagged_digest,
};
use crate::listen::Busy;

const WEBSOCKET: &str = "websocket";
const EXTENSIONS: &str = "sec-websocket-extensions";

/// The agent's side of a WebSocket handshake, taken from its request before the body is.
pub(in crate::http) fn take_websocket(parts: &mut http::request::Parts) -> Option<OnUpgrade> {
    let asks = parts.version == http::Version::HTTP_11
        && parts.method == Method::GET
        && lists(&parts.headers, header::UPGRADE, WEBSOCKET)
        && lists(&parts.headers, header::CONNECTION, "upgrade");
    asks.then(|| parts.extensions.remove::<OnUpgrade>())
        .flatten()
}

/// Whether a comma-separated header lists `token`.
fn lists(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

impl Exchange {
    /// Connects, dispatches the handshake, and commits a `101` (else receives as usual).
    pub(in crate::http) async fn websocket(
        &mut self,
        route: &Route,
        parts: &http::request::Parts,
        agent: (OnUpgrade, Busy),
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        let (tls, dns) = (&self.proxy.tls, &self.proxy.dns);
        let hop = self.hop.as_ref();
        let dialed = match dial_offering(route, &self.target, tls, dns, hop, Offer::Http1).await {
            Ok(d) => d,
            Err(f) => {
                let drafts = self.inv.attempt_drafts(&f.attempts);
                return Outgoing::Respond(self.fail(drafts, f.failure()).await);
            }
        };
        let Some(mut req) = self.upstream_request(parts, &Bytes::new(), false) else {
            let failure = Failure::of(Code::InvalidTarget);
            return Outgoing::Respond(self.fail(vec![], failure).await);
        };
        let headers = req.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static(WEBSOCKET));
        headers.remove(EXTENSIONS);
        let dispatch = Dispatch {
            connection_id: None,
            reused_connection: false,
            address: Some(dialed.address.to_string()),
            tls: dialed.tls.clone(),
        };
        let drafts = self.inv.attempt_drafts(&dialed.attempts);
        if let Err(out) = self.dispatch_boundary(drafts, dispatch).await {
            return out;
        }
        let (tap, written) = Tap::new(dialed.stream);
        let mut sender = match Sender::handshake_upgradable(tap).await {
            Ok(s) => s,
            Err(diag) => {
                let code = Code::RemoteOutcomeUnknown;
                return Outgoing::Respond(self.remote_failure(code, diag).await);
            }
        };
        let timeout = route.response_timeout;
        let waited = self
            .await_head(&mut sender, req, written, timeout, reply)
            .await;
        let (code, diag) = match waited {
            Ok(resp) => return self.answered(route, resp, agent, reply).await,
            Err(HeadError::Failed(code, diag)) => (code, diag),
            // Unwritten, but DISPATCH_STARTED is durable: never `not_attempted` again.
            Err(HeadError::Unwritten(_, diag)) => (Code::RemoteOutcomeUnknown, diag),
        };
        Outgoing::Respond(self.remote_failure(code, diag).await)
    }

    /// A `101` switches; any other answer is an ordinary response.
    async fn answered(
        &mut self,
        route: &Route,
        mut resp: Response<Incoming>,
        agent: (OnUpgrade, Busy),
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return self.receive(route, resp, reply).await;
        }
        let origin = hyper::upgrade::on(&mut resp);
        self.switched(resp, Switch::new(agent, origin, route), reply)
            .await
    }

    /// The `101`: committed with its head, then handed to the agent with the relay to run.
    async fn switched(
        &mut self,
        resp: Response<Incoming>,
        mut switch: Switch,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        let Some(guard) = self.response_guard() else {
            let diag = "the reflection guard could not be built".to_owned();
            let code = Code::RemoteOutcomeUnknown;
            return Outgoing::Respond(self.remote_failure(code, diag).await);
        };
        let (mut parts, _) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        // Not offered: frames it compresses would pass the guard unread, so none is relayed.
        let forced = parts.headers.remove(EXTENSIONS).is_some();
        let header_hits = redact_headers(&guard, &mut parts.headers);
        let status = StatusCode::SWITCHING_PROTOCOLS;
        let resolution = classify_upgrade();
        let digest = sha256_tagged_digest(&Sha256::digest(b""));
        let stored = self.stored_result(
            status.as_u16(),
            &parts.headers,
            &Bytes::new(),
            &digest,
            resolution.outcome,
            true,
        );
        let mut evidence = serde_json::Map::new();
        if header_hits > 0 {
            evidence.insert("redactions".into(), header_hits.into());
        }
        let started = Draft::observed(Body::RemoteResponseStarted(ResponseStarted {
            status: Some(status.as_u16()),
        }))
        .source(Source::RemoteResponse)
        .hop("origin");
        let whole = Whole {
            digest,
            bytes: 0,
            completion: Completion::None,
            grpc_status: None,
        };
        let committed = origin_committed(resolution, status, whole, evidence);
        let drafts = vec![started, committed];
        let outcome = match self
            .commit_for_agent(drafts, stored, resolution, reply)
            .await
        {
            Ok(outcome) => outcome,
            Err(out) => return out,
        };
        if forced {
            let mut failure = Failure::of(Code::ResultDeliveryFailed);
            failure.diagnostic = Some(
                "the origin switched with a Sec-WebSocket-Extensions postern did not offer; its frames could hide the secret from the guard, so nothing was relayed".into(),
            );
            failure
                .evidence
                .insert("extension_forced".into(), true.into());
            let env = self.inv.fail(vec![], failure).await;
            return Outgoing::Respond(respond::envelope(&env));
        }
        let mut out = Response::new(respond::full(&b""[..]));
        *out.status_mut() = status;
        *out.headers_mut() = parts.headers;
        let headers = out.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static(WEBSOCKET));
        if let Ok(v) = HeaderValue::from_str(self.inv.id()) {
            headers.insert(POSTERN_INVOCATION, v);
        }
        if let Ok(v) = HeaderValue::from_str(&outcome) {
            headers.insert(POSTERN_OUTCOME, v);
        }
        out.extensions_mut().insert(Relayed);
        switch.guard = guard;
        Outgoing::Switch {
            resp: out,
            switch: Box::new(switch),
        }
    }

    /// After the agent got its `101`: bytes both ways until the relay ends, then what it
    /// carried is recorded with the delivery.
    pub(in crate::http) async fn relay_switched(&mut self, switch: Switch) {
        let _place = self.agent_slot.take();
        let (Ok(agent), Ok(origin)) = (switch.agent.await, switch.origin.await) else {
            self.inv.delivery_failed().await;
            return;
        };
        let mut down = Frames::new(switch.guard);
        let (agent, origin) = (TokioIo::new(agent), TokioIo::new(origin));
        let relayed = pump::relay(agent, origin, switch.limits, &mut down).await;
        let upgrade = UpgradeEvidence {
            protocol: WEBSOCKET.into(),
            bytes_up: relayed.tunnel.bytes_up,
            bytes_down: relayed.tunnel.bytes_down,
            closed_by: relayed.tunnel.closed_by,
            redactions: down.hits,
            protocol_error: down.error,
        };
        match relayed.delivered {
            true => self.inv.delivered_upgrade(upgrade).await,
            false => self.inv.delivery_failed_upgrade(upgrade).await,
        }
    }
}
