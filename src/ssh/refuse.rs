//! Refusals before dispatch: journaled like HTTP's early refusals (protocol `ssh`, target
//! `ssh://user@host:port`), answered with the record's envelope.

use crate::contract::{Code, Envelope, unjournaled_refusal};
use crate::journal::{Accepted, Body, Draft, Failure, Journal, Protocol, new_invocation_id};

/// What was refused, for the record.
pub(crate) struct Refused<'a> {
    pub agent: &'a str,
    pub target: String,
    /// The kind of request: `exec`, `shell`, `subsystem`, `port_forward`, `agent_forward`.
    pub method: &'a str,
    pub command: Option<String>,
}

/// A failure with the field to correct.
pub(crate) fn failure(code: Code, field: &str) -> Failure {
    let mut f = Failure::of(code);
    f.field = Some(field.to_owned());
    f
}

/// Journals `ACTION_ACCEPTED` + `FAILED` and returns the record's envelope. If the journal
/// cannot take it, the agent still gets an envelope (`invocation_id: null`).
pub(crate) async fn journal(journal: &Journal, what: Refused<'_>, failure: Failure) -> Envelope {
    let field = failure.field.clone().unwrap_or_default();
    let fallback = |code| unjournaled_refusal(code, &field);
    if !journal.records_refusals() {
        return fallback(failure.code);
    }
    let id = new_invocation_id();
    let accepted = Draft::observed(Body::ActionAccepted(Accepted {
        agent: what.agent.to_owned(),
        protocol: Protocol::Ssh,
        method: Some(what.method.to_owned()),
        target: what.target,
        command: what.command,
    }));
    let code = failure.code;
    match journal
        .append(&id, vec![accepted, Draft::observed(Body::Failed(failure))])
        .await
    {
        Ok(a) => a
            .state
            .record
            .envelope
            .clone()
            .unwrap_or_else(|| fallback(code)),
        Err(_) => fallback(Code::JournalUnavailable),
    }
}

/// The envelope as one JSON line (no newline).
pub(crate) fn json(envelope: &Envelope) -> String {
    serde_json::to_string(envelope).unwrap_or_else(|_| "{}".into())
}
