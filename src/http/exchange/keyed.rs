//! A route's idempotency contract on an HTTP request (SPEC §3.4): the key (the agent's, or
//! one postern makes with `generate = true`), the lifecycle's turn for it, and the answers
//! that need no dispatch — a replayed result (`Postern-Replayed: true`), a mismatch, an
//! attempt in progress. A route without a contract never gets here: an agent's key there
//! is an ordinary header, forwarded untouched and never trusted.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use serde_json::json;

use crate::config::{Idempotency, Route};
use crate::contract::{
    Code, Envelope, FailureContext, OperationFacts, Outcome, Phase, ResponseFacts, Retry,
    classify_status, postern_outcome, resolve_failure, should_retry_value,
};
use crate::http::Exchange;
use crate::http::message::headers::names_in_connection;
use crate::http::message::respond::{self, POSTERN_INVOCATION, POSTERN_OUTCOME, ProxyBody};
use crate::journal::{Failure, KeySlot, Payload, State, StoredResult, unb64};
use crate::lifecycle::idempotency::{
    KeyBinding, KeyContract, KeyedRequest, Turn, bind, reserve_or_take_turn,
};
use crate::lifecycle::lease::LeaseTerms;

/// Marks an answer replayed from the result store (no dispatch).
pub const POSTERN_REPLAYED: &str = "postern-replayed";

/// The longest key postern accepts (it is journaled and indexed).
const MAX_KEY_BYTES: usize = 255;

/// The key this exchange dispatches with.
pub(in crate::http) struct KeyUse {
    pub request: KeyedRequest,
    pub contract: KeyContract,
    /// The window an earlier dispatch of the key opened (a leased generation).
    pub kept_safe_until_ms: Option<i64>,
}

/// What the key means for this request: go on (with or without a key), or answer now.
pub(in crate::http) type Keyed = Result<Option<KeyUse>, Response<ProxyBody>>;

fn contract_of(c: &Idempotency) -> KeyContract {
    KeyContract {
        scope: c.scope.clone(),
        retention: c.retention,
        safe_margin: c.safe_margin,
    }
}

impl Exchange {
    /// Resolves the key before anything is journaled. A first use goes on as this
    /// exchange's invocation; a known key replays, refuses, or swaps in a new generation
    /// of its invocation (`self.inv`).
    pub(in crate::http) async fn keyed(
        &mut self,
        route: &Route,
        c: &Idempotency,
        headers: &HeaderMap,
        fingerprint: &str,
    ) -> Keyed {
        let name = c.header.to_ascii_lowercase();
        let sent = match agent_key(headers, &name) {
            Ok(k) => k,
            Err(field) => {
                let mut f = Failure::of(Code::MalformedRequest);
                f.field = Some(format!("headers.{field}"));
                return Err(self.fail(vec![], f).await);
            }
        };
        if self.inv.leased() {
            return self.leased_key(c, sent, &name, fingerprint).await;
        }
        let (key, generated) = match sent {
            Some(k) => (k, false),
            None if c.generate => (format!("pk_{}", ulid::Ulid::generate()), true),
            None => return Ok(None),
        };
        if generated {
            self.added_key = key_header(&name, &key);
        }
        let request = KeyedRequest {
            slot: KeySlot {
                scope: c.scope.clone(),
                agent: self.agent.clone(),
                key,
            },
            fingerprint: fingerprint.to_owned(),
        };
        let contract = contract_of(c);
        let mut key_use = KeyUse {
            request,
            contract,
            kept_safe_until_ms: None,
        };
        // A key postern just made cannot be known.
        if generated {
            return Ok(Some(key_use));
        }
        let journal = self.proxy.journal.clone();
        let (turn, reserved) = reserve_or_take_turn(
            &journal,
            &key_use.request,
            &key_use.contract,
            self.inv.id(),
            LeaseTerms::for_route(route, Some("same idempotency key".into())),
        )
        .await;
        self.key_reserved = reserved;
        match turn {
            Turn::Fresh => Ok(Some(key_use)),
            Turn::Leased { inv, safe_until_ms } => {
                self.inv = *inv;
                key_use.kept_safe_until_ms = safe_until_ms;
                Ok(Some(key_use))
            }
            Turn::Replay(state) => Err(self.replay(route, &state).await),
            Turn::Refuse(env) => Err(respond::envelope(&env)),
            Turn::Mismatch(entry) => Err(self.mismatch(&key_use, &name, entry).await),
            Turn::Unavailable => Err(self.fallback(Code::JournalUnavailable)),
        }
    }

    /// A generation leased before this exchange began (`handle_leased`): the key is the
    /// one its invocation recorded, sent upstream if the request lacks it; another key is
    /// another request.
    async fn leased_key(
        &mut self,
        c: &Idempotency,
        sent: Option<String>,
        name: &str,
        fingerprint: &str,
    ) -> Keyed {
        let state = match self.proxy.journal.state(self.inv.id()) {
            Ok(Some(s)) => s,
            _ => return Err(self.fallback(Code::JournalUnavailable)),
        };
        let Some(recorded) = state.record.evidence.idempotency.clone() else {
            return Ok(None);
        };
        match sent {
            Some(k) if k != recorded.key => {
                let mut f = Failure::of(Code::FingerprintChanged);
                f.field = Some(format!("headers.{name}"));
                return Err(self.fail(vec![], f).await);
            }
            Some(_) => {}
            None => self.added_key = key_header(name, &recorded.key),
        }
        let p = &state.progress;
        Ok(Some(KeyUse {
            request: KeyedRequest {
                slot: KeySlot {
                    scope: c.scope.clone(),
                    agent: state.record.agent.clone(),
                    key: recorded.key,
                },
                fingerprint: fingerprint.to_owned(),
            },
            contract: contract_of(c),
            kept_safe_until_ms: p.dispatched_ever.then_some(p.safe_until_ms).flatten(),
        }))
    }

    /// The key's evidence, safe-until and index claim for this invocation's preflight.
    pub(in crate::http) fn bind_key(&self, key_use: &KeyUse) -> KeyBinding {
        bind(
            &self.proxy.journal,
            &key_use.request,
            &key_use.contract,
            self.inv.id(),
            key_use.kept_safe_until_ms,
        )
    }

    /// Same key, another request: refused as its own `not_attempted` invocation, naming
    /// the invocation that holds the key.
    async fn mismatch(
        &mut self,
        key_use: &KeyUse,
        name: &str,
        entry: crate::journal::KeyEntry,
    ) -> Response<ProxyBody> {
        let mut f = Failure::of(Code::IdempotencyMismatch);
        f.field = Some(format!("headers.{name}"));
        f.evidence.insert(
            "idempotency_conflict".into(),
            json!({
                "key": key_use.request.slot.key,
                "scope": key_use.request.slot.scope,
                "invocation_id": entry.invocation_id,
                "recorded_fingerprint": entry.fingerprint,
                "fingerprint": key_use.request.fingerprint,
            }),
        );
        self.fail(vec![], f).await
    }

    /// The key's (or resend twin's) invocation is resolved: its stored result, under its own id, marked
    /// `Postern-Replayed: true`. Nothing is dispatched and nothing is journaled.
    pub(in crate::http) async fn replay(
        &self,
        route: &Route,
        state: &State,
    ) -> Response<ProxyBody> {
        let id = &state.record.invocation_id;
        // Another node's invocation: its result as the owner published it (SPEC §7).
        let stored = self.proxy.journal.find_result(id).await.ok().flatten();
        let mut resp = match stored.as_ref().and_then(replayable) {
            Some((status, headers, body)) => {
                let retry = replay_retry(route, state, status, &headers);
                let outcome =
                    postern_outcome(state.record.outcome, Phase::RemoteExecution, retry, None);
                let mut resp = Response::new(respond::full(body));
                *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
                *resp.headers_mut() = headers;
                set(&mut resp, POSTERN_INVOCATION, id);
                set(&mut resp, POSTERN_OUTCOME, &outcome);
                respond::hint_retry(resp.headers_mut(), should_retry_value(retry, None));
                resp
            }
            None => respond::envelope(&unreplayable(state)),
        };
        tracing::info!(invocation = %id, agent = %self.agent, "replayed a stored result (a reused idempotency key or an identical resend)");
        resp.headers_mut()
            .insert(POSTERN_REPLAYED, HeaderValue::from_static("true"));
        resp
    }
}

/// The agent's key: absent, or exactly one visible-ASCII value of bounded length. A key
/// whose header `Connection` names would be stripped before the origin (hop-by-hop), so
/// the origin never saw it: refused, naming `connection`. Otherwise the field is the key's.
fn agent_key<'a>(headers: &HeaderMap, name: &'a str) -> Result<Option<String>, &'a str> {
    if names_in_connection(headers).any(|n| n.eq_ignore_ascii_case(name)) {
        return Err("connection");
    }
    let mut values = headers.get_all(name).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    let ok = values.next().is_none()
        && !v.is_empty()
        && v.len() <= MAX_KEY_BYTES
        && v.as_bytes().iter().all(|b| b.is_ascii_graphic());
    match (ok, v.to_str()) {
        (true, Ok(s)) => Ok(Some(s.to_owned())),
        _ => Err(name),
    }
}

/// A header postern adds to the request it sends and to the agent's response.
fn key_header(name: &str, key: &str) -> Option<(HeaderName, HeaderValue)> {
    Some((
        HeaderName::from_bytes(name.as_bytes()).ok()?,
        HeaderValue::from_str(key).ok()?,
    ))
}

/// A stored HTTP result with its body: status, headers to replay, body.
fn replayable(stored: &StoredResult) -> Option<(u16, HeaderMap, Bytes)> {
    let Payload::Http(h) = &stored.payload else {
        return None;
    };
    let body = unb64(h.body_base64.as_deref().filter(|_| h.body_stored)?)?;
    let mut headers = HeaderMap::new();
    for (k, v) in &h.headers {
        let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) else {
            continue;
        };
        // Framing is the replay's own; postern's headers are set fresh.
        if k == header::CONTENT_LENGTH || k.as_str().starts_with("postern-") {
            continue;
        }
        headers.append(k, v);
    }
    Some((h.status, headers, Bytes::from(body)))
}

/// The retry of a replayed result, classified as when it was received.
fn replay_retry(route: &Route, state: &State, status: u16, headers: &HeaderMap) -> Retry {
    let facts = ResponseFacts {
        status,
        has_retry_after: headers.contains_key(header::RETRY_AFTER),
        idempotent: state.progress.idempotent,
    };
    match classify_status(facts, &route.status_outcomes) {
        Some(r) => r.retry,
        None if state.record.outcome == Outcome::Rejected => Retry::AfterCorrection,
        None => Retry::Never,
    }
}

/// A resolved invocation without a replayable body (attested by an operator, too large
/// to store, or expired): its own envelope, or "fetch the result" with its outcome.
fn unreplayable(state: &State) -> Envelope {
    if let Some(env) = &state.record.envelope {
        return env.clone();
    }
    let ctx = FailureContext {
        phase_reached: Phase::RemoteExecution,
        current_outcome: state.record.outcome,
        dispatched: true,
        result_stored: true,
        operation: OperationFacts::default(),
        now_ms: 0,
        hop_status: None,
    };
    Envelope::new(
        &state.record.invocation_id,
        resolve_failure(Code::ResultDeliveryFailed, &ctx),
        None,
        state.record.evidence.clone(),
    )
}

fn set(resp: &mut Response<ProxyBody>, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        resp.headers_mut().insert(name, v);
    }
}
