//! Driving one HTTP exchange through its phases: validate and route (before any DNS
//! lookup or secret), preflight with the credential bound, approval, connection or pooled
//! connection, then delivery — and how delivery ended, for the journal.

use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

use tokio::sync::oneshot;

use super::intake::AgentBody;
use super::upgrade::take_websocket;
use super::{Exchange, Inbound};
use crate::config::{Approval, Config, Inject, Route};
use crate::contract::{Code, journal_unavailable, unjournaled_refusal};
use crate::http::Proxy;
use crate::http::deliver::flushed::DeliveryEnd;
use crate::http::deliver::outgoing::Outgoing;
use crate::http::deliver::stream::StreamEnd;
use crate::http::message::respond::{self, POSTERN_CREDENTIAL, ProxyBody};
use crate::http::origin::inject::Injection;
use crate::http::origin::inject::credential_failure;
use crate::http::origin::pool::Pool;
use crate::http::origin::upstream::bind_hop;
use crate::http::origin::upstream::dial;
use crate::journal::{Body, Draft, Failure, Preflight};
use crate::lifecycle::rate_limit::{limits_of, retry_after_secs};
use crate::listen::HeldSlot;
use crate::policy::sigv4;
use crate::policy::{
    covered_headers, denial_field, fingerprint, match_route, placeholder, route_is_built,
};

impl Exchange {
    pub(in crate::http) async fn run(
        &mut self,
        parts: http::request::Parts,
        body: AgentBody,
        mut reply: oneshot::Sender<Response<ProxyBody>>,
    ) {
        let resp = self.drive(parts, body, &mut reply).await;
        // From here the agent has its answer's head: a close is its delivery's to judge
        // (read through, or cut), no longer a departure from a request it waits for.
        self.line = None;
        match resp {
            Outgoing::Respond(resp) => {
                let _ = reply.send(self.with_added_key(resp));
            }
            Outgoing::Deliver { resp, done } => {
                if reply.send(self.with_added_key(resp)).is_err() {
                    // The agent left after the result was committed.
                    self.inv.delivery_failed().await;
                    return;
                }
                match done.await.unwrap_or(DeliveryEnd::Dropped) {
                    DeliveryEnd::Delivered => self.inv.delivered(self.delivered_bytes).await,
                    DeliveryEnd::Cut { .. } | DeliveryEnd::Dropped => {
                        self.inv.delivery_failed().await;
                    }
                }
            }
            Outgoing::Gone => self.inv.delivery_failed().await,
            Outgoing::Switch { resp, switch } => {
                if reply.send(self.with_added_key(resp)).is_err() {
                    self.inv.delivery_failed().await;
                    return;
                }
                self.relay_switched(*switch).await;
            }
            Outgoing::Stream { resp, done, plan } => {
                let agent_gone = reply.send(self.with_added_key(resp)).is_err();
                let end = self.pump(*plan, agent_gone).await;
                self.after_stream(end, done).await;
            }
        }
    }

    /// Records how a streamed delivery ended. An agent that read every body byte and then
    /// closed has the answer, though its stream's end never went out (SPEC §3.9: an SSE
    /// client stops reading once it has its JSON-RPC reply); one that missed a byte has not.
    async fn after_stream(&mut self, end: StreamEnd, done: oneshot::Receiver<DeliveryEnd>) {
        let StreamEnd::Committed { lost, .. } = end else {
            return;
        };
        if lost {
            return self.inv.delivery_failed().await;
        }
        match done.await.unwrap_or(DeliveryEnd::Dropped) {
            DeliveryEnd::Delivered => self.inv.delivered(self.delivered_bytes).await,
            DeliveryEnd::Cut { handed } if self.read_before_close(handed).await => {
                self.inv.delivered_unended(self.delivered_bytes).await;
            }
            DeliveryEnd::Cut { .. } | DeliveryEnd::Dropped => self.inv.delivery_failed().await,
        }
    }

    async fn read_before_close(&self, handed: u64) -> bool {
        match &self.flush {
            Some(watch) => watch.read_before_close(handed).await,
            None => false,
        }
    }

    async fn drive(
        &mut self,
        parts: http::request::Parts,
        body: AgentBody,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        if self.inv.journal().admit().is_err() {
            return Outgoing::Respond(respond::envelope(&journal_unavailable()));
        }
        let config = self.config.clone();
        let route = match self.validate(&parts.headers, &config) {
            Ok(r) => r,
            Err(r) => return Outgoing::Respond(self.refused(r).await),
        };
        self.aws_route = signs_aws(&config, route);
        self.matched = Some(route.id.clone());
        if let Some(failure) = self.proxy.suspended.refusal(&self.agent) {
            return Outgoing::Respond(self.refused_with(failure).await);
        }
        if let Err(resp) = self.within_rate(&config, route).await {
            return Outgoing::Respond(resp);
        }
        let credential = match select_credential(route, &parts.headers) {
            Ok(c) => c,
            Err(r) => return Outgoing::Respond(self.refused(r).await),
        };
        let placeholder = match self.placeholder(&config, route, credential, &parts.headers) {
            Ok(p) => p,
            Err(r) => return Outgoing::Respond(self.refused(r).await),
        };
        let body = match self.intake(body, &parts.headers).await {
            Ok(b) => b,
            Err(resp) => return Outgoing::Respond(resp),
        };
        let idempotent = route.idempotent_methods.contains(&self.method);
        let key_header = route.idempotency.as_ref().map(|c| c.header.as_str());
        // The placeholder names the credential, bound on its own: however the agent spelt
        // it (`Bearer p`, `p`, Basic), the operation is the same and so is the fingerprint,
        // and a kept request (which never holds the agent's Authorization) fingerprints alike.
        let mut url = self.target.url();
        let mut covered = covered_headers(&parts.headers, key_header);
        match &placeholder {
            Some(placeholder::Place::Header(name)) => covered.retain(|(n, _)| n != name),
            Some(placeholder::Place::Query(param)) => {
                crate::policy::placeholder::without_param(&mut url, param)
            }
            // What an AWS SDK changes between its own tries is left out: its retry of a
            // lost call is a resend (SPEC §3.8).
            Some(placeholder::Place::Sigv4 { .. }) => {
                covered.retain(|(n, _)| !sigv4::CHANGED_BETWEEN_TRIES.contains(n));
                for param in sigv4::QUERY_PARAMS {
                    crate::policy::placeholder::without_param(&mut url, param);
                }
            }
            None => {}
        }
        let fp = fingerprint(&self.method, &url, &covered, &body);
        let held_fingerprint = fp.clone();
        if let Err(resp) = self.same_operation(&fp).await {
            return Outgoing::Respond(resp);
        }
        let resend = match self
            .resend_check(route, &parts.headers, &fp, idempotent)
            .await
        {
            Ok(r) => r,
            Err(resp) => return Outgoing::Respond(resp),
        };
        let key_use = match &route.idempotency {
            Some(c) => match self.keyed(route, c, &parts.headers, &fp).await {
                Ok(k) => k,
                Err(resp) => return Outgoing::Respond(resp),
            },
            None => None,
        };
        let binding = key_use.as_ref().map(|k| self.bind_key(k));
        self.keep_request(&parts, &body).await;
        let mut preflight = Preflight {
            route: route.id.clone(),
            fingerprint: fp,
            idempotent,
            credential: None,
            idempotency: binding.as_ref().map(|b| b.evidence.clone()),
            safe_until_ms: binding.as_ref().map(|b| b.safe_until_ms),
            retry_budget: Some(route.retry_budget),
            credential_placeholder: placeholder.is_some(),
            resend,
        };
        let mut drafts = Vec::new();
        let mut refusal = None;
        if let Some(cred_id) = credential {
            let bound = Injection::resolve(&config, &self.proxy.vault, cred_id).and_then(|i| {
                i.takes(&parts.headers, &self.target.path_and_query)
                    .map(|()| i)
                    .map_err(Failure::from)
            });
            match bound {
                Ok(injection) => {
                    preflight.credential = Some(injection.evidence());
                    drafts.push(Draft::observed(Body::PreflightValidated(preflight)));
                    drafts.push(Draft::observed(Body::CredentialAuthorized(
                        injection.evidence(),
                    )));
                    self.injection = Some(injection);
                }
                Err(failure) => {
                    drafts.push(Draft::observed(Body::PreflightValidated(preflight)));
                    refusal = Some(credential_failure(&config, cred_id, failure));
                }
            }
        } else {
            drafts.push(Draft::observed(Body::PreflightValidated(preflight)));
        }
        if refusal.is_none() {
            match bind_hop(&config, &self.proxy.vault, route) {
                Ok(hop) => self.hop = hop,
                Err(failure) => refusal = Some(failure),
            }
            self.neighbours = neighbours(&config, &self.proxy, &self.target, route, credential);
        }
        if let Some(binding) = binding {
            // The key is claimed with the preflight, before anything can be sent (a refused
            // credential too: the key then names a not_attempted invocation to retry).
            if let Err(resp) = self
                .record_claims(std::mem::take(&mut drafts), Some(binding.claim), route)
                .await
            {
                return Outgoing::Respond(resp);
            }
            crate::journal::pause_after_lease().await;
        } else if refusal.is_none()
            && self.twin.is_some()
            && (route.approval == Approval::Required || self.agent_upgrade.is_some())
            && let Err(resp) = self
                .record_claims(std::mem::take(&mut drafts), None, route)
                .await
        {
            // The twin slot is claimed with the preflight, before anything can be sent
            // (otherwise below: with the preflight, or on a pooled connection with
            // DISPATCH_STARTED).
            return Outgoing::Respond(resp);
        }
        if let Some(failure) = refusal {
            return Outgoing::Respond(self.fail(drafts, failure).await);
        }
        if route.approval == Approval::Required
            && let Err(resp) = self
                .await_approval(
                    route,
                    &held_fingerprint,
                    (&body, &parts.headers),
                    credential,
                    &mut drafts,
                    reply,
                )
                .await
        {
            return Outgoing::Respond(resp);
        }
        // A minted credential's token, after any approval wait (a token minted before a long
        // wait could expire in it) and before anything is sent (SPEC §3.8).
        if let Some(injection) = self.injection.as_mut()
            && let Err(f) = injection.mint(&self.proxy, config.clone()).await
        {
            let failure = f.failure(&injection.id);
            return Outgoing::Respond(self.fail(std::mem::take(&mut drafts), failure).await);
        }
        if let Some(agent) = self.agent_upgrade.take() {
            if !drafts.is_empty() && self.inv.record(drafts).await.is_err() {
                return Outgoing::Respond(self.fallback(Code::JournalUnavailable));
            }
            // The relay after the switch keeps this request's place (a retry has none).
            let busy = self.proxy.busy.clone();
            let Some(hold) = self.busy.take().or_else(|| busy.hold(&self.agent)) else {
                let env = super::busy::refuse(&mut self.inv, busy.limit()).await;
                return Outgoing::Respond(respond::envelope(&env));
            };
            return self.websocket(route, &parts, (agent, hold), reply).await;
        }
        let key = Pool::key(route, &self.target, self.hop.as_ref());
        let pooled = self.proxy.pool.take_ready(&key).await;
        if pooled.is_some() {
            // No setup stage to wait for: preflight rides with DISPATCH_STARTED in one write
            // (and the twin slot claim with it: `dispatch_reused`).
            self.inv.defer(drafts);
        } else if self.twin.is_some() {
            if let Err(resp) = self.record_claims(drafts, None, route).await {
                return Outgoing::Respond(resp);
            }
        } else if !drafts.is_empty() && self.inv.record(drafts).await.is_err() {
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
        let (tls, dns) = (&self.proxy.tls, &self.proxy.dns);
        let dialed = match dial(route, &self.target, tls, dns, self.hop.as_ref()).await {
            Ok(d) => d,
            Err(f) => {
                let drafts = self.inv.attempt_drafts(&f.attempts);
                return Outgoing::Respond(self.fail(drafts, f.failure()).await);
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

    /// A refusal before anything was sent. One before any journal write is journaled at a
    /// bounded rate per agent, with its target capped (else answered unjournaled).
    async fn refused(&mut self, r: Refuse) -> Response<ProxyBody> {
        let field = r.field.unwrap_or(Cow::Borrowed("target"));
        let mut failure = Failure::of(r.code);
        failure.field = Some(field.into_owned());
        self.refused_with(failure).await
    }

    /// `refused` for a failure that carries its own evidence (its `field` set).
    async fn refused_with(&mut self, mut failure: Failure) -> Response<ProxyBody> {
        let field = failure.field.clone().unwrap_or_else(|| "target".into());
        failure.route = failure.route.or_else(|| self.matched.clone());
        if self.inv.unrecorded() {
            if !self.inv.journal().records_refusals()
                || !self.proxy.refusals.may_journal(&self.agent)
            {
                self.proxy.metrics.refusals_unjournaled.inc();
                return respond::envelope(&unjournaled_refusal(failure.code, &field));
            }
            if self.inv.cap_target() {
                failure
                    .evidence
                    .insert("target_truncated".into(), true.into());
            }
        }
        self.fail(vec![], failure).await
    }

    /// SPEC §5.8: the agent's and the route's `rate_limit`, before anything else is spent.
    async fn within_rate(
        &mut self,
        config: &Config,
        route: &Route,
    ) -> Result<(), Response<ProxyBody>> {
        let limits = limits_of(config, &self.agent, route);
        let Err((who, wait)) = self.proxy.rates.admit(&limits) else {
            return Ok(());
        };
        let mut resp = self.refused(refuse(Code::RateLimited, who.field())).await;
        let after = HeaderValue::from(retry_after_secs(wait));
        resp.headers_mut().insert(header::RETRY_AFTER, after);
        Err(resp)
    }

    /// A leased generation dispatches the operation its invocation recorded, nothing else.
    async fn same_operation(&mut self, fingerprint: &str) -> Result<(), Response<ProxyBody>> {
        if !self.inv.leased() {
            return Ok(());
        }
        let recorded = match self.proxy.journal.record(self.inv.id()) {
            Ok(Some(r)) => r.evidence.fingerprint,
            _ => return Err(self.fallback(Code::JournalUnavailable)),
        };
        if recorded.as_deref() == Some(fingerprint) {
            return Ok(());
        }
        let mut f = Failure::of(Code::FingerprintChanged);
        f.field = Some("body".into());
        Err(self.fail(vec![], f).await)
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
        Ok(route)
    }
}

impl Exchange {
    /// SPEC §3.7: where the route injects, the agent may send only the used credential's
    /// placeholder (`Some(where)`: it did, and the secret replaces it); any other value there
    /// is a credential of its own, `FORBIDDEN_HEADER`.
    fn placeholder(
        &self,
        config: &Config,
        route: &Route,
        used: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<Option<placeholder::Place>, Refuse> {
        let find = |id: &str| config.credentials.iter().find(|c| c.id == id);
        let offered: Vec<_> = route.credentials.iter().filter_map(|id| find(id)).collect();
        let used = used.and_then(find);
        match placeholder::presented(&offered, used, headers, &self.target.path_and_query) {
            Ok(placeholder::Presented::Placeholder) => {
                Ok(used.and_then(|c| placeholder::Place::of(&c.inject)))
            }
            // postern re-signs what the agent's SDK signed; it does not choose what to sign.
            Ok(placeholder::Presented::Nothing)
                if used.is_some_and(|c| matches!(c.inject, Inject::AwsSigv4 { .. })) =>
            {
                Err(refuse(Code::MalformedRequest, "headers.authorization"))
            }
            Ok(placeholder::Presented::Nothing) => Ok(None),
            Err(field) => Err(Refuse {
                code: Code::ForbiddenHeader,
                field: Some(field.into()),
            }),
        }
    }
}

/// Runs the exchange in its own task so a departing agent cannot cut it short. It keeps
/// the agent's connection busy until it ends (delivered, failed, or its relay closed).
pub async fn handle(proxy: Arc<Proxy>, inbound: Inbound) -> Response<ProxyBody> {
    let Some(busy) = proxy.busy.hold(&inbound.agent) else {
        proxy.metrics.refusals_unjournaled.inc();
        return super::busy::over_limit_answer(proxy.busy.limit());
    };
    let mut ex = Exchange::new(proxy, &inbound);
    ex.busy = Some(busy);
    run_spawned(ex, inbound).await
}

async fn run_spawned(mut ex: Exchange, inbound: Inbound) -> Response<ProxyBody> {
    let (tx, rx) = oneshot::channel();
    let exchange = async move {
        let (mut parts, body) = inbound.request.into_parts();
        ex.agent_upgrade = take_websocket(&mut parts);
        if ex.agent_upgrade.is_some() {
            // A relay keeps the connection's place under the cap while it runs.
            ex.agent_slot = parts.extensions.remove::<HeldSlot>();
        }
        ex.run(parts, AgentBody::Incoming(body), tx).await;
    };
    // Boxed: the exchange's state is ~15 KB, which tokio would copy into the task and
    // again when the task finishes.
    tokio::spawn(Box::pin(exchange));
    match rx.await {
        Ok(resp) => resp,
        Err(_) => {
            let mut r = Response::new(respond::full(&b""[..]));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r
        }
    }
}

/// Why the request stopped before dispatch, as the front observed it.
struct Refuse {
    code: Code,
    field: Option<Cow<'static, str>>,
}

/// Whether one of the route's credentials is `aws_sigv4`.
fn signs_aws(config: &Config, route: &Route) -> bool {
    config
        .credentials
        .iter()
        .any(|c| route.credentials.contains(&c.id) && matches!(c.inject, Inject::AwsSigv4 { .. }))
}

fn refuse(code: Code, field: &'static str) -> Refuse {
    Refuse {
        code,
        field: Some(field.into()),
    }
}

/// The other credentials routes inject into the target's host, each as it would be
/// injected now (a minted one with the token last minted); one whose secret cannot be read
/// now is left out (no guard can hold it).
fn neighbours(
    config: &Config,
    proxy: &Proxy,
    target: &crate::policy::Target,
    route: &Route,
    bound: Option<&str>,
) -> Vec<Injection> {
    (crate::policy::credentials_at_host(config, &target.host, route.resolve).into_iter())
        .filter(|id| Some(*id) != bound)
        .filter_map(|id| Injection::resolve(config, &proxy.vault, id).ok())
        .map(|i| i.with_kept_token(&proxy.minter))
        .collect()
}

/// Which offered credential this request uses (`Postern-Credential`), never echoed back.
fn select_credential<'r>(route: &'r Route, headers: &HeaderMap) -> Result<Option<&'r str>, Refuse> {
    let mut offered = headers.get_all(POSTERN_CREDENTIAL).iter();
    let asked = offered.next().map(|v| v.as_bytes());
    if offered.next().is_some() {
        // Two choices are none: using the first silently would hide the other.
        return Err(refuse(Code::MalformedRequest, "headers.postern-credential"));
    }
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
