//! The error contract: codes, phases, outcomes, retry, envelope and `decide`.
//!
//! Pure: no sockets, no files, no clock. Transports report observations to the
//! journal; the journal's projection asks this module what they mean.

mod codes;
mod decide;
mod envelope;
mod hints;
mod resolve;
mod status;
mod tls;
mod tunnel;
mod version;

pub use codes::{Code, CodeRow, Outcome, OutcomeRule, Phase, PhaseRule, Retry, RetryRule};
pub use decide::{OperationView, RecordFacts, Verdict, decide};
pub use envelope::{
    AttemptEvidence, Completion, CredentialEvidence, Envelope, ErrorBody, Evidence,
    IdempotencyEvidence, POSTERN_RESOURCE, Stage, journal_unavailable, never_sent, postern_outcome,
    proxy_status, read_postern_outcome, unanswered, unjournaled_refusal, unrecorded_invocation,
};
pub use hints::{should_retry, should_retry_value};
pub use resolve::{
    FailureContext, Generations, KeyWindow, OperationFacts, RecoveryFacts, Resolution, is_resolved,
    recovery_code, resolve_failure, retry_for_unknown,
};
pub use status::{
    ResponseFacts, StatusOverrides, StatusResolution, classify_exit, classify_grpc_status,
    classify_status, parse_grpc_status,
};
pub use tls::TlsProblem;
pub use tunnel::{
    ClosedBy, FrameError, TunnelEvidence, UpgradeEvidence, classify_tunnel, classify_upgrade,
};
pub use version::{DIGEST_PREFIX, DigestOf, SecretVersion};
