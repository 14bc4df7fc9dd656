//! The reflection guard (SPEC §1.8) over a remote command's output. A command can print
//! the injected password (or the key) back, whole or partly escaped; stdout and stderr
//! are separate streams, each with its own held-back tail (a possible start of a form,
//! or an escape cut off by the message's end), and both are screened before a byte
//! reaches the agent or the stored result. The count of hits is evidence, never the value.
//!
//! Latency over completeness: the caller releases a held tail after a short pause, so a
//! command waiting for the agent's answer is not stalled. A form (or one escape) split
//! across such a pause is not seen whole: each part goes out as it is.

use std::sync::Arc;

use bytes::Bytes;

use crate::guard::{Carry, ReflectionGuard};

#[derive(Default)]
pub struct Screen {
    guard: Arc<ReflectionGuard>,
    stdout: Carry,
    stderr: Carry,
    hits: usize,
}

impl Screen {
    pub fn new(guard: Arc<ReflectionGuard>) -> Self {
        Self {
            guard,
            ..Self::default()
        }
    }

    /// What of `data` can go out now, redacted; a possible start of the secret waits.
    pub fn pass(&mut self, data: &[u8], stderr: bool) -> Bytes {
        let carry = if stderr {
            &mut self.stderr
        } else {
            &mut self.stdout
        };
        let (out, hits) = self.guard.redact_stream(carry, data);
        self.hits += hits;
        out
    }

    /// Some output is held back as a possible start of the secret.
    pub fn holding(&self) -> bool {
        !self.stdout.is_empty() || !self.stderr.is_empty()
    }

    /// The held-back tails of stdout and stderr, decided now (at the end of the output, or
    /// after a pause).
    pub fn finish(&mut self) -> (Bytes, Bytes) {
        let (stdout, a) = self.guard.finish(&mut self.stdout);
        let (stderr, b) = self.guard.finish(&mut self.stderr);
        self.hits += a + b;
        (stdout, stderr)
    }

    /// `redactions` for the record, when there were any.
    pub fn evidence(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut evidence = serde_json::Map::new();
        if self.hits > 0 {
            evidence.insert("redactions".into(), self.hits.into());
        }
        evidence
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_split_across_chunks_and_streams_is_redacted_and_counted() {
        let guard = ReflectionGuard::new(b"hunter2-pw", b"hunter2-pw").unwrap();
        let mut s = Screen::new(Arc::new(guard));
        let mut stdout = s.pass(b"you said hunt", false).to_vec();
        let stderr = s.pass(b"warn: hunter2-pw\n", true);
        stdout.extend_from_slice(&s.pass(b"er2-pw!\n", false));
        let (tail_out, tail_err) = s.finish();
        stdout.extend_from_slice(&tail_out);
        assert_eq!(stdout, b"you said [postern:redacted]!\n");
        assert_eq!(&stderr[..], b"warn: [postern:redacted]\n");
        assert!(tail_err.is_empty());
        assert_eq!(s.evidence()["redactions"], 2);
    }

    #[test]
    fn a_partly_escaped_password_split_inside_an_escape_is_redacted() {
        let guard = ReflectionGuard::new(b"hunter2-pw", b"hunter2-pw").unwrap();
        let mut s = Screen::new(Arc::new(guard));
        let mut stdout = s.pass(b"pw: hunt\\x6", false).to_vec();
        stdout.extend_from_slice(&s.pass(b"5r2%2Dpw\n", false));
        let (tail, _) = s.finish();
        stdout.extend_from_slice(&tail);
        assert_eq!(stdout, b"pw: [postern:redacted]\n");
        assert_eq!(s.evidence()["redactions"], 1);
    }

    #[test]
    fn a_held_tail_that_never_completes_the_secret_goes_out_at_the_end() {
        let guard = ReflectionGuard::new(b"hunter2-pw", b"hunter2-pw").unwrap();
        let mut s = Screen::new(Arc::new(guard));
        let now = s.pass(b"ends with hunt", false);
        assert_eq!(&now[..], b"ends with ");
        let (tail, _) = s.finish();
        assert_eq!(&tail[..], b"hunt");
        assert!(s.evidence().is_empty());
    }
}
