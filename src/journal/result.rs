//! The result store's record: what `postern result` and the API return.

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::contract::Outcome;

/// A stored result, HTTP or SSH (SPEC §5.5 "Result").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResult {
    pub invocation_id: String,
    pub outcome: Outcome,
    #[serde(flatten)]
    pub payload: Payload,
    pub complete: bool,
    /// Unix ms after which the result is removed.
    pub expires_at_ms: i64,
}

/// Protocol-specific result content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Payload {
    Http(HttpResult),
    Ssh(SshResult),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpResult {
    pub status: u16,
    /// Non-secret headers, in order.
    pub headers: Vec<(String, String)>,
    /// `null` when the body exceeded `max_result_bytes` (then `body_stored` is false).
    pub body_base64: Option<String>,
    pub body_stored: bool,
    pub digest: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_signal: Option<String>,
    pub stdout_base64: String,
    pub stderr_base64: String,
}

/// Standard base64 of bytes.
pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes standard base64.
pub fn unb64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}
