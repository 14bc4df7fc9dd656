//! `approval = "required"`: the request waits, before any connection, until an operator
//! approves or denies it or `approval_timeout` passes (SPEC §3.5).

use http::Response;
use serde_json::json;

use super::exchange::Exchange;
use super::inject::Injection;
use super::respond::ProxyBody;
use crate::config::Route;
use crate::contract::Code;
use crate::journal::{ApprovalAnswer, ApprovalRequest, Body, Draft, Failure, Source, rfc3339};
use crate::policy::approvals::{Answer, Held, Verdict, preview};

impl Exchange {
    /// Records `APPROVAL_REQUESTED` (with the preflight drafts) and waits for the answer.
    /// `Ok` once `APPROVAL_GRANTED` is durable and nothing bound at preflight changed.
    pub(super) async fn await_approval(
        &mut self,
        route: &Route,
        fingerprint: &str,
        body: &[u8],
        credential: Option<&str>,
        drafts: &mut Vec<Draft>,
    ) -> Result<(), Response<ProxyBody>> {
        let now = time::OffsetDateTime::now_utc();
        let held = Held {
            invocation_id: self.id.clone(),
            agent: self.agent.clone(),
            route: route.id.clone(),
            method: self.method.clone(),
            target: self.target.url(),
            fingerprint: fingerprint.to_owned(),
            requested_at: rfc3339(now),
            expires_at: rfc3339(now + route.approval_timeout),
            body_bytes: body.len(),
            body_preview: preview(body),
        };
        drafts.push(Draft::observed(Body::ApprovalRequested(ApprovalRequest {
            fingerprint: held.fingerprint.clone(),
            expires_at: held.expires_at.clone(),
        })));
        if self.record(std::mem::take(drafts)).await.is_err() {
            return Err(self.fallback(Code::JournalUnavailable));
        }
        let approvals = self.proxy.approvals.clone();
        let waiting = approvals.hold(held);
        let answer = match tokio::time::timeout(route.approval_timeout, waiting).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) | Err(_) => {
                approvals.release(&self.id);
                return Err(self.fail(vec![], Failure::of(Code::ApprovalTimeout)).await);
            }
        };
        self.answered(answer, credential).await
    }

    async fn answered(
        &mut self,
        answer: Answer,
        credential: Option<&str>,
    ) -> Result<(), Response<ProxyBody>> {
        let by = ApprovalAnswer {
            by: Some("operator".into()),
        };
        let verdict = match answer.verdict {
            Verdict::Approve => Body::ApprovalGranted(by),
            Verdict::Deny => Body::ApprovalDenied(by),
        };
        let mut drafts = vec![Draft::observed(verdict).source(Source::OperatorAttested)];
        let refusal = match answer.verdict {
            Verdict::Deny => Some(Code::ApprovalDenied),
            Verdict::Approve => self
                .changed_since_preflight(credential)
                .then_some(Code::FingerprintChanged),
        };
        if let Some(code) = refusal {
            drafts.push(Draft::observed(Body::Failed(Failure::of(code))));
        }
        let recorded = self.record(drafts).await;
        let record = match &recorded {
            Ok(a) => json!(a.state.record),
            Err(_) => json!({"invocation_id": self.id, "error": "journal unavailable"}),
        };
        let _ = answer.recorded.send(record);
        match refusal {
            Some(code) => Err(self.failure_response(&recorded, code)),
            None if recorded.is_err() => Err(self.fallback(Code::JournalUnavailable)),
            None => Ok(()),
        }
    }

    /// Immediately before writing: the credential bound at preflight is still the one the
    /// vault holds (the fingerprint and target are the held request's own, unchanged).
    fn changed_since_preflight(&self, credential: Option<&str>) -> bool {
        let (Some(id), Some(bound)) = (credential, &self.injection) else {
            return false;
        };
        match Injection::resolve(&self.proxy.config, &self.proxy.vault, id) {
            Ok(now) => now.evidence() != bound.evidence(),
            Err(_) => true,
        }
    }
}
