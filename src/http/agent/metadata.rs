//! The GCE metadata server's token path at `postern.internal` (SPEC §3.8), so Google client
//! libraries run unchanged: with `GCE_METADATA_HOST` and `GCE_METADATA_IP` naming
//! `postern.internal` (from `postern env`), they find a "metadata server" through the proxy
//! and take the credential's placeholder as their access token. postern then injects the
//! token it minted from the service-account key on the routes that use it. Served only to
//! an agent one of whose routes uses a `jwt_bearer` credential; never a secret: the email
//! and project come from the key file's public fields.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use serde_json::json;

use crate::config::{Config, Credential, Grant, Inject};
use crate::http::Proxy;
use crate::http::message::respond::{self, ProxyBody};

const FLAVOR: &str = "metadata-flavor";

/// Whether `path` is the metadata server's: its root (the libraries' ping) or below
/// `/computeMetadata/`.
pub fn is_metadata(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or("");
    path == "/" || path.starts_with("/computeMetadata/")
}

/// Answers a metadata request as GCE's server does (`Metadata-Flavor: Google` both ways).
pub fn respond(proxy: &Proxy, agent: &str, headers: &HeaderMap, path: &str) -> Response<ProxyBody> {
    let config = proxy.config();
    let Some(cred) = service_account(&config, agent) else {
        return answer(StatusCode::NOT_FOUND, "text/plain", "not found".into());
    };
    let asked = headers
        .get(FLAVOR)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"google"));
    if !asked {
        return answer(
            StatusCode::FORBIDDEN,
            "text/plain",
            "Missing Metadata-Flavor:Google header.".into(),
        );
    }
    let path = path.split('?').next().unwrap_or("").trim_end_matches('/');
    let account = "/computeMetadata/v1/instance/service-accounts/";
    let (email, project) = public_fields(proxy, cred);
    match path
        .strip_prefix(account)
        .map(|rest| rest.split_once('/').unwrap_or((rest, "")))
    {
        Some((_, "token")) => {
            let token = json!({"access_token": cred.placeholder, "expires_in": 3600, "token_type": "Bearer"});
            answer(StatusCode::OK, "application/json", token.to_string())
        }
        Some((_, "email")) => answer(StatusCode::OK, "text/plain", email),
        Some((_, "")) => {
            let scopes: Vec<&str> = scope_of(cred).split_whitespace().collect();
            let info = json!({"aliases": ["default"], "email": email, "scopes": scopes});
            answer(StatusCode::OK, "application/json", info.to_string())
        }
        _ if path.is_empty() => answer(StatusCode::OK, "text/plain", "computeMetadata/\n".into()),
        _ if path == "/computeMetadata/v1/project/project-id" => {
            answer(StatusCode::OK, "text/plain", project)
        }
        _ => answer(StatusCode::NOT_FOUND, "text/plain", "not found".into()),
    }
}

/// The first `jwt_bearer` credential on a route that admits `agent`.
pub fn service_account<'c>(config: &'c Config, agent: &str) -> Option<&'c Credential> {
    let ids: Vec<&String> = config
        .routes
        .iter()
        .filter(|r| crate::policy::admits(&r.agents, agent))
        .flat_map(|r| r.credentials.iter())
        .collect();
    config.credentials.iter().find(|c| {
        ids.contains(&&c.id)
            && matches!(&c.inject, Inject::OAuth2(o) if o.grant == Grant::JwtBearer)
    })
}

fn scope_of(cred: &Credential) -> &str {
    match &cred.inject {
        Inject::OAuth2(o) => o.scope.as_deref().unwrap_or(""),
        _ => "",
    }
}

/// The key file's `client_email` and `project_id` (public); empty when it cannot be read.
fn public_fields(proxy: &Proxy, cred: &Credential) -> (String, String) {
    let Ok(secret) = proxy.vault.fetch(&cred.secret) else {
        return (String::new(), String::new());
    };
    let file: serde_json::Value = serde_json::from_str(&secret.value).unwrap_or_default();
    let field = |name: &str| file[name].as_str().unwrap_or_default().to_owned();
    (field("client_email"), field("project_id"))
}

fn answer(status: StatusCode, content_type: &'static str, body: String) -> Response<ProxyBody> {
    let mut r = Response::new(respond::full(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(FLAVOR, HeaderValue::from_static("Google"));
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
