//! The agent's request body read into memory before dispatch, under the buffer budget,
//! with `request_body_timeout` as the longest gap between its bytes and `min_upload_rate`
//! as the slowest average once that much time has passed. A request that cannot get budget
//! in time is refused (`RATE_LIMITED`, 429, `Retry-After`, naming the agent's share or the
//! whole budget).

use std::time::Duration;

use tokio::time::Instant;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::contract::Code;
use crate::http::Exchange;
use crate::http::deliver::budget::{Exhausted, Reservation};
use crate::http::message::respond::{self, ProxyBody};
use crate::journal::{Body, Draft, Failure};

const BUDGET_MESSAGE: &str =
    "postern's buffer budget for request bodies is exhausted right now; retry later.";
const SHARE_MESSAGE: &str = "this agent's share of postern's buffer budget \
     (proxy.agent_buffer_budget) is held by its other uploads right now; retry later.";

/// Why a request body was not taken.
enum BodyError {
    TooLarge,
    Malformed,
    Stalled(Duration),
    /// Averaged under `min_upload_rate` (bytes/s) after the grace time.
    TooSlow(u64),
    Budget(Exhausted),
}

/// When a body that has `received` bytes since `start` is too slow: not before `grace`,
/// then once its average falls under `rate` bytes/s (0: never).
fn too_slow_at(start: Instant, received: u64, grace: Duration, rate: u64) -> Option<Instant> {
    if rate == 0 {
        return None;
    }
    let earned = Duration::from_secs_f64(received as f64 / rate as f64);
    Some(start + grace.max(earned))
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// The body of the request an exchange sends: the agent's, still arriving, or one kept in
/// the journal (a retried invocation's).
pub(in crate::http) enum AgentBody {
    Incoming(Incoming),
    Kept(Bytes),
}

impl Exchange {
    /// Reads the agent's body whole; on failure records it and answers with the envelope.
    pub(in crate::http) async fn intake(
        &mut self,
        body: AgentBody,
        headers: &HeaderMap,
    ) -> Result<Bytes, Response<ProxyBody>> {
        let body = match body {
            AgentBody::Incoming(b) => b,
            AgentBody::Kept(bytes) => return Ok(bytes),
        };
        match self.read_body(body, headers).await {
            Ok(b) => Ok(b),
            Err(e) => Err(self.body_refused(e).await),
        }
    }

    async fn read_body(
        &mut self,
        mut body: Incoming,
        headers: &HeaderMap,
    ) -> Result<Bytes, BodyError> {
        let limit = self.config.proxy.max_request_bytes;
        let gap = self.config.proxy.request_body_timeout;
        let rate = self.config.proxy.min_upload_rate;
        let budget = &self.proxy.budget;
        let declared = declared_length(headers);
        if declared.is_some_and(|n| n > limit) {
            return Err(BodyError::TooLarge);
        }
        // A declared length is reserved whole up front; chunked bodies as bytes arrive.
        if let Some(n) = declared.filter(|n| *n > 0) {
            let held = budget.reserve(&self.agent, n).await;
            self.held.merge(held.map_err(BodyError::Budget)?);
        }
        let mut buf = BytesMut::with_capacity(declared.unwrap_or(0) as usize);
        let start = Instant::now();
        loop {
            let stalled = Instant::now() + gap;
            let slow = too_slow_at(start, buf.len() as u64, gap, rate);
            let wait = slow.map_or(stalled, |s| s.min(stalled));
            let frame = match tokio::time::timeout_at(wait, body.frame()).await {
                Err(_) if slow.is_some_and(|s| s <= stalled) => {
                    return Err(BodyError::TooSlow(rate));
                }
                Err(_) => return Err(BodyError::Stalled(gap)),
                Ok(None) => return Ok(buf.freeze()),
                Ok(Some(Err(_))) => return Err(BodyError::Malformed),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if buf.len() as u64 + data.len() as u64 > limit {
                return Err(BodyError::TooLarge);
            }
            if declared.is_none() {
                let more = budget.reserve(&self.agent, data.len() as u64).await;
                self.held.merge(more.map_err(BodyError::Budget)?);
            }
            buf.extend_from_slice(&data);
        }
    }

    async fn body_refused(&mut self, e: BodyError) -> Response<ProxyBody> {
        self.held = Reservation::default();
        let mut failure = Failure::of(match e {
            BodyError::TooLarge => Code::PayloadLimit,
            BodyError::Malformed | BodyError::Stalled(_) | BodyError::TooSlow(_) => {
                Code::MalformedRequest
            }
            BodyError::Budget(_) => Code::RateLimited,
        });
        failure.field = Some("body".into());
        match e {
            BodyError::Stalled(gap) => {
                failure.diagnostic = Some(format!("no request body bytes for {gap:?}"));
            }
            BodyError::TooSlow(rate) => {
                failure.diagnostic = Some(format!(
                    "the request body arrived slower than proxy.min_upload_rate ({rate} bytes/s)"
                ));
            }
            BodyError::Budget(which) => {
                self.proxy.budget.refused.inc();
                let (reason, message) = match which {
                    Exhausted::AgentShare => ("agent_buffer_share_exhausted", SHARE_MESSAGE),
                    Exhausted::Budget => ("buffer_budget_exhausted", BUDGET_MESSAGE),
                };
                failure.evidence.insert("reason".into(), reason.into());
                return self.budget_refused(failure, message).await;
            }
            BodyError::TooLarge | BodyError::Malformed => {}
        }
        self.fail(vec![], failure).await
    }

    /// `RATE_LIMITED` whose message names what ran out, with `Retry-After`.
    async fn budget_refused(&mut self, failure: Failure, message: &str) -> Response<ProxyBody> {
        let recorded = self
            .inv
            .record(vec![Draft::observed(Body::Failed(failure))])
            .await;
        let envelope = recorded
            .as_ref()
            .ok()
            .and_then(|a| a.state.record.envelope.clone());
        let mut resp = match envelope {
            Some(mut env) => {
                env.error.message = message.into();
                respond::envelope(&env)
            }
            None => self.fallback(Code::RateLimited),
        };
        let retry_after = self.proxy.budget.wait.as_secs().max(1);
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
        resp
    }
}
