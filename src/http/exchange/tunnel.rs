//! `intercept = false` (SPEC §3.6): a plain `CONNECT` tunnel for clients that pin
//! certificates. One invocation per tunnel, method `CONNECT`, target `https://host:port`:
//!
//! preflight → approval hold (the `CONNECT` waits, nothing is connected) → `dns` →
//! `tcp_connect` (the SSRF guard of every route) → through a `via` hop, `proxy_tunnel` (the
//! same `CONNECT` postern sends for intercepted routes) → `DISPATCH_STARTED` durable → `200` →
//! bytes relayed both ways, counted, unread → `RESULT_COMMITTED` if the origin sent a byte,
//! else `REMOTE_OUTCOME_UNKNOWN` (`contract` decides from the counts).
//!
//! A setup failure answers the `CONNECT` itself with the envelope. postern reads none of the
//! bytes: nothing is injected, no body is kept, and no secret can be reflected, so there is
//! no reflection guard. `DISPATCH_STARTED` is durable before the `200`, and so before the
//! first agent byte can reach the origin.

use std::sync::Arc;

use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

use super::approval::watching_the_caller;
use crate::config::{Approval, Route};
use crate::contract::{
    Code, Completion, Envelope, StatusResolution, classify_tunnel, journal_unavailable,
};
use crate::http::Proxy;
use crate::http::message::respond::{self, POSTERN_INVOCATION, ProxyBody};
use crate::http::origin::upstream::{Connected, bind_hop, connect_tcp};
use crate::http::relay::pump::{self, Relayed, Unread};
use crate::journal::{
    Accepted, Body, Dispatch, Draft, Failure, Payload, Preflight, Protocol, ResultCommitted,
    Source, StoredResult, TunnelResult, rfc3339,
};
use crate::lifecycle::Invocation;
use crate::lifecycle::rate_limit::{limits_of, refusal};
use crate::listen::Slot;
use crate::policy::Target;
use crate::policy::approvals::{Held, preview};
use crate::policy::fingerprint;

/// The method a tunnel's record names.
const CONNECT: &str = "CONNECT";

/// A `CONNECT` that matched a tunnel route.
pub(in crate::http) struct Opening {
    pub agent: String,
    pub route: Route,
    pub target: Target,
}

/// Serves the `CONNECT`: the invocation runs in its own task (an agent that leaves cannot
/// cut its record short) and answers through a channel; it holds the connection's `slot`,
/// so the tunnel counts under `[proxy] max_connections`.
pub(in crate::http) async fn open(
    proxy: Arc<Proxy>,
    opening: Opening,
    mut req: Request<Incoming>,
    slot: Arc<Slot>,
) -> Response<ProxyBody> {
    let upgrade = hyper::upgrade::on(&mut req);
    let (reply, answer) = oneshot::channel();
    let tunnel = Tunnel::accept(proxy, opening);
    tokio::spawn(async move {
        let _slot = slot;
        tunnel.run(upgrade, reply).await;
    });
    answer.await.unwrap_or_else(|_| {
        let mut r = Response::new(respond::full(&b""[..]));
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        r
    })
}

struct Tunnel {
    proxy: Arc<Proxy>,
    opening: Opening,
    inv: Invocation,
    /// Its place under the agent's busy limit, held until the tunnel ends.
    relay: Option<crate::listen::Busy>,
}

type Reply = oneshot::Sender<Response<ProxyBody>>;

impl Tunnel {
    fn accept(proxy: Arc<Proxy>, opening: Opening) -> Self {
        let accepted = Accepted {
            agent: opening.agent.clone(),
            protocol: Protocol::Https,
            method: Some(CONNECT.into()),
            target: opening.target.connect_url(),
            command: None,
        };
        let inv = Invocation::accept(proxy.journal.clone(), accepted);
        Self {
            proxy,
            opening,
            inv,
            relay: None,
        }
    }

    async fn run(mut self, upgrade: OnUpgrade, mut reply: Reply) {
        let origin = match self.set_up(&mut reply).await {
            Ok(c) => c,
            Err(env) => {
                let _ = reply.send(respond::envelope(&env));
                return;
            }
        };
        let relayed = if reply.send(self.opened()).is_err() {
            Relayed::agent_gone()
        } else {
            match upgrade.await {
                Ok(agent) => {
                    let limits = pump::Limits::of(&self.opening.route);
                    pump::relay(TokioIo::new(agent), origin.stream, limits, &mut Unread).await
                }
                Err(_) => Relayed::agent_gone(),
            }
        };
        self.settle(relayed).await;
    }

    /// Everything before the `200`: preflight, approval, connection stages, and the
    /// dispatch boundary. On `Err` nothing reached the origin beyond a TCP handshake.
    async fn set_up(&mut self, reply: &mut Reply) -> Result<Connected, Envelope> {
        if self.inv.journal().admit().is_err() {
            return Err(journal_unavailable());
        }
        if let Some(mut failure) = self.proxy.suspended.refusal(&self.opening.agent) {
            failure.route = Some(self.opening.route.id.clone());
            return Err(self.inv.fail(vec![], failure).await);
        }
        let limits = limits_of(
            &self.proxy.config(),
            &self.opening.agent,
            &self.opening.route,
        );
        if let Err((who, wait)) = self.proxy.rates.admit(&limits) {
            return Err(self.inv.fail(vec![], refusal(&who, wait)).await);
        }
        let busy = self.proxy.busy.clone();
        let Some(hold) = busy.hold(&self.opening.agent) else {
            return Err(super::busy::refuse(&mut self.inv, busy.limit()).await);
        };
        self.relay = Some(hold);
        let route = &self.opening.route;
        let fp = fingerprint(CONNECT, &self.opening.target.connect_url(), &[], b"");
        let preflight = Draft::observed(Body::PreflightValidated(Preflight {
            route: route.id.clone(),
            fingerprint: fp.clone(),
            idempotent: route.idempotent_methods.iter().any(|m| m == CONNECT),
            credential: None,
            idempotency: None,
            safe_until_ms: None,
            retry_budget: Some(route.retry_budget),
            credential_placeholder: false,
            resend: None,
        }));
        if route.approval == Approval::Required {
            self.hold(vec![preflight], &fp, reply).await?;
        } else if self.inv.record(vec![preflight]).await.is_err() {
            return Err(self.inv.fallback(Code::JournalUnavailable));
        }
        let (route, target) = (&self.opening.route, &self.opening.target);
        let hop = match bind_hop(&self.proxy.config(), &self.proxy.vault, route) {
            Ok(hop) => hop,
            Err(failure) => return Err(self.inv.fail(vec![], failure).await),
        };
        let connected = match connect_tcp(route, target, &self.proxy.dns, hop.as_ref()).await {
            Ok(c) => c,
            Err(f) => {
                let drafts = self.inv.attempt_drafts(&f.attempts);
                return Err(self.inv.fail(drafts, f.failure()).await);
            }
        };
        let drafts = self.inv.attempt_drafts(&connected.attempts);
        let dispatch = Dispatch {
            address: Some(connected.address.to_string()),
            ..Dispatch::default()
        };
        self.inv
            .dispatch_boundary(drafts, dispatch, "origin")
            .await?;
        Ok(connected)
    }

    /// SPEC §3.5 for a tunnel: the `CONNECT` waits before any connection. Nothing bound at
    /// preflight can change meanwhile: there is no credential, and the route is a copy.
    async fn hold(
        &mut self,
        drafts: Vec<Draft>,
        fp: &str,
        reply: &mut Reply,
    ) -> Result<(), Envelope> {
        let route = &self.opening.route;
        let now = time::OffsetDateTime::now_utc();
        let held = Held {
            invocation_id: self.inv.id().to_owned(),
            agent: self.opening.agent.clone(),
            route: route.id.clone(),
            method: CONNECT.into(),
            target: self.opening.target.connect_url(),
            fingerprint: fp.to_owned(),
            requested_at: rfc3339(now),
            expires_at: rfc3339(now + route.approval_timeout),
            body_bytes: 0,
            body_preview: preview(b""),
            credential: None,
            body_hex: None,
            headers: Vec::new(),
            headers_not_shown: 0,
        };
        let (approvals, timeout) = (self.proxy.approvals.clone(), route.approval_timeout);
        let id = self.inv.id().to_owned();
        let (proxy, route, agent) = (
            self.proxy.clone(),
            route.clone(),
            self.opening.agent.clone(),
        );
        // A route a reload removed while the CONNECT was held admits nothing.
        let changed = move || {
            (!crate::policy::still_routes(&proxy.config(), &route, &agent))
                .then_some(crate::contract::Code::RouteDenied)
        };
        let wait = self
            .inv
            .await_approval(&approvals, held, timeout, drafts, changed);
        watching_the_caller(&approvals, &id, wait, reply).await
    }

    /// The `200` that opens the tunnel, naming its invocation; no `Postern-Outcome` yet.
    fn opened(&self) -> Response<ProxyBody> {
        let mut r = Response::new(respond::full(&b""[..]));
        if let Ok(id) = HeaderValue::from_str(self.inv.id()) {
            r.headers_mut().insert(POSTERN_INVOCATION, id);
        }
        r
    }

    /// Both directions ended: `contract` says what the counts prove.
    async fn settle(&mut self, relayed: Relayed) {
        let mut evidence = serde_json::Map::new();
        evidence.insert("tunnel".into(), serde_json::json!(relayed.tunnel));
        match classify_tunnel(&relayed.tunnel) {
            Ok(resolution) => self.commit(relayed, resolution, evidence).await,
            Err(code) => {
                let mut failure = Failure::of(code);
                failure.evidence = evidence;
                failure.diagnostic = Some("the tunnel ended without a byte from the origin".into());
                self.inv.fail(vec![], failure).await;
            }
        }
    }

    /// `RESULT_COMMITTED` with the counts (no body: postern never read one), then whether
    /// every origin byte reached the agent.
    async fn commit(
        &mut self,
        relayed: Relayed,
        resolution: StatusResolution,
        evidence: serde_json::Map<String, serde_json::Value>,
    ) {
        let tunnel = relayed.tunnel;
        let committed = Draft::observed(Body::ResultCommitted(ResultCommitted {
            outcome: resolution.outcome,
            retry: resolution.retry,
            status: None,
            exit_status: None,
            exit_signal: None,
            grpc_status: None,
            digest: relayed.digest.clone(),
            bytes: tunnel.bytes_down,
            complete: relayed.clean,
            // A tunnel ends at a close: no framing says whether anything was cut off.
            completion: Some(Completion::None),
            evidence,
        }))
        .source(Source::RemoteResponse)
        .hop("origin");
        let result = StoredResult {
            invocation_id: self.inv.id().to_owned(),
            outcome: resolution.outcome,
            payload: Payload::Tunnel(TunnelResult {
                tunnel,
                digest: relayed.digest,
                bytes: tunnel.bytes_down,
            }),
            complete: relayed.clean,
            expires_at_ms: self.inv.journal().result_expiry_ms(),
        };
        if self
            .inv
            .commit_result(vec![committed], result)
            .await
            .is_err()
        {
            self.inv.result_store_failed().await;
            return;
        }
        if relayed.delivered {
            self.inv.delivered(tunnel.bytes_down).await;
        } else {
            self.inv.delivery_failed().await;
        }
    }
}
