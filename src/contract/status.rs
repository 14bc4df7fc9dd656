//! HTTP status → outcome for complete upstream responses (SPEC §1.5), and a gRPC
//! call's `grpc-status` → outcome (SPEC §3.2).

use std::collections::BTreeMap;

use super::codes::{Outcome, Retry};

/// A route's `status_outcomes`: statuses whose class the route overrides.
pub type StatusOverrides = BTreeMap<u16, Outcome>;

/// The resolution of a complete, correctly framed final response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusResolution {
    pub outcome: Outcome,
    pub retry: Retry,
}

/// What the response said beyond its status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResponseFacts {
    pub status: u16,
    pub has_retry_after: bool,
    /// The operation is idempotent per the route's `idempotent_methods`.
    pub idempotent: bool,
}

/// Classifies a final response; `None` for 1xx, which never resolves anything.
pub fn classify_status(
    facts: ResponseFacts,
    overrides: &StatusOverrides,
) -> Option<StatusResolution> {
    let status = facts.status;
    if !(200..=599).contains(&status) {
        return None;
    }
    let polite_backoff = matches!(status, 429 | 503) && facts.has_retry_after && facts.idempotent;
    let outcome = match overrides.get(&status) {
        Some(&o) if matches!(o, Outcome::Committed | Outcome::Rejected) => o,
        _ if polite_backoff => Outcome::Rejected,
        _ if status >= 500 => Outcome::Committed,
        _ if status >= 400 => Outcome::Rejected,
        _ => Outcome::Committed,
    };
    let retry = match outcome {
        Outcome::Rejected if polite_backoff => Retry::Backoff,
        Outcome::Rejected => Retry::AfterCorrection,
        _ => Retry::Never,
    };
    Some(StatusResolution { outcome, retry })
}

/// SPEC §3.2: the `grpc-status` that ended a gRPC call (with END_STREAM) resolves it by its
/// class. Codes that say the server refused the call as sent are `rejected`; `OK` and every
/// other code (`UNKNOWN`, `INTERNAL`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `ABORTED`, …, and
/// numbers gRPC does not define) are `committed`: the application may have acted.
pub fn classify_grpc_status(code: u32) -> StatusResolution {
    // INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, RESOURCE_EXHAUSTED,
    // FAILED_PRECONDITION, OUT_OF_RANGE, UNIMPLEMENTED, UNAUTHENTICATED.
    const REJECTED: &[u32] = &[3, 5, 6, 7, 8, 9, 11, 12, 16];
    if REJECTED.contains(&code) {
        StatusResolution {
            outcome: Outcome::Rejected,
            retry: Retry::AfterCorrection,
        }
    } else {
        StatusResolution {
            outcome: Outcome::Committed,
            retry: Retry::Never,
        }
    }
}

/// A `grpc-status` value: a non-negative decimal number (gRPC's PROTOCOL-HTTP2), else `None`
/// (no status was given, and the call is not complete).
pub fn parse_grpc_status(value: &[u8]) -> Option<u32> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// SPEC §4: an `exit-status` or `exit-signal` resolves an SSH exec as `committed`, whatever
/// the code (exit 23 is a complete, authoritative result, not a failure postern can judge).
pub fn classify_exit() -> StatusResolution {
    StatusResolution {
        outcome: Outcome::Committed,
        retry: Retry::Never,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn any_exit_resolves_an_exec_as_committed() {
        let r = classify_exit();
        assert_eq!((r.outcome, r.retry), (Outcome::Committed, Retry::Never));
    }

    use super::*;

    #[test]
    fn grpc_statuses_resolve_by_class() {
        use Outcome::*;
        use Retry::*;
        let rejected = [3, 5, 6, 7, 8, 9, 11, 12, 16];
        for code in 0..=40 {
            let r = classify_grpc_status(code);
            let want = if rejected.contains(&code) {
                (Rejected, AfterCorrection)
            } else {
                (Committed, Never)
            };
            assert_eq!((r.outcome, r.retry), want, "grpc-status {code}");
        }
        // OK, CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNAVAILABLE, DATA_LOSS.
        for code in [0, 1, 2, 4, 10, 13, 14, 15] {
            assert_eq!(classify_grpc_status(code).outcome, Committed, "{code}");
        }
    }

    #[test]
    fn a_grpc_status_is_a_decimal_number_or_none() {
        assert_eq!(parse_grpc_status(b"0"), Some(0));
        assert_eq!(parse_grpc_status(b"14"), Some(14));
        for bad in [&b""[..], b" 7", b"-1", b"7a", b"OK", b"99999999999"] {
            assert_eq!(parse_grpc_status(bad), None, "{bad:?}");
        }
    }

    fn classify(status: u16, retry_after: bool, idempotent: bool) -> Option<(Outcome, Retry)> {
        let facts = ResponseFacts {
            status,
            has_retry_after: retry_after,
            idempotent,
        };
        classify_status(facts, &StatusOverrides::new()).map(|r| (r.outcome, r.retry))
    }

    #[test]
    fn every_status_class_resolves_as_specified() {
        use Outcome::*;
        use Retry::*;
        for s in 100..=199 {
            assert_eq!(classify(s, false, true), None, "{s}");
        }
        for s in (200..=399).chain(500..=599) {
            if s == 503 {
                continue;
            }
            assert_eq!(classify(s, true, true), Some((Committed, Never)), "{s}");
        }
        for s in 400..=499 {
            if s == 429 {
                continue;
            }
            assert_eq!(
                classify(s, true, true),
                Some((Rejected, AfterCorrection)),
                "{s}"
            );
        }
    }

    #[test]
    fn retry_after_backs_off_only_for_idempotent_operations() {
        use Outcome::*;
        use Retry::*;
        assert_eq!(classify(429, true, true), Some((Rejected, Backoff)));
        assert_eq!(
            classify(429, true, false),
            Some((Rejected, AfterCorrection))
        );
        assert_eq!(
            classify(429, false, true),
            Some((Rejected, AfterCorrection))
        );
        assert_eq!(classify(503, true, true), Some((Rejected, Backoff)));
        assert_eq!(classify(503, true, false), Some((Committed, Never)));
        assert_eq!(classify(503, false, true), Some((Committed, Never)));
    }

    #[test]
    fn route_overrides_win_over_the_class() {
        let overrides = StatusOverrides::from([(409, Outcome::Rejected), (500, Outcome::Rejected)]);
        let facts = |status| ResponseFacts {
            status,
            has_retry_after: false,
            idempotent: false,
        };
        let r = classify_status(facts(409), &overrides).map(|r| (r.outcome, r.retry));
        assert_eq!(r, Some((Outcome::Rejected, Retry::AfterCorrection)));
        let r = classify_status(facts(500), &overrides).map(|r| r.outcome);
        assert_eq!(r, Some(Outcome::Rejected));
        let committed = StatusOverrides::from([(404, Outcome::Committed)]);
        let r = classify_status(facts(404), &committed).map(|r| (r.outcome, r.retry));
        assert_eq!(r, Some((Outcome::Committed, Retry::Never)));
    }

    #[test]
    fn out_of_range_statuses_resolve_nothing() {
        assert_eq!(classify(99, false, false), None);
        assert_eq!(classify(600, false, false), None);
    }
}
