//! No client can take postern down: connection caps, agent-side timeouts, the buffer
//! budget and leaf minting only for the CONNECT host. Scripted peers are raw loopback
//! sockets; assertions are "closed within a generous bound", never timing targets.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::origins::{self, Origin};
use crate::support::{Daemon, Home, closed_within, curl, get_json, read_head};
use crate::tls_origin::{TlsOrigin, echo_origin};

fn base(proxy: &str) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n{proxy}\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n"
    )
}

/// An `http` route to `origin.test:<port>` pinned to loopback.
fn http_config(port: u16, proxy: &str) -> String {
    format!(
        "{}\n[[routes]]\nid = \"origin\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n",
        base(proxy)
    )
}

/// An intercepted `https` route to the TLS echo origin.
fn https_config(origin: &TlsOrigin, proxy: &str) -> String {
    format!(
        "{}\n[[routes]]\nid = \"secure\"\nmatch = {{ host = \"origin.test\", port = {} }}\nresolve = \"{}\"\nupstream_ca = \"{}\"\n",
        base(proxy),
        origin.addr.port(),
        origin.addr,
        origin.ca_file.display()
    )
}

fn proxy_addr(daemon: &Daemon) -> String {
    daemon.proxy.trim_start_matches("http://").to_owned()
}

fn open(daemon: &Daemon) -> TcpStream {
    TcpStream::connect(proxy_addr(daemon)).unwrap()
}

/// The envelope's `error` members named by `keys` ("" when absent).
fn facts<'a>(e: &'a Value, keys: &[&str]) -> Vec<&'a str> {
    keys.iter()
        .map(|k| e["error"][*k].as_str().unwrap_or(""))
        .collect()
}

fn healthz(daemon: &Daemon) -> u16 {
    curl(&["--max-time", "5", &daemon.url("/healthz")]).0
}

fn metric(daemon: &Daemon, name: &str) -> f64 {
    let (_, text, _) = curl(&[&daemon.url("/metrics")]);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(-1.0)
}

fn ok_origin() -> Origin {
    origins::responds("200 OK", &[], "hello")
}

/// `n` connections, each with a GET to the origin running (raw sockets, kept open).
fn requests_running(daemon: &Daemon, port: u16, n: usize) -> Vec<TcpStream> {
    let request = format!("GET http://origin.test:{port}/ HTTP/1.1\r\nHost: origin.test\r\n\r\n");
    (0..n)
        .map(|_| {
            let mut s = open(daemon);
            s.write_all(request.as_bytes()).unwrap();
            s
        })
        .collect()
}

fn through(daemon: &Daemon, port: u16) -> u16 {
    curl(&["-x", &daemon.proxy, &format!("http://origin.test:{port}/")]).0
}

/// Four connections each with a request running: the cap is full of work, so a fifth is
/// refused at once (nothing idle to make room), the admin still answers.
#[test]
fn the_connection_cap_refuses_quickly_and_the_admin_still_answers() {
    let origin = origins::slow_head(Duration::from_secs(3), "slow");
    let home = Home::new();
    let config = http_config(
        origin.port(),
        "max_connections = 4\nmax_busy_per_agent = 4\nheader_read_timeout = \"60s\"",
    );
    let daemon = Daemon::start(&home, Some(&config));
    let busy = requests_running(&daemon, origin.port(), 4);
    std::thread::sleep(Duration::from_millis(500));

    let mut extra = open(&daemon);
    let (closed, said) = closed_within(&mut extra, Duration::from_secs(5));
    assert!(closed.is_some(), "a connection over the cap stays open");
    assert!(
        said.is_empty() || said.starts_with("HTTP/1.1 503"),
        "{said}"
    );
    assert_eq!(healthz(&daemon), 200, "the admin listener has its own cap");
    assert_eq!(
        metric(&daemon, "postern_proxy_connections_refused_total"),
        1.0
    );

    // The exchanges run to their end without their agents (3 s at the origin).
    drop(busy);
    let back = (0..40).any(|_| {
        std::thread::sleep(Duration::from_millis(250));
        through(&daemon, origin.port()) == 200
    });
    assert!(back, "slots come back");
}

/// Connections that never send a request (or sit idle between requests) cannot lock the
/// agents out: at the cap the one idle longest makes room.
#[test]
fn idle_proxy_connections_make_room_for_an_agent_at_the_cap() {
    let origin = ok_origin();
    let home = Home::new();
    let config = http_config(
        origin.port(),
        "max_connections = 4\nheader_read_timeout = \"60s\"",
    );
    let daemon = Daemon::start(&home, Some(&config));
    let mut idle: Vec<TcpStream> = (0..4).map(|_| open(&daemon)).collect();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        assert_eq!(
            through(&daemon, origin.port()),
            200,
            "locked out at the cap"
        );
    }
    let evicted = idle
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_secs(2)).0.is_some())
        .filter(|closed| *closed)
        .count();
    assert!(evicted >= 1, "the idlest connections made room");
}

#[test]
fn idle_and_half_sent_admin_connections_cannot_lock_the_operator_out() {
    let home = Home::new();
    let config = base("").replace(
        "[admin]\nlisten = \"127.0.0.1:0\"\n",
        "[admin]\nlisten = \"127.0.0.1:0\"\nmax_connections = 4\n",
    );
    let daemon = Daemon::start(&home, Some(&config));
    let admin = daemon.admin.trim_start_matches("http://").to_owned();
    let mut hogs: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(&admin).unwrap();
            s.write_all(b"GET /v1/invocations HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let out = daemon.cli(&["actions", "list"], &[]);
        assert!(out.status.success(), "the operator was locked out: {out:?}");
    }
    let evicted = hogs
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_secs(2)).0.is_some())
        .filter(|closed| *closed)
        .count();
    assert!(evicted >= 1, "the idlest connections made room");
}

#[test]
fn a_low_descriptor_limit_neither_spins_nor_floods_the_log() {
    let origin = ok_origin();
    let home = Home::new();
    let config = http_config(origin.port(), "");
    let wrapper = ["sh", "-c", "ulimit -n 160 && exec \"$@\"", "sh"];
    let mut daemon = Daemon::start_wrapped(&home, Some(&config), &[], &wrapper);
    // A full accept backlog makes connect wait for SYN retries: bounded, and stop there.
    let addr: std::net::SocketAddr = proxy_addr(&daemon).parse().unwrap();
    let idle: Vec<TcpStream> = (0..300)
        .map_while(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok())
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let health = healthz(&daemon);
    let log = std::fs::metadata(&daemon.stderr_path).map_or(0, |m| m.len());
    if log >= 64 * 1024 {
        // Keep a flooded log out of the failure report.
        let _ = daemon.child.kill();
        let _ = std::fs::write(&daemon.stderr_path, "(flooded log truncated by the test)\n");
    }
    assert!(log < 64 * 1024, "the log grew to {log} bytes in 2 s");
    assert_eq!(health, 200, "health answers while agents hold every slot");
    drop(idle);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(through(&daemon, origin.port()), 200);
}

#[test]
fn a_head_sent_byte_by_byte_is_cut_off_after_the_header_read_timeout() {
    let origin = ok_origin();
    let home = Home::new();
    let config = http_config(origin.port(), "header_read_timeout = \"500ms\"");
    let daemon = Daemon::start(&home, Some(&config));
    let mut stream = open(&daemon);
    let mut writer = stream.try_clone().unwrap();
    let head = format!(
        "GET http://origin.test:{}/ HTTP/1.1\r\nHost: origin.test\r\nX-Pad: {}\r\n\r\n",
        origin.port(),
        "a".repeat(200)
    );
    std::thread::spawn(move || {
        for b in head.bytes() {
            if writer.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let (closed, _) = closed_within(&mut stream, Duration::from_secs(8));
    assert!(
        closed.is_some_and(|d| d < Duration::from_secs(5)),
        "slowloris head kept open: {closed:?}"
    );
    assert_eq!(origin.hits(), 0);
}

/// A connection that never speaks holds no request buffers while it waits, and is still
/// closed at the header read timeout; one that speaks late within it is served.
#[test]
fn a_silent_connection_is_closed_at_the_header_read_timeout_and_a_late_one_is_served() {
    let origin = ok_origin();
    let home = Home::new();
    let config = http_config(origin.port(), "header_read_timeout = \"1s\"");
    let daemon = Daemon::start(&home, Some(&config));
    let mut silent = open(&daemon);
    let mut late = open(&daemon);
    std::thread::sleep(Duration::from_millis(600));
    write!(
        late,
        "GET http://origin.test:{}/ HTTP/1.1\r\nHost: origin.test\r\n\r\n",
        origin.port()
    )
    .unwrap();
    assert!(read_head(&mut late).starts_with("HTTP/1.1 200"));
    let (closed, _) = closed_within(&mut silent, Duration::from_secs(8));
    assert!(
        closed.is_some_and(|d| d < Duration::from_secs(4)),
        "silent connection kept open: {closed:?}"
    );
    assert_eq!(origin.hits(), 1);
}

#[test]
fn a_tunnel_without_a_client_hello_is_closed_after_the_tls_handshake_timeout() {
    let origin = echo_origin();
    let home = Home::new();
    let daemon = Daemon::start(
        &home,
        Some(&https_config(&origin, "tls_handshake_timeout = \"500ms\"")),
    );
    let mut stream = open(&daemon);
    let port = origin.addr.port();
    write!(
        stream,
        "CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n"
    )
    .unwrap();
    assert!(read_head(&mut stream).starts_with("HTTP/1.1 200"));
    let (closed, _) = closed_within(&mut stream, Duration::from_secs(8));
    assert!(
        closed.is_some_and(|d| d < Duration::from_secs(5)),
        "silent tunnel kept open: {closed:?}"
    );
    assert_eq!(
        metric(&daemon, "postern_proxy_tls_handshake_timeouts_total"),
        1.0
    );
}

#[test]
fn a_stalled_request_body_is_refused_and_journaled_before_dispatch() {
    let origin = ok_origin();
    let home = Home::new();
    let config = http_config(origin.port(), "request_body_timeout = \"500ms\"");
    let daemon = Daemon::start(&home, Some(&config));
    let mut stream = open(&daemon);
    let port = origin.port();
    write!(stream, "POST http://origin.test:{port}/x HTTP/1.1\r\nHost: origin.test:{port}\r\nContent-Length: 100\r\n\r\n0123456789").unwrap();
    let (closed, said) = closed_within(&mut stream, Duration::from_secs(8));
    assert!(
        closed.is_some_and(|d| d < Duration::from_secs(5)),
        "{closed:?}"
    );
    assert!(said.starts_with("HTTP/1.1 400"), "{said}");
    let body = said
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let e: Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        facts(&e, &["code", "field", "outcome"]),
        ["MALFORMED_REQUEST", "body", "not_attempted"]
    );
    let id = e["invocation_id"].as_str().unwrap();
    let (_, record) = get_json(&daemon.url(&format!("/v1/invocations/{id}")), &[]);
    assert_eq!(record["code"], "MALFORMED_REQUEST", "{record}");
    assert_eq!(origin.hits(), 0, "nothing was sent");
}

/// A raw upload that declares `len` bytes, sends `sent` of them and waits.
fn held_upload(daemon: &Daemon, port: u16, len: usize, sent: usize) -> TcpStream {
    let mut s = open(daemon);
    write!(s, "POST http://origin.test:{port}/up HTTP/1.1\r\nHost: origin.test:{port}\r\nContent-Length: {len}\r\n\r\n").unwrap();
    s.write_all(&vec![b'a'; sent]).unwrap();
    s
}

fn upload(daemon: &Daemon, port: u16, file: &std::path::Path) -> (u16, String, String) {
    let data = format!("@{}", file.display());
    curl(&[
        "-x",
        &daemon.proxy,
        "-H",
        "Expect:",
        "--data-binary",
        &data,
        &format!("http://origin.test:{port}/up"),
    ])
}

#[test]
fn uploads_beyond_the_buffer_budget_are_refused_with_retry_after_and_one_within_it_works() {
    let origin = ok_origin();
    let home = Home::new();
    let limits = "buffer_budget = \"1MiB\"\nmax_request_bytes = \"1MiB\"\nbuffer_wait = \"300ms\"\nrequest_body_timeout = \"20s\"";
    let daemon = Daemon::start(&home, Some(&http_config(origin.port(), limits)));
    let big = home.dir.path().join("big");
    std::fs::write(&big, vec![b'b'; 900_000]).unwrap();

    let holder = held_upload(&daemon, origin.port(), 900_000, 1000);
    std::thread::sleep(Duration::from_millis(300));
    let (status, body, head) = upload(&daemon, origin.port(), &big);
    assert_eq!(status, 429, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        facts(&e, &["code", "outcome", "retry"]),
        ["RATE_LIMITED", "not_attempted", "backoff"]
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("buffer budget"),
        "{body}"
    );
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    assert_eq!(metric(&daemon, "postern_buffer_budget_refusals_total"), 1.0);

    drop(holder);
    let mut last = 0;
    for _ in 0..20 {
        last = upload(&daemon, origin.port(), &big).0;
        if last == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        last, 200,
        "a body within the budget goes through once it is free"
    );
    assert_eq!(origin.hits(), 1);
}

#[test]
fn a_response_larger_than_the_free_budget_is_streamed_not_buffered() {
    const SIZE: usize = 2 << 20;
    let origin = Origin::script(|s, _| {
        let _ = s.write_all(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        );
        let chunk = vec![b'r'; 64 * 1024];
        for _ in 0..SIZE / chunk.len() {
            let _ = write!(s, "{:x}\r\n", chunk.len());
            let _ = s.write_all(&chunk);
            let _ = s.write_all(b"\r\n");
        }
        let _ = s.write_all(b"0\r\n\r\n");
    });
    let home = Home::new();
    let limits = "buffer_budget = \"1MiB\"\nmax_request_bytes = \"1MiB\"";
    let daemon = Daemon::start(&home, Some(&http_config(origin.port(), limits)));
    let (status, body, head) = curl(&[
        "-x",
        &daemon.proxy,
        &format!("http://origin.test:{}/", origin.port()),
    ]);
    assert_eq!((status, body.len()), (200, SIZE));
    assert!(
        head.to_ascii_lowercase()
            .contains("postern-delivery: streamed"),
        "{head}"
    );
    assert_eq!(metric(&daemon, "postern_buffer_budget_streamed_total"), 1.0);
}

/// A rustls client handshake naming `sni`, inside a fresh `CONNECT` tunnel.
fn handshake_naming(
    daemon: &Daemon,
    home: &Home,
    port: u16,
    sni: &str,
) -> Result<(), rustls::Error> {
    use rustls::pki_types::pem::PemObject;
    let mut stream = open(daemon);
    write!(
        stream,
        "CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n"
    )
    .unwrap();
    assert!(read_head(&mut stream).starts_with("HTTP/1.1 200"));
    let mut roots = rustls::RootCertStore::empty();
    let ca =
        rustls::pki_types::CertificateDer::from_pem_file(home.root().join("certs/ca.pem")).unwrap();
    roots.add(ca).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).unwrap();
    let mut tls = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    while tls.is_handshaking() {
        match tls.complete_io(&mut stream) {
            Ok(_) => {}
            Err(e) => {
                return Err(e
                    .get_ref()
                    .and_then(|i| i.downcast_ref::<rustls::Error>())
                    .cloned()
                    .unwrap_or(rustls::Error::General(e.to_string())));
            }
        }
    }
    Ok(())
}

#[test]
fn a_client_hello_naming_another_host_fails_and_the_connect_host_works() {
    let origin = echo_origin();
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&https_config(&origin, "")));
    let port = origin.addr.port();
    let evil = handshake_naming(&daemon, &home, port, "evil.test");
    assert!(
        evil.is_err(),
        "postern minted a leaf for an SNI the CONNECT did not name"
    );
    handshake_naming(&daemon, &home, port, "origin.test").unwrap();
    handshake_naming(&daemon, &home, port, "ORIGIN.test").unwrap();
}

/// Holds an intercepted connection: `CONNECT`, TLS with postern's CA, one request answered,
/// then silence (HTTP/1 keep-alive) until killed. Prints `ready` once answered.
const HOLD_INTERCEPTED: &str = r#"
import socket, ssl, sys, time
proxy, port, ca = int(sys.argv[1]), sys.argv[2], sys.argv[3]
s = socket.create_connection(("127.0.0.1", proxy))
s.sendall(f"CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
t = ssl.create_default_context(cafile=ca).wrap_socket(s, server_hostname="origin.test")
t.sendall(b"GET /held HTTP/1.1\r\nHost: origin.test\r\n\r\n")
got = t.recv(65536)
print("ready" if got.startswith(b"HTTP/1.1 200") else "failed", flush=True)
time.sleep(60)
"#;

/// An intercepted connection idle between requests makes room at the cap like any other:
/// agents holding `CONNECT`s open and silent cannot lock the others out.
#[test]
fn intercepted_connections_idle_between_requests_make_room_at_the_cap() {
    use std::io::BufRead;
    let origin = echo_origin();
    let home = Home::new();
    let config = https_config(
        &origin,
        "max_connections = 3\nheader_read_timeout = \"60s\"",
    );
    let daemon = Daemon::start(&home, Some(&config));
    let port = origin.addr.port().to_string();
    let ca = home.root().join("certs/ca.pem");
    let proxy_port = proxy_addr(&daemon)
        .rsplit(':')
        .next()
        .unwrap_or("0")
        .to_owned();
    let mut holders = Vec::new();
    for _ in 0..3 {
        let mut child = std::process::Command::new("python3")
            .args(["-c", HOLD_INTERCEPTED, &proxy_port, &port])
            .arg(&ca)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        holders.push(child);
    }
    let ca = ca.display().to_string();
    let url = format!("https://origin.test:{port}/new");
    let (status, body, _) = curl(&["--cacert", &ca, "-x", &daemon.proxy, &url]);
    for mut h in holders {
        let _ = h.kill();
        let _ = h.wait();
    }
    assert_eq!(
        status, 200,
        "locked out by idle intercepted connections: {body}"
    );
}

/// Busy connections do not make room at the cap, so one agent may keep at most
/// `max_busy_per_agent` of them busy: its next request is refused at once, unjournaled.
#[test]
fn one_agent_keeps_at_most_max_busy_per_agent_requests_running() {
    let origin = origins::slow_head(Duration::from_secs(3), "slow");
    let home = Home::new();
    let config = http_config(origin.port(), "max_busy_per_agent = 2");
    let daemon = Daemon::start(&home, Some(&config));
    let busy = requests_running(&daemon, origin.port(), 2);
    std::thread::sleep(Duration::from_millis(500));
    let (status, body, head) = curl(&[
        "-x",
        &daemon.proxy,
        &format!("http://origin.test:{}/third", origin.port()),
    ]);
    assert_eq!(status, 503, "{head}\n{body}");
    let e: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(e["error"]["code"], "JOURNAL_UNAVAILABLE", "{body}");
    assert!(e["invocation_id"].is_null(), "not journaled: {body}");
    let message = e["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_busy_per_agent"), "{body}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    drop(busy);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(through(&daemon, origin.port()), 200, "places come back");
}

/// A `CONNECT` answered `200` whose agent never starts TLS has no request running: at the
/// cap it makes room before its `tls_handshake_timeout`.
#[test]
fn connects_that_never_start_tls_make_room_at_the_cap() {
    let origin = echo_origin();
    let home = Home::new();
    let config = https_config(
        &origin,
        "max_connections = 3\ntls_handshake_timeout = \"60s\"",
    );
    let daemon = Daemon::start(&home, Some(&config));
    let port = origin.addr.port();
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = open(&daemon);
            write!(
                s,
                "CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n"
            )
            .unwrap();
            let head = read_head(&mut s);
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            s
        })
        .collect();
    let ca = home.root().join("certs/ca.pem").display().to_string();
    let url = format!("https://origin.test:{port}/new");
    let (status, body, _) = curl(&["--cacert", &ca, "-x", &daemon.proxy, &url]);
    drop(silent);
    assert_eq!(status, 200, "locked out by silent CONNECTs: {body}");
}

/// A configured cap above what the descriptor limit holds: descriptors run out at the
/// upstream connect, and the agent is told that postern ran out, not that the destination
/// refused. Connections waiting in the accept backlog take every descriptor that frees.
#[test]
fn descriptors_running_out_at_the_upstream_connect_are_postern_s_own_failure() {
    let origin = ok_origin();
    let home = Home::new();
    let config = http_config(
        origin.port(),
        "max_connections = 1000\nmax_busy_per_agent = 1000\nheader_read_timeout = \"60s\"",
    );
    let wrapper = ["sh", "-c", "ulimit -n 200 && exec \"$@\"", "sh"];
    let daemon = Daemon::start_wrapped(&home, Some(&config), &[], &wrapper);
    let pid = daemon.child.id();
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let addr: std::net::SocketAddr = proxy_addr(&daemon).parse().unwrap();
    let accepted = |before: usize| {
        (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            fds() > before
        })
    };
    let before = fds();
    let mut agent = open(&daemon);
    assert!(accepted(before), "the agent's connection is accepted");
    let mut hogs = Vec::new();
    while fds() < 200 && hogs.len() < 400 {
        let before = fds();
        hogs.extend(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok());
        accepted(before);
    }
    assert_eq!(fds(), 200, "every descriptor is taken");
    // More in the backlog, so a descriptor postern frees is taken again at once.
    hogs.extend(
        (0..20).filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()),
    );
    let port = origin.port();
    write!(
        agent,
        "GET http://origin.test:{port}/ HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let (_, response) = closed_within(&mut agent, Duration::from_secs(10));
    drop(hogs);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(head.starts_with("HTTP/1.1 502"), "{response}");
    let status = head
        .lines()
        .find_map(|l| l.strip_prefix("proxy-status: "))
        .unwrap_or("");
    assert!(status.contains("error=proxy_internal_error"), "{head}");
    let envelope: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let evidence = &envelope["evidence"];
    assert!(
        evidence["postern_resource"]
            .as_str()
            .is_some_and(|w| w.contains("EMFILE")),
        "{body}"
    );
    assert_eq!(evidence["hop"], "postern", "{body}");
    assert_eq!(envelope["error"]["outcome"], "not_attempted");
    assert_eq!(origin.hits(), 0, "nothing reached the origin");
}

/// Issue 40 (medium 3): 17 connections of one agent, each declaring 16 MiB and trickling a
/// byte every 20 s, held the whole budget, and every other agent's POST got
/// `JOURNAL_UNAVAILABLE`. One agent now holds at most its share (`agent_buffer_budget`), the
/// refusal names the share (`RATE_LIMITED`, 429), and a body slower than `min_upload_rate`
/// is cut once `request_body_timeout` has passed.
#[test]
fn one_agent_holds_only_its_share_of_the_budget_and_a_trickled_body_is_cut() {
    let origin = ok_origin();
    let home = Home::new();
    let port = origin.port();
    let limits = "buffer_budget = \"4MiB\"\nagent_buffer_budget = \"1MiB\"\nmax_request_bytes = \"1MiB\"\n\
                  buffer_wait = \"300ms\"\nrequest_body_timeout = \"2s\"\nmin_upload_rate = \"1KiB\"";
    let agents = "[[agents]]\nid = \"hog\"\ntoken = \"hog-token-0123456789\"\n\
                  [[agents]]\nid = \"other\"\ntoken = \"other-token-0123456789\"\n";
    let config = format!("{}{agents}", http_config(port, limits));
    let daemon = Daemon::start(&home, Some(&config));
    let big = home.dir.path().join("big");
    std::fs::write(&big, vec![b'b'; 900_000]).unwrap();
    let as_agent = |who: &str, token: &str| {
        let proxy = daemon
            .proxy
            .replace("http://", &format!("http://{who}:{token}@"));
        let data = format!("@{}", big.display());
        curl(&[
            "-x",
            &proxy,
            "-H",
            "Expect:",
            "--data-binary",
            &data,
            &format!("http://origin.test:{port}/up"),
        ])
    };
    // The hog declares 900 000 bytes, sends 1000, then a byte every 500 ms.
    let mut holder = open(&daemon);
    write!(holder, "POST http://origin.test:{port}/up HTTP/1.1\r\nHost: origin.test:{port}\r\n\
        Proxy-Authorization: Basic aG9nOmhvZy10b2tlbi0wMTIzNDU2Nzg5\r\nContent-Length: 900000\r\n\r\n").unwrap();
    holder.write_all(&[b'a'; 1000]).unwrap();
    let mut trickle = holder.try_clone().unwrap();
    std::thread::spawn(move || {
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(500));
            if trickle.write_all(b"a").is_err() {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let (status, body, _) = as_agent("hog", "hog-token-0123456789");
    assert_eq!(status, 429, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(facts(&e, &["code", "retry"]), ["RATE_LIMITED", "backoff"]);
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("agent_buffer_budget"),
        "{body}"
    );
    let (status, body, _) = as_agent("other", "other-token-0123456789");
    assert_eq!(status, 200, "another agent still uploads: {body}");
    // The trickle is cut at request_body_timeout (2 s), though no gap reached it.
    let (closed, said) = closed_within(&mut holder, Duration::from_secs(6));
    assert!(closed.is_some(), "the trickled body was not cut: {said}");
    assert!(said.starts_with("HTTP/1.1 400"), "{said}");
    let e: Value =
        serde_json::from_str(said.split_once("\r\n\r\n").map_or("", |(_, b)| b)).unwrap();
    assert_eq!(facts(&e, &["code", "field"]), ["MALFORMED_REQUEST", "body"]);
    let id = e["invocation_id"].as_str().unwrap_or_default();
    let (_, events) = get_json(&daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
    assert!(events.to_string().contains("min_upload_rate"), "{events}");
    assert_eq!(
        origin.hits(),
        1,
        "only the other agent's upload reached the origin"
    );
}

/// An origin that never reads the request held the exchange, its budget and the agent's
/// busy place for ever: `response_timeout` only started once the request was written.
/// Writing is bounded now (`response_timeout` plus the body at `min_upload_rate`).
#[test]
fn an_origin_that_never_reads_the_request_times_out() {
    let origin = Origin::raw(|s, _| {
        std::thread::sleep(Duration::from_secs(40));
        let _ = s.flush();
    });
    let home = Home::new();
    let config = format!(
        "{}response_timeout = \"1s\"\n",
        http_config(origin.port(), "min_upload_rate = \"16MiB\"")
    );
    let daemon = Daemon::start(&home, Some(&config));
    // More than loopback's socket buffers hold, so the write must wait for the origin.
    let big = home.dir.path().join("big");
    std::fs::write(&big, vec![b'b'; 15 << 20]).unwrap();
    let started = std::time::Instant::now();
    let (status, body, _) = curl(&[
        "-x",
        &daemon.proxy,
        "-H",
        "Expect:",
        "--max-time",
        "60",
        "--data-binary",
        &format!("@{}", big.display()),
        &format!("http://origin.test:{}/up", origin.port()),
    ]);
    let took = started.elapsed();
    assert_eq!(status, 504, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        facts(&e, &["code", "outcome"]),
        ["REMOTE_TIMEOUT", "unknown"]
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");
}
