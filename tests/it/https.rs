//! HTTPS through `CONNECT` with TLS interception, driven by real curl.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use base64::Engine;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::support::{Daemon, Home, curl, get_json};
use crate::tls_origin::{self, TlsOrigin, echo_origin};

fn config(origin: &TlsOrigin, trust: bool) -> String {
    let ca = if trust {
        format!("upstream_ca = \"{}\"\n", origin.ca_file.display())
    } else {
        String::new()
    };
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"ci\"\ntoken = \"tok-0123456789abcdef\"\n\
         [[routes]]\nid = \"secure\"\nmatch = {{ host = \"origin.test\", port = {} }}\nresolve = \"{}\"\n{ca}",
        origin.addr.port(),
        origin.addr
    )
}

struct Setup {
    home: Home,
    daemon: Daemon,
    port: u16,
}

fn setup(trust: bool) -> (Setup, TlsOrigin) {
    let origin = echo_origin();
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config(&origin, trust)));
    let port = origin.addr.port();
    (Setup { home, daemon, port }, origin)
}

impl Setup {
    fn ca(&self) -> String {
        self.home.root().join("certs/ca.pem").display().to_string()
    }

    fn proxy(&self) -> String {
        self.daemon
            .proxy
            .replace("http://", "http://ci:tok-0123456789abcdef@")
    }

    fn url(&self, path: &str) -> String {
        format!("https://origin.test:{}{path}", self.port)
    }

    /// curl through this postern, trusting its CA, with `flags` before the URL.
    fn curl(&self, flags: &[&str], path: &str) -> (u16, String, String) {
        let (ca, proxy, url) = (self.ca(), self.proxy(), self.url(path));
        let mut args = flags.to_vec();
        args.extend(["--cacert", &ca, "-x", &proxy, &url]);
        curl(&args)
    }
}

#[test]
fn curl_through_connect_reaches_the_origin_with_postern_headers() {
    let (s, _origin) = setup(true);
    let (status, body, head) = curl(&[
        "--http1.1",
        "--cacert",
        &s.ca(),
        "-x",
        &s.proxy(),
        &s.url("/v1/things?a=b"),
    ]);
    assert_eq!(status, 200, "{body}\n{head}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["path"], "/v1/things?a=b");
    assert_eq!(echo["method"], "GET");
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains("postern-outcome: outcome=committed, phase=remote_execution, retry=never"),
        "{head}"
    );
    let id = lower
        .lines()
        .find_map(|l| l.strip_prefix("postern-invocation: "))
        .unwrap()
        .trim()
        .to_uppercase()
        .replace("ACT_", "act_");
    let out = s.daemon.cli(&["actions", "show", &id, "--json"], &[]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["protocol"], "https");
    assert_eq!(r["agent"], "ci");
    assert_eq!(r["target"], s.url("/v1/things?a=b"));
    assert_eq!(
        r["attempts"], 1,
        "one attempt: tcp_connect and tls_handshake"
    );
    let stages: Vec<&str> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "CONNECT_ATTEMPT")
        .map(|e| e["data"]["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["tcp_connect", "tls_handshake"]);
    assert_eq!(
        r["evidence"]["tls"]["server_name"], "origin.test",
        "the verified identity is bound: {r}"
    );
    assert!(
        r["evidence"]["tls"]["leaf_sha256"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert!(
        r["evidence"]["address"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
}

#[test]
fn h2_works_end_to_end() {
    let (s, _origin) = setup(true);
    let (status, body, head) = curl(&[
        "--http2",
        "--cacert",
        &s.ca(),
        "-x",
        &s.proxy(),
        &s.url("/h2"),
    ]);
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("\nHTTP/2 200"), "agent side is h2: {head}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["version"], "HTTP/2.0", "origin side is h2");
    assert_eq!(echo["path"], "/h2");
}

#[test]
fn an_untrusted_origin_certificate_is_refused_before_dispatch() {
    let (s, _origin) = setup(false);
    let (status, body, head) = curl(&["--cacert", &s.ca(), "-x", &s.proxy(), &s.url("/x")]);
    assert_eq!(status, 502, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["code"], "TLS_CERTIFICATE_ERROR");
    assert_eq!(e["error"]["phase"], "connection_setup");
    assert_eq!(e["error"]["outcome"], "not_attempted");
    assert_eq!(e["error"]["retry"], "after_correction");
    assert!(
        head.to_ascii_lowercase()
            .contains("error=tls_certificate_error")
    );
}

#[test]
fn connect_to_an_unrouted_host_is_denied_and_journaled() {
    let (s, _origin) = setup(true);
    let (_, _, head) = curl(&[
        "--cacert",
        &s.ca(),
        "-x",
        &s.proxy(),
        "https://elsewhere.test/",
    ]);
    assert!(
        head.starts_with("HTTP/1.1 403"),
        "the CONNECT itself is refused: {head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-status: postern; error=http_request_denied"),
        "{head}"
    );
    let (_, list) = get_json(&s.daemon.url("/v1/invocations"), &[]);
    let r = &list["invocations"][0];
    assert_eq!(
        (r["code"].as_str(), r["method"].as_str()),
        (Some("ROUTE_DENIED"), Some("CONNECT"))
    );
    assert_eq!(r["target"], "https://elsewhere.test:443");
}

#[test]
fn connect_without_credentials_is_challenged() {
    let (s, _origin) = setup(true);
    let (_, _, head) = curl(&["--cacert", &s.ca(), "-x", &s.daemon.proxy, &s.url("/x")]);
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-authenticate: basic realm=\"postern\""),
        "{head}"
    );
}

#[test]
fn the_ca_key_is_private_and_env_points_at_the_bundle() {
    let (s, _origin) = setup(true);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(s.home.root().join("certs/ca.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let out = s.home.cli(&["env"], &[]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    for name in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "NODE_EXTRA_CA_CERTS",
    ] {
        assert!(
            text.contains(&format!("export {name}=")),
            "{name} missing:\n{text}"
        );
    }
    assert!(text.contains("certs/bundle.pem") && text.contains("certs/ca.pem"));
    let bundle = std::fs::read_to_string(s.home.root().join("certs/bundle.pem")).unwrap();
    let ca = std::fs::read_to_string(s.home.root().join("certs/ca.pem")).unwrap();
    assert!(bundle.contains(ca.trim()));
}

#[test]
fn a_stalled_tls_handshake_is_a_connect_timeout() {
    let silent = crate::origins::Origin::raw(|s, _| {
        std::thread::sleep(std::time::Duration::from_secs(3));
        let _ = s;
    });
    let home = Home::new();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[routes]]\nid = \"stall\"\nmatch = {{ host = \"origin.test\", port = {} }}\nresolve = \"{}\"\nconnect_timeout = \"300ms\"\n",
        silent.port(),
        silent.addr
    );
    let daemon = Daemon::start(&home, Some(&config));
    let ca = home.root().join("certs/ca.pem").display().to_string();
    let (status, body, head) = curl(&[
        "--cacert",
        &ca,
        "-x",
        &daemon.proxy,
        &format!("https://origin.test:{}/", silent.port()),
    ]);
    assert_eq!(status, 504, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (e["error"]["code"].as_str(), e["error"]["outcome"].as_str()),
        (Some("CONNECT_TIMEOUT"), Some("not_attempted"))
    );
    assert_eq!(e["evidence"]["attempts"][0]["stage"], "tls_handshake");
    assert_eq!(
        e["evidence"]["attempts"][0]["n"], 1,
        "tcp_connect and tls_handshake are stages of one attempt"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("error=connection_timeout")
    );
}

#[test]
fn a_pooled_connection_is_reused_and_says_so() {
    let (s, _origin) = setup(true);
    for _ in 0..2 {
        let (status, _, _) = curl(&[
            "--http1.1",
            "--cacert",
            &s.ca(),
            "-x",
            &s.proxy(),
            &s.url("/again"),
        ]);
        assert_eq!(status, 200);
    }
    let (_, list) = get_json(&s.daemon.url("/v1/invocations"), &[]);
    let newest = list["invocations"][0]["invocation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, ev) = get_json(
        &s.daemon.url(&format!("/v1/invocations/{newest}/events")),
        &[],
    );
    let events = ev["events"].as_array().unwrap();
    assert!(
        events.iter().all(|e| e["kind"] != "CONNECT_ATTEMPT"),
        "{ev}"
    );
    let dispatch = events
        .iter()
        .find(|e| e["kind"] == "DISPATCH_STARTED")
        .unwrap();
    assert_eq!(dispatch["data"]["reused_connection"], true);
    assert_eq!(
        dispatch["data"]["tls"]["server_name"], "origin.test",
        "a reused connection keeps its proven identity"
    );
}

#[test]
fn python_urllib_works_through_the_exports_of_postern_env() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("python3 is needed for this test (tests/run installs it)");
    }
    let (s, _origin) = setup(true);
    let script = format!(
        "import urllib.request, json; r = urllib.request.urlopen('{}'); print(r.status, json.loads(r.read())['path'], r.headers['Postern-Outcome'])",
        s.url("/from-python")
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .env("HTTPS_PROXY", s.proxy())
        .env("https_proxy", s.proxy())
        .env("SSL_CERT_FILE", s.home.root().join("certs/bundle.pem"))
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text.trim(),
        "200 /from-python outcome=committed, phase=remote_execution, retry=never"
    );
}

/// Node's own http CONNECT + tls, trusting postern's CA only through `NODE_EXTRA_CA_CERTS`.
const NODE_CLIENT: &str = r#"
const http = require('http'), https = require('https'), tls = require('tls');
const proxy = new URL(process.env.HTTPS_PROXY), target = new URL(process.argv[1]);
const headers = proxy.username ? { 'Proxy-Authorization': 'Basic ' + Buffer.from(
  decodeURIComponent(proxy.username) + ':' + decodeURIComponent(proxy.password)).toString('base64') } : {};
const tunnel = http.request({ host: proxy.hostname, port: proxy.port, method: 'CONNECT',
  path: `${target.hostname}:${target.port}`, headers });
tunnel.on('connect', (res, socket) => {
  if (res.statusCode !== 200) { console.log('CONNECT', res.statusCode); process.exit(1); }
  const agent = new https.Agent();
  agent.createConnection = () => tls.connect({ socket, servername: target.hostname });
  const req = https.request({ host: target.hostname, port: target.port, path: target.pathname, agent },
    (r) => { let b = ''; r.on('data', (d) => b += d);
      r.on('end', () => console.log(r.statusCode, JSON.parse(b).path, r.headers['postern-outcome'])); });
  req.on('error', (e) => { console.log('error', e.message); process.exit(1); });
  req.end();
});
tunnel.on('error', (e) => { console.log('error', e.message); process.exit(1); });
tunnel.end();
"#;

#[test]
fn node_works_through_the_exports_of_postern_env() {
    if std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("node is needed for this test (tests/run installs it)");
    }
    let (s, _origin) = setup(true);
    let out = std::process::Command::new("node")
        .args(["-e", NODE_CLIENT, &s.url("/from-node")])
        .env("HTTPS_PROXY", s.proxy())
        .env("NODE_EXTRA_CA_CERTS", s.home.root().join("certs/ca.pem"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text.trim(),
        "200 /from-node outcome=committed, phase=remote_execution, retry=never"
    );
}

#[test]
fn a_broken_h2_stream_is_reset_toward_the_agent_and_stays_unknown() {
    let (s, _origin) = setup(true);
    let (_, body, head) = curl(&[
        "--http2",
        "--cacert",
        &s.ca(),
        "-x",
        &s.proxy(),
        &s.url("/broken-stream"),
    ]);
    assert!(head.contains("\nHTTP/2 200"), "{head}");
    assert!(
        head.contains("(curl:"),
        "curl must see the stream fail, not end cleanly: {head}\n{body}"
    );
    let (_, list) = get_json(&s.daemon.url("/v1/invocations"), &[]);
    let r = &list["invocations"][0];
    assert_eq!(
        (r["code"].as_str(), r["outcome"].as_str()),
        (Some("REMOTE_RESULT_INCOMPLETE"), Some("unknown")),
        "{r}"
    );
}

#[test]
fn a_client_that_probes_without_credentials_retries_after_the_challenge() {
    let (s, _origin) = setup(true);
    // --proxy-anyauth first sends CONNECT without credentials, as git does.
    let (status, body, head) = curl(&[
        "--proxy-anyauth",
        "--cacert",
        &s.ca(),
        "-x",
        &s.proxy(),
        &s.url("/probe"),
    ]);
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(
        head.contains("407"),
        "the first CONNECT was challenged: {head}"
    );
    let (_, list) = get_json(&s.daemon.url("/v1/invocations"), &[]);
    assert_eq!(
        list["invocations"].as_array().unwrap().len(),
        1,
        "the bare challenge is not an invocation"
    );
}

fn header_of<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().rev().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The kinds of an invocation's events, once `RESULT_DELIVERED` (recorded after the last
/// byte went out) or a failure has landed.
fn settled_kinds(daemon: &Daemon, id: &str) -> Vec<String> {
    let url = daemon.url(&format!("/v1/invocations/{id}/events"));
    let mut kinds = Vec::new();
    for _ in 0..40 {
        let (_, events) = get_json(&url, &[]);
        kinds = events["events"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| e["kind"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default();
        if kinds
            .iter()
            .any(|k| k == "RESULT_DELIVERED" || k == "FAILED")
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    kinds
}

#[test]
fn head_keeps_the_origins_length_and_no_response_to_it_carries_a_body() {
    let origin = echo_origin();
    let home = Home::new();
    let text = config(&origin, true).replace(
        &format!("port = {} }}", origin.addr.port()),
        &format!("port = {}, path_prefix = \"/open\" }}", origin.addr.port()),
    );
    assert!(text.contains("path_prefix"), "{text}");
    let daemon = Daemon::start(&home, Some(&text));
    let s = Setup {
        home,
        daemon,
        port: origin.addr.port(),
    };
    for version in ["--http1.1", "--http2"] {
        let (status, _, head) = s.curl(&[version, "-I"], "/open/x");
        assert_eq!(status, 200, "{version}: {head}");
        assert!(!head.contains("(curl:"), "{version}: {head}");
        let length: usize = header_of(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(
            length > 20,
            "the origin's Content-Length is kept ({version}): {head}"
        );
        assert_eq!(
            header_of(&head, "postern-outcome"),
            Some("outcome=committed, phase=remote_execution, retry=never"),
            "{version}: {head}"
        );
        let id = header_of(&head, "postern-invocation").unwrap_or_default();
        let kinds = settled_kinds(&s.daemon, id);
        assert_eq!(
            kinds.last().map(String::as_str),
            Some("RESULT_DELIVERED"),
            "{version}: {kinds:?}"
        );
    }
    // postern's own error to a HEAD: the envelope's headers only (an h2 DATA frame would be
    // a protocol error for the agent).
    for version in ["--http1.1", "--http2"] {
        let (status, _, head) = s.curl(&[version, "-I"], "/closed");
        assert_eq!(status, 403, "{version}: {head}");
        assert!(!head.contains("(curl:"), "{version}: {head}");
        assert!(
            header_of(&head, "proxy-status").is_some_and(|v| v.contains("http_request_denied")),
            "{version}: {head}"
        );
    }
}

#[test]
fn curl_http1_0_is_served_through_connect() {
    let (s, _origin) = setup(true);
    let (status, body, head) = s.curl(&["--http1.0"], "/old");
    assert_eq!(status, 200, "{body}\n{head}");
    let echo: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(echo["path"], "/old", "{body}");
}

/// SPEC §2: `RESULT_DELIVERED` once the last byte is flushed to the agent (h2: END_STREAM
/// sent), not once hyper took the body. Over h2 the frames wait in the connection's queue
/// while the agent reads nothing; a crash then must not find a record of a delivery.
#[test]
fn over_h2_result_delivered_waits_until_the_end_stream_left_postern() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // More than the socket buffers hold for a reader that reads nothing.
    const SIZE: usize = 8 << 20;
    let body = Bytes::from(vec![b'x'; SIZE]);
    let origin = tls_origin::counting(false, Duration::ZERO, 200, body);
    let home = Home::new();
    let text = config(&origin.tls, true) + "delivery = \"buffer\"\n";
    let daemon = Daemon::start(&home, Some(&text));
    let port = origin.tls.addr.port();
    let proxy = daemon.proxy.trim_start_matches("http://").to_owned();
    let ca = home.root().join("certs/ca.pem");
    let gate = Gate::default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let g = gate.clone();
    let (mut send, req) = rt.block_on(async move {
        let mut tcp = tokio::net::TcpStream::connect(&proxy).await.unwrap();
        let auth = base64::engine::general_purpose::STANDARD.encode("ci:tok-0123456789abcdef");
        let connect = format!(
            "CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
        );
        tcp.write_all(connect.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(tcp.read_u8().await.unwrap());
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        for cert in rustls::pki_types::CertificateDer::pem_file_iter(&ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let name = rustls::pki_types::ServerName::try_from("origin.test").unwrap();
        let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(name, tcp)
            .await
            .unwrap();
        let io = Gated { inner: stream, gate: g };
        let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(16 << 20)
            .initial_connection_window_size(16 << 20)
            .handshake(TokioIo::new(io))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = http::Request::get(format!("https://origin.test:{port}/big"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        (send, req)
    });
    // Sent now; answered only once the agent reads.
    let answer = rt.spawn(async move { send.send_request(req).await });
    // The agent reads nothing: postern commits, and has the response queued for it.
    let id = (0..500)
        .find_map(|_| {
            let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
            let first = &list["invocations"][0];
            if first["outcome"] == "committed" {
                return first["invocation_id"].as_str().map(str::to_owned);
            }
            std::thread::sleep(Duration::from_millis(20));
            None
        })
        .expect("the exchange committed");
    let kinds = || -> Vec<String> {
        let (_, ev) = get_json(&daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
        ev["events"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    std::thread::sleep(Duration::from_millis(500));
    let before = kinds();
    assert!(
        !before.iter().any(|k| k == "RESULT_DELIVERED"),
        "delivered while the agent had read nothing: {before:?}"
    );
    gate.open();
    let got = rt.block_on(async {
        let resp = answer.await.unwrap().unwrap();
        resp.into_body().collect().await.unwrap().to_bytes().len()
    });
    assert_eq!(got, SIZE);
    let mut after = kinds();
    for _ in 0..250 {
        if after.last().map(String::as_str) == Some("RESULT_DELIVERED") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        after = kinds();
    }
    assert_eq!(
        after.last().map(String::as_str),
        Some("RESULT_DELIVERED"),
        "{after:?}"
    );
}

/// Shared by a `Gated` reader and the test that opens it.
#[derive(Clone, Default)]
struct Gate(Arc<(AtomicBool, Mutex<Option<Waker>>)>);

impl Gate {
    fn open(&self) {
        self.0.0.store(true, Ordering::SeqCst);
        if let Some(w) = self.0.1.lock().unwrap().take() {
            w.wake();
        }
    }
}

/// A connection whose reads wait until its gate opens (an agent that reads nothing yet);
/// writes go through.
struct Gated<T> {
    inner: T,
    gate: Gate,
}

impl<T: AsyncRead + Unpin> AsyncRead for Gated<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.gate.0.0.load(Ordering::SeqCst) {
            *self.gate.0.1.lock().unwrap() = Some(cx.waker().clone());
            if !self.gate.0.0.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Gated<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
