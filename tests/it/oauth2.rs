//! OAuth2 minted tokens (SPEC §3.8), `client_credentials`: postern asks a loopback token
//! endpoint (HTTPS, its own CA, reached through its route) for an access token with the
//! vault's client id and secret, keeps it, and injects it where the agent sent the
//! placeholder. One token request per credential at a time; expiry and an origin's `401`
//! bring a new one; a failing endpoint is `CREDENTIAL_MINT_FAILED` and nothing is sent.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::Value;

use crate::support::{Daemon, Home, curl, free_port, get_json, secret_set, stored_text};
use crate::tls_origin::{Handler, TlsOrigin, full, serve_tls};

mod grants;

const VAULT_KEY: &str = "vault-passphrase-for-oauth2-tests";
const CLIENT_ID: &str = "agent-client";
const CLIENT_SECRET: &str = "client-secret-canary-5f2b71/Zq";

/// How the token endpoint answers.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// `{"access_token":"minted-token-N", "expires_in": n}` (no `expires_in` for `None`).
    Issue(Option<u64>),
    Status(u16),
    NoAccessToken,
    /// Answers after 10 s.
    Slow,
}

/// The token endpoint: counts requests, keeps what each carried, issues numbered tokens.
struct TokenEndpoint {
    tls: TlsOrigin,
    hits: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<(String, String)>>>,
    mode: Arc<Mutex<Mode>>,
}

fn token_endpoint(mode: Mode) -> TokenEndpoint {
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mode = Arc::new(Mutex::new(mode));
    let (h, s, m) = (hits.clone(), seen.clone(), mode.clone());
    let service: Handler = Arc::new(move |req: Request<Incoming>| {
        let (h, s, m) = (h.clone(), s.clone(), m.clone());
        Box::pin(async move {
            let auth = header(&req, "authorization");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let n = h.fetch_add(1, Ordering::SeqCst) + 1;
            s.lock()
                .unwrap()
                .push((auth, String::from_utf8_lossy(&body).into_owned()));
            // Slow enough that concurrent agent requests overlap the one token request.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mode = *m.lock().unwrap();
            if mode == Mode::Slow {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            let (status, text) = match mode {
                Mode::Issue(Some(secs)) => (
                    200,
                    format!(
                        r#"{{"access_token":"minted-token-{n}","token_type":"Bearer","expires_in":{secs}}}"#
                    ),
                ),
                Mode::Issue(None) => (200, format!(r#"{{"access_token":"minted-token-{n}"}}"#)),
                Mode::Status(code) => (code, r#"{"error":"invalid_client"}"#.to_owned()),
                Mode::NoAccessToken | Mode::Slow => (200, r#"{"token_type":"Bearer"}"#.to_owned()),
            };
            json_response(status, text)
        })
    });
    TokenEndpoint {
        tls: serve_tls("auth.test", &[b"http/1.1"], Arc::default(), service),
        hits,
        seen,
        mode,
    }
}

/// The API: answers `401` to revoked tokens, else echoes the `Authorization` it got (in
/// the body and a header, as debug endpoints do).
struct Api {
    tls: TlsOrigin,
    hits: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<String>>>,
    revoked: Arc<Mutex<HashSet<String>>>,
}

fn api() -> Api {
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let revoked = Arc::new(Mutex::new(HashSet::new()));
    let (h, s, r) = (hits.clone(), seen.clone(), revoked.clone());
    let service: Handler = Arc::new(move |req: Request<Incoming>| {
        let (h, s, r) = (h.clone(), s.clone(), r.clone());
        Box::pin(async move {
            let auth = header(&req, "authorization");
            h.fetch_add(1, Ordering::SeqCst);
            s.lock().unwrap().push(auth.clone());
            let token = auth.strip_prefix("Bearer ").unwrap_or("").to_owned();
            if r.lock().unwrap().contains(&token) {
                return json_response(401, r#"{"error":"token revoked"}"#.into());
            }
            let mut resp = json_response(
                200,
                serde_json::json!({ "authorization": auth }).to_string(),
            );
            resp.headers_mut()
                .insert("x-echo-authorization", auth.parse().unwrap());
            resp
        })
    });
    Api {
        tls: serve_tls("api.test", &[b"h2", b"http/1.1"], Arc::default(), service),
        hits,
        seen,
        revoked,
    }
}

fn header(req: &Request<Incoming>, name: &str) -> String {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

fn json_response(status: u16, text: String) -> Response<crate::tls_origin::TestBody> {
    let mut resp = Response::new(full(Bytes::from(text)));
    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    resp
}

struct Setup {
    home: Home,
    daemon: Daemon,
    token: TokenEndpoint,
    api: Api,
}

/// The daemon with credential `cc` minted from `token`; `token_port` is where the token
/// route points (the endpoint's own port, or a closed one).
fn setup(mode: Mode, token_down: bool) -> Setup {
    let token = token_endpoint(mode);
    let api = api();
    let home = Home::new();
    let material = serde_json::json!({"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET});
    assert!(
        secret_set(&home, "cc-client", &material.to_string(), Some(VAULT_KEY))
            .status
            .success()
    );
    let port = token.tls.addr.port();
    let token_addr = match token_down {
        true => format!("127.0.0.1:{}", free_port()),
        false => token.tls.addr.to_string(),
    };
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[credentials]]\nid = \"cc\"\nsecret = \"cc-client\"\n\
         inject = {{ oauth2 = {{ grant = \"client_credentials\", token_url = \"https://auth.test:{port}/oauth/token\", scope = \"read write\" }} }}\n\
         [[routes]]\nid = \"token\"\nagents = []\nmatch = {{ host = \"auth.test\", port = {port} }}\nresolve = \"{token_addr}\"\nupstream_ca = \"{}\"\nresponse_timeout = \"3s\"\n\
         [[routes]]\nid = \"api\"\ncredential = \"cc\"\nmatch = {{ host = \"api.test\", port = {api_port} }}\nresolve = \"{api_addr}\"\nupstream_ca = \"{api_ca}\"\n\
         [[routes]]\nid = \"open\"\nmatch = {{ host = \"api.test\", port = {api_port}, path_prefix = \"/open\" }}\nresolve = \"{api_addr}\"\nupstream_ca = \"{api_ca}\"\n",
        token.tls.ca_file.display(),
        api_port = api.tls.addr.port(),
        api_addr = api.tls.addr,
        api_ca = api.tls.ca_file.display(),
    );
    let daemon = Daemon::start_with(&home, Some(&config), &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    Setup {
        home,
        daemon,
        token,
        api,
    }
}

impl Setup {
    /// A request as the agent sends it: the placeholder where the token goes.
    fn call(&self, path: &str) -> (u16, String, String) {
        let ca = self.home.root().join("certs/ca.pem").display().to_string();
        let url = format!("https://api.test:{}{path}", self.api.tls.addr.port());
        curl(&[
            "--cacert",
            &ca,
            "-x",
            &self.daemon.proxy,
            "-H",
            "Authorization: Bearer postern:cc",
            &url,
        ])
    }

    fn record(&self, body: &str) -> Value {
        let e: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        let id = e["invocation_id"].as_str().unwrap_or_default().to_owned();
        let (_, record) = get_json(&self.daemon.url(&format!("/v1/invocations/{id}")), &[]);
        record
    }
}

#[test]
fn twenty_concurrent_requests_share_one_token_request() {
    let s = Arc::new(setup(Mode::Issue(Some(3600)), false));
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || s.call(&format!("/v1/items/{i}")))
        })
        .collect();
    for call in calls {
        let (status, body, head) = call.join().unwrap();
        assert_eq!(status, 200, "{body}{head}");
        let echo: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            echo["authorization"], "Bearer [postern:redacted]",
            "the echoed token is masked: {body}"
        );
        assert!(!head.contains("minted-token"), "{head}");
    }
    assert_eq!(s.token.hits.load(Ordering::SeqCst), 1, "one token request");
    let seen = s.api.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 20);
    assert!(
        seen.iter().all(|a| a == "Bearer minted-token-1"),
        "the origin got the minted token, never the placeholder: {seen:?}"
    );
    // The token request: client_credentials, the client authenticated by Basic.
    let (auth, form) = s.token.seen.lock().unwrap()[0].clone();
    let basic = base64::engine::general_purpose::STANDARD
        .encode(format!("{CLIENT_ID}:client-secret-canary-5f2b71%2FZq"));
    assert_eq!(auth, format!("Basic {basic}"));
    assert_eq!(form, "grant_type=client_credentials&scope=read%20write");
    // A route to the same host that injects nothing is guarded against the minted token
    // too: an origin that kept it could echo it there (here the echo is of what it got).
    let ca = s.home.root().join("certs/ca.pem").display().to_string();
    let url = format!("https://api.test:{}/open/x", s.api.tls.addr.port());
    let sent = "Authorization: Bearer minted-token-1";
    let (status, body, head) = curl(&["--cacert", &ca, "-x", &s.daemon.proxy, "-H", sent, &url]);
    assert_eq!(status, 200, "{body}{head}");
    assert!(
        !body.contains("minted-token-1") && !head.contains("minted-token-1"),
        "{body}{head}"
    );
}

#[test]
fn an_expired_token_is_minted_again() {
    let s = setup(Mode::Issue(Some(2)), false);
    assert_eq!(s.call("/a").0, 200);
    assert_eq!(s.call("/b").0, 200);
    assert_eq!(s.token.hits.load(Ordering::SeqCst), 1, "kept while fresh");
    std::thread::sleep(Duration::from_millis(2200));
    assert_eq!(s.call("/c").0, 200);
    assert_eq!(
        s.token.hits.load(Ordering::SeqCst),
        2,
        "minted again after expiry"
    );
    let seen = s.api.seen.lock().unwrap().clone();
    assert_eq!(seen.last().unwrap(), "Bearer minted-token-2");
}

#[test]
fn an_origin_401_drops_the_token_and_is_not_resent() {
    let s = setup(Mode::Issue(None), false);
    assert_eq!(s.call("/a").0, 200);
    s.api
        .revoked
        .lock()
        .unwrap()
        .insert("minted-token-1".into());
    let (status, body, _) = s.call("/b");
    assert_eq!(status, 401, "the origin's 401 is passed through: {body}");
    assert_eq!(
        s.api.hits.load(Ordering::SeqCst),
        2,
        "never resent by postern"
    );
    let r = s.record_of_newest();
    assert_eq!(r["outcome"], "rejected", "{r}");
    let (status, _, _) = s.call("/c");
    assert_eq!(status, 200);
    assert_eq!(
        s.token.hits.load(Ordering::SeqCst),
        2,
        "a new token after the 401"
    );
    let seen = s.api.seen.lock().unwrap().clone();
    assert_eq!(seen.last().unwrap(), "Bearer minted-token-2");
}

impl Setup {
    fn record_of_newest(&self) -> Value {
        let (_, list) = get_json(&self.daemon.url("/v1/invocations?limit=1"), &[]);
        list["invocations"][0].clone()
    }
}

/// Every way the token endpoint can fail: the agent's request is not sent, the code says
/// so, and retry says whether to wait (`backoff`) or fix something (`4xx`).
#[test]
fn a_failing_token_endpoint_is_credential_mint_failed_and_nothing_is_sent() {
    let cases = [
        (Mode::Issue(None), true, "backoff", None::<u16>),
        (Mode::Status(400), false, "after_correction", Some(400)),
        (Mode::Status(500), false, "backoff", Some(500)),
        (Mode::NoAccessToken, false, "backoff", Some(200)),
    ];
    for (mode, down, retry, token_status) in cases {
        let s = setup(mode, down);
        let (status, body, head) = s.call("/charge");
        let e: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let what = format!("{down} {token_status:?}: {body}");
        assert_eq!(status, 502, "{what}");
        assert_eq!(e["error"]["code"], "CREDENTIAL_MINT_FAILED", "{what}");
        assert_eq!(e["error"]["phase"], "credential_injection", "{what}");
        assert_eq!(e["error"]["outcome"], "not_attempted", "{what}");
        assert_eq!(e["error"]["retry"], retry, "{what}");
        assert!(
            head.to_ascii_lowercase()
                .contains("error=proxy_internal_error"),
            "{head}"
        );
        assert_eq!(s.api.hits.load(Ordering::SeqCst), 0, "nothing sent: {what}");
        let r = s.record(&body);
        assert_eq!(
            r["evidence"]["token_status"].as_u64(),
            token_status.map(u64::from),
            "{r}"
        );
        if down {
            assert_eq!(
                r["evidence"]["token_connect_code"], "CONNECTION_REFUSED",
                "{r}"
            );
        }
        // The token request is postern's own invocation, named in the evidence.
        let id = r["evidence"]["token_invocation"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"));
        let (_, token) = get_json(&s.daemon.url(&format!("/v1/invocations/{id}")), &[]);
        assert_eq!(token["agent"], "postern", "{token}");
        let outcome = match token_status {
            None => "not_attempted",
            Some(400) => "rejected",
            Some(_) => "committed",
        };
        assert_eq!(token["outcome"], outcome, "{what}: {token}");
    }
}

#[test]
fn a_token_request_is_journaled_as_posterns_own_invocation_without_its_token() {
    let s = setup(Mode::Issue(Some(3600)), false);
    let (status, body, _) = s.call("/v1/items/1");
    assert_eq!(status, 200, "{body}");
    let list = s.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let token = list["invocations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["agent"] == "postern")
        .unwrap_or_else(|| panic!("{list}"))
        .clone();
    assert_eq!(token["outcome"], "committed", "{token}");
    assert!(
        token["target"].as_str().unwrap().ends_with("/oauth/token"),
        "{token}"
    );
    let id = token["invocation_id"].as_str().unwrap();
    let shown = s.daemon.cli(&["actions", "show", id, "--json"], &[]);
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let kinds: Vec<&str> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or(""))
        .collect();
    let dispatched = kinds.iter().position(|k| *k == "DISPATCH_STARTED");
    let committed = kinds.iter().position(|k| *k == "RESULT_COMMITTED");
    assert!(dispatched.is_some() && dispatched < committed, "{kinds:?}");
    // Its result is the head and the body's digest: the body holds the token.
    let result = s.daemon.cli(&["result", id, "--json"], &[]);
    let text = String::from_utf8_lossy(&result.stdout);
    assert!(!text.contains("minted-token"), "{text}");
}

/// A slow token endpoint is bounded by its route's `response_timeout` (3 s here).
#[test]
fn a_token_endpoint_too_slow_is_credential_mint_failed() {
    let s = setup(Mode::Slow, false);
    let started = std::time::Instant::now();
    let (status, body, _) = s.call("/charge");
    let e: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(status, 502, "{body}");
    assert_eq!(e["error"]["code"], "CREDENTIAL_MINT_FAILED", "{body}");
    assert_eq!(e["error"]["retry"], "backoff", "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "bounded by the route's timeout"
    );
    assert_eq!(s.record(&body)["evidence"]["token_failure"], "timeout");
    assert_eq!(s.api.hits.load(Ordering::SeqCst), 0);
}

/// The client secret and the minted token never reach the daemon's log, the journal,
/// or what the agent reads.
#[test]
fn the_client_secret_and_the_token_are_stored_nowhere() {
    let mut s = setup(Mode::Issue(Some(3600)), false);
    let (status, body, head) = s.call("/echo");
    assert_eq!(status, 200, "{body}");
    let (_, failed, failed_head) = {
        *s.token.mode.lock().unwrap() = Mode::Status(400);
        // A new vault version: a new token slot, so the failing endpoint is asked.
        let material = serde_json::json!({"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET});
        assert!(
            secret_set(&s.home, "cc-client", &material.to_string(), Some(VAULT_KEY))
                .status
                .success()
        );
        s.call("/echo")
    };
    assert!(failed.contains("CREDENTIAL_MINT_FAILED"), "{failed}");
    let log = s.daemon.stderr();
    let stored = stored_text(&mut s.daemon);
    for (name, text) in [
        ("response", format!("{head}{body}{failed_head}{failed}")),
        ("log", log),
        ("journal", stored),
    ] {
        for canary in [CLIENT_SECRET, "client-secret-canary", "minted-token-1"] {
            assert!(!text.contains(canary), "{canary} in the {name}");
        }
    }
}

#[test]
fn the_token_route_with_agents_empty_admits_no_agent() {
    let s = setup(Mode::Issue(Some(3600)), false);
    let ca = s.home.root().join("certs/ca.pem").display().to_string();
    let url = format!("https://auth.test:{}/oauth/token", s.token.tls.addr.port());
    let (_, _, head) = curl(&[
        "--cacert",
        &ca,
        "-x",
        &s.daemon.proxy,
        "-d",
        "grant_type=client_credentials",
        &url,
    ]);
    // No route admits the agent there: its CONNECT is refused.
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("ROUTE_DENIED"), "{head}");
    assert_eq!(
        s.token.hits.load(Ordering::SeqCst),
        0,
        "the endpoint saw nothing"
    );
    // postern itself still mints through that route.
    let (status, body, _) = s.call("/v1/items/1");
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.token.hits.load(Ordering::SeqCst), 1);
}
