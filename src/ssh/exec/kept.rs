//! An exec's request kept for `postern retry`: the command is in the record; what the
//! journal must also prove is the stdin the remote got. It is kept only when known whole:
//! the agent's stdin had ended when the preflight was written (`ssh -n`, or input sent and
//! closed at once: kept with the preflight, so it survives a restart), or it ended before
//! the exec did and all of it (up to `max_result_bytes`) was relayed. Otherwise nothing is
//! kept and a retry answers `REQUEST_NOT_KEPT`.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::{Instant, timeout_at};

use super::Run;
use crate::journal::{StoredRequest, b64};
use crate::ssh::dispatch::InputEvent;

/// How long an exec that failed before its relay waits for the agent's stdin to end.
const STDIN_SETTLE: Duration = Duration::from_millis(100);

/// The agent's stdin as far as postern took it.
#[derive(Default)]
pub(super) struct Stdin {
    chunks: Vec<Bytes>,
    bytes: u64,
    /// More than `max_result_bytes`: counted, no longer kept.
    over: bool,
    /// The agent sent EOF.
    ended: bool,
    /// Taken before the relay, still owed to the remote.
    early: Vec<InputEvent>,
    /// The relay ran: nothing taken later reached the remote.
    relayed: bool,
    /// The request is already kept as it stands.
    kept: bool,
}

impl Stdin {
    pub fn absorb(&mut self, event: &InputEvent, cap: u64) {
        match event {
            InputEvent::Data(data) => {
                self.bytes += data.len() as u64;
                self.over |= self.bytes > cap;
                if !self.over {
                    self.chunks.push(data.clone());
                }
            }
            InputEvent::Eof => self.ended = true,
        }
    }

    /// The relay starts: what was taken early goes to the remote first.
    pub fn relaying(&mut self) -> Vec<InputEvent> {
        self.relayed = true;
        std::mem::take(&mut self.early)
    }

    fn whole(&self) -> Option<Bytes> {
        if self.over {
            return None;
        }
        let mut all = BytesMut::with_capacity(self.bytes as usize);
        for chunk in &self.chunks {
            all.extend_from_slice(chunk);
        }
        Some(all.freeze())
    }
}

impl Run {
    /// Before the preflight write: takes the stdin the agent already sent, and keeps the
    /// request with that write when it had ended.
    pub(super) async fn keep_if_stdin_ended(&mut self) {
        let cap = self.config.journal.max_result_bytes;
        while !self.stdin.ended {
            let Some(event) = self.input.ready() else {
                break;
            };
            self.stdin.absorb(&event, cap);
            self.stdin.early.push(event);
        }
        if self.stdin.ended {
            self.keep_exec().await;
        }
    }

    /// Queues the kept request (durable with the invocation's next write), when the stdin
    /// the remote got is known whole.
    pub(super) async fn keep_exec(&mut self) {
        if self.stdin.kept {
            return;
        }
        // After a relay the stdin still open is not whole: what the agent sends next never
        // reached the remote, and a replay would end it where the first run did not.
        let ended = self.stdin.ended || (!self.stdin.relayed && self.stdin_ended().await);
        let Some(stdin) = self.stdin.whole().filter(|_| ended) else {
            return;
        };
        let journal = self.inv.journal();
        let kept = StoredRequest {
            invocation_id: self.inv.id().to_owned(),
            method: "exec".into(),
            target: self.call.target.url(),
            headers: Vec::new(),
            body_base64: Some(b64(&stdin)),
            body_bytes: stdin.len() as u64,
            headers_incomplete: false,
            expires_at_ms: journal.result_expiry_ms(),
        };
        journal.keep_request(kept).await;
        self.stdin.kept = true;
    }

    /// An exec that ends before its relay: takes what the agent sends until its EOF (true)
    /// or a short wait (false).
    async fn stdin_ended(&mut self) -> bool {
        let cap = self.config.journal.max_result_bytes;
        let until = Instant::now() + STDIN_SETTLE;
        while let Ok(Some(event)) = timeout_at(until, self.input.next()).await {
            self.stdin.absorb(&event, cap);
            if self.stdin.ended {
                return true;
            }
        }
        false
    }
}
