//! Delivered means delivered (SPEC §3.9): a streamed answer the agent read in full is
//! `RESULT_DELIVERED` even when the agent closed before the stream's framing end (an SSE
//! client that stops reading once it has its answer: the MCP SDKs), and an identical
//! request afterwards is sent again. An agent that left one event short, or with the last
//! event unread in its socket (an SDK's timeout), has not seen the answer: its record
//! stays `RESULT_DELIVERY_FAILED` and its resend is answered from the store.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::origins::Origin;
use crate::support::{Daemon, Home, get_json};

const CALL: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"record","arguments":{"n":1}}}"#;

fn config(port: u16) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[routes]]\nid = \"mcp\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n"
    )
}

fn chunk(s: &str) -> String {
    format!("{:x}\r\n{s}\r\n", s.len())
}

/// What the origin does between its events, told by the test.
type Steps = Arc<Mutex<mpsc::Receiver<()>>>;

/// An SSE origin that answers each POST with event `one-<n>`, then (at the test's word)
/// `two-<n>`, then (at its word again) the stream's end: `n` counts executions.
fn sse_origin(steps: Steps) -> Origin {
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    Origin::script(move |s, _| {
        let n = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        let _ = s.write_all(head.as_bytes());
        let _ = s.write_all(chunk(&format!("data: one-{n}\n\n")).as_bytes());
        let _ = s.flush();
        let wait = |steps: &Steps| steps.lock().unwrap().recv_timeout(Duration::from_secs(10));
        let _ = wait(&steps);
        let _ = s.write_all(chunk(&format!("data: two-{n}\n\n")).as_bytes());
        let _ = s.flush();
        let _ = wait(&steps);
        let _ = s.write_all(b"0\r\n\r\n");
        let _ = s.flush();
    })
}

fn post(daemon: &Daemon, port: u16) -> TcpStream {
    let addr = daemon.proxy.trim_start_matches("http://").to_owned();
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let req = format!(
        "POST http://origin.test:{port}/mcp HTTP/1.1\r\nhost: origin.test:{port}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\n\r\n{CALL}",
        CALL.len()
    );
    conn.write_all(req.as_bytes()).unwrap();
    conn
}

/// Reads (consuming) until `needle` was read.
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

/// Waits until `needle` sits in the socket's receive buffer, without reading it.
fn arrived_unread(conn: &TcpStream, needle: &str) {
    let mut buf = [0u8; 4096];
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Ok(n) = conn.peek(&mut buf)
            && String::from_utf8_lossy(&buf[..n]).contains(needle)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("{needle} never arrived");
}

/// The record of `id` once its delivery is settled (or after 10 s), and its event kinds.
fn settled(daemon: &Daemon, id: &str) -> (Value, Vec<String>) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, events) = get_json(&daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
        let kinds: Vec<String> = events["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["kind"].as_str().map(str::to_owned))
            .collect();
        let (_, record) = get_json(&daemon.url(&format!("/v1/invocations/{id}")), &[]);
        let done = kinds.iter().any(|k| k == "RESULT_DELIVERED")
            || record["code"] == "RESULT_DELIVERY_FAILED";
        if done || Instant::now() > until {
            return (record, kinds);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn invocation_of(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("postern-invocation")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no Postern-Invocation in {head}"))
}

struct Setup {
    _home: Home,
    daemon: Daemon,
    origin: Origin,
    step: mpsc::Sender<()>,
}

fn setup() -> Setup {
    let (step, steps) = mpsc::channel();
    let origin = sse_origin(Arc::new(Mutex::new(steps)));
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(origin.port())));
    Setup {
        _home: home,
        daemon,
        origin,
        step,
    }
}

/// The same POST again once the first is settled: its answer, read up to `last`.
fn resend(s: &Setup, last: &str) -> String {
    let mut again = post(&s.daemon, s.origin.port());
    let _ = s.step.send(());
    let _ = s.step.send(());
    read_until(&mut again, last)
}

#[test]
fn an_agent_that_read_every_event_and_closed_before_the_end_has_the_answer() {
    let s = setup();
    let mut conn = post(&s.daemon, s.origin.port());
    let head = read_until(&mut conn, "data: one-1\n\n\r\n");
    let id = invocation_of(&head);
    s.step.send(()).unwrap();
    read_until(&mut conn, "data: two-1\n\n\r\n");
    // Everything read: a clean close (FIN), before the stream's end came.
    drop(conn);
    std::thread::sleep(Duration::from_millis(100));
    s.step.send(()).unwrap();
    let (record, kinds) = settled(&s.daemon, &id);
    assert!(
        kinds.iter().any(|k| k == "RESULT_DELIVERED"),
        "{kinds:?} {record}"
    );
    assert_eq!(record["outcome"], "committed", "{record}");
    assert_eq!(record["code"], Value::Null, "{record}");
    assert_eq!(
        record["evidence"]["end_of_stream_delivered"], false,
        "{record}"
    );
    // The agent saw the answer: asking again is its choice, and runs again.
    let again = resend(&s, "data: two-2");
    assert!(again.contains("data: one-2"), "not sent again: {again}");
    assert!(
        !again.to_ascii_lowercase().contains("postern-replayed"),
        "{again}"
    );
    assert_eq!(s.origin.hits(), 2);
}

#[test]
fn an_agent_that_left_one_event_short_gets_the_stored_answer_on_resend() {
    let s = setup();
    let mut conn = post(&s.daemon, s.origin.port());
    let head = read_until(&mut conn, "data: one-1\n\n\r\n");
    let id = invocation_of(&head);
    drop(conn);
    std::thread::sleep(Duration::from_millis(100));
    s.step.send(()).unwrap();
    s.step.send(()).unwrap();
    let (record, kinds) = settled(&s.daemon, &id);
    assert!(!kinds.iter().any(|k| k == "RESULT_DELIVERED"), "{kinds:?}");
    assert_eq!(
        (record["code"].as_str(), record["retry"].as_str()),
        (Some("RESULT_DELIVERY_FAILED"), Some("fetch_result")),
        "{record}"
    );
    let again = resend(&s, "data: two-1");
    assert!(
        again
            .to_ascii_lowercase()
            .contains("postern-replayed: true"),
        "{again}"
    );
    assert!(again.contains("data: two-1"), "{again}");
    assert_eq!(s.origin.hits(), 1, "the resend must not run again");
}

#[test]
fn an_agent_that_closed_with_the_last_event_unread_gets_the_stored_answer_on_resend() {
    let s = setup();
    let mut conn = post(&s.daemon, s.origin.port());
    let head = read_until(&mut conn, "data: one-1\n\n\r\n");
    let id = invocation_of(&head);
    s.step.send(()).unwrap();
    // Event two sits in the socket unread when the agent gives up: its close resets.
    arrived_unread(&conn, "data: two-1");
    drop(conn);
    std::thread::sleep(Duration::from_millis(100));
    s.step.send(()).unwrap();
    let (record, kinds) = settled(&s.daemon, &id);
    assert!(!kinds.iter().any(|k| k == "RESULT_DELIVERED"), "{kinds:?}");
    assert_eq!(record["code"], "RESULT_DELIVERY_FAILED", "{record}");
    let again = resend(&s, "data: two-1");
    assert!(
        again
            .to_ascii_lowercase()
            .contains("postern-replayed: true"),
        "{again}"
    );
    assert_eq!(s.origin.hits(), 1, "the resend must not run again");
}
