//! The JSON envelope (SPEC §1.8) and the headers rendered from it (SPEC §3.3).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::codes::{Code, Outcome, Phase, Retry};
use super::resolve::{FailureContext, OperationFacts, Resolution, resolve_failure};
use super::tls::TlsProblem;

/// postern's answer for a failed invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// `null` for a refusal postern did not journal (SPEC §3.1).
    pub invocation_id: Option<String>,
    pub error: ErrorBody,
    pub evidence: Evidence,
}

/// The four facts plus a human message and, for validation, the field to correct.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: Code,
    pub phase: Phase,
    pub outcome: Outcome,
    pub retry: Retry,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// How postern knows. New fields may be added; meanings never change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub dispatch_started: bool,
    pub request_complete: bool,
    pub response_headers_received: bool,
    pub response_complete: bool,
    pub hop: String,
    #[serde(default)]
    pub attempts: Vec<AttemptEvidence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<IdempotencyEvidence>,
    /// The method is in the route's `idempotent_methods` (bound at preflight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_seq: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<Completion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<CredentialEvidence>,
    /// The agent sent the credential's placeholder, replaced by the secret (SPEC §3.7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_placeholder: Option<bool>,
    /// Further evidence a transport recorded (`connection_id`, `remote_request_id`, …).
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A connection-setup attempt of the latest generation that failed (and so proves
/// nothing was sent on it); the journal's `CONNECT_ATTEMPT` events keep every stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptEvidence {
    pub n: u32,
    pub stage: Stage,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<Code>,
}

/// Connection-setup stages (SPEC §3.2), plus SSH's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Dns,
    TcpConnect,
    TlsHandshake,
    ProxyTunnel,
    SshHandshake,
    SshAuth,
    SshChannel,
    /// SSH version exchange and key exchange with the upstream.
    SshTransport,
    /// The upstream host key checked against the target's `known_hosts`.
    HostKey,
    /// SSH user authentication with the injected key or password.
    UserAuth,
    /// The upstream session channel for an `exec`.
    ChannelOpen,
}

/// The framing marker seen at the end of a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Completion {
    ContentLength,
    LastChunk,
    EndStream,
    /// A gRPC call ended (END_STREAM) with its `grpc-status` (in trailers, or in a
    /// trailers-only head).
    GrpcStatus,
    ExitStatus,
    /// No framing marker: e.g. a body that ended at connection close, where
    /// truncation is undetectable.
    None,
}

/// The idempotency contract recorded before dispatch.
// Fields in key order: journal data is written straight from them (`Body::data_json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyEvidence {
    pub fingerprint: String,
    pub key: String,
    pub remote_contract: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_until: Option<String>,
    pub scope: String,
}

/// Which credential was used: never its value.
// Fields in key order: journal data is written straight from them (`Body::data_json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialEvidence {
    pub id: String,
    pub mode: String,
    pub version: super::SecretVersion,
}

impl Envelope {
    /// Builds the envelope for a resolved failure.
    pub fn new(
        invocation_id: &str,
        resolution: Resolution,
        field: Option<String>,
        evidence: Evidence,
    ) -> Self {
        let mut env = Self::unjournaled(resolution, field, evidence);
        env.invocation_id = Some(invocation_id.to_owned());
        env
    }

    /// An envelope for a refusal that has no record (e.g. a rate-limited failed login).
    pub fn unjournaled(resolution: Resolution, field: Option<String>, evidence: Evidence) -> Self {
        Self {
            invocation_id: None,
            error: ErrorBody {
                code: resolution.code,
                phase: resolution.phase,
                outcome: resolution.outcome,
                retry: resolution.retry,
                message: message(resolution.code, &evidence),
                field,
            },
            evidence,
        }
    }

    /// The HTTP status postern answers with (SPEC §5.5).
    pub fn http_status(&self) -> u16 {
        self.error.code.http_status()
    }

    /// `Postern-Outcome` for this failure.
    pub fn postern_outcome(&self) -> String {
        postern_outcome(
            self.error.outcome,
            self.error.phase,
            self.error.retry,
            Some(self.error.code),
        )
    }

    /// `Proxy-Status` (RFC 9209) for this failure: postern's own resource running out is
    /// postern's error, whatever stage it hit.
    pub fn proxy_status(&self) -> String {
        let error = match self.evidence.extra.contains_key(POSTERN_RESOURCE) {
            true => "proxy_internal_error",
            false => self.error.code.proxy_status_error(),
        };
        proxy_status_of(error, &self.error.message)
    }
}

/// The code's message, or a more precise one where the evidence names the class of problem.
fn message(code: Code, evidence: &Evidence) -> String {
    let tls = evidence
        .extra
        .get("tls_problem")
        .and_then(serde_json::Value::as_str)
        .and_then(TlsProblem::parse);
    if evidence.extra.contains_key(POSTERN_RESOURCE) {
        return "postern ran out of its own resources (file descriptors or memory) before it could connect; nothing was sent, and the destination is not to blame. Retry later.".to_owned();
    }
    if code == Code::ConnectionRefused
        && let Some(said) = stage_message(evidence)
    {
        return said.to_owned();
    }
    match tls {
        Some(problem) if code == Code::TlsCertificateError => problem.message().to_owned(),
        _ => code.message().to_owned(),
    }
}

/// A connection that got past TCP and failed later is named by the stage it failed in:
/// "refused" would blame a destination that answered.
fn stage_message(evidence: &Evidence) -> Option<&'static str> {
    let failed = evidence.attempts.iter().rev().find(|a| a.code.is_some())?;
    Some(match failed.stage {
        Stage::SshTransport | Stage::SshHandshake => {
            "The destination accepted the connection, but the SSH version or key exchange with it failed (stage ssh_transport); nothing was sent."
        }
        Stage::UserAuth | Stage::SshAuth => {
            "The SSH login to the destination did not complete (stage user_auth); nothing was sent."
        }
        Stage::ChannelOpen | Stage::SshChannel => {
            "The destination did not open an SSH session channel (stage channel_open); nothing was sent."
        }
        _ => return None,
    })
}

/// Evidence key: postern's own limit (file descriptors, memory) stopped the step.
pub const POSTERN_RESOURCE: &str = "postern_resource";

/// An envelope without a record (`invocation_id` null) for a failure at `phase` of an
/// operation whose outcome is `outcome`; its hop is postern.
fn unrecorded(code: Code, phase: Phase, outcome: Outcome, field: Option<String>) -> Envelope {
    unrecorded_of(None, code, phase, outcome, field)
}

/// An envelope no record here answers for (the journal could not record it, or another
/// fleet node holds it) about invocation `id`: only whether a dispatch may have happened is
/// known, and the contract computes phase, outcome and retry from that alone.
pub fn unrecorded_invocation(id: &str, code: Code, dispatched: bool) -> Envelope {
    let (phase, outcome) = match dispatched {
        true => (Phase::RemoteExecution, Outcome::Unknown),
        false => (Phase::Validation, Outcome::NotAttempted),
    };
    unrecorded_of(Some(id), code, phase, outcome, None)
}

fn unrecorded_of(
    id: Option<&str>,
    code: Code,
    phase: Phase,
    outcome: Outcome,
    field: Option<String>,
) -> Envelope {
    let ctx = FailureContext {
        phase_reached: phase,
        current_outcome: outcome,
        dispatched: outcome != Outcome::NotAttempted,
        result_stored: false,
        operation: OperationFacts::default(),
        now_ms: 0,
        hop_status: None,
    };
    let evidence = Evidence {
        hop: "postern".into(),
        ..Evidence::default()
    };
    let resolution = resolve_failure(code, &ctx);
    match id {
        Some(id) => Envelope::new(id, resolution, field, evidence),
        None => Envelope::unjournaled(resolution, field, evidence),
    }
}

/// A validation refusal answered without a record: `invocation_id` is null.
pub fn unjournaled_refusal(code: Code, field: &str) -> Envelope {
    let field = Some(field.to_owned());
    unrecorded(code, Phase::Validation, Outcome::NotAttempted, field)
}

/// A client of postern (`postern mcp`) whose request never left it (postern unreachable, or
/// the tunnel to it failed): nothing can have run, so `not_attempted`.
pub fn never_sent() -> Envelope {
    let (code, phase) = (Code::ConnectionRefused, Phase::ConnectionSetup);
    let mut env = unrecorded(code, phase, Outcome::NotAttempted, None);
    let extra = &mut env.evidence.extra;
    extra.insert("request_left_client".into(), false.into());
    env
}

/// A client of postern (`postern mcp`) that sent a request and got no answer from the
/// daemon: the daemon may have dispatched it, and nothing says whether, so it is `unknown`
/// and, with nothing known of the operation, `reconcile` (§1.6). The record, if any, is the
/// daemon's to show.
pub fn unanswered() -> Envelope {
    let (code, phase) = (Code::RemoteOutcomeUnknown, Phase::RemoteExecution);
    let mut env = unrecorded(code, phase, Outcome::Unknown, None);
    env.evidence
        .extra
        .insert("daemon_answered".into(), false.into());
    env
}

/// `JOURNAL_UNAVAILABLE` without a record: the journal refuses new work (low disk), and
/// recording the refusal could be the very write that fails.
pub fn journal_unavailable() -> Envelope {
    let mut env = unjournaled_refusal(Code::JournalUnavailable, "");
    env.error.field = None;
    env
}

/// The four facts of a `Postern-Outcome` value (what `postern_outcome` writes); `None`
/// unless outcome, phase and retry are all there and known.
pub fn read_postern_outcome(value: &str) -> Option<(Outcome, Phase, Retry, Option<Code>)> {
    fn token<T: serde::de::DeserializeOwned>(v: &str) -> Option<T> {
        serde_json::from_value(serde_json::Value::String(v.to_owned())).ok()
    }
    let (mut outcome, mut phase, mut retry, mut code) = (None, None, None, None);
    for member in value.split(',') {
        let Some((key, v)) = member.trim().split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches('"');
        match key.trim() {
            "outcome" => outcome = token(v),
            "phase" => phase = token(v),
            "retry" => retry = token(v),
            "code" => code = token(v),
            _ => {}
        }
    }
    Some((outcome?, phase?, retry?, code))
}

/// `Postern-Outcome`: an RFC 8941 dictionary of tokens.
pub fn postern_outcome(outcome: Outcome, phase: Phase, retry: Retry, code: Option<Code>) -> String {
    let mut s = format!("outcome={outcome}, phase={phase}, retry={retry}");
    if let Some(code) = code {
        s.push_str(", code=");
        s.push_str(code.as_str());
    }
    s
}

/// `Proxy-Status: postern; error=<type>; details="…"` (RFC 9209).
pub fn proxy_status(code: Code, details: &str) -> String {
    proxy_status_of(code.proxy_status_error(), details)
}

fn proxy_status_of(error: &str, details: &str) -> String {
    format!("postern; error={error}; details={}", sf_string(details))
}

/// An RFC 8941 sf-string: printable ASCII only, `"` and `\` escaped.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope {
        let resolution = Resolution {
            code: Code::RemoteOutcomeUnknown,
            phase: Phase::RemoteExecution,
            outcome: Outcome::Unknown,
            retry: Retry::SameIdempotencyKey,
        };
        let evidence = Evidence {
            dispatch_started: true,
            request_complete: true,
            hop: "origin".into(),
            attempts: vec![AttemptEvidence {
                n: 1,
                stage: Stage::TcpConnect,
                outcome: Outcome::NotAttempted,
                code: Some(Code::ConnectionRefused),
            }],
            ..Evidence::default()
        };
        Envelope::new("act_01J", resolution, None, evidence)
    }

    #[test]
    fn postern_outcome_reads_back_what_it_wrote() {
        let written = postern_outcome(
            Outcome::Unknown,
            Phase::RemoteExecution,
            Retry::Reconcile,
            Some(Code::RemoteResultIncomplete),
        );
        assert_eq!(
            read_postern_outcome(&written),
            Some((
                Outcome::Unknown,
                Phase::RemoteExecution,
                Retry::Reconcile,
                Some(Code::RemoteResultIncomplete)
            ))
        );
        let plain = postern_outcome(
            Outcome::Committed,
            Phase::RemoteExecution,
            Retry::Never,
            None,
        );
        assert_eq!(
            read_postern_outcome(&plain).map(|r| r.3),
            Some(None),
            "{plain}"
        );
        assert_eq!(read_postern_outcome("outcome=committed, retry=never"), None);
        assert_eq!(
            read_postern_outcome("outcome=maybe, phase=x, retry=y"),
            None
        );
    }

    #[test]
    fn a_request_that_never_left_the_client_was_not_attempted() {
        let e = never_sent().error;
        assert_eq!(
            (e.code, e.phase, e.outcome, e.retry),
            (
                Code::ConnectionRefused,
                Phase::ConnectionSetup,
                Outcome::NotAttempted,
                Retry::Backoff
            )
        );
    }

    #[test]
    fn an_unanswered_request_may_have_run_and_is_never_called_safe_to_repeat() {
        let env = unanswered();
        let e = &env.error;
        assert_eq!(
            (e.code, e.phase, e.outcome, e.retry),
            (
                Code::RemoteOutcomeUnknown,
                Phase::RemoteExecution,
                Outcome::Unknown,
                Retry::Reconcile
            )
        );
        assert_eq!(env.invocation_id, None);
        assert_eq!(
            env.evidence.extra.get("daemon_answered"),
            Some(&false.into())
        );
    }

    #[test]
    fn envelope_has_the_pinned_shape() {
        let v = serde_json::to_value(sample()).unwrap_or_default();
        assert_eq!(v["invocation_id"], "act_01J");
        let mut bare = sample();
        bare.invocation_id = None;
        let b = serde_json::to_value(bare).unwrap_or_default();
        assert!(b["invocation_id"].is_null() && b["evidence"].is_object());
        assert_eq!(v["error"]["code"], "REMOTE_OUTCOME_UNKNOWN");
        assert_eq!(v["error"]["phase"], "remote_execution");
        assert_eq!(v["error"]["outcome"], "unknown");
        assert_eq!(v["error"]["retry"], "same_idempotency_key");
        assert!(v["error"]["message"].is_string());
        assert!(v["error"].get("field").is_none());
        let e = &v["evidence"];
        assert_eq!(e["dispatch_started"], true);
        assert_eq!(e["request_complete"], true);
        assert_eq!(e["response_headers_received"], false);
        assert_eq!(e["response_complete"], false);
        assert_eq!(e["hop"], "origin");
        assert_eq!(e["attempts"][0]["n"], 1);
        assert_eq!(e["attempts"][0]["stage"], "tcp_connect");
        assert_eq!(e["attempts"][0]["outcome"], "not_attempted");
        assert_eq!(e["attempts"][0]["code"], "CONNECTION_REFUSED");
    }

    #[test]
    fn postern_running_out_of_descriptors_is_postern_s_error_not_the_destination_s() {
        let resolution = Resolution {
            code: Code::ConnectionRefused,
            phase: Phase::ConnectionSetup,
            outcome: Outcome::NotAttempted,
            retry: Retry::Backoff,
        };
        let mut evidence = Evidence {
            hop: "postern".into(),
            ..Evidence::default()
        };
        evidence
            .extra
            .insert(POSTERN_RESOURCE.into(), "no file descriptor left".into());
        let env = Envelope::new("act_01J", resolution, None, evidence);
        assert!(
            env.proxy_status()
                .starts_with("postern; error=proxy_internal_error;"),
            "{}",
            env.proxy_status()
        );
        assert!(env.error.message.contains("postern ran out"));
        assert!(env.error.message.contains("not to blame"));
    }

    #[test]
    fn envelope_round_trips() {
        let env = sample();
        let text = serde_json::to_string(&env).unwrap_or_default();
        let back: Option<Envelope> = serde_json::from_str(&text).ok();
        assert_eq!(back, Some(env));
    }

    #[test]
    fn headers_render_as_structured_fields() {
        let env = sample();
        assert_eq!(
            env.postern_outcome(),
            "outcome=unknown, phase=remote_execution, retry=same_idempotency_key, code=REMOTE_OUTCOME_UNKNOWN"
        );
        assert_eq!(
            env.proxy_status(),
            "postern; error=http_response_incomplete; details=\"Connection closed before a complete response was recorded.\""
        );
        assert_eq!(
            postern_outcome(
                Outcome::Committed,
                Phase::RemoteExecution,
                Retry::Never,
                None
            ),
            "outcome=committed, phase=remote_execution, retry=never"
        );
    }

    #[test]
    fn details_are_escaped() {
        assert_eq!(
            proxy_status(Code::DnsError, "a \"b\" \\ é\n"),
            "postern; error=dns_error; details=\"a \\\"b\\\" \\\\ ??\""
        );
    }

    #[test]
    fn every_code_has_a_status_and_proxy_status_type() {
        let pinned = [
            (Code::AgentUnauthenticated, 407, "http_request_denied"),
            (Code::RouteDenied, 403, "http_request_denied"),
            (Code::ForbiddenHeader, 403, "http_request_denied"),
            (Code::ApprovalDenied, 403, "http_request_denied"),
            (Code::ApprovalTimeout, 403, "http_request_denied"),
            (Code::InvalidTarget, 400, "http_request_error"),
            (Code::UnsupportedAction, 400, "http_request_error"),
            (Code::MalformedRequest, 400, "http_request_error"),
            (Code::UnknownCredential, 400, "http_request_error"),
            (Code::PayloadLimit, 413, "http_request_error"),
            (Code::IdempotencyMismatch, 422, "proxy_internal_response"),
            (Code::AttemptInProgress, 409, "proxy_internal_response"),
            (Code::FingerprintChanged, 409, "proxy_internal_response"),
            (Code::RetryBudgetExhausted, 409, "proxy_internal_response"),
            (Code::ResendRefused, 409, "proxy_internal_response"),
            (Code::VaultLocked, 503, "proxy_internal_error"),
            (Code::CredentialMissing, 500, "proxy_configuration_error"),
            (
                Code::InjectionModeUnsupported,
                500,
                "proxy_configuration_error",
            ),
            (
                Code::CredentialDecryptFailed,
                500,
                "proxy_configuration_error",
            ),
            (Code::DnsError, 502, "dns_error"),
            (Code::ConnectionRefused, 502, "connection_refused"),
            (Code::ConnectTimeout, 504, "connection_timeout"),
            (Code::TlsCertificateError, 502, "tls_certificate_error"),
            (Code::TlsHandshakeError, 502, "tls_protocol_error"),
            (
                Code::DestinationProhibited,
                502,
                "destination_ip_prohibited",
            ),
            (Code::ProxyTunnelRefused, 502, "destination_unavailable"),
            (Code::RemoteTimeout, 504, "http_response_timeout"),
            (Code::RemoteOutcomeUnknown, 502, "http_response_incomplete"),
            (
                Code::RemoteResultIncomplete,
                502,
                "http_response_incomplete",
            ),
            (Code::CallerCancelled, 502, "http_response_incomplete"),
            (Code::BrokerRestarted, 502, "http_response_incomplete"),
            (Code::UpstreamHopError, 502, "http_response_incomplete"),
            (Code::JournalUnavailable, 503, "proxy_internal_error"),
            (Code::RateLimited, 429, "http_request_denied"),
            (Code::AgentSuspended, 403, "http_request_denied"),
            (Code::CredentialMintFailed, 502, "proxy_internal_error"),
        ];
        for (code, status, kind) in pinned {
            assert_eq!(
                (code.http_status(), code.proxy_status_error()),
                (status, kind),
                "{code}"
            );
        }
        for &code in Code::ALL {
            assert!(!code.message().is_empty());
            assert!((400..=599).contains(&code.http_status()));
        }
    }

    #[test]
    fn codes_serialize_as_their_wire_names() {
        for &code in Code::ALL {
            let json = serde_json::to_string(&code).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(Code::parse(code.as_str()), Some(code));
        }
        for &p in Phase::ALL {
            assert_eq!(
                serde_json::to_string(&p).unwrap_or_default(),
                format!("\"{p}\"")
            );
        }
        for &o in Outcome::ALL {
            assert_eq!(
                serde_json::to_string(&o).unwrap_or_default(),
                format!("\"{o}\"")
            );
        }
        for &r in Retry::ALL {
            assert_eq!(
                serde_json::to_string(&r).unwrap_or_default(),
                format!("\"{r}\"")
            );
        }
    }
}
