//! A guarded stream that a pause may release. After a pause the caller may send a held
//! tail so a remote waiting for the agent's answer (a prompt, a WebSocket message) is not
//! stalled — but only a tail of at most `RELEASE_AT_MOST` bytes (too short to give a secret
//! away), and matching goes on across it: the rest of a secret split at the pause is still
//! redacted. A longer held tail waits for more bytes or the end of the stream.

use std::time::Duration;

use bytes::Bytes;

use super::{Carry, Mask, ReflectionGuard};

/// How long a quiet stream keeps a short tail back.
pub const PAUSE: Duration = Duration::from_millis(50);

/// The longest held tail a pause releases.
pub const RELEASE_AT_MOST: usize = 3;

/// One stream: what the guard holds back, and how much of it already went out on a
/// pause (it stays held, so a match can still start in it).
#[derive(Default)]
pub struct Paced {
    carry: Carry,
    sent: Vec<u8>,
}

impl Paced {
    pub fn masked(mask: Mask) -> Self {
        Self {
            carry: Carry::masked(mask),
            sent: Vec::new(),
        }
    }

    /// What of `data` can go out now, redacted, and the hits; a possible start waits.
    pub fn pass(&mut self, guard: &ReflectionGuard, data: &[u8]) -> (Bytes, usize) {
        let (out, hits) = guard.redact_stream(&mut self.carry, data);
        (self.unsent(out), hits)
    }

    /// The held-back tail, decided now (at the end of the stream).
    pub fn finish(&mut self, guard: &ReflectionGuard) -> (Bytes, usize) {
        let (out, hits) = guard.finish(&mut self.carry);
        (self.unsent(out), hits)
    }

    /// A short held tail not yet sent waits for a pause to go out.
    pub fn releasable(&self) -> bool {
        self.fresh_tail().is_some()
    }

    /// After a pause: the short held tail goes out (and stays held for matching).
    pub fn release(&mut self) -> Bytes {
        match self.fresh_tail() {
            Some(held) => {
                let fresh = Bytes::copy_from_slice(held.get(self.sent.len()..).unwrap_or_default());
                self.sent = held;
                fresh
            }
            None => Bytes::new(),
        }
    }

    fn fresh_tail(&self) -> Option<Vec<u8>> {
        let held = self.carry.held();
        let fresh = held.len() > self.sent.len() && held.len() <= RELEASE_AT_MOST;
        fresh.then_some(held)
    }

    /// `out` without what already went out on a pause.
    fn unsent(&mut self, out: Bytes) -> Bytes {
        if self.carry.mask() == Mask::SameLength {
            // Byte for byte: what went out covers the same positions, masked or not.
            let n = self.sent.len().min(out.len());
            self.sent.drain(..n);
            return out.slice(n..);
        }
        let common = out
            .iter()
            .zip(self.sent.iter())
            .take_while(|(a, b)| a == b)
            .count();
        if common == out.len() && common < self.sent.len() {
            self.sent.drain(..common);
            return Bytes::new();
        }
        // Diverged: a redaction now covers bytes that went out (they cannot be recalled).
        self.sent.clear();
        out.slice(common..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_same_length_stream_keeps_its_length_across_a_pause_inside_the_secret() {
        let secret = b"sk_live_SuperSecret123";
        for pause_after in 1..secret.len() {
            let Some(guard) = ReflectionGuard::new(secret, secret) else {
                panic!("guard");
            };
            let mut s = Paced::masked(Mask::SameLength);
            let mut seen = s.pass(&guard, b"key: ").0.to_vec();
            seen.extend_from_slice(&s.pass(&guard, &secret[..pause_after]).0);
            seen.extend_from_slice(&s.release());
            seen.extend_from_slice(&s.pass(&guard, &secret[pause_after..]).0);
            seen.extend_from_slice(&s.pass(&guard, b" bye").0);
            seen.extend_from_slice(&s.finish(&guard).0);
            let text = String::from_utf8_lossy(&seen).into_owned();
            assert_eq!(
                text.len(),
                "key: ".len() + secret.len() + " bye".len(),
                "{text}"
            );
            assert!(!text.contains("live_"), "{pause_after}: {text}");
            assert!(text.ends_with("*** bye"), "{pause_after}: {text}");
        }
    }
}
