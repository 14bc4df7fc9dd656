//! One token request per grant, and the answer read back (SPEC §3.8).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use http_body_util::Full;

use super::material::{ClientAuth, Material};
use super::{DEFAULT_LIFETIME, MintFailure, form, jwt};
use crate::config::OAuth2;

const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// What a token request sends: the form (empty for GitHub) and the headers of the grant.
struct Asking {
    form: String,
    authorization: Option<String>,
    accept: &'static str,
}

/// The request for `material`'s grant to `path` on `authority`, signed at `now`.
pub fn token_request(
    oauth: &OAuth2,
    material: &Material,
    path: &str,
    authority: &str,
    now: SystemTime,
) -> Result<Request<Full<Bytes>>, MintFailure> {
    let secs = now
        .duration_since(UNIX_EPOCH)
        .map_err(|_| MintFailure::new("material", "the clock is before 1970"))?
        .as_secs();
    let asking = asking(oauth, material, path, secs)?;
    let mut builder = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::HOST, authority)
        .header(header::ACCEPT, asking.accept)
        // GitHub refuses an API request without one; harmless elsewhere.
        .header(header::USER_AGENT, "postern");
    if !asking.form.is_empty() {
        builder = builder.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    }
    if let Some(auth) = asking.authorization {
        let mut auth = HeaderValue::from_str(&auth).map_err(|_| {
            MintFailure::new("material", "client credentials a header cannot carry")
        })?;
        auth.set_sensitive(true);
        builder = builder.header(header::AUTHORIZATION, auth);
    }
    builder
        .body(Full::new(Bytes::from(asking.form)))
        .map_err(|_| MintFailure::new("connection", "the token request could not be built"))
}

fn asking(
    oauth: &OAuth2,
    material: &Material,
    path: &str,
    now: u64,
) -> Result<Asking, MintFailure> {
    let json = "application/json";
    Ok(match material {
        Material::Client(client) => Asking {
            form: with_scope("grant_type=client_credentials", oauth),
            authorization: client.basic(),
            accept: json,
        },
        Material::Refresh {
            client,
            refresh_token,
            ..
        } => {
            let mut form_body = format!(
                "grant_type=refresh_token&refresh_token={}",
                form(refresh_token)
            );
            if let Some(scope) = &oauth.scope {
                form_body.push_str(&format!("&scope={}", form(scope)));
            }
            Asking {
                form: public_client(form_body, client),
                authorization: client.basic(),
                accept: json,
            }
        }
        Material::ServiceAccount {
            client_email,
            key_id,
            key,
        } => {
            let aud = oauth.audience.as_deref().unwrap_or(&oauth.token_url);
            let assertion = jwt::assertion(
                key,
                key_id.as_deref(),
                client_email,
                oauth.scope.as_deref(),
                aud,
                now,
            )?;
            Asking {
                form: format!("grant_type={}&assertion={assertion}", form(JWT_BEARER)),
                authorization: None,
                accept: json,
            }
        }
        Material::GithubApp {
            app_id,
            installation_id,
            key,
        } => {
            // The installation the entry names is the one asked for: a token_url naming
            // another would mint for an installation the operator did not mean.
            if installation_in(path).is_some_and(|id| id != installation_id) {
                return Err(MintFailure::new(
                    "material",
                    "the entry's installation_id is not the one in token_url",
                ));
            }
            Asking {
                form: String::new(),
                authorization: Some(format!("Bearer {}", jwt::app_jwt(key, app_id, now)?)),
                accept: "application/vnd.github+json",
            }
        }
    })
}

/// `grant_type=…` with `scope` and `audience` when configured.
fn with_scope(grant: &str, oauth: &OAuth2) -> String {
    let mut body = grant.to_owned();
    for (name, value) in [("scope", &oauth.scope), ("audience", &oauth.audience)] {
        if let Some(v) = value {
            body.push_str(&format!("&{name}={}", form(v)));
        }
    }
    body
}

/// RFC 6749 §3.2.1: a client without a secret names itself in the form.
fn public_client(mut body: String, client: &ClientAuth) -> String {
    if client.client_secret.is_none() {
        body.push_str(&format!("&client_id={}", form(&client.client_id)));
    }
    body
}

/// The `ID` of `…/installations/ID/access_tokens`, if the path has one.
fn installation_in(path: &str) -> Option<&str> {
    let mut parts = path.split('?').next()?.split('/');
    parts.find(|p| *p == "installations")?;
    parts.next()
}

/// What a token endpoint answered: the token, how long it lives, and a rotated refresh
/// token (a secret: it is stored in the vault, never printed).
pub struct Answer {
    pub token: Arc<str>,
    pub lifetime: Duration,
    pub refresh_token: Option<String>,
}

/// A `2xx` JSON body with a usable token: `access_token` and `expires_in` (OAuth2), or
/// GitHub's `token` and `expires_at` (RFC 3339).
pub fn read_answer(
    material: &Material,
    status: u16,
    body: Option<Bytes>,
    now: SystemTime,
) -> Result<Answer, MintFailure> {
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
    let github = matches!(material, Material::GithubApp { .. });
    let field = if github { "token" } else { "access_token" };
    let token = json
        .get(field)
        .and_then(serde_json::Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| bad_body(&format!("has no {field}")))?;
    // It goes into a header: visible ASCII only (never echoed in the diagnostic).
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad_body("token holds bytes a header cannot carry"));
    }
    let lifetime = match github {
        true => expires_at(&json, now),
        false => expires_in(&json),
    };
    let refresh_token = match material {
        Material::Refresh { .. } => json
            .get("refresh_token")
            .and_then(serde_json::Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_owned),
        _ => None,
    };
    Ok(Answer {
        token: Arc::from(token),
        lifetime: lifetime.unwrap_or(DEFAULT_LIFETIME),
        refresh_token,
    })
}

fn expires_in(json: &serde_json::Value) -> Option<Duration> {
    match json.get("expires_in") {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(Duration::from_secs),
        // Some servers send it as a string.
        Some(serde_json::Value::String(s)) => s.parse().ok().map(Duration::from_secs),
        _ => None,
    }
}

/// GitHub's `expires_at` (an hour on): the time left by this machine's clock, none if it
/// is already past.
fn expires_at(json: &serde_json::Value, now: SystemTime) -> Option<Duration> {
    let at = json.get("expires_at")?.as_str()?;
    let at =
        time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()?;
    let at = UNIX_EPOCH + Duration::from_secs(u64::try_from(at.unix_timestamp()).ok()?);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Grant;

    fn client() -> Material {
        Material::parse(
            Grant::ClientCredentials,
            r#"{"client_id":"id","client_secret":"s"}"#,
        )
        .unwrap()
    }

    #[test]
    fn a_token_answer_needs_2xx_json_and_an_access_token() {
        let now = SystemTime::now();
        let read = |status, body: &str| {
            read_answer(&client(), status, Some(Bytes::from(body.to_owned())), now)
        };
        let ok = read(200, r#"{"access_token":"t1","expires_in":"30"}"#).unwrap();
        assert_eq!((&*ok.token, ok.lifetime), ("t1", Duration::from_secs(30)));
        let none = read(200, r#"{"access_token":"t2"}"#).unwrap();
        assert_eq!(none.lifetime, DEFAULT_LIFETIME);
        let f = read(400, r#"{"error":"invalid_client"}"#).err().unwrap();
        assert_eq!((f.stage, f.status), ("status", Some(400)));
        assert!(f.diagnostic.contains("invalid_client"));
        for body in [r#"{"token":"x"}"#, "not json", r#"{"access_token":"a b"}"#] {
            let f = read(200, body).err().unwrap();
            assert_eq!(f.stage, "body", "{body}");
        }
    }

    #[test]
    fn a_github_answer_is_token_and_expires_at() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = time::OffsetDateTime::from_unix_timestamp(1_800_003_600).unwrap();
        let at = at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let body = format!(r#"{{"token":"ghs_x","expires_at":"{at}"}}"#);
        let Material::GithubApp { .. } = github() else {
            panic!("github material");
        };
        let a = read_answer(&github(), 201, Some(Bytes::from(body)), now).unwrap();
        assert_eq!(
            (&*a.token, a.lifetime),
            ("ghs_x", Duration::from_secs(3600))
        );
        let f = read_answer(
            &github(),
            201,
            Some(Bytes::from(r#"{"access_token":"x"}"#)),
            now,
        );
        assert!(f.err().unwrap().diagnostic.contains("no token"));
    }

    fn github() -> Material {
        let pem = super::super::tests::test_rsa_pem();
        let entry = serde_json::json!({"app_id": 42, "installation_id": "7", "private_key": pem});
        Material::parse(Grant::GithubApp, &entry.to_string()).unwrap()
    }

    #[test]
    fn the_installation_is_read_from_the_token_path() {
        assert_eq!(
            installation_in("/app/installations/77/access_tokens"),
            Some("77")
        );
        assert_eq!(installation_in("/oauth/token"), None);
    }
}
