//! HTTP's part of `postern retry`: the request each invocation binds is kept at preflight,
//! and sent again, unchanged, as a new generation of the same invocation.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, header};
use http_body_util::BodyExt;
use tokio::sync::oneshot;

use super::intake::AgentBody;
use crate::config::Scheme;
use crate::contract::Code;
use crate::http::Exchange;
use crate::http::Proxy;
use crate::http::origin::inject::Injection;
use crate::journal::{Record, StoredRequest, b64, unb64};
use crate::lifecycle::Invocation;
use crate::lifecycle::lease::LeaseTerms;
use crate::lifecycle::retry::{Resend, SnapshotChanged, credential_holds};
use crate::policy::{Target, acts_now, match_route};

impl Exchange {
    /// Keeps the request for `postern retry`, without the agent's own proxy credential.
    /// It rides the preflight write; a body over `max_result_bytes` is not kept. Every
    /// header the fingerprint covers is kept, in order (it leaves `Proxy-*` out), so the
    /// resent request fingerprints as the bound one; a header that cannot be kept as text
    /// marks the request not resendable.
    pub(in crate::http) async fn keep_request(&self, parts: &http::request::Parts, body: &Bytes) {
        let journal = self.inv.journal();
        let limit = self.config.journal.max_result_bytes;
        let mut headers = Vec::with_capacity(parts.headers.len());
        // A WebSocket handshake is not resent: without the agent there is no one to
        // relay the switched connection to.
        let mut incomplete = self.agent_upgrade.is_some();
        for (name, value) in &parts.headers {
            if name == header::PROXY_AUTHORIZATION {
                continue;
            }
            // The agent's own credential never enters the journal (SPEC §1.8); without it the
            // request cannot be rebuilt, so it is not resendable.
            if name == header::AUTHORIZATION || holds_agent_secret(name.as_str()) {
                incomplete = true;
                continue;
            }
            match value.to_str() {
                Ok(v) => headers.push((name.as_str().to_owned(), v.to_owned())),
                Err(_) => incomplete = true,
            }
        }
        let kept = StoredRequest {
            invocation_id: self.inv.id().to_owned(),
            method: self.method.clone(),
            target: self.target.url(),
            headers,
            body_base64: (body.len() as u64 <= limit).then(|| b64(body)),
            body_bytes: body.len() as u64,
            headers_incomplete: incomplete,
            expires_at_ms: journal.result_expiry_ms(),
        };
        journal.keep_request(kept).await;
    }
}

/// Header names that carry a credential of the agent's own (cookies, API keys, tokens):
/// never journaled. postern's own headers carry none.
fn holds_agent_secret(name: &str) -> bool {
    const MARKS: &[&str] = &[
        "auth",
        "token",
        "secret",
        "passw",
        "cookie",
        "session",
        "api-key",
        "apikey",
        "api_key",
        "signature",
        "credential",
    ];
    !name.starts_with("postern-") && MARKS.iter().any(|m| name.contains(m))
}

/// Sends kept HTTP requests again for `postern retry`.
pub struct HttpResend(pub Arc<Proxy>);

impl Resend for HttpResend {
    fn snapshot_holds(
        &self,
        record: &Record,
        request: &StoredRequest,
    ) -> Result<(), SnapshotChanged> {
        let changed = |why: &str| Err(SnapshotChanged(why.to_owned()));
        let config = &self.0.config();
        let Some(target) = target_of(&request.target) else {
            return changed("the kept target does not parse");
        };
        if !acts_now(config, &record.agent) {
            return changed("the agent is no longer configured");
        }
        let route = match_route(config, &record.agent, &target, &request.method);
        let Some(route) = route.filter(|r| Some(&r.id) == record.route.as_ref()) else {
            return changed("the request no longer matches the route it bound");
        };
        let Some(bound) = &record.evidence.credential else {
            return Ok(());
        };
        credential_holds(bound, &route.credentials, || {
            Injection::resolve(config, &self.0.vault, &bound.id)
                .map(|i| i.evidence().version)
                .map_err(|f| f.code)
        })
    }

    fn terms(&self, record: &Record, note: Option<String>) -> Option<LeaseTerms> {
        let config = self.0.config();
        let route = config
            .routes
            .iter()
            .find(|r| Some(&r.id) == record.route.as_ref())?;
        Some(LeaseTerms::for_route(route, note))
    }

    fn resend(
        &self,
        inv: Invocation,
        record: Record,
        request: StoredRequest,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let proxy = self.0.clone();
        Box::pin(async move {
            let mut inv = inv;
            let Some((target, parts, body)) = rebuild(&request) else {
                // The lease is written: the generation ends with a recorded outcome.
                let diagnostic = "the kept request cannot be rebuilt".to_owned();
                inv.fail_with(Code::MalformedRequest, diagnostic).await;
                return;
            };
            let (tx, rx) = oneshot::channel();
            let run = tokio::spawn(async move {
                let mut ex = Exchange::on(
                    proxy,
                    inv,
                    &record.agent,
                    &target,
                    &parts.method,
                    &parts.headers,
                );
                ex.run(parts, AgentBody::Kept(body), tx).await;
            });
            // The operator's retry is the caller: take the whole answer, then the record.
            if let Ok(resp) = rx.await {
                let mut body = resp.into_body();
                while let Some(Ok(_)) = body.frame().await {}
            }
            let _ = run.await;
        })
    }
}

/// The request as it was bound: target, head and body.
fn rebuild(kept: &StoredRequest) -> Option<(Target, http::request::Parts, Bytes)> {
    let target = target_of(&kept.target)?;
    let method = Method::from_bytes(kept.method.as_bytes()).ok()?;
    let mut headers = HeaderMap::new();
    for (name, value) in &kept.headers {
        let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
        headers.append(name, HeaderValue::from_str(value).ok()?);
    }
    let body = match &kept.body_base64 {
        Some(text) => Bytes::from(unb64(text)?),
        None => Bytes::new(),
    };
    let mut request = Request::builder()
        .method(method)
        .uri(&kept.target)
        .body(())
        .ok()?;
    *request.headers_mut() = headers;
    let (parts, ()) = request.into_parts();
    Some((target, parts, body))
}

fn target_of(url: &str) -> Option<Target> {
    let uri: Uri = url.parse().ok()?;
    let scheme = match uri.scheme_str()? {
        "https" => Scheme::Https,
        "http" => Scheme::Http,
        _ => return None,
    };
    let pq = uri.path_and_query().map_or("/", |p| p.as_str());
    Target::new(scheme, uri.host()?, uri.port_u16(), pq).ok()
}
