//! Credential injection at the egress hop, and the reflection guard that keeps an
//! echoing origin from handing the injected secret back to the agent.

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::config::{Config, Inject};
use crate::contract::{Code, CredentialEvidence};
use crate::vault::{Secret, Vault, VaultError};

pub const REDACTED: &[u8] = b"[postern:redacted]";

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
        Ok(Self {
            id: cred.id.clone(),
            inject: cred.inject.clone(),
            secret,
        })
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

    /// The forms of the secret an origin might echo: raw, base64, URL-encoded.
    pub fn guard(&self) -> ReflectionGuard {
        let v = self.secret.value.as_bytes();
        let std = base64::engine::general_purpose::STANDARD;
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut needles = vec![
            v.to_vec(),
            std.encode(v).into_bytes(),
            url.encode(v).into_bytes(),
            pct(&self.secret.value).into_bytes(),
        ];
        if let Inject::Basic { user } = &self.inject {
            needles.push(
                std.encode(format!("{user}:{}", self.secret.value))
                    .into_bytes(),
            );
        }
        needles.retain(|n| n.len() >= 4);
        needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        needles.dedup();
        ReflectionGuard { needles }
    }
}

/// Replaces every echoed form of the injected secret with `[postern:redacted]`.
#[derive(Default)]
pub struct ReflectionGuard {
    needles: Vec<Vec<u8>>,
}

impl ReflectionGuard {
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// Redacts a streamed chunk. Bytes that could be the start of a secret split
    /// across chunks stay in `carry` until the next chunk decides them.
    pub fn redact_stream(&self, carry: &mut Vec<u8>, chunk: &[u8]) -> (Bytes, usize) {
        if self.needles.is_empty() {
            return (Bytes::copy_from_slice(chunk), 0);
        }
        carry.extend_from_slice(chunk);
        let data = std::mem::take(carry);
        let mut out = Vec::with_capacity(data.len());
        let mut hits = 0;
        let mut i = 0;
        'scan: while i < data.len() {
            let rest = &data[i..];
            for n in &self.needles {
                if rest.starts_with(n) {
                    out.extend_from_slice(REDACTED);
                    i += n.len();
                    hits += 1;
                    continue 'scan;
                }
            }
            if self
                .needles
                .iter()
                .any(|n| rest.len() < n.len() && n.starts_with(rest))
            {
                carry.extend_from_slice(rest);
                break;
            }
            out.push(data[i]);
            i += 1;
        }
        (Bytes::from(out), hits)
    }

    /// Returns the redacted bytes and how many hits were replaced.
    pub fn redact(&self, bytes: &[u8]) -> (Bytes, usize) {
        if self.needles.is_empty() {
            return (Bytes::copy_from_slice(bytes), 0);
        }
        let mut out = Vec::with_capacity(bytes.len());
        let mut hits = 0;
        let mut i = 0;
        'scan: while i < bytes.len() {
            for n in &self.needles {
                if bytes[i..].starts_with(n) {
                    out.extend_from_slice(REDACTED);
                    i += n.len();
                    hits += 1;
                    continue 'scan;
                }
            }
            out.push(bytes[i]);
            i += 1;
        }
        (Bytes::from(out), hits)
    }

    pub fn redact_headers(&self, headers: &mut HeaderMap) -> usize {
        let mut hits = 0;
        for value in headers.values_mut() {
            let (clean, n) = self.redact(value.as_bytes());
            if n > 0 {
                hits += n;
                *value = HeaderValue::from_bytes(&clean)
                    .unwrap_or(HeaderValue::from_static("[postern:redacted]"));
            }
        }
        hits
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(secret: &str) -> ReflectionGuard {
        Injection {
            id: "c".into(),
            inject: Inject::Basic { user: "u".into() },
            secret: Secret {
                value: secret.into(),
                version: 1,
            },
        }
        .guard()
    }

    #[test]
    fn every_echoed_form_is_redacted_and_counted() {
        let g = guard("s3cr/t+val");
        let b64 = base64::engine::general_purpose::STANDARD.encode("s3cr/t+val");
        let basic = base64::engine::general_purpose::STANDARD.encode("u:s3cr/t+val");
        let body = format!("raw=s3cr/t+val b64={b64} pct=s3cr%2Ft%2Bval basic={basic} ok");
        let (clean, hits) = g.redact(body.as_bytes());
        let clean = String::from_utf8(clean.to_vec()).unwrap();
        assert_eq!(hits, 4, "{clean}");
        assert!(!clean.contains("s3cr") && clean.ends_with(" ok"), "{clean}");
    }

    #[test]
    fn a_secret_split_across_chunks_is_still_redacted() {
        let g = guard("tok-abcdef");
        let mut carry = Vec::new();
        let (a, _) = g.redact_stream(&mut carry, b"data: tok-ab");
        assert_eq!(&a[..], b"data: ");
        let (b, hits) = g.redact_stream(&mut carry, b"cdef\n\n");
        assert_eq!((&b[..], hits), (&b"[postern:redacted]\n\n"[..], 1));
        let (c, _) = g.redact_stream(&mut carry, b"event ends\n\n");
        assert_eq!(
            &c[..],
            b"event ends\n\n",
            "nothing held back when no secret could start"
        );
        assert!(carry.is_empty());
    }

    #[test]
    fn headers_are_redacted_too() {
        let g = guard("tok-abcdef");
        let mut h = HeaderMap::new();
        h.insert("x-echo", HeaderValue::from_static("Bearer tok-abcdef"));
        assert_eq!(g.redact_headers(&mut h), 1);
        assert_eq!(h["x-echo"], "Bearer [postern:redacted]");
    }
}
