//! From observations to the four facts: the only place outcomes are computed.

use super::codes::{Code, Outcome, OutcomeRule, Phase, PhaseRule, Retry, RetryRule};

/// What the journal proves about the operation's retry semantics (SPEC §1.6).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperationFacts {
    /// The method is in the route's `idempotent_methods` (or the SSH target says so).
    pub idempotent: bool,
    /// A configured idempotency contract with a key and fingerprint recorded before dispatch.
    pub idempotency_key: Option<KeyWindow>,
    /// The invocation's generation against the retry budget bound at preflight; `None` when
    /// no budget was bound (journals from before it was).
    pub generations: Option<Generations>,
}

/// How far an invocation is into its retry budget (SPEC §1.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generations {
    /// The current generation (1 for the first dispatch try).
    pub current: u32,
    /// Retries allowed beyond the first generation (the route's `retry_budget`).
    pub budget: u32,
}

impl Generations {
    /// No generation is left: a repeat of this invocation is `RETRY_BUDGET_EXHAUSTED`.
    pub const fn spent(self) -> bool {
        self.current > self.budget
    }
}

/// The window in which the remote promises to deduplicate a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyWindow {
    /// Unix milliseconds after which a same-key retry is no longer safe.
    pub safe_until_ms: i64,
}

/// The invocation as far as the journal knows it when a failure is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureContext {
    /// The furthest phase reached.
    pub phase_reached: Phase,
    /// The outcome the invocation already holds.
    pub current_outcome: Outcome,
    /// `DISPATCH_STARTED` is durable in some generation.
    pub dispatched: bool,
    /// A result is durably stored (`RESULT_COMMITTED` with its result).
    pub result_stored: bool,
    /// The operation's retry semantics.
    pub operation: OperationFacts,
    /// The time of the failure, unix milliseconds.
    pub now_ms: i64,
    /// The status a `via` hop answered a refused `CONNECT` with (`PROXY_TUNNEL_REFUSED`), or
    /// a token endpoint answered a failed mint with (`CREDENTIAL_MINT_FAILED`, evidence
    /// `token_status`).
    pub hop_status: Option<u16>,
}

/// The phase, outcome and retry of one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution {
    pub code: Code,
    pub phase: Phase,
    pub outcome: Outcome,
    pub retry: Retry,
}

/// Computes retry for an `unknown` outcome (SPEC §1.6), never pointing at a repeat the
/// budget refuses (SPEC §1.7).
pub fn retry_for_unknown(op: &OperationFacts, now_ms: i64) -> Retry {
    if keyed_repeat_refused(op) {
        // With a key the agent repeats as this same invocation, and no generation is left
        // for it: neither `same_idempotency_key` nor `backoff` would be true.
        return Retry::Reconcile;
    }
    if op.idempotent {
        // Without a key, an idempotent method's repeat is a new invocation with a budget of
        // its own, so `backoff` stays true even when this one's budget is spent.
        return Retry::Backoff;
    }
    match op.idempotency_key {
        Some(window) if now_ms < window.safe_until_ms => Retry::SameIdempotencyKey,
        _ => Retry::Reconcile,
    }
}

/// A repeat under the invocation's idempotency key would be its next generation, and the
/// retry budget has none left.
fn keyed_repeat_refused(op: &OperationFacts) -> bool {
    op.idempotency_key.is_some() && op.generations.is_some_and(Generations::spent)
}

/// Resolves a failure code against what the journal proves.
///
/// Once dispatch may have happened the outcome is never `not_attempted`: a
/// pre-dispatch code in a later generation keeps the invocation `unknown`.
pub fn resolve_failure(code: Code, ctx: &FailureContext) -> Resolution {
    let row = code.row();
    let phase = match row.phase {
        PhaseRule::Fixed(p) => p,
        PhaseRule::Reached => ctx.phase_reached,
    };
    let mut outcome = match row.outcome {
        OutcomeRule::Fixed(o) => o,
        OutcomeRule::Own => ctx.current_outcome,
        OutcomeRule::CommittedIfProvable if ctx.result_stored => Outcome::Committed,
        OutcomeRule::CommittedIfProvable => Outcome::Unknown,
    };
    if outcome == Outcome::NotAttempted && ctx.dispatched {
        outcome = Outcome::Unknown;
    }
    if is_resolved(ctx.current_outcome) {
        outcome = ctx.current_outcome;
    }
    // A hop's refusal picks its default from the hop's status; the rules for a default
    // then apply as to any other (a later generation's refusal stays `unknown`).
    let rule = match row.retry {
        RetryRule::HopRefusal => RetryRule::Fixed(hop_refusal_retry(ctx.hop_status)),
        RetryRule::MintFailure => RetryRule::Fixed(mint_failure_retry(ctx.hop_status)),
        other => other,
    };
    let retry = match rule {
        RetryRule::Fixed(r) if outcome == Outcome::Unknown && r != Retry::Reconcile => {
            if r == Retry::FetchResult {
                r
            } else {
                retry_for_unknown(&ctx.operation, ctx.now_ms)
            }
        }
        // Nothing was sent, but the key's repeat is refused: correct it (a new key).
        RetryRule::Fixed(Retry::Backoff) if keyed_repeat_refused(&ctx.operation) => {
            Retry::AfterCorrection
        }
        RetryRule::Fixed(r) => r,
        RetryRule::ComputedUnknown => retry_for_unknown(&ctx.operation, ctx.now_ms),
        RetryRule::BudgetExhausted if outcome == Outcome::Unknown => Retry::Reconcile,
        RetryRule::BudgetExhausted => Retry::AfterCorrection,
        // Mapped to `Fixed` above.
        RetryRule::HopRefusal => hop_refusal_retry(ctx.hop_status),
        RetryRule::MintFailure => mint_failure_retry(ctx.hop_status),
    };
    Resolution {
        code,
        phase,
        outcome,
        retry,
    }
}

/// SPEC §1.4 `PROXY_TUNNEL_REFUSED`: a hop that forbids the tunnel (403) or wants other
/// credentials (407) refuses again until something changes; anything else may pass.
const fn hop_refusal_retry(hop_status: Option<u16>) -> Retry {
    match hop_status {
        Some(403 | 407) => Retry::AfterCorrection,
        _ => Retry::Backoff,
    }
}

/// SPEC §1.4 `CREDENTIAL_MINT_FAILED`: a token endpoint that answered `4xx` refuses the
/// grant until its material or config changes; no answer, a `5xx` or a bad body may pass.
const fn mint_failure_retry(token_status: Option<u16>) -> Retry {
    match token_status {
        Some(400..=499) => Retry::AfterCorrection,
        _ => Retry::Backoff,
    }
}

/// What the journal proves about an invocation that was live when postern stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryFacts {
    /// `DISPATCH_STARTED` is durable in the invocation's current generation.
    pub dispatched: bool,
    /// `RESULT_COMMITTED`, the resolving event (SPEC §5.5), is durable.
    pub result_committed: bool,
    /// The result store holds the committed result under the invocation id.
    pub result_retrievable: bool,
}

/// SPEC §2 "Recovery at start": the code that settles a live invocation. `fetch_result`
/// (from `RESULT_DELIVERY_FAILED`) only when a result is there to fetch; received status
/// and digest without `RESULT_COMMITTED` resolve nothing, so that stays `BROKER_RESTARTED`.
pub const fn recovery_code(facts: RecoveryFacts) -> Code {
    if facts.result_committed && facts.result_retrievable {
        Code::ResultDeliveryFailed
    } else if facts.result_committed {
        // Resolved, but the result is gone (its retention passed): the outcome stands,
        // there is nothing to fetch and nothing to repeat.
        Code::ResultStoreFailed
    } else if facts.dispatched {
        Code::BrokerRestarted
    } else {
        Code::BrokerRestartedBeforeDispatch
    }
}

/// `committed` and `rejected` are final.
pub const fn is_resolved(outcome: Outcome) -> bool {
    matches!(outcome, Outcome::Committed | Outcome::Rejected)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(dispatched: bool) -> FailureContext {
        FailureContext {
            phase_reached: if dispatched {
                Phase::RemoteExecution
            } else {
                Phase::ConnectionSetup
            },
            current_outcome: if dispatched {
                Outcome::Unknown
            } else {
                Outcome::NotAttempted
            },
            dispatched,
            result_stored: false,
            operation: OperationFacts::default(),
            now_ms: 1_000,
            hop_status: None,
        }
    }

    #[test]
    fn a_refused_tunnel_asks_for_correction_only_on_403_and_407() {
        for (status, retry) in [
            (Some(403), Retry::AfterCorrection),
            (Some(407), Retry::AfterCorrection),
            (Some(503), Retry::Backoff),
            (Some(502), Retry::Backoff),
            (None, Retry::Backoff),
        ] {
            let ctx = FailureContext {
                hop_status: status,
                ..ctx(false)
            };
            let r = resolve_failure(Code::ProxyTunnelRefused, &ctx);
            assert_eq!(
                (r.phase, r.outcome, r.retry),
                (Phase::ConnectionSetup, Outcome::NotAttempted, retry),
                "{status:?}"
            );
        }
    }

    #[test]
    fn a_failed_mint_asks_for_correction_only_when_the_token_endpoint_answered_4xx() {
        for (status, retry) in [
            (Some(400), Retry::AfterCorrection),
            (Some(401), Retry::AfterCorrection),
            (Some(500), Retry::Backoff),
            (Some(503), Retry::Backoff),
            (None, Retry::Backoff),
        ] {
            let ctx = FailureContext {
                hop_status: status,
                ..ctx(false)
            };
            let r = resolve_failure(Code::CredentialMintFailed, &ctx);
            assert_eq!(
                (r.phase, r.outcome, r.retry),
                (Phase::CredentialInjection, Outcome::NotAttempted, retry),
                "{status:?}"
            );
        }
    }

    #[test]
    fn a_refused_tunnel_after_an_earlier_dispatch_stays_unknown_and_computes_retry() {
        let ctx = FailureContext {
            hop_status: Some(503),
            ..ctx(true)
        };
        let r = resolve_failure(Code::ProxyTunnelRefused, &ctx);
        assert_eq!((r.outcome, r.retry), (Outcome::Unknown, Retry::Reconcile));
    }

    #[test]
    fn every_code_matches_its_spec_row_before_dispatch() {
        // (code, phase, outcome, retry) per SPEC §1.4 with a non-idempotent operation.
        use Code::*;
        use Outcome::*;
        use Phase::*;
        use Retry::*;
        let table = [
            (
                AgentUnauthenticated,
                Validation,
                NotAttempted,
                AfterCorrection,
            ),
            (InvalidTarget, Validation, NotAttempted, AfterCorrection),
            (RouteDenied, Validation, NotAttempted, AfterCorrection),
            (UnsupportedAction, Validation, NotAttempted, AfterCorrection),
            (PayloadLimit, Validation, NotAttempted, AfterCorrection),
            (UnknownCredential, Validation, NotAttempted, AfterCorrection),
            (ForbiddenHeader, Validation, NotAttempted, AfterCorrection),
            (MalformedRequest, Validation, NotAttempted, AfterCorrection),
            (
                IdempotencyMismatch,
                Validation,
                NotAttempted,
                AfterCorrection,
            ),
            (
                FingerprintChanged,
                Validation,
                NotAttempted,
                AfterCorrection,
            ),
            (AttemptInProgress, Validation, NotAttempted, FetchResult),
            (ResendRefused, Validation, NotAttempted, Reconcile),
            (JournalUnavailable, Validation, NotAttempted, Backoff),
            (RateLimited, Validation, NotAttempted, Backoff),
            (AgentSuspended, Validation, NotAttempted, AfterCorrection),
            (
                VaultLocked,
                CredentialInjection,
                NotAttempted,
                AfterCorrection,
            ),
            (
                CredentialMissing,
                CredentialInjection,
                NotAttempted,
                AfterCorrection,
            ),
            (
                InjectionModeUnsupported,
                CredentialInjection,
                NotAttempted,
                AfterCorrection,
            ),
            (
                CredentialDecryptFailed,
                CredentialInjection,
                NotAttempted,
                AfterCorrection,
            ),
            (ApprovalDenied, CredentialInjection, NotAttempted, Never),
            (
                ApprovalTimeout,
                CredentialInjection,
                NotAttempted,
                AfterCorrection,
            ),
            (DnsError, ConnectionSetup, NotAttempted, Backoff),
            (ConnectionRefused, ConnectionSetup, NotAttempted, Backoff),
            (ConnectTimeout, ConnectionSetup, NotAttempted, Backoff),
            (
                TlsCertificateError,
                ConnectionSetup,
                NotAttempted,
                AfterCorrection,
            ),
            (TlsHandshakeError, ConnectionSetup, NotAttempted, Backoff),
            (
                DestinationProhibited,
                ConnectionSetup,
                NotAttempted,
                AfterCorrection,
            ),
            (
                SshHostKeyMismatch,
                ConnectionSetup,
                NotAttempted,
                AfterCorrection,
            ),
            (
                SshAuthFailed,
                ConnectionSetup,
                NotAttempted,
                AfterCorrection,
            ),
            (SshChannelFailed, ConnectionSetup, NotAttempted, Backoff),
            (ProxyTunnelRefused, ConnectionSetup, NotAttempted, Backoff),
            (
                BrokerRestartedBeforeDispatch,
                ConnectionSetup,
                NotAttempted,
                Backoff,
            ),
            (
                RetryBudgetExhausted,
                ConnectionSetup,
                NotAttempted,
                AfterCorrection,
            ),
        ];
        for (code, phase, outcome, retry) in table {
            let r = resolve_failure(code, &ctx(false));
            assert_eq!(
                (r.phase, r.outcome, r.retry),
                (phase, outcome, retry),
                "{code}"
            );
        }
    }

    #[test]
    fn every_code_after_dispatch_is_never_not_attempted() {
        for &code in Code::ALL {
            let r = resolve_failure(code, &ctx(true));
            assert_ne!(r.outcome, Outcome::NotAttempted, "{code}");
        }
    }

    #[test]
    fn unknown_codes_compute_retry_from_the_operation() {
        use Code::*;
        for code in [
            RemoteOutcomeUnknown,
            RemoteResultIncomplete,
            RemoteTimeout,
            CallerCancelled,
            BrokerRestarted,
            UpstreamHopError,
        ] {
            let mut c = ctx(true);
            let r = resolve_failure(code, &c);
            assert_eq!(
                (r.phase, r.outcome, r.retry),
                (Phase::RemoteExecution, Outcome::Unknown, Retry::Reconcile),
                "{code}"
            );
            c.operation.idempotent = true;
            assert_eq!(resolve_failure(code, &c).retry, Retry::Backoff, "{code}");
            c.operation.idempotent = false;
            c.operation.idempotency_key = Some(KeyWindow {
                safe_until_ms: 2_000,
            });
            assert_eq!(
                resolve_failure(code, &c).retry,
                Retry::SameIdempotencyKey,
                "{code}"
            );
            c.now_ms = 2_000;
            assert_eq!(resolve_failure(code, &c).retry, Retry::Reconcile, "{code}");
        }
    }

    #[test]
    fn no_generation_left_never_points_at_a_keyed_repeat() {
        let keyed = |idempotent, current| {
            let mut c = ctx(true);
            c.operation = OperationFacts {
                idempotent,
                idempotency_key: Some(KeyWindow {
                    safe_until_ms: 2_000,
                }),
                generations: Some(Generations { current, budget: 2 }),
            };
            c
        };
        let retry = |c: &FailureContext| resolve_failure(Code::RemoteOutcomeUnknown, c).retry;
        assert_eq!(retry(&keyed(false, 2)), Retry::SameIdempotencyKey);
        assert_eq!(retry(&keyed(false, 3)), Retry::Reconcile);
        assert_eq!(retry(&keyed(true, 2)), Retry::Backoff);
        assert_eq!(retry(&keyed(true, 3)), Retry::Reconcile);
        // Without a key the agent's repeat is a new invocation: idempotent stays backoff.
        let mut keyless = keyed(true, 3);
        keyless.operation.idempotency_key = None;
        assert_eq!(retry(&keyless), Retry::Backoff);
        // Nothing was sent, but the key's repeat would be refused all the same.
        let mut refused = keyed(false, 3);
        refused.dispatched = false;
        refused.current_outcome = Outcome::NotAttempted;
        let r = resolve_failure(Code::ConnectionRefused, &refused);
        assert_eq!(
            (r.outcome, r.retry),
            (Outcome::NotAttempted, Retry::AfterCorrection)
        );
        refused.operation.idempotency_key = None;
        assert_eq!(
            resolve_failure(Code::ConnectionRefused, &refused).retry,
            Retry::Backoff
        );
    }

    #[test]
    fn recovery_points_at_a_result_only_when_one_is_stored() {
        let facts = |dispatched, result_committed, result_retrievable| RecoveryFacts {
            dispatched,
            result_committed,
            result_retrievable,
        };
        use Code::*;
        assert_eq!(
            recovery_code(facts(false, false, false)),
            BrokerRestartedBeforeDispatch
        );
        assert_eq!(recovery_code(facts(true, false, false)), BrokerRestarted);
        // A stray result without its resolving event proves nothing.
        assert_eq!(recovery_code(facts(true, false, true)), BrokerRestarted);
        assert_eq!(recovery_code(facts(true, true, true)), ResultDeliveryFailed);
        assert_eq!(recovery_code(facts(true, true, false)), ResultStoreFailed);
        // Whatever the facts, fetch_result is only computed where a result is retrievable.
        for d in [false, true] {
            for c in [false, true] {
                for r in [false, true] {
                    let mut ctx = ctx(d);
                    if c {
                        ctx.current_outcome = Outcome::Committed;
                        ctx.result_stored = true;
                    }
                    let code = recovery_code(facts(d, c, r));
                    let retry = resolve_failure(code, &ctx).retry;
                    assert_eq!(retry == Retry::FetchResult, c && r, "{d} {c} {r}: {code}");
                }
            }
        }
    }

    #[test]
    fn remote_exec_rejected_is_rejected() {
        let r = resolve_failure(Code::RemoteExecRejected, &ctx(true));
        assert_eq!(
            (r.phase, r.outcome, r.retry),
            (
                Phase::RemoteExecution,
                Outcome::Rejected,
                Retry::AfterCorrection
            )
        );
    }

    #[test]
    fn delivery_failure_keeps_the_resolved_outcome() {
        for resolved in [Outcome::Committed, Outcome::Rejected] {
            let mut c = ctx(true);
            c.current_outcome = resolved;
            c.result_stored = true;
            let r = resolve_failure(Code::ResultDeliveryFailed, &c);
            assert_eq!(
                (r.phase, r.outcome, r.retry),
                (Phase::ResultDelivery, resolved, Retry::FetchResult)
            );
        }
    }

    #[test]
    fn result_store_failure_is_committed_only_when_provable() {
        let mut c = ctx(true);
        let r = resolve_failure(Code::ResultStoreFailed, &c);
        assert_eq!((r.outcome, r.retry), (Outcome::Unknown, Retry::Reconcile));
        c.result_stored = true;
        c.current_outcome = Outcome::Committed;
        let r = resolve_failure(Code::ResultStoreFailed, &c);
        assert_eq!((r.outcome, r.retry), (Outcome::Committed, Retry::Reconcile));
    }

    #[test]
    fn budget_exhausted_reconciles_only_unknown() {
        let r = resolve_failure(Code::RetryBudgetExhausted, &ctx(true));
        assert_eq!((r.outcome, r.retry), (Outcome::Unknown, Retry::Reconcile));
        let r = resolve_failure(Code::RetryBudgetExhausted, &ctx(false));
        assert_eq!(
            (r.outcome, r.retry),
            (Outcome::NotAttempted, Retry::AfterCorrection)
        );
    }

    #[test]
    fn pre_dispatch_code_in_a_later_generation_stays_unknown() {
        let mut c = ctx(true);
        c.operation.idempotent = true;
        let r = resolve_failure(Code::ConnectionRefused, &c);
        assert_eq!(
            (r.phase, r.outcome, r.retry),
            (Phase::ConnectionSetup, Outcome::Unknown, Retry::Backoff)
        );
        c.operation.idempotent = false;
        assert_eq!(
            resolve_failure(Code::TlsCertificateError, &c).retry,
            Retry::Reconcile
        );
    }
}
