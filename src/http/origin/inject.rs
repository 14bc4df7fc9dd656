//! Credential injection at the egress hop; `guard` keeps an echoing origin from
//! handing the injected secret back to the agent.

use base64::Engine;
use http::{HeaderMap, HeaderName, HeaderValue, header};

use std::sync::Arc;

use crate::guard::{GuardCache, ReflectionGuard, pct_reserved};

use crate::config::{Config, Inject};
use crate::contract::{Code, CredentialEvidence};
use crate::vault::{Secret, Vault, VaultError};

/// A credential bound to one invocation: id, version and mode are evidence; the value is not.
pub struct Injection {
    pub id: String,
    inject: Inject,
    secret: Secret,
}

impl Injection {
    /// Fetches the credential's secret; each failure is one contract code.
    pub fn resolve(config: &Config, vault: &Vault, credential_id: &str) -> Result<Self, Code> {
        let cred = config
            .credentials
            .iter()
            .find(|c| c.id == credential_id)
            .ok_or(Code::CredentialMissing)?;
        if matches!(cred.inject, Inject::SshKey | Inject::SshPassword) {
            return Err(Code::InjectionModeUnsupported);
        }
        let secret = vault.get(&cred.secret).map_err(|e| match e {
            VaultError::Locked => Code::VaultLocked,
            VaultError::Missing(_) => Code::CredentialMissing,
            VaultError::DecryptFailed | VaultError::File(_) => Code::CredentialDecryptFailed,
        })?;
        let injection = Self {
            id: cred.id.clone(),
            inject: cred.inject.clone(),
            secret,
        };
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
                without_param(path_and_query, param);
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
            Inject::SshKey | Inject::SshPassword => return None,
        }
        Some(())
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

    /// One guard for this secret and `other`'s (a route's credential and its hop's).
    pub fn guard_with(
        &self,
        other: &Injection,
        cache: &GuardCache,
    ) -> Option<Arc<ReflectionGuard>> {
        let id = format!("{}@{}+{}", self.id, self.secret.version, other.id);
        cache.get(&id, other.secret.version, || {
            let (a, b) = (self.injected(), other.injected());
            let pairs: [(&[u8], &[u8]); 2] = [
                (self.secret.value.as_bytes(), a.as_bytes()),
                (other.secret.value.as_bytes(), b.as_bytes()),
            ];
            ReflectionGuard::for_each(&pairs)
        })
    }

    /// The guard against echoes of this secret and of the value it is injected as.
    /// `None` only if the automaton cannot be built (the response is then not relayed).
    pub fn guard(&self, cache: &GuardCache) -> Option<Arc<ReflectionGuard>> {
        cache.get(&self.id, self.secret.version, || self.build_guard())
    }

    fn build_guard(&self) -> Option<ReflectionGuard> {
        ReflectionGuard::new(self.secret.value.as_bytes(), self.injected().as_bytes())
    }

    /// The value the secret is injected as.
    fn injected(&self) -> String {
        let value = &self.secret.value;
        match &self.inject {
            Inject::Header { format, .. } => format.replace("{secret}", value),
            Inject::Basic { user } => format!("{user}:{value}"),
            Inject::Query { .. } | Inject::SshKey | Inject::SshPassword => value.clone(),
        }
    }
}

/// Removes every `param=…` from the query (names compared decoded, as the placeholder
/// check reads them).
pub(in crate::http) fn without_param(path_and_query: &mut String, param: &str) {
    let Some((path, query)) = path_and_query.split_once('?') else {
        return;
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| {
            let name = kv.split_once('=').map_or(*kv, |(k, _)| k);
            !crate::policy::placeholder::same_name(name, param)
        })
        .collect();
    *path_and_query = match kept.is_empty() {
        true => path.to_owned(),
        false => format!("{path}?{}", kept.join("&")),
    };
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn pct(s: &str) -> String {
    pct_reserved(s.as_bytes(), b"")
}
