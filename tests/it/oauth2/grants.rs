//! Minted tokens from the grants that sign or rotate (SPEC §3.8): `jwt_bearer` (a Google
//! service-account key file), `github_app` (an app's key) and `refresh_token` (rotated,
//! each refresh token good once). Each loopback token endpoint checks what it got the way
//! the real one does (the assertion's signature and claims, a single use of a refresh
//! token) and answers in the real one's shape; the origin echoes what it received plus a
//! secret it knows, which the guard masks.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Request;
use hyper::body::Incoming;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde_json::{Value, json};

use super::{header, json_response};
use crate::support::{Daemon, Home, curl, get_json, secret_set, stored_text};
use crate::tls_origin::{Handler, TlsOrigin, full, serve_tls};

const VAULT_KEY: &str = "vault-passphrase-for-grant-tests";
const SA_EMAIL: &str = "agent@proj.iam.gserviceaccount.com";
const GCS_SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_only";

/// What the token endpoint saw: authorization, accept, the form (or body).
type Seen = (String, String, String);
/// How it answers one request, given the request number and what it saw.
type Answer = Arc<dyn Fn(usize, &Seen) -> (u16, String) + Send + Sync>;

struct Endpoint {
    tls: TlsOrigin,
    hits: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn endpoint(host: &str, answer: Answer) -> Endpoint {
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (h, s) = (hits.clone(), seen.clone());
    let service: Handler = Arc::new(move |req: Request<Incoming>| {
        let (h, s, answer) = (h.clone(), s.clone(), answer.clone());
        Box::pin(async move {
            let auth = header(&req, "authorization");
            let accept = header(&req, "accept");
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let got = (auth, accept, String::from_utf8_lossy(&body).into_owned());
            let n = h.fetch_add(1, Ordering::SeqCst) + 1;
            s.lock().unwrap().push(got.clone());
            let (status, text) = answer(n, &got);
            json_response(status, text)
        })
    });
    Endpoint {
        tls: serve_tls(host, &[b"http/1.1"], Arc::default(), service),
        hits,
        seen,
    }
}

impl Endpoint {
    /// The refresh tokens presented to it, in order.
    fn presented(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter_map(|(_, _, form)| form_value(form, "refresh_token"))
            .collect()
    }
}

/// The origin: echoes the `Authorization` it got and `knows`, a secret an origin may hold.
struct Origin {
    tls: TlsOrigin,
    seen: Arc<Mutex<Vec<String>>>,
}

fn origin(knows: String) -> Origin {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let service: Handler = Arc::new(move |req: Request<Incoming>| {
        let (s, knows) = (s.clone(), knows.clone());
        Box::pin(async move {
            let auth = header(&req, "authorization");
            s.lock().unwrap().push(auth.clone());
            let text = json!({ "authorization": auth, "knows": knows }).to_string();
            let mut resp = hyper::Response::new(full(Bytes::from(text)));
            resp.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            resp
        })
    });
    Origin {
        tls: serve_tls("api.test", &[b"http/1.1"], Arc::default(), service),
        seen,
    }
}

struct Setup {
    home: Home,
    daemon: Daemon,
    config: String,
    endpoint: Endpoint,
    origin: Origin,
}

/// The daemon with credential `m` (`inject` is its oauth2 table's fields; `{port}` in it
/// is the endpoint's port) from vault entry `entry`, the token route to `host`.
fn setup(host: &str, inject: &str, entry: &Value, answer: Answer, knows: String) -> Setup {
    let endpoint = endpoint(host, answer);
    let origin = origin(knows);
    let home = Home::new();
    let set = secret_set(&home, "minting", &entry.to_string(), Some(VAULT_KEY));
    assert!(set.status.success());
    let port = endpoint.tls.addr.port();
    let inject = inject.replace("{port}", &port.to_string());
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[credentials]]\nid = \"m\"\nsecret = \"minting\"\ninject = {{ oauth2 = {{ {inject} }} }}\n\
         [[routes]]\nid = \"token\"\nagents = []\nmatch = {{ host = \"{host}\", port = {port} }}\nresolve = \"{}\"\nupstream_ca = \"{}\"\nresponse_timeout = \"3s\"\n\
         [[routes]]\nid = \"api\"\ncredential = \"m\"\nmatch = {{ host = \"api.test\", port = {} }}\nresolve = \"{}\"\nupstream_ca = \"{}\"\n",
        endpoint.tls.addr,
        endpoint.tls.ca_file.display(),
        origin.tls.addr.port(),
        origin.tls.addr,
        origin.tls.ca_file.display(),
    );
    let daemon = start(&home, &config);
    Setup {
        home,
        daemon,
        config,
        endpoint,
        origin,
    }
}

fn start(home: &Home, config: &str) -> Daemon {
    Daemon::start_with(home, Some(config), &[("POSTERN_VAULT_KEY", VAULT_KEY)])
}

impl Setup {
    /// A request as the agent sends it: the placeholder where the token goes.
    fn call(&self) -> (u16, String, String) {
        let ca = self.home.root().join("certs/ca.pem").display().to_string();
        let url = format!("https://api.test:{}/v1/x", self.origin.tls.addr.port());
        curl(&[
            "--cacert",
            &ca,
            "-x",
            &self.daemon.proxy,
            "-H",
            "Authorization: Bearer postern:m",
            &url,
        ])
    }

    fn record(&self, body: &str) -> Value {
        let e: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        let id = e["invocation_id"].as_str().unwrap_or_default().to_owned();
        get_json(&self.daemon.url(&format!("/v1/invocations/{id}")), &[]).1
    }

    /// The log and everything stored (stops the daemon) hold none of `secrets`.
    fn stores_none_of(&mut self, responses: &str, secrets: &[&str]) {
        let log = self.daemon.stderr();
        let stored = stored_text(&mut self.daemon);
        for (name, text) in [("response", responses), ("log", &log), ("journal", &stored)] {
            for secret in secrets {
                assert!(!text.contains(secret), "{secret} in the {name}");
            }
        }
    }
}

/// An RSA key: the private PEM (`genpkey`: PKCS#8, as Google's; `-traditional`: PKCS#1, as
/// GitHub's) and the public one.
fn rsa_key(pkcs1: bool) -> (String, String) {
    let run = |args: &[&str], input: Option<&str>| {
        use std::io::Write;
        let mut child = std::process::Command::new("openssl")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        if let Some(input) = input {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "openssl {args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let private = match pkcs1 {
        true => run(&["genrsa", "-traditional", "2048"], None),
        false => run(
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ],
            None,
        ),
    };
    let public = run(&["pkey", "-pubout"], Some(&private));
    (private, public)
}

/// A base64 line of the key's body (an origin that knows the key echoes it).
fn pem_line(pem: &str) -> String {
    pem.lines().nth(3).unwrap().to_owned()
}

fn form_value(form: &str, name: &str) -> Option<String> {
    form.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| pct_decode(v))
    })
}

fn pct_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&v[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Google's token endpoint, as far as a service account's key file goes: the assertion
/// verified with the public key, its claims checked, a token answered.
fn google(public: String, token_url: Arc<Mutex<String>>) -> Answer {
    Arc::new(move |n, (_, _, form): &Seen| {
        let grant = form_value(form, "grant_type").unwrap_or_default();
        let assertion = form_value(form, "assertion").unwrap_or_default();
        let mut v = Validation::new(Algorithm::RS256);
        v.set_audience(&[token_url.lock().unwrap().clone()]);
        v.set_issuer(&[SA_EMAIL]);
        let key = DecodingKey::from_rsa_pem(public.as_bytes()).unwrap();
        let checked = decode::<Value>(&assertion, &key, &v).ok().filter(|t| {
            let c = &t.claims;
            let (iat, exp) = (
                c["iat"].as_u64().unwrap_or(0),
                c["exp"].as_u64().unwrap_or(0),
            );
            c["scope"] == GCS_SCOPE && exp == iat + 3600 && iat.abs_diff(now()) < 30
        });
        let kid = decode_header(&assertion).ok().and_then(|h| h.kid);
        match grant == "urn:ietf:params:oauth:grant-type:jwt-bearer"
            && checked.is_some()
            && kid.as_deref() == Some("key-1")
        {
            true => (
                200,
                format!(
                    r#"{{"access_token":"ya29.minted-{n}","expires_in":3599,"token_type":"Bearer"}}"#
                ),
            ),
            false => (400, r#"{"error":"invalid_grant"}"#.into()),
        }
    })
}

#[test]
fn a_service_account_key_file_mints_a_google_token() {
    let (private, public) = rsa_key(false);
    let entry = json!({
        "type": "service_account",
        "project_id": "proj",
        "private_key_id": "key-1",
        "private_key": private,
        "client_email": SA_EMAIL,
        "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token",
    });
    let url = Arc::new(Mutex::new(String::new()));
    let inject = format!(
        r#"grant = "jwt_bearer", token_url = "https://oauth2.test:{{port}}/token", scope = "{GCS_SCOPE}""#
    );
    let mut s = setup(
        "oauth2.test",
        &inject,
        &entry,
        google(public, url.clone()),
        pem_line(&private),
    );
    *url.lock().unwrap() = format!("https://oauth2.test:{}/token", s.endpoint.tls.addr.port());
    let (status, body, head) = s.call();
    assert_eq!(status, 200, "{body}{head}");
    assert_eq!(
        s.origin.seen.lock().unwrap().clone(),
        ["Bearer ya29.minted-1"]
    );
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["authorization"], "Bearer [postern:redacted]", "{body}");
    assert_eq!(
        echo["knows"], "[postern:redacted]",
        "the key's line is masked: {body}"
    );
    assert_eq!(s.call().0, 200);
    assert_eq!(
        s.endpoint.hits.load(Ordering::SeqCst),
        1,
        "kept while fresh"
    );
    let secrets = [pem_line(&private), "ya29.minted-1".into()];
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    s.stores_none_of(&format!("{head}{body}"), &secrets);
}

/// SPEC §3.8: google-auth, unchanged, finds the metadata server `postern env` names at
/// `postern.internal`, takes the placeholder as its token, and its calls carry the token
/// postern minted from the service-account key.
#[test]
fn google_auth_finds_its_token_at_the_metadata_server_postern_answers() {
    let (private, public) = rsa_key(false);
    let entry = json!({
        "type": "service_account",
        "project_id": "proj-7",
        "private_key_id": "key-1",
        "private_key": private,
        "client_email": SA_EMAIL,
        "token_uri": "https://oauth2.googleapis.com/token",
    });
    let url = Arc::new(Mutex::new(String::new()));
    let inject = format!(
        r#"grant = "jwt_bearer", token_url = "https://oauth2.test:{{port}}/token", scope = "{GCS_SCOPE}""#
    );
    let s = setup(
        "oauth2.test",
        &inject,
        &entry,
        google(public, url.clone()),
        String::new(),
    );
    *url.lock().unwrap() = format!("https://oauth2.test:{}/token", s.endpoint.tls.addr.port());
    let config = s.home.dir.path().join("postern.toml");
    std::fs::write(&config, &s.config).unwrap();
    let env = s
        .home
        .cli(&["env", "--config", config.to_str().unwrap()], &[]);
    let env = String::from_utf8_lossy(&env.stdout).to_string();
    assert!(
        env.contains("export GCE_METADATA_HOST=postern.internal"),
        "{env}"
    );
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/google_agent.py"))
        .arg(format!(
            "https://api.test:{}/v1/x",
            s.origin.tls.addr.port()
        ))
        .arg(GCS_SCOPE)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", s.home.dir.path());
    for line in env.lines().filter_map(|l| l.strip_prefix("export ")) {
        if let Some((k, v)) = line.split_once('=') {
            cmd.env(k, v.trim_matches('\''));
        }
    }
    for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        cmd.env(name, &s.daemon.proxy);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let got: Value = serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "{text}{}\npostern: {}",
            String::from_utf8_lossy(&out.stderr),
            s.daemon.stderr()
        )
    });
    assert_eq!(
        got["token"], "postern:m",
        "the library holds the placeholder: {got}"
    );
    assert_eq!(got["email"], SA_EMAIL, "{got}");
    assert_eq!(got["project"], "proj-7", "{got}");
    assert_eq!(got["status"], 200, "{got}");
    assert_eq!(
        s.origin.seen.lock().unwrap().clone(),
        ["Bearer ya29.minted-1"],
        "the origin got the minted token"
    );
}

/// A token endpoint refusing the assertion: nothing sent, the code says fix something.
#[test]
fn a_refused_assertion_is_credential_mint_failed() {
    let (private, _) = rsa_key(false);
    let (_, other_public) = rsa_key(false);
    let entry =
        json!({"private_key_id": "key-1", "private_key": private, "client_email": SA_EMAIL});
    let inject = format!(
        r#"grant = "jwt_bearer", token_url = "https://oauth2.test:{{port}}/token", scope = "{GCS_SCOPE}""#
    );
    let url = Arc::new(Mutex::new(String::new()));
    let s = setup(
        "oauth2.test",
        &inject,
        &entry,
        google(other_public, url),
        String::new(),
    );
    let (status, body, _) = s.call();
    let e: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(status, 502, "{body}");
    assert_eq!(e["error"]["code"], "CREDENTIAL_MINT_FAILED", "{body}");
    assert_eq!(e["error"]["retry"], "after_correction", "{body}");
    assert!(s.origin.seen.lock().unwrap().is_empty(), "nothing sent");
    assert_eq!(s.record(&body)["evidence"]["token_status"], 400);
}

/// GitHub's installation token endpoint: the app JWT verified, `token`/`expires_at` back.
fn github(public: String) -> Answer {
    Arc::new(move |n, (auth, accept, _): &Seen| {
        let jwt = auth.strip_prefix("Bearer ").unwrap_or_default();
        let mut v = Validation::new(Algorithm::RS256);
        v.validate_aud = false;
        let key = DecodingKey::from_rsa_pem(public.as_bytes()).unwrap();
        let ok = decode::<Value>(jwt, &key, &v).ok().is_some_and(|t| {
            let c = &t.claims;
            let (iat, exp) = (
                c["iat"].as_u64().unwrap_or(0),
                c["exp"].as_u64().unwrap_or(0),
            );
            c["iss"] == 123456 && exp == iat + 600 && (now() - 60).abs_diff(iat) < 30
        });
        if !ok || accept != "application/vnd.github+json" {
            return (
                401,
                r#"{"message":"A JSON web token could not be decoded"}"#.into(),
            );
        }
        let at = time::OffsetDateTime::from_unix_timestamp(now() as i64 + 3600).unwrap();
        let at = at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        (
            201,
            format!(
                r#"{{"token":"ghs_minted{n}","expires_at":"{at}","permissions":{{"contents":"read"}}}}"#
            ),
        )
    })
}

#[test]
fn a_github_app_key_mints_an_installation_token() {
    let (private, public) = rsa_key(true);
    let entry = json!({"app_id": 123456, "installation_id": 987, "private_key": private});
    let inject = r#"grant = "github_app", token_url = "https://github.test:{port}/app/installations/987/access_tokens""#;
    let mut s = setup(
        "github.test",
        inject,
        &entry,
        github(public),
        pem_line(&private),
    );
    let (status, body, head) = s.call();
    assert_eq!(status, 200, "{body}{head}");
    assert_eq!(
        s.origin.seen.lock().unwrap().clone(),
        ["Bearer ghs_minted1"]
    );
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["authorization"], "Bearer [postern:redacted]", "{body}");
    assert_eq!(echo["knows"], "[postern:redacted]", "{body}");
    assert_eq!(s.call().0, 200);
    assert_eq!(
        s.endpoint.hits.load(Ordering::SeqCst),
        1,
        "kept until expires_at"
    );
    assert_eq!(s.endpoint.seen.lock().unwrap()[0].2, "", "an empty body");
    let line = pem_line(&private);
    s.stores_none_of(&format!("{head}{body}"), &[&line, "ghs_minted1"]);
}

/// An entry whose installation is not the token_url's: refused before anything is asked.
#[test]
fn a_github_app_entry_for_another_installation_mints_nothing() {
    let (private, public) = rsa_key(true);
    let entry = json!({"app_id": 123456, "installation_id": "1", "private_key": private});
    let inject = r#"grant = "github_app", token_url = "https://github.test:{port}/app/installations/987/access_tokens""#;
    let s = setup("github.test", inject, &entry, github(public), String::new());
    let (status, body, _) = s.call();
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("CREDENTIAL_MINT_FAILED"), "{body}");
    assert_eq!(s.endpoint.hits.load(Ordering::SeqCst), 0);
    assert!(s.origin.seen.lock().unwrap().is_empty());
    assert_eq!(s.record(&body)["evidence"]["token_failure"], "material");
}

/// A token endpoint that rotates: each refresh token is good once; presenting a used one
/// revokes the whole family (what Auth0, Okta and others do on reuse).
struct Family {
    current: String,
    used: HashSet<String>,
    revoked: bool,
}

fn rotating(family: Arc<Mutex<Family>>, client_secret: Option<&'static str>) -> Answer {
    rotating_for(family, client_secret, 1)
}

/// `rotating`, with tokens good for `expires_in` seconds.
fn rotating_for(
    family: Arc<Mutex<Family>>,
    client_secret: Option<&'static str>,
    expires_in: u64,
) -> Answer {
    Arc::new(move |n, (auth, _, form): &Seen| {
        let mut f = family.lock().unwrap();
        let presented = form_value(form, "refresh_token").unwrap_or_default();
        let client_ok = match client_secret {
            Some(secret) => {
                let basic = base64::Engine::encode(
                    &base64::engine::general_purpose::STANDARD,
                    format!("app:{secret}"),
                );
                *auth == format!("Basic {basic}") && form_value(form, "client_id").is_none()
            }
            None => auth.is_empty() && form_value(form, "client_id").as_deref() == Some("app"),
        };
        if f.used.contains(&presented) {
            f.revoked = true;
        }
        let grant_ok = form_value(form, "grant_type").as_deref() == Some("refresh_token");
        if f.revoked || !client_ok || !grant_ok || presented != f.current {
            return (400, r#"{"error":"invalid_grant"}"#.into());
        }
        f.used.insert(presented);
        f.current = format!("rt-family-{}", n + 1);
        let next = f.current.clone();
        (
            200,
            format!(
                r#"{{"access_token":"at-minted-{n}","expires_in":{expires_in},"refresh_token":"{next}"}}"#
            ),
        )
    })
}

fn refresh_setup(client_secret: Option<&'static str>) -> (Setup, Arc<Mutex<Family>>) {
    let family = Arc::new(Mutex::new(Family {
        current: "rt-family-1".into(),
        used: HashSet::new(),
        revoked: false,
    }));
    let mut entry = json!({"client_id": "app", "refresh_token": "rt-family-1"});
    if let Some(secret) = client_secret {
        entry["client_secret"] = secret.into();
    }
    let inject = r#"grant = "refresh_token", token_url = "https://idp.test:{port}/oauth/token""#;
    let answer = rotating(family.clone(), client_secret);
    // The origin knows the first refresh token (it may share the identity provider).
    (
        setup("idp.test", inject, &entry, answer, "rt-family-1".into()),
        family,
    )
}

fn vault_version(home: &Home) -> String {
    let out = home.cli(&["secret", "list"], &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_rotated_refresh_token_is_stored_and_used_next() {
    let (mut s, family) = refresh_setup(Some("client-secret-5f2b"));
    let (status, body, head) = s.call();
    assert_eq!(status, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        echo["knows"], "[postern:redacted]",
        "the refresh token is masked: {body}"
    );
    assert!(
        vault_version(&s.home).contains("minting\tversion 2"),
        "stored as a new version"
    );
    // Expired (1 s): the second mint presents the stored rotated token.
    std::thread::sleep(Duration::from_millis(1100));
    let (status, second, _) = s.call();
    assert_eq!(status, 200, "{second}");
    assert!(vault_version(&s.home).contains("minting\tversion 3"));
    let seen = s.origin.seen.lock().unwrap().clone();
    assert_eq!(seen, ["Bearer at-minted-1", "Bearer at-minted-2"]);
    assert!(
        !family.lock().unwrap().revoked,
        "never presented a used token"
    );
    assert_eq!(s.endpoint.presented(), ["rt-family-1", "rt-family-2"]);
    // The second request is bound to version 2: rt-family-1 is revoked by then and no
    // longer guarded; what it holds and what it rotated to are.
    for secret in ["at-minted-2", "rt-family-2", "rt-family-3"] {
        assert!(!second.contains(secret), "{secret}: {second}");
    }
    s.stores_none_of(
        &format!("{head}{body}"),
        &[
            "rt-family-1",
            "rt-family-2",
            "rt-family-3",
            "at-minted-1",
            "client-secret-5f2b",
        ],
    );
}

/// Killed (SIGKILL) right after a rotation, the daemon restarts with the stored token: the
/// endpoint never sees a used one (which would revoke the family: `invalid_grant`).
#[test]
fn a_restart_after_a_rotation_presents_the_new_refresh_token() {
    let (mut s, family) = refresh_setup(None);
    assert_eq!(s.call().0, 200);
    s.daemon.kill();
    s.daemon = start(&s.home, &s.config);
    let (status, body, _) = s.call();
    assert_eq!(status, 200, "{body}");
    assert!(!family.lock().unwrap().revoked, "the family is intact");
    assert_eq!(
        s.origin.seen.lock().unwrap().last().unwrap(),
        "Bearer at-minted-2"
    );
    assert!(vault_version(&s.home).contains("minting\tversion 3"));
}

/// The crash cells around a refresh token's rotation (SPEC §3.8). The token request is
/// postern's own invocation; its result is committed only after the rotated token is stored.
/// Killed right after the request's `DISPATCH_STARTED` (nothing has left), and killed right
/// after its `RESULT_COMMITTED` (the rotation is stored by then): either way the restarted
/// daemon presents a refresh token the endpoint still honours, and the family stays intact.
#[test]
fn a_crash_around_a_token_request_never_presents_a_revoked_refresh_token() {
    for (failpoint, left) in [
        ("DISPATCH_STARTED", "unknown"),
        ("RESULT_COMMITTED", "committed"),
    ] {
        let (mut s, family) = refresh_setup(None);
        s.daemon.kill();
        let envs = [
            ("POSTERN_VAULT_KEY", VAULT_KEY),
            ("POSTERN_CRASH_AFTER", failpoint),
        ];
        s.daemon = Daemon::start_with(&s.home, Some(&s.config), &envs);
        let _ = s.call();
        assert!(
            s.daemon.wait_exit(Duration::from_secs(10)).is_some(),
            "{failpoint}: the failpoint ends the daemon"
        );
        s.daemon = start(&s.home, &s.config);
        let (status, body, _) = s.call();
        assert_eq!(status, 200, "{failpoint}: {body}");
        assert!(
            !family.lock().unwrap().revoked,
            "{failpoint}: the family is intact"
        );
        // The token request the crash cut is on record as the journal proves it.
        let list = s.daemon.cli(&["actions", "list", "--json"], &[]);
        let list: Value = serde_json::from_slice(&list.stdout).unwrap();
        let first = list["invocations"]
            .as_array()
            .unwrap()
            .iter()
            .rfind(|r| r["agent"] == "postern")
            .unwrap_or_else(|| panic!("{list}"))
            .clone();
        assert_eq!(first["outcome"], left, "{failpoint}: {first}");
    }
}

/// SPEC §7: a rotating refresh token used from two fleet nodes. Each node's vault holds the
/// first refresh token; the token one node minted serves the other while it is fresh, and
/// the one that asks next presents the refresh token the other rotated to. One refresh per
/// expiry, the family never revoked.
#[test]
fn a_rotating_refresh_token_used_from_two_fleet_nodes_is_refreshed_once_and_its_family_kept() {
    let pg = crate::fleet::pg::Postgres::start();
    let family = Arc::new(Mutex::new(Family {
        current: "rt-family-1".into(),
        used: HashSet::new(),
        revoked: false,
    }));
    let entry = json!({"client_id": "app", "refresh_token": "rt-family-1"});
    let inject = r#"grant = "refresh_token", token_url = "https://idp.test:{port}/oauth/token""#;
    let answer = rotating_for(family.clone(), None, 3);
    let Setup {
        home,
        daemon,
        config,
        endpoint,
        origin,
    } = setup("idp.test", inject, &entry, answer, "rt-family-1".into());
    let _ = daemon.terminate();
    let node = |id: &str| {
        format!(
            "{config}[cluster]\npostgres = \"{}\"\nnode = \"{id}\"\n",
            pg.url()
        )
    };
    let a = Setup {
        daemon: start(&home, &node("a")),
        home,
        config: String::new(),
        endpoint,
        origin,
    };
    let b_home = Home::new();
    assert!(
        secret_set(&b_home, "minting", &entry.to_string(), Some(VAULT_KEY))
            .status
            .success()
    );
    let b = start(&b_home, &node("b"));
    let call = |home: &Home, daemon: &Daemon| {
        let ca = home.root().join("certs/ca.pem").display().to_string();
        let url = format!("https://api.test:{}/v1/x", a.origin.tls.addr.port());
        let (status, body, _) = curl(&[
            "--cacert",
            &ca,
            "-x",
            &daemon.proxy,
            "-H",
            "Authorization: Bearer postern:m",
            &url,
        ]);
        assert_eq!(status, 200, "{body}");
    };
    call(&a.home, &a.daemon);
    call(&b_home, &b);
    assert_eq!(
        a.endpoint.hits.load(Ordering::SeqCst),
        1,
        "b used the token a minted"
    );
    // Past its lifetime: b asks, with the refresh token a rotated to.
    std::thread::sleep(Duration::from_millis(3100));
    call(&b_home, &b);
    call(&a.home, &a.daemon);
    assert_eq!(a.endpoint.presented(), ["rt-family-1", "rt-family-2"]);
    assert!(
        !family.lock().unwrap().revoked,
        "never presented a used token"
    );
    let seen = a.origin.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "Bearer at-minted-1",
            "Bearer at-minted-1",
            "Bearer at-minted-2",
            "Bearer at-minted-2"
        ]
    );
    // Sealed in the store: no token there in the clear.
    let kept = pg.sql(
        "SELECT coalesce(token_sealed, '') || coalesce(refresh_sealed, '') FROM postern_minted",
    );
    for secret in ["at-minted", "rt-family"] {
        assert!(!kept.contains(secret), "{secret} in the cluster store");
    }
}
