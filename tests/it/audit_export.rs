//! The audit export (SPEC §5.8): every journal event reaches a loopback OTLP/HTTP receiver
//! once and in seq order — through a receiver outage, a postern restart, and a receiver
//! that takes the connection and never answers (which must not slow a request).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::origins;
use crate::support::{Daemon, Home, TEST_CONFIG, curl, secret_set, stdout};

const VAULT_KEY: &str = "vault-passphrase-for-tests";
const SECRET_CANARY: &str = "canary-otlp-3f9a1c-vault-secret";
const TOKEN_CANARY: &str = "canary-otlp-token-8d2e47b1c0";
const BODY_CANARY: &str = "canary-otlp-body-51c7e2";

/// A loopback OTLP/HTTP receiver that decodes every `ExportLogsServiceRequest`.
mod receiver {
    use std::collections::BTreeMap;
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::{Request, Response};
    use hyper_util::rt::TokioIo;
    use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use prost::Message;

    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum Mode {
        /// 200 to every request.
        Accepts,
        /// This status to every request (an outage).
        Refuses(u16),
        /// Reads the request and never answers.
        Hangs,
    }

    /// One log record as received: its attributes as text, its time.
    #[derive(Clone, Debug)]
    pub struct Record {
        pub attrs: BTreeMap<String, String>,
        pub time_unix_nano: u64,
        pub body: String,
    }

    impl Record {
        pub fn seq(&self) -> u64 {
            self.attrs["postern.seq"].parse().unwrap()
        }
    }

    #[derive(Default)]
    struct Seen {
        records: Vec<Record>,
        /// Every request's head and body, as received.
        bytes: Vec<u8>,
        requests: usize,
        refused: usize,
        /// Requests that were not a protobuf POST to /v1/logs.
        wrong: Vec<String>,
        resource: BTreeMap<String, String>,
    }

    struct Shared {
        mode: Mutex<Mode>,
        seen: Mutex<Seen>,
    }

    pub struct Receiver {
        pub url: String,
        shared: Arc<Shared>,
        _stop: tokio::sync::oneshot::Sender<()>,
    }

    pub fn accepting() -> Receiver {
        start(Mode::Accepts)
    }

    pub fn refusing(status: u16) -> Receiver {
        start(Mode::Refuses(status))
    }

    pub fn never_answering() -> Receiver {
        start(Mode::Hangs)
    }

    /// Accepting over TLS as `localhost`, with a certificate of a fresh CA written in `dir`
    /// (returned: what `SSL_CERT_FILE` must name for postern to trust it).
    pub fn accepting_tls(dir: &std::path::Path) -> (Receiver, std::path::PathBuf) {
        let (acceptor, ca_file) = crate::tls_origin::acceptor("localhost", &[b"http/1.1"], dir);
        (start_with(Mode::Accepts, Some(acceptor)), ca_file)
    }

    fn start(mode: Mode) -> Receiver {
        start_with(mode, None)
    }

    fn start_with(mode: Mode, tls: Option<tokio_rustls::TlsAcceptor>) -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = match tls {
            None => format!("http://127.0.0.1:{port}"),
            Some(_) => format!("https://localhost:{port}"),
        };
        let shared = Arc::new(Shared {
            mode: Mutex::new(mode),
            seen: Mutex::default(),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = shared.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                tokio::select! {
                    _ = accept_loop(listener, serving, tls) => {}
                    _ = stopped => {}
                }
            });
        });
        Receiver {
            url,
            shared,
            _stop: stop,
        }
    }

    async fn accept_loop(
        listener: tokio::net::TcpListener,
        shared: Arc<Shared>,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) {
        while let Ok((stream, _)) = listener.accept().await {
            let (shared, tls) = (shared.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    None => serve(stream, shared).await,
                    Some(tls) => {
                        if let Ok(stream) = tls.accept(stream).await {
                            serve(stream, shared).await;
                        }
                    }
                }
            });
        }
    }

    async fn serve<I>(io: I, shared: Arc<Shared>)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |req| answer(shared.clone(), req));
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), service)
            .await;
    }

    async fn answer(
        shared: Arc<Shared>,
        req: Request<hyper::body::Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let head = format!("{} {} {:?}\n", req.method(), req.uri(), req.headers());
        let proper = req.method() == "POST"
            && req.uri().path() == "/v1/logs"
            && req.headers()["content-type"] == "application/x-protobuf";
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let mode = *shared.mode.lock().unwrap();
        {
            let mut seen = shared.seen.lock().unwrap();
            seen.requests += 1;
            seen.bytes.extend_from_slice(head.as_bytes());
            seen.bytes.extend_from_slice(&body);
            if !proper {
                seen.wrong.push(head.clone());
            }
        }
        let status = match mode {
            Mode::Hangs => std::future::pending().await,
            Mode::Refuses(status) => {
                shared.seen.lock().unwrap().refused += 1;
                status
            }
            Mode::Accepts => {
                record(&shared, &body);
                200
            }
        };
        Ok(Response::builder()
            .status(status)
            .header("content-type", "application/x-protobuf")
            .body(Full::new(Bytes::new()))
            .unwrap())
    }

    fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
        match v.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => s.clone(),
            Some(Value::IntValue(i)) => i.to_string(),
            other => format!("{other:?}"),
        }
    }

    fn record(shared: &Shared, body: &[u8]) {
        let request = ExportLogsServiceRequest::decode(body).unwrap();
        let mut seen = shared.seen.lock().unwrap();
        for resource_logs in request.resource_logs {
            for kv in resource_logs.resource.unwrap_or_default().attributes {
                seen.resource.insert(kv.key, text(&kv.value));
            }
            for scope in resource_logs.scope_logs {
                for r in scope.log_records {
                    let attrs = r
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(&kv.value)))
                        .collect();
                    seen.records.push(Record {
                        attrs,
                        time_unix_nano: r.time_unix_nano,
                        body: text(&r.body),
                    });
                }
            }
        }
    }

    impl Receiver {
        pub fn set_mode(&self, mode: Mode) {
            *self.shared.mode.lock().unwrap() = mode;
        }

        pub fn records(&self) -> Vec<Record> {
            self.shared.seen.lock().unwrap().records.clone()
        }

        pub fn seqs(&self) -> Vec<u64> {
            self.records().iter().map(Record::seq).collect()
        }

        pub fn bytes(&self) -> Vec<u8> {
            self.shared.seen.lock().unwrap().bytes.clone()
        }

        pub fn requests(&self) -> usize {
            self.shared.seen.lock().unwrap().requests
        }

        pub fn refused(&self) -> usize {
            self.shared.seen.lock().unwrap().refused
        }

        pub fn wrong(&self) -> Vec<String> {
            self.shared.seen.lock().unwrap().wrong.clone()
        }

        pub fn resource(&self) -> BTreeMap<String, String> {
            self.shared.seen.lock().unwrap().resource.clone()
        }

        /// Waits until `done` holds for what was received.
        pub fn wait(&self, within: Duration, done: impl Fn(&Receiver) -> bool) -> bool {
            let deadline = Instant::now() + within;
            while Instant::now() < deadline {
                if done(self) {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            done(self)
        }
    }
}

fn config(origin_port: u16, endpoint: &str) -> String {
    format!(
        r#"{TEST_CONFIG}
[audit]
otlp_endpoint = "{endpoint}"

[[agents]]
id = "ci"
token = "{TOKEN_CANARY}"

[[credentials]]
id = "api"
secret = "api-key"
inject = {{ header = "X-Api-Key" }}

[[routes]]
id = "origin"
credential = "api"
match = {{ scheme = "http", host = "origin.test", port = {origin_port} }}
resolve = "127.0.0.1:{origin_port}"
"#
    )
}

struct Setup {
    home: Home,
    /// None only while a restart swaps it.
    running: Option<Daemon>,
    origin: origins::Origin,
}

fn setup(endpoint: &str) -> Setup {
    setup_trusting(endpoint, None)
}

fn setup_trusting(endpoint: &str, roots: Option<&std::path::Path>) -> Setup {
    let home = Home::new();
    assert!(
        secret_set(&home, "api-key", SECRET_CANARY, Some(VAULT_KEY))
            .status
            .success()
    );
    let origin = origins::responds("200 OK", &["content-type: text/plain"], "done");
    let running = Some(start_trusting(&home, origin.port(), endpoint, roots));
    Setup {
        home,
        running,
        origin,
    }
}

fn start(home: &Home, origin_port: u16, endpoint: &str) -> Daemon {
    start_trusting(home, origin_port, endpoint, None)
}

/// With `SSL_CERT_FILE` naming `roots`, when given.
fn start_trusting(
    home: &Home,
    origin_port: u16,
    endpoint: &str,
    roots: Option<&std::path::Path>,
) -> Daemon {
    let roots = roots.map(|p| p.display().to_string());
    let mut envs = vec![("POSTERN_VAULT_KEY", VAULT_KEY)];
    if let Some(roots) = &roots {
        envs.push(("SSL_CERT_FILE", roots.as_str()));
    }
    Daemon::start_with(home, Some(&config(origin_port, endpoint)), &envs)
}

impl Setup {
    fn daemon(&self) -> &Daemon {
        self.running.as_ref().unwrap()
    }

    /// Stops the daemon (SIGTERM, as a supervisor would) and starts it again on its home.
    fn restart(&mut self, endpoint: &str) {
        let stopped = self.running.take().unwrap().terminate();
        assert_eq!(stopped, Some(0), "a clean stop");
        self.running = Some(start(&self.home, self.origin.port(), endpoint));
    }

    /// A POST through the proxy carrying the body canary.
    fn post(&self, n: usize) {
        let proxy = self
            .daemon()
            .proxy
            .replace("http://", &format!("http://ci:{TOKEN_CANARY}@"));
        let url = format!("http://origin.test:{}/pay/{n}", self.origin.port());
        let body = format!("{{\"note\":\"{BODY_CANARY}\"}}");
        let (status, text, _) = curl(&["-x", &proxy, "--data", &body, &url]);
        assert_eq!(status, 200, "{text}");
    }

    /// `postern audit export` through the daemon: every event, as JSON.
    fn exported(&self) -> Vec<Value> {
        let out = self.daemon().cli(&["audit", "export"], &[]);
        assert!(out.status.success(), "{out:?}");
        stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Waits until the receiver holds exactly the seqs `audit export` lists.
    fn converged(&self, receiver: &receiver::Receiver, within: Duration) -> Vec<Value> {
        let deadline = Instant::now() + within;
        loop {
            let exported = self.exported();
            let want: Vec<u64> = exported
                .iter()
                .map(|e| e["seq"].as_u64().unwrap())
                .collect();
            let got = receiver.seqs();
            if got == want {
                return exported;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver has {got:?}, the journal {want:?}\n{}",
                self.daemon().stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn metric(&self, name: &str) -> f64 {
        metric(self.daemon(), name)
    }
}

fn metric(daemon: &Daemon, name: &str) -> f64 {
    let (status, text, _) = curl(&[&daemon.url("/metrics")]);
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// Waits until `/metrics` shows `name` at `value`.
fn metric_reaches(daemon: &Daemon, name: &str, value: f64) {
    for _ in 0..200 {
        if metric(daemon, name) == value {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(metric(daemon, name), value, "{name}");
}

fn rfc3339_nanos(ts: &str) -> u64 {
    let t =
        time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).unwrap();
    t.unix_timestamp_nanos() as u64
}

fn assert_once_in_order(seqs: &[u64]) {
    let want: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, want, "every seq once, in order");
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn every_event_reaches_the_receiver_once_in_order_with_its_facts_and_no_secret() {
    let receiver = receiver::accepting();
    let s = setup(&receiver.url);
    let banner = s.daemon().stdout_until(&receiver.url);
    assert!(
        banner.last().is_some_and(|l| l.trim().starts_with("audit")),
        "the banner names the receiver: {banner:?}"
    );
    for n in 0..4 {
        s.post(n);
    }
    let exported = s.converged(&receiver, Duration::from_secs(20));
    assert!(exported.len() >= 4 * 8, "{}", exported.len());
    let records = receiver.records();
    assert_once_in_order(&receiver.seqs());
    let mut last_of: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (r, e)) in records.iter().zip(&exported).enumerate() {
        let a = &r.attrs;
        for key in [
            "invocation_id",
            "kind",
            "source",
            "hop",
            "hash",
            "prev_hash",
            "agent",
        ] {
            let want = e[key].as_str().unwrap_or_else(|| panic!("{key} in {e}"));
            assert_eq!(a[&format!("postern.{key}")], want, "{key} of {e}");
        }
        if let Some(route) = e["route"].as_str() {
            assert_eq!(a["postern.route"], route, "{e}");
        }
        assert!(a.contains_key("postern.outcome"), "{a:?}");
        assert_eq!(r.body, e["kind"].as_str().unwrap());
        assert_eq!(r.time_unix_nano, rfc3339_nanos(e["ts"].as_str().unwrap()));
        last_of.insert(e["invocation_id"].as_str().unwrap().to_owned(), i);
    }
    // The facts as the journal proved them when the event left: final on an invocation's
    // last event.
    for i in last_of.values() {
        let (a, e) = (&records[*i].attrs, &exported[*i]);
        assert_eq!(a["postern.outcome"], e["outcome"].as_str().unwrap(), "{e}");
        assert_eq!(
            a.get("postern.code").map(String::as_str),
            e["code"].as_str()
        );
        assert_eq!(a["postern.route"], "origin");
    }
    assert_eq!(receiver.resource()["service.name"], "postern");
    assert!(receiver.wrong().is_empty(), "{:?}", receiver.wrong());
    let bytes = receiver.bytes();
    for canary in [SECRET_CANARY, TOKEN_CANARY, BODY_CANARY] {
        assert!(!contains(&bytes, canary), "{canary} reached the receiver");
    }
    assert!(
        s.origin.last_request().contains(SECRET_CANARY),
        "the secret was injected"
    );
    let last = exported.len() as f64;
    metric_reaches(s.daemon(), "postern_audit_export_acked_seq", last);
    assert_eq!(s.metric("postern_audit_export_events_total"), last);
    assert_eq!(s.metric("postern_audit_export_failures_total"), 0.0);
    assert_eq!(s.metric("postern_audit_export_skipped_total"), 0.0);
}

#[test]
fn a_receiver_outage_delays_the_export_and_loses_nothing() {
    let receiver = receiver::refusing(503);
    let s = setup(&receiver.url);
    s.post(0);
    assert!(
        receiver.wait(Duration::from_secs(10), |r| r.refused() >= 3),
        "the exporter tries again: {} refused",
        receiver.refused()
    );
    for n in 1..4 {
        s.post(n);
    }
    assert!(receiver.records().is_empty());
    assert!(s.metric("postern_audit_export_failures_total") >= 3.0);
    assert_eq!(s.metric("postern_audit_export_acked_seq"), 0.0);
    receiver.set_mode(receiver::Mode::Accepts);
    let exported = s.converged(&receiver, Duration::from_secs(30));
    assert_once_in_order(&receiver.seqs());
    let last = exported.len() as f64;
    metric_reaches(s.daemon(), "postern_audit_export_acked_seq", last);
    assert_eq!(s.metric("postern_audit_export_events_total"), last);
}

#[test]
fn a_restart_resumes_after_the_last_acknowledged_seq() {
    let receiver = receiver::accepting();
    let mut s = setup(&receiver.url);
    for n in 0..2 {
        s.post(n);
    }
    let before = s.converged(&receiver, Duration::from_secs(20)).len();
    // The cursor is saved before the gauge moves: at this value it is on disk.
    metric_reaches(s.daemon(), "postern_audit_export_acked_seq", before as f64);
    s.restart(&receiver.url);
    // A resend would come at once: give it the time of a few polls.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        receiver.seqs().len(),
        before,
        "nothing acknowledged is sent again"
    );
    for n in 2..4 {
        s.post(n);
    }
    let exported = s.converged(&receiver, Duration::from_secs(20));
    assert!(exported.len() > before);
    assert_once_in_order(&receiver.seqs());
    metric_reaches(
        s.daemon(),
        "postern_audit_export_acked_seq",
        exported.len() as f64,
    );
    assert_eq!(
        s.metric("postern_audit_export_events_total"),
        (exported.len() - before) as f64,
        "this run sent only what the last one had not"
    );
}

/// One request through the proxy on a fresh connection, timed to the last response byte.
fn timed_get(proxy: &str, origin_port: u16) -> Duration {
    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("ci:{TOKEN_CANARY}"));
    let started = Instant::now();
    let mut stream = TcpStream::connect(proxy.trim_start_matches("http://")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let req = format!(
        "GET http://origin.test:{origin_port}/ HTTP/1.1\r\nHost: origin.test:{origin_port}\r\nProxy-Authorization: Basic {auth}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let took = started.elapsed();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    took
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// Two daemons side by side, one exporting to a receiver that answers and one to a receiver
/// that takes the connection and never answers; requests alternate between them so both see
/// the same machine load. The stalled export must not show in request latency.
#[test]
fn a_receiver_that_never_answers_does_not_slow_requests() {
    const REQUESTS: usize = 50;
    let answering = receiver::accepting();
    let hanging = receiver::never_answering();
    let a = setup(&answering.url);
    let b = setup(&hanging.url);
    let (mut normal, mut stalled) = (Vec::new(), Vec::new());
    for i in 0..REQUESTS {
        // Alternate which goes first, so neither always runs right after the other.
        if i % 2 == 0 {
            normal.push(timed_get(&a.daemon().proxy, a.origin.port()));
            stalled.push(timed_get(&b.daemon().proxy, b.origin.port()));
        } else {
            stalled.push(timed_get(&b.daemon().proxy, b.origin.port()));
            normal.push(timed_get(&a.daemon().proxy, a.origin.port()));
        }
    }
    let (normal, stalled) = (median(normal), median(stalled));
    eprintln!(
        "audit export latency: median of {REQUESTS} requests {normal:?} with an answering receiver, {stalled:?} with one that never answers"
    );
    assert!(hanging.requests() >= 1, "the stalled exporter did send");
    assert!(hanging.records().is_empty());
    assert!(answering.wait(Duration::from_secs(10), |r| !r.records().is_empty()));
    assert_eq!(metric(b.daemon(), "postern_audit_export_acked_seq"), 0.0);
    assert!(
        stalled <= normal * 3 + Duration::from_millis(5),
        "requests slowed down: median {stalled:?} against {normal:?}"
    );
    // The POST left hanging is given up after the exporter's timeout (10 s) and sent again.
    hanging.set_mode(receiver::Mode::Accepts);
    b.converged(&hanging, Duration::from_secs(30));
    assert_once_in_order(&hanging.seqs());
    assert!(metric(b.daemon(), "postern_audit_export_failures_total") >= 1.0);
}

/// Events retention removed before the exporter read them are skipped (the next page starts
/// after the gap) and counted; nothing after the gap is lost.
#[test]
fn events_removed_by_retention_before_their_export_are_skipped_and_counted() {
    let home = Home::new();
    home.drill("POST", "RESULT_DELIVERED", None);
    home.drill("GET", "RESULT_DELIVERED", None);
    std::thread::sleep(Duration::from_millis(1100));
    let retention = format!("{TEST_CONFIG}event_retention = \"1s\"\nresult_retention = \"1s\"\n");
    let pruning = Daemon::start(&home, Some(&retention));
    let deadline = Instant::now() + Duration::from_secs(10);
    while crate::support::get_json(&pruning.url("/v1/audit/verify"), &[]).1["from_seq"] != 19 {
        assert!(Instant::now() < deadline, "retention did not run");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(pruning.terminate(), Some(0));
    let receiver = receiver::accepting();
    let with_export = format!("{retention}[audit]\notlp_endpoint = \"{}\"\n", receiver.url);
    let daemon = Daemon::start(&home, Some(&with_export));
    metric_reaches(&daemon, "postern_audit_export_skipped_total", 18.0);
    assert!(receiver.wait(Duration::from_secs(10), |r| r.seqs().first() == Some(&19)));
    let seqs = receiver.seqs();
    let want: Vec<u64> = (19..19 + seqs.len() as u64).collect();
    assert_eq!(seqs, want, "from the first kept event on, each once");
}

/// An event whose stored value no longer decodes (`postern audit verify` names it) would stop
/// the export for good if waited on: it is skipped, counted and logged, and the rest goes.
#[test]
fn an_event_that_does_not_decode_is_skipped_and_the_rest_exported() {
    let home = Home::new();
    home.drill("POST", "RESULT_DELIVERED", None);
    let (db, events) = crate::audit::split_at(&home, 4);
    events.insert(4u64.to_be_bytes(), b"not an event").unwrap();
    db.persist(fjall::PersistMode::SyncAll).unwrap();
    drop((events, db));
    let receiver = receiver::accepting();
    let config = format!(
        "{TEST_CONFIG}[audit]\notlp_endpoint = \"{}\"\n",
        receiver.url
    );
    let daemon = Daemon::start(&home, Some(&config));
    assert!(receiver.wait(Duration::from_secs(10), |r| r.seqs().len() >= 8));
    assert_eq!(receiver.seqs(), [1, 2, 3, 5, 6, 7, 8, 9]);
    assert_eq!(metric(&daemon, "postern_audit_export_skipped_total"), 1.0);
    assert!(
        daemon.stderr().contains("does not decode"),
        "{}",
        daemon.stderr()
    );
}

/// An `https` endpoint: the receiver's certificate is checked against the roots postern
/// trusts (here only the test CA, through `SSL_CERT_FILE`); an untrusted one gets nothing.
#[test]
fn a_tls_receiver_gets_the_events_only_when_its_certificate_is_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let (receiver, ca_file) = receiver::accepting_tls(dir.path());
    let untrusted = setup_trusting(&receiver.url, None);
    untrusted.post(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while untrusted.metric("postern_audit_export_failures_total") < 1.0 {
        assert!(Instant::now() < deadline, "no failure counted");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(receiver.records().is_empty());
    let logged = untrusted.daemon().stderr();
    assert!(logged.contains("certificate"), "{logged}");
    drop(untrusted);
    let trusted = setup_trusting(&receiver.url, Some(&ca_file));
    trusted.post(0);
    trusted.converged(&receiver, Duration::from_secs(20));
    assert_once_in_order(&receiver.seqs());
}
