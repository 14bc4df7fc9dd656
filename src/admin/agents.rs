//! The kill switch's routes (SPEC §5.8): `GET /v1/agents`, `POST /v1/agents/{id}/suspend`
//! and `/resume` (body optional: `{"note": "…"}`). Behind the admin token like every other
//! route but `/healthz`.

use http::StatusCode;
use serde_json::{Value, json};

use super::state::{AdminState, Problem, Reply, error, json_reply, reply_of};
use crate::journal::JournalError;

/// The longest note kept with a suspension (it is journaled).
const MAX_NOTE: usize = 1024;

/// The configured agents, each with its suspension (or null), and suspended agents the
/// config no longer names (they stay suspended until resumed).
pub fn list(state: &AdminState) -> Reply {
    let config = state.live.current();
    let suspensions = state.suspended.list();
    let mut agents: Vec<Value> = known_ids(&config)
        .into_iter()
        .map(|id| {
            let s = suspensions.iter().find(|s| s.agent == id);
            json!({"id": id, "configured": true, "suspended": s.is_some(), "suspension": s})
        })
        .collect();
    for s in &suspensions {
        if !agents.iter().any(|a| a["id"] == s.agent.as_str()) {
            agents.push(
                json!({"id": s.agent, "configured": false, "suspended": true, "suspension": s}),
            );
        }
    }
    json_reply(StatusCode::OK, &json!({"agents": agents}))
}

/// Suspends (`suspend`) or resumes agent `id`; idempotent (`changed: false`, nothing
/// journaled, when it already was as asked).
pub async fn switch(state: &AdminState, id: &str, body: &Value, suspend: bool) -> Reply {
    match note_of(body) {
        Ok(note) => reply_of(switched(state, id, note, suspend).await),
        Err(why) => error(StatusCode::BAD_REQUEST, "BAD_REQUEST_BODY", why),
    }
}

/// The kill switch itself: the API's and the console's one path.
pub(super) async fn switched(
    state: &AdminState,
    id: &str,
    note: Option<String>,
    suspend: bool,
) -> Result<Value, Problem> {
    let config = state.live.current();
    let known = known_ids(&config).iter().any(|a| a == id) || state.suspended.of(id).is_some();
    if !known {
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            "AGENT_NOT_FOUND",
            "No agent with this id in the config in force (see `postern agents list`).",
        ));
    }
    let switched = state
        .suspended
        .switch(&state.journal, &state.approvals, id, suspend, note)
        .await;
    match switched {
        Ok(s) => {
            if s.changed {
                tracing::warn!(agent = %id, suspended = suspend, "kill switch: operator action journaled");
            }
            Ok(json!(s))
        }
        Err(
            JournalError::Refused(_) | JournalError::Unavailable | JournalError::SharedUnavailable,
        ) => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "JOURNAL_UNAVAILABLE",
            "The action could not be journaled, so it was not taken.",
        )),
    }
}

/// The agent ids of a config: its `[[agents]]`, or `anonymous` when it has none (then
/// every request is that agent's).
pub(super) fn known_ids(config: &crate::config::Config) -> Vec<String> {
    match config.agents.is_empty() {
        true => vec!["anonymous".to_owned()],
        false => config.agents.iter().map(|a| a.id.clone()).collect(),
    }
}

pub(super) fn note_of(body: &Value) -> Result<Option<String>, &'static str> {
    match body.get("note") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.len() > MAX_NOTE => Err("note is longer than 1024 bytes."),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err("note must be a string."),
    }
}
