//! Credential injection at the egress hop; `guard` keeps an echoing origin from
//! handing the injected secret back to the agent.

use base64::Engine;
use http::{HeaderMap, HeaderName, HeaderValue, header};

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use super::mint::material::{Material, Token};
use super::sigv4::{self, KeyPair};
use crate::policy::sigv4::Scope;

use crate::guard::{GuardCache, ReflectionGuard, pct_reserved};

use crate::config::{Config, Grant, Inject, OAuth2, SecretSource};
use crate::contract::{Code, CredentialEvidence};
use crate::journal::Failure;
use crate::vault::{Secret, Vault};

/// A credential bound to one invocation: id, version and mode are evidence; the value is not.
pub struct Injection {
    pub id: String,
    inject: Inject,
    /// The vault entry's name (a minted credential's rotation writes it).
    pub(in crate::http) secret_name: String,
    pub(in crate::http) secret: Secret,
    /// `aws_sigv4`: the key pair the vault entry holds, and the scope it last signed for.
    aws: Option<KeyPair>,
    signed: OnceLock<Scope>,
    /// `oauth2`: the grant material the vault entry holds, and the token minted for this
    /// request (`mint`), which `apply` injects.
    pub(in crate::http) oauth: Option<(OAuth2, Material)>,
    pub(in crate::http) token: Option<Token>,
}

impl Injection {
    /// Fetches the credential's secret; each failure is one contract code (with the
    /// secret source's evidence and diagnostic).
    pub fn resolve(config: &Config, vault: &Vault, credential_id: &str) -> Result<Self, Failure> {
        let cred = config
            .credentials
            .iter()
            .find(|c| c.id == credential_id)
            .ok_or(Code::CredentialMissing)?;
        if matches!(cred.inject, Inject::SshKey | Inject::SshPassword) {
            return Err(Code::InjectionModeUnsupported.into());
        }
        let secret = vault.fetch(&cred.secret).map_err(|e| e.failure(&cred.id))?;
        let aws = match cred.inject {
            Inject::AwsSigv4 { .. } => {
                Some(KeyPair::parse(&secret.value).ok_or(Code::InjectionModeUnsupported)?)
            }
            _ => None,
        };
        let oauth = match &cred.inject {
            Inject::OAuth2(o) => Some((
                o.clone(),
                Material::parse(o.grant, &secret.value)
                    .map_err(|_| Code::InjectionModeUnsupported)?,
            )),
            _ => None,
        };
        let injection = Self {
            id: cred.id.clone(),
            inject: cred.inject.clone(),
            secret_name: match &cred.secret {
                SecretSource::Vault(name) => name.clone(),
                _ => String::new(),
            },
            secret,
            aws,
            signed: OnceLock::new(),
            oauth,
            token: None,
        };
        if injection.oauth.is_some() {
            // Its token is checked when minted (`mint::read_answer`).
            return Ok(injection);
        }
        // A value a header cannot carry (CR, LF, NUL) is refused at preflight, not sent.
        let mut probe = (HeaderMap::new(), String::new());
        injection
            .apply(&mut probe.0, &mut probe.1)
            .ok_or(Code::InjectionModeUnsupported)?;
        Ok(injection)
    }

    pub fn evidence(&self) -> CredentialEvidence {
        CredentialEvidence {
            id: self.id.clone(),
            version: self.secret.version,
            mode: self.inject.mode().to_owned(),
        }
    }

    /// Attaches the credential to the outgoing request.
    pub fn apply(&self, headers: &mut HeaderMap, path_and_query: &mut String) -> Option<()> {
        let value = &self.secret.value;
        match &self.inject {
            Inject::Header { name, format } => {
                let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
                let mut v = HeaderValue::from_str(&format.replace("{secret}", value)).ok()?;
                v.set_sensitive(true);
                headers.insert(name, v);
            }
            Inject::Basic { user } => {
                let token =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{value}"));
                let mut v = HeaderValue::from_str(&format!("Basic {token}")).ok()?;
                v.set_sensitive(true);
                headers.insert(header::AUTHORIZATION, v);
            }
            Inject::Query { param } => {
                // A placeholder the agent sent there gives way to the secret.
                crate::policy::placeholder::without_param(path_and_query, param);
                let sep = if path_and_query.contains('?') {
                    '&'
                } else {
                    '?'
                };
                path_and_query.push(sep);
                path_and_query.push_str(&pct(param));
                path_and_query.push('=');
                path_and_query.push_str(&pct(value));
            }
            // Signed last, over the request as it leaves (`sign`).
            Inject::AwsSigv4 { .. } => {}
            // Never sent without its token: `mint` comes first.
            Inject::OAuth2(o) => {
                let token = self.token.as_ref()?;
                let name = HeaderName::from_bytes(o.header.as_bytes()).ok()?;
                let mut v =
                    HeaderValue::from_str(&o.format.replace("{token}", &token.value)).ok()?;
                v.set_sensitive(true);
                headers.insert(name, v);
            }
            Inject::SshKey | Inject::SshPassword => return None,
        }
        Some(())
    }

    /// `aws_sigv4`: replaces the agent's signature with the real key pair's, once every
    /// header postern sets is in place. Other modes: nothing to do.
    pub fn sign(
        &self,
        req: &sigv4::Outgoing<'_>,
        path_and_query: &mut String,
        headers: &mut HeaderMap,
    ) -> Option<()> {
        let Some(keys) = &self.aws else {
            return Some(());
        };
        let scope = sigv4::resign(keys, req, path_and_query, headers, SystemTime::now()).ok()?;
        let _ = self.signed.set(scope);
        Some(())
    }

    /// Whether this request can carry the credential: a SigV4 upload signed chunk by chunk
    /// cannot yet (`INJECTION_MODE_UNSUPPORTED`, nothing sent).
    pub fn takes(&self, headers: &HeaderMap, path_and_query: &str) -> Result<(), Code> {
        match self.aws.is_none() || sigv4::signable(headers, path_and_query) {
            true => Ok(()),
            false => Err(Code::InjectionModeUnsupported),
        }
    }

    /// The `Proxy-Authorization` value for a `via` hop (`basic` mode only).
    pub fn proxy_authorization(&self) -> Option<HeaderValue> {
        let Inject::Basic { user } = &self.inject else {
            return None;
        };
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{user}:{}", self.secret.value));
        let mut v = HeaderValue::from_str(&format!("Basic {token}")).ok()?;
        v.set_sensitive(true);
        Some(v)
    }

    /// Whether `bytes` hold some form of this secret (unsure counts as yes).
    pub fn reflected_in(&self, bytes: &[u8]) -> bool {
        self.build_guard().is_none_or(|g| g.is_match(bytes))
    }

    /// One guard for several credentials' secrets (a route's, its hop's, the host's
    /// others): each secret with the value it is injected as.
    pub fn guard_all(all: &[&Injection], cache: &GuardCache) -> Option<Arc<ReflectionGuard>> {
        let (first, one) = match all {
            [] => return Some(ReflectionGuard::none()),
            [one] => return one.guard(cache),
            [first, ..] => (first, all),
        };
        let id: Vec<String> = one
            .iter()
            .map(|i| format!("{}@{}", i.guard_id(), i.secret.version))
            .collect();
        cache.get(&id.join("+"), first.secret.version, || {
            let parts: Vec<GuardParts> = one.iter().map(|i| i.guard_parts()).collect();
            let pairs: Vec<(&[u8], &[u8])> = parts
                .iter()
                .flat_map(|p| p.pairs.iter())
                .map(|(s, v)| (s.as_slice(), v.as_slice()))
                .collect();
            // One signing key per guard: a second credential with one is rare enough.
            let pem = parts.iter().find_map(|p| p.pem.as_deref());
            ReflectionGuard::for_each_and_pem(&pairs, pem)
        })
    }

    /// The guard against echoes of this secret and of the value it is injected as.
    /// `None` only if the automaton cannot be built (the response is then not relayed).
    pub fn guard(&self, cache: &GuardCache) -> Option<Arc<ReflectionGuard>> {
        cache.get(&self.guard_id(), self.secret.version, || self.build_guard())
    }

    /// A SigV4 guard also holds the key derived for the scope signed, so it is kept per scope.
    fn guard_id(&self) -> String {
        if let Some(t) = &self.token {
            // A minted token is a secret of its own: one guard per token.
            return format!("{}#{}", self.id, t.serial);
        }
        match self.signed.get() {
            Some(s) => format!("{}/{}/{}", self.id, s.region, s.service),
            None => self.id.clone(),
        }
    }

    fn build_guard(&self) -> Option<ReflectionGuard> {
        let parts = self.guard_parts();
        let pairs: Vec<(&[u8], &[u8])> = parts
            .pairs
            .iter()
            .map(|(s, v)| (s.as_slice(), v.as_slice()))
            .collect();
        ReflectionGuard::for_each_and_pem(&pairs, parts.pem.as_deref())
    }

    /// What this credential's guard looks for: each secret with the value it is injected
    /// as. SigV4: the secret key and the key derived for the scope signed. Minted: the
    /// client secret and refresh token (never sent to the origin, but an origin may know
    /// them), a refresh token rotated to, the private key's lines, and the token, raw and
    /// as injected.
    fn guard_parts(&self) -> GuardParts {
        let same = |s: Vec<u8>| (s.clone(), s);
        if let Some(keys) = &self.aws {
            let pairs = keys.secrets(self.signed.get()).into_iter().map(same);
            return GuardParts {
                pairs: pairs.collect(),
                pem: None,
            };
        }
        let injected = self.injected().into_bytes();
        let Some((_, material)) = &self.oauth else {
            let pairs = vec![(self.secret.value.as_bytes().to_vec(), injected)];
            return GuardParts { pairs, pem: None };
        };
        let token = self.token.as_ref();
        let rotated = token.and_then(|t| t.refresh.clone());
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = (material.secrets().into_iter())
            .chain(rotated.as_deref())
            .map(|s| same(s.as_bytes().to_vec()))
            .collect();
        if let Some(t) = token.filter(|t| !t.value.is_empty()) {
            pairs.push((t.value.to_string().into_bytes(), injected));
        }
        GuardParts {
            pairs,
            pem: material.private_key().map(str::to_owned),
        }
    }

    /// The value the secret is injected as.
    fn injected(&self) -> String {
        let value = &self.secret.value;
        match &self.inject {
            Inject::Header { format, .. } => format.replace("{secret}", value),
            Inject::Basic { user } => format!("{user}:{value}"),
            Inject::OAuth2(o) => match &self.token {
                Some(t) => o.format.replace("{token}", &t.value),
                None => String::new(),
            },
            Inject::Query { .. }
            | Inject::SshKey
            | Inject::SshPassword
            | Inject::AwsSigv4 { .. } => value.clone(),
        }
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn pct(s: &str) -> String {
    pct_reserved(s.as_bytes(), b"")
}

/// A credential that could not be had. The secret's name goes only to the event's internal
/// `diagnostic` (the operator's view), never into the envelope (SPEC §1.8).
pub(in crate::http) fn credential_failure(
    config: &Config,
    credential: &str,
    mut failure: Failure,
) -> Failure {
    if failure.code == Code::InjectionModeUnsupported && failure.diagnostic.is_none() {
        let inject = config
            .credentials
            .iter()
            .find(|c| c.id == credential)
            .map(|c| &c.inject);
        failure.diagnostic = Some(format!("credential {credential}: {}", unsupported(inject)));
    }
    failure
}

/// Why a credential cannot be injected here, by its mode.
fn unsupported(inject: Option<&Inject>) -> &'static str {
    match inject {
        Some(Inject::AwsSigv4 { .. }) => {
            "its vault entry must be JSON {\"access_key_id\", \"secret_access_key\", \"session_token\"?}, and the request signed by an AWS SDK with the placeholder (an upload signed chunk by chunk is not re-signed yet)"
        }
        Some(Inject::OAuth2(o)) => match o.grant {
            Grant::ClientCredentials => {
                "its vault entry must be JSON {\"client_id\", \"client_secret\"}"
            }
            Grant::RefreshToken => {
                "its vault entry must be JSON {\"client_id\", \"client_secret\"?, \"refresh_token\"}"
            }
            Grant::JwtBearer => {
                "its vault entry must be a service-account key file: JSON with \"client_email\" and an RSA \"private_key\" in PEM"
            }
            Grant::GithubApp => {
                "its vault entry must be JSON {\"app_id\", \"installation_id\", \"private_key\"} with an RSA key in PEM"
            }
        },
        Some(Inject::SshKey | Inject::SshPassword) => {
            "an SSH credential cannot be put on an HTTP request"
        }
        _ => {
            "its secret holds bytes an HTTP header cannot carry (CR, LF, NUL or other control characters)"
        }
    }
}

/// A credential's guard before it is built: secrets with their injected values, and a
/// signing key's PEM.
struct GuardParts {
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    pem: Option<String>,
}
