//! gRPC through postern (SPEC §3.2): a real grpcio client that knows only `https_proxy` and
//! postern's CA (`grpc/agent.py`), against a real grpcio server over TLS on loopback
//! (`grpc/origin.py`), and a hyper h2 origin that ends a call without `grpc-status`.
//! `tests/run` installs grpcio for python3.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;

use crate::support::{Daemon, Home, get_json, secret_set};
use crate::tls_origin::{self, Minted};

const VAULT_KEY: &str = "vault-passphrase-for-grpc-tests";
const SECRET: &str = "grpc-canary-7d41e0-secret";
const AGENT: &str = "ci:agent-token-for-grpc-0123";
const HOST: &str = "grpc.test";

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it/grpc")
        .join(name)
}

/// A child process killed when the test ends.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The grpcio origin (`grpc/origin.py`) serving TLS for `grpc.test`; its CA in `ca_file`.
struct GrpcOrigin {
    port: u16,
    ca_file: PathBuf,
    _peer: Peer,
    _dir: tempfile::TempDir,
}

fn grpcio_origin() -> GrpcOrigin {
    let dir = tempfile::tempdir().unwrap();
    let Minted {
        ca_pem,
        leaf,
        leaf_key,
    } = tls_origin::mint(HOST);
    let (cert, key, ca_file) = (
        dir.path().join("leaf.pem"),
        dir.path().join("leaf.key"),
        dir.path().join("ca.pem"),
    );
    std::fs::write(&cert, leaf.pem()).unwrap();
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
    std::fs::write(&ca_file, ca_pem).unwrap();
    let mut child = Command::new("python3")
        .arg(script("origin.py"))
        .args([&cert, &key])
        .arg(format!("Bearer {SECRET}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 with grpcio must be installed (tests/run installs it)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("origin.py did not start (is grpcio installed?): {line:?}"));
    GrpcOrigin {
        port,
        ca_file,
        _peer: Peer(child),
        _dir: dir,
    }
}

/// postern with one credentialed route to `grpc.test:<port>` (pinned to loopback).
struct Setup {
    daemon: Daemon,
    home: Home,
    port: u16,
    config: String,
}

fn postern(port: u16, ca_file: &Path, delivery: &str) -> Setup {
    postern_with(port, ca_file, delivery, &[])
}

fn postern_with(port: u16, ca_file: &Path, delivery: &str, envs: &[(&str, &str)]) -> Setup {
    let home = Home::new();
    assert!(
        secret_set(&home, "svc", SECRET, Some(VAULT_KEY))
            .status
            .success()
    );
    let (id, token) = AGENT.split_once(':').unwrap();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"{id}\"\ntoken = \"{token}\"\n\
         [[credentials]]\nid = \"svc\"\nsecret = \"svc\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\
         [[routes]]\nid = \"grpc\"\ncredential = \"svc\"\ndelivery = \"{delivery}\"\n\
         match = {{ host = \"{HOST}\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\nupstream_ca = \"{}\"\n",
        ca_file.display()
    );
    let mut envs = envs.to_vec();
    envs.push(("POSTERN_VAULT_KEY", VAULT_KEY));
    let daemon = Daemon::start_with(&home, Some(&config), &envs);
    Setup {
        daemon,
        home,
        port,
        config,
    }
}

impl Setup {
    /// One call by `grpc/agent.py`, which gets only `https_proxy` and postern's CA.
    fn call(&self, method: &str, request: &str, streaming: bool) -> Value {
        let proxy = self
            .daemon
            .proxy
            .replace("http://", &format!("http://{AGENT}@"));
        let ca = self.home.root().join("certs/ca.pem");
        let mut cmd = Command::new("python3");
        cmd.arg(script("agent.py"))
            .arg(format!("{HOST}:{}", self.port))
            .arg(method)
            .arg(request);
        if streaming {
            cmd.arg("stream");
        }
        let out = cmd
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", std::env::var("HOME").unwrap_or_default())
            .env("https_proxy", proxy)
            .env("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", ca)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).unwrap_or_else(|_| {
            panic!(
                "agent.py printed no result: {text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// The record of the invocation the call's initial metadata names.
    fn record(&self, call: &Value) -> Value {
        let id = call["initial"]["postern-invocation"]
            .as_str()
            .unwrap_or_else(|| panic!("no postern-invocation in the initial metadata: {call}"));
        let (status, record) = get_json(&self.daemon.url(&format!("/v1/invocations/{id}")), &[]);
        assert_eq!(status, 200, "{record}");
        record
    }

    fn stored(&self, record: &Value) -> Value {
        let id = record["invocation_id"].as_str().unwrap();
        let url = self.daemon.url(&format!("/v1/invocations/{id}/result"));
        get_json(&url, &[]).1
    }

    /// The newest invocation (for a call whose metadata never arrived).
    fn newest(&self) -> Value {
        let (_, list) = get_json(&self.daemon.url("/v1/invocations?limit=1"), &[]);
        list["invocations"][0].clone()
    }
}

fn outcome_trailer(call: &Value) -> &str {
    call["trailing"]["postern-outcome"].as_str().unwrap_or("")
}

#[test]
fn a_unary_call_carries_the_credential_and_the_origins_trailers_reach_the_agent() {
    let origin = grpcio_origin();
    let s = postern(origin.port, &origin.ca_file, "auto");
    let call = s.call("/t.Svc/Unary", "hi", false);
    assert_eq!(call["code"], "OK", "the origin saw its credential: {call}");
    assert_eq!(call["messages"][0], "echo:hi");
    assert_eq!(call["trailing"]["x-origin"], "trailers", "{call}");
    assert_eq!(
        outcome_trailer(&call),
        "outcome=committed, phase=remote_execution, retry=never"
    );
    let r = s.record(&call);
    assert_eq!(
        (&r["outcome"], &r["retry"]),
        (&"committed".into(), &"never".into())
    );
    assert_eq!(r["result"]["status"], 200);
    assert_eq!(r["result"]["grpc_status"], 0, "{r}");
    assert_eq!(r["evidence"]["completion"], "grpc_status");
    let stored = s.stored(&r);
    assert_eq!(stored["grpc_status"], 0, "{stored}");
    let trailers = stored["trailers"].to_string();
    assert!(trailers.contains("x-origin"), "{stored}");
    // The h2 connection went back to the pool when the call's head came.
    let again = s.record(&s.call("/t.Svc/Unary", "again", false));
    assert_eq!(again["evidence"]["reused_connection"], true, "{again}");
}

#[test]
fn a_secret_echoed_in_a_message_and_a_trailer_is_redacted_for_the_agent() {
    let origin = grpcio_origin();
    let s = postern(origin.port, &origin.ca_file, "auto");
    let call = s.call("/t.Svc/Echo", "x", false);
    assert_eq!(call["code"], "OK", "{call}");
    // Masked to its length: the message's length prefix stays true.
    let masked = format!("you sent Bearer {}", "*".repeat(SECRET.len()));
    assert_eq!(call["messages"][0], masked.as_str());
    assert_eq!(call["trailing"]["x-echo"], "Bearer [postern:redacted]");
    let r = s.record(&call);
    assert_eq!(r["evidence"]["redactions"], 2, "{r}");
    let stored = s.stored(&r).to_string();
    assert!(!stored.contains(SECRET), "{stored}");
    assert!(!call.to_string().contains(SECRET), "{call}");
}

#[test]
fn permission_denied_reaches_the_agent_as_sent_and_is_rejected() {
    let origin = grpcio_origin();
    let s = postern(origin.port, &origin.ca_file, "auto");
    let call = s.call("/t.Svc/Deny", "x", false);
    assert_eq!(call["code"], "PERMISSION_DENIED", "{call}");
    assert_eq!(
        call["details"], "not for Bearer [postern:redacted]",
        "grpc-message through the guard"
    );
    assert_eq!(
        outcome_trailer(&call),
        "outcome=rejected, phase=remote_execution, retry=after_correction"
    );
    let r = s.record(&call);
    assert_eq!(r["outcome"], "rejected", "{r}");
    assert_eq!(r["retry"], "after_correction");
    assert_eq!(r["result"]["grpc_status"], 7);
    assert_eq!(r["evidence"]["completion"], "grpc_status");
}

#[test]
fn unavailable_and_internal_are_committed() {
    let origin = grpcio_origin();
    let s = postern(origin.port, &origin.ca_file, "auto");
    for (name, number) in [("UNAVAILABLE", 14), ("INTERNAL", 13)] {
        let call = s.call("/t.Svc/Fail", name, false);
        assert_eq!(call["code"], name, "{call}");
        assert_eq!(call["details"], "failed on purpose");
        let r = s.record(&call);
        assert_eq!(
            (&r["outcome"], &r["retry"]),
            (&"committed".into(), &"never".into()),
            "{r}"
        );
        assert_eq!(r["result"]["grpc_status"], number);
    }
}

#[test]
fn server_streaming_messages_reach_the_agent_as_they_come() {
    let origin = grpcio_origin();
    let s = postern(origin.port, &origin.ca_file, "auto");
    // The origin sends 4 messages 400 ms apart.
    let call = s.call("/t.Svc/Stream", "4", true);
    assert_eq!(call["code"], "OK", "{call}");
    let messages: Vec<&str> = call["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(messages, ["tick 0", "tick 1", "tick 2", "tick 3"]);
    let at: Vec<i64> = call["arrivals_ms"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    // 1.2 s from the first to the last at the origin; buffered, they would come at once.
    assert!(at[3] - at[0] >= 800, "each as it came, not at once: {at:?}");
    assert_eq!(call["initial"]["postern-delivery"], "streamed");
    let r = s.record(&call);
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["result"]["grpc_status"], 0);
}

#[test]
fn buffered_delivery_relays_trailers_and_trailers_only_statuses() {
    let origin = grpcio_origin();
    let s = postern(origin.port, &origin.ca_file, "buffer");
    let call = s.call("/t.Svc/Unary", "hi", false);
    assert_eq!(call["code"], "OK", "{call}");
    assert_eq!(call["trailing"]["x-origin"], "trailers", "{call}");
    assert!(
        call["initial"].get("postern-delivery").is_none(),
        "buffered: {call}"
    );
    assert_eq!(
        outcome_trailer(&call),
        "outcome=committed, phase=remote_execution, retry=never"
    );
    // grpcio answers an abort trailers-only: the status in the head.
    let call = s.call("/t.Svc/Deny", "x", false);
    assert_eq!(call["code"], "PERMISSION_DENIED", "{call}");
    assert_eq!(call["details"], "not for Bearer [postern:redacted]");
    let r = s.record(&call);
    assert_eq!(
        (&r["outcome"], &r["result"]["grpc_status"]),
        (&"rejected".into(), &7.into())
    );
    let call = s.call("/t.Svc/Echo", "x", false);
    let masked = format!("you sent Bearer {}", "*".repeat(SECRET.len()));
    assert_eq!(call["messages"][0], masked.as_str(), "{call}");
    assert_eq!(call["trailing"]["x-echo"], "Bearer [postern:redacted]");
}

#[test]
fn the_calls_end_waits_until_result_committed_is_durable() {
    let origin = grpcio_origin();
    // postern dies right after RESULT_COMMITTED is durable: an end sent before it would
    // have reached the agent.
    let crash = [("POSTERN_CRASH_AFTER", "RESULT_COMMITTED")];
    let mut s = postern_with(origin.port, &origin.ca_file, "auto", &crash);
    let call = s.call("/t.Svc/Stream", "2", true);
    assert_ne!(call["code"], "OK", "no clean end before the commit: {call}");
    assert!(
        s.daemon
            .wait_exit(std::time::Duration::from_secs(20))
            .is_some(),
        "the failpoint aborts serve"
    );
    let daemon = Daemon::start(&s.home, Some(&s.config));
    let (_, list) = get_json(&daemon.url("/v1/invocations?limit=1"), &[]);
    let r = &list["invocations"][0];
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["code"], "RESULT_DELIVERY_FAILED", "{r}");
    assert_eq!(r["retry"], "fetch_result");
    assert_eq!(r["result"]["grpc_status"], 0);
    s.daemon = daemon;
}

/// An h2 origin for `grpc.test` that answers every call `200 application/grpc` as its
/// `Script` says.
struct Scripted {
    port: u16,
    ca_file: PathBuf,
    _dir: tempfile::TempDir,
}

/// What a scripted origin does wrong.
#[derive(Clone, Copy)]
enum Script {
    /// One message, then the end: no trailers.
    EndsWithoutTrailers,
    /// One message, then trailers without `grpc-status`.
    TrailersWithoutStatus,
    /// One message, then `grpc-status: 0` and `grpc-status: 13` in the same trailers.
    TwoStatuses,
    /// `grpc-encoding: <coding>` and one message flagged compressed that no decoder of that
    /// coding reads (the secret in the clear inside), then `grpc-status: 0`.
    Undecodable(&'static str),
}

impl Script {
    fn answer(self) -> Response<Frames> {
        let message = match self {
            Self::Undecodable(_) => {
                let inside = format!("plain {SECRET}");
                let mut m = vec![1];
                m.extend_from_slice(&(inside.len() as u32).to_be_bytes());
                m.extend_from_slice(inside.as_bytes());
                Bytes::from(m)
            }
            _ => Bytes::from_static(b"\x00\x00\x00\x00\x04half"),
        };
        let mut frames = VecDeque::from([Frame::data(message)]);
        let mut trailers = hyper::HeaderMap::new();
        match self {
            Self::EndsWithoutTrailers => {}
            Self::TrailersWithoutStatus => {
                trailers.insert("x-not-a-status", "1".parse().unwrap());
            }
            Self::TwoStatuses => {
                trailers.append("grpc-status", "0".parse().unwrap());
                trailers.append("grpc-status", "13".parse().unwrap());
            }
            Self::Undecodable(_) => {
                trailers.insert("grpc-status", "0".parse().unwrap());
            }
        }
        if !trailers.is_empty() {
            frames.push_back(Frame::trailers(trailers));
        }
        let mut resp = Response::new(Frames(frames));
        let h = resp.headers_mut();
        h.insert("content-type", "application/grpc".parse().unwrap());
        if let Self::Undecodable(coding) = self {
            h.insert("grpc-encoding", coding.parse().unwrap());
        }
        resp
    }
}

/// Frames handed out one by one.
struct Frames(VecDeque<Frame<Bytes>>);

impl hyper::body::Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

fn scripted_origin(script: Script) -> Scripted {
    let dir = tempfile::tempdir().unwrap();
    let (acceptor, ca_file) = tls_origin::acceptor(HOST, &[b"h2"], dir.path());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service =
                        hyper::service::service_fn(move |req: Request<Incoming>| async move {
                            let _ = req.into_body().collect().await;
                            Ok::<_, std::convert::Infallible>(script.answer())
                        });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
    });
    Scripted {
        port,
        ca_file,
        _dir: dir,
    }
}

#[test]
fn a_call_that_ends_without_grpc_status_is_incomplete() {
    use Script::{EndsWithoutTrailers, TrailersWithoutStatus};
    for (delivery, script) in [
        ("auto", EndsWithoutTrailers),
        ("auto", TrailersWithoutStatus),
        ("buffer", EndsWithoutTrailers),
    ] {
        let origin = scripted_origin(script);
        let s = postern(origin.port, &origin.ca_file, delivery);
        let call = s.call("/t.Svc/Unary", "hi", false);
        let cell = format!(
            "delivery {delivery}, trailers {}",
            !matches!(script, EndsWithoutTrailers)
        );
        assert_ne!(call["code"], "OK", "{cell}: never a clean end: {call}");
        let r = s.newest();
        assert_eq!(r["code"], "REMOTE_RESULT_INCOMPLETE", "{cell}: {r}");
        assert_eq!(r["outcome"], "unknown", "{cell}");
        assert_eq!(r["phase"], "remote_execution", "{cell}");
        assert!(r["result"].is_null(), "{cell}: {r}");
    }
}

/// The client fails a call whose trailers carry two statuses; the record must not claim
/// either one.
#[test]
fn two_grpc_statuses_leave_the_call_incomplete() {
    for delivery in ["auto", "buffer"] {
        let origin = scripted_origin(Script::TwoStatuses);
        let s = postern(origin.port, &origin.ca_file, delivery);
        let call = s.call("/t.Svc/Unary", "hi", false);
        assert_ne!(call["code"], "OK", "{delivery}: {call}");
        let r = s.newest();
        assert_eq!(r["code"], "REMOTE_RESULT_INCOMPLETE", "{delivery}: {r}");
        assert_eq!(r["outcome"], "unknown", "{delivery}");
        assert!(r["result"].is_null(), "{delivery}: {r}");
    }
}

/// The origin compresses whatever the call's grpc-accept-encoding said: postern decodes
/// each message, masks the secret and hands it on uncompressed.
#[test]
fn a_compressed_message_is_decoded_and_masked_before_the_agent_gets_it() {
    let origin = grpcio_origin();
    let masked = format!("you sent Bearer {}", "*".repeat(SECRET.len())).repeat(8);
    for delivery in ["auto", "buffer"] {
        let s = postern(origin.port, &origin.ca_file, delivery);
        for method in ["/t.Svc/EchoGzip", "/t.Svc/EchoDeflate"] {
            let cell = format!("{delivery} {method}");
            let call = s.call(method, "x", false);
            assert_eq!(call["code"], "OK", "{cell}: {call}");
            assert_eq!(call["messages"][0], masked.as_str(), "{cell}: {call}");
            assert_eq!(call["trailing"]["x-echo"], "Bearer [postern:redacted]");
            assert!(!call.to_string().contains(SECRET), "{cell}: {call}");
            let r = s.record(&call);
            assert_eq!(r["evidence"]["redactions"], 9, "{cell}: {r}");
            assert_eq!(r["result"]["grpc_status"], 0, "{cell}: {r}");
            let stored = s.stored(&r).to_string();
            assert!(!stored.contains(SECRET), "{cell}: {stored}");
        }
    }
}

#[test]
fn server_streamed_compressed_messages_are_each_decoded_and_masked() {
    let origin = grpcio_origin();
    let s = postern(origin.port, &origin.ca_file, "auto");
    let call = s.call("/t.Svc/StreamGzip", "3", true);
    assert_eq!(call["code"], "OK", "{call}");
    let stars = "*".repeat(SECRET.len());
    for n in 0..3 {
        let want = format!("{n} you sent Bearer {stars}\n").repeat(8);
        assert_eq!(call["messages"][n], want.as_str(), "{call}");
    }
    assert!(!call.to_string().contains(SECRET), "{call}");
    assert_eq!(s.record(&call)["evidence"]["redactions"], 24);
}

/// A message postern cannot decode (a coding it does not know, or corrupt data) is never
/// relayed: the call fails with postern's status, and the record keeps the origin's.
#[test]
fn a_compressed_message_postern_cannot_decode_fails_the_call() {
    for (coding, reason) in [("snappy", "unsupported_coding"), ("gzip", "decode_error")] {
        let origin = scripted_origin(Script::Undecodable(coding));
        for delivery in ["auto", "buffer"] {
            let cell = format!("{coding} {delivery}");
            let s = postern(origin.port, &origin.ca_file, delivery);
            let call = s.call("/t.Svc/Unary", "hi", false);
            assert!(!call.to_string().contains(SECRET), "{cell}: {call}");
            assert_eq!(call["code"], "INTERNAL", "{cell}: {call}");
            let details = call["details"].as_str().unwrap_or("");
            assert!(details.contains(reason), "{cell}: {call}");
            let withheld = format!("withheld; reason={reason}");
            assert_eq!(
                call["trailing"]["postern-body"],
                withheld.as_str(),
                "{cell}"
            );
            assert_eq!(
                outcome_trailer(&call),
                "outcome=committed, phase=remote_execution, retry=never",
                "{cell}"
            );
            let r = s.record(&call);
            assert_eq!(r["outcome"], "committed", "{cell}: {r}");
            assert!(
                r["code"].is_null(),
                "{cell}: postern's answer was delivered: {r}"
            );
            assert_eq!(r["evidence"]["body_withheld"], reason, "{cell}: {r}");
            assert_eq!(r["result"]["grpc_status"], 0, "{cell}: the origin's status");
            let stored = s.stored(&r).to_string();
            assert!(!stored.contains(SECRET), "{cell}: {stored}");
        }
    }
}

/// gRPC binary metadata is base64 on the wire: a masked echo stays valid base64, so the
/// client takes the call as sent.
#[test]
fn binary_metadata_keeps_valid_base64_with_the_secret_masked() {
    let origin = grpcio_origin();
    let stars = "*".repeat(SECRET.len());
    for delivery in ["auto", "buffer"] {
        let s = postern(origin.port, &origin.ca_file, delivery);
        let call = s.call("/t.Svc/EchoBin", "x", false);
        assert_eq!(call["code"], "OK", "{delivery}: {call}");
        let head = format!("head Bearer {stars}");
        assert_eq!(call["initial"]["x-head-bin"], head.as_str(), "{call}");
        let echo = format!("you sent Bearer {stars}");
        assert_eq!(call["trailing"]["x-echo-bin"], echo.as_str(), "{call}");
        // The protobuf inside keeps its length prefix.
        let message = format!("not for Bearer {stars}");
        let details = format!("\u{12}{}{message}", char::from(message.len() as u8));
        assert_eq!(
            call["trailing"]["grpc-status-details-bin"],
            details.as_str(),
            "{call}"
        );
        let r = s.record(&call);
        assert_eq!(r["outcome"], "committed", "{delivery}: {r}");
        assert_eq!(r["evidence"]["redactions"], 3, "{delivery}: {r}");
        assert!(!s.stored(&r).to_string().contains(SECRET));
    }
}
