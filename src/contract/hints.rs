//! Retry hints for SDK retry loops (SPEC §3.7). Vendor SDKs repeat a request by themselves
//! on `408`/`409`/`429`/`5xx` unless the response says not to (`X-Should-Retry`, read by the
//! Stainless-generated SDKs; `Stripe-Should-Retry`, by Stripe's). The hint is the record's
//! retry directive said in their words: a blind repeat is allowed only where the contract
//! allows a new attempt (`backoff`), where a repeat becomes a same-key retry, or where the
//! answer is "still running, ask again" (`ATTEMPT_IN_PROGRESS`).

use super::{Code, Retry};

/// Whether an SDK may send the same request again by itself.
pub fn should_retry(retry: Retry, code: Option<Code>) -> bool {
    matches!(retry, Retry::Backoff | Retry::SameIdempotencyKey)
        || code == Some(Code::AttemptInProgress)
}

/// The header value for [`should_retry`].
pub fn should_retry_value(retry: Retry, code: Option<Code>) -> &'static str {
    if should_retry(retry, code) {
        "true"
    } else {
        "false"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_the_contract_allows_to_repeat_says_true() {
        let cases = [
            (Retry::Never, None, false),
            (Retry::AfterCorrection, Some(Code::ForbiddenHeader), false),
            (Retry::Reconcile, Some(Code::RemoteOutcomeUnknown), false),
            (Retry::Reconcile, Some(Code::ResultStoreFailed), false),
            (Retry::FetchResult, Some(Code::ResultDeliveryFailed), false),
            (Retry::Backoff, Some(Code::ConnectionRefused), true),
            (Retry::Backoff, Some(Code::RemoteOutcomeUnknown), true),
            (Retry::SameIdempotencyKey, Some(Code::RemoteTimeout), true),
            (Retry::FetchResult, Some(Code::AttemptInProgress), true),
        ];
        for (retry, code, want) in cases {
            assert_eq!(should_retry(retry, code), want, "{retry:?} {code:?}");
        }
        assert_eq!(should_retry_value(Retry::Never, None), "false");
    }
}
