//! Agents that attack postern itself: failed-login floods and paths that origins read
//! differently than a prefix match does.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

use crate::origins;
use crate::support::{Daemon, Home, curl, get_json};

fn config(port: u16) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"ci\"\ntoken = \"tok-123-0123456789abcdef\"\n\
         [[routes]]\nid = \"repos\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port}, path_prefix = \"/repos\" }}\n\
         resolve = \"127.0.0.1:{port}\"\n"
    )
}

/// One request over a fresh connection; the whole response as text.
fn raw_request(proxy: &str, head: &str) -> String {
    let addr = proxy.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads one response (head and a `Content-Length` body) from a kept-alive connection.
fn read_response(s: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some(head + &String::from_utf8_lossy(&body))
}

/// Guessing tokens on one kept-alive connection: the fifth wrong one closes it, and an agent
/// with the right token on its own connection is not locked out.
#[test]
fn a_connection_that_fails_authentication_five_times_is_closed() {
    let origin = origins::responds("200 OK", &[], "hi");
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port())));
    let addr = daemon.proxy.trim_start_matches("http://").to_owned();
    let request = |token: &str| {
        use base64::Engine;
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("ci:{token}"));
        format!(
            "GET http://origin.test:{}/repos/x HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: Basic {auth}\r\n\r\n",
            origin.port()
        )
    };
    let mut guesser = TcpStream::connect(&addr).unwrap();
    guesser
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answered = 0;
    for i in 0..20 {
        if guesser
            .write_all(request(&format!("guess-{i:02}-0123456789")).as_bytes())
            .is_err()
        {
            break;
        }
        let Some(resp) = read_response(&mut guesser) else {
            break;
        };
        assert!(resp.starts_with("HTTP/1.1 407"), "{resp}");
        answered += 1;
        let closing = resp.to_ascii_lowercase().contains("connection: close");
        assert_eq!(closing, answered == 5, "guess {answered}: {resp}");
    }
    assert_eq!(answered, 5, "the fifth wrong token closed the connection");
    let mut rest = Vec::new();
    let _ = guesser.read_to_end(&mut rest);
    assert!(rest.is_empty(), "nothing after the close");
    // The right token on its own connection still works, twice on one connection.
    let mut agent = TcpStream::connect(&addr).unwrap();
    agent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    for _ in 0..2 {
        agent
            .write_all(request("tok-123-0123456789abcdef").as_bytes())
            .unwrap();
        let resp = read_response(&mut agent).unwrap_or_default();
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    }
}

fn json_body(response: &str) -> Value {
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or(Value::Null)
}

#[test]
fn a_failed_login_flood_cannot_fill_the_journal_or_wear_an_agents_name() {
    let origin = origins::responds("200 OK", &[], "hi");
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port())));
    let long_path = format!("/repos/{}", "a".repeat(7000));
    let wrong = "Basic Y2k6d3Jvbmc="; // ci:wrong
    let head = format!(
        "GET http://origin.test:{}{long_path} HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {wrong}\r\nConnection: close\r\n\r\n",
        origin.port()
    );
    let mut journaled = 0;
    let mut unjournaled = 0;
    for _ in 0..60 {
        let resp = raw_request(&daemon.proxy, &head);
        assert!(resp.starts_with("HTTP/1.1 407"), "{resp}");
        let env = json_body(&resp);
        assert_eq!(env["error"]["code"], "AGENT_UNAUTHENTICATED", "{resp}");
        assert!(env["evidence"].is_object(), "{resp}");
        match &env["invocation_id"] {
            Value::String(id) => {
                assert!(id.starts_with("act_"));
                journaled += 1;
            }
            Value::Null => {
                assert!(!resp.to_ascii_lowercase().contains("postern-invocation"));
                unjournaled += 1;
            }
            other => panic!("invocation_id {other}"),
        }
    }
    assert!(
        (1..=10).contains(&journaled),
        "journaled at a bounded rate: {journaled}"
    );
    assert_eq!(journaled + unjournaled, 60);

    let (_, list) = get_json(&daemon.url("/v1/invocations?limit=100"), &[]);
    let records = list["invocations"].as_array().unwrap();
    assert_eq!(records.len(), journaled);
    for r in records {
        assert_eq!(r["agent"], "unauthenticated");
        assert_eq!(r["evidence"]["claimed_agent"], "ci");
        assert_eq!(r["evidence"]["target_truncated"], true);
        assert!(r["target"].as_str().unwrap().len() < 300, "target capped");
    }
    let (_, mine) = get_json(&daemon.url("/v1/invocations?agent=ci"), &[]);
    assert_eq!(
        mine["invocations"].as_array().unwrap().len(),
        0,
        "failed logins never show in the claimed agent's view"
    );
    let (_, metrics, _) = curl(&[&daemon.url("/metrics")]);
    assert!(
        metrics.contains("postern_proxy_auth_failures_total 60"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "postern_proxy_auth_failures_unjournaled_total {unjournaled}"
        )),
        "{metrics}"
    );
    assert_eq!(origin.hits(), 0);
}

#[test]
fn a_bare_challenge_is_an_unjournaled_envelope() {
    let origin = origins::responds("200 OK", &[], "hi");
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port())));
    let head = format!(
        "GET http://origin.test:{}/repos/x HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n",
        origin.port()
    );
    let resp = raw_request(&daemon.proxy, &head);
    assert!(resp.starts_with("HTTP/1.1 407"), "{resp}");
    let env = json_body(&resp);
    assert!(env["invocation_id"].is_null(), "{resp}");
    assert_eq!(env["error"]["retry"], "after_correction");
    assert_eq!(env["evidence"]["dispatch_started"], false);
}

#[test]
fn paths_origins_read_differently_are_refused_before_matching() {
    let origin = origins::responds("200 OK", &[], "hi");
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port())));
    let auth = "Basic Y2k6dG9rLTEyMy0wMTIzNDU2Nzg5YWJjZGVm"; // ci:tok-123-0123456789abcdef
    let send = |path: &str| {
        raw_request(
            &daemon.proxy,
            &format!(
                "GET http://origin.test:{}{path} HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {auth}\r\nConnection: close\r\n\r\n",
                origin.port()
            ),
        )
    };
    for path in [
        "/repos/..;/admin",
        "/repos/..%3B/admin",
        "/repos/..\\admin",
        "/repos/%5c..%5cadmin",
        "/repos/%2e%2e%5cadmin",
        "/repos/%252e%252e/admin",
        "/repos/%c0%ae%c0%ae/admin",
        "/repos/%00/x",
    ] {
        let resp = send(path);
        assert!(resp.starts_with("HTTP/1.1 400"), "{path}: {resp}");
        let env = json_body(&resp);
        assert_eq!(env["error"]["code"], "INVALID_TARGET", "{path}");
        assert_eq!(env["error"]["field"], "target.path", "{path}");
    }
    assert_eq!(origin.hits(), 0, "nothing refused reached the origin");

    let resp = send("//%72epos//a%2db");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(
        origin.last_request().starts_with("GET /repos/a-b HTTP/1.1"),
        "the origin gets the path that was matched: {}",
        origin.last_request()
    );
}

/// An origin closes an idle pooled connection between `DISPATCH_STARTED` and the send
/// (held open there by a test hook): hyper hands the request back unwritten, which proves
/// nothing was sent, so it goes out on a fresh connection instead of being recorded as
/// possibly executed.
#[test]
fn a_request_handed_back_unwritten_is_sent_on_a_fresh_connection() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let served = Arc::new(AtomicUsize::new(0));
    let origin = origins::closes_idle_connections(Duration::from_millis(150), served.clone());
    let home = Home::new();
    let daemon = Daemon::start_with(
        &home,
        Some(&config(origin.port())),
        &[("POSTERN_PAUSE_BEFORE_SEND_MS", "600")],
    );
    let proxy = daemon
        .proxy
        .replace("http://", "http://ci:tok-123-0123456789abcdef@");
    let url = format!("http://origin.test:{}/repos/x", origin.port());
    let (status, body, _) = curl(&["-x", &proxy, &url]);
    assert_eq!((status, body.as_str()), (200, "request 1"));
    let (status, body, head) = curl(&["-x", &proxy, "-X", "POST", "--data", "once", &url]);
    assert_eq!((status, body.as_str()), (200, "request 2"), "{head}");
    assert_eq!(
        served.load(Ordering::SeqCst),
        2,
        "each request reached the origin once"
    );
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    let second = &list["invocations"][0];
    assert_eq!(second["outcome"], "committed", "{second}");
    assert_eq!(second["evidence"]["reused_connection"], true, "{second}");
    assert_eq!(second["evidence"]["resent_unwritten"], true, "{second}");
}

/// An authenticated agent's refused requests are journaled at a bounded rate, their
/// targets capped: a hijacked agent cannot fill the disk with ROUTE_DENIED records.
#[test]
fn a_flood_of_refused_requests_cannot_fill_the_journal() {
    let origin = origins::responds("200 OK", &[], "hi");
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port())));
    let auth = "Basic Y2k6dG9rLTEyMy0wMTIzNDU2Nzg5YWJjZGVm"; // ci:tok-123-0123456789abcdef
    let head = format!(
        "GET http://origin.test:{}/deny/{} HTTP/1.1\r\nHost: origin.test\r\nProxy-Authorization: {auth}\r\nConnection: close\r\n\r\n",
        origin.port(),
        "B".repeat(7000)
    );
    let mut unjournaled = 0;
    for _ in 0..80 {
        let resp = raw_request(&daemon.proxy, &head);
        assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
        let env = json_body(&resp);
        assert_eq!(env["error"]["code"], "ROUTE_DENIED");
        if env["invocation_id"].is_null() {
            unjournaled += 1;
        }
    }
    assert!(
        unjournaled >= 40,
        "only {unjournaled} of 80 went unjournaled"
    );
    let (_, list) = get_json(&daemon.url("/v1/invocations?limit=200&agent=ci"), &[]);
    let records = list["invocations"].as_array().unwrap();
    assert_eq!(records.len(), 80 - unjournaled);
    for r in records {
        assert!(r["target"].as_str().unwrap().len() < 300, "target capped");
        assert_eq!(r["evidence"]["target_truncated"], true);
    }
    let (_, metrics, _) = curl(&[&daemon.url("/metrics")]);
    assert!(
        metrics.contains(&format!(
            "postern_proxy_refusals_unjournaled_total {unjournaled}"
        )),
        "{metrics}"
    );
}
