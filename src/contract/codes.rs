//! The closed vocabularies of the error contract (SPEC §1.1–§1.4, §5.5).

use serde::{Deserialize, Serialize};

/// Where postern stopped (SPEC §1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Rejected before any secret was selected or used.
    Validation,
    /// The credential could not be fetched, approved or attached.
    CredentialInjection,
    /// DNS, route, TCP, TLS, tunnel, SSH transport or auth failed before dispatch.
    ConnectionSetup,
    /// Dispatched; postern waits for or holds the remote result.
    RemoteExecution,
    /// The result is durably stored but could not be fully handed to the caller.
    ResultDelivery,
}

/// What is known about remote execution (SPEC §1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Durable evidence shows the operation never crossed the dispatch boundary.
    NotAttempted,
    /// The remote returned a complete, authoritative rejection.
    Rejected,
    /// postern holds a complete, authoritative result (not "success").
    Committed,
    /// Dispatch may have happened; no complete, deciding result.
    Unknown,
}

/// What automation may do now (SPEC §1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Retry {
    /// Never repeat this operation.
    Never,
    /// Repeat only after changing the request, config or credential.
    AfterCorrection,
    /// A new attempt is safe after a pause.
    Backoff,
    /// Repeat with the same idempotency key; the remote deduplicates.
    SameIdempotencyKey,
    /// Find out what happened remotely before anything else.
    Reconcile,
    /// The result exists: fetch it by invocation id.
    FetchResult,
}

macro_rules! str_enum {
    ($ty:ident { $($variant:ident => $s:literal),+ $(,)? }) => {
        impl $ty {
            /// The wire name.
            pub const fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $s),+ }
            }
            /// Every variant, in declaration order.
            pub const ALL: &'static [$ty] = &[$(Self::$variant),+];
            /// Parses the wire name.
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($s => Some(Self::$variant),)+ _ => None }
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

str_enum!(Phase {
    Validation => "validation",
    CredentialInjection => "credential_injection",
    ConnectionSetup => "connection_setup",
    RemoteExecution => "remote_execution",
    ResultDelivery => "result_delivery",
});

str_enum!(Outcome {
    NotAttempted => "not_attempted",
    Rejected => "rejected",
    Committed => "committed",
    Unknown => "unknown",
});

str_enum!(Retry {
    Never => "never",
    AfterCorrection => "after_correction",
    Backoff => "backoff",
    SameIdempotencyKey => "same_idempotency_key",
    Reconcile => "reconcile",
    FetchResult => "fetch_result",
});

/// Every failure code (SPEC §1.4). Closed: extend only by adding variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Code {
    AgentUnauthenticated,
    InvalidTarget,
    RouteDenied,
    UnsupportedAction,
    PayloadLimit,
    UnknownCredential,
    ForbiddenHeader,
    MalformedRequest,
    IdempotencyMismatch,
    FingerprintChanged,
    AttemptInProgress,
    JournalUnavailable,
    /// An operator suspended the agent (SPEC §5.8 kill switch): nothing of it is sent.
    AgentSuspended,
    /// The agent's share of a limit is in use (SPEC §5.9 rate limits; the buffer budget).
    RateLimited,
    VaultLocked,
    CredentialMissing,
    InjectionModeUnsupported,
    CredentialDecryptFailed,
    ApprovalDenied,
    ApprovalTimeout,
    DnsError,
    ConnectionRefused,
    ConnectTimeout,
    TlsCertificateError,
    TlsHandshakeError,
    DestinationProhibited,
    SshHostKeyMismatch,
    SshAuthFailed,
    SshChannelFailed,
    /// A `via` hop answered the `CONNECT` with a non-2xx status (SPEC §3.6).
    ProxyTunnelRefused,
    RemoteOutcomeUnknown,
    RemoteResultIncomplete,
    RemoteTimeout,
    CallerCancelled,
    BrokerRestarted,
    BrokerRestartedBeforeDispatch,
    UpstreamHopError,
    RetryBudgetExhausted,
    RemoteExecRejected,
    ResultDeliveryFailed,
    /// An identical resend of an invocation that may have run (SPEC §3.7): nothing sent.
    ResendRefused,
    ResultStoreFailed,
    /// A minted credential's token endpoint failed (SPEC §3.8): the request was not sent.
    CredentialMintFailed,
}

str_enum!(Code {
    AgentUnauthenticated => "AGENT_UNAUTHENTICATED",
    InvalidTarget => "INVALID_TARGET",
    RouteDenied => "ROUTE_DENIED",
    UnsupportedAction => "UNSUPPORTED_ACTION",
    PayloadLimit => "PAYLOAD_LIMIT",
    UnknownCredential => "UNKNOWN_CREDENTIAL",
    ForbiddenHeader => "FORBIDDEN_HEADER",
    MalformedRequest => "MALFORMED_REQUEST",
    IdempotencyMismatch => "IDEMPOTENCY_MISMATCH",
    FingerprintChanged => "FINGERPRINT_CHANGED",
    AttemptInProgress => "ATTEMPT_IN_PROGRESS",
    JournalUnavailable => "JOURNAL_UNAVAILABLE",
    AgentSuspended => "AGENT_SUSPENDED",
    RateLimited => "RATE_LIMITED",
    VaultLocked => "VAULT_LOCKED",
    CredentialMissing => "CREDENTIAL_MISSING",
    InjectionModeUnsupported => "INJECTION_MODE_UNSUPPORTED",
    CredentialDecryptFailed => "CREDENTIAL_DECRYPT_FAILED",
    ApprovalDenied => "APPROVAL_DENIED",
    ApprovalTimeout => "APPROVAL_TIMEOUT",
    DnsError => "DNS_ERROR",
    ConnectionRefused => "CONNECTION_REFUSED",
    ConnectTimeout => "CONNECT_TIMEOUT",
    TlsCertificateError => "TLS_CERTIFICATE_ERROR",
    TlsHandshakeError => "TLS_HANDSHAKE_ERROR",
    DestinationProhibited => "DESTINATION_PROHIBITED",
    SshHostKeyMismatch => "SSH_HOST_KEY_MISMATCH",
    SshAuthFailed => "SSH_AUTH_FAILED",
    SshChannelFailed => "SSH_CHANNEL_FAILED",
    ProxyTunnelRefused => "PROXY_TUNNEL_REFUSED",
    RemoteOutcomeUnknown => "REMOTE_OUTCOME_UNKNOWN",
    RemoteResultIncomplete => "REMOTE_RESULT_INCOMPLETE",
    RemoteTimeout => "REMOTE_TIMEOUT",
    CallerCancelled => "CALLER_CANCELLED",
    BrokerRestarted => "BROKER_RESTARTED",
    BrokerRestartedBeforeDispatch => "BROKER_RESTARTED_BEFORE_DISPATCH",
    UpstreamHopError => "UPSTREAM_HOP_ERROR",
    RetryBudgetExhausted => "RETRY_BUDGET_EXHAUSTED",
    RemoteExecRejected => "REMOTE_EXEC_REJECTED",
    ResultDeliveryFailed => "RESULT_DELIVERY_FAILED",
    ResendRefused => "RESEND_REFUSED",
    ResultStoreFailed => "RESULT_STORE_FAILED",
    CredentialMintFailed => "CREDENTIAL_MINT_FAILED",
});

/// A code's phase: fixed, or whatever the invocation had reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseRule {
    Fixed(Phase),
    /// `ATTEMPT_IN_PROGRESS`, `RETRY_BUDGET_EXHAUSTED`, `BROKER_RESTARTED_BEFORE_DISPATCH`.
    Reached,
}

/// A code's outcome: fixed, or derived from the invocation's evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeRule {
    Fixed(Outcome),
    /// The invocation keeps the outcome it already has.
    Own,
    /// `RESULT_STORE_FAILED`: committed only if durably provable, else unknown.
    CommittedIfProvable,
}

/// A code's retry directive: fixed, or computed (SPEC §1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryRule {
    Fixed(Retry),
    /// Computed for `unknown` from method semantics and idempotency evidence.
    ComputedUnknown,
    /// `RETRY_BUDGET_EXHAUSTED`: reconcile if unknown, else after_correction.
    BudgetExhausted,
    /// `PROXY_TUNNEL_REFUSED`: after_correction for the hop's 403/407, else backoff.
    HopRefusal,
    /// `CREDENTIAL_MINT_FAILED`: after_correction when the token endpoint answered `4xx`
    /// (the grant or its material is wrong), else backoff.
    MintFailure,
}

/// The row of SPEC §1.4 for one code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeRow {
    pub phase: PhaseRule,
    pub outcome: OutcomeRule,
    pub retry: RetryRule,
}

impl Code {
    /// The defaults of SPEC §1.4.
    pub const fn row(self) -> CodeRow {
        use Code::*;
        use OutcomeRule as O;
        use PhaseRule as P;
        use RetryRule as R;
        const NA: OutcomeRule = OutcomeRule::Fixed(Outcome::NotAttempted);
        const UNK: OutcomeRule = OutcomeRule::Fixed(Outcome::Unknown);
        let (phase, outcome, retry) = match self {
            AgentUnauthenticated | InvalidTarget | RouteDenied | UnsupportedAction
            | PayloadLimit | UnknownCredential | ForbiddenHeader | MalformedRequest
            | IdempotencyMismatch | FingerprintChanged | AgentSuspended => (
                P::Fixed(Phase::Validation),
                NA,
                R::Fixed(Retry::AfterCorrection),
            ),
            AttemptInProgress => (
                P::Fixed(Phase::Validation),
                O::Own,
                R::Fixed(Retry::FetchResult),
            ),
            JournalUnavailable | RateLimited => {
                (P::Fixed(Phase::Validation), NA, R::Fixed(Retry::Backoff))
            }
            VaultLocked
            | CredentialMissing
            | InjectionModeUnsupported
            | CredentialDecryptFailed
            | ApprovalTimeout => (
                P::Fixed(Phase::CredentialInjection),
                NA,
                R::Fixed(Retry::AfterCorrection),
            ),
            ApprovalDenied => (
                P::Fixed(Phase::CredentialInjection),
                NA,
                R::Fixed(Retry::Never),
            ),
            DnsError | ConnectionRefused | ConnectTimeout | TlsHandshakeError
            | SshChannelFailed => (
                P::Fixed(Phase::ConnectionSetup),
                NA,
                R::Fixed(Retry::Backoff),
            ),
            TlsCertificateError | DestinationProhibited | SshHostKeyMismatch | SshAuthFailed => (
                P::Fixed(Phase::ConnectionSetup),
                NA,
                R::Fixed(Retry::AfterCorrection),
            ),
            RemoteOutcomeUnknown
            | RemoteResultIncomplete
            | RemoteTimeout
            | CallerCancelled
            | BrokerRestarted
            | UpstreamHopError => (P::Fixed(Phase::RemoteExecution), UNK, R::ComputedUnknown),
            ProxyTunnelRefused => (P::Fixed(Phase::ConnectionSetup), NA, R::HopRefusal),
            CredentialMintFailed => (P::Fixed(Phase::CredentialInjection), NA, R::MintFailure),
            BrokerRestartedBeforeDispatch => (P::Reached, NA, R::Fixed(Retry::Backoff)),
            RetryBudgetExhausted => (P::Reached, O::Own, R::BudgetExhausted),
            RemoteExecRejected => (
                P::Fixed(Phase::RemoteExecution),
                O::Fixed(Outcome::Rejected),
                R::Fixed(Retry::AfterCorrection),
            ),
            ResultDeliveryFailed => (
                P::Fixed(Phase::ResultDelivery),
                O::Own,
                R::Fixed(Retry::FetchResult),
            ),
            ResendRefused => (P::Fixed(Phase::Validation), NA, R::Fixed(Retry::Reconcile)),
            ResultStoreFailed => (
                P::Fixed(Phase::ResultDelivery),
                O::CommittedIfProvable,
                R::Fixed(Retry::Reconcile),
            ),
        };
        CodeRow {
            phase,
            outcome,
            retry,
        }
    }

    /// True for codes that can only be reported before the dispatch boundary.
    pub const fn is_pre_dispatch(self) -> bool {
        matches!(
            self.row().outcome,
            OutcomeRule::Fixed(Outcome::NotAttempted)
        )
    }

    /// The HTTP status of postern's own error response (SPEC §5.5).
    pub const fn http_status(self) -> u16 {
        use Code::*;
        match self {
            AgentUnauthenticated => 407,
            RouteDenied | ForbiddenHeader | ApprovalDenied | ApprovalTimeout | AgentSuspended => {
                403
            }
            InvalidTarget | UnsupportedAction | MalformedRequest | UnknownCredential => 400,
            PayloadLimit => 413,
            RateLimited => 429,
            IdempotencyMismatch => 422,
            AttemptInProgress | FingerprintChanged | RetryBudgetExhausted | ResendRefused => 409,
            VaultLocked | JournalUnavailable => 503,
            CredentialMissing | InjectionModeUnsupported | CredentialDecryptFailed => 500,
            ConnectTimeout | RemoteTimeout => 504,
            DnsError
            | ConnectionRefused
            | TlsCertificateError
            | TlsHandshakeError
            | DestinationProhibited
            | SshHostKeyMismatch
            | SshAuthFailed
            | SshChannelFailed
            | ProxyTunnelRefused
            | CredentialMintFailed => 502,
            RemoteOutcomeUnknown
            | RemoteResultIncomplete
            | CallerCancelled
            | BrokerRestarted
            | BrokerRestartedBeforeDispatch
            | UpstreamHopError
            | RemoteExecRejected
            | ResultDeliveryFailed
            | ResultStoreFailed => 502,
        }
    }

    /// The RFC 9209 `error` type for `Proxy-Status` (SPEC §5.5).
    pub const fn proxy_status_error(self) -> &'static str {
        use Code::*;
        match self {
            AgentUnauthenticated | RouteDenied | ForbiddenHeader | ApprovalDenied
            | ApprovalTimeout | RateLimited | AgentSuspended => "http_request_denied",
            InvalidTarget | UnsupportedAction | MalformedRequest | PayloadLimit
            | UnknownCredential => "http_request_error",
            IdempotencyMismatch | AttemptInProgress | FingerprintChanged | RetryBudgetExhausted
            | ResendRefused => "proxy_internal_response",
            VaultLocked
            | JournalUnavailable
            | BrokerRestartedBeforeDispatch
            | CredentialMintFailed => "proxy_internal_error",
            CredentialMissing | InjectionModeUnsupported | CredentialDecryptFailed => {
                "proxy_configuration_error"
            }
            DnsError => "dns_error",
            ConnectionRefused | SshChannelFailed => "connection_refused",
            ConnectTimeout => "connection_timeout",
            TlsCertificateError | SshHostKeyMismatch => "tls_certificate_error",
            TlsHandshakeError | SshAuthFailed => "tls_protocol_error",
            DestinationProhibited => "destination_ip_prohibited",
            ProxyTunnelRefused => "destination_unavailable",
            RemoteTimeout => "http_response_timeout",
            RemoteOutcomeUnknown
            | RemoteResultIncomplete
            | CallerCancelled
            | BrokerRestarted
            | UpstreamHopError
            | RemoteExecRejected
            | ResultDeliveryFailed
            | ResultStoreFailed => "http_response_incomplete",
        }
    }

    /// A short human sentence; callers branch on the enums, never on this.
    pub const fn message(self) -> &'static str {
        use Code::*;
        match self {
            AgentUnauthenticated => "The agent did not present valid proxy credentials.",
            InvalidTarget => "The request target is not a valid destination.",
            RouteDenied => "No route allows this request for this agent.",
            UnsupportedAction => "This kind of action is not supported on this target.",
            PayloadLimit => "The request body exceeds the configured limit.",
            UnknownCredential => "The requested credential is not offered on this route.",
            ForbiddenHeader => "The request carries a header that postern injects on this route.",
            MalformedRequest => "The request framing is malformed or ambiguous.",
            IdempotencyMismatch => "The idempotency key was used before with a different request.",
            FingerprintChanged => "The request changed between approval and dispatch.",
            AttemptInProgress => "Another attempt of this invocation is in progress.",
            JournalUnavailable => "The journal cannot record new dispatches right now.",
            AgentSuspended => {
                "An operator suspended this agent; nothing is sent until it is resumed."
            }
            RateLimited => "This agent is over a limit right now; retry after a pause.",
            VaultLocked => "The vault is locked; no credential can be injected.",
            CredentialMissing => "The route's credential has no secret in the vault.",
            InjectionModeUnsupported => "The credential's injection mode does not fit this target.",
            CredentialDecryptFailed => "The credential could not be decrypted.",
            ApprovalDenied => "An operator denied this action.",
            ApprovalTimeout => "No operator answered the approval request in time.",
            DnsError => "The destination name could not be resolved.",
            ConnectionRefused => "The destination refused the connection.",
            ConnectTimeout => "Connecting to the destination timed out.",
            TlsCertificateError => "The destination's TLS certificate could not be verified.",
            TlsHandshakeError => "The TLS handshake with the destination failed.",
            DestinationProhibited => {
                "The destination address is in a range routes may not reach by name (loopback, private, link-local, …): pin the route with `resolve`, or set `allow_private = true` on it."
            }
            SshHostKeyMismatch => "The SSH host key does not match known_hosts.",
            SshAuthFailed => "SSH user authentication to the destination failed.",
            SshChannelFailed => "The SSH session channel could not be opened.",
            ProxyTunnelRefused => "The upstream proxy refused the tunnel to the destination.",
            RemoteOutcomeUnknown => "Connection closed before a complete response was recorded.",
            RemoteResultIncomplete => "The response started but did not complete.",
            RemoteTimeout => "The destination did not answer in time.",
            CallerCancelled => "The caller went away after dispatch.",
            BrokerRestarted => "postern restarted after dispatch, before a result was recorded.",
            BrokerRestartedBeforeDispatch => "postern restarted before the action was dispatched.",
            UpstreamHopError => "An upstream proxy reported an error after dispatch.",
            RetryBudgetExhausted => "The retry budget for this invocation is spent.",
            RemoteExecRejected => "The remote refused to run the command.",
            ResultDeliveryFailed => "The result is stored but could not be delivered in full.",
            ResendRefused => {
                "An identical earlier request may have run; reconcile it before sending again."
            }
            ResultStoreFailed => "The remote completed but its result could not be stored.",
            CredentialMintFailed => {
                "The credential's token endpoint did not issue an access token; nothing was sent."
            }
        }
    }
}
