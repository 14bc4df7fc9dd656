//! One HTTP exchange, phase by phase: accept → validate → preflight → connect →
//! dispatch boundary → await response → commit → deliver. Each phase reports what
//! it observed to the journal; the envelope comes from the journal's projection.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use super::Proxy;
use super::body::{DeliveryBody, DeliveryEnd, RequestBody};
use super::budget::Reservation;
use super::decode;
use super::guard::ReflectionGuard;
use super::inject::Injection;
use super::intake::Collected;
use super::pool::{Conn, Pool, SendFailure, Sender};
use super::respond::{
    self, POSTERN_CREDENTIAL, POSTERN_INVOCATION, POSTERN_OUTCOME, PROXY_STATUS, ProxyBody, Relayed,
};
use super::stream::{StreamEnd, StreamPlan};
use super::tap::Tap;
use super::upstream::{Dialed, dial};
use crate::config::{Approval, Config, Delivery, Inject, Route, Scheme};
use crate::contract::{
    Code, Completion, Outcome, Phase, ResponseFacts, StatusResolution, classify_status,
    postern_outcome,
};
use crate::journal::{
    Accepted, Body, Dispatch, Draft, Failure, HttpResult, Payload, Preflight, Protocol,
    RequestSent, ResponseComplete, ResponseStarted, ResultCommitted, Source, StoredResult, b64,
    sha256_tagged_digest,
};
use crate::lifecycle::Invocation;
use crate::policy::{Target, denial_field, fingerprint, match_route, route_is_built};

/// A request as the front received it, with the agent already identified.
pub struct Inbound {
    pub agent: String,
    pub target: Target,
    pub request: Request<Incoming>,
    /// The raw head carried both `Content-Length` and `Transfer-Encoding`.
    pub framing_conflict: bool,
}

/// Runs the exchange in its own task so a departing agent cannot cut it short.
pub async fn handle(proxy: Arc<Proxy>, inbound: Inbound) -> Response<ProxyBody> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut ex = Exchange::new(proxy, &inbound);
        ex.run(inbound.request, tx).await;
    });
    match rx.await {
        Ok(resp) => resp,
        Err(_) => {
            let mut r = Response::new(respond::full(&b""[..]));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r
        }
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) and postern's own, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
    let postern: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("postern-"))
        .cloned()
        .collect();
    for name in postern {
        headers.remove(name);
    }
}

/// Why the request stopped before dispatch, as the front observed it.
struct Refuse {
    code: Code,
    field: Option<&'static str>,
}

/// A credential that could not be had. The secret's name goes only to the event's internal
/// `diagnostic` (the operator's view), never into the envelope (SPEC §1.8).
fn credential_failure(config: &Config, credential: &str, code: Code) -> Failure {
    let mut failure = Failure::of(code);
    if code == Code::CredentialMissing {
        failure.diagnostic = config
            .credentials
            .iter()
            .find(|c| c.id == credential)
            .map(|c| {
                format!(
                    "credential {}: secret {} is not in the vault",
                    c.id, c.secret
                )
            });
    }
    failure
}

fn refuse(code: Code, field: &'static str) -> Refuse {
    Refuse {
        code,
        field: Some(field),
    }
}

pub(super) struct Exchange {
    pub(super) proxy: Arc<Proxy>,
    /// The invocation this exchange drives through the lifecycle.
    pub(super) inv: Invocation,
    pub(super) agent: String,
    pub(super) target: Target,
    pub(super) method: String,
    framing_conflict: bool,
    /// The credential bound at preflight; used unchanged at dispatch.
    pub(super) injection: Option<Injection>,
    /// The agent can take trailers (h2, or HTTP/1.1 with `TE: trailers`).
    pub(super) agent_trailers: bool,
    /// Body bytes handed to the origin (`REQUEST_SENT`) and to the agent (`RESULT_DELIVERED`).
    request_bytes: u64,
    pub(super) delivered_bytes: u64,
    /// Buffer budget held for this exchange's bodies; released when it ends.
    pub(super) held: Reservation,
}

impl Exchange {
    fn new(proxy: Arc<Proxy>, inbound: &Inbound) -> Self {
        let target = inbound.target.clone();
        let method = inbound.request.method().as_str().to_owned();
        let protocol = match target.scheme {
            Scheme::Https => Protocol::Https,
            Scheme::Http => Protocol::Http,
        };
        let accepted = Accepted {
            agent: inbound.agent.clone(),
            protocol,
            method: Some(method.clone()),
            target: target.url(),
            command: None,
        };
        Self {
            inv: Invocation::accept(proxy.journal.clone(), accepted),
            proxy,
            agent: inbound.agent.clone(),
            target,
            method,
            framing_conflict: inbound.framing_conflict,
            injection: None,
            agent_trailers: inbound.request.version() == http::Version::HTTP_2
                || inbound
                    .request
                    .headers()
                    .get_all(header::TE)
                    .iter()
                    .any(|v| {
                        v.to_str()
                            .is_ok_and(|t| t.to_ascii_lowercase().contains("trailers"))
                    }),
            request_bytes: 0,
            delivered_bytes: 0,
            held: Reservation::default(),
        }
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

    async fn run(
        &mut self,
        request: Request<Incoming>,
        mut reply: oneshot::Sender<Response<ProxyBody>>,
    ) {
        let resp = self.drive(request, &mut reply).await;
        match resp {
            Outgoing::Respond(resp) => {
                let _ = reply.send(resp);
            }
            Outgoing::Deliver { resp, done } => {
                if reply.send(resp).is_err() {
                    // The agent left after the result was committed.
                    self.inv.delivery_failed().await;
                    return;
                }
                let end = done.await.unwrap_or(DeliveryEnd::Dropped);
                match end {
                    DeliveryEnd::Delivered => self.inv.delivered(self.delivered_bytes).await,
                    DeliveryEnd::Dropped => self.inv.delivery_failed().await,
                }
            }
            Outgoing::Gone => self.inv.delivery_failed().await,
            Outgoing::Stream { resp, done, plan } => {
                let agent_gone = reply.send(resp).is_err();
                let end = self.pump(*plan, agent_gone).await;
                self.after_stream(end, done).await;
            }
        }
    }

    /// Records how a streamed delivery ended.
    async fn after_stream(&mut self, end: StreamEnd, done: oneshot::Receiver<DeliveryEnd>) {
        match end {
            StreamEnd::Broken => {}
            StreamEnd::Committed { agent_gone: true } => self.inv.delivery_failed().await,
            StreamEnd::Committed { agent_gone: false } => {
                match done.await.unwrap_or(DeliveryEnd::Dropped) {
                    DeliveryEnd::Delivered => self.inv.delivered(self.delivered_bytes).await,
                    DeliveryEnd::Dropped => self.inv.delivery_failed().await,
                }
            }
        }
    }

    async fn drive(
        &mut self,
        request: Request<Incoming>,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        let (parts, body) = request.into_parts();
        if self.inv.journal().admit().is_err() {
            return Outgoing::Respond(
                self.fail(vec![], Failure::of(Code::JournalUnavailable))
                    .await,
            );
        }
        let config = self.proxy.config.clone();
        let route = match self.validate(&parts.headers, &config) {
            Ok(r) => r,
            Err(r) => return Outgoing::Respond(self.refused(r).await),
        };
        let credential = match select_credential(route, &parts.headers) {
            Ok(c) => c,
            Err(r) => return Outgoing::Respond(self.refused(r).await),
        };
        let body = match self.intake(body, &parts.headers).await {
            Ok(b) => b,
            Err(resp) => return Outgoing::Respond(resp),
        };
        let idempotent = route.idempotent_methods.contains(&self.method);
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        let fp = fingerprint(
            &self.method,
            &self.target.url(),
            &[("content-type", content_type)],
            &body,
        );
        let held_fingerprint = fp.clone();
        let mut preflight = Preflight {
            route: route.id.clone(),
            fingerprint: fp,
            idempotent,
            credential: None,
            idempotency: None,
            safe_until_ms: None,
        };
        let mut drafts = Vec::new();
        if let Some(cred_id) = credential {
            match Injection::resolve(&config, &self.proxy.vault, cred_id) {
                Ok(injection) => {
                    preflight.credential = Some(injection.evidence());
                    drafts.push(Draft::observed(Body::PreflightValidated(preflight)));
                    drafts.push(Draft::observed(Body::CredentialAuthorized(
                        injection.evidence(),
                    )));
                    self.injection = Some(injection);
                }
                Err(code) => {
                    let drafts = vec![Draft::observed(Body::PreflightValidated(preflight))];
                    let failure = credential_failure(&config, cred_id, code);
                    return Outgoing::Respond(self.fail(drafts, failure).await);
                }
            }
        } else {
            drafts.push(Draft::observed(Body::PreflightValidated(preflight)));
        }
        if route.approval == Approval::Required
            && let Err(resp) = self
                .await_approval(route, &held_fingerprint, &body, credential, &mut drafts)
                .await
        {
            return Outgoing::Respond(resp);
        }
        let key = Pool::key(route, &self.target);
        let pooled = self.proxy.pool.take_ready(&key).await;
        if pooled.is_some() {
            // No setup stage to wait for: preflight rides with DISPATCH_STARTED in one write.
            self.inv.defer(drafts);
        } else if self.inv.record(drafts).await.is_err() {
            return Outgoing::Respond(self.fallback(Code::JournalUnavailable));
        }
        if let Some(conn) = pooled {
            let Some(req) = self.upstream_request(&parts, &body, conn.sender.is_h2()) else {
                return Outgoing::Respond(
                    self.refused(refuse(Code::InvalidTarget, "target")).await,
                );
            };
            return self
                .dispatch_reused(route, key, conn, req, body, reply)
                .await;
        }
        let dialed = match dial(route, &self.target, &self.proxy.tls, &self.proxy.dns).await {
            Ok(d) => d,
            Err(f) => {
                let drafts = self.inv.attempt_drafts(&f.attempts);
                return Outgoing::Respond(self.fail(drafts, Failure::of(f.code)).await);
            }
        };
        let upstream_req = match self.upstream_request(&parts, &body, dialed.h2) {
            Some(r) => r,
            None => {
                return Outgoing::Respond(
                    self.refused(refuse(Code::InvalidTarget, "target")).await,
                );
            }
        };
        self.dispatch(route, key, dialed, upstream_req, body, reply)
            .await
    }

    async fn refused(&mut self, r: Refuse) -> Response<ProxyBody> {
        let mut failure = Failure::of(r.code);
        failure.field = r.field.map(str::to_owned);
        self.fail(vec![], failure).await
    }

    /// Framing and policy, before any DNS lookup or secret access.
    fn validate<'c>(
        &self,
        headers: &HeaderMap,
        config: &'c crate::config::Config,
    ) -> Result<&'c Route, Refuse> {
        let both = headers.contains_key(header::TRANSFER_ENCODING)
            && headers.contains_key(header::CONTENT_LENGTH);
        if both || self.framing_conflict {
            return Err(refuse(Code::MalformedRequest, "headers.transfer-encoding"));
        }
        let lengths: Vec<&HeaderValue> = headers.get_all(header::CONTENT_LENGTH).iter().collect();
        if lengths.len() > 1 && lengths.windows(2).any(|w| w[0] != w[1]) {
            return Err(refuse(Code::MalformedRequest, "headers.content-length"));
        }
        let route =
            match_route(config, &self.agent, &self.target, &self.method).ok_or_else(|| {
                let field = denial_field(config, &self.agent, &self.target, &self.method);
                refuse(Code::RouteDenied, field)
            })?;
        if !route_is_built(route, self.target.scheme) {
            return Err(refuse(Code::UnsupportedAction, "route"));
        }
        for cred_id in &route.credentials {
            let Some(cred) = config.credentials.iter().find(|c| &c.id == cred_id) else {
                continue;
            };
            let forbidden = match &cred.inject {
                Inject::Header { name, .. } => Some(name.to_ascii_lowercase()),
                Inject::Basic { .. } => Some("authorization".to_owned()),
                Inject::Query { .. } | Inject::SshKey | Inject::SshPassword => None,
            };
            if let Some(name) = forbidden
                && headers.contains_key(name.as_str())
            {
                return Err(Refuse {
                    code: Code::ForbiddenHeader,
                    field: Some(if name == "authorization" {
                        "headers.authorization"
                    } else {
                        "headers"
                    }),
                });
            }
            if let Inject::Query { param } = &cred.inject
                && query_has(&self.target.path_and_query, param)
            {
                return Err(refuse(Code::ForbiddenHeader, "target.query"));
            }
        }
        Ok(route)
    }

    /// The request toward the origin: hop-by-hop headers gone, Host set.
    fn upstream_request(
        &self,
        parts: &http::request::Parts,
        body: &Bytes,
        h2: bool,
    ) -> Option<Request<UpBody>> {
        let mut headers = parts.headers.clone();
        strip_hop_by_hop(&mut headers);
        headers.remove(header::HOST);
        let mut path_and_query = self.target.path_and_query.clone();
        if let Some(injection) = &self.injection {
            injection.apply(&mut headers, &mut path_and_query)?;
            decode::offer(&mut headers);
        }
        let uri = if h2 {
            format!("{}://{}{path_and_query}", "https", self.target.authority())
        } else {
            path_and_query
        };
        let mut builder = Request::builder().method(parts.method.clone()).uri(uri);
        if !h2 {
            headers.insert(
                header::HOST,
                HeaderValue::from_str(&self.target.authority()).ok()?,
            );
        }
        if body.is_empty() && matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
        if let Some(h) = builder.headers_mut() {
            *h = headers;
        }
        builder.body(UpBody::Empty).ok()
    }

    /// `DISPATCH_STARTED` is durable before the first request byte enters the socket.
    async fn dispatch(
        &mut self,
        route: &Route,
        key: String,
        dialed: Dialed,
        mut req: Request<UpBody>,
        body: Bytes,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        let drafts = self.inv.attempt_drafts(&dialed.attempts);
        let dispatch = Dispatch {
            connection_id: None,
            reused_connection: false,
            address: Some(dialed.address.to_string()),
            tls: dialed.tls.clone(),
        };
        if let Err(out) = self.dispatch_boundary(drafts, dispatch).await {
            return out;
        }
        self.request_bytes = body.len() as u64;
        let (tap, first_write) = Tap::new(dialed.stream);
        // A bodiless request is written when its head is: the tap sees that.
        let sent_rx = attach_body(&mut req, body).unwrap_or(first_write);
        let sender = match Sender::handshake(tap, dialed.h2).await {
            Ok(s) => s,
            Err(diag) => {
                return Outgoing::Respond(
                    self.remote_failure(Code::RemoteOutcomeUnknown, diag).await,
                );
            }
        };
        let conn = Conn {
            sender,
            address: dialed.address.to_string(),
            tls: dialed.tls,
        };
        self.exchange_over(route, key, conn, req, sent_rx, reply)
            .await
    }

    /// Dispatch on a pooled connection: no setup stages, `reused_connection` as evidence.
    async fn dispatch_reused(
        &mut self,
        route: &Route,
        key: String,
        conn: Conn,
        mut req: Request<UpBody>,
        body: Bytes,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        let dispatch = Dispatch {
            connection_id: None,
            reused_connection: true,
            address: Some(conn.address.clone()),
            tls: conn.tls.clone(),
        };
        if let Err(out) = self.dispatch_boundary(vec![], dispatch).await {
            return out;
        }
        crate::journal::pause_before_send().await;
        self.request_bytes = body.len() as u64;
        let sent_rx = attach_body(&mut req, body).unwrap_or_else(|| {
            // hyper writes a bodiless request as soon as it is sent on a ready connection.
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(DeliveryEnd::Delivered);
            rx
        });
        self.exchange_over(route, key, conn, req, sent_rx, reply)
            .await
    }

    /// `DISPATCH_STARTED` made durable: from here on nothing is ever `not_attempted`.
    async fn dispatch_boundary(
        &mut self,
        drafts: Vec<Draft>,
        dispatch: Dispatch,
    ) -> Result<(), Outgoing> {
        self.inv
            .dispatch_boundary(drafts, dispatch, "origin")
            .await
            .map_err(|env| Outgoing::Respond(respond::envelope(&env)))
    }

    /// Sends, receives, and hands a still-usable connection back to the pool.
    async fn exchange_over(
        &mut self,
        route: &Route,
        key: String,
        mut conn: Conn,
        req: Request<UpBody>,
        sent_rx: oneshot::Receiver<DeliveryEnd>,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        let timeout = route.response_timeout;
        let waited = self
            .await_head(&mut conn.sender, req, sent_rx, timeout, reply)
            .await;
        let (resp, conn) = match waited {
            Ok(r) => (r, conn),
            Err(HeadError::Failed(code, diag)) => {
                return Outgoing::Respond(self.remote_failure(code, diag).await);
            }
            Err(HeadError::Unwritten(req, diag)) => {
                match self.resend_unwritten(route, *req, diag, reply).await {
                    Ok(sent) => sent,
                    Err(out) => return out,
                }
            }
        };
        // The request body was handed over: its bytes are no longer held.
        self.held = Reservation::default();
        let out = self.receive(route, resp, reply).await;
        if matches!(out, Outgoing::Deliver { .. }) {
            self.proxy.pool.give(key, conn);
        }
        out
    }

    /// hyper handed the request back unwritten, which proves nothing was sent: it goes out
    /// once more, in the same generation, on a fresh connection whose stages are recorded.
    async fn resend_unwritten(
        &mut self,
        route: &Route,
        req: Request<UpBody>,
        why: String,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Result<(Response<Incoming>, Conn), Outgoing> {
        let unknown = |diag: String| (Code::RemoteOutcomeUnknown, diag);
        let dialed = dial(route, &self.target, &self.proxy.tls, &self.proxy.dns).await;
        let mut attempts = match &dialed {
            Ok(d) => d.attempts.clone(),
            Err(f) => f.attempts.clone(),
        };
        if let Some(first) = attempts.first_mut() {
            let prior = first
                .diagnostic
                .take()
                .map(|d| format!("; {d}"))
                .unwrap_or_default();
            first.diagnostic = Some(format!(
                "sent again: the request came back unwritten ({why}){prior}"
            ));
        }
        let drafts = self.inv.attempt_drafts(&attempts);
        let _ = self.inv.record(drafts).await;
        let failed = match dialed {
            Err(f) => unknown(format!("{why}; a fresh connection failed: {}", f.code)),
            Ok(d) if d.h2 != is_h2_request(&req) => {
                unknown(format!("{why}; the origin changed protocol"))
            }
            Ok(d) => return self.send_fresh(route, d, req, reply).await,
        };
        Err(Outgoing::Respond(
            self.remote_failure(failed.0, failed.1).await,
        ))
    }

    async fn send_fresh(
        &mut self,
        route: &Route,
        dialed: Dialed,
        req: Request<UpBody>,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Result<(Response<Incoming>, Conn), Outgoing> {
        let (tap, first_write) = Tap::new(dialed.stream);
        let (parts, body) = req.into_parts();
        let (body, sent_rx) = match body {
            UpBody::Full(b) => {
                let (b, rx) = b.reissue();
                (UpBody::Full(b), rx)
            }
            UpBody::Empty => (UpBody::Empty, first_write),
        };
        let mut conn = match Sender::handshake(tap, dialed.h2).await {
            Ok(sender) => Conn {
                sender,
                address: dialed.address.to_string(),
                tls: dialed.tls,
            },
            Err(diag) => {
                let resp = self.remote_failure(Code::RemoteOutcomeUnknown, diag).await;
                return Err(Outgoing::Respond(resp));
            }
        };
        let req = Request::from_parts(parts, body);
        let timeout = route.response_timeout;
        let waited = self
            .await_head(&mut conn.sender, req, sent_rx, timeout, reply)
            .await;
        match waited {
            Ok(resp) => Ok((resp, conn)),
            Err(HeadError::Failed(code, diag)) => {
                Err(Outgoing::Respond(self.remote_failure(code, diag).await))
            }
            // Handed back a second time: give up, without a third connection.
            Err(HeadError::Unwritten(_, diag)) => Err(Outgoing::Respond(
                self.remote_failure(Code::RemoteOutcomeUnknown, diag).await,
            )),
        }
    }

    async fn remote_failure(&mut self, code: Code, diagnostic: String) -> Response<ProxyBody> {
        respond::envelope(&self.inv.fail_with(code, diagnostic).await)
    }

    /// Waits for the response head; `response_timeout` runs from the request fully written.
    async fn await_head(
        &mut self,
        sender: &mut Sender,
        req: Request<UpBody>,
        mut sent_rx: oneshot::Receiver<DeliveryEnd>,
        response_timeout: Duration,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Result<Response<Incoming>, HeadError> {
        let send = sender.send(req);
        tokio::pin!(send);
        let mut written = false;
        let mut cancelled = false;
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
        let deadline = tokio::time::sleep_until(far);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = &mut send => {
                    return r.map_err(|e| match e {
                        SendFailure::Unwritten(req, diag) => HeadError::Unwritten(req, diag),
                        SendFailure::Failed(diag) => HeadError::Failed(Code::RemoteOutcomeUnknown, diag),
                    });
                }
                s = &mut sent_rx, if !written => {
                    written = true;
                    if matches!(s, Ok(DeliveryEnd::Delivered)) {
                        let sent = RequestSent { bytes: self.request_bytes };
                        let sent = Draft::observed(Body::RequestSent(sent)).hop("origin");
                        self.inv.observe(vec![sent]).await;
                    }
                    deadline.as_mut().reset(tokio::time::Instant::now() + response_timeout);
                }
                () = &mut deadline => {
                    return Err(HeadError::Failed(Code::RemoteTimeout, format!("no response head within {response_timeout:?}")));
                }
                () = reply.closed(), if !cancelled => {
                    cancelled = true;
                    self.inv.caller_cancelled().await;
                }
            }
        }
    }

    /// Reads the response to its framing end, commits it, then hands it over.
    async fn receive(
        &mut self,
        route: &Route,
        resp: Response<Incoming>,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        let status = resp.status();
        let started = Draft::observed(Body::RemoteResponseStarted(ResponseStarted {
            status: Some(status.as_u16()),
        }))
        .source(Source::RemoteResponse)
        .hop("origin");
        let (mut parts, incoming) = resp.into_parts();
        // An origin's reason phrase is free text (it may echo the secret): never relayed.
        parts.extensions.remove::<hyper::ext::ReasonPhrase>();
        let completion = framing(&parts.headers, parts.version);
        let config = self.proxy.config.clone();
        let journal = &config.journal;
        // A bodiless response's Content-Length describes the representation: kept as sent.
        let bodiless = bodiless(&self.method, status);
        let limit = match delivery_mode(route.delivery, &parts.headers, journal.buffer_limit) {
            _ if bodiless => journal.buffer_limit.max(1),
            Delivery::Stream => 0,
            Delivery::Buffer => journal.buffer_limit.max(journal.max_result_bytes),
            Delivery::Auto => journal.buffer_limit,
        };
        let collected = self.collect(incoming, route.idle_timeout, limit).await;
        let body = match collected {
            Ok(Collected::Complete(b)) => b,
            Ok(Collected::Partial(prefix, rest)) => {
                return self
                    .start_stream(route, status, parts, completion, prefix, rest, started)
                    .await;
            }
            Err(diag) => {
                let mut f = Failure::of(Code::RemoteResultIncomplete);
                f.diagnostic = Some(diag);
                return Outgoing::Respond(self.fail(vec![started], f).await);
            }
        };
        let Some(head) = self.resolve_head(route, status, &mut parts.headers) else {
            let f = Failure::of(Code::RemoteOutcomeUnknown);
            return Outgoing::Respond(self.fail(vec![started], f).await);
        };
        let resolution = head.resolution;
        let guarded = !head.guard.is_empty() && !bodiless;
        let cap = journal.buffer_limit.max(journal.max_result_bytes);
        let decoded = decode::for_guard(guarded, &mut parts.headers, &body, cap);
        let (delivered, body_hits) = head.guard.redact(decoded.as_ref().unwrap_or(&Bytes::new()));
        // A withheld body is recorded by the digest and length of what the origin sent.
        let body = if decoded.is_ok() {
            delivered.clone()
        } else {
            body
        };
        let redactions = body_hits + head.header_hits;
        let mut evidence = serde_json::Map::new();
        if redactions > 0 {
            evidence.insert("redactions".into(), redactions.into());
        }
        if let Err(why) = &decoded {
            evidence.insert("body_withheld".into(), why.as_str().into());
        }
        for name in ["location", "operation-location"] {
            if status == StatusCode::ACCEPTED
                && let Some(v) = parts.headers.get(name).and_then(|v| v.to_str().ok())
            {
                evidence.insert(name.replace('-', "_"), v.into());
            }
        }
        if !bodiless && parts.headers.contains_key(header::CONTENT_LENGTH) {
            // Redaction may change the length: the stored head says what the agent gets.
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(delivered.len()));
        }
        let digest = sha256_tagged_digest(&Sha256::digest(&body));
        let stored = self.stored_result(
            status.as_u16(),
            &parts.headers,
            &body,
            &digest,
            resolution.outcome,
            decoded.is_ok(),
        );
        let complete = Draft::observed(Body::RemoteResponseComplete(ResponseComplete {
            completion,
            bytes: body.len() as u64,
            digest: digest.clone(),
        }))
        .source(Source::RemoteResponse)
        .hop("origin");
        let committed = Draft::observed(Body::ResultCommitted(ResultCommitted {
            outcome: resolution.outcome,
            retry: resolution.retry,
            status: Some(status.as_u16()),
            exit_status: None,
            exit_signal: None,
            digest,
            bytes: body.len() as u64,
            complete: true,
            completion: Some(completion),
            evidence,
        }))
        .source(Source::RemoteResponse)
        .hop("origin");
        let drafts = vec![started, complete, committed];
        if self.inv.commit_result(drafts, stored).await.is_err() {
            return Outgoing::Respond(self.fallback(Code::ResultStoreFailed));
        }
        if reply.is_closed() {
            return Outgoing::Gone;
        }
        let outcome = postern_outcome(
            resolution.outcome,
            Phase::RemoteExecution,
            resolution.retry,
            None,
        );
        self.delivered_bytes = delivered.len() as u64;
        let (delivery, done) = DeliveryBody::new(delivered);
        parts.version = http::Version::HTTP_11;
        let mut out = Response::from_parts(parts, delivery.boxed());
        out.extensions_mut().insert(Relayed);
        if !bodiless {
            out.headers_mut().remove(header::CONTENT_LENGTH);
        }
        if let Ok(v) = HeaderValue::from_str(self.inv.id()) {
            out.headers_mut().insert(POSTERN_INVOCATION, v);
        }
        if let Ok(v) = HeaderValue::from_str(&outcome) {
            out.headers_mut().insert(POSTERN_OUTCOME, v);
        }
        Outgoing::Deliver { resp: out, done }
    }

    /// Classifies a final response head and cleans its headers for the agent.
    pub(super) fn resolve_head(
        &self,
        route: &Route,
        status: StatusCode,
        headers: &mut HeaderMap,
    ) -> Option<Head> {
        let facts = ResponseFacts {
            status: status.as_u16(),
            has_retry_after: headers.contains_key(header::RETRY_AFTER),
            idempotent: route.idempotent_methods.contains(&self.method),
        };
        let resolution = classify_status(facts, &route.status_outcomes)?;
        strip_hop_by_hop(headers);
        strip_error_proxy_status(headers);
        // No guard for a credentialed route: nothing is relayed (the caller fails it).
        let guard = match &self.injection {
            Some(injection) => injection.guard(&self.proxy.guards)?,
            None => Arc::new(ReflectionGuard::default()),
        };
        let header_hits = guard.redact_headers(headers);
        Some(Head {
            resolution,
            guard,
            header_hits,
        })
    }

    fn stored_result(
        &self,
        status: u16,
        headers: &HeaderMap,
        body: &Bytes,
        digest: &str,
        outcome: Outcome,
        keep: bool,
    ) -> StoredResult {
        let keep = keep && body.len() as u64 <= self.proxy.config.journal.max_result_bytes;
        StoredResult {
            invocation_id: self.inv.id().to_owned(),
            outcome,
            payload: Payload::Http(HttpResult {
                status,
                headers: stored_headers(headers),
                body_base64: keep.then(|| b64(body)),
                body_stored: keep,
                digest: digest.to_owned(),
                bytes: body.len() as u64,
            }),
            complete: true,
            expires_at_ms: self.inv.journal().result_expiry_ms(),
        }
    }
}

/// A classified response head: its resolution and the reflection guard for its body.
pub(super) struct Head {
    pub resolution: StatusResolution,
    pub guard: Arc<ReflectionGuard>,
    pub header_hits: usize,
}

/// The response headers worth keeping: never cookies or credentials.
pub(super) fn stored_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    const SECRET: &[&str] = &[
        "set-cookie",
        "authorization",
        "proxy-authorization",
        "cookie",
        "www-authenticate",
    ];
    headers
        .iter()
        .filter(|(k, _)| !SECRET.contains(&k.as_str()))
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect()
}

pub(super) fn strip_error_proxy_status(headers: &mut HeaderMap) {
    let has_error = headers
        .get_all(PROXY_STATUS)
        .iter()
        .any(|v| v.to_str().map_or(true, |s| s.contains("error")));
    if has_error {
        headers.remove(PROXY_STATUS);
    }
}

fn framing(headers: &HeaderMap, version: http::Version) -> Completion {
    if version == http::Version::HTTP_2 {
        Completion::EndStream
    } else if headers.contains_key(header::TRANSFER_ENCODING) {
        Completion::LastChunk
    } else if headers.contains_key(header::CONTENT_LENGTH) {
        Completion::ContentLength
    } else {
        // Delimited by connection close: a truncation would look the same.
        Completion::None
    }
}

fn query_has(path_and_query: &str, param: &str) -> bool {
    path_and_query
        .split_once('?')
        .map(|(_, q)| q.split('&').any(|kv| kv.split('=').next() == Some(param)))
        .unwrap_or(false)
}

/// Which offered credential this request uses (`Postern-Credential`), never echoed back.
fn select_credential<'r>(route: &'r Route, headers: &HeaderMap) -> Result<Option<&'r str>, Refuse> {
    let asked = headers.get(POSTERN_CREDENTIAL).map(|v| v.as_bytes());
    match asked {
        None => Ok(route.credentials.first().map(String::as_str)),
        Some(name) => route
            .credentials
            .iter()
            .find(|c| c.as_bytes() == name)
            .map(|c| Some(c.as_str()))
            .ok_or(refuse(
                Code::UnknownCredential,
                "headers.postern-credential",
            )),
    }
}

/// Puts the agent's body on the upstream request; `None` for an empty body.
fn attach_body(req: &mut Request<UpBody>, body: Bytes) -> Option<oneshot::Receiver<DeliveryEnd>> {
    if body.is_empty() {
        return None;
    }
    let (b, rx) = RequestBody::new(body);
    *req.body_mut() = UpBody::Full(b);
    Some(rx)
}

/// Responses that never carry a body (RFC 9110 §6.4.1).
fn bodiless(method: &str, status: StatusCode) -> bool {
    method == "HEAD"
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status.is_informational()
}

/// `delivery = "auto"`: event streams and bodies declared larger than the buffer stream at once.
fn delivery_mode(route: Delivery, headers: &HeaderMap, buffer_limit: u64) -> Delivery {
    if route != Delivery::Auto {
        return route;
    }
    let streaming_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|t| t == "text/event-stream" || t == "application/x-ndjson");
    let declared_large = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|n| n > buffer_limit);
    if streaming_type || declared_large {
        Delivery::Stream
    } else {
        Delivery::Auto
    }
}

pub(super) fn body_error(e: &hyper::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Why no response head arrived.
enum HeadError {
    /// hyper handed the request back unwritten.
    Unwritten(Box<Request<UpBody>>, String),
    /// It may have been written: the contract code and the transport's words.
    Failed(Code, String),
}

/// An h2 request carries an absolute URI; an HTTP/1.1 one is origin-form.
fn is_h2_request(req: &Request<UpBody>) -> bool {
    req.uri().scheme().is_some()
}

/// What the exchange hands back to the front.
pub(super) enum Outgoing {
    Respond(Response<ProxyBody>),
    /// A streamed response: the head goes out now, the pump feeds the body.
    Stream {
        resp: Response<ProxyBody>,
        done: oneshot::Receiver<DeliveryEnd>,
        plan: Box<StreamPlan>,
    },
    Deliver {
        resp: Response<ProxyBody>,
        done: oneshot::Receiver<DeliveryEnd>,
    },
    /// The agent left; the result is committed and fetchable.
    Gone,
}

/// The request body toward the origin.
pub enum UpBody {
    Empty,
    Full(RequestBody),
}

impl http_body::Body for UpBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Self::Empty => std::task::Poll::Ready(None),
            Self::Full(b) => std::pin::Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::Full(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Self::Empty => http_body::SizeHint::with_exact(0),
            Self::Full(b) => b.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_framing_marker_names_how_the_body_ended() {
        let mut h = HeaderMap::new();
        assert_eq!(
            framing(&h, http::Version::HTTP_11),
            Completion::None,
            "close-delimited"
        );
        assert_eq!(framing(&h, http::Version::HTTP_2), Completion::EndStream);
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        assert_eq!(
            framing(&h, http::Version::HTTP_11),
            Completion::ContentLength
        );
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert_eq!(framing(&h, http::Version::HTTP_11), Completion::LastChunk);
    }

    #[test]
    fn hop_by_hop_and_postern_headers_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("x-hop"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("postern-outcome", HeaderValue::from_static("spoofed"));
        h.insert("x-kept", HeaderValue::from_static("yes"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-kept"], "yes");
    }
}
