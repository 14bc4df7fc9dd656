//! The idempotency key index (SPEC §3.4): per route `scope` and agent, which invocation a
//! key belongs to, the fingerprint of the request it stands for, and when the entry
//! expires (`retention` after its last use). A key is claimed in the same atomic write as
//! the preflight that records it, so the index never says more than the journal; the
//! writer checks the claim, so two first uses of one key cannot both win.

use serde::{Deserialize, Serialize};

/// Where a key lives: route scope, agent, key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeySlot {
    pub scope: String,
    pub agent: String,
    pub key: String,
}

impl KeySlot {
    /// The stored index key. Header values, scopes and agent ids hold no NUL byte.
    pub fn index_key(&self) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.scope.len() + self.agent.len() + self.key.len() + 2);
        k.extend_from_slice(self.scope.as_bytes());
        k.push(0);
        k.extend_from_slice(self.agent.as_bytes());
        k.push(0);
        k.extend_from_slice(self.key.as_bytes());
        k
    }
}

/// What the index holds for a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEntry {
    pub invocation_id: String,
    /// The fingerprint of the request the key was first used with (never the key itself).
    pub fingerprint: String,
    /// Unix ms after which the key is forgotten.
    pub expires_at_ms: i64,
}

/// An index write riding an append: a first use claims the key, a later use moves its
/// expiry on. Refused (`Refusal::KeyHeld`) while another invocation holds the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyClaim {
    pub slot: KeySlot,
    pub entry: KeyEntry,
}

/// One index write in a group commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyWrite {
    pub index_key: Vec<u8>,
    pub entry: KeyEntry,
    /// The expiry row of the entry this one replaces.
    pub replaces_expiry: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Journal, JournalError};

    #[test]
    fn index_keys_separate_their_parts() {
        let a = KeySlot {
            scope: "s".into(),
            agent: "ab".into(),
            key: "c".into(),
        };
        let b = KeySlot {
            scope: "s".into(),
            agent: "a".into(),
            key: "bc".into(),
        };
        assert_ne!(a.index_key(), b.index_key());
    }

    use crate::journal::{Accepted, Body, Draft, JournalOptions, Protocol, Refusal};

    fn open(dir: &std::path::Path) -> Journal {
        crate::journal::open_for_test(dir, JournalOptions::default()).0
    }

    fn accepted() -> Vec<Draft> {
        vec![Draft::observed(Body::ActionAccepted(Accepted {
            agent: "ci".into(),
            protocol: Protocol::Https,
            method: Some("POST".into()),
            target: "https://api.test/pay".into(),
            command: None,
        }))]
    }

    fn claim(id: &str, expires_at_ms: i64) -> KeyClaim {
        KeyClaim {
            slot: KeySlot {
                scope: "payments".into(),
                agent: "ci".into(),
                key: "k1".into(),
            },
            entry: KeyEntry {
                invocation_id: id.into(),
                fingerprint: "sha256:f".into(),
                expires_at_ms,
            },
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => panic!("runtime: {e}"),
        }
    }

    #[test]
    fn a_key_is_claimed_once_durably_and_forgotten_after_its_retention() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let rt = rt();
        let later = i64::MAX / 2;
        let (a, b) = (
            crate::journal::new_invocation_id(),
            crate::journal::new_invocation_id(),
        );
        {
            let j = open(dir.path());
            let first = rt.block_on(j.append_claiming(&a, accepted(), claim(&a, later)));
            assert!(first.is_ok(), "{first:?}");
            let second = rt.block_on(j.append_claiming(&b, accepted(), claim(&b, later)));
            assert_eq!(
                second.err(),
                Some(JournalError::Refused(Refusal::KeyHeld(a.clone())))
            );
            assert_eq!(
                j.events(&b).map(|e| e.len()).ok(),
                Some(0),
                "nothing written"
            );
            let touched = rt.block_on(j.touch_key(claim(&a, later + 1)));
            assert!(touched.is_ok(), "{touched:?}");
        }
        let j = open(dir.path());
        let slot = claim(&a, 0).slot;
        let entry = j.key_entry(&slot).ok().flatten();
        assert_eq!(
            entry.map(|e| (e.invocation_id, e.expires_at_ms)),
            Some((a.clone(), later + 1))
        );
        // Expired: reads as unseen, may be claimed anew, and the sweep removes it.
        let touched = rt.block_on(j.touch_key(claim(&a, 1)));
        assert!(touched.is_ok());
        assert_eq!(j.key_entry(&slot).ok().flatten(), None);
        let again = rt.block_on(j.append_claiming(&b, accepted(), claim(&b, 2)));
        assert!(again.is_ok(), "{again:?}");
        assert_eq!(rt.block_on(j.expire_keys()).ok(), Some(1));
        assert_eq!(j.store.key_entry(&slot.index_key()).ok().flatten(), None);
    }
}
