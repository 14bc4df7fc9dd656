//! `approval = "required"` for an HTTP request: what the operator is shown (method,
//! target, body size and preview), then the lifecycle's hold (SPEC §3.5).

use http::Response;
use tokio::sync::oneshot;

use crate::config::Route;
use crate::contract::{Code, CredentialEvidence};
use crate::http::Exchange;
use crate::http::Proxy;
use crate::http::message::respond::{self, ProxyBody};
use crate::http::origin::inject::Injection;
use crate::journal::{Draft, rfc3339};
use crate::policy::approvals::{
    Approvals, Held, headers_not_shown, hex_head, preview, shown_headers,
};

impl Exchange {
    /// Holds the request (after `drafts`, the preflight) until it is approved and nothing
    /// bound at preflight changed; else the refusal to answer with.
    pub(in crate::http) async fn await_approval(
        &mut self,
        route: &Route,
        fingerprint: &str,
        (body, headers): (&[u8], &http::HeaderMap),
        credential: Option<&str>,
        drafts: &mut Vec<Draft>,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Result<(), Response<ProxyBody>> {
        let now = time::OffsetDateTime::now_utc();
        let held = Held {
            invocation_id: self.inv.id().to_owned(),
            agent: self.agent.clone(),
            route: route.id.clone(),
            method: self.method.clone(),
            target: self.target.url(),
            fingerprint: fingerprint.to_owned(),
            requested_at: rfc3339(now),
            expires_at: rfc3339(now + route.approval_timeout),
            body_bytes: body.len(),
            body_preview: preview(body),
            credential: credential.map(str::to_owned),
            body_hex: hex_head(body),
            headers: shown_headers(headers),
            headers_not_shown: headers_not_shown(headers),
        };
        let approvals = self.proxy.approvals.clone();
        let proxy = self.proxy.clone();
        let bound = self.injection.as_ref().map(Injection::evidence);
        let credential = credential.map(str::to_owned);
        let (held_route, agent) = (route.clone(), self.agent.clone());
        // Asked once the answer is in: a route a reload removed meanwhile (or that no longer
        // admits the agent) is ROUTE_DENIED, a secret rotated while held FINGERPRINT_CHANGED.
        let changed = move || {
            if !crate::policy::still_routes(&proxy.config(), &held_route, &agent) {
                return Some(Code::RouteDenied);
            }
            changed_since_preflight(&proxy, credential.as_deref(), bound)
                .then_some(Code::FingerprintChanged)
        };
        let id = self.inv.id().to_owned();
        let wait = self.inv.await_approval(
            &approvals,
            held,
            route.approval_timeout,
            std::mem::take(drafts),
            changed,
        );
        let answered = watching_the_caller(&approvals, &id, wait, reply).await;
        answered.map_err(|env| respond::envelope(&env))
    }
}

/// Waits for the approval `wait` while the caller waits on `reply`. The hold goes on when
/// the caller leaves (an approval still dispatches and stores the result), but the listing
/// says it left, so an abandoned duplicate is not approved blindly.
pub(in crate::http) async fn watching_the_caller<T>(
    approvals: &Approvals,
    id: &str,
    wait: impl Future<Output = T>,
    reply: &mut oneshot::Sender<Response<ProxyBody>>,
) -> T {
    tokio::pin!(wait);
    let mut gone = false;
    loop {
        tokio::select! {
            answered = &mut wait => return answered,
            () = reply.closed(), if !gone => {
                gone = true;
                approvals.caller_gone(id);
            }
        }
    }
}

/// The credential bound at preflight is no longer the one the vault holds.
fn changed_since_preflight(
    proxy: &Proxy,
    credential: Option<&str>,
    bound: Option<CredentialEvidence>,
) -> bool {
    let (Some(id), Some(bound)) = (credential, bound) else {
        return false;
    };
    match Injection::resolve(&proxy.config(), &proxy.vault, id) {
        Ok(now) => now.evidence() != bound,
        Err(_) => true,
    }
}
