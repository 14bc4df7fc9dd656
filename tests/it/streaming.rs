//! Streamed delivery: SSE with low per-event latency, a stream broken midway, trailers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::origins::Origin;
use crate::support::{Daemon, Home, curl, get_json};

fn config(port: u16, journal: &str, extra: &str) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n{journal}\n\
         [[routes]]\nid = \"sse\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n{extra}\n"
    )
}

fn chunk(s: &str) -> String {
    format!("{:x}\r\n{s}\r\n", s.len())
}

/// An SSE origin that sends one event, waits for the test's go, sends the rest.
fn sse_origin(go: mpsc::Receiver<()>, finish_cleanly: bool) -> Origin {
    let go = std::sync::Mutex::new(go);
    Origin::script(move |s, _| {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        let _ = s.write_all(head.as_bytes());
        let _ = s.write_all(chunk("data: one\n\n").as_bytes());
        let _ = s.flush();
        let _ = go.lock().unwrap().recv_timeout(Duration::from_secs(10));
        let _ = s.write_all(chunk("data: two\n\n").as_bytes());
        if finish_cleanly {
            let _ = s.write_all(b"0\r\n\r\n");
        }
        let _ = s.flush();
        let _ = s.shutdown(std::net::Shutdown::Both);
    })
}

fn proxy_get(daemon: &Daemon, url: &str, extra_headers: &str) -> TcpStream {
    let addr = daemon.proxy.trim_start_matches("http://").to_owned();
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let req = format!("GET {url} HTTP/1.1\r\nhost: origin.test\r\n{extra_headers}\r\n");
    conn.write_all(req.as_bytes()).unwrap();
    conn
}

fn read_until(conn: &mut TcpStream, needle: &str) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(needle) {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn read_all(conn: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let _ = conn.read_to_end(&mut got);
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn sse_events_reach_the_agent_before_the_stream_ends() {
    let (go, wait) = mpsc::channel();
    let origin = sse_origin(wait, true);
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port(), "", "")));
    let url = format!("http://origin.test:{}/events", origin.port());
    let mut conn = proxy_get(&daemon, &url, "te: trailers\r\n");
    // The origin holds event two until we have seen event one through postern.
    let first = read_until(&mut conn, "data: one");
    assert!(
        first.contains("data: one"),
        "event one was not relayed on its own: {first}"
    );
    let lower = first.to_ascii_lowercase();
    assert!(lower.contains("postern-delivery: streamed"), "{first}");
    assert!(lower.contains("postern-invocation: act_"), "{first}");
    assert!(
        !lower.contains("postern-outcome: outcome"),
        "the head cannot know the outcome: {first}"
    );
    assert!(lower.contains("trailer: postern-outcome"), "{first}");
    go.send(()).unwrap();
    let rest = read_until(&mut conn, "retry=never");
    assert!(rest.contains("data: two"), "{rest}");
    assert!(
        rest.to_ascii_lowercase()
            .contains("postern-outcome: outcome=committed, phase=remote_execution, retry=never"),
        "trailer: {rest}"
    );
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    let r = &list["invocations"][0];
    assert_eq!(r["outcome"], "committed");
    assert_eq!(r["evidence"]["delivery"], "streamed");
    let id = r["invocation_id"].as_str().unwrap();
    let (_, res) = get_json(&daemon.url(&format!("/v1/invocations/{id}/result")), &[]);
    use base64::Engine;
    let body = base64::engine::general_purpose::STANDARD
        .decode(res["body_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&body), "data: one\n\ndata: two\n\n");
}

#[test]
fn a_stream_broken_midway_is_aborted_toward_the_agent_and_stays_unknown() {
    let (go, wait) = mpsc::channel();
    let origin = sse_origin(wait, false);
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port(), "", "")));
    let url = format!("http://origin.test:{}/events", origin.port());
    let mut conn = proxy_get(&daemon, &url, "");
    read_until(&mut conn, "data: one");
    go.send(()).unwrap();
    let rest = read_all(&mut conn);
    assert!(
        !rest.contains("0\r\n\r\n"),
        "the agent's stream must not end cleanly: {rest:?}"
    );
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    let r = &list["invocations"][0];
    assert_eq!(
        (r["code"].as_str(), r["outcome"].as_str()),
        (Some("REMOTE_RESULT_INCOMPLETE"), Some("unknown")),
        "{r}"
    );
    assert_eq!(r["retry"], "backoff");
}

#[test]
fn a_body_past_the_buffer_limit_continues_as_a_stream() {
    let body = "x".repeat(5000);
    let payload = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{}{}0\r\n\r\n",
        chunk(&body[..2500]),
        chunk(&body[2500..])
    );
    let origin = Origin::script(move |s, _| {
        let _ = s.write_all(payload.as_bytes());
    });
    let home = Home::new();
    let daemon = Daemon::start(
        &home,
        Some(&config(
            origin.port(),
            "buffer_limit = \"1KiB\"\nmax_result_bytes = \"2KiB\"",
            "",
        )),
    );
    let url = format!("http://origin.test:{}/big", origin.port());
    let (status, got, head) = curl(&["-x", &daemon.proxy, &url]);
    assert_eq!((status, got.len()), (200, 5000));
    assert!(
        head.to_ascii_lowercase()
            .contains("postern-delivery: streamed"),
        "{head}"
    );
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    let id = list["invocations"][0]["invocation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, res) = get_json(&daemon.url(&format!("/v1/invocations/{id}/result")), &[]);
    assert_eq!(res["body_stored"], false, "{res}");
    assert!(res["body_base64"].is_null());
    assert_eq!(res["bytes"], 5000);
    let r: Value = get_json(&daemon.url(&format!("/v1/invocations/{id}")), &[]).1;
    assert_eq!(r["result"]["bytes"], 5000);
    let events = format!("/v1/invocations/{id}/events");
    let mut delivered = Value::Null;
    for _ in 0..100 {
        let (_, ev) = get_json(&daemon.url(&events), &[]);
        if let Some(e) = ev["events"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["kind"] == "RESULT_DELIVERED"))
        {
            delivered = e["data"]["bytes"].clone();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        delivered, 5000,
        "RESULT_DELIVERED counts the streamed bytes"
    );
}

/// An origin that streams up to 64 MiB of chunked body at about 13 MiB/s and counts what it
/// managed to write before postern stopped reading.
fn slow_big_origin(written: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Origin {
    Origin::script(move |s, _| {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        if s.write_all(head.as_bytes()).is_err() {
            return;
        }
        let piece = chunk(&"x".repeat(64 * 1024));
        for _ in 0..1024 {
            if s.write_all(piece.as_bytes()).is_err() {
                return;
            }
            written.fetch_add(64 * 1024, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = s.write_all(b"0\r\n\r\n");
    })
}

/// A daemon keeping at most 1 MiB of a result; an agent sends `request`, reads 256 KiB of
/// the answer and leaves.
fn reads_a_little_then_leaves(home: &Home, port: u16, request: &str) -> Daemon {
    let journal = "buffer_limit = \"64KiB\"\nmax_result_bytes = \"1MiB\"";
    let daemon = Daemon::start(home, Some(&config(port, journal, "")));
    let addr = daemon.proxy.trim_start_matches("http://").to_owned();
    let mut agent = TcpStream::connect(&addr).unwrap();
    agent.write_all(request.as_bytes()).unwrap();
    let mut first = vec![0u8; 256 * 1024];
    agent.read_exact(&mut first).unwrap();
    daemon
}

/// A GET whose body is over `max_result_bytes` and whose agent left: postern stops reading
/// (nothing would be stored, and a new GET is safe), and the record never points at a
/// result to fetch.
#[test]
fn a_get_too_big_to_store_whose_agent_left_stops_reading_and_points_at_no_result() {
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let origin = slow_big_origin(written.clone());
    let home = Home::new();
    let request = format!(
        "GET http://origin.test:{}/big HTTP/1.1\r\nHost: origin.test\r\n\r\n",
        origin.port()
    );
    let daemon = reads_a_little_then_leaves(&home, origin.port(), &request);
    let left_at = written.load(std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(3));
    let after = written.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        after < left_at + 8 * 1024 * 1024,
        "postern kept reading after the agent left: {left_at} then {after} bytes"
    );
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    let r = &list["invocations"][0];
    assert_ne!(r["retry"], "fetch_result", "{r}");
    assert_ne!(r["code"], "RESULT_DELIVERY_FAILED", "{r}");
    assert_eq!(
        r["outcome"], "unknown",
        "the body was not read to its end: {r}"
    );
    let id = r["invocation_id"].as_str().unwrap_or("");
    let (status, _) = get_json(&daemon.url(&format!("/v1/invocations/{id}/result")), &[]);
    assert_eq!(status, 404, "no result to fetch");
}

/// A POST's body over `max_result_bytes`, read to its end after its agent left: the record is
/// committed, but it says `fetch_result` only where a body is stored.
#[test]
fn a_post_too_big_to_store_whose_agent_left_is_committed_without_fetch_result() {
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let origin = slow_big_origin(written.clone());
    let home = Home::new();
    let request = format!(
        "POST http://origin.test:{}/big HTTP/1.1\r\nHost: origin.test\r\nContent-Length: 2\r\n\r\n{{}}",
        origin.port()
    );
    let daemon = reads_a_little_then_leaves(&home, origin.port(), &request);
    let mut r = Value::Null;
    for _ in 0..200 {
        let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
        r = list["invocations"][0].clone();
        if r["outcome"] == "committed" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(r["outcome"], "committed", "{r}");
    std::thread::sleep(Duration::from_millis(300));
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    let r = &list["invocations"][0];
    assert_ne!(r["retry"], "fetch_result", "nothing to fetch: {r}");
}
