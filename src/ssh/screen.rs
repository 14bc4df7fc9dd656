//! The reflection guard (SPEC §1.8) over a remote command's output. A command can print
//! the injected password (or the key) back, whole or partly escaped; stdout and stderr
//! are separate streams, each with its own held-back tail (a possible start of a form,
//! or an escape cut off by the message's end), and both are screened before a byte
//! reaches the agent or the stored result. The count of hits is evidence, never the value.
//!
//! A pause may release a short held tail (`guard::Paced`), so a command waiting for the
//! agent's answer is not stalled.

use std::sync::Arc;

use bytes::Bytes;

use crate::guard::{Paced, ReflectionGuard};

#[derive(Default)]
pub struct Screen {
    guard: Arc<ReflectionGuard>,
    stdout: Paced,
    stderr: Paced,
    hits: usize,
}

impl Screen {
    pub fn new(guard: Arc<ReflectionGuard>) -> Self {
        Self {
            guard,
            ..Self::default()
        }
    }

    fn stream(&mut self, stderr: bool) -> &mut Paced {
        if stderr {
            &mut self.stderr
        } else {
            &mut self.stdout
        }
    }

    /// What of `data` can go out now, redacted; a possible start of the secret waits.
    pub fn pass(&mut self, data: &[u8], stderr: bool) -> Bytes {
        let guard = self.guard.clone();
        let (out, hits) = self.stream(stderr).pass(&guard, data);
        self.hits += hits;
        out
    }

    /// A short held tail waits for a pause to go out.
    pub fn releasable(&self) -> bool {
        self.stdout.releasable() || self.stderr.releasable()
    }

    /// After a pause: the short held tails of stdout and stderr go out (and stay held for
    /// matching).
    pub fn release(&mut self) -> (Bytes, Bytes) {
        (self.stdout.release(), self.stderr.release())
    }

    /// The held-back tails of stdout and stderr, decided now (at the end of the output).
    pub fn finish(&mut self) -> (Bytes, Bytes) {
        let (stdout, a) = self.stdout.finish(&self.guard);
        let (stderr, b) = self.stderr.finish(&self.guard);
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
    use crate::guard::RELEASE_AT_MOST;

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
        // `with` and `hunt` may be two groups of the password's base64 (one of its
        // cores starts with `h`), so `h ` may wait with `hunt`.
        assert!(b"ends with ".starts_with(&now) && now.starts_with(b"ends wit"));
        let (tail, _) = s.finish();
        assert_eq!([&now[..], &tail[..]].concat(), b"ends with hunt");
        assert!(s.evidence().is_empty());
    }

    #[test]
    fn a_pause_inside_the_secret_releases_at_most_a_short_prefix_and_the_rest_is_redacted() {
        let secret = b"sk_live_SuperSecret123";
        for pause_after in 1..secret.len() {
            let guard = ReflectionGuard::new(secret, secret).unwrap();
            let mut s = Screen::new(Arc::new(guard));
            let mut seen = s.pass(b"key: ", false).to_vec();
            seen.extend_from_slice(&s.pass(&secret[..pause_after], false));
            if s.releasable() {
                seen.extend_from_slice(&s.release().0);
            }
            assert!(!s.releasable(), "released twice");
            seen.extend_from_slice(&s.pass(&secret[pause_after..], false));
            seen.extend_from_slice(&s.pass(b" bye\n", false));
            seen.extend_from_slice(&s.finish().0);
            let text = String::from_utf8_lossy(&seen).into_owned();
            assert!(
                text.contains("[postern:redacted] bye"),
                "{pause_after}: {text}"
            );
            assert!(!text.contains("live_"), "{pause_after}: {text}");
            assert!(
                text.len() <= "key: ".len() + RELEASE_AT_MOST + "[postern:redacted] bye\n".len(),
                "{text}"
            );
        }
    }

    #[test]
    fn a_short_tail_that_is_not_a_secret_goes_out_once_after_a_pause() {
        let guard = ReflectionGuard::new(b"hunter2-pw", b"hunter2-pw").unwrap();
        let mut s = Screen::new(Arc::new(guard));
        let mut seen = s.pass(b"prompt> hu", false).to_vec();
        assert!(s.releasable());
        seen.extend_from_slice(&s.release().0);
        assert_eq!(seen, b"prompt> hu");
        seen.extend_from_slice(&s.pass(b"sh now\n", false));
        seen.extend_from_slice(&s.finish().0);
        assert_eq!(String::from_utf8_lossy(&seen), "prompt> hush now\n");
    }
}
