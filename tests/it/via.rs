//! `via` upstream proxy hops (SPEC §3.6) through a scripted loopback proxy that records
//! every request head it saw and every byte it tunneled.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use serde_json::Value;

use crate::origins::{self, Origin, read_request};
use crate::support::{Daemon, Home, curl, get_json, secret_set};
use crate::tls_origin::{self, Counting};

const VAULT_KEY: &str = "vault-passphrase-for-via-tests";
/// The origin's credential (the route's `credential`).
const ORIGIN_SECRET: &str = "canary-origin-4b1f-SECRET";
/// The hop's credential (`via_credential`): only the hop may ever see it.
const HOP_SECRET: &str = "canary-hop-93ad-SECRET";

/// What the scripted hop does with what it is sent.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Script {
    /// Tunnels a `CONNECT`, forwards an absolute-form request.
    Forward,
    /// Answers a `CONNECT` with this status.
    RefuseConnect(u16),
    /// Reads the request whole, then answers 502 with its own `Proxy-Status` error.
    HopError,
    /// Answers an absolute-form request itself, echoing the head it got (a debug proxy).
    EchoHead,
    /// Answers an absolute-form request with a bare `407` (no `Proxy-Status`).
    DemandAuth,
}

/// A loopback HTTP proxy: every name resolves to 127.0.0.1.
struct HopProxy {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
    /// Every request head it received, as sent.
    heads: Arc<Mutex<Vec<String>>>,
    /// Every byte it relayed from postern toward the origin inside a tunnel.
    tunneled: Arc<Mutex<Vec<u8>>>,
}

impl HopProxy {
    fn start(script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hop = Self {
            addr,
            script: Arc::new(Mutex::new(script)),
            heads: Arc::default(),
            tunneled: Arc::default(),
        };
        let (script, heads, tunneled) =
            (hop.script.clone(), hop.heads.clone(), hop.tunneled.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let script = *script.lock().unwrap();
                let (heads, tunneled) = (heads.clone(), tunneled.clone());
                std::thread::spawn(move || serve(stream, script, &heads, &tunneled));
            }
        });
        hop
    }

    fn set(&self, script: Script) {
        *self.script.lock().unwrap() = script;
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }

    fn tunneled(&self) -> String {
        String::from_utf8_lossy(&self.tunneled.lock().unwrap()).into_owned()
    }

    /// The name postern gives this hop when it does not name itself.
    fn evidence_name(&self) -> String {
        format!("proxy:{}", self.addr)
    }
}

fn serve(
    mut client: TcpStream,
    script: Script,
    heads: &Mutex<Vec<String>>,
    tunneled: &Mutex<Vec<u8>>,
) {
    let req = read_request(&mut client);
    let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") else {
        return;
    };
    let head = String::from_utf8_lossy(&req[..end + 4]).into_owned();
    heads.lock().unwrap().push(head.clone());
    let mut line = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (line.next().unwrap_or(""), line.next().unwrap_or(""));
    match (method, script) {
        ("CONNECT", Script::RefuseConnect(status)) => {
            let refusal = format!(
                "HTTP/1.1 {status} Refused\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
            let _ = client.write_all(refusal.as_bytes());
        }
        ("CONNECT", _) => tunnel(client, port_of(target), tunneled),
        (_, Script::HopError) => {
            let _ = client.write_all(
                b"HTTP/1.1 502 Bad Gateway\r\nproxy-status: hopname; error=connection_timeout\r\ncontent-length: 11\r\nconnection: close\r\n\r\nhop timeout",
            );
        }
        (_, Script::DemandAuth) => {
            let _ = client.write_all(
                b"HTTP/1.1 407 Proxy Authentication Required\r\nproxy-authenticate: Basic realm=\"corp\"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
        (_, Script::EchoHead) => {
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{head}",
                head.len()
            );
            let _ = client.write_all(answer.as_bytes());
        }
        _ => forward(client, method, target, &req[end + 4..], &head),
    }
}

fn port_of(authority: &str) -> u16 {
    authority.rsplit(':').next().unwrap().parse().unwrap()
}

/// `200`, then bytes both ways until each side ends, recording postern's side.
fn tunnel(mut client: TcpStream, port: u16, tunneled: &Mutex<Vec<u8>>) {
    let Ok(origin) = TcpStream::connect(("127.0.0.1", port)) else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
        return;
    };
    let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
    let (mut up_from, mut up_to) = (client.try_clone().unwrap(), origin.try_clone().unwrap());
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = up_from.read(&mut buf) {
                tunneled.lock().unwrap().extend_from_slice(&buf[..n]);
                if up_to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = up_to.shutdown(Shutdown::Write);
        });
        let (mut down_from, mut down_to) = (origin, client);
        let _ = std::io::copy(&mut down_from, &mut down_to);
        let _ = down_to.shutdown(Shutdown::Write);
    });
}

/// An absolute-form request sent on in origin form, without the hop's own header.
fn forward(mut client: TcpStream, method: &str, target: &str, body: &[u8], head: &str) {
    let rest = target.strip_prefix("http://").unwrap();
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let Ok(mut origin) = TcpStream::connect(("127.0.0.1", port_of(authority))) else {
        return;
    };
    let mut out = format!("{method} {path} HTTP/1.1\r\n");
    for l in head.split("\r\n").skip(1).filter(|l| !l.is_empty()) {
        if !l.to_ascii_lowercase().starts_with("proxy-authorization:") {
            out.push_str(l);
            out.push_str("\r\n");
        }
    }
    out.push_str("\r\n");
    let _ = origin.write_all(out.as_bytes());
    let _ = origin.write_all(body);
    let _ = std::io::copy(&mut origin, &mut client);
}

fn config(route: &str) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[credentials]]\nid = \"api\"\nsecret = \"api-key\"\ninject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\
         [[credentials]]\nid = \"corp\"\nsecret = \"corp-proxy\"\ninject = {{ basic = {{ user = \"postern\" }} }}\n\
         [[routes]]\nid = \"api\"\nvia_credential = \"corp\"\n{route}\n"
    )
}

/// The route's keys beyond `id` and `via_credential`. The hop is on loopback: without
/// `allow_private` the SSRF guard refuses it.
fn https_route(origin: &Counting, hop: &HopProxy, extra: &str) -> String {
    format!(
        "match = {{ host = \"origin.test\", port = {} }}\nvia = \"http://{}\"\nallow_private = true\nupstream_ca = \"{}\"\n{extra}",
        origin.tls.addr.port(),
        hop.addr,
        origin.tls.ca_file.display()
    )
}

struct Setup {
    home: Home,
    daemon: Daemon,
}

fn start(route: &str) -> Setup {
    let home = Home::new();
    for (name, value) in [("api-key", ORIGIN_SECRET), ("corp-proxy", HOP_SECRET)] {
        assert!(
            secret_set(&home, name, value, Some(VAULT_KEY))
                .status
                .success()
        );
    }
    let envs = [("POSTERN_VAULT_KEY", VAULT_KEY), ("RUST_LOG", "debug")];
    let daemon = Daemon::start_with(&home, Some(&config(route)), &envs);
    Setup { home, daemon }
}

impl Setup {
    fn https(&self, port: u16, path: &str, extra: &[&str]) -> (u16, String, String) {
        let ca = self.home.root().join("certs/ca.pem").display().to_string();
        let url = format!("https://origin.test:{port}{path}");
        let mut args = vec!["--cacert", ca.as_str(), "-x", self.daemon.proxy.as_str()];
        args.extend_from_slice(extra);
        args.push(&url);
        curl(&args)
    }

    fn record(&self, head: &str) -> Value {
        let id = invocation(head);
        let out = self.daemon.cli(&["actions", "show", &id, "--json"], &[]);
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The record once it has `kind` among its events (delivery is recorded after the answer).
    fn settled(&self, head: &str, kind: &str) -> Value {
        for _ in 0..250 {
            let r = self.record(head);
            if kinds(&r).contains(&kind.to_owned()) {
                return r;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.record(head)
    }
}

fn invocation(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("postern-invocation")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no Postern-Invocation in {head}"))
}

fn kinds(r: &Value) -> Vec<String> {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect()
}

fn position(r: &Value, pred: impl Fn(&Value) -> bool) -> Option<usize> {
    r["events"].as_array().unwrap().iter().position(pred)
}

fn hop_auth() -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("postern:{HOP_SECRET}"));
    format!("proxy-authorization: basic {}", token.to_ascii_lowercase())
}

fn counting_origin() -> Counting {
    tls_origin::counting(
        false,
        Duration::ZERO,
        200,
        Bytes::from_static(b"{\"ok\":true}"),
    )
}

/// An `http` route to `origin` through `hop`; `extra` lines go into the route.
fn http_route(origin: &Origin, hop: &HopProxy, extra: &str) -> String {
    format!(
        "match = {{ scheme = \"http\", host = \"origin.test\", port = {} }}\nvia = \"http://{}\"\nallow_private = true\n{extra}",
        origin.port(),
        hop.addr
    )
}

#[test]
fn https_goes_through_a_connect_tunnel_each_credential_reaching_only_its_own_party() {
    let origin = counting_origin();
    let hop = HopProxy::start(Script::Forward);
    let s = start(&https_route(&origin, &hop, "credential = \"api\""));
    let (status, body, head) = s.https(origin.tls.addr.port(), "/v1/things", &[]);
    assert_eq!(status, 200, "{head}\n{body}");
    assert_eq!(body, "{\"ok\":true}");

    let seen = origin.origin.last_request();
    assert!(
        seen.contains(&format!("authorization: Bearer {ORIGIN_SECRET}")),
        "the origin got its credential: {seen}"
    );
    assert!(
        !seen.to_ascii_lowercase().contains("proxy-authorization"),
        "{seen}"
    );
    assert!(!seen.contains(HOP_SECRET), "{seen}");

    let heads = hop.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let connect = heads[0].to_ascii_lowercase();
    let port = origin.tls.addr.port();
    assert!(
        connect.starts_with(&format!("connect origin.test:{port} http/1.1\r\n")),
        "{connect}"
    );
    assert!(
        connect.contains(&hop_auth()),
        "the hop got its credential: {connect}"
    );
    let tunneled = hop.tunneled();
    assert!(!tunneled.is_empty(), "the request went through the tunnel");
    for plaintext in [ORIGIN_SECRET, "/v1/things", "authorization"] {
        assert!(!tunneled.contains(plaintext), "the hop saw {plaintext}");
    }

    let r = s.settled(&head, "RESULT_DELIVERED");
    assert_eq!(r["outcome"], "committed", "{r}");
    let stages: Vec<(&str, &str)> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "CONNECT_ATTEMPT")
        .map(|e| {
            (
                e["data"]["stage"].as_str().unwrap(),
                e["hop"].as_str().unwrap(),
            )
        })
        .collect();
    let named = hop.evidence_name();
    assert_eq!(
        stages,
        [
            ("dns", "postern"),
            ("tcp_connect", "postern"),
            ("proxy_tunnel", named.as_str()),
            ("tls_handshake", "postern")
        ],
        "{r}"
    );
    let tunnel_at = position(&r, |e| e["data"]["stage"] == "proxy_tunnel").unwrap();
    let dispatch_at = position(&r, |e| e["kind"] == "DISPATCH_STARTED").unwrap();
    assert!(
        tunnel_at < dispatch_at,
        "tunnel, then DISPATCH_STARTED: {r}"
    );
    assert_eq!(r["events"][dispatch_at]["hop"], "origin");
    assert_eq!(r["evidence"]["tls"]["server_name"], "origin.test", "{r}");
    assert_eq!(r["evidence"]["address"], hop.addr.to_string());
}

#[test]
fn http_goes_to_the_hop_in_absolute_form_and_the_origin_never_sees_the_hop_credential() {
    let origin = origins::echoes_request();
    let hop = HopProxy::start(Script::Forward);
    let route = http_route(&origin, &hop, "credential = \"api\"\n");
    let s = start(&route);
    let url = format!("http://origin.test:{}/items?n=1", origin.port());
    let (status, body, head) = curl(&["-x", &s.daemon.proxy, &url]);
    assert_eq!(status, 200, "{head}\n{body}");

    let heads = hop.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let sent = heads[0].to_ascii_lowercase();
    assert!(
        sent.starts_with(&format!("get {} http/1.1\r\n", url.to_ascii_lowercase())),
        "absolute form to the hop: {sent}"
    );
    assert!(sent.contains(&hop_auth()), "{sent}");
    let seen = origin.last_request();
    assert!(seen.starts_with("GET /items?n=1 HTTP/1.1"), "{seen}");
    assert!(
        seen.contains(ORIGIN_SECRET),
        "the origin got its credential: {seen}"
    );
    assert!(!seen.contains(HOP_SECRET), "{seen}");

    let r = s.settled(&head, "RESULT_DELIVERED");
    assert_eq!(r["outcome"], "committed", "{r}");
    let dispatch_at = position(&r, |e| e["kind"] == "DISPATCH_STARTED").unwrap();
    assert_eq!(r["events"][dispatch_at]["hop"], hop.evidence_name(), "{r}");
    assert!(position(&r, |e| e["data"]["stage"] == "proxy_tunnel").is_none());
}

#[test]
fn a_hop_refusing_the_tunnel_is_proxy_tunnel_refused_before_dispatch() {
    let origin = counting_origin();
    let hop = HopProxy::start(Script::RefuseConnect(407));
    let s = start(&https_route(&origin, &hop, ""));
    for (refusal, retry) in [
        (407, "after_correction"),
        (403, "after_correction"),
        (503, "backoff"),
    ] {
        hop.set(Script::RefuseConnect(refusal));
        let (status, body, head) =
            s.https(origin.tls.addr.port(), "/x", &["-X", "POST", "-d", "b"]);
        assert_eq!(status, 502, "{refusal}: {head}\n{body}");
        assert!(
            head.to_ascii_lowercase()
                .contains("error=destination_unavailable"),
            "{head}"
        );
        let env: Value = serde_json::from_str(&body).unwrap();
        let e = &env["error"];
        assert_eq!(e["code"], "PROXY_TUNNEL_REFUSED", "{body}");
        assert_eq!(e["phase"], "connection_setup");
        assert_eq!(e["outcome"], "not_attempted");
        assert_eq!(e["retry"], retry, "{refusal}: {body}");
        assert_eq!(env["evidence"]["hop"], hop.evidence_name(), "{body}");
        assert_eq!(env["evidence"]["hop_status"], refusal, "{body}");
        assert_eq!(env["evidence"]["dispatch_started"], false);
        let r = s.record(&head);
        assert!(!kinds(&r).contains(&"DISPATCH_STARTED".to_owned()), "{r}");
    }
    assert_eq!(origin.origin.connections(), 0, "nothing reached the origin");
    assert_eq!(origin.origin.hits(), 0);
}

#[test]
fn a_hop_error_after_the_request_was_written_is_upstream_hop_error() {
    let origin = origins::echoes_request();
    let hop = HopProxy::start(Script::HopError);
    let route = http_route(&origin, &hop, "");
    let s = start(&route);
    let url = format!("http://origin.test:{}/pay", origin.port());
    let (status, body, head) = curl(&["-x", &s.daemon.proxy, "-X", "POST", "-d", "x=1", &url]);
    assert_eq!(status, 502, "{head}\n{body}");
    let env: Value = serde_json::from_str(&body).unwrap();
    let e = &env["error"];
    assert_eq!(e["code"], "UPSTREAM_HOP_ERROR", "{body}");
    assert_eq!(e["outcome"], "unknown");
    assert_eq!(e["phase"], "remote_execution");
    assert_eq!(e["retry"], "reconcile", "POST without a key: {body}");
    assert_eq!(env["evidence"]["hop"], "proxy:hopname", "{body}");
    assert_eq!(env["evidence"]["hop_status"], 502);
    let proxy_status = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("proxy-status:"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        proxy_status.contains("hopname; error=connection_timeout, postern"),
        "the hop's member first: {proxy_status}"
    );
    assert_eq!(origin.hits(), 0);
    let r = s.record(&head);
    let ks = kinds(&r);
    let at = |k: &str| ks.iter().position(|x| x == k).unwrap_or(usize::MAX);
    assert!(at("DISPATCH_STARTED") < at("REQUEST_SENT"), "{ks:?}");
    assert!(at("REQUEST_SENT") < at("FAILED"), "{ks:?}");
}

#[test]
fn a_tunnel_route_connects_through_its_hop() {
    let origin = counting_origin();
    let hop = HopProxy::start(Script::Forward);
    let route = format!(
        "match = {{ host = \"origin.test\", port = {} }}\nvia = \"http://{}\"\nallow_private = true\nintercept = false\n",
        origin.tls.addr.port(),
        hop.addr
    );
    let s = start(&route);
    // The client verifies the origin itself: postern does not terminate its TLS.
    let ca = origin.tls.ca_file.display().to_string();
    let url = format!("https://origin.test:{}/pinned", origin.tls.addr.port());
    let (status, body, head) = curl(&["--cacert", &ca, "-x", &s.daemon.proxy, &url]);
    assert_eq!(status, 200, "{head}\n{body}");
    let heads = hop.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(
        heads[0].to_ascii_lowercase().contains(&hop_auth()),
        "{heads:?}"
    );
    assert!(!hop.tunneled().contains("/pinned"), "the hop saw plaintext");
    let (_, list) = get_json(&s.daemon.url("/v1/invocations?limit=1"), &[]);
    let id = list["invocations"][0]["invocation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = s.daemon.cli(&["actions", "show", &id, "--json"], &[]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["method"], "CONNECT", "{r}");
    let tunnel_at = position(&r, |e| e["data"]["stage"] == "proxy_tunnel").unwrap();
    assert_eq!(r["events"][tunnel_at]["hop"], hop.evidence_name());
    let dispatch_at = position(&r, |e| e["kind"] == "DISPATCH_STARTED").unwrap();
    assert!(tunnel_at < dispatch_at, "{r}");
}

#[test]
fn a_hop_on_a_private_address_needs_allow_private() {
    let origin = counting_origin();
    let hop = HopProxy::start(Script::Forward);
    let s = start(&https_route(&origin, &hop, "").replace("allow_private = true\n", ""));
    let (status, body, _) = s.https(origin.tls.addr.port(), "/", &[]);
    assert_eq!(status, 502, "{body}");
    let env: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(env["error"]["code"], "DESTINATION_PROHIBITED", "{body}");
    assert!(hop.heads().is_empty(), "the hop was never contacted");
}

#[test]
fn neither_secret_surfaces_in_records_events_results_metrics_or_logs() {
    let origin = counting_origin();
    // Refused first: once a tunnel is open, postern reuses it and asks the hop nothing.
    let hop = HopProxy::start(Script::RefuseConnect(407));
    let s = start(&https_route(&origin, &hop, "credential = \"api\""));
    let port = origin.tls.addr.port();
    let (refused, body, _) = s.https(port, "/two", &[]);
    assert_eq!(refused, 502, "{body}");
    hop.set(Script::Forward);
    let (status, _, head) = s.https(port, "/one", &["-X", "POST", "-d", "hello"]);
    assert_eq!(status, 200);
    let id = invocation(&head);
    s.settled(&head, "RESULT_DELIVERED");
    let mut seen = format!("{body}\n{head}\n");
    for path in [
        "/v1/invocations".to_owned(),
        format!("/v1/invocations/{id}"),
        format!("/v1/invocations/{id}/events"),
        format!("/v1/invocations/{id}/result"),
        "/metrics".to_owned(),
    ] {
        let (_, text, _) = curl(&[&s.daemon.url(&path)]);
        seen.push_str(&text);
    }
    let (_, list) = get_json(&s.daemon.url("/v1/invocations"), &[]);
    for r in list["invocations"].as_array().unwrap() {
        let id = r["invocation_id"].as_str().unwrap();
        for args in [
            vec!["actions", "show", id, "--json"],
            vec!["actions", "show", id],
        ] {
            let out = s.daemon.cli(&args, &[]);
            seen.push_str(&String::from_utf8_lossy(&out.stdout));
            seen.push_str(&String::from_utf8_lossy(&out.stderr));
        }
    }
    seen.push_str(&s.daemon.stdout.join("\n"));
    seen.push_str(&s.daemon.stderr());
    let b64 = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
    for secret in [HOP_SECRET, ORIGIN_SECRET] {
        assert!(!seen.contains(secret), "{secret} leaked");
        assert!(!seen.contains(&b64(secret)));
    }
    assert!(
        !seen.contains(&b64(&format!("postern:{HOP_SECRET}"))),
        "the hop's Basic leaked"
    );
    assert!(
        seen.contains("PROXY_TUNNEL_REFUSED"),
        "the refusal is in what was read"
    );
}

#[test]
fn a_hop_echoing_its_credential_is_redacted_like_an_origin_echo() {
    let origin = origins::echoes_request();
    let hop = HopProxy::start(Script::EchoHead);
    let route = http_route(&origin, &hop, "credential = \"api\"\n");
    let s = start(&route);
    let url = format!("http://origin.test:{}/debug", origin.port());
    let (status, body, head) = curl(&["-x", &s.daemon.proxy, &url]);
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(hop.heads()[0].to_ascii_lowercase().contains(&hop_auth()));
    let token = base64::engine::general_purpose::STANDARD.encode(format!("postern:{HOP_SECRET}"));
    assert!(
        !body.contains(&token),
        "the hop's Basic reached the agent: {body}"
    );
    assert!(!body.contains(ORIGIN_SECRET), "{body}");
    assert!(body.contains("[postern:redacted]"), "{body}");
    let id = invocation(&head);
    let (_, result) = get_json(&s.daemon.url(&format!("/v1/invocations/{id}/result")), &[]);
    let stored = result["body_base64"].as_str().unwrap_or_default();
    let stored = base64::engine::general_purpose::STANDARD
        .decode(stored)
        .unwrap();
    let stored = String::from_utf8_lossy(&stored);
    assert!(
        !stored.contains(&token) && !stored.contains(HOP_SECRET),
        "{stored}"
    );
}

/// A bare `407` can only be the hop's (an origin asks with `401`): the hop's refusal never
/// resolves the invocation as if the origin had answered.
#[test]
fn a_bare_407_from_the_hop_is_the_hops_error_not_the_origins_answer() {
    let origin = origins::echoes_request();
    let hop = HopProxy::start(Script::DemandAuth);
    let route = http_route(&origin, &hop, "");
    let s = start(&route);
    let url = format!("http://origin.test:{}/pay", origin.port());
    let (status, body, head) = curl(&["-x", &s.daemon.proxy, "-X", "POST", "-d", "x=1", &url]);
    assert_eq!(status, 502, "{head}\n{body}");
    let env: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(env["error"]["code"], "UPSTREAM_HOP_ERROR", "{body}");
    assert_eq!(env["error"]["outcome"], "unknown", "{body}");
    assert_eq!(env["evidence"]["hop"], hop.evidence_name(), "{body}");
    assert_eq!(env["evidence"]["hop_status"], 407, "{body}");
    assert_eq!(origin.hits(), 0);
}
