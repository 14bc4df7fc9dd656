//! A secret's non-secret version, as the record binds it (SPEC §2 snapshot binding, §3.8).
//!
//! A vault entry's version is its number (JSON `1`, as journals always held). Other sources
//! have no counter: their version is a short prefix of a keyed digest of the value
//! (`"file:1a2b3c4d5e6f"`), which tells a change without letting anyone test guesses of a
//! low-entropy secret against it.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes of the digest a version keeps (12 hex characters).
pub const DIGEST_PREFIX: usize = 6;

/// Where a digest version's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestOf {
    File,
    Env,
    Command,
}

impl DigestOf {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Env => "env",
            Self::Command => "command",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Self::File, Self::Env, Self::Command]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// Copy, so evidence and cache keys take it as they took the vault's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SecretVersion {
    /// A vault entry's version number.
    Vault(u64),
    /// A keyed digest prefix of a file's, variable's or command's value.
    Digest {
        of: DigestOf,
        prefix: [u8; DIGEST_PREFIX],
    },
}

impl SecretVersion {
    /// A vault entry's version number; a file's, variable's or command's value has none
    /// (0: its versions are digests, not ordered).
    pub fn vault_number(self) -> u64 {
        match self {
            Self::Vault(n) => n,
            Self::Digest { .. } => 0,
        }
    }
}

impl From<u64> for SecretVersion {
    fn from(n: u64) -> Self {
        Self::Vault(n)
    }
}

impl fmt::Display for SecretVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Vault(n) => write!(f, "{n}"),
            Self::Digest { of, prefix } => {
                write!(f, "{}:", of.as_str())?;
                prefix.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

impl std::str::FromStr for SecretVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a secret version (a number or kind:12 hex digits)");
        if let Ok(n) = s.parse::<u64>() {
            return Ok(Self::Vault(n));
        }
        let (kind, hex) = s.split_once(':').ok_or_else(bad)?;
        if kind == "vault" {
            return hex.parse().map(Self::Vault).map_err(|_| bad());
        }
        let of = DigestOf::parse(kind).ok_or_else(bad)?;
        if hex.len() != 2 * DIGEST_PREFIX || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut prefix = [0u8; DIGEST_PREFIX];
        for (i, byte) in prefix.iter_mut().enumerate() {
            let pair = hex.get(2 * i..2 * i + 2).ok_or_else(bad)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
        }
        Ok(Self::Digest { of, prefix })
    }
}

impl Serialize for SecretVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Vault(n) => s.serialize_u64(*n),
            Self::Digest { .. } => s.collect_str(self),
        }
    }
}

/// A number (every journal before secret sources) or the string form.
#[derive(Deserialize)]
#[serde(untagged)]
enum Written {
    Number(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for SecretVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Written::deserialize(d)? {
            Written::Number(n) => Ok(Self::Vault(n)),
            Written::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vault_version_stays_a_number_and_a_digest_is_a_string() {
        let vault = SecretVersion::Vault(7);
        assert_eq!(serde_json::to_string(&vault).ok().as_deref(), Some("7"));
        let digest = SecretVersion::Digest {
            of: DigestOf::File,
            prefix: [0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f],
        };
        let json = serde_json::to_string(&digest).unwrap_or_default();
        assert_eq!(json, "\"file:1a2b3c4d5e6f\"");
        assert_eq!(
            serde_json::from_str::<SecretVersion>(&json).ok(),
            Some(digest)
        );
        assert_eq!(serde_json::from_str::<SecretVersion>("7").ok(), Some(vault));
        assert_eq!(
            serde_json::from_str::<SecretVersion>("\"vault:7\"").ok(),
            Some(vault)
        );
        for bad in [
            "\"file:1a2b\"",
            "\"disk:1a2b3c4d5e6f\"",
            "\"file:+a2b3c4d5e6f\"",
            "-1",
        ] {
            assert!(serde_json::from_str::<SecretVersion>(bad).is_err(), "{bad}");
        }
    }
}
