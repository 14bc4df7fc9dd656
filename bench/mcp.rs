//! What `postern mcp` costs per call, beside the same request sent the way an agent on
//! `HTTPS_PROXY` sends it (a new connection, `CONNECT`, TLS with postern's CA, one GET), one
//! run, sequential calls against a loopback HTTPS origin through one daemon:
//! - `direct`: that request, in process;
//! - `postern mcp`: one `tools/call http_request` over stdio to a running `postern mcp`, its
//!   JSON-RPC answer read back (the request above, plus the record fetched for the evidence).
//!
//! `cargo bench --bench mcp`. `POSTERN_BENCH_BIN` measures another build;
//! `POSTERN_BENCH_RUNS` sets the calls per path (default 300).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_postern");
const TOKEN: &str = "bench-agent-token-0123";

fn postern_bin() -> String {
    std::env::var("POSTERN_BENCH_BIN").unwrap_or_else(|_| BIN.to_owned())
}

/// A loopback HTTPS origin for `origin.test` answering a small JSON body; its CA's PEM.
fn origin(rt: &tokio::runtime::Runtime) -> (u16, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, "bench CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["origin.test".into()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_req| async {
                    let body = Full::new(Bytes::from_static(br#"{"id":"obj_1","ok":true}"#));
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(body))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, ca_cert.pem())
}

struct Daemon {
    child: Child,
    proxy: u16,
    dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn daemon(origin_port: u16, ca_pem: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("origin-ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();
    let proxy = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:{proxy}\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[agents]]\nid = \"bench\"\ntoken = \"{TOKEN}\"\n\
         [[routes]]\nid = \"api\"\nmatch = {{ host = \"origin.test\", port = {origin_port} }}\nresolve = \"127.0.0.1:{origin_port}\"\nupstream_ca = \"{}\"\n",
        ca.display()
    );
    let cfg = dir.path().join("postern.toml");
    std::fs::write(&cfg, config).unwrap();
    let mut child = Command::new(postern_bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("POSTERN_HOME", dir.path().join("home"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        if line.unwrap().trim().starts_with("admin") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Daemon { child, proxy, dir }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn show(name: &str, mut times: Vec<Duration>, base: Option<Duration>) -> Duration {
    times.sort();
    let p50 = percentile(&times, 0.5);
    let ratio = base.map_or("1.00×".to_owned(), |b| {
        format!("{:.2}×", p50.as_secs_f64() / b.as_secs_f64())
    });
    println!(
        "| {name} | {} | {:.0} µs | {:.0} µs | {ratio} |",
        times.len(),
        p50.as_secs_f64() * 1e6,
        percentile(&times, 0.99).as_secs_f64() * 1e6
    );
    p50
}

fn main() {
    let runs: usize = std::env::var("POSTERN_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (port, ca_pem) = origin(&rt);
    let d = daemon(port, &ca_pem);
    let home = d.dir.path().join("home");
    let url = format!("https://origin.test:{port}/v1/items");
    // The agent's own request through HTTPS_PROXY, in process.
    let auth = format!(
        "Basic {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("bench:{TOKEN}")
        )
    );
    let proxy = std::net::SocketAddr::from(([127, 0, 0, 1], d.proxy));
    let agent = postern::mcp::Agent::new(proxy, &auth, &home.join("certs/ca.pem")).unwrap();
    let ask = || postern::mcp::Ask {
        method: http::Method::GET,
        url: url.parse().unwrap(),
        headers: http::HeaderMap::new(),
        body: Bytes::new(),
    };
    let mut direct = Vec::with_capacity(runs);
    for i in 0..runs + 10 {
        let start = Instant::now();
        let answer = rt.block_on(agent.send(ask())).unwrap();
        assert_eq!(answer.status, 200);
        if i >= 10 {
            direct.push(start.elapsed());
        }
    }
    // The same through postern mcp, over its stdio.
    let mut mcp = Command::new(postern_bin())
        .args(["mcp", "--agent", "bench"])
        .env("POSTERN_HOME", &home)
        .env("POSTERN_CONFIG", d.dir.path().join("postern.toml"))
        .env("POSTERN_AGENT_TOKEN", TOKEN)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = mcp.stdin.take().unwrap();
    let mut out = BufReader::new(mcp.stdout.take().unwrap());
    let mut line = String::new();
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}});
    writeln!(stdin, "{init}").unwrap();
    out.read_line(&mut line).unwrap();
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .unwrap();
    let mut via_mcp = Vec::with_capacity(runs);
    for i in 0..runs + 10 {
        let call = json!({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": {"name": "http_request", "arguments": {"method": "GET", "url": url}}});
        let start = Instant::now();
        writeln!(stdin, "{call}").unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        assert!(line.contains("\"status\":200"), "{line}");
        if i >= 10 {
            via_mcp.push(start.elapsed());
        }
    }
    drop(stdin);
    let _ = mcp.wait();
    println!(
        "\n### postern mcp per call (sequential GETs, loopback HTTPS origin, fsync journal)\n"
    );
    println!("| path | calls | p50 | p99 | p50 / direct |");
    println!("|---|---:|---:|---:|---:|");
    let base = show(
        "direct: CONNECT + TLS + GET through the proxy",
        direct,
        None,
    );
    show(
        "postern mcp: tools/call http_request over stdio",
        via_mcp,
        Some(base),
    );
}
