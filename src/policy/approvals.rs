//! Requests held until an operator answers (SPEC §3.5). Held in memory only: after a
//! restart, recovery settles a held invocation as `BROKER_RESTARTED_BEFORE_DISPATCH`.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::oneshot;

/// One held request, as `GET /v1/approvals` lists it (SPEC §5.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Held {
    pub invocation_id: String,
    pub agent: String,
    pub route: String,
    pub fingerprint: String,
    pub requested_at: String,
    pub expires_at: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    Deny,
}

/// An operator's verdict, and where the exchange sends the record once it journaled it.
#[derive(Debug)]
pub struct Answer {
    pub verdict: Verdict,
    pub recorded: oneshot::Sender<Value>,
}

/// The requests waiting for an answer, by invocation id.
#[derive(Debug, Default)]
pub struct Approvals {
    held: Mutex<HashMap<String, (Held, oneshot::Sender<Answer>)>>,
}

impl Approvals {
    /// Holds a request; the receiver gets the operator's answer.
    pub fn hold(&self, held: Held) -> oneshot::Receiver<Answer> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut map) = self.held.lock() {
            map.insert(held.invocation_id.clone(), (held, tx));
        }
        rx
    }

    /// Every held request, oldest first.
    pub fn list(&self) -> Vec<Held> {
        let mut out: Vec<Held> = self
            .held
            .lock()
            .map(|m| m.values().map(|(h, _)| h.clone()).collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.requested_at.cmp(&b.requested_at));
        out
    }

    /// Hands the verdict to the waiting exchange; `None` when nothing waits under `id`
    /// (never held, already answered, or expired). The receiver yields the record.
    pub fn answer(&self, id: &str, verdict: Verdict) -> Option<oneshot::Receiver<Value>> {
        let (_, waiter) = self.held.lock().ok()?.remove(id)?;
        let (recorded, rx) = oneshot::channel();
        waiter.send(Answer { verdict, recorded }).ok()?;
        Some(rx)
    }

    /// Stops holding `id` (its wait ended without an answer).
    pub fn release(&self, id: &str) {
        if let Ok(mut map) = self.held.lock() {
            map.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(id: &str, at: &str) -> Held {
        Held {
            invocation_id: id.into(),
            agent: "ci".into(),
            route: "pay".into(),
            fingerprint: "sha256:x".into(),
            requested_at: at.into(),
            expires_at: at.into(),
        }
    }

    #[test]
    fn an_answer_reaches_its_waiter_once() {
        let approvals = Approvals::default();
        let mut waiter = approvals.hold(held("act_b", "2026-01-01T00:00:02.000Z"));
        let _other = approvals.hold(held("act_a", "2026-01-01T00:00:01.000Z"));
        let ids: Vec<String> = approvals
            .list()
            .into_iter()
            .map(|h| h.invocation_id)
            .collect();
        assert_eq!(ids, ["act_a", "act_b"]);
        assert!(approvals.answer("act_b", Verdict::Deny).is_some());
        let got = waiter.try_recv().map(|a| a.verdict).ok();
        assert_eq!(got, Some(Verdict::Deny));
        assert!(
            approvals.answer("act_b", Verdict::Approve).is_none(),
            "answered once"
        );
        assert!(approvals.answer("act_zz", Verdict::Approve).is_none());
    }

    #[test]
    fn a_released_request_takes_no_answer() {
        let approvals = Approvals::default();
        let _waiter = approvals.hold(held("act_c", "2026-01-01T00:00:00.000Z"));
        approvals.release("act_c");
        assert!(approvals.list().is_empty());
        assert!(approvals.answer("act_c", Verdict::Approve).is_none());
    }
}
