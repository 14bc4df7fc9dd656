//! Responses postern writes itself: the envelope with `Proxy-Status` and `Postern-Outcome`.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};

use crate::contract::{Code, Envelope, should_retry_value};

/// Every response body postern sends toward an agent.
pub type ProxyBody = BoxBody<Bytes, std::io::Error>;

pub const POSTERN_INVOCATION: &str = "postern-invocation";
pub const POSTERN_OUTCOME: &str = "postern-outcome";
pub const POSTERN_DELIVERY: &str = "postern-delivery";
pub const POSTERN_CREDENTIAL: &str = "postern-credential";
pub const PROXY_STATUS: &str = "proxy-status";
/// SDK retry hints (SPEC §3.7): Stainless-generated SDKs read the first, Stripe's the second.
pub const X_SHOULD_RETRY: &str = "x-should-retry";
pub const STRIPE_SHOULD_RETRY: &str = "stripe-should-retry";

/// Marks a response whose head and body are the origin's.
#[derive(Debug, Clone, Copy)]
pub struct Relayed;

/// A response to `HEAD` has no body (RFC 9110 §9.3.2). hyper drops one on HTTP/1.1, but on
/// h2 a DATA frame after a HEAD is a protocol error for the agent, so postern's own responses
/// (envelopes, challenges) lose theirs here. Relayed responses to HEAD are bodiless already
/// and keep their delivery tracking.
pub fn fit_to_method(head: bool, resp: Response<ProxyBody>) -> Response<ProxyBody> {
    if !head || resp.extensions().get::<Relayed>().is_some() {
        return resp;
    }
    let (parts, _) = resp.into_parts();
    Response::from_parts(parts, full(Bytes::new()))
}

pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

fn set(resp: &mut Response<ProxyBody>, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        resp.headers_mut().insert(name, v);
    }
}

/// postern's own error: status of §5.5, the envelope as JSON, and both headers.
pub fn envelope(env: &Envelope) -> Response<ProxyBody> {
    let body = serde_json::to_vec(env).unwrap_or_default();
    let mut resp = Response::new(full(body));
    *resp.status_mut() = StatusCode::from_u16(env.http_status()).unwrap_or(StatusCode::BAD_GATEWAY);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(id) = &env.invocation_id {
        set(&mut resp, POSTERN_INVOCATION, id);
    }
    set(&mut resp, POSTERN_OUTCOME, &env.postern_outcome());
    set(&mut resp, PROXY_STATUS, &env.proxy_status());
    let code = Some(env.error.code);
    hint_retry(
        resp.headers_mut(),
        should_retry_value(env.error.retry, code),
    );
    if env.error.code == Code::AttemptInProgress {
        // The SDK's next try comes after this; the running attempt may have ended by then.
        resp.headers_mut()
            .entry(header::RETRY_AFTER)
            .or_insert(HeaderValue::from_static("1"));
    }
    if env.error.code == Code::JournalUnavailable {
        // A journal refusing new work looks at free space again within 5 s; callers that
        // know their limit better (busy, budget) set their own.
        resp.headers_mut()
            .entry(header::RETRY_AFTER)
            .or_insert(HeaderValue::from_static("5"));
    }
    if env.error.code == Code::AgentUnauthenticated {
        resp.headers_mut().insert(
            header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"postern\""),
        );
    }
    resp
}

/// Sets both SDK retry hints to `value`. An origin's own hint stands (the remote's promise
/// about its own operation): where it sent one of the two, the other says the same.
pub fn hint_retry(headers: &mut http::HeaderMap, value: &'static str) {
    let origin = [X_SHOULD_RETRY, STRIPE_SHOULD_RETRY]
        .iter()
        .find_map(|name| headers.get(*name).cloned());
    let value = origin.unwrap_or(HeaderValue::from_static(value));
    for name in [X_SHOULD_RETRY, STRIPE_SHOULD_RETRY] {
        headers.entry(name).or_insert_with(|| value.clone());
    }
}

/// The hint an origin sent itself, if any (evidence: the remote's own promise).
pub fn origin_retry_hint(headers: &http::HeaderMap) -> Option<String> {
    [X_SHOULD_RETRY, STRIPE_SHOULD_RETRY]
        .iter()
        .find_map(|name| headers.get(*name)?.to_str().ok().map(str::to_owned))
}

/// The last word on a response leaving for the agent: one that carries no hint yet (a
/// streamed head, whose outcome is not known; postern's internal answers) says `false`,
/// which never permits a repeat the record would not.
pub fn with_retry_hint(mut resp: Response<ProxyBody>) -> Response<ProxyBody> {
    hint_retry(resp.headers_mut(), "false");
    resp
}

/// The `407` challenge to a request without credentials (counted, not journaled).
pub fn challenge() -> Response<ProxyBody> {
    envelope(&crate::contract::unjournaled_refusal(
        crate::contract::Code::AgentUnauthenticated,
        "headers.proxy-authorization",
    ))
}

/// Clients do not show the body of a refused `CONNECT` (Python: "Tunnel connection failed:
/// 403 Forbidden"), so the code and the invocation id go into the reason phrase, which they
/// print: `403 ROUTE_DENIED act_01…`.
pub fn explain_in_reason(mut resp: Response<ProxyBody>) -> Response<ProxyBody> {
    if resp.status().is_success() {
        return resp;
    }
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let code = header(POSTERN_OUTCOME).and_then(|o| {
        o.split(", ")
            .find_map(|kv| kv.strip_prefix("code=").map(str::to_owned))
    });
    let Some(code) = code else { return resp };
    let reason = match header(POSTERN_INVOCATION) {
        Some(id) => format!("{code} {id}"),
        None => code,
    };
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(reason) {
        resp.extensions_mut().insert(phrase);
    }
    resp
}

/// On a SigV4 route: an answer postern wrote itself (it has `Proxy-Status`) also names its
/// code in `x-amzn-ErrorType`, where AWS SDKs read an error's code (SPEC §3.8).
pub fn name_code_for_aws(headers: &mut HeaderMap) {
    if !headers.contains_key(PROXY_STATUS) {
        return;
    }
    let code = headers
        .get(POSTERN_OUTCOME)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').find_map(|f| f.trim().strip_prefix("code=")))
        .and_then(|c| HeaderValue::from_str(c).ok());
    if let Some(code) = code {
        headers.insert("x-amzn-errortype", code);
    }
}
