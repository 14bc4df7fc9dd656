//! What is wrong with an origin's certificate, in words a newcomer can act on. The class is
//! evidence (`tls_problem`); the TLS library's own text stays in the event's `diagnostic`.

use serde::{Deserialize, Serialize};

/// The class of a `TLS_CERTIFICATE_ERROR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TlsProblem {
    /// No trust root postern uses signed the chain (a private CA without `upstream_ca`).
    UntrustedIssuer,
    /// The certificate does not name the host postern connected for.
    NameMismatch,
    Expired,
    NotYetValid,
    Revoked,
}

impl TlsProblem {
    pub const ALL: [TlsProblem; 5] = [
        Self::UntrustedIssuer,
        Self::NameMismatch,
        Self::Expired,
        Self::NotYetValid,
        Self::Revoked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::UntrustedIssuer => "untrusted_issuer",
            Self::NameMismatch => "name_mismatch",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Revoked => "revoked",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The envelope's `message` for this class.
    pub fn message(self) -> &'static str {
        match self {
            Self::UntrustedIssuer => {
                "The origin's certificate issuer is not trusted: for a private CA, set `upstream_ca` on the route."
            }
            Self::NameMismatch => {
                "The origin's certificate does not name the host that was asked for."
            }
            Self::Expired => "The origin's certificate has expired.",
            Self::NotYetValid => "The origin's certificate is not valid yet (is a clock wrong?).",
            Self::Revoked => "The origin's certificate was revoked.",
        }
    }
}
