//! Header rules of the HTTP exchange: hop-by-hop stripping, what a stored result keeps,
//! framing markers and the delivery mode a response head asks for.

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};

use super::respond::PROXY_STATUS;
use crate::config::Delivery;
use crate::contract::Completion;
use crate::guard::ReflectionGuard;

/// Hop-by-hop headers (RFC 9110 §7.6.1) and postern's own, never forwarded.
pub(super) const HOP_BY_HOP: &[&str] = &[
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

pub(super) fn framing(headers: &HeaderMap, version: http::Version) -> Completion {
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
pub(super) fn bodiless(method: &str, status: StatusCode) -> bool {
    method == "HEAD"
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status.is_informational()
}

/// `delivery = "auto"`: event streams and bodies declared larger than the buffer stream at once.
pub(super) fn delivery_mode(route: Delivery, headers: &HeaderMap, buffer_limit: u64) -> Delivery {
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
pub(super) fn intermediary_error(headers: &HeaderMap) -> Option<(String, String)> {
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
pub(super) fn redact_headers(guard: &ReflectionGuard, headers: &mut HeaderMap) -> usize {
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
    for value in headers.values_mut() {
        let (clean, n) = guard.redact(value.as_bytes());
        if n > 0 {
            hits += n;
            *value = HeaderValue::from_bytes(&clean)
                .unwrap_or(HeaderValue::from_static("[postern:redacted]"));
        }
    }
    hits
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
}
