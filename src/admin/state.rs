//! What every admin route answers from and with: the state it serves, and the JSON replies
//! (`{"error":{"code","message"}}` with a fitting status). Below the routes, above nothing
//! of the admin API.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::Full;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use crate::journal::Journal;
use crate::lifecycle::retry::Resend;
use crate::policy::approvals::Approvals;
use crate::vault::Vault;

/// What the admin API serves from.
pub struct AdminState {
    pub journal: Journal,
    pub registry: Registry,
    /// The config in force: the admin token and the credentials `/healthz` checks.
    pub live: Arc<crate::config::Live>,
    pub approvals: Arc<Approvals>,
    /// The kill switch (SPEC §5.8): `POST /v1/agents/{id}/suspend|resume`.
    pub suspended: Arc<crate::lifecycle::suspended::Suspended>,
    pub vault: Arc<Vault>,
    /// `POST /v1/reload` (and SIGHUP).
    pub reloader: Arc<super::reload::Reloader>,
    /// Sends a kept request again for `POST …/retry`.
    pub resend: Arc<dyn Resend>,
    /// The web console's signed-in sessions (SPEC §5.8).
    pub console: super::console::Sessions,
    /// Counts requests and sign-ins with a wrong admin token (`postern_admin_auth_failures`).
    pub auth_failures: prometheus_client::metrics::counter::Counter,
}

pub(super) type Reply = Response<Full<Bytes>>;

pub(super) fn json_reply(status: StatusCode, body: &Value) -> Reply {
    let text = serde_json::to_vec(body).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    // Records, results and approvals are the operator's: no cache keeps a copy.
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r
}

/// A refused admin action, for the API (as its JSON error) and the console (as a page).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Problem {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl Problem {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Problem {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn storage() -> Self {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "JOURNAL_UNAVAILABLE",
            "The journal could not be read.",
        )
    }

    pub fn reply(&self) -> Reply {
        error(self.status, self.code, &self.message)
    }
}

/// An action's JSON answer, or its problem.
pub(super) fn reply_of(done: Result<Value, Problem>) -> Reply {
    match done {
        Ok(v) => json_reply(StatusCode::OK, &v),
        Err(p) => p.reply(),
    }
}

pub(super) fn error(status: StatusCode, code: &str, message: &str) -> Reply {
    json_reply(
        status,
        &json!({"error": {"code": code, "message": message}}),
    )
}

pub(super) fn storage_error() -> Reply {
    Problem::storage().reply()
}

pub(super) fn not_found(id: &str) -> Reply {
    not_found_problem(id).reply()
}

/// An invocation this node does not hold: another fleet node's (SPEC §7), whose journal
/// alone can record an action on it (its request body is kept there too); else not found.
pub(super) async fn held_elsewhere(state: &AdminState, id: &str) -> Problem {
    match state.journal.locate(id).await {
        Ok(Some(crate::journal::Whereabouts::There { node, .. })) => Problem::new(
            StatusCode::CONFLICT,
            "HELD_BY_ANOTHER_NODE",
            format!(
                "Node {node} holds this invocation: ask that node's admin API (its journal \
                 records the action, and keeps the request)."
            ),
        ),
        Ok(_) => not_found_problem(id),
        Err(_) => Problem::storage(),
    }
}

pub(super) fn not_found_problem(id: &str) -> Problem {
    let prefixes = ["act_", "rld_", "prn_", "sus_", "rsm_"];
    let msg = if prefixes.iter().any(|p| id.starts_with(p)) {
        "No invocation with this id."
    } else {
        "Invocation ids look like act_<ULID> (reloads rld_<ULID>, retention cuts prn_<ULID>, suspensions sus_<ULID>, resumes rsm_<ULID>)."
    };
    Problem::new(StatusCode::NOT_FOUND, "INVOCATION_NOT_FOUND", msg)
}
