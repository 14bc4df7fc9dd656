//! The approval hold (SPEC §3.5), before any connection: `APPROVAL_REQUESTED` with the
//! fingerprint, then the operator's answer or `approval_timeout`, then — right before
//! dispatch — a check that nothing bound at preflight changed.

use std::time::Duration;

use serde_json::json;

use super::Invocation;
use crate::contract::{Code, Envelope};
use crate::journal::{ApprovalAnswer, ApprovalRequest, Body, Draft, Failure, Source};
use crate::policy::approvals::{Answer, Approvals, Held, Verdict};

impl Invocation {
    /// Records `APPROVAL_REQUESTED` (after `drafts`, the preflight) and waits for the
    /// answer. `Ok` once `APPROVAL_GRANTED` is durable and `changed()` names nothing bound
    /// at preflight that changed meanwhile (`FINGERPRINT_CHANGED`, `ROUTE_DENIED`).
    pub async fn await_approval(
        &mut self,
        approvals: &Approvals,
        held: Held,
        timeout: Duration,
        mut drafts: Vec<Draft>,
        changed: impl FnOnce() -> Option<Code>,
    ) -> Result<(), Envelope> {
        drafts.push(Draft::observed(Body::ApprovalRequested(ApprovalRequest {
            fingerprint: held.fingerprint.clone(),
            expires_at: held.expires_at.clone(),
        })));
        if self.record(drafts).await.is_err() {
            return Err(self.fallback(Code::JournalUnavailable));
        }
        let waiting = approvals.hold(held);
        let answer = match tokio::time::timeout(timeout, waiting).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) | Err(_) => {
                approvals.release(&self.id);
                return Err(self.fail(vec![], Failure::of(Code::ApprovalTimeout)).await);
            }
        };
        self.answered(answer, changed).await
    }

    async fn answered(
        &mut self,
        answer: Answer,
        changed: impl FnOnce() -> Option<Code>,
    ) -> Result<(), Envelope> {
        let decision = &answer.decision;
        let by = ApprovalAnswer {
            by: Some("operator".into()),
            note: decision.note.clone(),
            via: Some(decision.via.to_owned()),
        };
        let verdict = match decision.verdict {
            Verdict::Approve => Body::ApprovalGranted(by),
            Verdict::Deny => Body::ApprovalDenied(by),
        };
        let mut drafts = vec![Draft::observed(verdict).source(Source::OperatorAttested)];
        let refusal = match decision.verdict {
            Verdict::Deny => Some(Code::ApprovalDenied),
            Verdict::Approve => changed(),
        };
        if let Some(code) = refusal {
            let mut failure = Failure::of(code);
            if let Some(because) = answer.because {
                // SPEC §5.8: denied because the agent was suspended, not by a verdict on it.
                failure.evidence.insert("suspension".into(), because);
            }
            drafts.push(Draft::observed(Body::Failed(failure)));
        }
        let recorded = self.record(drafts).await;
        let record = match &recorded {
            Ok(a) => json!(a.state.record),
            Err(_) => json!({"invocation_id": self.id, "error": "journal unavailable"}),
        };
        let _ = answer.recorded.send(record);
        match refusal {
            Some(code) => Err(self.envelope(&recorded, code)),
            None if recorded.is_err() => Err(self.fallback(Code::JournalUnavailable)),
            None => Ok(()),
        }
    }
}
