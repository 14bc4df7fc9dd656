//! Streamed delivery: parts flow to the agent as they arrive (SSE keeps its per-event
//! latency), while the end of the agent's stream is held back until `RESULT_COMMITTED`
//! is durable. A broken upstream aborts the agent's stream; it never ends cleanly.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::body::body_error;
use super::body::{ChannelBody, Chunk};
use super::flushed::DeliveryEnd;
use crate::config::Route;
use crate::contract::{
    Code, Completion, Phase, StatusResolution, classify_grpc_status, postern_outcome,
};
use crate::guard::{Carry, Mask, ReflectionGuard};
use crate::http::Exchange;
use crate::http::message::decode::{self, Decoder, Undecodable};
use crate::http::message::grpc::{self, GrpcEnd, Messages};
use crate::http::message::headers::stored_headers;
use crate::http::message::respond::ProxyBody;
use crate::http::message::respond::{
    POSTERN_DELIVERY, POSTERN_INVOCATION, POSTERN_OUTCOME, Relayed,
};
use crate::journal::{
    BODY_STORED, Body, Draft, Failure, HttpResult, Payload, ResponseComplete, ResultCommitted,
    Source, StoredResult, b64, sha256_tagged_digest,
};
use tokio::sync::oneshot;

/// Everything the pump needs once the head has gone out.
pub struct StreamPlan {
    prefix: Bytes,
    rest: Option<Incoming>,
    tx: mpsc::Sender<Chunk>,
    resolution: StatusResolution,
    status: u16,
    stored_headers: Vec<(String, String)>,
    completion: Completion,
    guard: std::sync::Arc<ReflectionGuard>,
    header_hits: usize,
    decoder: Option<Decoder>,
    /// A gRPC call on a credentialed route: its messages, decoded.
    messages: Option<Messages>,
    withheld: Option<Undecodable>,
    trailers: bool,
    idle: Duration,
    /// The request may be sent again as it was (an idempotent method on its route).
    idempotent: bool,
    /// A gRPC call: the status a trailers-only head carried (taken out of it), and
    /// the origin's trailers once they came.
    grpc: Option<GrpcTail>,
}

/// What ends a streamed gRPC response.
struct GrpcTail {
    head_status: HeaderMap,
    trailers: Option<HeaderMap>,
    end: Option<GrpcEnd>,
}

/// A streamed response whose head can go out now; the pump feeds its body.
pub struct StreamStart {
    pub resp: Response<ProxyBody>,
    pub done: oneshot::Receiver<DeliveryEnd>,
    pub plan: Box<StreamPlan>,
}

/// How the pump ended.
pub enum StreamEnd {
    /// The upstream broke; the record says `REMOTE_RESULT_INCOMPLETE`.
    Broken,
    /// The result is committed. If the agent left, body data meant for it may have been
    /// `lost` (never handed to its connection).
    Committed { lost: bool },
}

/// The delivered bytes: digest, length, and the stored copy while it fits.
struct Tally {
    hasher: Sha256,
    stored: Vec<u8>,
    keep: bool,
    cap: u64,
    bytes: u64,
    hits: usize,
    carry: Carry,
    decoder: Option<Decoder>,
    messages: Option<Messages>,
    withheld: Option<Undecodable>,
    /// Body data the agent's connection never took (it had left, or it was withheld).
    lost: bool,
}

impl Tally {
    fn absorb(&mut self, out: &[u8]) {
        self.hasher.update(out);
        self.bytes += out.len() as u64;
        if self.keep {
            if self.stored.len() as u64 + out.len() as u64 > self.cap {
                self.keep = false;
                self.stored = Vec::new();
            } else {
                self.stored.extend_from_slice(out);
            }
        }
    }

    /// The plain bytes of coded ones (the end of the body when `coded` is `None`): the
    /// content coding undone, then a gRPC call's messages. With them, why the body stops
    /// here if it cannot be decoded.
    fn decode(&mut self, coded: Option<&[u8]>) -> (Bytes, Option<Undecodable>) {
        let plain = match (&mut self.decoder, coded) {
            (None, Some(data)) => Ok(Bytes::copy_from_slice(data)),
            (None, None) => Ok(Bytes::new()),
            (Some(d), Some(data)) => d.push(data),
            (Some(d), None) => d.finish(),
        };
        match (plain, &mut self.messages) {
            (Err(why), _) => (Bytes::new(), Some(why)),
            (Ok(plain), None) => (plain, None),
            (Ok(plain), Some(messages)) => messages.push(&plain, coded.is_none()),
        }
    }
}

/// The agent left, the body will not be stored, and the request may be sent again: reading
/// the rest of the body would cost postern and the origin for nothing.
fn nobody_needs_the_rest(plan: &StreamPlan, tally: &Tally, agent_gone: bool) -> bool {
    agent_gone && plan.idempotent && !tally.keep && tally.withheld.is_none()
}

impl Exchange {
    /// Sends the head now (without `Postern-Outcome`: nothing is known yet).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::http) async fn start_stream(
        &mut self,
        route: &Route,
        status: StatusCode,
        mut parts: http::response::Parts,
        completion: Completion,
        grpc: bool,
        prefix: Bytes,
        rest: Incoming,
        started: Draft,
    ) -> Result<StreamStart, Response<ProxyBody>> {
        let Some(head) = self.resolve_head(route, status, &mut parts.headers) else {
            return Err(self
                .fail(vec![started], Failure::of(Code::RemoteOutcomeUnknown))
                .await);
        };
        let (resolution, guard, header_hits) = (head.resolution, head.guard, head.header_hits);
        let (mut decoder, mut withheld, mut messages) = (None, None, None);
        if !guard.is_empty() {
            // Redaction may change the length: frame the body with chunks instead.
            parts.headers.remove(header::CONTENT_LENGTH);
            let journal = &self.config.journal;
            let cap = journal.buffer_limit.max(journal.max_result_bytes);
            let cap = usize::try_from(cap).unwrap_or(usize::MAX);
            match decode::decoder_for(&parts.headers, cap) {
                Ok(d) => decoder = d,
                Err(why) => withheld = Some(why),
            }
            messages = grpc.then(|| Messages::for_head(&mut parts.headers, cap));
            parts.headers.remove(header::CONTENT_ENCODING);
            if let Some(why) = withheld {
                decode::mark_withheld(&mut parts.headers, why);
            }
        }
        let grpc = grpc.then(|| GrpcTail {
            // Relayed with the trailers: the agent's stream ends after the commit.
            head_status: grpc::take_head_status(&mut parts.headers),
            trailers: None,
            end: None,
        });
        if grpc.is_some() {
            // h2 frames the body; a length would not cover the trailers' wait anyway.
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        let stored = stored_headers(&parts.headers);
        let trailers = self.agent_trailers && !parts.headers.contains_key(header::CONTENT_LENGTH);
        parts.version = http::Version::HTTP_11;
        let h = &mut parts.headers;
        if let Ok(v) = HeaderValue::from_str(self.inv.id()) {
            h.insert(POSTERN_INVOCATION, v);
        }
        h.insert(POSTERN_DELIVERY, HeaderValue::from_static("streamed"));
        if trailers && grpc.is_none() {
            h.insert(header::TRAILER, HeaderValue::from_static("postern-outcome"));
        }
        if self.inv.record(vec![started]).await.is_err() {
            return Err(self
                .fail(vec![], Failure::of(Code::RemoteOutcomeUnknown))
                .await);
        }
        let (tx, rx) = mpsc::channel(32);
        let (body, done) = ChannelBody::new(rx, self.flush.clone());
        let mut resp = Response::from_parts(parts, body.boxed());
        resp.extensions_mut().insert(Relayed);
        let plan = StreamPlan {
            prefix,
            rest: Some(rest),
            tx,
            resolution,
            status: status.as_u16(),
            stored_headers: stored,
            completion,
            guard,
            header_hits,
            decoder,
            messages,
            withheld,
            trailers,
            idle: route.idle_timeout,
            idempotent: route.idempotent_methods.contains(&self.method),
            grpc,
        };
        Ok(StreamStart {
            resp,
            done,
            plan: Box::new(plan),
        })
    }

    /// Relays the body to its framing end, commits it, then releases the stream's end.
    pub(in crate::http) async fn pump(
        &mut self,
        mut plan: StreamPlan,
        mut agent_gone: bool,
    ) -> StreamEnd {
        let mut tally = Tally {
            hasher: Sha256::new(),
            stored: Vec::new(),
            keep: true,
            cap: self.config.journal.max_result_bytes,
            bytes: 0,
            hits: plan.header_hits,
            // gRPC messages are length-prefixed: a hit keeps its length.
            carry: match plan.grpc {
                Some(_) => Carry::masked(Mask::SameLength),
                None => Carry::default(),
            },
            decoder: plan.decoder.take(),
            messages: plan.messages.take(),
            withheld: plan.withheld,
            // A head that never went out: nothing reached the agent.
            lost: agent_gone,
        };
        tally.keep = tally.withheld.is_none();
        if agent_gone {
            self.inv.caller_cancelled().await;
        }
        let Some(mut rest) = plan.rest.take() else {
            return self.broken(&plan.tx, "no body to stream".into()).await;
        };
        self.forward(
            &plan.guard,
            &plan.tx,
            &mut tally,
            Some(&plan.prefix),
            &mut agent_gone,
        )
        .await;
        loop {
            match tokio::time::timeout(plan.idle, rest.frame()).await {
                Err(_) => {
                    return self
                        .broken(&plan.tx, format!("no body bytes for {:?}", plan.idle))
                        .await;
                }
                Ok(Some(Err(e))) => return self.broken(&plan.tx, body_error(&e)).await,
                Ok(None) => break,
                Ok(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let data = Some(&data[..]);
                        self.forward(&plan.guard, &plan.tx, &mut tally, data, &mut agent_gone)
                            .await;
                        if nobody_needs_the_rest(&plan, &tally, agent_gone) {
                            // The record stays CALLER_CANCELLED/unknown: a new GET is safe.
                            return StreamEnd::Broken;
                        }
                    }
                    Err(frame) => {
                        if let (Some(tail), Ok(t)) = (plan.grpc.as_mut(), frame.into_trailers()) {
                            tail.trailers = Some(t);
                        }
                    }
                },
            }
        }
        self.forward(&plan.guard, &plan.tx, &mut tally, None, &mut agent_gone)
            .await;
        let (tail, hits) = plan.guard.finish(&mut tally.carry);
        tally.hits += hits;
        tally.absorb(&tail);
        if let Some(grpc) = plan.grpc.as_mut() {
            let head_status = std::mem::take(&mut grpc.head_status);
            let mut end = match grpc::end(head_status, grpc.trailers.take(), &plan.guard) {
                Ok(end) => end,
                Err(diag) => return self.broken(&plan.tx, diag.into()).await,
            };
            if let Some(why) = tally.withheld {
                end.withhold(why);
            }
            plan.resolution = classify_grpc_status(end.status);
            tally.hits += end.hits;
            grpc.end = Some(end);
        }
        if !self.commit_stream(&plan, &mut tally).await {
            let _ = plan.tx.send(Chunk::Abort).await;
            return StreamEnd::Broken;
        }
        if !agent_gone {
            // Only the stream's end is left, unless the guard held back a tail (or a gRPC
            // status rides the trailers).
            let tail_is_data = !tail.is_empty() || plan.grpc.is_some();
            agent_gone = !self.release_end(&plan, tail).await;
            tally.lost |= agent_gone && tail_is_data;
        }
        StreamEnd::Committed { lost: tally.lost }
    }

    async fn forward(
        &mut self,
        guard: &ReflectionGuard,
        tx: &mpsc::Sender<Chunk>,
        tally: &mut Tally,
        coded: Option<&[u8]>,
        agent_gone: &mut bool,
    ) {
        if tally.withheld.is_some() {
            return;
        }
        let (data, failed) = tally.decode(coded);
        let (out, hits) = guard.redact_stream(&mut tally.carry, &data);
        tally.hits += hits;
        self.hand_on(tx, tally, out, agent_gone).await;
        if let Some(why) = failed {
            self.withhold(guard, tx, tally, why, agent_gone).await;
        }
    }

    /// Guarded bytes toward the agent, counted as delivered.
    async fn hand_on(
        &mut self,
        tx: &mpsc::Sender<Chunk>,
        tally: &mut Tally,
        out: Bytes,
        agent_gone: &mut bool,
    ) {
        tally.absorb(&out);
        if *agent_gone && !out.is_empty() {
            tally.lost = true;
        } else if !out.is_empty() && tx.send(Chunk::Data(out)).await.is_err() {
            *agent_gone = true;
            tally.lost = true;
            self.inv.caller_cancelled().await;
        }
    }

    /// The rest of the body cannot be decoded, so it is never relayed: the agent's
    /// stream is aborted (it is visibly incomplete; a gRPC call ends with postern's status
    /// instead), and the upstream is still read to its end so the invocation resolves;
    /// the stored result keeps no body.
    async fn withhold(
        &mut self,
        guard: &ReflectionGuard,
        tx: &mpsc::Sender<Chunk>,
        tally: &mut Tally,
        why: Undecodable,
        agent_gone: &mut bool,
    ) {
        tally.withheld = Some(why);
        tally.keep = false;
        tally.stored = Vec::new();
        if tally.messages.is_some() {
            // A gRPC call: the messages before this one are whole, so they go out, and
            // the call ends with postern's status in its trailers (`GrpcEnd::withhold`).
            let (tail, hits) = guard.finish(&mut tally.carry);
            tally.hits += hits;
            return self.hand_on(tx, tally, tail, agent_gone).await;
        }
        tally.lost = true;
        tally.carry.clear();
        if !*agent_gone {
            let _ = tx.send(Chunk::Abort).await;
            *agent_gone = true;
        }
    }

    async fn broken(&mut self, tx: &mpsc::Sender<Chunk>, diagnostic: String) -> StreamEnd {
        let _ = self
            .inv
            .fail_with(Code::RemoteResultIncomplete, diagnostic)
            .await;
        let _ = tx.send(Chunk::Abort).await;
        StreamEnd::Broken
    }

    /// `REMOTE_RESPONSE_COMPLETE` + `RESULT_COMMITTED` with the result, durable.
    async fn commit_stream(&mut self, plan: &StreamPlan, tally: &mut Tally) -> bool {
        let digest = sha256_tagged_digest(&std::mem::take(&mut tally.hasher).finalize());
        let mut evidence = serde_json::Map::new();
        evidence.insert("delivery".into(), "streamed".into());
        if tally.hits > 0 {
            evidence.insert("redactions".into(), tally.hits.into());
        }
        if let Some(why) = tally.withheld {
            evidence.insert("body_withheld".into(), why.as_str().into());
        }
        if !tally.keep {
            evidence.insert(BODY_STORED.into(), false.into());
        }
        let complete = Draft::observed(Body::RemoteResponseComplete(ResponseComplete {
            completion: plan.completion,
            bytes: tally.bytes,
            digest: digest.clone(),
        }))
        .source(Source::RemoteResponse)
        .hop("origin");
        let grpc_end = plan.grpc.as_ref().and_then(|g| g.end.as_ref());
        let committed = Draft::observed(Body::ResultCommitted(ResultCommitted {
            outcome: plan.resolution.outcome,
            retry: plan.resolution.retry,
            status: Some(plan.status),
            exit_status: None,
            exit_signal: None,
            grpc_status: grpc_end.map(|end| end.status),
            digest: digest.clone(),
            bytes: tally.bytes,
            complete: true,
            completion: Some(plan.completion),
            evidence,
        }))
        .source(Source::RemoteResponse)
        .hop("origin");
        let result = StoredResult {
            invocation_id: self.inv.id().to_owned(),
            outcome: plan.resolution.outcome,
            payload: Payload::Http(HttpResult {
                status: plan.status,
                headers: plan.stored_headers.clone(),
                body_base64: tally.keep.then(|| b64(&tally.stored)),
                body_stored: tally.keep,
                digest,
                bytes: tally.bytes,
                grpc_status: grpc_end.map(|end| end.status),
                trailers: grpc_end.map_or_else(Vec::new, |end| stored_headers(&end.trailers)),
            }),
            complete: true,
            expires_at_ms: self.inv.journal().result_expiry_ms(),
        };
        self.delivered_bytes = tally.bytes;
        let drafts = vec![complete, committed];
        if self.inv.commit_result(drafts, result).await.is_ok() {
            return true;
        }
        let _ = self.inv.result_store_failed().await;
        false
    }

    /// Sends the held-back end: the last bytes, then `Postern-Outcome` as a trailer.
    async fn release_end(&mut self, plan: &StreamPlan, tail: Bytes) -> bool {
        let outcome = postern_outcome(
            plan.resolution.outcome,
            Phase::RemoteExecution,
            plan.resolution.retry,
            None,
        );
        if !plan.trailers {
            return plan.tx.send(Chunk::Last(tail)).await.is_ok();
        }
        if !tail.is_empty() && plan.tx.send(Chunk::Data(tail)).await.is_err() {
            return false;
        }
        let trailers = match plan.grpc.as_ref().and_then(|g| g.end.as_ref()) {
            Some(end) => grpc::agent_trailers(end, &outcome),
            None => {
                let mut trailers = HeaderMap::new();
                if let Ok(v) = HeaderValue::from_str(&outcome) {
                    trailers.insert(POSTERN_OUTCOME, v);
                }
                trailers
            }
        };
        plan.tx.send(Chunk::Trailers(trailers)).await.is_ok()
    }
}
