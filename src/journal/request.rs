//! The request an invocation bound at preflight, kept beside its result so `postern retry`
//! can send exactly that request again as a new generation. An agent's request carries no
//! secret (postern injects it at the egress hop), so nothing kept here is one.

use serde::{Deserialize, Serialize};

/// A kept request (HTTP: method, absolute target, end-to-end headers, body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRequest {
    pub invocation_id: String,
    pub method: String,
    pub target: String,
    /// End-to-end headers as the agent sent them, in order.
    pub headers: Vec<(String, String)>,
    /// `None` when the body was larger than `max_result_bytes` (then it cannot be resent).
    pub body_base64: Option<String>,
    pub body_bytes: u64,
    /// A header was not kept (not text, or the agent's own `Authorization`): the request
    /// cannot be rebuilt byte for byte.
    #[serde(default)]
    pub headers_incomplete: bool,
    /// Unix ms after which the request is removed (with the result's retention).
    pub expires_at_ms: i64,
}

impl StoredRequest {
    /// Whether the request can be sent again exactly as it was.
    pub fn resendable(&self) -> bool {
        !self.headers_incomplete && (self.body_base64.is_some() || self.body_bytes == 0)
    }
}
