//! `http://postern.internal/v1/invocations/{id}[/result[/body]]`: an agent's read-only
//! view of its own invocations, through the proxy. Not journaled; other agents' ids are 404.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde_json::json;

use crate::http::Proxy;
use crate::http::message::respond::{self, ProxyBody};

pub const HOST: &str = "postern.internal";

/// Said to an agent that asked for `https://postern.internal`.
pub const HINT: &str = "postern.internal is served over plain http through the proxy: http://postern.internal/v1/invocations/{id}";

fn json(status: StatusCode, value: &serde_json::Value) -> Response<ProxyBody> {
    let mut r = Response::new(respond::full(Bytes::from(value.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn not_found() -> Response<ProxyBody> {
    json(
        StatusCode::NOT_FOUND,
        &json!({"error": {"code": "INVOCATION_NOT_FOUND", "message": "No invocation with this id for this agent."}}),
    )
}

#[derive(PartialEq)]
enum Want {
    Record,
    Result,
    /// The stored body, whole or a `Range` of it (a delivery to resume).
    Body,
}

/// Serves the agent-facing view.
pub async fn respond(
    proxy: &Proxy,
    agent: &str,
    method: &http::Method,
    path: &str,
    range: Option<&str>,
) -> Response<ProxyBody> {
    if method != http::Method::GET && method != http::Method::HEAD {
        return json(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({"error": {"code": "UNSUPPORTED_ACTION", "message": "postern.internal is read-only."}}),
        );
    }
    let segments: Vec<&str> = path
        .split('?')
        .next()
        .unwrap_or("")
        .trim_matches('/')
        .split('/')
        .collect();
    let (id, want) = match segments.as_slice() {
        ["v1", "invocations", id] => (*id, Want::Record),
        ["v1", "invocations", id, "result"] => (*id, Want::Result),
        ["v1", "invocations", id, "result", "body"] => (*id, Want::Body),
        _ => return not_found(),
    };
    // In a fleet, another node's invocation as its owner published it (SPEC §7).
    let record = match proxy.journal.find_record(id).await {
        Ok(Some(r)) if r.agent == agent => r,
        Ok(_) => return not_found(),
        Err(_) => {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"error": {"code": "JOURNAL_UNAVAILABLE", "message": "The journal could not be read."}}),
            );
        }
    };
    let stored = match want {
        Want::Record => return json(StatusCode::OK, &json!(record)),
        _ => proxy.journal.find_result(id).await,
    };
    match stored {
        Ok(Some(result)) if want == Want::Body => {
            crate::admin::body_response(&result, range).map(respond::full)
        }
        Ok(Some(result)) => json(StatusCode::OK, &json!(result)),
        _ => json(
            StatusCode::NOT_FOUND,
            &json!({"error": {"code": "RESULT_NOT_STORED", "message": "This invocation has no stored result."}}),
        ),
    }
}
