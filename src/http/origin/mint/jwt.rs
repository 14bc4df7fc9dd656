//! The JWTs postern signs with a vault entry's RSA key (RS256): a Google service account's
//! assertion (RFC 7523) and a GitHub App's JWT. Both are sent to the token endpoint only,
//! never to an origin.

use jsonwebtoken::{Algorithm, Header, encode};
use serde_json::{Value, json};

use super::MintFailure;
use super::material::SigningKey;

/// A service-account assertion's lifetime: Google's maximum, one hour.
const ASSERTION_LIFETIME: u64 = 3600;
/// GitHub refuses an app JWT issued "in the future": backdated a minute for clock drift.
const APP_JWT_BACKDATE: u64 = 60;
/// And one valid for more than ten minutes: nine, so drift does not push it over.
const APP_JWT_LIFETIME: u64 = 540;

/// The RS256 assertion of `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`:
/// `iss` the service account, `aud` the token endpoint (or the configured `audience`).
pub fn assertion(
    key: &SigningKey,
    key_id: Option<&str>,
    client_email: &str,
    scope: Option<&str>,
    aud: &str,
    now: u64,
) -> Result<String, MintFailure> {
    let mut claims = json!({
        "iss": client_email,
        "aud": aud,
        "iat": now,
        "exp": now + ASSERTION_LIFETIME,
    });
    if let (Some(scope), Some(map)) = (scope, claims.as_object_mut()) {
        map.insert("scope".into(), scope.into());
    }
    sign(key, key_id, &claims)
}

/// The GitHub App JWT: `iss` the app, valid from a minute ago for nine minutes.
pub fn app_jwt(key: &SigningKey, app_id: &Value, now: u64) -> Result<String, MintFailure> {
    let claims = json!({
        "iss": app_id,
        "iat": now.saturating_sub(APP_JWT_BACKDATE),
        "exp": now + APP_JWT_LIFETIME,
    });
    sign(key, None, &claims)
}

fn sign(key: &SigningKey, key_id: Option<&str>, claims: &Value) -> Result<String, MintFailure> {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = key_id.map(str::to_owned);
    // The library's error names the failure kind only, never the key.
    encode(&header, claims, &key.key)
        .map_err(|e| MintFailure::new("material", format!("signing the JWT: {e}")))
}
