//! Refusals of an agent over `[proxy] max_busy_per_agent` (`listen::BusyPerAgent`).

use http::{HeaderValue, Response, header};

use crate::contract::{Code, Envelope};
use crate::http::message::respond::{self, ProxyBody};
use crate::journal::Failure;
use crate::lifecycle::Invocation;
use crate::listen::over_busy_limit;

/// Records the refusal of a tunnel or WebSocket over the agent's limit: nothing was
/// connected. The code is the one for a capacity postern ran out of
/// (`JOURNAL_UNAVAILABLE`, `backoff`), its message names the limit.
pub async fn refuse(inv: &mut Invocation, limit: usize) -> Envelope {
    let mut failure = Failure::of(Code::JournalUnavailable);
    failure.field = Some("agent".into());
    failure
        .evidence
        .insert("reason".into(), "max_busy_per_agent".into());
    let mut env = inv.fail(vec![], failure).await;
    env.error.message = over_busy_limit(limit).error.message;
    env
}

/// A request over the agent's limit, refused before it becomes an invocation (so a flood
/// of them writes nothing): `503`, `Retry-After: 1`, the capacity code and the limit.
pub fn over_limit_answer(limit: usize) -> Response<ProxyBody> {
    let mut resp = respond::envelope(&over_busy_limit(limit));
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}
