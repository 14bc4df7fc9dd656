//! The response: read to its framing end under the buffer budget (or handed to streaming
//! when the budget or the buffering limit runs out), classified by the contract, guarded,
//! committed with its result, then handed to the agent.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use crate::config::{Delivery, Route};
use crate::contract::{
    Code, Completion, Outcome, Phase, ResponseFacts, StatusResolution, classify_grpc_status,
    classify_status, postern_outcome, should_retry_value,
};
use crate::guard::ReflectionGuard;
use crate::http::Exchange;
use crate::http::deliver::body::{DeliveryBody, body_error};
use crate::http::deliver::outgoing::Outgoing;
use crate::http::deliver::stream::StreamStart;
use crate::http::message::decode::{self, Undecodable};
use crate::http::message::grpc;
use crate::http::message::headers::{
    bodiless, delivery_mode, framing, intermediary_error, redact_headers, stored_headers,
    strip_error_proxy_status, strip_hop_by_hop,
};
use crate::http::message::respond::{
    self, POSTERN_INVOCATION, POSTERN_OUTCOME, PROXY_STATUS, ProxyBody, Relayed,
};
use crate::http::origin::inject::Injection;
use crate::journal::{
    Body, Draft, Failure, HttpResult, Payload, ResponseComplete, ResponseStarted, ResultCommitted,
    Source, StoredResult, b64, sha256_tagged_digest,
};

impl Exchange {
    /// Reads the response to its framing end, commits it, then hands it over.
    pub(in crate::http) async fn receive(
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
        // The member is origin-side text: guarded before it names the hop or is relayed.
        let guard = self.response_guard();
        let hop = guard
            .and_then(|g| {
                let mut headers = parts.headers.clone();
                redact_headers(&g, &mut headers);
                intermediary_error(&headers).map(|(name, member)| (name, Some(member)))
            })
            .or_else(|| self.hop_refused_auth(status));
        if let Some((name, member)) = hop {
            return Outgoing::Respond(self.hop_error(status, name, member, started).await);
        }
        let grpc = self.grpc
            && parts.version == http::Version::HTTP_2
            && grpc::is_grpc_response(status, &parts.headers);
        let completion = match grpc {
            true => Completion::GrpcStatus,
            false => framing(&parts.headers, parts.version),
        };
        let config = self.config.clone();
        let journal = &config.journal;
        // A bodiless response's Content-Length describes the representation: kept as sent.
        let bodiless = bodiless(&self.method, status);
        // A gRPC response streams: a server-streaming call's messages go out as they come.
        let mode = match route.delivery {
            Delivery::Auto if grpc => Delivery::Stream,
            d => delivery_mode(d, &parts.headers, journal.buffer_limit),
        };
        let limit = match mode {
            _ if bodiless => journal.buffer_limit.max(1),
            Delivery::Stream => 0,
            Delivery::Buffer => journal.buffer_limit.max(journal.max_result_bytes),
            Delivery::Auto => journal.buffer_limit,
        };
        let collected = self.collect(incoming, route.idle_timeout, limit).await;
        let (body, trailers) = match collected {
            Ok(Collected::Complete(b, t)) => (b, t),
            Ok(Collected::Partial(prefix, rest)) => {
                let start = self
                    .start_stream(
                        route, status, parts, completion, grpc, prefix, rest, started,
                    )
                    .await;
                return match start {
                    Ok(StreamStart { resp, done, plan }) => Outgoing::Stream { resp, done, plan },
                    Err(resp) => Outgoing::Respond(resp),
                };
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
        let mut grpc_end = match grpc {
            true => {
                let head_status = grpc::take_head_status(&mut parts.headers);
                match grpc::end(head_status, trailers, &head.guard) {
                    Ok(end) => Some(end),
                    Err(diag) => {
                        let mut f = Failure::of(Code::RemoteResultIncomplete);
                        f.diagnostic = Some(diag.into());
                        return Outgoing::Respond(self.fail(vec![started], f).await);
                    }
                }
            }
            false => None,
        };
        let resolution = grpc_end
            .as_ref()
            .map_or(head.resolution, |end| classify_grpc_status(end.status));
        let guarded = !head.guard.is_empty() && !bodiless;
        let cap = journal.buffer_limit.max(journal.max_result_bytes);
        let decoded = for_guard(&head.guard, guarded, grpc, &mut parts.headers, &body, cap);
        if let (Some(end), Err(why)) = (grpc_end.as_mut(), &decoded) {
            end.withhold(*why);
        }
        let plain = decoded.as_ref().unwrap_or(&Bytes::new()).clone();
        let (delivered, body_hits) = match grpc {
            true => head.guard.redact_same_length(&plain),
            false => head.guard.redact(&plain),
        };
        // A withheld body is recorded by the digest and length of what the origin sent.
        let body = if decoded.is_ok() {
            delivered.clone()
        } else {
            body
        };
        let trailer_hits = grpc_end.as_ref().map_or(0, |end| end.hits);
        let redactions = body_hits + head.header_hits + trailer_hits;
        let mut evidence = serde_json::Map::new();
        if redactions > 0 {
            evidence.insert("redactions".into(), redactions.into());
        }
        if let Err(why) = &decoded {
            evidence.insert("body_withheld".into(), why.as_str().into());
        }
        if let Some(hint) = respond::origin_retry_hint(&parts.headers) {
            evidence.insert("origin_should_retry".into(), hint.into());
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
        let mut stored = self.stored_result(
            status.as_u16(),
            &parts.headers,
            &body,
            &digest,
            resolution.outcome,
            decoded.is_ok(),
        );
        if let Some(end) = &grpc_end {
            grpc::record_in(&mut stored, end);
        }
        let complete = Draft::observed(Body::RemoteResponseComplete(ResponseComplete {
            completion,
            bytes: body.len() as u64,
            digest: digest.clone(),
        }))
        .source(Source::RemoteResponse)
        .hop("origin");
        let whole = Whole {
            digest,
            bytes: body.len() as u64,
            completion,
            grpc_status: grpc_end.as_ref().map(|end| end.status),
        };
        let committed = origin_committed(resolution, status, whole, evidence);
        let drafts = vec![started, complete, committed];
        let outcome = match self
            .commit_for_agent(drafts, stored, resolution, reply)
            .await
        {
            Ok(outcome) => outcome,
            Err(out) => return out,
        };
        self.delivered_bytes = delivered.len() as u64;
        let (mut delivery, done) = DeliveryBody::to_agent(delivered, self.flush.clone());
        if let Some(end) = &grpc_end {
            // Postern-Outcome rides in the trailers too: gRPC clients read them.
            delivery = delivery.with_trailers(grpc::agent_trailers(end, &outcome));
        }
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
        respond::hint_retry(
            out.headers_mut(),
            should_retry_value(resolution.retry, None),
        );
        Outgoing::Deliver { resp: out, done }
    }

    /// Commits the result with its drafts. `Ok`: the `Postern-Outcome` for the agent;
    /// `Err`: what happens instead (the store failed, or the agent left).
    pub(in crate::http) async fn commit_for_agent(
        &mut self,
        drafts: Vec<Draft>,
        stored: StoredResult,
        resolution: StatusResolution,
        reply: &oneshot::Sender<Response<ProxyBody>>,
    ) -> Result<String, Outgoing> {
        if self.inv.commit_result(drafts, stored).await.is_err() {
            let env = self.inv.result_store_failed().await;
            return Err(Outgoing::Respond(respond::envelope(&env)));
        }
        if reply.is_closed() {
            return Err(Outgoing::Gone);
        }
        let (outcome, retry) = (resolution.outcome, resolution.retry);
        Ok(postern_outcome(
            outcome,
            Phase::RemoteExecution,
            retry,
            None,
        ))
    }

    /// SPEC §3.6: an intermediary's error never resolves the invocation. `UPSTREAM_HOP_ERROR`
    /// (unknown), the hop named in the evidence, its member kept first in `Proxy-Status`.
    async fn hop_error(
        &mut self,
        status: StatusCode,
        name: String,
        member: Option<String>,
        started: Draft,
    ) -> Response<ProxyBody> {
        let hop = match &self.hop {
            // The route's own hop: its name unless it named itself.
            Some(h) => h.evidence_name(Some(&name)),
            None => format!("proxy:{name}"),
        };
        let mut f = Failure::of(Code::UpstreamHopError);
        f.evidence
            .insert("hop_status".into(), status.as_u16().into());
        if let Some(member) = &member {
            f.evidence
                .insert("hop_proxy_status".into(), member.clone().into());
        }
        let failed = Draft::observed(Body::Failed(f)).hop(&hop);
        let recorded = self.inv.record(vec![started.hop(&hop), failed]).await;
        let env = self.inv.envelope(&recorded, Code::UpstreamHopError);
        let mut resp = respond::envelope(&env);
        if let Some(member) = member {
            let ours = env.proxy_status();
            if let Ok(v) = HeaderValue::from_str(&format!("{member}, {ours}")) {
                resp.headers_mut().insert(PROXY_STATUS, v);
            }
        }
        resp
    }

    /// A `407` on an http request sent to the route's hop is the hop's own refusal (an origin
    /// asks for credentials with `401`): it never resolves the invocation as the origin's.
    fn hop_refused_auth(&self, status: StatusCode) -> Option<(String, Option<String>)> {
        let hop = self.plain_hop()?;
        (status == StatusCode::PROXY_AUTHENTICATION_REQUIRED).then(|| (hop.via().name(), None))
    }

    /// Classifies a final response head and cleans its headers for the agent.
    pub(in crate::http) fn resolve_head(
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
        if status == StatusCode::UNAUTHORIZED
            && let Some(injection) = &self.injection
        {
            // The origin no longer takes the minted token: the next request mints anew.
            injection.refused_by_origin(&self.proxy.minter);
        }
        strip_hop_by_hop(headers);
        strip_error_proxy_status(headers);
        // No guard for a credentialed route: nothing is relayed (the caller fails it).
        let guard = self.response_guard()?;
        let header_hits = redact_headers(&guard, headers);
        Some(Head {
            resolution,
            guard,
            header_hits,
        })
    }

    /// Whether a secret of this host's can come back on this exchange: the origin is then
    /// asked for what the guard reads whole (codings it decodes, no ranges).
    pub(in crate::http) fn guarded(&self) -> bool {
        self.injection.is_some() || !self.neighbours.is_empty()
    }

    /// The reflection guard for the response: the route's credential, the hop's when an
    /// http request carried it to the hop in the clear, and the other credentials routes
    /// inject into this host. `None` if it cannot be built (nothing is relayed then).
    pub(in crate::http) fn response_guard(&self) -> Option<Arc<ReflectionGuard>> {
        let hop = self.plain_hop().and_then(|h| h.credential());
        let all: Vec<&Injection> = (self.injection.iter().chain(hop))
            .chain(&self.neighbours)
            .collect();
        Injection::guard_all(&all, &self.proxy.guards)
    }

    pub(in crate::http) fn stored_result(
        &self,
        status: u16,
        headers: &HeaderMap,
        body: &Bytes,
        digest: &str,
        outcome: Outcome,
        keep: bool,
    ) -> StoredResult {
        let keep = keep && body.len() as u64 <= self.config.journal.max_result_bytes;
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
                grpc_status: None,
                trailers: Vec::new(),
            }),
            complete: true,
            expires_at_ms: self.inv.journal().result_expiry_ms(),
        }
    }
}

/// A buffered body as the guard must see it on a credentialed route: decoded (its content
/// coding, a packed echo checked, a gRPC call's messages uncompressed), or withheld (the
/// head then says so).
fn for_guard(
    guard: &ReflectionGuard,
    guarded: bool,
    grpc: bool,
    headers: &mut HeaderMap,
    body: &Bytes,
    cap: u64,
) -> Result<Bytes, Undecodable> {
    let plain = decode::for_guard(guarded, headers, body, cap)?;
    if !guarded {
        return Ok(plain);
    }
    if let Err(why) = decode::check_packed(guard, &plain, cap) {
        decode::mark_withheld(headers, why);
        return Err(why);
    }
    match grpc {
        true => grpc::for_guard(headers, &plain, cap),
        false => Ok(plain),
    }
}

/// What a complete response was: digest and length of its body, and what ended it.
pub(in crate::http) struct Whole {
    pub digest: String,
    pub bytes: u64,
    pub completion: Completion,
    /// The `grpc-status` that ended a gRPC call.
    pub grpc_status: Option<u32>,
}

/// `RESULT_COMMITTED` for a complete response from the origin.
pub(in crate::http) fn origin_committed(
    resolution: StatusResolution,
    status: StatusCode,
    whole: Whole,
    evidence: serde_json::Map<String, serde_json::Value>,
) -> Draft {
    Draft::observed(Body::ResultCommitted(ResultCommitted {
        outcome: resolution.outcome,
        retry: resolution.retry,
        status: Some(status.as_u16()),
        exit_status: None,
        exit_signal: None,
        grpc_status: whole.grpc_status,
        digest: whole.digest,
        bytes: whole.bytes,
        complete: true,
        completion: Some(whole.completion),
        evidence,
    }))
    .source(Source::RemoteResponse)
    .hop("origin")
}

/// A classified response head: its resolution and the reflection guard for its body.
pub(in crate::http) struct Head {
    pub resolution: StatusResolution,
    pub guard: Arc<ReflectionGuard>,
    pub header_hits: usize,
}

/// A body read up to a limit: all of it (with its trailers, if any), or the first part
/// and the rest still to come.
pub(in crate::http) enum Collected {
    Complete(Bytes, Option<HeaderMap>),
    Partial(Bytes, Incoming),
}

impl Exchange {
    /// Reads a response to its end or past `limit`, reserving budget as bytes arrive;
    /// without budget the rest is streamed. An idle gap, a short body or bad framing is an error.
    pub(in crate::http) async fn collect(
        &mut self,
        mut body: Incoming,
        idle: Duration,
        limit: u64,
    ) -> Result<Collected, String> {
        let mut buf = BytesMut::new();
        let mut trailers = None;
        if limit == 0 {
            return Ok(Collected::Partial(Bytes::new(), body));
        }
        loop {
            let frame = match tokio::time::timeout(idle, body.frame()).await {
                Err(_) => return Err(format!("no body bytes for {idle:?}")),
                Ok(None) => return Ok(Collected::Complete(buf.freeze(), trailers)),
                Ok(Some(Err(e))) => return Err(body_error(&e)),
                Ok(Some(Ok(frame))) => frame,
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    trailers = frame.into_trailers().ok().or(trailers);
                    continue;
                }
            };
            let Some(more) = self.proxy.budget.try_reserve(data.len() as u64) else {
                self.proxy.budget.streamed.inc();
                buf.extend_from_slice(&data);
                return Ok(Collected::Partial(buf.freeze(), body));
            };
            self.held.merge(more);
            buf.extend_from_slice(&data);
            if buf.len() as u64 > limit {
                return Ok(Collected::Partial(buf.freeze(), body));
            }
        }
    }
}
