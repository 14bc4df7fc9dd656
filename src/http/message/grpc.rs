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
//! redacted as in headers. On a credentialed route a compressed message is decoded first
//! and delivered uncompressed (`messages`); one that cannot be decoded is withheld and the
//! agent's call ends with postern's status instead (`GrpcEnd::withhold`).

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, header};

use super::decode::{self, Undecodable};
use super::headers::{redact_headers, strip_hop_by_hop};
use super::respond::POSTERN_OUTCOME;
use crate::contract::parse_grpc_status;
use crate::guard::ReflectionGuard;
use crate::journal::{Payload, StoredResult};

mod messages;

pub(in crate::http) use messages::Messages;

const GRPC_STATUS: &str = "grpc-status";

/// gRPC's `INTERNAL`: what a client answers a message it cannot decompress with.
const INTERNAL: u32 = 13;

/// The diagnostic of a gRPC response that ended without its status.
pub(in crate::http) const NO_STATUS: &str = "the gRPC response ended without a grpc-status";

/// The diagnostic of a gRPC response that ended with two different statuses.
pub(in crate::http) const CONFLICTING_STATUS: &str =
    "the gRPC response ended with conflicting grpc-status values";

/// The fields that carry a call's status (gRPC's PROTOCOL-HTTP2 "Trailers").
const STATUS_FIELDS: &[&str] = &[GRPC_STATUS, "grpc-message", "grpc-status-details-bin"];

/// `content-type: application/grpc`, `application/grpc+proto`, `application/grpc;…`
/// (not `application/grpc-web…`, which carries its trailers in the body over HTTP/1.1).
pub(in crate::http) fn is_grpc(headers: &HeaderMap) -> bool {
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
pub(in crate::http) fn is_grpc_response(status: http::StatusCode, headers: &HeaderMap) -> bool {
    status == http::StatusCode::OK && (is_grpc(headers) || headers.contains_key(GRPC_STATUS))
}

/// The gRPC call toward the origin: `te: trailers` (the hop-by-hop rules dropped the
/// agent's). With a credential injected, messages are asked for uncompressed: the guard
/// reads them as they come (one compressed anyway is decoded first, `Messages`).
pub(in crate::http) fn prepare_request(headers: &mut HeaderMap, guarded: bool) {
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    if guarded {
        headers.insert("grpc-accept-encoding", HeaderValue::from_static("identity"));
    }
}

/// A trailers-only response's status, taken out of the head: it goes to the agent as
/// trailers, after the commit.
pub(in crate::http) fn take_head_status(headers: &mut HeaderMap) -> HeaderMap {
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
pub(in crate::http) struct GrpcEnd {
    /// The origin's status: the record's `grpc_status`, which decides the outcome.
    pub status: u32,
    /// The origin's trailers (or the head's status), cleaned and guarded.
    pub trailers: HeaderMap,
    /// Reflection guard hits in them.
    pub hits: usize,
}

impl GrpcEnd {
    /// A message postern could not decode was withheld, so the agent's call must not end
    /// as the origin's did (a server-streaming client would take the missing messages for
    /// none): it ends `INTERNAL` with postern's reason, as a client's own decompression
    /// failure would, and `Postern-Body` as on an HTTP body. `status` stays the origin's:
    /// the origin did answer, and the record's outcome follows it (evidence
    /// `body_withheld`).
    pub(in crate::http) fn withhold(&mut self, why: Undecodable) {
        for name in STATUS_FIELDS {
            self.trailers.remove(*name);
        }
        self.trailers
            .insert(GRPC_STATUS, HeaderValue::from(INTERNAL));
        let message = format!(
            "postern withheld a response message it could not scan: {}",
            why.as_str()
        );
        if let Ok(v) = HeaderValue::from_str(&message) {
            self.trailers.insert("grpc-message", v);
        }
        decode::mark_withheld(&mut self.trailers, why);
    }
}

/// The end of a gRPC response from what came after its body (`trailers`) or, for a
/// trailers-only response, its head (`head_status`). `Err` (the diagnostic): no single
/// `grpc-status`, so the call is not complete.
pub(in crate::http) fn end(
    head_status: HeaderMap,
    trailers: Option<HeaderMap>,
    guard: &ReflectionGuard,
) -> Result<GrpcEnd, &'static str> {
    let mut trailers = match trailers {
        Some(t) if t.contains_key(GRPC_STATUS) => t,
        _ => head_status,
    };
    let status = one_status(&mut trailers)?;
    // Origin-sent `Postern-*` go too: the trailers carry postern's own.
    strip_hop_by_hop(&mut trailers);
    let hits = redact_headers(guard, &mut trailers);
    Ok(GrpcEnd {
        status,
        trailers,
        hits,
    })
}

/// The call's status. Two that differ (`0` and `13`) are no result: the client fails
/// such a call (grpc-core: `INTERNAL`) whichever the origin meant, so recording either
/// would claim what nobody saw; the call is incomplete, as without a status (SPEC §3.2).
/// The same value twice is one status, relayed once.
fn one_status(trailers: &mut HeaderMap) -> Result<u32, &'static str> {
    let statuses: Vec<Option<u32>> = trailers
        .get_all(GRPC_STATUS)
        .iter()
        .map(|v| parse_grpc_status(v.as_bytes()))
        .collect();
    let Some(&Some(status)) = statuses.first() else {
        return Err(NO_STATUS);
    };
    if statuses.iter().any(|s| *s != Some(status)) {
        return Err(CONFLICTING_STATUS);
    }
    if statuses.len() > 1 {
        trailers.insert(GRPC_STATUS, HeaderValue::from(status));
    }
    Ok(status)
}

/// The agent's trailers: the origin's, then `Postern-Outcome`.
pub(in crate::http) fn agent_trailers(end: &GrpcEnd, outcome: &str) -> HeaderMap {
    let mut trailers = end.trailers.clone();
    if let Ok(v) = HeaderValue::from_str(outcome) {
        trailers.insert(POSTERN_OUTCOME, v);
    }
    trailers
}

/// The stored result names the status and keeps the trailers as relayed.
pub(in crate::http) fn record_in(stored: &mut StoredResult, end: &GrpcEnd) {
    if let Payload::Http(http) = &mut stored.payload {
        http.grpc_status = Some(end.status);
        http.trailers = super::headers::stored_headers(&end.trailers);
    }
}

/// A buffered body on a credentialed route as the guard must see it: every message
/// uncompressed, or withheld (the head then says so).
pub(in crate::http) fn for_guard(
    headers: &mut HeaderMap,
    body: &[u8],
    cap: u64,
) -> Result<Bytes, Undecodable> {
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    Messages::for_head(headers, cap)
        .whole(body)
        .inspect_err(|why| decode::mark_withheld(headers, *why))
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
        assert_eq!(end, Ok((7, 2)));

        let mut trailers = HeaderMap::new();
        trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
        trailers.insert("postern-outcome", HeaderValue::from_static("spoofed"));
        let got = super::end(HeaderMap::new(), Some(trailers), &guard).map(|e| e.trailers);
        assert_eq!(
            got.map(|t| t.len()),
            Ok(1),
            "the origin's postern-* is dropped"
        );
    }

    fn statuses(values: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(GRPC_STATUS, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn without_a_single_number_in_grpc_status_the_call_is_not_complete() {
        let guard = ReflectionGuard::default();
        let status_of = |t| end(HeaderMap::new(), t, &guard).map(|e| e.status);
        assert_eq!(status_of(None), Err(NO_STATUS));
        assert_eq!(status_of(Some(HeaderMap::new())), Err(NO_STATUS));
        assert_eq!(status_of(Some(statuses(&["OK"]))), Err(NO_STATUS));
        for two in [["0", "13"], ["13", "0"], ["0", "OK"]] {
            let got = status_of(Some(statuses(&two)));
            assert_eq!(got, Err(CONFLICTING_STATUS), "{two:?}");
        }
    }

    #[test]
    fn the_same_status_twice_is_relayed_once() {
        let guard = ReflectionGuard::default();
        let got = end(HeaderMap::new(), Some(statuses(&["7", "7"])), &guard);
        let Ok(got) = got else { panic!("one status") };
        assert_eq!(got.status, 7);
        assert_eq!(got.trailers.get_all(GRPC_STATUS).iter().count(), 1);
    }

    #[test]
    fn a_withheld_message_ends_the_agents_call_internal_and_the_record_keeps_the_origins() {
        let guard = ReflectionGuard::default();
        let mut trailers = statuses(&["0"]);
        trailers.insert("grpc-message", HeaderValue::from_static("fine"));
        trailers.insert("x-kept", HeaderValue::from_static("1"));
        let Ok(mut end) = end(HeaderMap::new(), Some(trailers), &guard) else {
            panic!("status 0")
        };
        end.withhold(Undecodable::UnsupportedCoding);
        assert_eq!(end.status, 0, "the origin's status, for the record");
        let t = &end.trailers;
        assert_eq!(t[GRPC_STATUS], "13");
        assert_eq!(
            t["grpc-message"],
            "postern withheld a response message it could not scan: unsupported_coding"
        );
        assert_eq!(t["postern-body"], "withheld; reason=unsupported_coding");
        assert_eq!(t["x-kept"], "1");
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
        let (out, hits) = guard.redact_same_length(&message);
        assert_eq!((out.len(), hits), (message.len(), 1));
        assert_eq!(&out[5..], b"you sent ***************");
    }
}
