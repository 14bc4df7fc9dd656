//! Real vendor SDKs as agents (Python openai, anthropic, stripe; Node openai), each in its
//! own process through the real binary, configured only by the environment an agent gets
//! (`HTTPS_PROXY` with `agent:token@`, the CA bundle, the SDK's key variable) and with its
//! default retry settings. The origin counts side effects: a POST that applies increments
//! `effects` before the origin answers (or does not). Scripts: `tests/sdk/agent.py`,
//! `tests/sdk/node/agent.js`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{Daemon, Home, secret_set};
use crate::tls_origin::{Minted, mint};

const VAULT_KEY: &str = "vault-passphrase-for-sdk-tests";
/// The injected secret: the origin sees it, the agent never holds it.
const SECRET: &str = "sk-live-injected-4b7e";
/// Every SDK run is bounded: default retries with short origin answers fit well within it.
const SDK_DEADLINE: Duration = Duration::from_secs(60);

/// What the origin does with a POST that applies (it always applies first).
#[derive(Clone, Copy, Debug)]
enum Act {
    /// Answers 200 with the created object.
    Answer,
    /// Closes the connection without a response: the answer is lost.
    Close,
    /// Answers a complete 500 (the application acted, then failed).
    Fail500,
    /// Answers 200 after this long (longer than the SDK waits).
    Slow(Duration),
    /// Streams a chat completion (SSE): one event, then nothing for this long (longer than
    /// the SDK waits between reads), then the last event and the stream's end.
    StreamStall(Duration),
}

/// One request as the origin received it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    /// It applied (a side effect) rather than being replayed for a known key.
    applied: bool,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Ledger {
    seen: Vec<Seen>,
    effects: usize,
    /// An `Idempotency-Key` the origin applied under → the body it answered (or would have).
    replay: HashMap<String, String>,
}

/// A loopback HTTPS origin (HTTP/1.1) for `name`, with its own CA, counting side effects.
struct SideEffects {
    addr: SocketAddr,
    ca_file: PathBuf,
    ledger: Arc<Mutex<Ledger>>,
    _dir: tempfile::TempDir,
}

impl SideEffects {
    fn start(name: &str, act: Act) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let Minted {
            ca_pem,
            leaf,
            leaf_key,
        } = mint(name);
        let ca_file = dir.path().join("upstream-ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();
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
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let shared = ledger.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let (config, ledger) = (config.clone(), shared.clone());
                std::thread::spawn(move || serve_connection(tcp, config, ledger, act));
            }
        });
        Self {
            addr,
            ca_file,
            ledger,
            _dir: dir,
        }
    }

    fn effects(&self) -> usize {
        self.ledger.lock().unwrap().effects
    }

    fn seen(&self) -> Vec<Seen> {
        self.ledger.lock().unwrap().seen.clone()
    }
}

fn serve_connection(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    ledger: Arc<Mutex<Ledger>>,
    act: Act,
) {
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(conn) = rustls::ServerConnection::new(config) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    loop {
        let Some((method, path, headers, _body)) = read_request(&mut tls) else {
            return;
        };
        let (answer, close) = respond(&ledger, act, method, path, headers);
        if let (Act::StreamStall(stall), Some(_)) = (act, &answer) {
            let _ = stream_stalling(&mut tls, stall);
            return;
        }
        if let Some(delay) = close {
            std::thread::sleep(delay);
            if answer.is_none() {
                // Lost answer: a TLS close_notify, then the socket goes.
                tls.conn.send_close_notify();
                let _ = tls.flush();
                let _ = tls.sock.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
        if let Some(bytes) = answer
            && tls.write_all(&bytes).and_then(|_| tls.flush()).is_err()
        {
            return;
        }
    }
}

/// Records the request and decides the answer: `(bytes to send, pause before)`; no bytes
/// means close without a response.
fn respond(
    ledger: &Mutex<Ledger>,
    act: Act,
    method: String,
    path: String,
    headers: Vec<(String, String)>,
) -> (Option<Vec<u8>>, Option<Duration>) {
    let mut l = ledger.lock().unwrap();
    let mut seen = Seen {
        method,
        path,
        headers,
        applied: false,
    };
    let key = seen.header("idempotency-key").map(str::to_owned);
    if seen.method != "POST" {
        l.seen.push(seen);
        return (Some(http_response(200, "{}", &[])), None);
    }
    if let Some(body) = key.as_ref().and_then(|k| l.replay.get(k)).cloned() {
        // A known key: the stored answer, no second effect (what Stripe promises).
        l.seen.push(seen);
        return (
            Some(http_response(200, &body, &["Idempotent-Replayed: true"])),
            None,
        );
    }
    l.effects += 1;
    seen.applied = true;
    let n = l.effects;
    let body = format!(
        r#"{{"id":"obj_{n}","object":"customer","type":"message","role":"assistant","model":"m","content":[],"choices":[],"output":[],"effect":{n}}}"#
    );
    if let Some(k) = key {
        l.replay.insert(k, body.clone());
    }
    l.seen.push(seen);
    match act {
        Act::Answer => (Some(http_response(200, &body, &[])), None),
        Act::Close => (None, Some(Duration::ZERO)),
        Act::Fail500 => (
            Some(http_response(
                500,
                r#"{"error":{"type":"api_error","message":"origin failed after acting"}}"#,
                &[],
            )),
            None,
        ),
        Act::Slow(d) => (Some(http_response(200, &body, &[])), Some(d)),
        Act::StreamStall(_) => (Some(Vec::new()), None),
    }
}

/// A chat completion as SSE: `one `, a stall, `two`, `[DONE]`, the end.
fn stream_stalling(out: &mut impl Write, stall: Duration) -> std::io::Result<()> {
    let event = |content: &str| {
        let data = format!(
            r#"data: {{"id":"chatcmpl-1","object":"chat.completion.chunk","created":0,"model":"m","choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":null}}]}}"#
        );
        let data = format!("{data}\n\n");
        format!("{:x}\r\n{data}\r\n", data.len())
    };
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    out.write_all(format!("{head}{}", event("one ")).as_bytes())?;
    out.flush()?;
    std::thread::sleep(stall);
    let done = "data: [DONE]\n\n";
    let end = format!("{}{:x}\r\n{done}\r\n0\r\n\r\n", event("two"), done.len());
    out.write_all(end.as_bytes())?;
    out.flush()
}

fn http_response(status: u16, body: &str, extra: &[&str]) -> Vec<u8> {
    let reason = if status == 200 { "OK" } else { "Error" };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for h in extra {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

type Request = (String, String, Vec<(String, String)>, Vec<u8>);

/// One HTTP/1.1 request (Content-Length or chunked body), or None at end of stream.
fn read_request(stream: &mut impl Read) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok().filter(|n| *n > 0)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (name, value) = h.split_once(':')?;
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _): &&(String, String)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(n, 0);
        reader.read_exact(&mut body).ok()?;
    }
    // BufReader may hold bytes of a pipelined next request; SDKs do not pipeline.
    Some((method, path, headers, body))
}

/// One vendor SDK as the tests drive it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Sdk {
    OpenAiPython,
    OpenAiNode,
    Anthropic,
    Stripe,
}

impl Sdk {
    fn host(self) -> &'static str {
        match self {
            Sdk::OpenAiPython | Sdk::OpenAiNode => "api.openai.test",
            Sdk::Anthropic => "api.anthropic.test",
            Sdk::Stripe => "api.stripe.test",
        }
    }

    fn credential(self) -> &'static str {
        match self {
            Sdk::OpenAiPython | Sdk::OpenAiNode => "openai",
            Sdk::Anthropic => "anthropic",
            Sdk::Stripe => "stripe",
        }
    }

    fn key_var(self) -> &'static str {
        match self {
            Sdk::OpenAiPython | Sdk::OpenAiNode => "OPENAI_API_KEY",
            Sdk::Anthropic => "ANTHROPIC_API_KEY",
            Sdk::Stripe => "STRIPE_API_KEY",
        }
    }

    fn base_url(self) -> String {
        match self {
            Sdk::OpenAiPython | Sdk::OpenAiNode => format!("https://{}/v1", self.host()),
            Sdk::Anthropic | Sdk::Stripe => format!("https://{}", self.host()),
        }
    }
}

/// A postern with one route for `sdk` to `origin`, and the origin.
struct Setup {
    sdk: Sdk,
    home: Home,
    daemon: Daemon,
    origin: SideEffects,
}

/// `credential`: the route injects the SDK's credential; `extra`: more route keys.
fn setup(sdk: Sdk, act: Act, credential: bool, extra: &str) -> Setup {
    let origin = SideEffects::start(sdk.host(), act);
    let home = Home::new();
    let id = sdk.credential();
    let mut config = String::from(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"agent\"\ntoken = \"tok-0123456789abcdef\"\n",
    );
    if credential {
        assert!(
            secret_set(&home, &format!("{id}-key"), SECRET, Some(VAULT_KEY))
                .status
                .success()
        );
        config.push_str(&format!(
            "[[credentials]]\nid = \"{id}\"\nsecret = \"{id}-key\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\
             [[credentials]]\nid = \"other\"\nsecret = \"{id}-key\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n"
        ));
    }
    config.push_str(&format!(
        "[[routes]]\nid = \"{id}\"\nmatch = {{ host = \"{}\" }}\nresolve = \"{}\"\nupstream_ca = \"{}\"\nresponse_timeout = \"10s\"\n{}{extra}\n",
        sdk.host(),
        origin.addr,
        origin.ca_file.display(),
        if credential {
            format!("credential = \"{id}\"\n")
        } else {
            String::new()
        }
    ));
    let daemon = Daemon::start_with(&home, Some(&config), &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    Setup {
        sdk,
        home,
        daemon,
        origin,
    }
}

/// What one SDK run printed, and how long it took.
struct Run {
    out: Value,
    took: Duration,
}

impl Setup {
    /// Runs the SDK once as the agent with `api_key` and `args` after the base URL.
    fn run(&self, api_key: &str, args: &[&str]) -> Run {
        let proxy = self
            .daemon
            .proxy
            .replace("http://", "http://agent:tok-0123456789abcdef@");
        let bundle = self.home.root().join("certs/bundle.pem");
        let ca = self.home.root().join("certs/ca.pem");
        let sdk_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk");
        let mut cmd = match self.sdk {
            Sdk::OpenAiNode => {
                let mut c = Command::new("node");
                c.current_dir(crate::support::node_sdk_dir("openai"))
                    .arg("agent.js")
                    .arg(self.sdk.base_url());
                c
            }
            sdk => {
                let mut c = Command::new("python3");
                let name = match sdk {
                    Sdk::Anthropic => "anthropic",
                    Sdk::Stripe => "stripe",
                    _ => "openai",
                };
                c.arg(sdk_dir.join("agent.py"))
                    .arg(name)
                    .arg(self.sdk.base_url());
                c
            }
        };
        for var in [
            "NO_PROXY",
            "no_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
            "OPENAI_BASE_URL",
            "OPENAI_ORG_ID",
            "OPENAI_PROJECT_ID",
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_AUTH_TOKEN",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
        ] {
            cmd.env_remove(var);
        }
        // HOME: Stripe keeps a telemetry id under it.
        cmd.args(args)
            .env("HOME", self.home.dir.path())
            .env("HTTPS_PROXY", &proxy)
            .env("https_proxy", &proxy)
            .env("SSL_CERT_FILE", &bundle)
            .env("NODE_EXTRA_CA_CERTS", &ca)
            .env(self.sdk.key_var(), api_key);
        let started = Instant::now();
        let out = run_bounded(cmd, SDK_DEADLINE);
        let took = started.elapsed();
        let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let out_json: Value = serde_json::from_str(line.lines().last().unwrap_or(""))
            .unwrap_or_else(|_| {
                panic!(
                    "{:?} printed no result line: {line}\n{}\npostern: {}",
                    self.sdk,
                    String::from_utf8_lossy(&out.stderr),
                    self.daemon.stderr()
                )
            });
        Run {
            out: out_json,
            took,
        }
    }

    /// The placeholder on a route with the credential, else a key of the agent's own.
    fn api_key(&self, credential: bool) -> String {
        if credential {
            self.placeholder()
        } else {
            "sk-agent-own-key".into()
        }
    }

    fn placeholder(&self) -> String {
        format!("postern:{}", self.sdk.credential())
    }
}

/// Runs `cmd`, killing it after `deadline` (an SDK stuck in its retries fails the test).
fn run_bounded(mut cmd: Command, deadline: Duration) -> std::process::Output {
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the SDK agent");
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "SDK agent ran past {deadline:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_ok(run: &Run, what: &str) {
    assert_eq!(run.out["ok"], Value::Bool(true), "{what}: {}", run.out);
}

const ALL: [Sdk; 4] = [
    Sdk::OpenAiPython,
    Sdk::OpenAiNode,
    Sdk::Anthropic,
    Sdk::Stripe,
];

// --- placeholders -------------------------------------------------------------------------

/// The placeholder is all the agent holds; the origin sees the injected credential.
fn placeholder_reaches_the_origin_with_the_injected_credential(sdk: Sdk) {
    let s = setup(sdk, Act::Answer, true, "");
    let run = s.run(&s.placeholder(), &[]);
    assert_ok(&run, &format!("{sdk:?} with its placeholder"));
    let seen = s.origin.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    assert_eq!(s.origin.effects(), 1);
}

#[test]
fn openai_python_placeholder_gets_the_injected_credential() {
    placeholder_reaches_the_origin_with_the_injected_credential(Sdk::OpenAiPython);
}

#[test]
fn openai_node_placeholder_gets_the_injected_credential() {
    placeholder_reaches_the_origin_with_the_injected_credential(Sdk::OpenAiNode);
}

#[test]
fn anthropic_placeholder_gets_the_injected_credential() {
    placeholder_reaches_the_origin_with_the_injected_credential(Sdk::Anthropic);
}

#[test]
fn stripe_placeholder_gets_the_injected_credential() {
    placeholder_reaches_the_origin_with_the_injected_credential(Sdk::Stripe);
}

/// Another credential's placeholder, or a real-looking key: FORBIDDEN_HEADER, nothing sent,
/// and the SDK does not retry it into the origin.
#[test]
fn a_wrong_placeholder_or_a_real_key_is_forbidden_for_every_sdk() {
    for sdk in ALL {
        let s = setup(sdk, Act::Answer, true, "");
        for key in ["postern:other", "sk-live-looks-real-0123456789"] {
            let run = s.run(key, &[]);
            assert_eq!(
                run.out["ok"],
                Value::Bool(false),
                "{sdk:?} {key}: {}",
                run.out
            );
            assert_eq!(
                run.out["code"], "FORBIDDEN_HEADER",
                "{sdk:?} {key}: {}",
                run.out
            );
        }
        assert!(s.origin.seen().is_empty(), "{sdk:?}: {:?}", s.origin.seen());
    }
}

// --- lost answers, 500s, keys ---------------------------------------------------------------

/// The origin applies and closes without answering: the SDK retries on its own, postern
/// refuses the resend (nothing sent), and the SDK raises with postern's envelope.
fn lost_answer_is_one_effect_and_reconcile(sdk: Sdk, credential: bool) {
    let s = setup(sdk, Act::Close, credential, "");
    let run = s.run(&s.api_key(credential), &[]);
    assert_eq!(run.out["ok"], Value::Bool(false), "{}", run.out);
    assert_eq!(
        s.origin.effects(),
        1,
        "{sdk:?}: {} {:?}",
        run.out,
        s.origin.seen()
    );
    assert_eq!(run.out["retry"], "reconcile", "{sdk:?}: {}", run.out);
    assert!(
        ["REMOTE_OUTCOME_UNKNOWN", "RESEND_REFUSED"]
            .contains(&run.out["code"].as_str().unwrap_or("")),
        "{sdk:?}: {}",
        run.out
    );
    assert!(
        run.out["invocation_id"]
            .as_str()
            .is_some_and(|i| i.starts_with("act_"))
    );
}

#[test]
fn openai_python_lost_answer_is_one_effect_and_reconcile() {
    lost_answer_is_one_effect_and_reconcile(Sdk::OpenAiPython, true);
}

#[test]
fn openai_node_lost_answer_is_one_effect_and_reconcile() {
    lost_answer_is_one_effect_and_reconcile(Sdk::OpenAiNode, true);
}

#[test]
fn anthropic_lost_answer_is_one_effect_and_reconcile() {
    lost_answer_is_one_effect_and_reconcile(Sdk::Anthropic, true);
}

#[test]
fn stripe_lost_answer_without_a_key_contract_is_one_effect_and_reconcile() {
    lost_answer_is_one_effect_and_reconcile(Sdk::Stripe, true);
}

/// A complete 500 after the origin acted: one effect, and what the SDK raises is the
/// origin's 500 (not a postern refusal of its retry).
fn a_500_after_commit_is_one_effect(sdk: Sdk, credential: bool) {
    let s = setup(sdk, Act::Fail500, credential, "");
    let run = s.run(&s.api_key(credential), &[]);
    assert_eq!(run.out["ok"], Value::Bool(false), "{}", run.out);
    assert_eq!(
        s.origin.effects(),
        1,
        "{sdk:?}: {} {:?}",
        run.out,
        s.origin.seen()
    );
    assert_eq!(run.out["status"], 500, "{sdk:?}: {}", run.out);
}

#[test]
fn openai_python_500_after_commit_is_one_effect() {
    a_500_after_commit_is_one_effect(Sdk::OpenAiPython, true);
}

#[test]
fn openai_node_500_after_commit_is_one_effect() {
    a_500_after_commit_is_one_effect(Sdk::OpenAiNode, true);
}

#[test]
fn anthropic_500_after_commit_is_one_effect() {
    a_500_after_commit_is_one_effect(Sdk::Anthropic, true);
}

#[test]
fn stripe_500_after_commit_is_one_effect() {
    a_500_after_commit_is_one_effect(Sdk::Stripe, true);
}

const KEY_CONTRACT: &str = "idempotency = { header = \"Idempotency-Key\", scope = \"customers.create\", retention = \"24h\", safe_margin = \"1h\", generate = false }";
const GENERATING: &str = "idempotency = { header = \"Idempotency-Key\", scope = \"chat\", retention = \"24h\", safe_margin = \"1h\", generate = true }";

/// Stripe's own key on a route with that contract: the origin applies then closes, Stripe
/// retries with the same key, the origin replays: one effect and the SDK succeeds.
fn stripe_own_key_lost_answer(credential: bool) {
    let s = setup(Sdk::Stripe, Act::Close, credential, KEY_CONTRACT);
    let run = s.run(&s.api_key(credential), &[]);
    let seen = s.origin.seen();
    assert_eq!(s.origin.effects(), 1, "{} {seen:?}", run.out);
    assert_ok(&run, "stripe retrying under its own key");
    let keys: Vec<_> = seen.iter().map(|r| r.header("idempotency-key")).collect();
    assert!(
        seen.len() >= 2 && keys.windows(2).all(|w| w[0] == w[1]),
        "{seen:?}"
    );
    assert_eq!(run.out["id"], "obj_1");
}

#[test]
fn stripe_own_idempotency_key_survives_a_lost_answer() {
    stripe_own_key_lost_answer(true);
}

#[test]
fn stripe_own_idempotency_key_survives_a_lost_answer_without_a_credential() {
    stripe_own_key_lost_answer(false);
}

/// OpenAI sends no key of its own; the route generates one: the SDK's retry of the lost
/// answer is a resend that becomes a same-key retry, the origin replays: one effect, success.
fn openai_generated_key_lost_answer(sdk: Sdk, credential: bool) {
    let s = setup(sdk, Act::Close, credential, GENERATING);
    let run = s.run(&s.api_key(credential), &[]);
    let seen = s.origin.seen();
    assert_eq!(s.origin.effects(), 1, "{sdk:?}: {} {seen:?}", run.out);
    assert_ok(&run, &format!("{sdk:?} on a generating route"));
    assert!(seen.iter().all(|r| r.header("idempotency-key").is_some()));
    assert_eq!(run.out["id"], "obj_1");
}

#[test]
fn openai_python_on_a_generating_route_survives_a_lost_answer() {
    openai_generated_key_lost_answer(Sdk::OpenAiPython, true);
}

#[test]
fn openai_node_on_a_generating_route_survives_a_lost_answer() {
    openai_generated_key_lost_answer(Sdk::OpenAiNode, true);
}

// --- timeouts -------------------------------------------------------------------------------

/// The SDK gives up waiting (1 s) before the origin answers (3 s) and retries: one effect;
/// its retries get ATTEMPT_IN_PROGRESS, or, once the first attempt is resolved, its stored
/// result.
fn sdk_timeout_is_one_effect(sdk: Sdk, credential: bool) {
    let s = setup(sdk, Act::Slow(Duration::from_secs(3)), credential, "");
    let run = s.run(&s.api_key(credential), &["--timeout", "1"]);
    // Let the first attempt finish at the origin before counting.
    std::thread::sleep(Duration::from_secs(3).saturating_sub(run.took));
    assert_eq!(
        s.origin.effects(),
        1,
        "{sdk:?}: {} {:?}",
        run.out,
        s.origin.seen()
    );
    let posts = s
        .origin
        .seen()
        .iter()
        .filter(|r| r.method == "POST")
        .count();
    assert_eq!(posts, 1, "{sdk:?}: retries reached the origin");
    if run.out["ok"] != Value::Bool(true) {
        assert_eq!(
            run.out["code"], "ATTEMPT_IN_PROGRESS",
            "{sdk:?}: {}",
            run.out
        );
    } else {
        assert_eq!(run.out["id"], "obj_1", "{}", run.out);
    }
}

#[test]
fn openai_python_timeout_and_retry_is_one_effect() {
    sdk_timeout_is_one_effect(Sdk::OpenAiPython, true);
}

#[test]
fn openai_node_timeout_and_retry_is_one_effect() {
    sdk_timeout_is_one_effect(Sdk::OpenAiNode, true);
}

#[test]
fn stripe_timeout_and_retry_is_one_effect() {
    sdk_timeout_is_one_effect(Sdk::Stripe, true);
}

/// The SDK streams a completion and gives up mid-stream (its read timeout, 1 s, is shorter
/// than the origin's stall): it has not seen the answer, so the record stays
/// `RESULT_DELIVERY_FAILED`, and the same call afterwards is answered from the store (SPEC
/// §3.9): one execution, and the whole answer.
#[test]
fn openai_python_stream_cut_by_its_timeout_is_one_execution_answered_from_the_store() {
    let s = setup(
        Sdk::OpenAiPython,
        Act::StreamStall(Duration::from_secs(2)),
        true,
        "",
    );
    let key = s.api_key(true);
    let first = s.run(&key, &["--stream", "--timeout", "1"]);
    assert_eq!(
        first.out["ok"], false,
        "the SDK must time out mid-stream: {}",
        first.out
    );
    assert_eq!(first.out["text"], "one ", "{}", first.out);
    // The origin finishes the stream; postern commits it, undelivered (polled: a loaded
    // machine may take longer than the stall). CALLER_CANCELLED is what the record says from
    // the moment postern sees the SDK gone until the stream it reads on ends.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let list = loop {
        let (_, list) = crate::support::get_json(&s.daemon.url("/v1/invocations"), &[]);
        let code = &list["invocations"][0]["code"];
        let settled = code.is_string() && code != "CALLER_CANCELLED";
        if settled || std::time::Instant::now() > deadline {
            break list;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let record = &list["invocations"][0];
    assert_eq!(
        (record["code"].as_str(), record["retry"].as_str()),
        (Some("RESULT_DELIVERY_FAILED"), Some("fetch_result")),
        "{record}"
    );
    let again = s.run(&key, &["--stream", "--timeout", "1"]);
    assert_eq!(again.out["ok"], true, "{}", again.out);
    assert_eq!(again.out["text"], "one two", "{}", again.out);
    assert_eq!(again.out["replayed"], "true", "{}", again.out);
    assert_eq!(s.origin.effects(), 1, "{:?}", s.origin.seen());
}

// --- the harness itself, on a route without a credential ------------------------------------

/// Without a credential on the route the SDK's own key is forwarded: this runs every SDK
/// through postern end to end (proxy, CA, base URL), whatever the placeholder feature.
#[test]
fn every_sdk_reaches_the_origin_through_postern() {
    for sdk in ALL {
        let s = setup(sdk, Act::Answer, false, "");
        let run = s.run(&s.api_key(false), &[]);
        assert_ok(&run, &format!("{sdk:?}"));
        let seen = s.origin.seen();
        assert_eq!(seen.len(), 1, "{sdk:?}: {seen:?}");
        assert_eq!(
            seen[0].header("authorization"),
            Some("Bearer sk-agent-own-key")
        );
        assert!(seen[0].path.starts_with(if sdk == Sdk::Stripe {
            "/v1/customers"
        } else {
            "/v1/"
        }));
    }
}

#[test]
fn openai_python_lost_answer_without_a_credential_is_one_effect_and_reconcile() {
    lost_answer_is_one_effect_and_reconcile(Sdk::OpenAiPython, false);
}

#[test]
fn openai_python_on_a_generating_route_without_a_credential_survives_a_lost_answer() {
    openai_generated_key_lost_answer(Sdk::OpenAiPython, false);
}

#[test]
fn openai_python_500_after_commit_without_a_credential_is_one_effect() {
    a_500_after_commit_is_one_effect(Sdk::OpenAiPython, false);
}

#[test]
fn openai_python_timeout_and_retry_without_a_credential_is_one_effect() {
    sdk_timeout_is_one_effect(Sdk::OpenAiPython, false);
}

#[test]
fn stripe_timeout_and_retry_without_a_credential_is_one_effect() {
    sdk_timeout_is_one_effect(Sdk::Stripe, false);
}

/// SPEC §5.8: past a route's `rate_limit` postern answers `429` with `Retry-After`; the
/// openai SDK waits that long by itself and its retry gets through (not sent twice).
#[test]
fn openai_python_waits_out_a_rate_limit_and_gets_through() {
    let s = setup(
        Sdk::OpenAiPython,
        Act::Answer,
        true,
        "rate_limit = \"1/s\"\n",
    );
    // Both calls from one process, back to back: the second meets the limit however
    // slowly a loaded machine starts Python.
    let both = s.run(&s.placeholder(), &["--calls", "2"]);
    assert_ok(&both, "the second call, after its own wait");
    assert_eq!(s.origin.effects(), 2, "each call applied once");
    assert_eq!(
        s.origin.seen().len(),
        2,
        "the refused try never reached the origin"
    );
    let refused = s.daemon.cli(&["actions", "list", "--json"], &[]);
    let text = String::from_utf8_lossy(&refused.stdout);
    assert!(
        text.contains("RATE_LIMITED"),
        "the refusal is journaled: {text}"
    );
}
