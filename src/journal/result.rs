//! The result store's record: what `postern result` and the API return.

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::contract::{Outcome, TunnelEvidence};

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
    Tunnel(TunnelResult),
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
    /// A gRPC call's `grpc-status` (SPEC §3.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<u32>,
    /// Non-secret trailers as relayed (gRPC: `grpc-status`, `grpc-message`, …), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trailers: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_signal: Option<String>,
    pub stdout_base64: String,
    pub stderr_base64: String,
    /// False when the output exceeded `max_result_bytes`: then neither stream is kept
    /// (both empty) and only the digest and byte count stand for it, as HTTP's `body_stored`.
    #[serde(default = "stored")]
    pub output_stored: bool,
}

/// A plain CONNECT tunnel's result (SPEC §3.6): counts only; postern cannot read the bytes,
/// so none are kept (`bytes` is `tunnel.bytes_down`, `digest` is over those bytes as relayed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelResult {
    pub tunnel: TunnelEvidence,
    pub digest: String,
    pub bytes: u64,
}

fn stored() -> bool {
    true
}

/// Standard base64 of bytes.
pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes standard base64.
pub fn unb64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// The bytes as text to show an operator, or `None` for binary: invalid UTF-8, or control
/// characters other than tab and line breaks (a terminal must not interpret a body).
/// A multi-byte character cut off at the end (a bounded preview) is dropped, not binary.
pub fn as_text(bytes: &[u8]) -> Option<&str> {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) if e.error_len().is_none() => {
            std::str::from_utf8(bytes.get(..e.valid_up_to())?).ok()?
        }
        Err(_) => return None,
    };
    let printable = text
        .chars()
        .all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r'));
    printable.then_some(text)
}

#[cfg(test)]
mod tests {
    use super::as_text;

    #[test]
    fn text_is_printable_utf8_and_a_cut_character_is_dropped() {
        assert_eq!(as_text(b"{\"a\":1}\n"), Some("{\"a\":1}\n"));
        assert_eq!(as_text("h\u{e9}".as_bytes()), Some("h\u{e9}"));
        assert_eq!(as_text(&"h\u{e9}".as_bytes()[..2]), Some("h"));
        assert_eq!(as_text(b"\x00\x01bin"), None);
        assert_eq!(as_text(b"\x1b[2J"), None);
        assert_eq!(as_text(&[0xff, 0xfe]), None);
    }
}
