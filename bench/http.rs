//! HTTP benchmark: HTTPS through postern's CONNECT interception against a direct
//! connection, in one run. Run: `cargo bench --bench http`.
//!
//! Loopback origin (HTTPS, HTTP/1.1 keep-alive). Clients keep their connection open
//! and verify postern's CA. Cells: small GET and 1 KiB POST at concurrency 1 and 32,
//! direct / postern `fsync` / postern `buffered`; SSE per-event latency; RSS with
//! 1,000 idle agent connections.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "procstat.rs"]
mod procstat;

use procstat::rss_mb;
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Seconds per cell; `POSTERN_BENCH_SECS` lengthens a run for profiling.
fn run_time() -> Duration {
    let secs = std::env::var("POSTERN_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    Duration::from_secs(secs)
}
const BIN: &str = env!("CARGO_BIN_EXE_postern");

/// The binary under test; `POSTERN_BENCH_BIN` points at another build for A/B runs.
fn postern_bin() -> String {
    std::env::var("POSTERN_BENCH_BIN").unwrap_or_else(|_| BIN.to_owned())
}
/// Untimed requests per connection before a cell's clock starts.
const WARMUP_REQUESTS: usize = 20;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

struct Origin {
    addr: SocketAddr,
    ca_pem: String,
    /// The origin's TLS identity, also worn by the bare relay.
    acceptor: tokio_rustls::TlsAcceptor,
}

async fn handle(
    req: Request<Incoming>,
) -> Result<Response<http_body_util::combinators::BoxBody<Bytes, Infallible>>, Infallible> {
    if req.uri().path() == "/sse" {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(8);
        tokio::spawn(async move {
            for _ in 0..50 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_micros();
                if tx
                    .send(Ok(Frame::data(Bytes::from(format!("data: {now}\n\n")))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        let body = StreamBody::new(Rx(rx)).boxed();
        let mut r = Response::new(body);
        r.headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        return Ok(r);
    }
    if req.uri().path() == "/oauth/token" {
        let _ = req.into_body().collect().await;
        let token = br#"{"access_token":"bench-minted-token-5d1e","token_type":"Bearer","expires_in":3600}"#;
        let mut r = Response::new(Full::new(Bytes::from_static(token)).boxed());
        r.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        return Ok(r);
    }
    let _ = req.into_body().collect().await;
    Ok(Response::new(
        Full::new(Bytes::from_static(b"{\"ok\":true}")).boxed(),
    ))
}

/// A receiver as a stream of body frames.
struct Rx<T>(tokio::sync::mpsc::Receiver<T>);

impl<T> futures_core::Stream for Rx<T> {
    type Item = T;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}

fn start_origin(rt: &tokio::runtime::Runtime) -> Origin {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, "bench CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["origin.test".into()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let origin_acceptor = acceptor.clone();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), hyper::service::service_fn(handle))
                    .await;
            });
        }
    });
    Origin {
        addr,
        ca_pem: ca_cert.pem(),
        acceptor: origin_acceptor,
    }
}

/// The floor under any intercepting proxy here: CONNECT, TLS in, HTTP/1.1 parse, TLS out,
/// keep-alive upstream; no policy, no journal. On its own 2-thread runtime, as postern is.
fn start_relay(origin: &Origin) -> SocketAddr {
    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = origin.acceptor.clone();
    let upstream_tls = tls_client(origin.ca_pem.as_bytes());
    let target = origin.addr;
    std::thread::spawn(move || {
        rt.block_on(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, tls) = (acceptor.clone(), upstream_tls.clone());
                tokio::spawn(relay_connection(tcp, acceptor, tls, target));
            }
        })
    });
    addr
}

async fn relay_connection(
    mut tcp: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    tls: tokio_rustls::TlsConnector,
    target: SocketAddr,
) {
    let _ = tcp.set_nodelay(true);
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tcp.read_exact(&mut b).await.is_err() {
            return;
        }
        head.push(b[0]);
    }
    if tcp.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.is_err() {
        return;
    }
    let Ok(agent) = acceptor.accept(tcp).await else {
        return;
    };
    let up = TcpStream::connect(target).await.unwrap();
    up.set_nodelay(true).unwrap();
    let name = rustls::pki_types::ServerName::try_from("origin.test").unwrap();
    let up = tls.connect(name, up).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(up))
        .await
        .unwrap();
    tokio::spawn(conn);
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let sender = sender.clone();
        async move { sender.lock().await.send_request(req).await }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(agent), service)
        .await;
}

struct Postern {
    child: Child,
    proxy: SocketAddr,
    admin: SocketAddr,
    ca: PathBuf,
    _home: tempfile::TempDir,
}

impl Drop for Postern {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const BENCH_VAULT_KEY: &str = "bench-vault-key";

/// `Bearer <token>` injected on the route, so the reflection guard scans every byte.
/// A credential a benchmark route injects: its config and its vault entry's value.
struct BenchCredential {
    toml: &'static str,
    secret: &'static [u8],
}

const HEADER: BenchCredential = BenchCredential {
    toml: "[[credentials]]\nid = \"bench\"\nsecret = \"bench-token\"\ninject = { header = \"Authorization\", format = \"Bearer {secret}\" }\n",
    secret: b"bench-secret-7f3a9c0d1e2b\n",
};

const SIGV4: BenchCredential = BenchCredential {
    toml: "[[credentials]]\nid = \"bench\"\nsecret = \"bench-token\"\ninject = { aws_sigv4 = {} }\n",
    secret: br#"{"access_key_id":"AKIABENCHKEY00000001","secret_access_key":"bench-secret-key-7f3a9c0d1e2b"}"#,
};

/// `{origin_port}` is the bench origin's port, which also answers `/oauth/token`.
const OAUTH2: BenchCredential = BenchCredential {
    toml: "[[credentials]]\nid = \"bench\"\nsecret = \"bench-token\"\ninject = { oauth2 = { grant = \"client_credentials\", token_url = \"https://origin.test:{origin_port}/oauth/token\" } }\n",
    secret: br#"{"client_id":"bench-client","client_secret":"bench-client-secret-7f3a"}"#,
};

/// What an AWS SDK sends on a SigV4 route: a signature made with the placeholder.
const SIGNED_WITH_PLACEHOLDER: &[(&str, &str)] = &[
    (
        "authorization",
        "AWS4-HMAC-SHA256 Credential=postern:bench/20261206/us-east-1/bedrock/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=00",
    ),
    ("x-amz-date", "20261206T000000Z"),
    ("content-type", "application/json"),
];

fn set_bench_secret(home: &std::path::Path, value: &[u8]) {
    let mut child = Command::new(postern_bin())
        .args(["secret", "set", "bench-token"])
        .env("POSTERN_HOME", home)
        .env("POSTERN_VAULT_KEY", BENCH_VAULT_KEY)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(value).unwrap();
    assert!(child.wait().unwrap().success());
}

fn start_postern(origin: &Origin, durability: &str) -> Postern {
    start_postern_with(origin, durability, false)
}

fn start_postern_with(origin: &Origin, durability: &str, credential: bool) -> Postern {
    start_postern_journal(origin, durability, credential.then_some(&HEADER), "", "")
}

/// A postern with `journal` added to its `[journal]` table and `route` to its route
/// (retention and the resend window for the soak).
fn start_postern_journal(
    origin: &Origin,
    durability: &str,
    credential: Option<&BenchCredential>,
    journal: &str,
    route: &str,
) -> Postern {
    let home = tempfile::tempdir().unwrap();
    if let Some(c) = credential {
        set_bench_secret(&home.path().join("home"), c.secret);
    }
    let ca_file = home.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, &origin.ca_pem).unwrap();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\ndurability = \"{durability}\"\n{journal}\
         {}[[routes]]\nid = \"bench\"\nmatch = {{ host = \"origin.test\", port = {} }}\nresolve = \"{}\"\nupstream_ca = \"{}\"\n{route}{}",
        credential.map_or(String::new(), |c| c
            .toml
            .replace("{origin_port}", &origin.addr.port().to_string())),
        origin.addr.port(),
        origin.addr,
        ca_file.display(),
        if credential.is_some() {
            "credential = \"bench\"\n"
        } else {
            ""
        },
    );
    let cfg = home.path().join("postern.toml");
    std::fs::write(&cfg, config).unwrap();
    let mut child = Command::new(postern_bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("POSTERN_HOME", home.path().join("home"))
        .env("RUST_LOG", "warn")
        .env("POSTERN_VAULT_KEY", BENCH_VAULT_KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (mut proxy, mut admin) = (None, None);
    let mut lines = BufReader::new(stdout).lines();
    let address = |rest: &str| rest.trim().trim_start_matches("http://").parse().unwrap();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(p) = line.trim().strip_prefix("proxy") {
            proxy = Some(address(p));
        }
        if let Some(a) = line.trim().strip_prefix("admin") {
            admin = Some(address(a));
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    Postern {
        child,
        proxy: proxy.unwrap(),
        admin: admin.unwrap(),
        ca: home.path().join("home/certs/ca.pem"),
        _home: home,
    }
}

fn tls_client(ca_pem: &[u8]) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Opens a keep-alive HTTP/1.1 connection to the origin, directly or through CONNECT.
async fn connect(
    target: SocketAddr,
    via: Option<SocketAddr>,
    tls: &tokio_rustls::TlsConnector,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let mut tcp = TcpStream::connect(via.unwrap_or(target)).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    if via.is_some() {
        let req = format!(
            "CONNECT origin.test:{0} HTTP/1.1\r\nHost: origin.test:{0}\r\n\r\n",
            target.port()
        );
        tcp.write_all(req.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            tcp.read_exact(&mut b).await.unwrap();
            head.push(b[0]);
        }
        assert!(
            head.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&head)
        );
    }
    let name = rustls::pki_types::ServerName::try_from("origin.test").unwrap();
    let stream = tls.connect(name, tcp).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

struct Cell {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    /// Every request the proxy served in the cell, warm-up included (for CPU per request).
    served: usize,
}

async fn load(
    target: SocketAddr,
    via: Option<SocketAddr>,
    tls: tokio_rustls::TlsConnector,
    concurrency: usize,
    post: bool,
) -> Cell {
    load_with(target, via, tls, concurrency, post, &[]).await
}

/// `load`, each request also carrying `headers`.
async fn load_with(
    target: SocketAddr,
    via: Option<SocketAddr>,
    tls: tokio_rustls::TlsConnector,
    concurrency: usize,
    post: bool,
    headers: &'static [(&'static str, &'static str)],
) -> Cell {
    // Connections are opened and warmed (first upstream connection, leaf certificate)
    // before the clock starts, on every path alike.
    let ready = Arc::new(tokio::sync::Barrier::new(concurrency + 1));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let tls = tls.clone();
        let ready = ready.clone();
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(target, via, &tls).await;
            let body = Bytes::from(vec![b'x'; 1024]);
            let request = || {
                let mut r = Request::builder()
                    .method(if post { "POST" } else { "GET" })
                    .uri("/bench")
                    .header("host", format!("origin.test:{}", target.port()));
                for (name, value) in headers {
                    r = r.header(*name, *value);
                }
                r.body(Full::new(if post { body.clone() } else { Bytes::new() }))
                    .unwrap()
            };
            for _ in 0..WARMUP_REQUESTS {
                let resp = sender.send_request(request()).await.unwrap();
                let _ = resp.into_body().collect().await.unwrap();
            }
            ready.wait().await;
            let deadline = Instant::now() + run_time();
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let resp = sender.send_request(request()).await.unwrap();
                let _ = resp.into_body().collect().await.unwrap();
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    ready.wait().await;
    let started = Instant::now();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let took = started.elapsed();
    all.sort();
    let at = |q: f64| {
        all.get(((all.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    Cell {
        per_sec: all.len() as f64 / took.as_secs_f64(),
        p50: at(0.5),
        p99: at(0.99),
        served: all.len() + concurrency * WARMUP_REQUESTS,
    }
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// Bytes a process caused to be written to storage (`write_bytes` of /proc/PID/io; 0 if
/// unreadable). Compactions that run later count in a later cell.
fn written_bytes(pid: u32) -> f64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Median and p99 delay between an SSE event's send time and its arrival.
async fn sse_latency(
    target: SocketAddr,
    via: Option<SocketAddr>,
    tls: &tokio_rustls::TlsConnector,
) -> (Duration, Duration) {
    let mut sender = connect(target, via, tls).await;
    let req = Request::builder()
        .uri("/sse")
        .header("host", format!("origin.test:{}", target.port()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let mut body = sender.send_request(req).await.unwrap().into_body();
    let mut delays = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_micros();
            for line in String::from_utf8_lossy(&data).lines() {
                if let Some(sent) = line
                    .strip_prefix("data: ")
                    .and_then(|v| v.parse::<u128>().ok())
                {
                    delays.push(Duration::from_micros((now.saturating_sub(sent)) as u64));
                }
            }
        }
    }
    delays.sort();
    let at = |q: f64| {
        delays
            .get(((delays.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    (at(0.5), at(0.99))
}

fn us(d: Duration) -> String {
    format!("{:.0}µs", d.as_secs_f64() * 1e6)
}

/// `POSTERN_BENCH_ONLY` (e.g. `GET small 1 postern fsync`) runs just the matching cells, each
/// beside its direct cell, and skips the SSE, guard and RSS lines.
/// Two worker threads, as the 2-core machines this runs on have.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// What one small journal write's fdatasync costs on this disk at best: into a block written
/// before, so no allocation is committed with it.
fn fdatasync_p50(dir: &Path) -> Duration {
    use std::os::unix::fs::FileExt;
    let path = dir.join("fdatasync-floor");
    let file = std::fs::File::create(&path).unwrap();
    for page in 0..256u64 {
        file.write_all_at(&[0; 4096], page * 4096).unwrap();
    }
    file.sync_all().unwrap();
    let mut times: Vec<Duration> = (0..1000u64)
        .map(|i| {
            file.write_all_at(&[0x5a; 700], i * 700).unwrap();
            let started = Instant::now();
            file.sync_data().unwrap();
            started.elapsed()
        })
        .collect();
    let _ = std::fs::remove_file(&path);
    times.sort();
    times[times.len() / 2]
}

fn selected(cell: &str) -> bool {
    std::env::var("POSTERN_BENCH_ONLY").map_or(true, |only| cell.contains(&only))
}

fn main() {
    if std::env::var("POSTERN_BENCH_ONLY").is_ok_and(|only| only == "guard") {
        return guard_cost();
    }
    if std::env::var("POSTERN_BENCH_ONLY").is_ok_and(|only| only == "soak") {
        return soak();
    }
    if std::env::var("POSTERN_BENCH_ONLY").is_ok_and(|only| only == "cluster") {
        return cluster_cost();
    }
    if std::env::var("POSTERN_BENCH_ONLY").is_ok_and(|only| only == "credentials") {
        return credential_cost();
    }
    let rt = runtime();
    let origin = start_origin(&rt);
    let direct_tls = tls_client(origin.ca_pem.as_bytes());
    let relay = start_relay(&origin);
    let fsync = start_postern(&origin, "fsync");
    let buffered = start_postern(&origin, "buffered");
    println!(
        "HTTP benchmark: HTTPS keep-alive, {}s per cell, loopback origin, 2 cores",
        run_time().as_secs()
    );
    println!();
    println!(
        "| request | concurrency | path | req/s | p50 | p99 | ratio to direct | postern CPU s / 1000 req | postern disk KB / req |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut c1_added = None;
    for (post, label) in [(false, "GET small"), (true, "POST 1 KiB")] {
        for concurrency in [1usize, 32] {
            let paths = ["direct", "bare relay", "postern fsync", "postern buffered"];
            if !paths
                .iter()
                .any(|p| selected(&format!("{label} {concurrency} {p}")))
            {
                continue;
            }
            let direct = rt.block_on(load(
                origin.addr,
                None,
                direct_tls.clone(),
                concurrency,
                post,
            ));
            println!(
                "| {label} | {concurrency} | direct | {:.0} | {} | {} | 1.00 | - | - |",
                direct.per_sec,
                us(direct.p50),
                us(direct.p99)
            );
            if selected(&format!("{label} {concurrency} bare relay")) {
                let cell = rt.block_on(load(
                    origin.addr,
                    Some(relay),
                    direct_tls.clone(),
                    concurrency,
                    post,
                ));
                println!(
                    "| {label} | {concurrency} | bare relay (no journal) | {:.0} | {} | {} | {:.2} | - | - |",
                    cell.per_sec,
                    us(cell.p50),
                    us(cell.p99),
                    cell.per_sec / direct.per_sec,
                );
            }
            for (name, p) in [("postern fsync", &fsync), ("postern buffered", &buffered)] {
                if !selected(&format!("{label} {concurrency} {name}")) {
                    continue;
                }
                let tls = tls_client(&std::fs::read(&p.ca).unwrap());
                let (cpu0, disk0) = (cpu_seconds(p.child.id()), written_bytes(p.child.id()));
                let cell = rt.block_on(load(origin.addr, Some(p.proxy), tls, concurrency, post));
                let cpu = cpu_seconds(p.child.id()) - cpu0;
                let disk = written_bytes(p.child.id()) - disk0;
                let served = cell.served.max(1) as f64;
                if !post && concurrency == 1 && name == "postern fsync" {
                    c1_added = Some(cell.p50.saturating_sub(direct.p50));
                }
                println!(
                    "| {label} | {concurrency} | {name} | {:.0} | {} | {} | {:.2} | {:.2} | {:.1} |",
                    cell.per_sec,
                    us(cell.p50),
                    us(cell.p99),
                    cell.per_sec / direct.per_sec,
                    cpu / (served / 1000.0),
                    disk / served / 1024.0
                );
            }
        }
    }
    println!();
    if let Some(added) = c1_added {
        let sync = fdatasync_p50(fsync._home.path());
        println!(
            "GET small c=1, postern fsync: added p50 {}; floor {} (two fdatasyncs of a page written before, p50 {} each, in postern's home, + 150 µs)",
            us(added),
            us(sync * 2 + Duration::from_micros(150)),
            us(sync)
        );
        println!();
    }
    if std::env::var("POSTERN_BENCH_ONLY").is_ok() {
        return;
    }
    let (d50, d99) = rt.block_on(sse_latency(origin.addr, None, &direct_tls));
    let tls = tls_client(&std::fs::read(&fsync.ca).unwrap());
    let (p50, p99) = rt.block_on(sse_latency(origin.addr, Some(fsync.proxy), &tls));
    println!(
        "SSE per-event delay: direct p50 {} p99 {}; through postern p50 {} p99 {}; added p50 {}",
        us(d50),
        us(d99),
        us(p50),
        us(p99),
        us(p50.saturating_sub(d50))
    );
    let guarded = start_postern_with(&origin, "fsync", true);
    let tls = tls_client(&std::fs::read(&guarded.ca).unwrap());
    let (g50, g99) = rt.block_on(sse_latency(origin.addr, Some(guarded.proxy), &tls));
    println!(
        "SSE through a credentialed route (reflection guard on): p50 {} p99 {}; added to direct p50 {}",
        us(g50),
        us(g99),
        us(g50.saturating_sub(d50))
    );
    drop(guarded);
    guard_cost();
    let before = rss_mb(fsync.child.id());
    let idle: Vec<std::net::TcpStream> = (0..1000)
        .filter_map(|_| std::net::TcpStream::connect(fsync.proxy).ok())
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    println!(
        "RSS of postern: {before:.1} MB before, {:.1} MB with {} idle agent connections",
        rss_mb(fsync.child.id()),
        idle.len()
    );
}

/// The reflection guard's own cost: building it, and scanning whole and as a stream of
/// 4 KiB chunks (per MiB, the fastest of 9 runs over 2 MiB; MB/s of the streamed scan),
/// for events of plain text, of JSON with escapes (what the second pass decodes:
/// `\u00e9`, `\"`), of nothing but percent-escapes (its worst case), of prose, of
/// base64 in groups and of an `xxd` dump, of whitespace runs (a hostile origin's padding);
/// then a private key's guard (RSA-4096 size).
/// `POSTERN_BENCH_ONLY=credentials`: a POST of 1 KiB through a static-header credential and
/// through a SigV4 one postern re-signs, and a GET through a static header and through an
/// OAuth2 token postern mints (once, then kept), CPU per request side by side (SPEC §3.8).
fn credential_cost() {
    let rt = runtime();
    let origin = start_origin(&rt);
    println!("| credential | concurrency | req/s | p50 | p99 | postern CPU s / 1000 req |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, cred, headers, post) in [
        ("header (static), POST 1 KiB", &HEADER, &[][..], true),
        (
            "aws_sigv4 (re-signed), POST 1 KiB",
            &SIGV4,
            SIGNED_WITH_PLACEHOLDER,
            true,
        ),
        ("header (static), GET", &HEADER, &[][..], false),
        ("oauth2 (minted), GET", &OAUTH2, &[][..], false),
    ] {
        let p = start_postern_journal(&origin, "fsync", Some(cred), "", "");
        cpu_rows(&rt, &origin, &p, post, headers, name);
    }
}

/// One row per concurrency (1, 8) of `label`: req/s, p50, p99 and postern's CPU seconds per
/// 1000 requests.
fn cpu_rows(
    rt: &tokio::runtime::Runtime,
    origin: &Origin,
    p: &Postern,
    post: bool,
    headers: &'static [(&'static str, &'static str)],
    label: &str,
) {
    let tls = tls_client(&std::fs::read(&p.ca).unwrap());
    for concurrency in [1usize, 8] {
        let cpu0 = cpu_seconds(p.child.id());
        let cell = rt.block_on(load_with(
            origin.addr,
            Some(p.proxy),
            tls.clone(),
            concurrency,
            post,
            headers,
        ));
        let cpu = cpu_seconds(p.child.id()) - cpu0;
        println!(
            "| {label} | {concurrency} | {:.0} | {} | {} | {:.3} |",
            cell.per_sec,
            us(cell.p50),
            us(cell.p99),
            cpu / (cell.served.max(1) as f64 / 1000.0)
        );
    }
}

#[path = "../tests/it/fleet/pg.rs"]
#[allow(dead_code)]
mod pg;

/// `POSTERN_BENCH_ONLY=cluster` (SPEC §7): one node with `[cluster]` on a PostgreSQL of its
/// own (loopback, `fsync` on) against the same node alone, same run: a GET (no shared
/// call), a POST 1 KiB (resend-checked: twin lookup, claim) and a keyed POST (a key postern
/// generates: claim, and the generation confirmed before dispatch).
fn cluster_cost() {
    let rt = runtime();
    let origin = start_origin(&rt);
    let pg = pg::Postgres::start();
    let keyed = "idempotency = { header = \"Idempotency-Key\", scope = \"bench\", retention = \"1h\", safe_margin = \"10m\", generate = true }\n";
    println!("| node | request | concurrency | req/s | p50 | p99 | postern CPU s / 1000 req |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (node, cluster) in [
        ("alone", String::new()),
        (
            "[cluster]",
            format!("[cluster]\npostgres = \"{}\"\nnode = \"bench\"\n", pg.url()),
        ),
    ] {
        for (request, route, post) in [
            ("GET", "", false),
            ("POST 1 KiB", "", true),
            ("POST 1 KiB, keyed", keyed, true),
        ] {
            let p = start_postern_journal(&origin, "fsync", None, &cluster, route);
            cpu_rows(&rt, &origin, &p, post, &[], &format!("{node} | {request}"));
        }
    }
}

/// `POSTERN_BENCH_ONLY=guard` runs only this.
fn guard_cost() {
    use postern::guard::ReflectionGuard;
    let secret = b"bench-secret-7f3a9c0d1e2b";
    let started = Instant::now();
    let runs = 200u32;
    for _ in 0..runs {
        let _ = ReflectionGuard::new(secret, b"Bearer bench-secret-7f3a9c0d1e2b");
    }
    let build = started.elapsed() / runs;
    println!("Reflection guard: built in {}", us(build));
    let g = ReflectionGuard::new(secret, b"Bearer bench-secret-7f3a9c0d1e2b").unwrap();
    let events: [(&str, &[u8]); 9] = [
        ("plain", b"data: {\"delta\":\"bench text\"}\n\n"),
        (
            "JSON escapes",
            b"data: {\"delta\":\"caf\\u00e9 \\\"na\\u00efve\\\" a\\/b\"}\n\n",
        ),
        ("all %XX", b"%62%65%6E%63%68%20%74%65%78%74%0A"),
        (
            "prose",
            b"The quick brown fox jumps over the lazy dog, then naps in the sun.\n",
        ),
        (
            "base64 in groups",
            b"aGVs bG8g d29y bGQg YmVu Y2gg dGV4 dA==\n",
        ),
        (
            "xxd dump",
            b"00000010: 3f71 2061 6e64 206d 6f72 6520 7465 7874  ?q and more text\n",
        ),
        // A hostile origin's padding: one run of whitespace, blank lines, base64 then spaces.
        ("spaces only", b" "),
        ("line breaks only", b"\n"),
        (
            "A then spaces",
            b"A                                                               ",
        ),
    ];
    for (name, event) in events {
        scan_cost(&g, name, event);
    }
    pem_guard_cost();
}

/// A PEM's guard: built once per key, and its scan of plain text.
fn pem_guard_cost() {
    use postern::guard::ReflectionGuard;
    // 49 body lines of 70 characters, as an RSA-4096 OpenSSH key has.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut pem = String::from("-----BEGIN OPENSSH PRIVATE KEY-----\n");
    for _ in 0..49 {
        for _ in 0..70 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            pem.push(char::from(alphabet[(state % 64) as usize]));
        }
        pem.push('\n');
    }
    pem.push_str("-----END OPENSSH PRIVATE KEY-----\n");
    let started = Instant::now();
    let g = ReflectionGuard::for_pem(&pem).unwrap();
    println!(
        "Key guard (49 PEM lines): built in {}",
        us(started.elapsed())
    );
    scan_cost(&g, "plain", b"data: {\"delta\":\"bench text\"}\n\n");
    scan_cost(
        &g,
        "prose",
        b"The quick brown fox jumps over the lazy dog, then naps in the sun.\n",
    );
}

fn scan_cost(g: &postern::guard::ReflectionGuard, name: &str, event: &[u8]) {
    use postern::guard::Carry;
    let body: Vec<u8> = event.iter().copied().cycle().take(2 << 20).collect();
    let (whole, hits) = fastest(|| g.redact(&body).1);
    let (streamed, _) = fastest(|| {
        let mut carry = Carry::default();
        for chunk in body.chunks(4096) {
            let _ = g.redact_stream(&mut carry, chunk);
        }
        g.finish(&mut carry).1
    });
    println!(
        "  {name}: scan {} per MiB whole, {} per MiB in 4 KiB chunks ({:.0} MB/s) ({hits} hits)",
        us(whole),
        us(streamed),
        1.048_576 / streamed.as_secs_f64()
    );
}

/// The fastest of a few runs over 2 MiB, per MiB: the least disturbed by other load.
fn fastest(mut run: impl FnMut() -> usize) -> (Duration, usize) {
    let mut best = (Duration::MAX, 0);
    for _ in 0..9 {
        let started = Instant::now();
        let hits = run();
        best = best.min((started.elapsed() / 2, hits));
    }
    best
}

/// `POSTERN_BENCH_ONLY=soak`: small GETs at a constant rate (`POSTERN_SOAK_RATE`, 200/s)
/// over `POSTERN_SOAK_CONNECTIONS` (8) for `POSTERN_SOAK_SECS` (600) through postern
/// (`POSTERN_SOAK_DURABILITY`, `fsync`) with a 60 s event and result retention
/// (`POSTERN_SOAK_EVENT_RETENTION`, `POSTERN_SOAK_RESULT_RETENTION`); every
/// `POSTERN_SOAK_EVERY` (30) s the journal's size on disk (allocated blocks, the space
/// reserve left out), what postern wrote and the entries of its resend twin index. A
/// journal that stops growing levels off after the retention plus a sweep.
/// `POSTERN_SOAK_POSTS=1` sends POSTs instead, each with a body of its own (each a new twin
/// index entry), on a route whose `resend_window` is `POSTERN_SOAK_RESEND_WINDOW` (5s):
/// the index levels off at the requests of the window plus a sweep's interval.
fn soak() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (secs, rate) = (env("POSTERN_SOAK_SECS", 600), env("POSTERN_SOAK_RATE", 200));
    // `POSTERN_SOAK_QUIET` seconds more without load: what stays once results expire.
    let quiet = env("POSTERN_SOAK_QUIET", 0);
    let (connections, every) = (
        env("POSTERN_SOAK_CONNECTIONS", 8).max(1),
        env("POSTERN_SOAK_EVERY", 30).max(1),
    );
    let posts = env("POSTERN_SOAK_POSTS", 0) == 1;
    let text = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let (events, results) = (
        text("POSTERN_SOAK_EVENT_RETENTION", "60s"),
        text("POSTERN_SOAK_RESULT_RETENTION", "60s"),
    );
    let window = text("POSTERN_SOAK_RESEND_WINDOW", "5s");
    let durability = text("POSTERN_SOAK_DURABILITY", "fsync");
    let rt = runtime();
    let origin = start_origin(&rt);
    let retention = format!("event_retention = \"{events}\"\nresult_retention = \"{results}\"\n");
    let route = format!("resend_window = \"{window}\"\n");
    let p = start_postern_journal(&origin, &durability, None, &retention, &route);
    let journal = p._home.path().join("home/journal");
    let tls = tls_client(&std::fs::read(&p.ca).unwrap());
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    for c in 0..connections {
        let (tls, sent) = (tls.clone(), sent.clone());
        let (target, via) = (origin.addr, p.proxy);
        rt.spawn(async move {
            let mut sender = connect(target, Some(via), &tls).await;
            let every = Duration::from_secs_f64(connections as f64 / rate.max(1) as f64);
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0u64;
            while Instant::now() < until {
                tick.tick().await;
                n += 1;
                let (method, body) = match posts {
                    true => ("POST", Bytes::from(format!("{{\"c\":{c},\"n\":{n}}}"))),
                    false => ("GET", Bytes::new()),
                };
                let request = Request::builder()
                    .method(method)
                    .uri("/bench")
                    .header("host", format!("origin.test:{}", target.port()))
                    .body(Full::new(body))
                    .unwrap();
                // postern is stopped at the end while requests may still be under way.
                let Ok(resp) = sender.send_request(request).await else {
                    return;
                };
                let _ = resp.into_body().collect().await;
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }
    let load = match posts {
        true => format!("unique POSTs (resend window {window})"),
        false => "small GETs".to_owned(),
    };
    println!(
        "Soak: {load} at {rate}/s over {connections} connections for {secs}s (then {quiet}s without load), {durability}, event retention {events}, result retention {results}"
    );
    println!();
    println!(
        "| seconds | requests | journal on disk MB | of it fjall's write-ahead journals MB | kept KB / request | written MB | written KB / request | twin index entries |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let disk0 = written_bytes(p.child.id());
    let end = until + Duration::from_secs(quiet);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_secs(every).min(end - Instant::now()));
        let n = sent.load(std::sync::atomic::Ordering::Relaxed);
        let written = written_bytes(p.child.id()) - disk0;
        let kept = on_disk(&journal) as f64;
        let twins = metric(p.admin, "postern_journal_resend_twins")
            .map_or("?".to_owned(), |v| format!("{v:.0}"));
        println!(
            "| {} | {n} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {twins} |",
            started.elapsed().as_secs(),
            kept / 1e6,
            write_ahead(&journal) as f64 / 1e6,
            kept / n.max(1) as f64 / 1024.0,
            written / 1e6,
            written / n.max(1) as f64 / 1024.0
        );
    }
}

/// One unlabelled sample from postern's `/metrics`.
fn metric(admin: SocketAddr, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(admin).ok()?;
    let request = "GET /metrics HTTP/1.1\r\nHost: postern\r\nConnection: close\r\n\r\n";
    tcp.write_all(request.as_bytes()).ok()?;
    let mut text = String::new();
    tcp.read_to_string(&mut text).ok()?;
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Allocated bytes under `dir`, the space reserve left out.
/// fjall's write-ahead journal files (`<n>.jnl` beside its keyspaces), allocated blocks.
fn write_ahead(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "jnl"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

fn on_disk(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name() != "reserve.bin")
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => on_disk(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}
