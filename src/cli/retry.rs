//! `postern retry ID`: asks the daemon to act on the verdict and says what happened.
//! Exit status 0 when the answer settles the invocation (a new generation resolved, a
//! stored result or a recorded outcome), 1 when nothing could be sent or it stayed open.

use std::process::ExitCode;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::client::{Wait, api_error, call_headed};
use super::{AdminTarget, CliError, percent_encode};

pub struct Ask {
    pub reconciled: bool,
    pub note: Option<String>,
    pub json: bool,
}

pub fn run(target: &AdminTarget, id: &str, ask: &Ask) -> Result<ExitCode, CliError> {
    let mut body = json!({});
    if ask.reconciled {
        body["operator_attested_safe"] = json!(true);
    }
    if let Some(note) = &ask.note {
        body["note"] = json!(note);
    }
    let path = format!("/v1/invocations/{}/retry", percent_encode(id));
    let waiting = still_running_note(id);
    let answer = call_headed(target, Method::POST, &path, Some(&body), Wait::Unbounded);
    drop(waiting);
    let (status, headers, reply) = match answer {
        Err(CliError::Unreachable { url, detail }) => {
            // The daemon may have taken the retry before the connection broke; it runs on.
            let detail = format!(
                "{detail}; if the daemon took the retry, it runs to its end: `postern actions show {id}` tells"
            );
            return Err(CliError::Unreachable { url, detail });
        }
        answer => answer?,
    };
    let retried = headers
        .get("postern-verdict")
        .is_some_and(|v| v.as_bytes() == b"RETRIED");
    if ask.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&reply).unwrap_or_default()
        );
    }
    if status == StatusCode::CONFLICT && reply["error"]["verdict"].is_string() {
        return refused(&reply, ask.json);
    }
    if !status.is_success() {
        let mut err = api_error(status, &reply);
        if reply["error"]["code"] == "RETRY_BUDGET_EXHAUSTED"
            && let CliError::Failed(text) = &mut err
        {
            text.push_str(&format!(
                "\npostern: {id} used up its retry budget, so postern does not repeat it; an idempotent request may be sent again as a new request, otherwise find out at the remote and `postern reconcile {id}`."
            ));
        }
        return Err(err);
    }
    if ask.json {
        return Ok(settled(&reply));
    }
    outln!("{}", describe(id, &reply, retried));
    Ok(settled(&reply))
}

/// Says once, after a few seconds without an answer, what the retry may be waiting for
/// (an approval) and that it goes on without the CLI. Dropping the guard stops it.
fn still_running_note(id: &str) -> StillRunning {
    let (done, rx) = std::sync::mpsc::channel::<()>();
    let id = id.to_owned();
    std::thread::spawn(move || {
        let waited = rx.recv_timeout(std::time::Duration::from_secs(3));
        if matches!(waited, Err(std::sync::mpsc::RecvTimeoutError::Timeout)) {
            errln!(
                "postern: {id}: the retry is running (held for approval? `postern approvals list`); it goes on if you stop waiting, and `postern actions show {id}` tells"
            );
        }
    });
    StillRunning { _done: done }
}

struct StillRunning {
    _done: std::sync::mpsc::Sender<()>,
}

/// A refusal names the verdict and what to do instead; nothing was sent.
fn refused(reply: &Value, json: bool) -> Result<ExitCode, CliError> {
    let e = &reply["error"];
    if !json {
        errln!(
            "postern: {} ({}): {}",
            e["code"].as_str().unwrap_or("RETRY_REFUSED"),
            e["verdict"].as_str().unwrap_or("-"),
            e["message"].as_str().unwrap_or("")
        );
    }
    Ok(ExitCode::from(1))
}

/// One line: what the answer is, by its shape (record, or stored result).
fn describe(id: &str, reply: &Value, retried: bool) -> String {
    let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let result = ["body_base64", "stdout_base64", "tunnel"];
    if result.iter().any(|k| reply.get(k).is_some()) {
        return format!(
            "{id}: a result is stored ({}); nothing was sent. `postern result {id}` prints it.",
            s(&reply["outcome"])
        );
    }
    let generation = reply["generation"].as_u64().unwrap_or(1);
    let code = reply["code"]
        .as_str()
        .map(|c| format!(" {c}"))
        .unwrap_or_default();
    let sent = match retried {
        true => "",
        false => "; nothing was sent, the recorded outcome stands",
    };
    format!(
        "{id} generation {generation}: {} {}{code} (retry {}){sent}",
        s(&reply["phase"]),
        s(&reply["outcome"]),
        s(&reply["retry"])
    )
}

fn settled(reply: &Value) -> ExitCode {
    match reply["outcome"].as_str() {
        Some("committed" | "rejected") => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    }
}
