//! `decide(record, operation)`: the verdict automation acts on (SPEC §1.7).

use serde::{Deserialize, Serialize};

use super::codes::{Code, Outcome, Retry};

/// What automation should do next with an invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    /// Fetch the stored result by invocation id.
    Fetch,
    /// Find out what happened remotely before doing anything else.
    Reconcile,
    /// Change the request, config or credential first.
    StopForCorrection,
    /// A new attempt is safe.
    RetryNewAttempt,
    /// Retry with the same idempotency key.
    RetrySameKey,
    /// Retry once the remote's `Retry-After` allows.
    RetryWhenAllowed,
    /// The recorded result is the answer.
    ReturnRecordedResult,
    /// The outcome is settled (e.g. attested by an operator) but no result is stored:
    /// nothing to fetch and nothing to repeat; the record is the answer.
    ReturnRecordedOutcome,
}

impl Verdict {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Fetch => "FETCH",
            Self::Reconcile => "RECONCILE",
            Self::StopForCorrection => "STOP_FOR_CORRECTION",
            Self::RetryNewAttempt => "RETRY_NEW_ATTEMPT",
            Self::RetrySameKey => "RETRY_SAME_KEY",
            Self::RetryWhenAllowed => "RETRY_WHEN_ALLOWED",
            Self::ReturnRecordedResult => "RETURN_RECORDED_RESULT",
            Self::ReturnRecordedOutcome => "RETURN_RECORDED_OUTCOME",
        }
    }

    /// Verdicts `postern retry` refuses without the visibly unsafe flag.
    pub const fn needs_operator(self) -> bool {
        matches!(self, Self::Reconcile | Self::StopForCorrection)
    }
}

/// The four facts of a record that `decide` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFacts {
    pub code: Option<Code>,
    pub outcome: Outcome,
    pub retry: Retry,
    /// A result is stored under the invocation id (`postern result` finds it).
    pub result_stored: bool,
}

impl RecordFacts {
    /// The facts as of `now_ms`: a same-key retry is safe only before the key's safe-until
    /// time (SPEC §1.6); past it, or without one, the verdict is computed from `reconcile`.
    /// The record keeps what was true when it was written.
    pub fn as_of(mut self, safe_until: Option<&str>, now_ms: i64) -> Self {
        let until = safe_until.and_then(rfc3339_ms);
        if self.retry == Retry::SameIdempotencyKey && until.is_none_or(|t| now_ms >= t) {
            self.retry = Retry::Reconcile;
        }
        self
    }
}

/// Unix ms of an RFC 3339 time.
fn rfc3339_ms(text: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339);
    t.ok()
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// What the caller knows about the operation it would repeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OperationView {
    pub idempotent: bool,
    /// The operation's fingerprint equals the recorded one.
    pub fingerprint_equal: bool,
}

/// SPEC §1.7, branch for branch; a verdict never points at a result that is not stored.
pub fn decide(record: RecordFacts, operation: OperationView) -> Verdict {
    // No code with `fetch_result` is a live attempt: its result is what to wait for and fetch.
    let in_flight = record.code.is_none();
    if record.retry == Retry::FetchResult && (record.result_stored || in_flight) {
        return Verdict::Fetch;
    }
    if record.code == Some(Code::RetryBudgetExhausted) {
        return if record.outcome == Outcome::Unknown {
            Verdict::Reconcile
        } else {
            Verdict::StopForCorrection
        };
    }
    match record.outcome {
        Outcome::NotAttempted if record.retry == Retry::Backoff => Verdict::RetryNewAttempt,
        Outcome::NotAttempted => Verdict::StopForCorrection,
        Outcome::Unknown if operation.idempotent => Verdict::RetryNewAttempt,
        Outcome::Unknown
            if record.retry == Retry::SameIdempotencyKey && operation.fingerprint_equal =>
        {
            Verdict::RetrySameKey
        }
        Outcome::Unknown => Verdict::Reconcile,
        Outcome::Rejected if record.retry == Retry::Backoff => Verdict::RetryWhenAllowed,
        Outcome::Rejected | Outcome::Committed if !record.result_stored => {
            Verdict::ReturnRecordedOutcome
        }
        Outcome::Rejected | Outcome::Committed => Verdict::ReturnRecordedResult,
    }
}

#[cfg(test)]
mod as_of_tests {
    use super::*;

    #[test]
    fn a_same_key_verdict_lapses_at_safe_until() {
        let facts = RecordFacts {
            code: Some(Code::RemoteOutcomeUnknown),
            outcome: Outcome::Unknown,
            retry: Retry::SameIdempotencyKey,
            result_stored: false,
        };
        let until = "2026-01-01T00:00:10Z";
        let t = 1_767_225_610_000; // 2026-01-01T00:00:10Z
        let op = OperationView {
            idempotent: false,
            fingerprint_equal: true,
        };
        assert_eq!(
            decide(facts.as_of(Some(until), t - 1), op),
            Verdict::RetrySameKey
        );
        assert_eq!(decide(facts.as_of(Some(until), t), op), Verdict::Reconcile);
        assert_eq!(decide(facts.as_of(None, 0), op), Verdict::Reconcile);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(code: Option<Code>, outcome: Outcome, retry: Retry) -> RecordFacts {
        RecordFacts {
            code,
            outcome,
            retry,
            result_stored: true,
        }
    }

    const PLAIN: OperationView = OperationView {
        idempotent: false,
        fingerprint_equal: false,
    };

    #[test]
    fn every_branch_of_decide() {
        use Outcome::*;
        use Retry::*;
        use Verdict::*;
        let same_fp = OperationView {
            idempotent: false,
            fingerprint_equal: true,
        };
        let idem = OperationView {
            idempotent: true,
            fingerprint_equal: false,
        };
        let rbe = Some(Code::RetryBudgetExhausted);
        let cases = [
            (facts(None, Committed, FetchResult), PLAIN, Fetch),
            (facts(rbe, Unknown, FetchResult), PLAIN, Fetch),
            (
                facts(rbe, Unknown, Retry::Reconcile),
                idem,
                Verdict::Reconcile,
            ),
            (
                facts(rbe, NotAttempted, AfterCorrection),
                idem,
                StopForCorrection,
            ),
            (
                facts(rbe, Rejected, AfterCorrection),
                PLAIN,
                StopForCorrection,
            ),
            (
                facts(Some(Code::DnsError), NotAttempted, Backoff),
                PLAIN,
                RetryNewAttempt,
            ),
            (
                facts(Some(Code::RouteDenied), NotAttempted, AfterCorrection),
                idem,
                StopForCorrection,
            ),
            (
                facts(Some(Code::ApprovalDenied), NotAttempted, Never),
                idem,
                StopForCorrection,
            ),
            (
                facts(Some(Code::RemoteTimeout), Unknown, Retry::Reconcile),
                idem,
                RetryNewAttempt,
            ),
            (
                facts(Some(Code::RemoteTimeout), Unknown, SameIdempotencyKey),
                same_fp,
                RetrySameKey,
            ),
            (
                facts(Some(Code::RemoteTimeout), Unknown, SameIdempotencyKey),
                PLAIN,
                Verdict::Reconcile,
            ),
            (
                facts(Some(Code::RemoteTimeout), Unknown, Retry::Reconcile),
                same_fp,
                Verdict::Reconcile,
            ),
            (facts(None, Rejected, Backoff), PLAIN, RetryWhenAllowed),
            (
                facts(None, Rejected, AfterCorrection),
                PLAIN,
                ReturnRecordedResult,
            ),
            (facts(None, Committed, Never), idem, ReturnRecordedResult),
        ];
        for (record, op, want) in cases {
            assert_eq!(decide(record, op), want, "{record:?} {op:?}");
        }
    }

    #[test]
    fn an_unknown_outcome_is_never_returned_as_a_result() {
        for &retry in Retry::ALL {
            for code in [
                None,
                Some(Code::RemoteOutcomeUnknown),
                Some(Code::RetryBudgetExhausted),
            ] {
                let v = decide(facts(code, Outcome::Unknown, retry), PLAIN);
                assert_ne!(v, Verdict::ReturnRecordedResult, "{retry} {code:?}");
                assert_ne!(v, Verdict::RetryNewAttempt, "{retry} {code:?}");
            }
        }
    }

    #[test]
    fn a_verdict_never_points_at_a_result_that_is_not_stored() {
        let reconciled = RecordFacts {
            result_stored: false,
            ..facts(None, Outcome::Committed, Retry::Never)
        };
        assert_eq!(decide(reconciled, PLAIN), Verdict::ReturnRecordedOutcome);
        let lost = RecordFacts {
            result_stored: false,
            ..facts(
                Some(Code::ResultDeliveryFailed),
                Outcome::Committed,
                Retry::FetchResult,
            )
        };
        assert_eq!(decide(lost, PLAIN), Verdict::ReturnRecordedOutcome);
    }

    #[test]
    fn verdicts_serialize_as_pinned() {
        let json = serde_json::to_string(&Verdict::RetrySameKey).ok();
        assert_eq!(json.as_deref(), Some("\"RETRY_SAME_KEY\""));
        assert_eq!(Verdict::StopForCorrection.as_str(), "STOP_FOR_CORRECTION");
    }
}
