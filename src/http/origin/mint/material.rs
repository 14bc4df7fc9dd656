//! The grant material a minted credential's vault entry holds (SPEC §3.8), one shape per
//! grant. Every field that is a secret stays in here: `Debug` never prints one, and
//! `secrets`/`private_key` hand them to the reflection guard only.

use base64::Engine;
use jsonwebtoken::EncodingKey;
use serde_json::Value;

use crate::config::Grant;

/// A vault entry, parsed for its grant. Never printed.
#[derive(Clone)]
pub enum Material {
    /// `client_credentials`: `{"client_id","client_secret"}`.
    Client(ClientAuth),
    /// `refresh_token`: `{"client_id","client_secret"?,"refresh_token"}`. `entry` is the
    /// whole object, so a rotation stores back every field the operator put there.
    Refresh {
        client: ClientAuth,
        refresh_token: String,
        entry: serde_json::Map<String, Value>,
    },
    /// `jwt_bearer`: a Google service-account key file as downloaded.
    ServiceAccount {
        client_email: String,
        /// `private_key_id`, sent as the assertion's `kid` (Google finds the key by it).
        key_id: Option<String>,
        key: SigningKey,
    },
    /// `github_app`: the app signs its JWT; `installation_id` must be the one in token_url.
    GithubApp {
        /// A number or a string (a client id), as the entry has it: GitHub takes both.
        app_id: Value,
        installation_id: String,
        key: SigningKey,
    },
}

/// A client authenticating to the token endpoint; the secret is optional only for a public
/// client's refresh (its `client_id` then goes in the form).
#[derive(Clone)]
pub struct ClientAuth {
    pub client_id: String,
    pub client_secret: Option<String>,
}

/// An RSA private key: the PEM (for the guard) and the key parsed from it (to sign).
#[derive(Clone)]
pub struct SigningKey {
    pub pem: String,
    pub key: EncodingKey,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Material({}, [redacted])", self.grant().as_str())
    }
}

impl Material {
    /// The entry read for `grant`; the error says what is wrong (a field's name, never
    /// its value).
    pub fn parse(grant: Grant, entry: &str) -> Result<Self, &'static str> {
        let Ok(Value::Object(v)) = serde_json::from_str::<Value>(entry) else {
            return Err("the vault entry is not a JSON object");
        };
        let text = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Ok(match grant {
            Grant::ClientCredentials => Self::Client(ClientAuth {
                client_id: text("client_id").ok_or("no client_id")?,
                client_secret: Some(text("client_secret").ok_or("no client_secret")?),
            }),
            Grant::RefreshToken => Self::Refresh {
                client: ClientAuth {
                    client_id: text("client_id").ok_or("no client_id")?,
                    client_secret: text("client_secret"),
                },
                refresh_token: text("refresh_token").ok_or("no refresh_token")?,
                entry: v.clone(),
            },
            Grant::JwtBearer => Self::ServiceAccount {
                client_email: text("client_email").ok_or("no client_email")?,
                key_id: text("private_key_id"),
                key: SigningKey::parse(text("private_key").ok_or("no private_key")?)?,
            },
            Grant::GithubApp => Self::GithubApp {
                app_id: match v.get("app_id") {
                    Some(id @ Value::Number(_)) => id.clone(),
                    Some(Value::String(s)) if !s.is_empty() => Value::String(s.clone()),
                    _ => return Err("no app_id"),
                },
                installation_id: match v.get("installation_id") {
                    Some(Value::Number(n)) => n.to_string(),
                    Some(Value::String(s)) if !s.is_empty() => s.clone(),
                    _ => return Err("no installation_id"),
                },
                key: SigningKey::parse(text("private_key").ok_or("no private_key")?)?,
            },
        })
    }

    pub fn grant(&self) -> Grant {
        match self {
            Self::Client(_) => Grant::ClientCredentials,
            Self::Refresh { .. } => Grant::RefreshToken,
            Self::ServiceAccount { .. } => Grant::JwtBearer,
            Self::GithubApp { .. } => Grant::GithubApp,
        }
    }

    /// The secrets an origin must never see echoed back: client secret, refresh token.
    pub fn secrets(&self) -> Vec<&str> {
        match self {
            Self::Client(c) => c.client_secret.as_deref().into_iter().collect(),
            Self::Refresh {
                client,
                refresh_token,
                ..
            } => {
                let mut s: Vec<&str> = client.client_secret.as_deref().into_iter().collect();
                s.push(refresh_token);
                s
            }
            Self::ServiceAccount { .. } | Self::GithubApp { .. } => Vec::new(),
        }
    }

    /// The private key's PEM, guarded line by line (`ReflectionGuard::for_pem`'s forms).
    pub fn private_key(&self) -> Option<&str> {
        match self {
            Self::ServiceAccount { key, .. } | Self::GithubApp { key, .. } => Some(&key.pem),
            Self::Client(_) | Self::Refresh { .. } => None,
        }
    }
}

impl ClientAuth {
    /// RFC 6749 §2.3.1: both parts form-encoded, then Basic. `None` for a public client.
    pub fn basic(&self) -> Option<String> {
        let secret = self.client_secret.as_deref()?;
        let pair = format!("{}:{}", super::form(&self.client_id), super::form(secret));
        Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        ))
    }
}

impl SigningKey {
    /// PKCS#8 (`BEGIN PRIVATE KEY`, Google's) or PKCS#1 (`BEGIN RSA PRIVATE KEY`, GitHub's).
    fn parse(pem: String) -> Result<Self, &'static str> {
        let key = EncodingKey::from_rsa_pem(pem.as_bytes())
            .map_err(|_| "private_key is not an RSA private key in PEM")?;
        Ok(Self { pem, key })
    }
}

/// A minted access token. `serial` tells one mint from another (the guard and a `401`'s
/// drop name it); the value is a secret and is never printed.
#[derive(Clone)]
pub struct Token {
    pub value: std::sync::Arc<str>,
    pub serial: u64,
    /// The refresh token the endpoint rotated to with this mint (guarded like the rest).
    pub refresh: Option<std::sync::Arc<str>>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(#{}, [redacted])", self.serial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_grant_names_the_field_it_misses_and_never_prints_a_secret() {
        let cc = Material::parse(
            Grant::ClientCredentials,
            r#"{"client_id":"id","client_secret":"s3cr3t"}"#,
        )
        .unwrap();
        assert!(!format!("{cc:?}").contains("s3cr3t"));
        assert_eq!(cc.secrets(), ["s3cr3t"]);
        let missing = |g, e| Material::parse(g, e).err();
        assert_eq!(
            missing(Grant::ClientCredentials, r#"{"client_id":"id"}"#),
            Some("no client_secret")
        );
        let rt = Material::parse(
            Grant::RefreshToken,
            r#"{"client_id":"id","refresh_token":"rt-1","note":"kept"}"#,
        )
        .unwrap();
        assert_eq!(rt.secrets(), ["rt-1"]);
        assert_eq!(
            missing(Grant::RefreshToken, r#"{"client_id":"id"}"#),
            Some("no refresh_token")
        );
        assert_eq!(
            missing(
                Grant::JwtBearer,
                r#"{"client_email":"a@b","private_key":"x"}"#
            ),
            Some("private_key is not an RSA private key in PEM")
        );
        assert_eq!(
            missing(
                Grant::GithubApp,
                r#"{"installation_id":1,"private_key":"x"}"#
            ),
            Some("no app_id")
        );
        assert_eq!(
            missing(Grant::JwtBearer, "[]"),
            Some("the vault entry is not a JSON object")
        );
    }
}
