//! `postern retry`: act on `decide()` for a recorded invocation (SPEC §1.7, §5.1).
//! Only RETRY_NEW_ATTEMPT and RETRY_SAME_KEY send anything, and then the bound snapshot as
//! a new generation of the same invocation; RECONCILE is repeated only when an operator
//! vouches for it, and that is journaled; STOP_FOR_CORRECTION never is.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::contract::{
    Code, CredentialEvidence, Envelope, OperationView, RecordFacts, SecretVersion, Verdict, decide,
};
use crate::journal::{Journal, Payload, Protocol, Record, StoredRequest, StoredResult};

use super::Invocation;
use super::lease::{LeaseError, LeaseTerms, attempt_in_progress};

/// What the operator asked for.
#[derive(Debug, Clone, Default)]
pub struct RetryAsk {
    /// `--i-have-reconciled` / `{"operator_attested_safe": true}`: overrides RECONCILE only.
    pub operator_attested_safe: bool,
    pub note: Option<String>,
}

/// Why a snapshot can no longer be sent as it was bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotChanged(pub String);

/// The transport that sends an invocation's kept request again.
pub trait Resend: Send + Sync {
    /// Whether route, target and credential version still are what the invocation bound.
    fn snapshot_holds(
        &self,
        record: &Record,
        request: &StoredRequest,
    ) -> Result<(), SnapshotChanged>;
    /// The lease terms (retry budget, lease expiry) of the invocation's route or target;
    /// `None` when it no longer exists.
    fn terms(&self, record: &Record, note: Option<String>) -> Option<LeaseTerms>;
    /// Runs the leased generation to its end (result committed or failure recorded).
    fn resend(
        &self,
        inv: Invocation,
        record: Record,
        request: StoredRequest,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// Each transport's `Resend`, chosen by the invocation's protocol.
pub struct Transports {
    pub http: Arc<dyn Resend>,
    pub ssh: Arc<dyn Resend>,
}

impl Transports {
    fn of(&self, record: &Record) -> &dyn Resend {
        match record.protocol {
            Protocol::Http | Protocol::Https => self.http.as_ref(),
            Protocol::Ssh => self.ssh.as_ref(),
        }
    }
}

impl Resend for Transports {
    fn snapshot_holds(
        &self,
        record: &Record,
        request: &StoredRequest,
    ) -> Result<(), SnapshotChanged> {
        self.of(record).snapshot_holds(record, request)
    }

    fn terms(&self, record: &Record, note: Option<String>) -> Option<LeaseTerms> {
        self.of(record).terms(record, note)
    }

    fn resend(
        &self,
        inv: Invocation,
        record: Record,
        request: StoredRequest,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.of(&record).resend(inv, record, request)
    }
}

/// What `retry` did.
#[derive(Debug)]
pub enum RetryAnswer {
    /// A new generation ran; this is the record after it settled.
    Retried(Box<Record>),
    /// The stored result is the answer (FETCH, RETURN_RECORDED_RESULT); nothing was sent.
    Fetched(Verdict, Box<StoredResult>),
    /// The recorded outcome is the answer; nothing was sent.
    Settled(Verdict, Box<Record>),
    /// Nothing was sent, and why.
    Refused {
        verdict: Option<Verdict>,
        code: &'static str,
        message: String,
        record: Box<Record>,
    },
    /// The lease or the budget refused the new generation.
    Failed(Box<Envelope>),
    NotFound,
    Unavailable,
}

/// Acts on the verdict for `id`.
pub async fn retry(
    journal: &Journal,
    resend: &Arc<dyn Resend>,
    id: &str,
    ask: RetryAsk,
) -> RetryAnswer {
    let state = match journal.state(id) {
        Ok(Some(s)) => s,
        Ok(None) => return RetryAnswer::NotFound,
        Err(_) => return RetryAnswer::Unavailable,
    };
    if !state.progress.closed {
        return RetryAnswer::Failed(Box::new(attempt_in_progress(&state)));
    }
    let (record, result_stored) = (state.record, state.progress.result_stored);
    let now = crate::journal::unix_ms(journal.now());
    let verdict = verdict_of(&record, result_stored, now);
    match verdict {
        Verdict::Fetch | Verdict::ReturnRecordedResult | Verdict::ReturnRecordedOutcome => {
            match journal.result(id) {
                Ok(Some(r)) => RetryAnswer::Fetched(verdict, Box::new(r)),
                Ok(None) => RetryAnswer::Settled(verdict, Box::new(record)),
                Err(_) => RetryAnswer::Unavailable,
            }
        }
        Verdict::RetryWhenAllowed => {
            let after = retry_after(journal, id);
            refuse(verdict, "RETRY_NOT_YET", when_allowed(after), record)
        }
        Verdict::StopForCorrection if record.code == Some(Code::ResendRefused) => {
            let twin = resend_twin(&record);
            refuse(verdict, "RETRY_REFUSED", twin_first(&twin), record)
        }
        Verdict::StopForCorrection => refuse(verdict, "RETRY_REFUSED", STOP.into(), record),
        Verdict::Reconcile if record.code == Some(Code::RetryBudgetExhausted) => {
            refuse(verdict, "RETRY_BUDGET_EXHAUSTED", budget_spent(id), record)
        }
        Verdict::Reconcile if !ask.operator_attested_safe => {
            refuse(verdict, "RETRY_REFUSED", reconcile_first(id), record)
        }
        Verdict::Reconcile | Verdict::RetryNewAttempt | Verdict::RetrySameKey => {
            let vouched = verdict == Verdict::Reconcile;
            resend_generation(journal, resend, record, vouched, ask.note).await
        }
    }
}

const STOP: &str = "The verdict is STOP_FOR_CORRECTION: this invocation is not repeated. Correct the request, route or credential and send a new request.";
/// Why the invocation's request is not kept whole, as far as the journal can tell.
fn not_kept(journal: &Journal, record: &Record) -> String {
    let id = &record.invocation_id;
    let exec = record.protocol == Protocol::Ssh;
    if record.method.as_deref() == Some("CONNECT") {
        return "It was a tunnel, whose bytes postern never reads".into();
    }
    let kept = journal.request_as_kept(id).ok().flatten();
    let now = crate::journal::unix_ms(journal.now());
    match kept {
        None if exec => "The stdin this exec's command got is not known whole (it had not ended when the exec failed or postern restarted, or it was larger than journal.max_result_bytes): run the command again as a new exec once you know what the first one did".into(),
        None => "Its request was not kept (a request from an older postern, or refused before its preflight)".into(),
        Some(r) if r.expires_at_ms <= now => "Its request passed its retention (journal.result_retention)".into(),
        Some(r) if r.headers_incomplete => "It carried a credential of the agent's own (Authorization, a cookie or another credential-like header), which postern never stores, or it was a WebSocket handshake".into(),
        Some(r) => format!(
            "Its body ({} bytes) was larger than journal.max_result_bytes, so it was not kept",
            r.body_bytes
        ),
    }
}

/// The twin a refused resend names (`evidence.resend_of.invocation_id`).
fn resend_twin(record: &Record) -> String {
    let twin = record.evidence.extra.get("resend_of");
    let id = twin
        .and_then(|t| t.get("invocation_id"))
        .and_then(|v| v.as_str());
    id.unwrap_or("-").to_owned()
}

/// A refused resend was never sent: what is open is its twin, which may have happened.
fn twin_first(twin: &str) -> String {
    format!(
        "This request was refused as a resend of {twin}, which may have happened; nothing was sent, and this invocation is not repeated. Settle the twin first: `postern decide {twin}` (reconcile it if its outcome is unknown); send a new request only once you know it did not happen, with `Postern-Resend: deliberate`."
    )
}

fn budget_spent(id: &str) -> String {
    format!(
        "This invocation used up its retry budget: postern repeats it no more, not even when vouched for; nothing was sent. Find out at the remote whether it happened and record it with `postern reconcile {id} --outcome committed|rejected --note …`; to act again, send a new request."
    )
}

fn reconcile_first(id: &str) -> String {
    format!(
        "The verdict is RECONCILE: the action may have happened; nothing was sent. Find out at the remote, then record it with `postern reconcile {id} --outcome committed|rejected --note …`; if you established that it did not happen, `postern retry {id} --i-have-reconciled --note …` repeats it (journaled as operator-attested)."
    )
}

fn verdict_of(record: &Record, result_stored: bool, now_ms: i64) -> Verdict {
    let key = record.evidence.idempotency.as_ref();
    let facts = RecordFacts {
        code: record.code,
        outcome: record.outcome,
        retry: record.retry,
        result_stored,
    }
    .as_of(key.and_then(|k| k.safe_until.as_deref()), now_ms);
    let view = OperationView {
        idempotent: record.evidence.idempotent.unwrap_or(false),
        // The kept request is the bound snapshot itself.
        fingerprint_equal: true,
    };
    decide(facts, view)
}

/// The remote's `Retry-After` from the stored response, if there is one.
fn retry_after(journal: &Journal, id: &str) -> Option<String> {
    let Ok(Some(result)) = journal.result(id) else {
        return None;
    };
    match result.payload {
        Payload::Http(h) => h
            .headers
            .into_iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("retry-after"))
            .map(|(_, v)| v),
        Payload::Ssh(_) | Payload::Tunnel(_) => None,
    }
}

fn when_allowed(after: Option<String>) -> String {
    let after = after.map_or("the Retry-After it sent".into(), |a| {
        format!("Retry-After: {a}")
    });
    format!(
        "The remote refused for now (RETRY_WHEN_ALLOWED): send the request again as a new one after {after}."
    )
}

fn refuse(verdict: Verdict, code: &'static str, message: String, record: Record) -> RetryAnswer {
    RetryAnswer::Refused {
        verdict: Some(verdict),
        code,
        message,
        record: Box::new(record),
    }
}

async fn resend_generation(
    journal: &Journal,
    resend: &Arc<dyn Resend>,
    record: Record,
    vouched: bool,
    note: Option<String>,
) -> RetryAnswer {
    let id = record.invocation_id.clone();
    let request = match journal.request(&id) {
        Ok(Some(r)) if r.resendable() => r,
        Ok(_) => {
            let why = not_kept(journal, &record);
            return RetryAnswer::Refused {
                verdict: None,
                code: "REQUEST_NOT_KEPT",
                message: format!("{why}: postern cannot send it again; nothing was sent."),
                record: Box::new(record),
            };
        }
        Err(_) => return RetryAnswer::Unavailable,
    };
    if let Err(SnapshotChanged(why)) = resend.snapshot_holds(&record, &request) {
        return RetryAnswer::Refused {
            verdict: None,
            code: "FINGERPRINT_CHANGED",
            message: format!("The bound snapshot no longer holds ({why}); nothing was sent."),
            record: Box::new(record),
        };
    }
    let Some(mut terms) = resend.terms(&record, note) else {
        return RetryAnswer::Refused {
            verdict: None,
            code: "FINGERPRINT_CHANGED",
            message:
                "The route or target this invocation bound no longer exists; nothing was sent."
                    .into(),
            record: Box::new(record),
        };
    };
    terms.unsafe_override = vouched;
    // The generation runs to its end even when the operator's CLI or API client leaves: a
    // lease written or a request sent must reach an outcome in the journal.
    let generation = tokio::spawn(run_generation(
        journal.clone(),
        resend.clone(),
        record,
        request,
        terms,
    ));
    match generation.await {
        Ok(answer) => answer,
        Err(_) => RetryAnswer::Unavailable,
    }
}

async fn run_generation(
    journal: Journal,
    resend: Arc<dyn Resend>,
    record: Record,
    request: StoredRequest,
    terms: LeaseTerms,
) -> RetryAnswer {
    let id = record.invocation_id.clone();
    let inv = match Invocation::lease(journal.clone(), &id, terms).await {
        Ok(inv) => inv,
        Err(LeaseError::Refused(env)) => return RetryAnswer::Failed(env),
        Err(LeaseError::NotFound) => return RetryAnswer::NotFound,
        Err(LeaseError::Resolved(state)) => {
            return RetryAnswer::Settled(Verdict::ReturnRecordedResult, Box::new(state.record));
        }
    };
    resend.resend(inv, record, request).await;
    match journal.record(&id) {
        Ok(Some(r)) => RetryAnswer::Retried(Box::new(r)),
        Ok(None) => RetryAnswer::NotFound,
        Err(_) => RetryAnswer::Unavailable,
    }
}

/// Whether the credential the invocation bound is still `offered` by its route or target,
/// at the version it had. `now` is the version its secret source holds now.
pub fn credential_holds(
    bound: &CredentialEvidence,
    offered: &[String],
    now: impl FnOnce() -> Result<SecretVersion, Code>,
) -> Result<(), SnapshotChanged> {
    let changed = |why: String| Err(SnapshotChanged(why));
    if !offered.contains(&bound.id) {
        return changed(format!(
            "credential `{}` was bound; it is no longer the one configured there",
            bound.id
        ));
    }
    match now() {
        Ok(version) if version == bound.version => Ok(()),
        Ok(version) => changed(format!(
            "credential `{}` was rotated (version {} then, {version} now)",
            bound.id, bound.version
        )),
        Err(code) => changed(format!(
            "credential `{}` cannot be had now: {}",
            bound.id,
            code.as_str()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound() -> CredentialEvidence {
        CredentialEvidence {
            id: "stripe".into(),
            version: 2.into(),
            mode: "bearer".into(),
        }
    }

    #[test]
    fn a_credential_holds_only_as_it_was_bound() {
        let offered = ["stripe".to_owned()];
        assert_eq!(
            credential_holds(&bound(), &offered, || Ok(2.into())),
            Ok(())
        );
        let rotated = credential_holds(&bound(), &offered, || Ok(3.into()));
        assert!(matches!(rotated, Err(SnapshotChanged(w)) if w.contains("rotated")));
        let swapped = credential_holds(&bound(), &["other".to_owned()], || Ok(2.into()));
        assert!(matches!(swapped, Err(SnapshotChanged(w)) if w.contains("no longer")));
        let gone = credential_holds(&bound(), &offered, || Err(Code::CredentialMissing));
        assert!(matches!(gone, Err(SnapshotChanged(w)) if w.contains("cannot be had")));
    }

    #[test]
    fn a_rewritten_file_secret_counts_as_rotated() {
        use crate::contract::DigestOf;
        let file = |b| SecretVersion::Digest {
            of: DigestOf::File,
            prefix: [b; 6],
        };
        let bound = CredentialEvidence {
            version: file(1),
            ..bound()
        };
        let offered = ["stripe".to_owned()];
        assert_eq!(credential_holds(&bound, &offered, || Ok(file(1))), Ok(()));
        let rewritten = credential_holds(&bound, &offered, || Ok(file(2)));
        assert!(
            matches!(&rewritten, Err(SnapshotChanged(w)) if w.contains("rotated") && w.contains("file:010101010101")),
            "{rewritten:?}"
        );
    }
}
