//! A plain CONNECT tunnel (`intercept = false`, SPEC §3.6): postern sees only how many
//! bytes went each way and who closed it, so that is all that can resolve it.

use serde::{Deserialize, Serialize};

use super::codes::{Code, Outcome, Retry};
use super::status::StatusResolution;

/// Who ended the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClosedBy {
    /// The agent's side ended first (EOF, reset, or it stopped taking bytes).
    Agent,
    /// The origin's side ended first.
    Origin,
    /// postern closed it: the route's `idle_timeout` passed without a byte either way.
    Postern,
}

impl ClosedBy {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Origin => "origin",
            Self::Postern => "postern",
        }
    }
}

/// The evidence `tunnel` of a record, and the observation `classify_tunnel` decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelEvidence {
    /// Bytes relayed from the agent to the origin.
    pub bytes_up: u64,
    /// Bytes the origin sent toward the agent.
    pub bytes_down: u64,
    pub closed_by: ClosedBy,
}

/// What the relay after a protocol switch (SPEC §3.6, WebSocket) carried: counts, who
/// closed it, and how many echoes of the secret the guard masked. `RESULT_DELIVERED`
/// carries it; the record shows it as evidence `upgrade`.
// Fields in key order: journal data is written straight from them (`Body::data_json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeEvidence {
    pub bytes_down: u64,
    pub bytes_up: u64,
    pub closed_by: ClosedBy,
    pub protocol: String,
    /// The origin sent a frame it may not send: postern ended the relay with close `1002`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_error: Option<FrameError>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub redactions: u64,
}

/// Why a frame from a WebSocket origin ended the relay (RFC 6455 §5; SPEC §3.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameError {
    /// The mask bit is set: only a client masks.
    Masked,
    /// RSV1–3 set, with no extension negotiated.
    ReservedBit,
    /// An opcode RFC 6455 does not define.
    UnknownOpcode,
    /// A control frame with more than 125 bytes of payload.
    ControlTooLong,
    /// A control frame without FIN.
    FragmentedControl,
    /// A continuation frame with no message open.
    ContinuationWithoutMessage,
    /// A new text or binary frame while a message is still open.
    MessageInsideMessage,
    /// A 64-bit length with its most significant bit set.
    LengthTooLarge,
}

impl FrameError {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Masked => "masked",
            Self::ReservedBit => "reserved_bit",
            Self::UnknownOpcode => "unknown_opcode",
            Self::ControlTooLong => "control_too_long",
            Self::FragmentedControl => "fragmented_control",
            Self::ContinuationWithoutMessage => "continuation_without_message",
            Self::MessageInsideMessage => "message_inside_message",
            Self::LengthTooLarge => "length_too_large",
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// SPEC §3.6: the origin's `101` switched protocols. The handshake is the operation, and
/// the origin accepted it: `committed`, whatever the relay after it carries.
pub fn classify_upgrade() -> StatusResolution {
    StatusResolution {
        outcome: Outcome::Committed,
        retry: Retry::Never,
    }
}

/// SPEC §3.6: once both directions ended, a byte from the origin means it answered, so the
/// tunnel is `committed` (what it answered stays unreadable to postern); without one,
/// nothing says whether the agent's bytes did anything: `REMOTE_OUTCOME_UNKNOWN`.
pub fn classify_tunnel(tunnel: &TunnelEvidence) -> Result<StatusResolution, Code> {
    if tunnel.bytes_down == 0 {
        return Err(Code::RemoteOutcomeUnknown);
    }
    Ok(StatusResolution {
        outcome: Outcome::Committed,
        retry: Retry::Never,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tunnel(bytes_up: u64, bytes_down: u64, closed_by: ClosedBy) -> TunnelEvidence {
        TunnelEvidence {
            bytes_up,
            bytes_down,
            closed_by,
        }
    }

    #[test]
    fn a_byte_from_the_origin_commits_whoever_closed() {
        for by in [ClosedBy::Agent, ClosedBy::Origin, ClosedBy::Postern] {
            let r = classify_tunnel(&tunnel(0, 1, by));
            assert_eq!(
                r.map(|r| (r.outcome, r.retry)),
                Ok((Outcome::Committed, Retry::Never)),
                "{}",
                by.as_str()
            );
            let r = classify_tunnel(&tunnel(517, 0, by));
            assert_eq!(r, Err(Code::RemoteOutcomeUnknown), "{}", by.as_str());
        }
    }

    #[test]
    fn the_evidence_has_the_pinned_shape() {
        let json = serde_json::to_value(tunnel(3, 4, ClosedBy::Postern)).unwrap_or_default();
        assert_eq!(
            json,
            serde_json::json!({"bytes_up": 3, "bytes_down": 4, "closed_by": "postern"})
        );
    }

    #[test]
    fn a_refused_frame_shows_as_protocol_error_in_the_upgrade_evidence() {
        let upgrade = UpgradeEvidence {
            protocol: "websocket".into(),
            bytes_up: 1,
            bytes_down: 2,
            closed_by: ClosedBy::Postern,
            redactions: 0,
            protocol_error: Some(FrameError::ReservedBit),
        };
        let json = serde_json::to_value(&upgrade).unwrap_or_default();
        assert_eq!(json["protocol_error"], FrameError::ReservedBit.as_str());
        let clean = UpgradeEvidence {
            protocol_error: None,
            ..upgrade
        };
        let json = serde_json::to_value(&clean).unwrap_or_default();
        assert!(json.get("protocol_error").is_none(), "{json}");
    }
}
