//! What an exec's remote command sent back, tallied as it passes: every byte hashed and
//! counted, stdout/stderr kept up to `max_result_bytes` for the stored result.

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// The remote's output and how it ended.
#[derive(Default)]
pub(super) struct Output {
    /// Kept chunks, as received: holding a `Bytes` costs no copy, and the stored text is
    /// encoded straight from them at its exact size (a growing buffer would re-copy it).
    stdout: Vec<Bytes>,
    stderr: Vec<Bytes>,
    hasher: Sha256,
    pub bytes: u64,
    overflowed: bool,
    pub exit_status: Option<u32>,
    pub exit_signal: Option<russh::Sig>,
    pub agent_gone: bool,
}

impl Output {
    /// Hashes and counts `data`; keeps it while the total stays within `cap`.
    pub fn absorb(&mut self, data: &Bytes, stderr: bool, cap: u64) {
        self.hasher.update(data);
        self.bytes += data.len() as u64;
        if self.bytes > cap {
            self.overflowed = true;
        }
        if self.overflowed {
            return;
        }
        let kept = if stderr {
            &mut self.stderr
        } else {
            &mut self.stdout
        };
        kept.push(data.clone());
    }

    /// SHA-256 of every byte relayed, stdout and stderr in arrival order.
    pub fn digest(&self) -> [u8; 32] {
        self.hasher.clone().finalize().into()
    }

    /// The kept stdout and stderr, base64 as `journal::b64` writes them; both empty once
    /// the output exceeded the cap (a cut stream is not stored as if it were whole).
    pub fn recorded_base64(&self) -> (String, String) {
        if self.overflowed {
            return (String::new(), String::new());
        }
        (base64_of(&self.stdout), base64_of(&self.stderr))
    }

    /// Whether the whole output is kept for the stored result.
    pub fn stored(&self) -> bool {
        !self.overflowed
    }
}

/// Standard base64 (padded) of the chunks joined, without joining them first.
fn base64_of(chunks: &[Bytes]) -> String {
    use base64::Engine;
    let engine = &base64::engine::general_purpose::STANDARD;
    let total: usize = chunks.iter().map(Bytes::len).sum();
    let mut text = String::with_capacity(total.div_ceil(3) * 4);
    // Up to two bytes a chunk ended with, completed by the next chunk.
    let mut carry: Vec<u8> = Vec::with_capacity(3);
    for chunk in chunks {
        let mut rest: &[u8] = chunk;
        if !carry.is_empty() {
            let (head, tail) = rest.split_at(rest.len().min(3 - carry.len()));
            carry.extend_from_slice(head);
            rest = tail;
            if carry.len() < 3 {
                continue;
            }
            engine.encode_string(&carry, &mut text);
            carry.clear();
        }
        let (whole, tail) = rest.split_at(rest.len() / 3 * 3);
        engine.encode_string(whole, &mut text);
        carry.extend_from_slice(tail);
    }
    engine.encode_string(&carry, &mut text);
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::b64;

    #[test]
    fn base64_across_chunk_boundaries_matches_the_journal_encoding() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for sizes in [
            &[1usize, 1, 1, 997][..],
            &[2, 2, 2, 994],
            &[5, 7, 11, 977],
            &[1000],
        ] {
            let mut chunks = Vec::new();
            let mut at = 0;
            for n in sizes {
                chunks.push(Bytes::copy_from_slice(&data[at..at + n]));
                at += n;
            }
            for keep in 0..=chunks.len() {
                let joined: Vec<u8> = chunks[..keep].concat();
                assert_eq!(base64_of(&chunks[..keep]), b64(&joined), "{sizes:?} {keep}");
            }
        }
    }

    #[test]
    fn keeps_within_the_cap_and_hashes_everything() {
        let mut out = Output::default();
        out.absorb(&Bytes::from_static(b"abc"), false, 6);
        out.absorb(&Bytes::from_static(b"de"), true, 6);
        assert_eq!(out.recorded_base64(), (b64(b"abc"), b64(b"de")));
        assert!(out.stored());
        out.absorb(&Bytes::from_static(b"fg"), false, 6);
        out.absorb(&Bytes::from_static(b"h"), true, 6);
        assert_eq!(out.bytes, 8);
        assert_eq!(out.recorded_base64(), (String::new(), String::new()));
        assert!(!out.stored());
        let whole: [u8; 32] = Sha256::digest(b"abcdefgh").into();
        assert_eq!(out.digest(), whole);
    }
}
