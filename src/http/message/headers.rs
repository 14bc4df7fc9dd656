//! Header rules of the HTTP exchange: hop-by-hop stripping, what a stored result keeps,
//! framing markers and the delivery mode a response head asks for.

use base64::Engine;
use base64::alphabet::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};

use super::respond::PROXY_STATUS;
use crate::config::{Delivery, HOP_BY_HOP};
use crate::contract::Completion;
use crate::guard::{REDACTED, ReflectionGuard};

pub(in crate::http) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = names_in_connection(headers)
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
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

/// The header names `Connection` lists (hop-by-hop: never sent on).
pub(in crate::http) fn names_in_connection(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
}

/// The response headers worth keeping: never cookies or credentials.
pub(in crate::http) fn stored_headers(headers: &HeaderMap) -> Vec<(String, String)> {
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

pub(in crate::http) fn strip_error_proxy_status(headers: &mut HeaderMap) {
    let has_error = headers
        .get_all(PROXY_STATUS)
        .iter()
        .any(|v| v.to_str().map_or(true, |s| s.contains("error")));
    if has_error {
        headers.remove(PROXY_STATUS);
    }
}

pub(in crate::http) fn framing(headers: &HeaderMap, version: http::Version) -> Completion {
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

/// Responses that never carry a body (RFC 9110 §6.4.1).
pub(in crate::http) fn bodiless(method: &str, status: StatusCode) -> bool {
    method == "HEAD"
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status.is_informational()
}

/// `delivery = "auto"`: event streams and bodies declared larger than the buffer stream at once.
pub(in crate::http) fn delivery_mode(
    route: Delivery,
    headers: &HeaderMap,
    buffer_limit: u64,
) -> Delivery {
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

/// An intermediary's own error (RFC 9209): the first `Proxy-Status` member, from the
/// origin side, with an `error` parameter. Returns its name and the member as sent.
pub(in crate::http) fn intermediary_error(headers: &HeaderMap) -> Option<(String, String)> {
    headers
        .get_all(PROXY_STATUS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find(|member| {
            member
                .split(';')
                .skip(1)
                .any(|param| param.trim().starts_with("error="))
        })
        .map(|member| {
            let name = member
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches('"');
            (name.to_owned(), member.to_owned())
        })
}

/// The reflection guard over a header block: values redacted, headers whose name is a
/// form of the secret dropped (a name cannot be rewritten). Returns the hits.
pub(in crate::http) fn redact_headers(guard: &ReflectionGuard, headers: &mut HeaderMap) -> usize {
    if guard.is_empty() {
        return 0;
    }
    let names: Vec<_> = headers
        .keys()
        .filter(|k| guard.is_match(k.as_str().as_bytes()))
        .cloned()
        .collect();
    let mut hits = 0;
    for name in names {
        hits += headers.get_all(&name).iter().count();
        headers.remove(&name);
    }
    for (name, value) in headers.iter_mut() {
        let binary = name.as_str().ends_with("-bin");
        let decoded = binary
            .then(|| BINARY.decode(value.as_bytes()).ok())
            .flatten();
        let (clean, n) = match decoded {
            Some(bytes) => redact_binary(guard, &bytes),
            None => redact_text(guard, value.as_bytes()),
        };
        if n > 0 {
            hits += n;
            *value = clean;
        }
    }
    hits
}

/// gRPC binary metadata (a `-bin` name): base64, padded or not on the way in, unpadded
/// on the way out (gRPC's PROTOCOL-HTTP2 asks both of implementations).
const BINARY: GeneralPurpose = GeneralPurpose::new(
    &STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

fn redact_text(guard: &ReflectionGuard, value: &[u8]) -> (HeaderValue, usize) {
    let (clean, n) = guard.redact(value);
    let clean =
        HeaderValue::from_bytes(&clean).unwrap_or(HeaderValue::from_static("[postern:redacted]"));
    (clean, n)
}

/// A binary value stays base64, or the client fails the call (`INTERNAL`) though the
/// record says it was answered: the secret is masked byte for byte in the decoded bytes
/// (a protobuf there, as in `grpc-status-details-bin`, keeps its lengths) and encoded
/// again. A secret in the base64 text itself replaces the value with the marker's base64.
fn redact_binary(guard: &ReflectionGuard, decoded: &[u8]) -> (HeaderValue, usize) {
    let (masked, n) = guard.redact_same_length(decoded);
    let mut text = BINARY.encode(&masked);
    let in_text = guard.redact(text.as_bytes()).1;
    if in_text > 0 {
        text = BINARY.encode(REDACTED);
    }
    let clean = HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static(""));
    (clean, n + in_text)
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
    fn an_intermediary_error_names_its_member() {
        let mut h = HeaderMap::new();
        h.insert(
            PROXY_STATUS,
            HeaderValue::from_static("origin-lb; received-status=200"),
        );
        assert_eq!(intermediary_error(&h), None);
        h.append(
            PROXY_STATUS,
            HeaderValue::from_static("\"cdn\"; error=connection_refused, edge"),
        );
        assert_eq!(
            intermediary_error(&h),
            Some(("cdn".into(), "\"cdn\"; error=connection_refused".into()))
        );
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

    #[test]
    fn headers_are_redacted_and_secret_named_headers_dropped() {
        use base64::Engine;
        const SECRET: &str = "s3cr/t+val~Z9?q";
        let g =
            ReflectionGuard::new(SECRET.as_bytes(), format!("Bearer {SECRET}").as_bytes()).unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-echo", HeaderValue::from_static("Bearer s3cr/t+val~Z9?q"));
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("Bearer {SECRET}"));
        h.insert("x-b64", HeaderValue::from_str(&b64).unwrap());
        let hex: String = SECRET.bytes().map(|b| format!("{b:02x}")).collect();
        h.insert(
            HeaderName::from_bytes(format!("x-{hex}").as_bytes()).unwrap(),
            HeaderValue::from_static("1"),
        );
        let g2 = ReflectionGuard::new(b"Abc-Token-123", b"Abc-Token-123").unwrap();
        let mut named = HeaderMap::new();
        named.insert("abc-token-123", HeaderValue::from_static("1"));
        named.insert("ok", HeaderValue::from_static("1"));
        assert_eq!(redact_headers(&g2, &mut named), 1);
        assert_eq!(named.len(), 1);
        assert_eq!(redact_headers(&g, &mut h), 3);
        assert_eq!(h["x-echo"], "Bearer [postern:redacted]");
        assert_eq!(h["x-b64"], "[postern:redacted]");
        assert_eq!(h.len(), 2, "the header named by the secret is dropped");
    }

    #[test]
    fn a_binary_value_stays_base64_with_the_secret_masked_inside() {
        const SECRET: &str = "s3cr/t+val~Z9?q";
        let g =
            ReflectionGuard::new(SECRET.as_bytes(), format!("Bearer {SECRET}").as_bytes()).unwrap();
        let message = format!("not for Bearer {SECRET}");
        let inside = format!("\x12{}{message}", char::from(message.len() as u8));
        let padded = base64::engine::general_purpose::STANDARD.encode(&inside);
        assert!(padded.ends_with('='), "{padded}");
        let literal = format!("AAAA{SECRET}"); // not base64 (`~`, `?`): redacted as text
        let mut h = HeaderMap::new();
        h.insert(
            "grpc-status-details-bin",
            HeaderValue::from_str(&padded).unwrap(),
        );
        h.insert("x-raw-bin", HeaderValue::from_str(&literal).unwrap());
        h.insert("x-fine-bin", HeaderValue::from_static("AAEC"));
        assert_eq!(redact_headers(&g, &mut h), 2);
        let details = BINARY
            .decode(h["grpc-status-details-bin"].as_bytes())
            .unwrap();
        let masked = inside.replace(SECRET, &"*".repeat(SECRET.len()));
        assert_eq!(details, masked.as_bytes());
        assert_eq!(h["x-raw-bin"], "AAAA[postern:redacted]");
        assert_eq!(h["x-fine-bin"], "AAEC", "untouched without a hit");
    }

    #[test]
    fn a_secret_in_a_binary_values_base64_text_replaces_the_value() {
        // A hex token is base64 too: decoding it shows nothing, its text is the echo.
        const TOKEN: &str = "0123456789abcdef0123456789abcdef";
        let g = ReflectionGuard::new(TOKEN.as_bytes(), TOKEN.as_bytes()).unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-echo-bin", HeaderValue::from_static(TOKEN));
        assert_eq!(redact_headers(&g, &mut h), 1);
        let value = BINARY.decode(h["x-echo-bin"].as_bytes()).unwrap();
        assert_eq!(value, REDACTED);
    }
}
