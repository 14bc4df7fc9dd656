//! The twin index (SPEC §3.7 "Resends"): per agent, route and request fingerprint, the
//! invocation an identical resend would repeat (its *twin*) and when that entry is
//! forgotten (`resend_window` after its last use). An entry is written in the same atomic
//! batch as the preflight of the invocation it names, so the index never names an
//! invocation the journal does not hold; the writer compares the entry with the one the
//! lookup saw, so of two identical requests judged at once only one takes the slot and the
//! other judges again. A refused resend is never written here.
//!
//! Its own keyspaces beside the idempotency key index: a different key, lifetime and
//! sweep, and a lost compare-and-set here is not a key held there.

use serde::{Deserialize, Serialize};

/// Where a twin lives: agent, route, request fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TwinSlot {
    pub agent: String,
    pub route: String,
    pub fingerprint: String,
}

impl TwinSlot {
    /// The stored index key. Agent and route ids and fingerprints hold no NUL byte.
    pub fn index_key(&self) -> Vec<u8> {
        let mut k =
            Vec::with_capacity(self.agent.len() + self.route.len() + self.fingerprint.len() + 2);
        k.extend_from_slice(self.agent.as_bytes());
        k.push(0);
        k.extend_from_slice(self.route.as_bytes());
        k.push(0);
        k.extend_from_slice(self.fingerprint.as_bytes());
        k
    }
}

/// What the index holds for a slot (one small entry per non-idempotent invocation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TwinEntry {
    pub invocation_id: String,
    /// Unix ms after which the entry is forgotten.
    pub expires_at_ms: i64,
}

/// An index write riding an append (or alone, for a refresh).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwinClaim {
    pub slot: TwinSlot,
    pub entry: TwinEntry,
    /// The invocation the lookup saw in the slot (none: empty or expired). The write is
    /// refused (`Refusal::TwinMoved`) when the slot names another one by now.
    pub saw: Option<String>,
}

/// One twin index write in a group commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwinWrite {
    pub index_key: Vec<u8>,
    pub entry: TwinEntry,
    /// The expiry row of the entry this one replaces.
    pub replaces_expiry: Option<i64>,
}

#[cfg(test)]
#[path = "twins/tests.rs"]
mod tests;
