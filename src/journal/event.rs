//! Journal events: what was observed, in global `seq` order, hash-chained.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::contract::{
    Code, Completion, CredentialEvidence, IdempotencyEvidence, Outcome, Retry, Stage,
    UpgradeEvidence,
};

/// The hash before the first event.
pub const GENESIS_HASH: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Event kinds (SPEC §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventKind {
    ActionAccepted,
    PreflightValidated,
    CredentialAuthorized,
    ApprovalRequested,
    ApprovalGranted,
    ApprovalDenied,
    ConnectAttempt,
    DispatchStarted,
    RequestSent,
    RemoteResponseStarted,
    RemoteResponseComplete,
    ResultCommitted,
    ResultDelivered,
    Failed,
    Reconciled,
    RetryLeased,
    /// The daemon's own: a config reload applied or refused (no invocation's).
    ConfigReloaded,
    /// The daemon's own: events before a checkpoint were pruned (retention).
    JournalPruned,
    /// The daemon's own: an operator suspended an agent (SPEC §5.8 kill switch).
    AgentSuspended,
    /// The daemon's own: an operator lifted an agent's suspension.
    AgentResumed,
    /// A fleet's node takes over another node's invocation for its next generation: the
    /// record as the owner published it (SPEC §7).
    InvocationAdopted,
}

impl EventKind {
    pub const ALL: &'static [EventKind] = &[
        Self::ActionAccepted,
        Self::PreflightValidated,
        Self::CredentialAuthorized,
        Self::ApprovalRequested,
        Self::ApprovalGranted,
        Self::ApprovalDenied,
        Self::ConnectAttempt,
        Self::DispatchStarted,
        Self::RequestSent,
        Self::RemoteResponseStarted,
        Self::RemoteResponseComplete,
        Self::ResultCommitted,
        Self::ResultDelivered,
        Self::Failed,
        Self::Reconciled,
        Self::RetryLeased,
        Self::ConfigReloaded,
        Self::JournalPruned,
        Self::AgentSuspended,
        Self::AgentResumed,
        Self::InvocationAdopted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ActionAccepted => "ACTION_ACCEPTED",
            Self::PreflightValidated => "PREFLIGHT_VALIDATED",
            Self::CredentialAuthorized => "CREDENTIAL_AUTHORIZED",
            Self::ApprovalRequested => "APPROVAL_REQUESTED",
            Self::ApprovalGranted => "APPROVAL_GRANTED",
            Self::ApprovalDenied => "APPROVAL_DENIED",
            Self::ConnectAttempt => "CONNECT_ATTEMPT",
            Self::DispatchStarted => "DISPATCH_STARTED",
            Self::RequestSent => "REQUEST_SENT",
            Self::RemoteResponseStarted => "REMOTE_RESPONSE_STARTED",
            Self::RemoteResponseComplete => "REMOTE_RESPONSE_COMPLETE",
            Self::ResultCommitted => "RESULT_COMMITTED",
            Self::ResultDelivered => "RESULT_DELIVERED",
            Self::Failed => "FAILED",
            Self::Reconciled => "RECONCILED",
            Self::RetryLeased => "RETRY_LEASED",
            Self::ConfigReloaded => "CONFIG_RELOADED",
            Self::JournalPruned => "JOURNAL_PRUNED",
            Self::AgentSuspended => "AGENT_SUSPENDED",
            Self::AgentResumed => "AGENT_RESUMED",
            Self::InvocationAdopted => "INVOCATION_ADOPTED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.as_str() == s)
    }
}

/// How postern knows what an event says (SPEC §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    TransportObserved,
    RemoteResponse,
    RemoteQuery,
    OperatorAttested,
    Recovery,
}

impl Source {
    /// The wire name (as serde writes it).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TransportObserved => "transport_observed",
            Self::RemoteResponse => "remote_response",
            Self::RemoteQuery => "remote_query",
            Self::OperatorAttested => "operator_attested",
            Self::Recovery => "recovery",
        }
    }

    pub const ALL: &'static [Source] = &[
        Self::TransportObserved,
        Self::RemoteResponse,
        Self::RemoteQuery,
        Self::OperatorAttested,
        Self::Recovery,
    ];

    /// Sources that may turn an `unknown` into a resolved outcome.
    pub fn can_resolve_unknown(self) -> bool {
        matches!(
            self,
            Self::RemoteResponse | Self::RemoteQuery | Self::OperatorAttested
        )
    }
}

/// The observed facts an event carries, one variant per kind. Every struct inside declares
/// its fields in key order (`data_json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Body {
    ActionAccepted(Accepted),
    PreflightValidated(Preflight),
    CredentialAuthorized(CredentialEvidence),
    ApprovalRequested(ApprovalRequest),
    ApprovalGranted(ApprovalAnswer),
    ApprovalDenied(ApprovalAnswer),
    ConnectAttempt(ConnectAttempt),
    DispatchStarted(Dispatch),
    RequestSent(RequestSent),
    RemoteResponseStarted(ResponseStarted),
    RemoteResponseComplete(ResponseComplete),
    ResultCommitted(ResultCommitted),
    ResultDelivered(Delivered),
    Failed(Failure),
    Reconciled(Reconciliation),
    RetryLeased(Lease),
    ConfigReloaded(ConfigReload),
    JournalPruned(Checkpoint),
    AgentSuspended(AgentSwitch),
    AgentResumed(AgentSwitch),
    InvocationAdopted(Adoption),
}

impl Body {
    pub fn kind(&self) -> EventKind {
        match self {
            Self::ActionAccepted(_) => EventKind::ActionAccepted,
            Self::PreflightValidated(_) => EventKind::PreflightValidated,
            Self::CredentialAuthorized(_) => EventKind::CredentialAuthorized,
            Self::ApprovalRequested(_) => EventKind::ApprovalRequested,
            Self::ApprovalGranted(_) => EventKind::ApprovalGranted,
            Self::ApprovalDenied(_) => EventKind::ApprovalDenied,
            Self::ConnectAttempt(_) => EventKind::ConnectAttempt,
            Self::DispatchStarted(_) => EventKind::DispatchStarted,
            Self::RequestSent(_) => EventKind::RequestSent,
            Self::RemoteResponseStarted(_) => EventKind::RemoteResponseStarted,
            Self::RemoteResponseComplete(_) => EventKind::RemoteResponseComplete,
            Self::ResultCommitted(_) => EventKind::ResultCommitted,
            Self::ResultDelivered(_) => EventKind::ResultDelivered,
            Self::Failed(_) => EventKind::Failed,
            Self::Reconciled(_) => EventKind::Reconciled,
            Self::RetryLeased(_) => EventKind::RetryLeased,
            Self::ConfigReloaded(_) => EventKind::ConfigReloaded,
            Self::JournalPruned(_) => EventKind::JournalPruned,
            Self::AgentSuspended(_) => EventKind::AgentSuspended,
            Self::AgentResumed(_) => EventKind::AgentResumed,
            Self::InvocationAdopted(_) => EventKind::InvocationAdopted,
        }
    }

    /// The event's `data` as JSON, serialized straight from the typed fields. The data
    /// structs declare their fields in key order, so this is byte for byte what the sorted
    /// `serde_json::Value` route (`split_body`, which audit and decoding use) writes,
    /// without building that tree for every event appended.
    pub fn data_json(&self) -> Vec<u8> {
        let json = match self {
            Self::ActionAccepted(d) => serde_json::to_vec(d),
            Self::PreflightValidated(d) => serde_json::to_vec(d),
            Self::CredentialAuthorized(d) => serde_json::to_vec(d),
            Self::ApprovalRequested(d) => serde_json::to_vec(d),
            Self::ApprovalGranted(d) | Self::ApprovalDenied(d) => serde_json::to_vec(d),
            Self::ConnectAttempt(d) => serde_json::to_vec(d),
            Self::DispatchStarted(d) => serde_json::to_vec(d),
            Self::RequestSent(d) => serde_json::to_vec(d),
            Self::RemoteResponseStarted(d) => serde_json::to_vec(d),
            Self::RemoteResponseComplete(d) => serde_json::to_vec(d),
            Self::ResultCommitted(d) => serde_json::to_vec(d),
            Self::ResultDelivered(d) => serde_json::to_vec(d),
            Self::Failed(d) => serde_json::to_vec(d),
            Self::Reconciled(d) => serde_json::to_vec(d),
            Self::RetryLeased(d) => serde_json::to_vec(d),
            Self::ConfigReloaded(d) => serde_json::to_vec(d),
            Self::JournalPruned(d) => serde_json::to_vec(d),
            Self::AgentSuspended(d) | Self::AgentResumed(d) => serde_json::to_vec(d),
            Self::InvocationAdopted(d) => serde_json::to_vec(d),
        };
        let json = json.unwrap_or_default();
        debug_assert_eq!(
            String::from_utf8_lossy(&json),
            serde_json::to_string(&split_body(self).1).unwrap_or_default(),
            "{:?}: data fields must be declared in key order",
            self.kind()
        );
        json
    }
}

/// The protocol of an invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Http,
    Https,
    Ssh,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    pub protocol: Protocol,
    /// Absolute URL, or `ssh://user@host:port`.
    pub target: String,
}

/// The snapshot an invocation binds at preflight (SPEC §2, "Snapshot binding").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preflight {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<CredentialEvidence>,
    /// The agent sent the credential's placeholder where it is injected (SPEC §3.7).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credential_placeholder: bool,
    pub fingerprint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<IdempotencyEvidence>,
    /// The method is in the route's `idempotent_methods`.
    pub idempotent: bool,
    /// An identical resend sent anyway (SPEC §3.7): its twin and whether the agent asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resend: Option<ResendEvidence>,
    /// The route's (or SSH target's) `retry_budget`: generations beyond the first this
    /// invocation may have. Absent in events written before it was bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_budget: Option<u32>,
    pub route: String,
    /// Unix ms until which a same-key retry is safe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_until_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub expires_at: String,
    pub fingerprint: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalAnswer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The operator's note with the verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Where it was given: `api` (and the CLI) or `console`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// One connection-setup stage and its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectAttempt {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<Code>,
    /// The transport library's own words; operators only, never an envelope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<String>,
    /// Who said it, when not postern (`proxy:<name>` for a `via` hop's answer): the event's
    /// `hop`, not part of its data.
    #[serde(skip)]
    pub hop: Option<String>,
    pub n: u32,
    pub ok: bool,
    pub stage: Stage,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispatch {
    /// The address the request goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_id: Option<String>,
    #[serde(default)]
    pub reused_connection: bool,
    /// The origin's verified TLS identity: the name checked and the leaf's digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsIdentity>,
}

/// What TLS verification proved about the origin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsIdentity {
    pub leaf_sha256: String,
    pub server_name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestSent {
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseStarted {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseComplete {
    pub bytes: u64,
    pub completion: Completion,
    pub digest: String,
}

/// The resolving event: outcome computed by `contract` from a complete result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultCommitted {
    pub bytes: u64,
    /// The output was complete (SSH output may break after an exit status).
    pub complete: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<Completion>,
    pub digest: String,
    /// Extra evidence such as `location` for a `202`.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub evidence: serde_json::Map<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i64>,
    /// The `grpc-status` that ended a gRPC call (SPEC §3.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<u32>,
    pub outcome: Outcome,
    pub retry: Retry,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivered {
    #[serde(default)]
    pub bytes: u64,
    /// After a protocol switch: what the relay carried (flattened: `protocol`,
    /// `bytes_up`, `bytes_down`, `closed_by`).
    #[serde(default, flatten, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeEvidence>,
    /// `false`: the agent read every body byte and closed before the stream's end reached
    /// it (SPEC §3.9). Never beside `upgrade`, so the keys stay in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_of_stream_delivered: Option<bool>,
}

/// A failure as observed; the projection computes its phase, outcome and retry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub code: Code,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<String>,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub evidence: serde_json::Map<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The route matched before a refusal that came ahead of the preflight (a suspended
    /// agent, a forbidden header): the record names it as a preflight would.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
}

impl From<Code> for Failure {
    fn from(code: Code) -> Self {
        Self::of(code)
    }
}

impl Failure {
    pub fn of(code: Code) -> Self {
        Self {
            code,
            field: None,
            diagnostic: None,
            evidence: serde_json::Map::new(),
            route: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciliation {
    pub note: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsafe_retry: Option<bool>,
    /// Where the operator gave it: `api` (and the CLI) or `console`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// `CONFIG_RELOADED`: what a reload changed or why it was refused — ids and config paths,
/// never a value. Its `invocation_id` is the reload's own (`rld_<ULID>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigReload {
    /// Routes, agents, credentials and SSH targets added, removed or changed.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub changes: serde_json::Value,
    /// The config paths of a refused reload's problems.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// `applied` or `refused`.
    pub result: String,
}

/// `AGENT_SUSPENDED` / `AGENT_RESUMED`: an operator's kill switch (SPEC §5.8), chained under
/// its own id (`sus_<ULID>` / `rsm_<ULID>`), source `operator_attested`.
// Fields in key order: journal data is written straight from them (`Body::data_json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSwitch {
    pub agent: String,
    /// Why, as the operator put it (`--note`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `INVOCATION_ADOPTED`: another node's invocation, as its owner published it, taken over
/// for its next generation (the lease is won in the fleet's store first). The snapshot is
/// the projected state as JSON text: it carries what earlier generations proved (a
/// dispatch, its safe window, the budget), so nothing here can call it not attempted.
// Fields in key order: journal data is written straight from them (`Body::data_json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adoption {
    pub from_node: String,
    pub snapshot: String,
}

/// `JOURNAL_PRUNED` and the checkpoint row beside it: the events up to `seq` were pruned
/// (`journal.event_retention`); `hash` is the last pruned event's, so the kept chain links
/// to it. The event, chained after the cut, is what makes a stored checkpoint verifiable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Events pruned in this cut.
    pub events: u64,
    pub hash: String,
    /// Events of records not settled at a cut (live, or `unknown`), kept aside: how many
    /// are kept now, and `sha256:` over their seqs and hashes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub islands: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub islands_digest: String,
    /// Records (settled invocations) pruned with them.
    pub records: u64,
    pub seq: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `RETRY_LEASED`: a new generation of the invocation may dispatch (SPEC §3.4).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub generation: u32,
    /// Who asked and why, in their words (an operator's note, "same idempotency key").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// A live generation this lease takes over (its worker never reached the dispatch
    /// boundary and its lease ran out): that worker is stopped by the generation check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<Supersession>,
    /// How long the new generation's worker may take to reach the dispatch boundary
    /// before another may supersede it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(default)]
    pub unsafe_override: bool,
}

/// The generation a lease took over, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Supersession {
    pub generation: u32,
    pub reason: SupersedeReason,
}

/// Why a live generation was taken over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SupersedeReason {
    /// Its worker held the lease past its expiry without reaching the dispatch boundary.
    LeaseExpired,
}

impl SupersedeReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::LeaseExpired => "lease_expired",
        }
    }
}

/// What a caller asks the journal to append.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub body: Body,
    pub source: Source,
    pub hop: String,
    pub attempt: u32,
    /// The generation the writer of this draft holds (None: whatever is current). A draft
    /// of a superseded generation is refused: that is the generation check.
    pub generation: Option<u32>,
}

impl Draft {
    /// An observation by postern's own transport.
    pub fn observed(body: Body) -> Self {
        Self {
            body,
            source: Source::TransportObserved,
            hop: "postern".into(),
            attempt: 0,
            generation: None,
        }
    }

    pub fn source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    pub fn hop(mut self, hop: &str) -> Self {
        self.hop = hop.to_owned();
        self
    }

    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    pub fn generation(mut self, generation: u32) -> Self {
        self.generation = Some(generation);
        self
    }
}

/// A journaled event, exactly the shape of SPEC §5.5.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub invocation_id: String,
    pub attempt: u32,
    pub generation: u32,
    pub ts: String,
    pub kind: EventKind,
    pub source: Source,
    pub hop: String,
    pub data: serde_json::Value,
    pub prev_hash: String,
    pub hash: String,
}

/// A chained event with its `data` as the JSON its hash was computed over, so the store
/// does not serialize it a second time.
#[derive(Debug, Clone)]
pub struct Sealed {
    pub event: Event,
    pub data_json: Vec<u8>,
}

impl Event {
    /// The typed body; `None` if the stored data does not fit its kind.
    pub fn body(&self) -> Option<Body> {
        let tagged = serde_json::json!({"kind": self.kind, "data": self.data});
        serde_json::from_value(tagged).ok()
    }

    /// SHA-256 over the canonical bytes of everything but `hash`.
    pub fn compute_hash(&self) -> String {
        let data = serde_json::to_vec(&self.data).unwrap_or_default();
        self.hash_over(&data)
    }

    /// `compute_hash`, with `data` given as the JSON it serializes to.
    pub fn hash_over(&self, data_json: &[u8]) -> String {
        sha256_tagged(&self.canonical_bytes(data_json))
    }

    /// Sets `hash` in place (tests build chains by hand).
    #[cfg(test)]
    pub fn seal(&mut self) {
        self.hash = self.compute_hash();
    }

    /// Sets `hash`: the event is chained.
    pub fn sealed(self) -> Sealed {
        let data_json = serde_json::to_vec(&self.data).unwrap_or_default();
        self.sealed_over(data_json)
    }

    /// `sealed`, with `data` given as its JSON (`Body::data_json`); the writer leaves
    /// `data` itself `Null` then, as nothing after the store reads it.
    pub fn sealed_over(mut self, data_json: Vec<u8>) -> Sealed {
        self.hash = self.hash_over(&data_json);
        Sealed {
            event: self,
            data_json,
        }
    }

    /// The event as compact JSON with the fields in this order and without `hash`; `data`
    /// (a `Value`, so its keys are sorted) given as its JSON. What `serde_json` writes for
    /// the same fields, assembled here so `data` is serialized once for hash and store.
    fn canonical_bytes(&self, data: &[u8]) -> Vec<u8> {
        fn field(out: &mut Vec<u8>, name: &str, value: &impl Serialize) {
            out.push(if out.is_empty() { b'{' } else { b',' });
            let _ = serde_json::to_writer(&mut *out, name);
            out.push(b':');
            let _ = serde_json::to_writer(&mut *out, value);
        }
        let mut out = Vec::with_capacity(320 + data.len());
        field(&mut out, "seq", &self.seq);
        field(&mut out, "invocation_id", &self.invocation_id);
        field(&mut out, "attempt", &self.attempt);
        field(&mut out, "generation", &self.generation);
        field(&mut out, "ts", &self.ts);
        field(&mut out, "kind", &self.kind);
        field(&mut out, "source", &self.source);
        field(&mut out, "hop", &self.hop);
        out.extend_from_slice(b",\"data\":");
        out.extend_from_slice(data);
        field(&mut out, "prev_hash", &self.prev_hash);
        out.push(b'}');
        out
    }
}

/// Splits a body into the `kind` and `data` fields of an event.
pub fn split_body(body: &Body) -> (EventKind, serde_json::Value) {
    let data = match serde_json::to_value(body) {
        Ok(serde_json::Value::Object(mut map)) => map.remove("data"),
        _ => None,
    };
    (body.kind(), data.unwrap_or(serde_json::Value::Null))
}

/// `sha256:<hex>` of some bytes.
pub fn sha256_tagged(bytes: &[u8]) -> String {
    sha256_tagged_digest(&Sha256::digest(bytes))
}

/// `sha256:<hex>` of a finished digest.
pub fn sha256_tagged_digest(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest.iter() {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

/// The twin a resend names in its evidence (`resend_of`).
// Fields in key order: journal data is written straight from them (`Body::data_json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TwinRef {
    pub code: Option<crate::contract::Code>,
    pub invocation_id: String,
    pub outcome: crate::contract::Outcome,
}

/// Journaled at the preflight of a resend that is dispatched anyway.
// Fields in key order: journal data is written straight from them (`Body::data_json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResendEvidence {
    /// `Postern-Resend: deliberate` asked for a new invocation whatever the twin.
    pub resend_deliberate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resend_of: Option<TwinRef>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_names_itself_as_serde_writes_it() {
        for source in Source::ALL {
            let json = serde_json::to_value(source).unwrap();
            assert_eq!(json.as_str(), Some(source.as_str()));
        }
    }

    /// Every kind with every optional field set: the straight serialization matches the
    /// sorted one the audit and the API read (`data_json` also asserts it in debug builds).
    #[test]
    fn data_is_written_in_key_order_for_every_kind() {
        let some = |s: &str| Some(s.to_owned());
        let mut evidence = serde_json::Map::new();
        evidence.insert("z".into(), 1.into());
        evidence.insert("a".into(), serde_json::json!({"y": 1, "b": 2}));
        let credential = CredentialEvidence {
            id: "c".into(),
            mode: "bearer".into(),
            version: 2.into(),
        };
        let twin = super::TwinRef {
            code: Some(Code::RemoteTimeout),
            invocation_id: "act_t".into(),
            outcome: Outcome::Unknown,
        };
        let upgrade = UpgradeEvidence {
            bytes_down: 1,
            bytes_up: 2,
            closed_by: crate::contract::ClosedBy::Origin,
            protocol: "websocket".into(),
            protocol_error: Some(crate::contract::FrameError::Masked),
            redactions: 3,
        };
        let bodies = [
            Body::ActionAccepted(Accepted {
                agent: "a".into(),
                command: some("id"),
                method: some("exec"),
                protocol: Protocol::Ssh,
                target: "ssh://u@h:22".into(),
            }),
            Body::PreflightValidated(Preflight {
                credential: Some(credential),
                credential_placeholder: true,
                fingerprint: "sha256:f".into(),
                idempotency: Some(IdempotencyEvidence {
                    fingerprint: "sha256:f".into(),
                    key: "k".into(),
                    remote_contract: "none".into(),
                    safe_until: some("2026-01-01T00:00:00Z"),
                    scope: "s".into(),
                }),
                idempotent: true,
                resend: Some(super::ResendEvidence {
                    resend_deliberate: true,
                    resend_of: Some(twin),
                }),
                retry_budget: Some(3),
                route: "r".into(),
                safe_until_ms: Some(9),
            }),
            Body::ApprovalRequested(ApprovalRequest {
                expires_at: "2026-01-01T00:00:00Z".into(),
                fingerprint: "sha256:f".into(),
            }),
            Body::ApprovalGranted(ApprovalAnswer {
                by: some("op"),
                note: some("n"),
                via: some("console"),
            }),
            Body::ConnectAttempt(ConnectAttempt {
                address: some("127.0.0.1:1"),
                code: Some(Code::ConnectTimeout),
                diagnostic: some("refused"),
                hop: some("proxy:p"),
                n: 1,
                ok: false,
                stage: Stage::TcpConnect,
            }),
            Body::DispatchStarted(Dispatch {
                address: some("127.0.0.1:1"),
                connection_id: some("c1"),
                reused_connection: true,
                tls: Some(TlsIdentity {
                    leaf_sha256: "ab".into(),
                    server_name: "h".into(),
                }),
            }),
            Body::RequestSent(RequestSent { bytes: 1 }),
            Body::RemoteResponseStarted(ResponseStarted { status: Some(200) }),
            Body::RemoteResponseComplete(ResponseComplete {
                bytes: 1,
                completion: Completion::LastChunk,
                digest: "sha256:d".into(),
            }),
            Body::ResultCommitted(ResultCommitted {
                bytes: 1,
                complete: true,
                completion: Some(Completion::EndStream),
                digest: "sha256:d".into(),
                evidence: evidence.clone(),
                exit_signal: some("KILL"),
                exit_status: Some(1),
                grpc_status: Some(2),
                outcome: Outcome::Committed,
                retry: Retry::Never,
                status: Some(200),
            }),
            Body::ResultDelivered(Delivered {
                bytes: 4,
                upgrade: Some(upgrade),
                end_of_stream_delivered: None,
            }),
            Body::ResultDelivered(Delivered {
                bytes: 4,
                upgrade: None,
                end_of_stream_delivered: Some(false),
            }),
            Body::Failed(Failure {
                code: Code::RemoteTimeout,
                diagnostic: some("d"),
                evidence,
                field: some("f"),
                route: some("r"),
            }),
            Body::Reconciled(Reconciliation {
                note: "n".into(),
                outcome: Outcome::Committed,
                unsafe_retry: Some(true),
                via: some("console"),
            }),
            Body::RetryLeased(Lease {
                generation: 2,
                note: some("n"),
                supersedes: Some(Supersession {
                    generation: 1,
                    reason: SupersedeReason::LeaseExpired,
                }),
                ttl_ms: Some(5),
                unsafe_override: true,
            }),
            Body::ConfigReloaded(ConfigReload {
                changes: serde_json::json!({"routes": {"added": ["b"], "a": 1}}),
                problems: vec!["routes.x".into()],
                result: "refused".into(),
            }),
            Body::JournalPruned(Checkpoint {
                events: 1,
                hash: GENESIS_HASH.into(),
                islands: 4,
                islands_digest: GENESIS_HASH.into(),
                records: 2,
                seq: 3,
            }),
            Body::InvocationAdopted(Adoption {
                from_node: "a".into(),
                snapshot: "{\"record\":{}}".into(),
            }),
        ];
        for body in &bodies {
            let sorted = serde_json::to_vec(&split_body(body).1).unwrap_or_default();
            assert_eq!(
                String::from_utf8_lossy(&body.data_json()),
                String::from_utf8_lossy(&sorted),
                "{:?}",
                body.kind()
            );
        }
    }

    #[test]
    fn bodies_split_and_rejoin() {
        let body = Body::Failed(Failure::of(Code::DnsError));
        let (kind, data) = split_body(&body);
        assert_eq!(kind, EventKind::Failed);
        assert_eq!(data["code"], "DNS_ERROR");
        let event = Event {
            seq: 1,
            invocation_id: "act_x".into(),
            attempt: 0,
            generation: 1,
            ts: "2026-01-01T00:00:00Z".into(),
            kind,
            source: Source::TransportObserved,
            hop: "postern".into(),
            data,
            prev_hash: GENESIS_HASH.into(),
            hash: String::new(),
        };
        assert_eq!(event.body(), Some(body));
    }

    #[test]
    fn hash_is_stable_across_a_json_round_trip() {
        let (kind, data) = split_body(&Body::ActionAccepted(Accepted {
            agent: "ci".into(),
            protocol: Protocol::Https,
            method: Some("POST".into()),
            target: "https://example.test/x".into(),
            command: None,
        }));
        let mut event = Event {
            seq: 7,
            invocation_id: "act_y".into(),
            attempt: 0,
            generation: 1,
            ts: "2026-01-01T00:00:00Z".into(),
            kind,
            source: Source::TransportObserved,
            hop: "postern".into(),
            data,
            prev_hash: GENESIS_HASH.into(),
            hash: String::new(),
        };
        event.hash = event.compute_hash();
        let text = serde_json::to_string(&event).unwrap_or_default();
        let back: Event = serde_json::from_str(&text).unwrap_or_else(|_| event.clone());
        assert_eq!(back.compute_hash(), event.hash);
        assert!(event.hash.starts_with("sha256:") && event.hash.len() == 71);
    }

    /// The canonical form as `serde_json` writes these fields: what every hash so far was
    /// computed over.
    #[derive(Serialize)]
    struct Canonical<'a> {
        seq: u64,
        invocation_id: &'a str,
        attempt: u32,
        generation: u32,
        ts: &'a str,
        kind: EventKind,
        source: Source,
        hop: &'a str,
        data: &'a serde_json::Value,
        prev_hash: &'a str,
    }

    #[test]
    fn the_assembled_canonical_bytes_are_what_serde_json_writes() {
        let data =
            serde_json::json!({"z": [1, "\"é\\\u{1}"], "a": {"y": null, "b": 2.5}, "m": true});
        let event = Event {
            seq: u64::MAX,
            invocation_id: "act_\"x\n".into(),
            attempt: 3,
            generation: 7,
            ts: "2026-01-01T00:00:00.000Z".into(),
            kind: EventKind::RemoteResponseComplete,
            source: Source::RemoteQuery,
            hop: "proxy:corp\\1".into(),
            data,
            prev_hash: GENESIS_HASH.into(),
            hash: String::new(),
        };
        let expected = serde_json::to_vec(&Canonical {
            seq: event.seq,
            invocation_id: &event.invocation_id,
            attempt: event.attempt,
            generation: event.generation,
            ts: &event.ts,
            kind: event.kind,
            source: event.source,
            hop: &event.hop,
            data: &event.data,
            prev_hash: &event.prev_hash,
        })
        .unwrap_or_default();
        let data_json = serde_json::to_vec(&event.data).unwrap_or_default();
        assert_eq!(
            String::from_utf8_lossy(&event.canonical_bytes(&data_json)),
            String::from_utf8_lossy(&expected)
        );
        let sealed = event.clone().sealed();
        assert_eq!(sealed.event.hash, sha256_tagged(&expected));
        assert_eq!(sealed.data_json, data_json);
        assert_eq!(sealed.event.compute_hash(), sealed.event.hash);
    }

    #[test]
    fn kinds_parse_their_wire_names() {
        for &k in EventKind::ALL {
            assert_eq!(EventKind::parse(k.as_str()), Some(k));
            let json = serde_json::to_string(&k).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
        }
    }
}
