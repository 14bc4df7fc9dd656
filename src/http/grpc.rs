//! gRPC on the HTTP path (SPEC §3.2): a call is an h2 request with `content-type:
//! application/grpc…`. Its request needs `te: trailers` (gRPC servers reset a stream
//! without it); its response ends with trailers, and END_STREAM with a `grpc-status` is
//! the completeness marker (`completion: grpc_status`). The status decides the outcome
//! (`contract::classify_grpc_status`); a call that ends without one resolves nothing.
//!
//! The agent's stream end is the trailers, so it waits for `RESULT_COMMITTED` like any
//! other end: a trailers-only response (status in the head, END_STREAM on the HEADERS)
//! is relayed as a head and then trailers carrying that status.
//!
//! Messages are length-prefixed (and protobuf inside has its own lengths), so a secret
//! echoed in a message is masked byte for byte; in trailers (e.g. `grpc-message`) it is
//! redacted as in headers.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, header};

use super::headers::{redact_headers, strip_hop_by_hop};
use super::respond::POSTERN_OUTCOME;
use crate::contract::parse_grpc_status;
use crate::guard::{Carry, Mask, ReflectionGuard};
use crate::journal::{Payload, StoredResult};

const GRPC_STATUS: &str = "grpc-status";

/// The diagnostic of a gRPC response that ended without its status.
pub(super) const NO_STATUS: &str = "the gRPC response ended without a grpc-status";

/// The fields that carry a call's status (gRPC's PROTOCOL-HTTP2 "Trailers").
const STATUS_FIELDS: &[&str] = &[GRPC_STATUS, "grpc-message", "grpc-status-details-bin"];

/// `content-type: application/grpc`, `application/grpc+proto`, `application/grpc;…`
/// (not `application/grpc-web…`, which carries its trailers in the body over HTTP/1.1).
pub(super) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
        .is_some_and(|t| {
            t.strip_prefix("application/grpc")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['+', ';']))
        })
}

/// A response head that answers a gRPC call as one: `200`, and a gRPC content type or a
/// status of its own (trailers-only). Anything else is an HTTP answer (§1.5 decides it).
pub(super) fn is_grpc_response(status: http::StatusCode, headers: &HeaderMap) -> bool {
    status == http::StatusCode::OK && (is_grpc(headers) || headers.contains_key(GRPC_STATUS))
}

/// The gRPC call toward the origin: `te: trailers` (the hop-by-hop rules dropped the
/// agent's). With a credential injected, messages are asked for uncompressed: the guard
/// cannot read compressed ones.
pub(super) fn prepare_request(headers: &mut HeaderMap, guarded: bool) {
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    if guarded {
        headers.insert("grpc-accept-encoding", HeaderValue::from_static("identity"));
    }
}

/// A trailers-only response's status, taken out of the head: it goes to the agent as
/// trailers, after the commit.
pub(super) fn take_head_status(headers: &mut HeaderMap) -> HeaderMap {
    let mut moved = HeaderMap::new();
    if !headers.contains_key(GRPC_STATUS) {
        return moved;
    }
    for name in STATUS_FIELDS {
        let name = HeaderName::from_static(name);
        for value in headers.get_all(&name) {
            moved.append(name.clone(), value.clone());
        }
        headers.remove(&name);
    }
    moved
}

/// How a gRPC response ended: its status and the trailers for the agent.
pub(super) struct GrpcEnd {
    pub status: u32,
    /// The origin's trailers (or the head's status), cleaned and guarded.
    pub trailers: HeaderMap,
    /// Reflection guard hits in them.
    pub hits: usize,
}

/// The end of a gRPC response from what came after its body (`trailers`) or, for a
/// trailers-only response, its head (`head_status`). `None`: no `grpc-status`, so the
/// call is not complete.
pub(super) fn end(
    head_status: HeaderMap,
    trailers: Option<HeaderMap>,
    guard: &ReflectionGuard,
) -> Option<GrpcEnd> {
    let mut trailers = match trailers {
        Some(t) if t.contains_key(GRPC_STATUS) => t,
        _ => head_status,
    };
    let status = parse_grpc_status(trailers.get(GRPC_STATUS)?.as_bytes())?;
    // Origin-sent `Postern-*` go too: the trailers carry postern's own.
    strip_hop_by_hop(&mut trailers);
    let hits = redact_headers(guard, &mut trailers);
    Some(GrpcEnd {
        status,
        trailers,
        hits,
    })
}

/// The agent's trailers: the origin's, then `Postern-Outcome`.
pub(super) fn agent_trailers(end: &GrpcEnd, outcome: &str) -> HeaderMap {
    let mut trailers = end.trailers.clone();
    if let Ok(v) = HeaderValue::from_str(outcome) {
        trailers.insert(POSTERN_OUTCOME, v);
    }
    trailers
}

/// The stored result names the status and keeps the trailers as relayed.
pub(super) fn record_in(stored: &mut StoredResult, end: &GrpcEnd) {
    if let Payload::Http(http) = &mut stored.payload {
        http.grpc_status = Some(end.status);
        http.trailers = super::headers::stored_headers(&end.trailers);
    }
}

/// A whole body guarded byte for byte (length prefixes stay true).
pub(super) fn redact_messages(guard: &ReflectionGuard, body: &[u8]) -> (Bytes, usize) {
    let mut carry = Carry::masked(Mask::SameLength);
    let (head, hits) = guard.redact_stream(&mut carry, body);
    let (tail, more) = guard.finish(&mut carry);
    let mut out = head.to_vec();
    out.extend_from_slice(&tail);
    (Bytes::from(out), hits + more)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content_type(t: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(t));
        h
    }

    #[test]
    fn grpc_content_types_and_not_grpc_web() {
        for t in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC; charset=utf-8",
        ] {
            assert!(is_grpc(&content_type(t)), "{t}");
        }
        for t in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/json",
            "application/grpcx",
        ] {
            assert!(!is_grpc(&content_type(t)), "{t}");
        }
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn the_status_comes_from_trailers_or_a_trailers_only_head() {
        let guard = ReflectionGuard::default();
        let mut head = content_type("application/grpc");
        head.insert(GRPC_STATUS, HeaderValue::from_static("7"));
        head.insert("grpc-message", HeaderValue::from_static("denied"));
        let moved = take_head_status(&mut head);
        assert!(!head.contains_key(GRPC_STATUS) && !head.contains_key("grpc-message"));
        let end = end(moved, None, &guard).map(|e| (e.status, e.trailers.len()));
        assert_eq!(end, Some((7, 2)));

        let mut trailers = HeaderMap::new();
        trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
        trailers.insert("postern-outcome", HeaderValue::from_static("spoofed"));
        let got = super::end(HeaderMap::new(), Some(trailers), &guard).map(|e| e.trailers);
        assert_eq!(
            got.map(|t| t.len()),
            Some(1),
            "the origin's postern-* is dropped"
        );
    }

    #[test]
    fn without_a_number_in_grpc_status_the_call_is_not_complete() {
        let guard = ReflectionGuard::default();
        assert!(end(HeaderMap::new(), None, &guard).is_none());
        assert!(end(HeaderMap::new(), Some(HeaderMap::new()), &guard).is_none());
        let mut bad = HeaderMap::new();
        bad.insert(GRPC_STATUS, HeaderValue::from_static("OK"));
        assert!(end(HeaderMap::new(), Some(bad), &guard).is_none());
    }

    #[test]
    fn a_secret_in_trailers_is_redacted_and_in_messages_masked_to_its_length() {
        let guard = ReflectionGuard::new(b"s3cret-value-42", b"Bearer s3cret-value-42").unwrap();
        let mut trailers = HeaderMap::new();
        trailers.insert(GRPC_STATUS, HeaderValue::from_static("7"));
        trailers.insert(
            "grpc-message",
            HeaderValue::from_static("not for Bearer%20s3cret-value-42"),
        );
        let end = end(HeaderMap::new(), Some(trailers), &guard).unwrap();
        assert_eq!(end.hits, 1);
        assert_eq!(
            end.trailers["grpc-message"],
            "not for Bearer%20[postern:redacted]"
        );

        let mut message = vec![0, 0, 0, 0, 24];
        message.extend_from_slice(b"you sent s3cret-value-42");
        let (out, hits) = redact_messages(&guard, &message);
        assert_eq!((out.len(), hits), (message.len(), 1));
        assert_eq!(&out[5..], b"you sent ***************");
    }
}
