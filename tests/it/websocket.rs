//! WebSocket through postern (SPEC §3.6), driven by a real client (Python's
//! websocket-client over `CONNECT` + postern's CA) against a loopback TLS WebSocket origin
//! (tungstenite) that records each handshake and can echo the credential it was sent.

use std::process::Command;
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};

use crate::support::{Daemon, Home, get_json, secret_set};
use crate::tls_origin::acceptor;

/// Each handshake's request headers, lower-cased names.
type Handshakes = Arc<Mutex<Vec<Vec<(String, String)>>>>;

const VAULT_KEY: &str = "websocket-vault-key";
const CANARY: &str = "ws-canary-3f9a1c7e5b2d";

/// A TLS WebSocket origin: `/forbidden` refuses the handshake with 403; otherwise each
/// text message is echoed, except `secret?`, answered with the `Authorization` it got.
struct WsOrigin {
    port: u16,
    ca_file: std::path::PathBuf,
    handshakes: Handshakes,
    _dir: tempfile::TempDir,
}

/// `tls`: wss, else plain ws.
fn ws_origin(tls: bool) -> WsOrigin {
    let dir = tempfile::tempdir().unwrap();
    let (acceptor, ca_file) = acceptor("origin.test", &[b"http/1.1"], dir.path());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let handshakes = Arc::new(Mutex::new(Vec::new()));
    let seen = handshakes.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, seen) = (acceptor.clone(), seen.clone());
                tokio::spawn(async move {
                    if !tls {
                        return serve_ws(tcp, seen).await;
                    }
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    serve_ws(tls, seen).await;
                });
            }
        });
    });
    WsOrigin {
        port,
        ca_file,
        handshakes,
        _dir: dir,
    }
}

async fn serve_ws<S>(tls: S, seen: Handshakes)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let auth = Arc::new(Mutex::new(String::new()));
    let a = auth.clone();
    // tungstenite's callback signature returns its large error response as is.
    #[allow(clippy::result_large_err)]
    let callback = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        let headers = req
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect::<Vec<_>>();
        seen.lock().unwrap().push(headers);
        let value = req.headers().get("authorization");
        *a.lock().unwrap() = value.and_then(|v| v.to_str().ok()).unwrap_or("").into();
        if req.uri().path() == "/deflate" {
            // Hostile: compression nobody offered.
            let mut resp = resp;
            let ext = http::HeaderValue::from_static("permessage-deflate");
            resp.headers_mut().insert("sec-websocket-extensions", ext);
            return Ok(resp);
        }
        if req.uri().path() == "/forbidden" {
            // Framed by its length: a close-delimited body could be cut off unseen.
            let mut no = ErrorResponse::new(None);
            *no.status_mut() = http::StatusCode::FORBIDDEN;
            let zero = http::HeaderValue::from_static("0");
            no.headers_mut().insert(http::header::CONTENT_LENGTH, zero);
            return Err(no);
        }
        Ok(resp)
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tls, callback).await else {
        return;
    };
    while let Some(Ok(msg)) = ws.next().await {
        let answer = match msg {
            Message::Text(t) if t.as_str() == "secret?" => {
                Message::text(auth.lock().unwrap().clone())
            }
            Message::Text(t) if t.as_str() == "split?" => {
                let value = auth.lock().unwrap().clone();
                split_frame(ws.get_mut(), value.as_bytes()).await;
                continue;
            }
            Message::Text(t) => Message::Text(t),
            Message::Close(_) => break,
            _ => continue,
        };
        if ws.send(answer).await.is_err() {
            return;
        }
    }
    let _ = ws.close(None).await;
}

/// One text frame holding `payload`, written in two parts with a pause between, so the
/// pause falls inside the secret.
async fn split_frame<S: tokio::io::AsyncWrite + Unpin>(tls: &mut S, payload: &[u8]) {
    use tokio::io::AsyncWriteExt;
    let mut frame = vec![0x81, payload.len() as u8];
    frame.extend_from_slice(payload);
    let (first, second) = frame.split_at(2 + payload.len() / 2);
    let _ = tls.write_all(first).await;
    let _ = tls.flush().await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let _ = tls.write_all(second).await;
    let _ = tls.flush().await;
}

struct Setup {
    home: Home,
    daemon: Daemon,
    origin: WsOrigin,
}

fn setup() -> Setup {
    setup_for(true)
}

/// A route for wss (`tls`) or ws to the origin, injecting the canary.
fn setup_for(tls: bool) -> Setup {
    let origin = ws_origin(tls);
    let port = origin.port;
    let route = match tls {
        true => format!("upstream_ca = \"{}\"\n", origin.ca_file.display()),
        false => "match = { scheme = \"http\", host = \"origin.test\", port = PORT }\n"
            .replace("PORT", &port.to_string()),
    };
    let home = Home::new();
    assert!(
        secret_set(&home, "tok", CANARY, Some(VAULT_KEY))
            .status
            .success()
    );
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"ci\"\ntoken = \"agent-tok-0123456789abcdef\"\n\
         [[credentials]]\nid = \"api\"\nsecret = \"tok\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\
         [[routes]]\nid = \"chat\"\ncredential = \"api\"\nresolve = \"127.0.0.1:{port}\"\n{route}\n"
    );
    let config = match tls {
        true => config.replace(
            "resolve =",
            &format!("match = {{ host = \"origin.test\", port = {port} }}\nresolve ="),
        ),
        false => config,
    };
    let daemon = Daemon::start_with(&home, Some(&config), &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    Setup {
        home,
        daemon,
        origin,
    }
}

/// The client script: connects through postern, sends each message, prints a JSON line
/// per answer, then a line with what ended it.
const CLIENT: &str = r#"
import json, sys, websocket
url, proxy_port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    ws = websocket.create_connection(
        url, http_proxy_host="127.0.0.1", http_proxy_port=proxy_port, proxy_type="http",
        http_proxy_auth=("ci", "agent-tok-0123456789abcdef"), sslopt={"ca_certs": ca},
        header=["Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits"],
        timeout=20)
    for m in sys.argv[4:]:
        ws.send(m)
        print(json.dumps({"got": ws.recv()}), flush=True)
    ws.close()
    print(json.dumps({"end": "closed"}), flush=True)
except websocket.WebSocketBadStatusException as e:
    print(json.dumps({"end": "status", "status": e.status_code}), flush=True)
"#;

impl Setup {
    fn client(&self, path: &str, messages: &[&str]) -> (Vec<Value>, String) {
        self.client_to("wss", path, messages)
    }

    fn client_to(&self, scheme: &str, path: &str, messages: &[&str]) -> (Vec<Value>, String) {
        let url = format!("{scheme}://origin.test:{}{path}", self.origin.port);
        let port = self
            .daemon
            .proxy
            .rsplit(':')
            .next()
            .unwrap_or("0")
            .to_owned();
        let ca = self.home.root().join("certs/ca.pem");
        let out = Command::new("python3")
            .arg("-c")
            .arg(CLIENT)
            .args([&url, &port, ca.to_str().unwrap()])
            .args(messages)
            .output()
            .expect("python3 with websocket-client (tests/run installs python3-websocket)");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let lines = stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (lines, format!("{stdout}{stderr}"))
    }

    fn newest(&self) -> Value {
        newest(&self.daemon)
    }

    fn settled(&self, id: &str) -> (Value, Vec<Value>) {
        settled(&self.daemon, id)
    }
}

fn newest(daemon: &Daemon) -> Value {
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    list["invocations"][0].clone()
}

/// The record once `RESULT_DELIVERED` or a delivery failure settled it.
fn settled(daemon: &Daemon, id: &str) -> (Value, Vec<Value>) {
    for _ in 0..200 {
        let url = daemon.url(&format!("/v1/invocations/{id}/events"));
        let events = get_json(&url, &[]).1["events"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ended = events.iter().any(|e| {
            e["kind"] == "RESULT_DELIVERED" || e["data"]["code"] == "RESULT_DELIVERY_FAILED"
        });
        if ended {
            let url = daemon.url(&format!("/v1/invocations/{id}"));
            return (get_json(&url, &[]).1, events);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the relay of {id} never settled");
}

#[test]
fn a_websocket_is_one_committed_invocation_with_the_credential_injected_and_echoes_masked() {
    let mut s = setup();
    let (lines, said) = s.client("/chat", &["hello", "secret?", "split?", "bye"]);
    assert_eq!(lines.len(), 5, "{said}");
    assert_eq!(lines[0]["got"], "hello", "{said}");
    // The origin echoed the injected value; the agent gets a mask of the same length.
    let injected = format!("Bearer {CANARY}");
    let masked = lines[1]["got"].as_str().unwrap_or_default();
    assert_eq!(masked.len(), injected.len(), "{said}");
    assert!(masked.contains(&"*".repeat(CANARY.len())), "{said}");
    // Paused inside the secret: at most a short prefix went out early, the rest masked.
    let split = lines[2]["got"].as_str().unwrap_or_default();
    assert_eq!(split.len(), injected.len(), "{said}");
    assert!(split.ends_with(&"*".repeat(CANARY.len() - 3)), "{said}");
    assert_eq!(lines[3]["got"], "bye", "{said}");
    assert_eq!(lines[4]["end"], "closed", "{said}");

    let handshakes = s.origin.handshakes.lock().unwrap().clone();
    assert_eq!(handshakes.len(), 1);
    let get = |name: &str| {
        handshakes[0]
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("authorization").as_deref(), Some(injected.as_str()));
    assert_eq!(get("sec-websocket-extensions"), None, "compression offered");
    assert_eq!(get("proxy-authorization"), None);

    let id = s.newest()["invocation_id"].as_str().unwrap().to_owned();
    let (record, events) = s.settled(&id);
    assert_eq!(record["outcome"], "committed", "{record}");
    assert_eq!(record["method"], "GET", "{record}");
    assert_eq!(record["result"]["status"], 101, "{record}");
    let upgrade = &record["evidence"]["upgrade"];
    assert_eq!(upgrade["protocol"], "websocket", "{record}");
    assert!(upgrade["bytes_up"].as_u64().unwrap_or(0) > 0, "{record}");
    assert!(upgrade["bytes_down"].as_u64().unwrap_or(0) > 0, "{record}");
    assert!(upgrade["closed_by"].is_string(), "{record}");
    assert_eq!(upgrade["redactions"], 2, "{record}");
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    let at = |k: &str| kinds.iter().position(|x| *x == k);
    assert!(at("DISPATCH_STARTED") < at("RESULT_COMMITTED"), "{kinds:?}");
    assert!(at("RESULT_COMMITTED") < at("RESULT_DELIVERED"), "{kinds:?}");
    let delivered = events.iter().find(|e| e["kind"] == "RESULT_DELIVERED");
    let delivered = delivered.map(|e| e["data"].clone()).unwrap_or_default();
    assert_eq!(
        delivered["bytes_down"], upgrade["bytes_down"],
        "{delivered}"
    );

    // The secret is nowhere but at the origin.
    let mut all = said.clone() + &s.daemon.stderr() + &record.to_string();
    all += &serde_json::to_string(&events).unwrap_or_default();
    all += &crate::support::stored_text(&mut s.daemon);
    assert!(!all.contains(CANARY), "the secret leaked");
}

#[test]
fn a_refused_handshake_is_an_ordinary_response_and_no_relay() {
    let s = setup();
    let (lines, said) = s.client("/forbidden", &["hello"]);
    let record = s.newest();
    let status = lines.first().map(|l| l["status"].clone());
    assert_eq!(status, Some(403.into()), "{said}\n{record}");
    assert_eq!(record["outcome"], "rejected", "{record}");
    assert_eq!(record["result"]["status"], 403, "{record}");
    assert!(record["evidence"]["upgrade"].is_null(), "{record}");
}

/// websocket-client tunnels `ws://` through `CONNECT` too: plain HTTP inside it is read like
/// an `http://` request on the route.
#[test]
fn a_plain_ws_client_tunnelling_through_connect_is_served_on_the_http_route() {
    let s = setup_for(false);
    let (lines, said) = s.client_to("ws", "/chat", &["hello", "secret?"]);
    assert_eq!(lines.len(), 3, "{said}");
    assert_eq!(lines[0]["got"], "hello", "{said}");
    let masked = lines[1]["got"].as_str().unwrap_or_default();
    assert_eq!(masked.len(), format!("Bearer {CANARY}").len(), "{said}");
    assert!(!said.contains(CANARY), "{said}");
    let id = s.newest()["invocation_id"].as_str().unwrap().to_owned();
    let (record, _) = s.settled(&id);
    assert_eq!(record["protocol"], "http", "{record}");
    assert_eq!(record["outcome"], "committed", "{record}");
    assert_eq!(
        record["evidence"]["upgrade"]["protocol"], "websocket",
        "{record}"
    );
}

/// An origin that switches with compression nobody offered could hide the secret in
/// compressed frames: the handshake is committed (the origin did switch), nothing relayed.
#[test]
fn an_origin_forcing_an_extension_gets_no_relay() {
    let s = setup();
    let (lines, said) = s.client("/deflate", &["secret?"]);
    let status = lines.first().map(|l| l["status"].clone());
    assert!(
        status.is_some_and(|s| s.as_u64().is_some_and(|n| n >= 500)),
        "{said}"
    );
    let record = s.newest();
    assert_eq!(record["outcome"], "committed", "{record}");
    assert_eq!(record["code"], "RESULT_DELIVERY_FAILED", "{record}");
    assert_eq!(record["evidence"]["extension_forced"], true, "{record}");
    assert!(!said.contains(CANARY), "{said}");
}

/// A hostile plain-TCP WebSocket origin: it answers any handshake with a `101` by hand and
/// then writes the frames `script` builds for the request path from the canary it was sent
/// (the `Authorization` value without `Bearer `), then ends its side and waits for postern's.
fn raw_origin(script: fn(&str, &[u8]) -> Vec<u8>) -> u16 {
    upgrading_origin(script, true)
}

/// `raw_origin`, ending its side after the script only where `ends`.
fn upgrading_origin(script: fn(&str, &[u8]) -> Vec<u8>, ends: bool) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(mut tcp) = tcp else { return };
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let head = crate::support::read_head(&mut tcp);
                let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                let canary = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("authorization")
                            .then(|| v.trim().to_owned())
                    })
                    .unwrap_or_default();
                let canary = canary.trim_start_matches("Bearer ").to_owned();
                let switched = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                                Connection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n";
                let _ = tcp.write_all(switched.as_bytes());
                let _ = tcp.write_all(&script(&path, canary.as_bytes()));
                if ends {
                    let _ = tcp.shutdown(std::net::Shutdown::Write);
                }
                let _ = tcp.read_to_end(&mut Vec::new());
            });
        }
    });
    port
}

/// One unmasked frame: `first` is FIN/RSV/opcode, lengths encoded minimally.
fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![first];
    match payload.len() {
        n @ 0..=125 => f.push(n as u8),
        n @ 126..=0xFFFF => {
            f.push(126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(payload);
    f
}

const TEXT_FIN: u8 = 0x81;
const TEXT_MORE: u8 = 0x01;
const CONT_MORE: u8 = 0x00;
const CONT_FIN: u8 = 0x80;
const CLOSE_1002: &[u8] = &[0x88, 0x02, 0x03, 0xEA];

/// `key=<canary> end` as one text message in fragments, each cut inside the canary at `cuts`.
fn fragmented(canary: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut payload = b"key=".to_vec();
    payload.extend_from_slice(canary);
    payload.extend_from_slice(b" end");
    let mut bounds = vec![0];
    bounds.extend(cuts.iter().map(|c| 4 + c));
    bounds.push(payload.len());
    let mut out = Vec::new();
    for (i, w) in bounds.windows(2).enumerate() {
        let (first, last) = (i == 0, i + 2 == bounds.len());
        let op = match (first, last) {
            (true, _) => TEXT_MORE,
            (false, false) => CONT_MORE,
            (false, true) => CONT_FIN,
        };
        out.extend(frame(op, &payload[w[0]..w[1]]));
    }
    out
}

/// What the hostile origin sends, per path, around the canary.
fn hostile_script(path: &str, canary: &[u8]) -> Vec<u8> {
    let hello = frame(TEXT_FIN, b"hello");
    let mut out = hello.clone();
    match path {
        // Messages without a secret (one fragmented around a ping, a 200-byte binary),
        // then the canary in two fragments, then a normal close.
        "/split2" => {
            out.extend(frame(TEXT_MORE, b"frag"));
            out.extend(frame(0x89, b"are you there"));
            out.extend(frame(CONT_FIN, b"ment"));
            out.extend(frame(0x82, &[7u8; 200]));
            out.extend(fragmented(canary, &[8]));
            out.extend(frame(0x88, &[0x03, 0xE8]));
        }
        "/split3" => out.extend(fragmented(canary, &[5, 14])),
        "/masked" => {
            let key = [0x11, 0x22, 0x33, 0x44];
            let mut f = vec![TEXT_FIN, 0x80 | canary.len() as u8];
            f.extend_from_slice(&key);
            f.extend(canary.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
            out.extend(f);
        }
        "/rsv1" => out.extend(frame(0xC1, canary)),
        "/bigping" => {
            let mut payload = canary.to_vec();
            payload.resize(126, b'.');
            out.extend(frame(0x89, &payload));
        }
        _ => {}
    }
    out.extend(frame(TEXT_FIN, b"after"));
    out
}

/// A ws route to the raw origin on `port`.
fn setup_raw(port: u16) -> (Home, Daemon) {
    setup_raw_with(port, "")
}

/// `setup_raw` with more `[proxy]` keys.
fn setup_raw_with(port: u16, proxy: &str) -> (Home, Daemon) {
    setup_raw_wrapped(port, proxy, &[])
}

/// `setup_raw_with`, the daemon started inside `wrapper`.
fn setup_raw_wrapped(port: u16, proxy: &str, wrapper: &[&str]) -> (Home, Daemon) {
    let home = Home::new();
    assert!(
        secret_set(&home, "tok", CANARY, Some(VAULT_KEY))
            .status
            .success()
    );
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n{proxy}\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"ci\"\ntoken = \"agent-tok-0123456789abcdef\"\n\
         [[credentials]]\nid = \"api\"\nsecret = \"tok\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\
         [[routes]]\nid = \"chat\"\ncredential = \"api\"\nresolve = \"127.0.0.1:{port}\"\n\
         match = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\n"
    );
    let env = [("POSTERN_VAULT_KEY", VAULT_KEY)];
    let daemon = Daemon::start_wrapped(&home, Some(&config), &env, wrapper);
    (home, daemon)
}

/// A raw agent: `CONNECT`, the handshake for `path`, then every byte postern sends until it
/// ends the connection.
fn raw_agent(daemon: &Daemon, port: u16, path: &str) -> Vec<u8> {
    use std::io::Read;
    let mut tcp = open_relay(daemon, port, path);
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let _ = tcp.read_to_end(&mut got);
    got
}

/// A raw agent's connection once postern relayed the origin's `101` for `path`.
fn open_relay(daemon: &Daemon, port: u16, path: &str) -> std::net::TcpStream {
    match try_relay(daemon, port, path) {
        Ok(tcp) => tcp,
        Err(head) => panic!("no relay: {head}"),
    }
}

/// `open_relay`, or the answer that refused it.
fn try_relay(daemon: &Daemon, port: u16, path: &str) -> Result<std::net::TcpStream, String> {
    use std::io::Write;
    let addr = daemon.proxy.trim_start_matches("http://");
    let mut tcp = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let target = format!("origin.test:{port}");
    // Y2k6YWdlbnQtdG9rLTAxMjM0NTY3ODlhYmNkZWY= = base64("ci:agent-tok-0123456789abcdef")
    let connect = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic Y2k6YWdlbnQtdG9rLTAxMjM0NTY3ODlhYmNkZWY=\r\n\r\n"
    );
    let get = format!(
        "GET {path} HTTP/1.1\r\nHost: {target}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    for (ask, want) in [(connect, "HTTP/1.1 200"), (get, "HTTP/1.1 101")] {
        tcp.write_all(ask.as_bytes()).map_err(|e| e.to_string())?;
        let head = crate::support::read_head(&mut tcp);
        if !head.starts_with(want) {
            return Err(head);
        }
    }
    Ok(tcp)
}

/// The raw agent's bytes for `path` and the settled record.
fn through_hostile(path: &str) -> (Vec<u8>, Value, String) {
    let port = raw_origin(hostile_script);
    let (_home, mut daemon) = setup_raw(port);
    let got = raw_agent(&daemon, port, path);
    let id = newest(&daemon)["invocation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (record, events) = settled(&daemon, &id);
    let mut all = daemon.stderr() + &record.to_string();
    all += &serde_json::to_string(&events).unwrap_or_default();
    all += &crate::support::stored_text(&mut daemon);
    (got, record, all)
}

fn stars(canary: &str) -> Vec<u8> {
    vec![b'*'; canary.len()]
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The origin splits the echoed secret across two fragments of one message (with a ping
/// between other fragments): the agent gets every frame byte for byte, the secret as `*`s.
#[test]
fn a_secret_split_across_two_fragments_is_masked_and_other_frames_arrive_intact() {
    let (record, all) = masked_through("/split2");
    assert_eq!(record["outcome"], "committed", "{record}");
    assert_eq!(record["evidence"]["upgrade"]["redactions"], 1, "{record}");
    assert!(record["evidence"]["upgrade"]["protocol_error"].is_null());
    assert!(!all.contains(CANARY), "the secret leaked");
}

#[test]
fn a_secret_split_across_three_fragments_is_masked() {
    masked_through("/split3");
}

/// The agent's bytes for `path` are the script's with the secret as `*`s; the record and
/// everything postern wrote, for more checks.
fn masked_through(path: &str) -> (Value, String) {
    let (got, record, all) = through_hostile(path);
    let want = hostile_script(path, &stars(CANARY));
    assert!(
        !contains(&got, CANARY.as_bytes()),
        "the secret reached the agent"
    );
    assert_eq!(got, want, "{}", String::from_utf8_lossy(&got));
    (record, all)
}

/// A frame the origin may not send: what came before it arrives, then a close `1002`, and
/// nothing of it or after it.
fn refused(path: &str, reason: &str) {
    let (got, record, all) = through_hostile(path);
    assert!(!all.contains(CANARY), "the secret leaked");
    assert!(all.contains("RESULT_DELIVERED"), "{all}");
    let mut want = frame(TEXT_FIN, b"hello");
    want.extend_from_slice(CLOSE_1002);
    assert_eq!(got, want, "{path}: {}", String::from_utf8_lossy(&got));
    let upgrade = &record["evidence"]["upgrade"];
    assert_eq!(upgrade["protocol_error"], reason, "{record}");
    assert_eq!(upgrade["closed_by"], "postern", "{record}");
    assert_eq!(record["outcome"], "committed", "{record}");
}

#[test]
fn a_masked_frame_from_the_origin_ends_the_relay_with_1002() {
    refused("/masked", "masked");
}

#[test]
fn a_frame_with_rsv1_from_the_origin_ends_the_relay_with_1002() {
    refused("/rsv1", "reserved_bit");
}

#[test]
fn a_control_frame_over_125_bytes_ends_the_relay_with_1002() {
    refused("/bigping", "control_too_long");
}

/// An origin that answers every handshake with a `101` and then holds the relay open.
fn holding_origin() -> u16 {
    upgrading_origin(|_, _| Vec::new(), false)
}

fn gauge(daemon: &Daemon, name: &str) -> Option<u64> {
    let (_, text, _) = crate::support::curl(&[&daemon.url("/metrics")]);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// A relay keeps its connection's place under `[proxy] max_connections`: one agent cannot
/// hold more relays than the cap, and the gauge counts them.
#[test]
fn websocket_relays_count_against_the_connection_cap() {
    let port = holding_origin();
    let (_home, daemon) = setup_raw_with(port, "max_connections = 4\nmax_busy_per_agent = 16");
    let relays: Vec<_> = (0..4).map(|_| open_relay(&daemon, port, "/hold")).collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(gauge(&daemon, "postern_proxy_connections_open"), Some(4));
    // A fifth connection finds no room: every place is a running relay.
    use std::io::{Read, Write};
    let addr = daemon.proxy.trim_start_matches("http://");
    let mut fifth = std::net::TcpStream::connect(addr).unwrap();
    fifth
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let target = format!("origin.test:{port}");
    let _ =
        fifth.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes());
    let mut answer = Vec::new();
    let _ = fifth.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        !answer.starts_with("HTTP/1.1 200"),
        "admitted over the cap: {answer}"
    );
    assert!(
        !answer.starts_with("HTTP/1.1 407"),
        "admitted over the cap: {answer}"
    );
    // Closing relays gives the places back.
    drop(relays);
    let freed = (0..50).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        gauge(&daemon, "postern_proxy_connections_open") == Some(0)
    });
    assert!(freed, "closed relays free their places");
    let _again = open_relay(&daemon, port, "/hold");
}

/// Under a low descriptor limit, relays stop at the connection cap postern derives from it
/// (two descriptors each), so postern keeps descriptors for itself: `/healthz` and
/// `/metrics` answer, and a request is still served once a relay closes.
#[test]
fn relays_under_a_low_descriptor_limit_leave_postern_room_to_answer() {
    let port = holding_origin();
    let wrapper = ["sh", "-c", "ulimit -n 160 && exec \"$@\"", "sh"];
    let (_home, daemon) = setup_raw_wrapped(port, "max_busy_per_agent = 1000", &wrapper);
    let mut relays = Vec::new();
    while relays.len() < 200 {
        match try_relay(&daemon, port, "/hold") {
            Ok(tcp) => relays.push(tcp),
            Err(_) => break,
        }
    }
    let held = relays.len();
    assert!((10..200).contains(&held), "relays stop at the cap: {held}");
    let gauge_open = gauge(&daemon, "postern_proxy_connections_open");
    assert_eq!(gauge_open, Some(held as u64), "every relay counted");
    let (health, _, _) = crate::support::curl(&["--max-time", "5", &daemon.url("/healthz")]);
    assert_eq!(health, 200, "postern answers with {held} relays open");
    relays.pop();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        try_relay(&daemon, port, "/hold").is_ok(),
        "a closed relay's place is free again"
    );
}
