//! A minimal admin API client (HTTP/1.1 over loopback).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::{AdminTarget, CliError};

/// How long the CLI waits for the daemon to take the connection, and then for its answer: a
/// hung daemon (or another program on the port) must not hold the operator's shell forever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long to wait for the answer once the request is sent.
#[derive(Clone, Copy)]
pub enum Wait {
    /// `ANSWER_TIMEOUT`: every admin call but `postern retry`.
    Bounded,
    /// Until the daemon answers: a retry may be held for approval (it says so on stderr).
    Unbounded,
}

/// Sends one request and returns status and JSON body.
pub fn call(
    target: &AdminTarget,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(StatusCode, Value), CliError> {
    call_headed(target, method, path, body, Wait::Bounded).map(|(status, _, json)| (status, json))
}

/// `call`, with the response's headers.
pub fn call_headed(
    target: &AdminTarget,
    method: Method,
    path: &str,
    body: Option<&Value>,
    wait: Wait,
) -> Result<(StatusCode, HeaderMap, Value), CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("cannot start a runtime: {e}")))?;
    let exchange = send(target, method, path, body);
    let answer = runtime.block_on(async {
        match wait {
            Wait::Unbounded => exchange.await,
            Wait::Bounded => tokio::time::timeout(ANSWER_TIMEOUT, exchange)
                .await
                .unwrap_or_else(|_| {
                    Err(CliError::NoAnswer {
                        url: target.url.clone(),
                        secs: ANSWER_TIMEOUT.as_secs(),
                    })
                }),
        }
    })?;
    refuse_unauthenticated(target, &answer.0, &answer.2)?;
    Ok(answer)
}

/// The daemon's 401 speaks HTTP (`Authorization: Bearer`); the operator sets a variable.
fn refuse_unauthenticated(
    target: &AdminTarget,
    status: &StatusCode,
    body: &Value,
) -> Result<(), CliError> {
    if *status != StatusCode::UNAUTHORIZED || body["error"]["code"] != "ADMIN_UNAUTHENTICATED" {
        return Ok(());
    }
    let hint = if target.token.is_some() {
        "POSTERN_ADMIN_TOKEN does not match the daemon's [admin] token"
    } else {
        "the daemon at this address has an admin token: set POSTERN_ADMIN_TOKEN to its [admin] token"
    };
    Err(CliError::Failed(format!(
        "ADMIN_UNAUTHENTICATED ({status}): {hint} ({})",
        target.url
    )))
}

async fn send(
    target: &AdminTarget,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(StatusCode, HeaderMap, Value), CliError> {
    let unreachable = |detail: String| CliError::Unreachable {
        url: target.url.clone(),
        detail,
    };
    let authority = target
        .url
        .strip_prefix("http://")
        .ok_or_else(|| {
            CliError::Failed(format!(
                "admin URL `{}` must start with http://",
                target.url
            ))
        })?
        .trim_end_matches('/')
        .to_owned();
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&authority))
        .await
        .map_err(|_| {
            unreachable(format!(
                "no connection within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| unreachable(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    tokio::spawn(conn);
    let payload = body
        .map(|b| serde_json::to_vec(b).unwrap_or_default())
        .unwrap_or_default();
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, authority.as_str())
        .header(header::ACCEPT, "application/json");
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    if let Some(token) = &target.token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let req = req
        .body(Full::new(Bytes::from(payload)))
        .map_err(|e| CliError::Failed(format!("bad request: {e}")))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok((status, headers, json))
}

/// Turns an API error body into a CLI error.
pub fn api_error(status: StatusCode, body: &Value) -> CliError {
    let code = body["error"]["code"].as_str().unwrap_or("ERROR");
    let message = body["error"]["message"].as_str().unwrap_or("");
    CliError::Failed(format!("{code} ({status}): {message}"))
}
