//! `intercept = false`: a plain CONNECT tunnel, one invocation each, bytes relayed unread.
//! Driven by real curl trusting only the origin's own CA (a pinning client), and by raw
//! sockets where the exact bytes matter.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::approvals::id_of;
use crate::origins::{self, Origin};
use crate::support::{Daemon, Home, TEST_CONFIG, closed_within, curl, get_json, read_head, stdout};
use crate::tls_origin::echo_origin_for;

/// A tunnel route for `ci` to `127.0.0.1:<port>`; `extra` lines go into the route.
fn config(port: u16, extra: &str) -> String {
    format!(
        "{TEST_CONFIG}\n[[agents]]\nid = \"ci\"\ntoken = \"tok-0123456789abcdef\"\n\
         [[routes]]\nid = \"pinned\"\nagents = [\"ci\"]\nintercept = false\n\
         match = {{ host = \"127.0.0.1\", port = {port} }}\n{extra}\n"
    )
}

const PRIVATE: &str = "allow_private = true";

/// The agent's proxy URL with its identity.
fn proxy(daemon: &Daemon) -> String {
    daemon
        .proxy
        .replace("http://", "http://ci:tok-0123456789abcdef@")
}

/// A raw `CONNECT 127.0.0.1:<port>` as agent `ci`: the socket and the response head.
fn connect(daemon: &Daemon, port: u16) -> (TcpStream, String) {
    let addr = daemon.proxy.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    // base64("ci:tok-0123456789abcdef")
    write!(
        s,
        "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: Basic Y2k6dG9rLTAxMjM0NTY3ODlhYmNkZWY=\r\n\r\n"
    )
    .unwrap();
    let head = read_head(&mut s);
    (s, head)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The body that follows `head` (postern's envelope carries a Content-Length).
fn body(s: &mut TcpStream, head: &str) -> Value {
    let len: usize = header(head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf).unwrap();
    serde_json::from_slice(&buf).unwrap_or(Value::Null)
}

/// The record once the tunnel's invocation is settled (both directions ended and recorded).
fn settled(daemon: &Daemon, id: &str) -> Value {
    let mut record = Value::Null;
    for _ in 0..200 {
        let out = daemon.cli(&["actions", "show", id, "--json"], &[]);
        record = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        // `actions show` reads the record, then the events: both must have settled.
        let resolved = !record["result"].is_null() || !record["code"].is_null();
        let kinds = kinds(&record);
        if resolved
            && kinds
                .iter()
                .any(|k| k == "RESULT_DELIVERED" || k == "FAILED")
        {
            return record;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{id} did not settle: {record}");
}

fn kinds(record: &Value) -> Vec<String> {
    record["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn tunnel(record: &Value) -> (u64, u64, &str) {
    let t = &record["evidence"]["tunnel"];
    (
        t["bytes_up"].as_u64().unwrap_or(u64::MAX),
        t["bytes_down"].as_u64().unwrap_or(u64::MAX),
        t["closed_by"].as_str().unwrap_or_default(),
    )
}

#[test]
fn a_pinning_curl_reaches_its_origin_through_a_tunnel_and_the_record_is_committed() {
    let origin = echo_origin_for("127.0.0.1");
    let port = origin.addr.port();
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(port, PRIVATE)));
    // Only the origin's CA is trusted: a leaf minted by postern would fail verification.
    let ca = origin.ca_file.display().to_string();
    let url = format!("https://127.0.0.1:{port}/v1/pinned?a=b");
    let (status, body, head) = curl(&["--cacert", &ca, "-x", &proxy(&daemon), &url]);
    assert_eq!(status, 200, "{head}\n{body}");
    let echo: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(echo["path"], "/v1/pinned?a=b", "{body}");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let id = header(&head, "postern-invocation").expect("the 200 names the invocation");
    let r = settled(&daemon, id);
    assert_eq!(
        (
            r["method"].as_str(),
            r["target"].as_str(),
            r["protocol"].as_str()
        ),
        (
            Some("CONNECT"),
            Some(format!("https://127.0.0.1:{port}").as_str()),
            Some("https")
        ),
        "{r}"
    );
    assert_eq!(
        (r["outcome"].as_str(), r["code"].as_str()),
        (Some("committed"), None),
        "{r}"
    );
    assert_eq!(r["route"], "pinned");
    assert_eq!(r["evidence"]["hop"], "origin", "{r}");
    let (up, down, closed_by) = tunnel(&r);
    // A TLS handshake and an HTTP exchange went each way.
    assert!(up > 200 && down > 500, "{up} up, {down} down: {r}");
    assert_eq!(
        closed_by, "agent",
        "curl closes once it has its answer: {r}"
    );
    assert_eq!(r["result"]["bytes"].as_u64(), Some(down), "{r}");
    assert_eq!(
        kinds(&r),
        [
            "ACTION_ACCEPTED",
            "PREFLIGHT_VALIDATED",
            "CONNECT_ATTEMPT",
            "CONNECT_ATTEMPT",
            "DISPATCH_STARTED",
            "RESULT_COMMITTED",
            "RESULT_DELIVERED"
        ],
        "{r}"
    );
    let shown = stdout(&daemon.cli(&["actions", "show", id], &[]));
    for kind in ["DISPATCH_STARTED", "RESULT_COMMITTED", "bytes_down"] {
        assert!(
            shown.contains(kind),
            "{kind} missing from `actions show`:\n{shown}"
        );
    }
    let (_, result) = get_json(&daemon.url(&format!("/v1/invocations/{id}/result")), &[]);
    assert_eq!(
        result["tunnel"]["bytes_down"].as_u64(),
        Some(down),
        "{result}"
    );
    assert!(
        result.get("body_base64").is_none(),
        "no body is kept: {result}"
    );
    let text = stdout(&daemon.cli(&["result", id], &[]));
    assert!(text.contains("closed by agent"), "{text}");
}

#[test]
fn dispatch_started_is_durable_before_the_first_agent_byte_and_bytes_are_counted_exactly() {
    let admin = Arc::new(Mutex::new(String::new()));
    let origin = origins::checks_dispatch_first(admin.clone());
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port(), PRIVATE)));
    *admin.lock().unwrap() = daemon.admin.clone();
    let (mut s, head) = connect(&daemon, origin.port());
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let request = "GET /through HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    s.write_all(request.as_bytes()).unwrap();
    let (closed, answer) = closed_within(&mut s, Duration::from_secs(10));
    assert!(
        closed.is_some(),
        "the origin's close reached the agent: {answer}"
    );
    assert!(answer.ends_with("durable-before-first-byte"), "{answer}");
    let id = header(&head, "postern-invocation").unwrap();
    drop(s);
    let r = settled(&daemon, id);
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(
        tunnel(&r),
        (request.len() as u64, answer.len() as u64, "origin"),
        "{r}"
    );
}

#[test]
fn an_origin_that_closes_without_a_byte_leaves_the_tunnel_unknown() {
    let origin = Origin::raw(|s, _| {
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf);
        let _ = s.shutdown(std::net::Shutdown::Both);
    });
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port(), PRIVATE)));
    let (mut s, head) = connect(&daemon, origin.port());
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(b"hello").unwrap();
    let (closed, said) = closed_within(&mut s, Duration::from_secs(10));
    assert_eq!((closed.is_some(), said.as_str()), (true, ""));
    drop(s);
    let id = header(&head, "postern-invocation").unwrap();
    let r = settled(&daemon, id);
    let e = &r["envelope"]["error"];
    assert_eq!(
        (
            e["code"].as_str(),
            e["phase"].as_str(),
            e["outcome"].as_str()
        ),
        (
            Some("REMOTE_OUTCOME_UNKNOWN"),
            Some("remote_execution"),
            Some("unknown")
        ),
        "{r}"
    );
    assert_eq!(e["retry"], "reconcile", "CONNECT is not idempotent: {r}");
    assert_eq!(r["envelope"]["evidence"]["tunnel"]["bytes_down"], 0, "{r}");
    assert_eq!(tunnel(&r), (5, 0, "origin"), "{r}");
    assert!(r["result"].is_null(), "nothing was committed: {r}");
    assert!(kinds(&r).contains(&"DISPATCH_STARTED".to_owned()), "{r}");
}

/// A setup failure answers the CONNECT itself; the envelope and the record agree.
fn refused_connect(daemon: &Daemon, port: u16, code: &str) -> Value {
    let (mut s, head) = connect(daemon, port);
    assert!(
        head.starts_with(&format!("HTTP/1.1 502 {code} act_")),
        "{head}"
    );
    let proxy_status = header(&head, "proxy-status").unwrap_or_default();
    let env = body(&mut s, &head);
    assert_eq!(
        (
            env["error"]["code"].as_str(),
            env["error"]["phase"].as_str()
        ),
        (Some(code), Some("connection_setup")),
        "{env}"
    );
    assert_eq!(env["error"]["outcome"], "not_attempted", "{env}");
    assert_eq!(
        env["evidence"]["attempts"][0]["stage"], "tcp_connect",
        "{env}"
    );
    assert_eq!(env["evidence"]["attempts"][0]["code"], code, "{env}");
    let id = env["invocation_id"].as_str().unwrap();
    let r = settled(daemon, id);
    assert_eq!(r["method"], "CONNECT", "{r}");
    assert_eq!(r["code"], code, "{r}");
    assert!(!kinds(&r).contains(&"DISPATCH_STARTED".to_owned()), "{r}");
    serde_json::json!({"proxy_status": proxy_status, "envelope": env})
}

#[test]
fn a_refused_port_answers_the_connect_with_502_and_nothing_was_attempted() {
    let home = Home::new();
    let port = origins::refused_port();
    let daemon = Daemon::start(&home, Some(&config(port, PRIVATE)));
    let seen = refused_connect(&daemon, port, "CONNECTION_REFUSED");
    assert_eq!(seen["envelope"]["error"]["retry"], "backoff", "{seen}");
    assert!(
        seen["proxy_status"]
            .as_str()
            .unwrap()
            .contains("error=connection_refused"),
        "{seen}"
    );
}

#[test]
fn without_allow_private_a_loopback_tunnel_is_refused_before_any_connection() {
    let origin = Origin::raw(|s, _| {
        let _ = s.write_all(b"should never be reached");
    });
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port(), "")));
    let seen = refused_connect(&daemon, origin.port(), "DESTINATION_PROHIBITED");
    assert!(
        seen["proxy_status"]
            .as_str()
            .unwrap()
            .contains("error=destination_ip_prohibited"),
        "{seen}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(origin.hits(), 0, "no TCP connection was made");
}

#[test]
fn an_idle_tunnel_is_closed_by_postern_after_the_idle_timeout() {
    let served = Arc::new(AtomicUsize::new(0));
    // Keeps the connection open far longer than the route's idle_timeout.
    let origin = origins::closes_idle_connections(Duration::from_secs(60), served);
    let home = Home::new();
    let extra = format!("{PRIVATE}\nidle_timeout = \"1s\"");
    let daemon = Daemon::start(&home, Some(&config(origin.port(), &extra)));
    let (mut s, head) = connect(&daemon, origin.port());
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (closed, answer) = closed_within(&mut s, Duration::from_secs(10));
    assert!(answer.ends_with("request 1"), "{answer}");
    let closed = closed.expect("postern closed the idle tunnel");
    assert!(
        closed >= Duration::from_millis(900) && closed < Duration::from_secs(6),
        "closed after {closed:?}"
    );
    let id = header(&head, "postern-invocation").unwrap();
    let r = settled(&daemon, id);
    assert_eq!(r["outcome"], "committed", "the origin answered: {r}");
    let (_, down, closed_by) = tunnel(&r);
    assert_eq!((down, closed_by), (answer.len() as u64, "postern"), "{r}");
    assert_eq!(r["result"]["complete"], false, "{r}");
}

#[test]
fn an_approval_required_tunnel_waits_for_the_operator_before_connecting() {
    let origin = Origin::raw(|s, _| {
        let mut buf = [0u8; 64];
        if let Ok(n) = s.read(&mut buf) {
            let _ = s.write_all(&buf[..n]);
        }
    });
    let home = Home::new();
    let extra = format!("{PRIVATE}\napproval = \"required\"\napproval_timeout = \"20s\"");
    let daemon = Arc::new(Daemon::start(&home, Some(&config(origin.port(), &extra))));
    let port = origin.port();
    let held_connect = |daemon: &Arc<Daemon>| {
        let d = daemon.clone();
        let pending = std::thread::spawn(move || connect(&d, port));
        let held = held(daemon);
        (pending, id_of(&held), held)
    };
    let (pending, id, held) = held_connect(&daemon);
    assert_eq!(
        (held["method"].as_str(), held["target"].as_str()),
        (
            Some("CONNECT"),
            Some(format!("https://127.0.0.1:{port}").as_str())
        ),
        "{held}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(origin.hits(), 0, "no connection while the CONNECT is held");
    assert!(
        !pending.is_finished(),
        "the CONNECT is not answered while held"
    );
    assert!(daemon.cli(&["approve", &id], &[]).status.success());
    let (mut s, head) = pending.join().unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(b"ping").unwrap();
    let mut pong = [0u8; 4];
    s.read_exact(&mut pong).unwrap();
    assert_eq!(&pong, b"ping");
    drop(s);
    let r = settled(&daemon, &id);
    assert_eq!(r["outcome"], "committed", "{r}");
    let kinds = kinds(&r);
    let at = |k: &str| kinds.iter().position(|x| x == k).unwrap_or(usize::MAX);
    assert!(
        at("APPROVAL_REQUESTED") < at("APPROVAL_GRANTED"),
        "{kinds:?}"
    );
    assert!(at("APPROVAL_GRANTED") < at("CONNECT_ATTEMPT"), "{kinds:?}");
    assert!(at("CONNECT_ATTEMPT") < at("DISPATCH_STARTED"), "{kinds:?}");

    let (pending, id, _) = held_connect(&daemon);
    assert!(daemon.cli(&["deny", &id], &[]).status.success());
    let (_, head) = pending.join().unwrap();
    assert!(head.starts_with("HTTP/1.1 403 APPROVAL_DENIED"), "{head}");
    assert_eq!(origin.hits(), 1, "the denied tunnel never connected");
}

/// The one request held for approval, once postern lists it.
fn held(daemon: &Daemon) -> Value {
    for _ in 0..200 {
        let (_, list) = get_json(&daemon.url("/v1/approvals"), &[]);
        if let Some(first) = list["approvals"].as_array().and_then(|a| a.first()) {
            return first.clone();
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("no CONNECT was held for approval");
}

#[test]
fn a_tunnel_route_with_methods_path_prefix_or_a_credential_is_a_config_error() {
    let home = Home::new();
    let route = |i: usize, extra: &str, matcher: &str| {
        format!(
            "[[routes]]\nid = \"t{i}\"\nintercept = false\nmatch = {{ host = \"h{i}.test\"{matcher} }}\n{extra}\n"
        )
    };
    let text = format!(
        "[[credentials]]\nid = \"gh\"\nsecret = \"s\"\ninject = {{ header = \"Authorization\" }}\n{}{}{}",
        route(0, "", ", methods = [\"GET\"]"),
        route(1, "", ", path_prefix = \"/api\""),
        route(2, "credential = \"gh\"", ""),
    );
    // Listeners on port 0: a config wrongly accepted must not take a fixed port, and its
    // daemon is stopped after a while rather than hanging the test.
    let path = home.config(&format!("{TEST_CONFIG}{text}"));
    let mut serve = std::process::Command::new(crate::support::BIN)
        .args(["serve", "--config", path.to_str().unwrap()])
        .env("POSTERN_HOME", home.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut exited = None;
    for _ in 0..200 {
        exited = serve.try_wait().unwrap();
        if exited.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = serve.kill();
    let out = serve.wait_with_output().unwrap();
    assert_eq!(exited.and_then(|s| s.code()), Some(1), "{out:?}");
    let err = crate::support::stderr(&out);
    for key in [
        "routes[0].match.methods: ",
        "routes[1].match.path_prefix: ",
        "routes[2].credential: ",
    ] {
        let line = err.lines().find(|l| l.contains(key));
        assert!(
            line.is_some_and(|l| l.contains("intercept = false")),
            "{key} missing or unexplained in:\n{err}"
        );
    }
}

/// One agent cannot hold every connection postern has: past `max_busy_per_agent` open
/// tunnels its next `CONNECT` is refused before any connection (a capacity code with a
/// message naming the limit); a closed tunnel frees its place.
#[test]
fn one_agent_holds_at_most_max_busy_per_agent_tunnels() {
    let origin = Origin::raw(|s, _| {
        let mut buf = [0u8; 64];
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    });
    let text = config(origin.port(), PRIVATE).replacen(
        "[proxy]\n",
        "[proxy]\nmax_busy_per_agent = 2\n",
        1,
    );
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&text));
    let held: Vec<(TcpStream, String)> = (0..2).map(|_| connect(&daemon, origin.port())).collect();
    for (_, head) in &held {
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    let (mut s, head) = connect(&daemon, origin.port());
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    let env = body(&mut s, &head);
    assert_eq!(env["error"]["code"], "JOURNAL_UNAVAILABLE", "{env}");
    assert_eq!(env["error"]["field"], "agent", "{env}");
    assert_eq!(env["error"]["retry"], "backoff", "{env}");
    let message = env["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_busy_per_agent"), "{env}");
    assert_eq!(origin.connections(), 2, "the refused one connected nowhere");
    let (_, metrics, _) = curl(&[&daemon.url("/metrics")]);
    let gauge = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    assert_eq!(gauge("postern_agent_busy_connections"), 2.0, "{metrics}");
    assert!(gauge("postern_proxy_connections_open") >= 2.0, "{metrics}");

    drop(held);
    let mut reopened = None;
    for _ in 0..50 {
        let (s, head) = connect(&daemon, origin.port());
        if head.starts_with("HTTP/1.1 200") {
            reopened = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(reopened.is_some(), "closed tunnels free their places");
}
