//! OAuth2 minted tokens (SPEC §3.8): postern asks the token endpoint for a short-lived access
//! token with the long-lived grant material the vault holds, keeps it until shortly before
//! it expires, and injects it. The agent only ever holds the placeholder.
//!
//! One token request per credential (id, vault version and token config) runs at a time;
//! requests that need the token meanwhile wait for that request's answer rather than each
//! asking again (a token endpoint rate-limits, and a burst of agent requests is normal).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

use super::upstream::{Offer, dial_offering};
use crate::config::{Config, Grant, OAuth2};
use crate::contract::Code;
use crate::guard::pct_reserved;
use crate::http::Proxy;
use crate::journal::Failure;
use crate::policy::{match_token_route, token_target};

/// A token without `expires_in` is kept this long (less the margin below).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// A token is renewed this long before it expires at most (10 % of its lifetime for
/// shorter ones), so one handed to a request does not expire on its way to the origin.
const MAX_MARGIN: Duration = Duration::from_secs(60);
/// The largest token response read (a token response is a small JSON object).
const MAX_TOKEN_BODY: usize = 64 * 1024;
/// Credentials' token slots kept at once; a full table starts over (like the guard cache).
const MAX_SLOTS: usize = 256;

/// The grant material of a `client_credentials` vault entry. Never printed.
pub struct ClientMaterial {
    client_id: String,
    client_secret: String,
}

impl std::fmt::Debug for ClientMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientMaterial([redacted])")
    }
}

impl ClientMaterial {
    /// The vault entry `{"client_id","client_secret"}`; `None` if it is not that.
    pub fn parse(entry: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(entry).ok()?;
        let field = |k: &str| {
            v.get(k)?
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Some(Self {
            client_id: field("client_id")?,
            client_secret: field("client_secret")?,
        })
    }

    pub fn secret(&self) -> &str {
        &self.client_secret
    }

    /// RFC 6749 §2.3.1: both parts form-encoded, then Basic.
    fn basic(&self) -> String {
        let pair = format!("{}:{}", form(&self.client_id), form(&self.client_secret));
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// A minted access token. `serial` tells one mint from another (the guard and a `401`'s
/// drop name it); the value is a secret and is never printed.
#[derive(Clone)]
pub struct Token {
    pub value: Arc<str>,
    pub serial: u64,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(#{}, [redacted])", self.serial)
    }
}

/// Why no token was had: the `CREDENTIAL_MINT_FAILED` evidence, and the operator's words.
#[derive(Debug, Clone)]
pub struct MintFailure {
    /// `connection`, `status`, `body` or `timeout`.
    pub stage: &'static str,
    /// The token endpoint's status, when it answered (`4xx` → `after_correction`).
    pub status: Option<u16>,
    /// The connection-setup code, when the endpoint could not be reached.
    pub connect_code: Option<Code>,
    /// Internal only (the journal's `diagnostic`): never the endpoint's body or a secret.
    pub diagnostic: String,
}

impl MintFailure {
    fn new(stage: &'static str, diagnostic: impl Into<String>) -> Self {
        Self {
            stage,
            status: None,
            connect_code: None,
            diagnostic: diagnostic.into(),
        }
    }

    /// The `FAILED` event's body.
    pub fn failure(&self, credential: &str) -> Failure {
        let mut f = Failure::of(Code::CredentialMintFailed);
        f.evidence.insert("token_failure".into(), self.stage.into());
        if let Some(status) = self.status {
            f.evidence.insert("token_status".into(), status.into());
        }
        if let Some(code) = self.connect_code {
            f.evidence
                .insert("token_connect_code".into(), code.as_str().into());
        }
        f.diagnostic = Some(format!("credential {credential}: {}", self.diagnostic));
        f
    }
}

/// What one token request needs.
pub struct Ask<'a> {
    pub credential: &'a str,
    pub version: crate::contract::SecretVersion,
    pub oauth: &'a OAuth2,
    pub material: &'a ClientMaterial,
}

impl Ask<'_> {
    /// The slot a token is kept in: a new vault version or token config is a new slot.
    fn key(&self) -> String {
        let o = self.oauth;
        format!(
            "{}@{}|{}|{}|{:?}|{:?}",
            self.credential,
            self.version,
            o.grant.as_str(),
            o.token_url,
            o.scope,
            o.audience
        )
    }
}

/// Minted tokens, one slot per credential.
#[derive(Default)]
pub struct Minter {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    serial: AtomicU64,
}

#[derive(Default)]
struct Slot {
    /// Held by the one token request in flight; the others wait on it.
    minting: tokio::sync::Mutex<()>,
    /// The token and when it stops being handed out.
    kept: Mutex<Option<(Token, Instant)>>,
    /// The last failure and when it happened: a request that waited on that attempt
    /// shares its answer instead of asking again.
    failed: Mutex<Option<(Instant, MintFailure)>>,
}

impl Slot {
    fn fresh(&self, now: Instant) -> Option<Token> {
        let kept = self.kept.lock().ok()?;
        kept.as_ref()
            .filter(|(_, until)| now < *until)
            .map(|(t, _)| t.clone())
    }

    fn failed_since(&self, asked: Instant) -> Option<MintFailure> {
        let failed = self.failed.lock().ok()?;
        failed
            .as_ref()
            .filter(|(at, _)| *at >= asked)
            .map(|(_, f)| f.clone())
    }
}

impl Minter {
    fn slot(&self, key: String) -> Arc<Slot> {
        let Ok(mut slots) = self.slots.lock() else {
            return Arc::default();
        };
        if slots.len() >= MAX_SLOTS && !slots.contains_key(&key) {
            slots.clear();
        }
        slots.entry(key).or_default().clone()
    }

    /// The credential's token: the kept one while fresh, else one minted now (or by the
    /// request in flight this one waited for).
    pub async fn token(
        &self,
        proxy: &Proxy,
        config: &Config,
        ask: &Ask<'_>,
    ) -> Result<Token, MintFailure> {
        let asked = Instant::now();
        let slot = self.slot(ask.key());
        if let Some(t) = slot.fresh(asked) {
            return Ok(t);
        }
        let _minting = slot.minting.lock().await;
        if let Some(t) = slot.fresh(Instant::now()) {
            return Ok(t);
        }
        if let Some(f) = slot.failed_since(asked) {
            return Err(f);
        }
        match request_token(proxy, config, ask).await {
            Ok((value, lifetime)) => {
                let serial = self.serial.fetch_add(1, Ordering::Relaxed) + 1;
                let token = Token { value, serial };
                let until = Instant::now() + lifetime.saturating_sub(margin(lifetime));
                if let Ok(mut kept) = slot.kept.lock() {
                    *kept = Some((token.clone(), until));
                }
                Ok(token)
            }
            Err(f) => {
                if let Ok(mut failed) = slot.failed.lock() {
                    *failed = Some((Instant::now(), f.clone()));
                }
                Err(f)
            }
        }
    }

    /// The origin answered `401` to a request that carried `token`: the next request mints
    /// anew. A newer token minted meanwhile is kept.
    pub fn forget(&self, ask_key: &str, serial: u64) {
        let slot = self.slots.lock().ok().and_then(|s| s.get(ask_key).cloned());
        let Some(slot) = slot else {
            return;
        };
        if let Ok(mut kept) = slot.kept.lock()
            && kept.as_ref().is_some_and(|(t, _)| t.serial == serial)
        {
            *kept = None;
        }
    }
}

/// The slot key of a credential's tokens (for `Minter::forget`).
pub fn slot_key(ask: &Ask<'_>) -> String {
    ask.key()
}

/// How long before expiry a token stops being handed out.
fn margin(lifetime: Duration) -> Duration {
    (lifetime / 10).min(MAX_MARGIN)
}

/// One token request through the token endpoint's route: its `resolve`, `upstream_ca`,
/// `via`, `connect_timeout`; `response_timeout` bounds the answer, head and body.
async fn request_token(
    proxy: &Proxy,
    config: &Config,
    ask: &Ask<'_>,
) -> Result<(Arc<str>, Duration), MintFailure> {
    let target = token_target(&ask.oauth.token_url)
        .map_err(|why| MintFailure::new("connection", format!("token_url {why}")))?;
    let route = match_token_route(config, &target)
        .ok_or_else(|| MintFailure::new("connection", "no route matches the token_url"))?;
    let hop = crate::http::exchange::drive::bind_hop(config, &proxy.vault, route)
        .map_err(|_| MintFailure::new("connection", "the token route's via credential"))?;
    let dialed = dial_offering(
        route,
        &target,
        &proxy.tls,
        &proxy.dns,
        hop.as_ref(),
        Offer::Http1,
    )
    .await
    .map_err(|f| {
        let mut m = MintFailure::new("connection", format!("token endpoint: {}", f.code));
        m.connect_code = Some(f.code);
        m
    })?;
    let req = token_request(ask, &target.path_and_query, &target.authority())?;
    let exchange = async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(dialed.stream))
            .await
            .map_err(|e| MintFailure::new("connection", format!("HTTP handshake: {e}")))?;
        tokio::spawn(conn);
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| MintFailure::new("status", format!("no answer: {e}")))?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_TOKEN_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes());
        Ok::<_, MintFailure>((status, body))
    };
    let (status, body) = tokio::time::timeout(route.response_timeout, exchange)
        .await
        .map_err(|_| MintFailure::new("timeout", "the token endpoint did not answer in time"))??;
    read_answer(status, body.ok())
}

/// `POST token_url` with `grant_type=client_credentials` (and `scope`, `audience`), the
/// client authenticated by HTTP Basic (RFC 6749 §2.3.1, the method every server supports).
fn token_request(
    ask: &Ask<'_>,
    path: &str,
    authority: &str,
) -> Result<Request<Full<Bytes>>, MintFailure> {
    let Grant::ClientCredentials = ask.oauth.grant;
    let mut form_body = String::from("grant_type=client_credentials");
    for (name, value) in [
        ("scope", &ask.oauth.scope),
        ("audience", &ask.oauth.audience),
    ] {
        if let Some(v) = value {
            form_body.push_str(&format!("&{name}={}", form(v)));
        }
    }
    let mut auth = HeaderValue::from_str(&ask.material.basic())
        .map_err(|_| MintFailure::new("connection", "client_id or client_secret unusable"))?;
    auth.set_sensitive(true);
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::HOST, authority)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ACCEPT, "application/json")
        .header(header::AUTHORIZATION, auth)
        .body(Full::new(Bytes::from(form_body)))
        .map_err(|_| MintFailure::new("connection", "the token request could not be built"))
}

/// A `2xx` JSON body with a usable `access_token`; its lifetime from `expires_in`.
fn read_answer(status: u16, body: Option<Bytes>) -> Result<(Arc<str>, Duration), MintFailure> {
    if !(200..300).contains(&status) {
        let mut f = MintFailure::new(
            "status",
            format!(
                "the token endpoint answered {status}{}",
                oauth_error(body.as_deref())
            ),
        );
        f.status = Some(status);
        return Err(f);
    }
    let bad_body = |why: &str| {
        let mut f = MintFailure::new("body", format!("token response {why}"));
        f.status = Some(status);
        f
    };
    let body = body.ok_or_else(|| bad_body("body unreadable or too large"))?;
    let json: serde_json::Value =
        serde_json::from_slice(&body).map_err(|_| bad_body("is not JSON"))?;
    let token = json
        .get("access_token")
        .and_then(serde_json::Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| bad_body("has no access_token"))?;
    // It goes into a header: visible ASCII only (never echoed in the diagnostic).
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad_body("access_token holds bytes a header cannot carry"));
    }
    let lifetime = match json.get("expires_in") {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(Duration::from_secs),
        // Some servers send it as a string.
        Some(serde_json::Value::String(s)) => s.parse().ok().map(Duration::from_secs),
        _ => None,
    };
    Ok((Arc::from(token), lifetime.unwrap_or(DEFAULT_LIFETIME)))
}

/// RFC 6749 §5.2's `error` code for the diagnostic, when it is one (a short snake_case
/// word); anything else of the body stays out (it may echo what was sent).
fn oauth_error(body: Option<&[u8]>) -> String {
    let code = body
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
        .and_then(|j| j.get("error")?.as_str().map(str::to_owned))
        .filter(|e| e.len() <= 64 && e.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
    code.map(|c| format!(" ({c})")).unwrap_or_default()
}

/// `application/x-www-form-urlencoded` value: everything but unreserved characters escaped.
fn form(s: &str) -> String {
    pct_reserved(s.as_bytes(), b"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_is_a_tenth_of_a_short_lifetime_and_a_minute_of_a_long_one() {
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(200));
        assert_eq!(margin(Duration::from_secs(3600)), Duration::from_secs(60));
    }

    #[test]
    fn a_token_answer_needs_2xx_json_and_an_access_token() {
        let ok = read_answer(
            200,
            Some(Bytes::from(r#"{"access_token":"t1","expires_in":"30"}"#)),
        );
        let (token, lifetime) = ok.unwrap();
        assert_eq!((&*token, lifetime), ("t1", Duration::from_secs(30)));
        let none = read_answer(200, Some(Bytes::from(r#"{"access_token":"t2"}"#))).unwrap();
        assert_eq!(none.1, DEFAULT_LIFETIME);
        let refused = read_answer(400, Some(Bytes::from(r#"{"error":"invalid_client"}"#)));
        let f = refused.unwrap_err();
        assert_eq!((f.stage, f.status), ("status", Some(400)));
        assert!(f.diagnostic.contains("invalid_client"));
        for body in [r#"{"token":"x"}"#, "not json", r#"{"access_token":"a b"}"#] {
            let f = read_answer(200, Some(Bytes::from(body))).unwrap_err();
            assert_eq!(f.stage, "body", "{body}");
        }
    }

    #[test]
    fn client_material_is_never_printed() {
        let m = ClientMaterial::parse(r#"{"client_id":"id","client_secret":"s3cr3t"}"#).unwrap();
        assert!(!format!("{m:?}").contains("s3cr3t"));
        assert!(ClientMaterial::parse(r#"{"client_id":"id"}"#).is_none());
        let t = Token {
            value: Arc::from("tok-value"),
            serial: 1,
        };
        assert!(!format!("{t:?}").contains("tok-value"));
    }
}
