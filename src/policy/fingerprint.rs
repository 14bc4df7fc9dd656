//! The request fingerprint: SHA-256 over method, normalized target, selected headers and
//! body (SPEC §3.4). It decides whether a same-key request, an approved request and a
//! `postern retry` are the operation the invocation bound, so it covers every end-to-end
//! header the origin receives from the agent, except those that legitimately differ
//! between tries of one operation or are postern's own (`EXCLUDED`, `EXCLUDED_PREFIXES`).

use http::{HeaderMap, header};
use sha2::{Digest, Sha256};

/// Headers the fingerprint leaves out, and why (README "Idempotency keys" lists them).
const EXCLUDED: &[&str] = &[
    // Hop-by-hop and framing (RFC 9110 §7.6.1): never forwarded as sent, or restating the
    // body's length, which the fingerprint covers itself.
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "content-length",
    "upgrade",
    // The target (scheme, host, port) is covered as such.
    "host",
    // postern rewrites it when it injects a credential (it decodes for the reflection guard).
    "accept-encoding",
    // Names the client software, not the operation: a retry after the agent restarted with
    // an upgraded library, or sent by another tool, is still the same operation.
    "user-agent",
    // The time of each try.
    "date",
    // Tracing ids: new for every try by design.
    "traceparent",
    "tracestate",
    "baggage",
    "b3",
    "x-request-id",
    "x-amzn-trace-id",
    "sentry-trace",
    // Measured (tests/sdk/measure.py): the only headers the vendor SDKs change between tries
    // of one operation. Stainless SDKs (openai, anthropic; Python and Node) count their own
    // retries; Stripe's reports the previous call's request id and duration, so the agent's
    // resend under the same key carries a new value. (Stainless's other `x-stainless-*`
    // headers are left out by prefix, below.)
    "x-stainless-retry-count",
    "x-stripe-client-telemetry",
    // Like `user-agent`: Stripe's description of the client software (versions, a telemetry
    // id). An agent restarted on an upgraded SDK still asks for the same operation.
    "x-stripe-client-user-agent",
];

/// Name prefixes the fingerprint leaves out: the agent's proxy headers (`Proxy-*`, hop to
/// postern only), B3 tracing ids, postern's own `Postern-*` (never forwarded), and the
/// Stainless SDKs' `x-stainless-*`: the client software (language, package and runtime
/// versions, OS, arch), its own timeouts and retry count — measured stable within one
/// process but not across an agent's restart or upgrade; none names the operation (the
/// body, the path and the account headers such as `OpenAI-Organization` do).
const EXCLUDED_PREFIXES: &[&str] = &["proxy-", "x-b3-", "postern-", "x-stainless-"];

/// Kept although it is `Postern-*`: it picks which of the route's credentials — which
/// account — the request acts as.
const POSTERN_CREDENTIAL: &str = "postern-credential";

/// `sha256:<hex>` over length-prefixed parts: method, url, each header as (name, value) in
/// the order given, then the body. Every part is length-prefixed and the body is last, so
/// the encoding is unambiguous: a decoder reads length-prefixed fields to the end, and the
/// last one is the body.
pub fn fingerprint(method: &str, url: &str, headers: &[(&str, &[u8])], body: &[u8]) -> String {
    let mut h = Sha256::new();
    for part in [method.as_bytes(), url.as_bytes()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    for (name, value) in headers {
        h.update((name.len() as u64).to_be_bytes());
        h.update(name.as_bytes());
        h.update((value.len() as u64).to_be_bytes());
        h.update(value);
    }
    h.update((body.len() as u64).to_be_bytes());
    h.update(body);
    crate::journal::sha256_tagged_digest(&h.finalize())
}

/// The headers a fingerprint covers, canonical: names lower-case (as `HeaderMap` holds
/// them), sorted by name, values exact and, within a repeated name, in the order sent.
/// `key_header` is the route's idempotency key header: the key names the operation, it is
/// not part of it (and postern may add it at retry time).
pub fn covered_headers<'h>(
    headers: &'h HeaderMap,
    key_header: Option<&str>,
) -> Vec<(&'h str, &'h [u8])> {
    let listed = connection_listed(headers);
    let mut covered: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()))
        .filter(|(name, _)| !excluded(name, key_header, &listed))
        .collect();
    // Stable: values of one name keep their order.
    covered.sort_by(|a, b| a.0.cmp(b.0));
    covered
}

/// Whether the fingerprint leaves `name` (lower-case) out.
fn excluded(name: &str, key_header: Option<&str>, listed: &[String]) -> bool {
    if name == POSTERN_CREDENTIAL {
        return false;
    }
    EXCLUDED.contains(&name)
        || EXCLUDED_PREFIXES.iter().any(|p| name.starts_with(p))
        || key_header.is_some_and(|k| k.eq_ignore_ascii_case(name))
        || listed.iter().any(|l| l == name)
}

/// Names the `Connection` header declares hop-by-hop: postern strips them before
/// forwarding, so the origin never sees them.
fn connection_listed(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_static(v));
        }
        m
    }

    fn fp(pairs: &[(&'static str, &'static str)]) -> String {
        let m = map(pairs);
        fingerprint(
            "POST",
            "https://x/a",
            &covered_headers(&m, Some("Idempotency-Key")),
            b"{}",
        )
    }

    #[test]
    fn fingerprints_separate_their_parts() {
        let a = fingerprint("POST", "https://x/a", &[], b"bc");
        let b = fingerprint("POST", "https://x/ab", &[], b"c");
        assert_ne!(a, b);
        assert_eq!(a, fingerprint("POST", "https://x/a", &[], b"bc"));
        assert!(a.starts_with("sha256:"));
        let split = fingerprint("POST", "u", &[("ab", b"c")], b"");
        assert_ne!(split, fingerprint("POST", "u", &[("a", b"bc")], b""));
        assert_ne!(split, fingerprint("POST", "u", &[], b"abc"));
    }

    #[test]
    fn an_end_to_end_header_is_covered_with_its_exact_value() {
        let base = fp(&[("stripe-account", "acct_A")]);
        assert_ne!(base, fp(&[("stripe-account", "acct_EVIL")]));
        assert_ne!(
            base,
            fp(&[("stripe-account", "acct_a")]),
            "values are exact"
        );
        assert_ne!(base, fp(&[]), "absent is not empty");
        assert_ne!(fp(&[]), fp(&[("stripe-account", "")]));
        assert_ne!(base, fp(&[("stripe-account", "acct_A"), ("x-extra", "1")]));
        assert_ne!(base, fp(&[("postern-credential", "other")]));
    }

    #[test]
    fn names_are_order_insensitive_values_of_one_name_are_not() {
        assert_eq!(
            fp(&[("a", "1"), ("b", "2"), ("a", "3")]),
            fp(&[("b", "2"), ("a", "1"), ("a", "3")])
        );
        assert_ne!(
            fp(&[("accept", "x"), ("accept", "y")]),
            fp(&[("accept", "y"), ("accept", "x")])
        );
        let m = map(&[("X-Mode", "live")]);
        assert_eq!(covered_headers(&m, None), vec![("x-mode", &b"live"[..])]);
    }

    #[test]
    fn what_varies_between_tries_or_is_postern_s_own_is_left_out() {
        let base = fp(&[("stripe-account", "acct_A")]);
        let noisy = fp(&[
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("content-length", "2"),
            ("host", "x"),
            ("accept-encoding", "gzip"),
            ("user-agent", "sdk/2"),
            ("date", "Tue, 01 Dec 2026 00:00:00 GMT"),
            ("traceparent", "00-abc-def-01"),
            ("x-b3-traceid", "1"),
            ("x-request-id", "r-2"),
            ("x-stainless-retry-count", "1"),
            ("proxy-authorization", "Basic eA=="),
            ("postern-outcome", "x"),
            ("idempotency-key", "k-1"),
            ("stripe-account", "acct_A"),
        ]);
        assert_eq!(base, noisy);
    }

    // Header sets as the SDKs sent them to a loopback origin (tests/sdk/measure.py):
    // the first try, and what changes on a retry. Host values are the capture's.

    const OPENAI_PY_FIRST: &[(&str, &str)] = &[
        ("Host", "127.0.0.1:44041"),
        ("Accept-Encoding", "gzip, deflate"),
        ("Connection", "keep-alive"),
        ("authorization", "Bearer sk-test"),
        ("accept", "application/json"),
        ("content-type", "application/json"),
        ("user-agent", "OpenAI/Python 3.60.0"),
        ("x-stainless-lang", "python"),
        ("x-stainless-package-version", "3.60.0"),
        ("x-stainless-os", "Linux"),
        ("x-stainless-arch", "x64"),
        ("x-stainless-runtime", "CPython"),
        ("x-stainless-runtime-version", "3.11.7"),
        ("x-stainless-async", "false"),
        ("openai-organization", "org-A"),
        ("openai-project", "proj-A"),
        ("x-stainless-retry-count", "0"),
        ("x-stainless-read-timeout", "600"),
        ("Content-Length", "67"),
    ];

    const OPENAI_NODE_FIRST: &[(&str, &str)] = &[
        ("host", "127.0.0.1:35957"),
        ("connection", "keep-alive"),
        ("accept", "application/json"),
        ("user-agent", "OpenAI/JS 6.49.0"),
        ("x-stainless-retry-count", "0"),
        ("x-stainless-lang", "js"),
        ("x-stainless-package-version", "6.49.0"),
        ("x-stainless-os", "Linux"),
        ("x-stainless-arch", "x64"),
        ("x-stainless-runtime", "node"),
        ("x-stainless-runtime-version", "v20.20.2"),
        ("openai-organization", "org-A"),
        ("openai-project", "proj-A"),
        ("authorization", "Bearer sk-test"),
        ("content-type", "application/json"),
        ("accept-language", "*"),
        ("sec-fetch-mode", "cors"),
        ("accept-encoding", "gzip, deflate"),
        ("content-length", "67"),
    ];

    const ANTHROPIC_PY_FIRST: &[(&str, &str)] = &[
        ("Host", "127.0.0.1:45373"),
        ("Accept-Encoding", "gzip, deflate"),
        ("Connection", "keep-alive"),
        ("x-stainless-timeout", "600"),
        ("x-stainless-retry-count", "0"),
        ("x-stainless-read-timeout", "600"),
        ("Accept", "application/json"),
        ("Content-Type", "application/json"),
        ("User-Agent", "Anthropic/Python 2.16.0"),
        ("X-Stainless-Lang", "python"),
        ("X-Stainless-Package-Version", "2.16.0"),
        ("X-Stainless-OS", "Linux"),
        ("X-Stainless-Arch", "x64"),
        ("X-Stainless-Runtime", "CPython"),
        ("X-Stainless-Runtime-Version", "3.11.7"),
        ("Authorization", "Bearer sk-ant-test"),
        ("X-Stainless-Async", "false"),
        ("anthropic-version", "2026-10-21"),
        ("anthropic-beta", "tools-2024-04-04"),
        ("Content-Length", "89"),
    ];

    const STRIPE_PY_FIRST: &[(&str, &str)] = &[
        ("Host", "127.0.0.1:38731"),
        ("User-Agent", "Stripe/v1 PythonBindings/16.1.0"),
        ("Accept-Encoding", "gzip, deflate"),
        ("Accept", "*/*"),
        ("Connection", "keep-alive"),
        (
            "X-Stripe-Client-User-Agent",
            r#"{"bindings_version": "16.1.0", "lang": "python", "httplib": "requests", "telemetry_id": "de45166ed3825a555d9fe8c5a8b927bf", "lang_version": "3.11.7", "platform": "Linux-6.18.44-fc-v1147-x86_64-with-glibc2.36"}"#,
        ),
        ("Authorization", "Bearer sk_test_x"),
        ("Stripe-Account", "acct_A"),
        ("Idempotency-Key", "13b99f8f-8caf-2a40-f2eb-487b0e19f44f"),
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Stripe-Version", "2026-10-28.endive"),
        ("Content-Length", "21"),
    ];

    /// `first` with each of `changes` replacing (or, absent, adding) that header's value.
    fn varied(first: &[(&str, &str)], changes: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in first {
            let name = http::HeaderName::from_bytes(k.as_bytes()).expect("name");
            let value = changes
                .iter()
                .find(|(c, _)| c.eq_ignore_ascii_case(k))
                .map_or(*v, |(_, c)| *c);
            m.append(name, HeaderValue::from_str(value).expect("value"));
        }
        for (k, v) in changes {
            if !first.iter().any(|(f, _)| f.eq_ignore_ascii_case(k)) {
                let name = http::HeaderName::from_bytes(k.as_bytes()).expect("name");
                m.append(name, HeaderValue::from_str(v).expect("value"));
            }
        }
        m
    }

    fn sdk_fp(first: &[(&str, &str)], changes: &[(&str, &str)], key: Option<&str>) -> String {
        fingerprint(
            "POST",
            "https://api.test/v1/x",
            &covered_headers(&varied(first, changes), key),
            b"{}",
        )
    }

    #[test]
    fn openai_python_retry_is_the_same_request_and_its_account_headers_are_not() {
        let first = sdk_fp(OPENAI_PY_FIRST, &[], None);
        for n in ["1", "2"] {
            let retry = sdk_fp(OPENAI_PY_FIRST, &[("x-stainless-retry-count", n)], None);
            assert_eq!(first, retry, "retry {n}");
        }
        for other in [
            ("openai-organization", "org-B"),
            ("openai-project", "proj-B"),
        ] {
            assert_ne!(first, sdk_fp(OPENAI_PY_FIRST, &[other], None), "{other:?}");
        }
        // The client's own timeout is not the operation: an agent restarted with another
        // timeout resends the same request.
        assert_eq!(
            first,
            sdk_fp(
                OPENAI_PY_FIRST,
                &[("x-stainless-read-timeout", "1.0")],
                None
            )
        );
    }

    #[test]
    fn openai_node_retry_is_the_same_request_and_its_account_headers_are_not() {
        let first = sdk_fp(OPENAI_NODE_FIRST, &[], None);
        let retry = sdk_fp(OPENAI_NODE_FIRST, &[("x-stainless-retry-count", "2")], None);
        assert_eq!(first, retry);
        for other in [
            ("openai-organization", "org-B"),
            ("openai-project", "proj-B"),
        ] {
            assert_ne!(
                first,
                sdk_fp(OPENAI_NODE_FIRST, &[other], None),
                "{other:?}"
            );
        }
    }

    #[test]
    fn anthropic_python_retry_is_the_same_request_and_its_version_headers_are_not() {
        let first = sdk_fp(ANTHROPIC_PY_FIRST, &[], None);
        let retry = sdk_fp(
            ANTHROPIC_PY_FIRST,
            &[("x-stainless-retry-count", "1")],
            None,
        );
        assert_eq!(first, retry);
        for other in [
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", "other-2025-01-01"),
        ] {
            assert_ne!(
                first,
                sdk_fp(ANTHROPIC_PY_FIRST, &[other], None),
                "{other:?}"
            );
        }
    }

    #[test]
    fn stripe_python_retry_and_resend_are_the_same_request_and_its_account_is_not() {
        let key = Some("Idempotency-Key");
        let first = sdk_fp(STRIPE_PY_FIRST, &[], key);
        // Its own retries repeat every header; the agent's resend under the same key adds
        // the telemetry of the call before.
        assert_eq!(first, sdk_fp(STRIPE_PY_FIRST, &[], key));
        let telemetry = (
            "X-Stripe-Client-Telemetry",
            r#"{"last_request_metrics": {"request_id": "req_1", "request_duration_ms": 12}}"#,
        );
        assert_eq!(first, sdk_fp(STRIPE_PY_FIRST, &[telemetry], key));
        for other in [
            ("Stripe-Account", "acct_B"),
            ("Stripe-Version", "2024-06-20"),
        ] {
            assert_ne!(first, sdk_fp(STRIPE_PY_FIRST, &[other], key), "{other:?}");
        }
        // On a route without a key contract, Stripe's own key is a header like any other.
        assert_ne!(
            sdk_fp(STRIPE_PY_FIRST, &[], None),
            sdk_fp(
                STRIPE_PY_FIRST,
                &[("Idempotency-Key", "ffffffff-8caf-2a40-f2eb-487b0e19f44f")],
                None
            )
        );
    }
}
