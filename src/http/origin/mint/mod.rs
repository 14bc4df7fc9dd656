//! OAuth2 minted tokens (SPEC §3.8): postern asks the token endpoint for a short-lived access
//! token with the long-lived grant material the vault holds, keeps it until shortly before
//! it expires, and injects it. The agent only ever holds the placeholder.
//!
//! One token request per credential (id, vault version and token config) runs at a time;
//! requests that need the token meanwhile wait for that request's answer rather than each
//! asking again (a token endpoint rate-limits, and a burst of agent requests is normal).
//!
//! `material` reads the vault entry per grant, `grant` builds the token request and reads
//! the answer, `jwt` signs the assertions; a `refresh_token` grant's rotated refresh token
//! is stored back as a new vault version before its access token is handed out (`rotate`).

mod fleet;
mod grant;
mod jwt;
pub(crate) mod material;
mod record;
mod rotate;

pub use material::Material;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http_body_util::{BodyExt, Limited};
use hyper_util::rt::TokioIo;

use material::Token;
use record::TokenInvocation;

use super::inject::Injection;

use super::upstream::{Offer, dial_offering};
use crate::config::{Config, OAuth2};
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

/// Why no token was had: the `CREDENTIAL_MINT_FAILED` evidence, and the operator's words.
#[derive(Debug, Clone)]
pub struct MintFailure {
    /// `connection`, `status`, `body`, `timeout`, `material` (the vault entry cannot make
    /// the request) or `vault` (the entry could not be read or a rotation stored).
    pub stage: &'static str,
    /// The token endpoint's status, when it answered (`4xx` → `after_correction`).
    pub status: Option<u16>,
    /// The connection-setup code, when the endpoint could not be reached.
    pub connect_code: Option<Code>,
    /// Internal only (the journal's `diagnostic`): never the endpoint's body or a secret.
    pub diagnostic: String,
    /// The token request's own invocation, once it was journaled.
    pub invocation: Option<String>,
}

impl MintFailure {
    fn new(stage: &'static str, diagnostic: impl Into<String>) -> Self {
        Self {
            stage,
            status: None,
            connect_code: None,
            diagnostic: diagnostic.into(),
            invocation: None,
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
        if let Some(id) = &self.invocation {
            f.evidence
                .insert("token_invocation".into(), id.clone().into());
        }
        f.diagnostic = Some(format!("credential {credential}: {}", self.diagnostic));
        f
    }
}

/// What one token request needs.
pub struct Ask<'a> {
    pub credential: &'a str,
    /// The vault entry's name (a rotated refresh token is stored under it).
    pub secret: &'a str,
    /// The vault version this request was bound to.
    pub version: u64,
    pub oauth: &'a OAuth2,
    pub material: &'a Material,
}

impl Ask<'_> {
    /// The slot a token is kept in: a new token config is a new slot. The vault version is
    /// not part of it: a token minted from version N serves requests bound to N or older,
    /// and a rotation storing version N+1 keeps its token for requests bound to N+1.
    fn key(&self) -> String {
        let o = self.oauth;
        format!(
            "{}|{}|{}|{:?}|{:?}",
            self.credential,
            o.grant.as_str(),
            o.token_url,
            o.scope,
            o.audience
        )
    }
}

/// An `Ask` the token request's task owns.
struct Owned {
    credential: String,
    secret: String,
    version: u64,
    oauth: OAuth2,
    material: Material,
}

impl Owned {
    fn of(ask: &Ask<'_>) -> Self {
        Self {
            credential: ask.credential.to_owned(),
            secret: ask.secret.to_owned(),
            version: ask.version,
            oauth: ask.oauth.clone(),
            material: ask.material.clone(),
        }
    }

    fn ask(&self) -> Ask<'_> {
        Ask {
            credential: &self.credential,
            secret: &self.secret,
            version: self.version,
            oauth: &self.oauth,
            material: &self.material,
        }
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
    /// Held by the one token request in flight (its task); the others wait on it.
    minting: Arc<tokio::sync::Mutex<()>>,
    /// The token, when it stops being handed out, and the vault version it stands for.
    kept: Mutex<Option<Kept>>,
    /// The last failure and when it happened: a request that waited on that attempt
    /// shares its answer instead of asking again.
    failed: Mutex<Option<(Instant, MintFailure)>>,
    /// `refresh_token`: a rotated refresh token the vault could not store, with the
    /// version it replaces; the next mint presents it (the one stored is revoked).
    unstored: Mutex<Option<(u64, String)>>,
}

struct Kept {
    token: Token,
    until: Instant,
    version: u64,
}

impl Slot {
    /// The kept token if it is fresh and stands for `version` or a later one (a version
    /// the operator set since is minted anew).
    fn fresh(&self, now: Instant, version: u64) -> Option<Token> {
        let kept = self.kept.lock().ok()?;
        kept.as_ref()
            .filter(|k| now < k.until && version <= k.version)
            .map(|k| k.token.clone())
    }

    /// Keeps `token` for `handed_out` from now, standing for vault `version`.
    fn keep(&self, token: Token, handed_out: Duration, version: u64) {
        if let Ok(mut kept) = self.kept.lock() {
            *kept = Some(Kept {
                token,
                until: Instant::now() + handed_out,
                version,
            });
        }
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

    /// The token last kept for this credential, fresh or not (an origin may still hold it).
    pub fn kept(&self, ask: &Ask<'_>) -> Option<Token> {
        let slot = self.slots.lock().ok()?.get(&ask.key())?.clone();
        let kept = slot.kept.lock().ok()?;
        kept.as_ref().map(|k| k.token.clone())
    }

    /// The credential's token: the kept one while fresh, else one minted now (or by the
    /// request in flight this one waited for).
    pub async fn token(
        &self,
        proxy: &Arc<Proxy>,
        config: Arc<Config>,
        ask: &Ask<'_>,
    ) -> Result<Token, MintFailure> {
        let asked = Instant::now();
        let slot = self.slot(ask.key());
        if let Some(t) = slot.fresh(asked, ask.version) {
            return Ok(t);
        }
        let minting = slot.minting.clone().lock_owned().await;
        if let Some(t) = slot.fresh(Instant::now(), ask.version) {
            return Ok(t);
        }
        if let Some(f) = slot.failed_since(asked) {
            return Err(f);
        }
        // The token request is a task of its own, holding the slot: an agent that gives up
        // meanwhile neither cuts it short (a refresh token the endpoint rotated would be
        // lost, the stored one revoked by then) nor lets another request start beside it.
        let owned = Owned::of(ask);
        let (proxy, slot) = (proxy.clone(), slot.clone());
        let task = tokio::spawn(async move {
            let _minting = minting;
            let minted = match fleet::shared_for(&proxy, &owned.ask()) {
                Some(shared) => {
                    fleet::token(&proxy.minter, &proxy, &config, &owned.ask(), &slot, shared).await
                }
                None => proxy
                    .minter
                    .mint(&proxy, &config, &owned.ask(), &slot, None)
                    .await
                    .map(|(token, _)| token),
            };
            if let Err(f) = &minted
                && let Ok(mut failed) = slot.failed.lock()
            {
                *failed = Some((Instant::now(), f.clone()));
            }
            minted
        });
        task.await.unwrap_or_else(|_| {
            Err(MintFailure::new(
                "connection",
                "the token request ended abnormally",
            ))
        })
    }

    /// One token request (the slot's `minting` held), its token kept; and how long it is
    /// handed out. `newest`: a refresh token another fleet node rotated to, presented
    /// instead of the vault's.
    async fn mint(
        &self,
        proxy: &Proxy,
        config: &Config,
        ask: &Ask<'_>,
        slot: &Slot,
        newest: Option<String>,
    ) -> Result<(Token, Duration), MintFailure> {
        let current = rotate::current(proxy, ask, slot, newest).await?;
        let (material, version) = match &current {
            Some((m, v)) => (m, *v),
            None => (ask.material, ask.version),
        };
        let (answer, answered) = request_token(proxy, config, ask, material).await?;
        let serial = self.next_serial();
        // Stored before the token is handed out (a restart never presents a revoked one),
        // and before the token request's result is committed.
        let stored = rotate::store(
            proxy,
            ask.secret,
            material,
            version,
            answer.refresh_token,
            slot,
        )
        .await;
        answered.commit().await;
        let (version, refresh) = stored?;
        let token = Token {
            value: answer.token,
            serial,
            refresh,
        };
        let handed_out = answer.lifetime.saturating_sub(margin(answer.lifetime));
        slot.keep(token.clone(), handed_out, version);
        Ok((token, handed_out))
    }

    fn next_serial(&self) -> u64 {
        self.serial.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The origin answered `401` to a request that carried `token`: the next request mints
    /// anew. A newer token minted meanwhile is kept.
    pub fn forget(&self, ask_key: &str, serial: u64) {
        let slot = self.slots.lock().ok().and_then(|s| s.get(ask_key).cloned());
        let Some(slot) = slot else {
            return;
        };
        if let Ok(mut kept) = slot.kept.lock()
            && kept.as_ref().is_some_and(|k| k.token.serial == serial)
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
/// `via`, `connect_timeout`; `response_timeout` bounds the answer, head and body. It is
/// journaled as postern's own invocation (`record`), named in a failure's evidence.
async fn request_token(
    proxy: &Proxy,
    config: &Config,
    ask: &Ask<'_>,
    material: &Material,
) -> Result<(grant::Answer, Answered), MintFailure> {
    let oauth = ask.oauth;
    let target = token_target(&oauth.token_url)
        .map_err(|why| MintFailure::new("connection", format!("token_url {why}")))?;
    let route = match_token_route(config, &target)
        .ok_or_else(|| MintFailure::new("connection", "no route matches the token_url"))?;
    let hop = super::upstream::bind_hop(config, &proxy.vault, route)
        .map_err(|_| MintFailure::new("connection", "the token route's via credential"))?;
    let req = grant::token_request(
        oauth,
        material,
        &target.path_and_query,
        &target.authority(),
        SystemTime::now(),
    )?;
    let mut record =
        TokenInvocation::accept(&proxy.journal, route, &oauth.token_url, ask.credential);
    let named = |mut m: MintFailure, record: &TokenInvocation| {
        m.invocation = Some(record.id());
        m
    };
    let dialed = dial_offering(
        route,
        &target,
        &proxy.tls,
        &proxy.dns,
        hop.as_ref(),
        Offer::Http1,
    )
    .await;
    let dialed = match dialed {
        Ok(d) => d,
        Err(f) => {
            record.not_sent(f.code).await;
            let mut m = MintFailure::new("connection", format!("token endpoint: {}", f.code));
            m.connect_code = Some(f.code);
            return Err(named(m, &record));
        }
    };
    if let Err(m) = record.dispatch(dialed.address, dialed.tls.clone()).await {
        return Err(named(m, &record));
    }
    let exchange = async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(dialed.stream))
            .await
            .map_err(|e| {
                (
                    Code::RemoteOutcomeUnknown,
                    MintFailure::new("connection", format!("HTTP handshake: {e}")),
                )
            })?;
        tokio::spawn(conn);
        let resp = sender.send_request(req).await.map_err(|e| {
            (
                Code::RemoteOutcomeUnknown,
                MintFailure::new("status", format!("no answer: {e}")),
            )
        })?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_TOKEN_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes());
        Ok::<_, (Code, MintFailure)>((status, body))
    };
    let answered = match tokio::time::timeout(route.response_timeout, exchange).await {
        Ok(answered) => answered,
        Err(_) => Err((
            Code::RemoteTimeout,
            MintFailure::new("timeout", "the token endpoint did not answer in time"),
        )),
    };
    let (status, body) = match answered {
        Ok(a) => a,
        Err((code, m)) => {
            record.unanswered(code).await;
            return Err(named(m, &record));
        }
    };
    let Ok(body) = body else {
        record.unanswered(Code::RemoteResultIncomplete).await;
        let read = grant::read_answer(material, status, None, SystemTime::now());
        return Err(named(
            read.err()
                .unwrap_or_else(|| MintFailure::new("body", "cut short")),
            &record,
        ));
    };
    match grant::read_answer(material, status, Some(body.clone()), SystemTime::now()) {
        Ok(answer) => Ok((
            answer,
            Answered {
                record,
                status,
                body,
            },
        )),
        Err(m) => {
            record.answered(status, &body).await;
            Err(named(m, &record))
        }
    }
}

/// A token the endpoint gave, whose invocation is committed once a rotated refresh token is
/// stored: a crash in between leaves the invocation `unknown`, never a stored rotation
/// behind a committed record.
struct Answered {
    record: TokenInvocation,
    status: u16,
    body: bytes::Bytes,
}

impl Answered {
    async fn commit(mut self) {
        self.record.answered(self.status, &self.body).await;
    }
}

/// `application/x-www-form-urlencoded` value: everything but unreserved characters escaped.
fn form(s: &str) -> String {
    pct_reserved(s.as_bytes(), b"")
}

impl Injection {
    /// `oauth2`: the access token this request carries, kept or minted now (SPEC §3.8).
    /// Other modes: nothing to do.
    pub async fn mint(
        &mut self,
        proxy: &Arc<crate::http::Proxy>,
        config: Arc<Config>,
    ) -> Result<(), MintFailure> {
        let Some(ask) = self.ask() else {
            return Ok(());
        };
        let token = proxy.minter.token(proxy, config, &ask).await?;
        self.token = Some(token);
        Ok(())
    }

    /// `oauth2`: the token last minted for this credential, for a guard (nothing is minted).
    pub fn with_kept_token(mut self, minter: &Minter) -> Self {
        if let Some(ask) = self.ask() {
            self.token = minter.kept(&ask);
        }
        self
    }

    /// What a token request for this credential needs (`oauth2` only).
    fn ask(&self) -> Option<Ask<'_>> {
        let (oauth, material) = self.oauth.as_ref()?;
        Some(Ask {
            credential: &self.id,
            secret: &self.secret_name,
            version: self.secret.version.vault_number(),
            oauth,
            material,
        })
    }

    /// The origin answered `401` to this request: its minted token is dropped, so the next
    /// request mints anew (SPEC §3.8). Other modes: nothing to do.
    pub fn refused_by_origin(&self, minter: &Minter) {
        let (Some(ask), Some(token)) = (self.ask(), &self.token) else {
            return;
        };
        minter.forget(&slot_key(&ask), token.serial);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh 2048-bit RSA key, PKCS#8 PEM (what Google's key files hold).
    pub fn test_rsa_pem() -> String {
        let out = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn the_margin_is_a_tenth_of_a_short_lifetime_and_a_minute_of_a_long_one() {
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(200));
        assert_eq!(margin(Duration::from_secs(3600)), Duration::from_secs(60));
    }

    #[test]
    fn a_token_is_never_printed() {
        let t = Token {
            value: Arc::from("tok-value"),
            serial: 1,
            refresh: Some(Arc::from("rt-value")),
        };
        let shown = format!("{t:?}");
        assert!(!shown.contains("tok-value") && !shown.contains("rt-value"));
    }
}
