//! `POST /v1/invocations/{id}/retry`: the verdict acted on, as HTTP. Every answer carries
//! `Postern-Verdict`; a refusal says what to do instead, and nothing was sent.

use http::{HeaderValue, StatusCode};
use serde_json::{Value, json};

use super::state::{AdminState, Reply, error, held_elsewhere, json_reply, storage_error};
use crate::lifecycle::retry::{RetryAnswer, RetryAsk, retry};

/// Acts on the verdict for `id`; body `{"operator_attested_safe": true, "note": "…"}`.
pub async fn answer(state: &AdminState, id: &str, body: &Value) -> Reply {
    let ask = match ask_of(body) {
        Ok(a) => a,
        Err(why) => return error(StatusCode::BAD_REQUEST, "BAD_REQUEST_BODY", why),
    };
    let (verdict, reply) = match retry(&state.journal, &state.resend, id, ask).await {
        RetryAnswer::Retried(record) => ("RETRIED", json_reply(StatusCode::OK, &json!(record))),
        RetryAnswer::Fetched(v, result) => (v.as_str(), json_reply(StatusCode::OK, &json!(result))),
        RetryAnswer::Settled(v, record) => (v.as_str(), json_reply(StatusCode::OK, &json!(record))),
        RetryAnswer::Refused {
            verdict,
            code,
            message,
            record,
        } => {
            let body = json!({
                "error": {"code": code, "message": message, "verdict": verdict},
                "record": record,
            });
            let v = verdict.map_or("NONE", |v| v.as_str());
            (v, json_reply(StatusCode::CONFLICT, &body))
        }
        RetryAnswer::Failed(envelope) => {
            let status = StatusCode::from_u16(envelope.error.code.http_status())
                .unwrap_or(StatusCode::CONFLICT);
            ("NONE", json_reply(status, &json!(envelope)))
        }
        RetryAnswer::NotFound => return held_elsewhere(state, id).await.reply(),
        RetryAnswer::Unavailable => return storage_error(),
    };
    with_verdict(reply, verdict)
}

fn ask_of(body: &Value) -> Result<RetryAsk, &'static str> {
    let attested = match body.get("operator_attested_safe") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("operator_attested_safe must be true or false."),
    };
    // The attestation is journaled either way (SPEC §5.1: the flag alone is enough).
    let note = match body.get("note") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("note must be a string."),
    };
    Ok(RetryAsk {
        operator_attested_safe: attested,
        note,
    })
}

fn with_verdict(mut reply: Reply, verdict: &'static str) -> Reply {
    reply
        .headers_mut()
        .insert("postern-verdict", HeaderValue::from_static(verdict));
    reply
}
