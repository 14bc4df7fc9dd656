//! The HTTP proxy against loopback origins built to misbehave, driven by real curl.

use std::time::Duration;

use serde_json::Value;

use crate::origins;
use crate::support::{Daemon, Home, curl, get_json};

fn base() -> String {
    "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n".into()
}

/// A route to `origin.test:<port>` pinned to loopback, plus extra route keys.
fn route_to(port: u16, extra: &str) -> String {
    format!(
        "{}\n[[routes]]\nid = \"origin\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n{extra}\n",
        base()
    )
}

struct Setup {
    _home: Home,
    daemon: Daemon,
    port: u16,
}

fn setup(port: u16, extra: &str) -> Setup {
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&route_to(port, extra)));
    Setup {
        _home: home,
        daemon,
        port,
    }
}

impl Setup {
    fn url(&self, path: &str) -> String {
        format!("http://origin.test:{}{path}", self.port)
    }

    /// curl through the proxy: status, body, headers (lower-cased).
    fn curl(&self, args: &[&str]) -> (u16, String, String) {
        let mut all = vec!["-x", self.daemon.proxy.as_str()];
        all.extend_from_slice(args);
        curl(&all)
    }

    fn record(&self, id: &str) -> Value {
        get_json(&self.daemon.url(&format!("/v1/invocations/{id}")), &[]).1
    }

    fn events(&self, id: &str) -> Vec<String> {
        self.event_data(id)
            .into_iter()
            .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    fn event_data(&self, id: &str) -> Vec<Value> {
        let (_, v) = get_json(
            &self.daemon.url(&format!("/v1/invocations/{id}/events")),
            &[],
        );
        v["events"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until the record settles into the expected code (the exchange runs in its own task).
    fn record_eventually(&self, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..100 {
            let r = self.record(id);
            if pred(&r) {
                return r;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.record(id)
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn envelope(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not an envelope: {body}"))
}

fn assert_envelope(body: &str, code: &str, phase: &str, outcome: &str, retry: &str) -> Value {
    let e = envelope(body);
    assert_eq!(
        (
            e["error"]["code"].as_str(),
            e["error"]["phase"].as_str(),
            e["error"]["outcome"].as_str(),
            e["error"]["retry"].as_str()
        ),
        (Some(code), Some(phase), Some(outcome), Some(retry)),
        "{body}"
    );
    e
}

#[test]
fn a_complete_response_passes_through_with_postern_headers() {
    let origin = origins::responds(
        "200 OK",
        &["content-type: application/json", "x-origin: yes"],
        "{\"ok\":1}",
    );
    let s = setup(origin.port(), "");
    let (status, body, head) = s.curl(&[&s.url("/things?x=1")]);
    assert_eq!((status, body.as_str()), (200, "{\"ok\":1}"));
    assert_eq!(header(&head, "x-origin"), Some("yes"));
    assert_eq!(
        header(&head, "postern-outcome"),
        Some("outcome=committed, phase=remote_execution, retry=never")
    );
    assert!(header(&head, "proxy-status").is_none());
    let id = header(&head, "postern-invocation").unwrap().to_owned();
    assert!(id.starts_with("act_") && id.len() == 30, "{id}");
    let r = s.record_eventually(&id, |r| r["evidence"]["response_complete"] == true);
    assert_eq!(
        (r["outcome"].as_str(), r["code"].as_str()),
        (Some("committed"), None)
    );
    assert_eq!(r["target"], s.url("/things?x=1"));
    assert_eq!(r["route"], "origin");
    assert_eq!(r["result"]["status"], 200);
    let mut events = s.events(&id);
    for _ in 0..500 {
        if events.last().map(String::as_str) == Some("RESULT_DELIVERED") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        events = s.events(&id);
    }
    assert_eq!(
        events,
        [
            "ACTION_ACCEPTED",
            "PREFLIGHT_VALIDATED",
            "CONNECT_ATTEMPT",
            "DISPATCH_STARTED",
            "REQUEST_SENT",
            "REMOTE_RESPONSE_STARTED",
            "REMOTE_RESPONSE_COMPLETE",
            "RESULT_COMMITTED",
            "RESULT_DELIVERED"
        ]
    );
    let req = origin.last_request().to_ascii_lowercase();
    assert!(req.starts_with("get /things?x=1 http/1.1\r\n"), "{req}");
    assert!(
        req.contains(&format!("host: origin.test:{}\r\n", s.port)),
        "{req}"
    );
}

#[test]
fn dispatch_started_is_durable_before_the_first_request_byte() {
    let admin = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let origin = origins::checks_dispatch_first(admin.clone());
    let s = setup(origin.port(), "");
    *admin.lock().unwrap() = s.daemon.admin.clone();
    let (status, body, _) = s.curl(&["-X", "POST", "--data", "x=1", &s.url("/pay")]);
    assert_eq!((status, body.as_str()), (200, "durable-before-first-byte"));
}

#[test]
fn a_close_without_response_is_unknown_reconcile_for_post_and_backoff_for_get() {
    let origin = origins::closes_without_response();
    let s = setup(origin.port(), "");
    let (status, body, head) = s.curl(&["-X", "POST", "--data", "amount=5", &s.url("/pay")]);
    assert_eq!(status, 502);
    let e = assert_envelope(
        &body,
        "REMOTE_OUTCOME_UNKNOWN",
        "remote_execution",
        "unknown",
        "reconcile",
    );
    assert_eq!(e["evidence"]["dispatch_started"], true);
    assert_eq!(e["evidence"]["response_headers_received"], false);
    assert!(e["evidence"]["dispatch_seq"].as_u64().is_some());
    assert!(
        header(&head, "proxy-status")
            .unwrap()
            .starts_with("postern; error=http_response_incomplete")
    );
    assert_eq!(
        header(&head, "postern-outcome"),
        Some(
            "outcome=unknown, phase=remote_execution, retry=reconcile, code=REMOTE_OUTCOME_UNKNOWN"
        )
    );
    assert!(
        !body.contains("diagnostic"),
        "transport text leaked into the envelope: {body}"
    );
    let (status, body, _) = s.curl(&[&s.url("/balance")]);
    assert_eq!(status, 502);
    assert_envelope(
        &body,
        "REMOTE_OUTCOME_UNKNOWN",
        "remote_execution",
        "unknown",
        "backoff",
    );
    assert_eq!(origin.hits(), 2, "postern must not retry after dispatch");
}

#[test]
fn a_short_content_length_body_is_incomplete_and_never_delivered_in_part() {
    let origin = origins::partial_content_length();
    let s = setup(origin.port(), "");
    let (status, body, _) = s.curl(&["-X", "POST", "--data", "a", &s.url("/x")]);
    assert_eq!(status, 502);
    let e = assert_envelope(
        &body,
        "REMOTE_RESULT_INCOMPLETE",
        "remote_execution",
        "unknown",
        "reconcile",
    );
    assert_eq!(e["evidence"]["response_headers_received"], true);
    assert_eq!(e["evidence"]["response_complete"], false);
    assert!(!body.contains("hello"));
}

#[test]
fn broken_chunked_framing_is_incomplete() {
    for origin in [origins::broken_chunked(), origins::half_a_chunked_body()] {
        let s = setup(origin.port(), "");
        let (status, body, _) = s.curl(&[&s.url("/x")]);
        assert_eq!(status, 502, "{body}");
        assert_envelope(
            &body,
            "REMOTE_RESULT_INCOMPLETE",
            "remote_execution",
            "unknown",
            "backoff",
        );
    }
}

#[test]
fn a_500_after_a_side_effect_is_committed_and_passed_through() {
    let origin = origins::responds("500 Internal Server Error", &[], "boom");
    let s = setup(origin.port(), "");
    let (status, body, head) = s.curl(&["-X", "POST", "--data", "x", &s.url("/x")]);
    assert_eq!((status, body.as_str()), (500, "boom"));
    assert_eq!(
        header(&head, "postern-outcome"),
        Some("outcome=committed, phase=remote_execution, retry=never")
    );
    assert!(header(&head, "proxy-status").is_none());
}

#[test]
fn a_404_is_rejected_after_correction() {
    let origin = origins::responds("404 Not Found", &[], "nope");
    let s = setup(origin.port(), "");
    let (status, _, head) = s.curl(&[&s.url("/missing")]);
    assert_eq!(status, 404);
    assert_eq!(
        header(&head, "postern-outcome"),
        Some("outcome=rejected, phase=remote_execution, retry=after_correction")
    );
}

#[test]
fn a_429_with_retry_after_backs_off_for_an_idempotent_request() {
    let origin = origins::responds("429 Too Many Requests", &["retry-after: 2"], "slow down");
    let s = setup(origin.port(), "");
    let (status, _, head) = s.curl(&[&s.url("/x")]);
    assert_eq!(status, 429);
    assert_eq!(header(&head, "retry-after"), Some("2"));
    assert_eq!(
        header(&head, "postern-outcome"),
        Some("outcome=rejected, phase=remote_execution, retry=backoff")
    );
    let id = header(&head, "postern-invocation").unwrap().to_owned();
    let out = s.daemon.cli(&["decide", &id], &[]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "RETRY_WHEN_ALLOWED"
    );
    let (_, _, head) = s.curl(&["-X", "POST", &s.url("/x")]);
    assert_eq!(
        header(&head, "postern-outcome"),
        Some("outcome=rejected, phase=remote_execution, retry=after_correction")
    );
}

#[test]
fn after_a_reconcile_decide_never_points_at_a_result_that_is_not_stored() {
    let origin = origins::closes_without_response();
    let s = setup(origin.port(), "");
    let (status, _, head) = s.curl(&["-X", "POST", "--data", "x", &s.url("/pay")]);
    assert_eq!(status, 502);
    let id = header(&head, "postern-invocation").unwrap().to_owned();
    let verdict = |s: &Setup| {
        let out = s.daemon.cli(&["decide", &id], &[]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(verdict(&s), "RECONCILE");
    let out = s.daemon.cli(
        &[
            "reconcile",
            &id,
            "--outcome",
            "committed",
            "--note",
            "ledger shows it",
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(verdict(&s), "RETURN_RECORDED_OUTCOME");
    let result = s.daemon.cli(&["result", &id], &[]);
    assert!(!result.status.success(), "no result is stored: {result:?}");
}

#[test]
fn a_202_keeps_its_location_as_evidence() {
    let origin = origins::responds(
        "202 Accepted",
        &["location: /jobs/42", "operation-location: /ops/42"],
        "",
    );
    let s = setup(origin.port(), "");
    let (status, _, head) = s.curl(&["-X", "POST", "--data", "go", &s.url("/jobs")]);
    assert_eq!(status, 202);
    let id = header(&head, "postern-invocation").unwrap().to_owned();
    let r = s.record(&id);
    assert_eq!(r["outcome"], "committed");
    assert_eq!(r["evidence"]["location"], "/jobs/42");
    assert_eq!(r["evidence"]["operation_location"], "/ops/42");
}

#[test]
fn a_slow_upstream_is_a_remote_timeout() {
    let origin = origins::slow_head(Duration::from_millis(1500), "late");
    let s = setup(origin.port(), "response_timeout = \"300ms\"");
    let (status, body, head) = s.curl(&["-X", "POST", "--data", "x", &s.url("/slow")]);
    assert_eq!(status, 504, "{body}");
    assert_envelope(
        &body,
        "REMOTE_TIMEOUT",
        "remote_execution",
        "unknown",
        "reconcile",
    );
    assert!(
        header(&head, "proxy-status")
            .unwrap()
            .contains("error=http_response_timeout")
    );
}

#[test]
fn an_idle_gap_mid_body_is_incomplete() {
    let origin = origins::stalls_mid_body(Duration::from_millis(1500));
    let s = setup(origin.port(), "idle_timeout = \"300ms\"");
    let (status, body, _) = s.curl(&[&s.url("/stall")]);
    assert_eq!(status, 502);
    assert_envelope(
        &body,
        "REMOTE_RESULT_INCOMPLETE",
        "remote_execution",
        "unknown",
        "backoff",
    );
}

#[test]
fn a_refused_port_is_not_attempted_with_its_attempts_recorded() {
    let port = origins::refused_port();
    let s = setup(port, "");
    let (status, body, head) = s.curl(&["-X", "POST", "--data", "x", &s.url("/x")]);
    assert_eq!(status, 502);
    let e = assert_envelope(
        &body,
        "CONNECTION_REFUSED",
        "connection_setup",
        "not_attempted",
        "backoff",
    );
    assert_eq!(e["evidence"]["dispatch_started"], false);
    assert_eq!(e["evidence"]["attempts"][0]["stage"], "tcp_connect");
    assert_eq!(e["evidence"]["attempts"][0]["code"], "CONNECTION_REFUSED");
    assert!(
        header(&head, "proxy-status")
            .unwrap()
            .contains("error=connection_refused")
    );
    let id = e["invocation_id"].as_str().unwrap();
    let out = s.daemon.cli(&["actions", "show", id, "--json"], &[]);
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let attempt = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "CONNECT_ATTEMPT")
        .unwrap()
        .clone();
    assert!(
        attempt["data"]["diagnostic"].as_str().is_some(),
        "operators see the transport's words: {attempt}"
    );
}

#[test]
fn policy_refuses_before_any_connection() {
    let origin = origins::responds("200 OK", &[], "hi");
    let home = Home::new();
    let config = route_to(origin.port(), "").replace(
        "[proxy]\nlisten = \"127.0.0.1:0\"",
        "[proxy]\nlisten = \"127.0.0.1:0\"\nmax_request_bytes = \"1KiB\"",
    );
    let daemon = Daemon::start(&home, Some(&config));
    let url = format!("http://origin.test:{}/x", origin.port());
    let (status, body, head) = curl(&[
        "-x",
        &daemon.proxy,
        &format!("http://elsewhere.test:{}/x", origin.port()),
    ]);
    assert_eq!(status, 403);
    assert_envelope(
        &body,
        "ROUTE_DENIED",
        "validation",
        "not_attempted",
        "after_correction",
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-status: postern; error=http_request_denied")
    );
    let big = "a".repeat(4096);
    let (status, body, _) = curl(&["-x", &daemon.proxy, "-X", "POST", "--data", &big, &url]);
    assert_eq!(status, 413);
    let e = assert_envelope(
        &body,
        "PAYLOAD_LIMIT",
        "validation",
        "not_attempted",
        "after_correction",
    );
    assert_eq!(e["error"]["field"], "body");
    let (status, body, _) = curl(&[
        "-x",
        &daemon.proxy,
        &format!("http://origin.test:{}/a/../b", origin.port()),
        "--path-as-is",
    ]);
    assert_eq!(status, 400, "{body}");
    assert_envelope(
        &body,
        "INVALID_TARGET",
        "validation",
        "not_attempted",
        "after_correction",
    );
    assert_eq!(origin.hits(), 0, "nothing reached the origin");
}

#[test]
fn conflicting_framing_is_malformed() {
    use std::io::{Read, Write};
    let origin = origins::responds("200 OK", &[], "hi");
    let s = setup(origin.port(), "");
    let addr = s.daemon.proxy.trim_start_matches("http://").to_owned();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    let req = format!(
        "POST http://origin.test:{}/x HTTP/1.1\r\nhost: origin.test\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        s.port
    );
    conn.write_all(req.as_bytes()).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 8192];
    let n = conn.read(&mut buf).unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert_eq!(origin.hits(), 0);
}

#[test]
fn origin_sent_postern_headers_are_removed() {
    let origin = origins::responds(
        "200 OK",
        &[
            "postern-outcome: outcome=committed, phase=remote_execution, retry=never, code=SPOOFED",
            "postern-invocation: act_SPOOF",
        ],
        "ok",
    );
    let s = setup(origin.port(), "");
    let (_, _, head) = s.curl(&[&s.url("/x")]);
    let head = head.to_ascii_lowercase();
    assert!(!head.contains("spoof"), "{head}");
    assert_eq!(head.matches("postern-invocation:").count(), 1);
}

#[test]
fn hop_by_hop_and_proxy_headers_never_reach_the_origin() {
    let origin = origins::echoes_request();
    let s = setup(origin.port(), "");
    let (status, body, _) = s.curl(&[
        "-H",
        "Connection: x-secret-hop",
        "-H",
        "X-Secret-Hop: 1",
        "-H",
        "Proxy-Connection: keep-alive",
        &s.url("/echo"),
    ]);
    assert_eq!(status, 200);
    let lower = body.to_ascii_lowercase();
    assert!(
        !lower.contains("x-secret-hop") && !lower.contains("proxy-connection"),
        "{body}"
    );
}

#[test]
fn loopback_destinations_are_prohibited_unless_pinned() {
    let origin = origins::responds("200 OK", &[], "hi");
    let home = Home::new();
    let config = format!(
        "{}\n[[routes]]\nid = \"raw\"\nmatch = {{ scheme = \"http\", host = \"127.0.0.1\", port = {} }}\n",
        base(),
        origin.port()
    );
    let daemon = Daemon::start(&home, Some(&config));
    let (status, body, head) = curl(&[
        "-x",
        &daemon.proxy,
        &format!("http://127.0.0.1:{}/", origin.port()),
    ]);
    assert_eq!(status, 502);
    assert_envelope(
        &body,
        "DESTINATION_PROHIBITED",
        "connection_setup",
        "not_attempted",
        "after_correction",
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("error=destination_ip_prohibited")
    );
    assert_eq!(origin.hits(), 0);
}

#[test]
fn an_unresolvable_name_is_a_dns_error() {
    let home = Home::new();
    let config = format!(
        "{}\n[[routes]]\nid = \"nx\"\nmatch = {{ scheme = \"http\", host = \"no-such-host.invalid\" }}\nconnect_timeout = \"2s\"\n",
        base()
    );
    let daemon = Daemon::start(&home, Some(&config));
    let (status, body, head) = curl(&["-x", &daemon.proxy, "http://no-such-host.invalid/"]);
    assert_eq!(status, 502, "{body}");
    let e = assert_envelope(
        &body,
        "DNS_ERROR",
        "connection_setup",
        "not_attempted",
        "backoff",
    );
    assert_eq!(e["evidence"]["attempts"][0]["stage"], "dns");
    assert!(head.to_ascii_lowercase().contains("error=dns_error"));
}

#[test]
fn agents_authenticate_and_bad_tokens_are_journaled() {
    let origin = origins::responds("200 OK", &[], "hi");
    let home = Home::new();
    let config = route_to(origin.port(), "")
        + "\n[[agents]]\nid = \"ci\"\ntoken = \"tok-123-0123456789abcdef\"\n";
    let daemon = Daemon::start(&home, Some(&config));
    let url = format!("http://origin.test:{}/x", origin.port());
    let (status, body, head) = curl(&["-x", &daemon.proxy, &url]);
    assert_eq!(status, 407, "{body}");
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-authenticate: basic realm=\"postern\"")
    );
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    assert_eq!(
        list["invocations"].as_array().unwrap().len(),
        0,
        "a bare challenge is not journaled"
    );
    let with_bad = daemon.proxy.replace("http://", "http://ci:wrong@");
    let (status, body, _) = curl(&["-x", &with_bad, &url]);
    assert_eq!(status, 407);
    assert_envelope(
        &body,
        "AGENT_UNAUTHENTICATED",
        "validation",
        "not_attempted",
        "after_correction",
    );
    assert!(!body.contains("wrong"));
    let with_good = daemon
        .proxy
        .replace("http://", "http://ci:tok-123-0123456789abcdef@");
    let (status, body, _) = curl(&["-x", &with_good, &url]);
    assert_eq!((status, body.as_str()), (200, "hi"));
    let (_, list) = get_json(&daemon.url("/v1/invocations?outcome=not_attempted"), &[]);
    assert_eq!(list["invocations"][0]["code"], "AGENT_UNAUTHENTICATED");
    assert_eq!(
        list["invocations"][0]["agent"], "unauthenticated",
        "the claimed id is evidence, not the record's agent"
    );
    assert_eq!(list["invocations"][0]["evidence"]["claimed_agent"], "ci");
    let (_, list) = get_json(
        &daemon.url("/v1/invocations?agent=ci&outcome=committed"),
        &[],
    );
    assert_eq!(list["invocations"].as_array().unwrap().len(), 1);
    let (_, metrics, _) = curl(&[&daemon.url("/metrics")]);
    assert!(
        metrics.contains("postern_proxy_auth_challenges_total 1"),
        "{metrics}"
    );
}

#[test]
fn a_caller_that_leaves_early_never_causes_a_second_dispatch() {
    let origin = origins::slow_head(Duration::from_millis(1200), "done");
    let s = setup(origin.port(), "");
    let (status, _, _) = s.curl(&[
        "--max-time",
        "0.4",
        "-X",
        "POST",
        "--data",
        "x",
        &s.url("/slow"),
    ]);
    assert_eq!(status, 0, "curl gave up");
    let (_, list) = get_json(&s.daemon.url("/v1/invocations"), &[]);
    let id = list["invocations"][0]["invocation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = s.record_eventually(&id, |r| r["code"] == "RESULT_DELIVERY_FAILED");
    assert_eq!(
        (r["outcome"].as_str(), r["retry"].as_str()),
        (Some("committed"), Some("fetch_result")),
        "{r}"
    );
    let (_, ev) = get_json(&s.daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
    let codes: Vec<&str> = ev["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["data"]["code"].as_str())
        .collect();
    assert_eq!(
        codes,
        ["CALLER_CANCELLED", "RESULT_DELIVERY_FAILED"],
        "{ev}"
    );
    let (_, result) = get_json(&s.daemon.url(&format!("/v1/invocations/{id}/result")), &[]);
    assert_eq!(result["body_base64"], "ZG9uZQ==");
    assert_eq!(origin.hits(), 1);
}

#[test]
fn agents_read_their_own_invocations_through_postern_internal() {
    let origin = origins::responds("200 OK", &[], "mine");
    let home = Home::new();
    let config = route_to(origin.port(), "")
        + "\n[[agents]]\nid = \"ci\"\ntoken = \"t1-0123456789abcdef\"\n[[agents]]\nid = \"other\"\ntoken = \"t2-0123456789abcdef\"\n";
    let daemon = Daemon::start(&home, Some(&config));
    let ci = daemon
        .proxy
        .replace("http://", "http://ci:t1-0123456789abcdef@");
    let other = daemon
        .proxy
        .replace("http://", "http://other:t2-0123456789abcdef@");
    let (_, _, head) = curl(&[
        "-x",
        &ci,
        &format!("http://origin.test:{}/x", origin.port()),
    ]);
    let id = header(&head, "postern-invocation").unwrap().to_owned();
    let (status, body, _) = curl(&[
        "-x",
        &ci,
        &format!("http://postern.internal/v1/invocations/{id}"),
    ]);
    assert_eq!(status, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (r["invocation_id"].as_str(), r["outcome"].as_str()),
        (Some(id.as_str()), Some("committed"))
    );
    let (status, body, _) = curl(&[
        "-x",
        &ci,
        &format!("http://postern.internal/v1/invocations/{id}/result"),
    ]);
    assert_eq!(status, 200);
    let res: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(res["body_base64"], "bWluZQ==");
    // A delivery to resume: the stored body, whole or from a byte on (SPEC §2).
    let body_url = format!("http://postern.internal/v1/invocations/{id}/result/body");
    let (status, body, head) = curl(&["-x", &ci, &body_url]);
    assert_eq!((status, body.as_str()), (200, "mine"), "{head}");
    let (status, body, head) = curl(&["-x", &ci, "-r", "2-", &body_url]);
    assert_eq!((status, body.as_str()), (206, "ne"), "{head}");
    assert_eq!(
        header(&head, "content-range"),
        Some("bytes 2-3/4"),
        "{head}"
    );
    assert_eq!(header(&head, "cache-control"), Some("no-store"), "{head}");
    let (status, _, head) = curl(&["-x", &ci, "-r", "9-", &body_url]);
    assert_eq!(status, 416, "{head}");
    for path in ["", "/result", "/result/body"] {
        let url = format!("http://postern.internal/v1/invocations/{id}{path}");
        let (status, _, _) = curl(&["-x", &other, &url]);
        assert_eq!(
            status, 404,
            "another agent's invocation is not visible: {path}"
        );
    }
    let (status, _, _) = curl(&[
        "-x",
        &ci,
        "-X",
        "POST",
        &format!("http://postern.internal/v1/invocations/{id}"),
    ]);
    assert_eq!(status, 405);
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    assert_eq!(
        list["invocations"].as_array().unwrap().len(),
        1,
        "reads through postern.internal are not invocations"
    );
}

#[test]
fn sent_and_delivered_events_count_the_body_bytes() {
    let origin = origins::responds("200 OK", &["content-type: application/json"], "{\"ok\":1}");
    let s = setup(origin.port(), "");
    let (status, body, head) = s.curl(&["--data-binary", "hello", &s.url("/bytes")]);
    assert_eq!((status, body.as_str()), (200, "{\"ok\":1}"), "{head}");
    let id = header(&head, "postern-invocation")
        .unwrap_or_default()
        .to_owned();
    let mut events = s.event_data(&id);
    for _ in 0..500 {
        if events
            .last()
            .is_some_and(|e| e["kind"] == "RESULT_DELIVERED")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        events = s.event_data(&id);
    }
    let bytes_of = |kind: &str| {
        events
            .iter()
            .find(|e| e["kind"] == kind)
            .map(|e| e["data"]["bytes"].clone())
    };
    assert_eq!(bytes_of("REQUEST_SENT"), Some(5.into()), "{events:?}");
    assert_eq!(bytes_of("RESULT_DELIVERED"), Some(8.into()), "{events:?}");
}

#[test]
fn each_settled_invocation_is_one_access_log_line_without_query_values() {
    let origin = origins::responds("200 OK", &[], "ok");
    let home = Home::new();
    let daemon = Daemon::start_with(
        &home,
        Some(&route_to(origin.port(), "")),
        &[("POSTERN_LOG_FORMAT", "json")],
    );
    let url = format!(
        "http://origin.test:{}/items?q=private-value&n=2",
        origin.port()
    );
    let (status, _, head) = curl(&["-x", &daemon.proxy, &url]);
    assert_eq!(status, 200);
    let id = header(&head, "postern-invocation").unwrap().to_owned();
    let mut line = None;
    for _ in 0..250 {
        line = daemon
            .stderr()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["target"] == "postern::access" && v["fields"]["invocation"] == id.as_str());
        if line.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let line = line.unwrap_or_else(|| panic!("no access line: {}", daemon.stderr()));
    let f = &line["fields"];
    assert_eq!(f["agent"], "anonymous");
    assert_eq!(f["route"], "origin");
    assert_eq!(f["method"], "GET");
    assert_eq!(f["status"], 200);
    assert_eq!(f["outcome"], "committed");
    assert_eq!(
        f["target"],
        format!("http://origin.test:{}/items?q=&n=", origin.port())
    );
    assert!(f["duration_ms"].is_number());
    assert!(!daemon.stderr().contains("private-value"));
}

/// SPEC §3.6: an intermediary's RFC 9209 error is not the origin's answer.
#[test]
fn an_intermediary_error_is_unknown_and_names_its_hop() {
    let origin = origins::responds(
        "502 Bad Gateway",
        &["proxy-status: cdn; error=connection_refused"],
        "cdn could not reach the origin",
    );
    let s = setup(origin.port(), "");
    let (status, body, head) = s.curl(&["-X", "POST", "--data", "pay", &s.url("/pay")]);
    assert_eq!(status, 502, "{body}");
    let e = assert_envelope(
        &body,
        "UPSTREAM_HOP_ERROR",
        "remote_execution",
        "unknown",
        "reconcile",
    );
    assert_eq!(e["evidence"]["hop"], "proxy:cdn");
    assert_eq!(e["evidence"]["hop_status"], 502);
    let ps = header(&head, "proxy-status").unwrap_or_default();
    assert!(
        ps.starts_with("cdn; error=connection_refused, postern; error=http_response_incomplete"),
        "{ps}"
    );
    let (_, _, head) = s.curl(&[&s.url("/read")]);
    assert!(
        header(&head, "postern-outcome").is_some_and(|o| o.contains("retry=backoff")),
        "{head}"
    );
}

/// An agent that sends a path with raw UTF-8 (unescaped): the origin gets the same
/// character, escaped, never its bytes re-read one by one (it got `/enc/Ã©` for `/enc/é`).
#[test]
fn a_raw_utf8_path_reaches_the_origin_as_the_same_character() {
    let origin = origins::echoes_request();
    let s = setup(origin.port(), "");
    let (status, body, _) = s.curl(&[&s.url("/enc/é")]);
    assert_eq!(status, 200, "{body}");
    let line = body.lines().next().unwrap_or_default();
    assert_eq!(line, "GET /enc/%C3%A9 HTTP/1.1", "{body}");
}
