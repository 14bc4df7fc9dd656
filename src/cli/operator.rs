//! Operator commands that talk to the running daemon.

use std::path::Path;
use std::process::ExitCode;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::client::{api_error, call};
use super::render;
use super::{ActionsCommand, AdminTarget, CliError, Home, percent_encode};
use crate::contract::{Code, OperationView, Outcome, RecordFacts, Retry, decide as decide_verdict};
use crate::journal::unb64;

fn get(target: &AdminTarget, path: &str) -> Result<Value, CliError> {
    let (status, body) = call(target, Method::GET, path, None)?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(api_error(status, &body))
    }
}

fn print_json(v: &Value) {
    outln!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn s(v: &Value) -> std::borrow::Cow<'_, str> {
    render::printable(v.as_str().unwrap_or("-"))
}

pub fn actions(target: &AdminTarget, command: ActionsCommand) -> Result<ExitCode, CliError> {
    match command {
        ActionsCommand::List {
            agent,
            outcome,
            phase,
            limit,
            cursor,
            json,
        } => {
            let mut q = format!("limit={limit}");
            // The same filters page on: the hint repeats them.
            let mut again = format!("postern actions list --limit {limit}");
            let filters = [("agent", agent), ("outcome", outcome), ("phase", phase)];
            for (k, v) in filters {
                if let Some(v) = v {
                    q.push_str(&format!("&{k}={}", percent_encode(&v)));
                    again.push_str(&format!(" --{k} {v}"));
                }
            }
            if let Some(c) = cursor {
                q.push_str(&format!("&cursor={}", percent_encode(&c)));
            }
            let body = get(target, &format!("/v1/invocations?{q}"))?;
            if json {
                print_json(&body);
                return Ok(ExitCode::SUCCESS);
            }
            let mut rows = vec![
                ["ID", "AGENT", "OUTCOME", "PHASE", "RETRY", "CODE", "TARGET"].map(String::from),
            ];
            for r in body["invocations"].as_array().into_iter().flatten() {
                let field = |k: &str| s(&r[k]).to_string();
                rows.push([
                    field("invocation_id"),
                    field("agent"),
                    field("outcome"),
                    field("phase"),
                    field("retry"),
                    field("code"),
                    list_target(r),
                ]);
            }
            for line in columns(&rows) {
                outln!("{line}");
            }
            if let Some(next) = body["next"].as_str() {
                errln!("postern: more invocations: `{again} --cursor {next}`");
            }
            Ok(ExitCode::SUCCESS)
        }
        ActionsCommand::Show { id, json } => {
            let note = is_note_id(&id.id);
            let id = percent_encode(&id.id);
            // A reload's or a retention cut's id names a journal note, not a record.
            let mut record = match note {
                true => json!({"invocation_id": id}),
                false => get(target, &format!("/v1/invocations/{id}"))?,
            };
            let events = get(target, &format!("/v1/invocations/{id}/events"))?;
            record["events"] = events["events"].clone();
            if events["events_pruned"] == true {
                record["events_pruned"] = json!(true);
            }
            match (json, note) {
                (true, _) => print_json(&record),
                (false, true) => print_events(&record),
                (false, false) => print_show(&record),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `rld_…` (a reload) and `prn_…` (a retention cut): journal notes, shown as their events.
fn is_note_id(id: &str) -> bool {
    id.starts_with("rld_") || id.starts_with("prn_")
}

fn print_events(r: &Value) {
    if r["events_pruned"] == true {
        outln!("events:     pruned by retention (the record above stays)");
        return;
    }
    outln!("events:");
    for e in r["events"].as_array().into_iter().flatten() {
        outln!(
            "  #{:<6} {}  {:<24} gen {} att {}  {:<18} {:<8} {}",
            e["seq"],
            s(&e["ts"]),
            s(&e["kind"]),
            e["generation"],
            e["attempt"],
            s(&e["source"]),
            s(&e["hop"]),
            e["data"]
        );
    }
}

fn print_show(r: &Value) {
    outln!("invocation  {}", s(&r["invocation_id"]));
    outln!("agent       {}", s(&r["agent"]));
    outln!("target      {} {}", s(&r["method"]), s(&r["target"]));
    outln!("route       {}", s(&r["route"]));
    outln!("outcome     {}", s(&r["outcome"]));
    outln!("phase       {}", s(&r["phase"]));
    outln!("retry       {}", s(&r["retry"]));
    outln!("code        {}", s(&r["code"]));
    outln!(
        "generation  {}   attempts {}",
        r["generation"],
        r["attempts"]
    );
    outln!("created_at  {}", s(&r["created_at"]));
    outln!("evidence    {}", r["evidence"]);
    if !r["result"].is_null() {
        outln!("result      {}", r["result"]);
    }
    if !r["envelope"].is_null() {
        outln!("envelope    {}", r["envelope"]);
    }
    print_events(r);
}

/// `postern result ID [--json] [--output FILE]`: the stored result, never re-executed.
pub fn result(
    target: &AdminTarget,
    id: &str,
    json: bool,
    output: Option<&Path>,
) -> Result<ExitCode, CliError> {
    let body = get(
        target,
        &format!("/v1/invocations/{}/result", percent_encode(id)),
    )?;
    if json {
        print_json(&body);
        return Ok(ExitCode::SUCCESS);
    }
    let saved = match output {
        Some(path) => Some(save_body(&body, path)?),
        None => None,
    };
    for line in render::result(&body, saved.as_deref()) {
        outln!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the raw HTTP body (SSH: stdout) to `path`; returns the path as shown.
fn save_body(result: &Value, path: &Path) -> Result<String, CliError> {
    let field = if result.get("status").is_some() {
        "body_base64"
    } else {
        "stdout_base64"
    };
    let bytes = result[field]
        .as_str()
        .and_then(unb64)
        .ok_or_else(|| CliError::Failed("only the digest of this body was kept".into()))?;
    std::fs::write(path, bytes)
        .map_err(|e| CliError::Failed(format!("cannot write {}: {e}", path.display())))?;
    Ok(path.display().to_string())
}

pub fn decide(target: &AdminTarget, id: &str, json: bool) -> Result<ExitCode, CliError> {
    let r = get(target, &format!("/v1/invocations/{}", percent_encode(id)))?;
    let parse = |v: &Value| v.as_str().map(str::to_owned);
    let facts = RecordFacts {
        code: parse(&r["code"]).and_then(|c| Code::parse(&c)),
        outcome: parse(&r["outcome"])
            .and_then(|o| Outcome::parse(&o))
            .ok_or_else(|| CliError::Failed("the record has no readable outcome".into()))?,
        retry: parse(&r["retry"])
            .and_then(|o| Retry::parse(&o))
            .ok_or_else(|| CliError::Failed("the record has no readable retry".into()))?,
        result_stored: false,
    };
    let op = OperationView {
        idempotent: r["evidence"]["idempotent"].as_bool().unwrap_or(false),
        fingerprint_equal: true,
    };
    let now = crate::journal::unix_ms(time::OffsetDateTime::now_utc());
    let facts = RecordFacts {
        result_stored: result_stored(target, id)?,
        ..facts
    }
    .as_of(r["evidence"]["idempotency"]["safe_until"].as_str(), now);
    let verdict = decide_verdict(facts, op);
    if json {
        print_json(&json!({"invocation_id": id, "verdict": verdict}));
    } else {
        outln!("{}", verdict.as_str());
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether the daemon has a result stored for `id` (it may have expired or never existed).
fn result_stored(target: &AdminTarget, id: &str) -> Result<bool, CliError> {
    let path = format!("/v1/invocations/{}/result", percent_encode(id));
    let (status, _) = call(target, Method::GET, &path, None)?;
    Ok(status == StatusCode::OK)
}

pub fn reconcile(
    target: &AdminTarget,
    id: &str,
    outcome: &str,
    note: &str,
) -> Result<ExitCode, CliError> {
    let body = json!({"outcome": outcome, "note": note});
    let path = format!("/v1/invocations/{}/reconcile", percent_encode(id));
    let (status, reply) = call(target, Method::POST, &path, Some(&body))?;
    if status != StatusCode::OK {
        return Err(api_error(status, &reply));
    }
    outln!(
        "{} reconciled as {} (operator_attested)",
        id,
        s(&reply["outcome"])
    );
    Ok(ExitCode::SUCCESS)
}

/// `postern reload`: the daemon reads its config again; what changed, or every problem.
pub fn reload(
    target: &AdminTarget,
    json: bool,
    local: impl Fn() -> Result<(), crate::config::ConfigErrors>,
) -> Result<ExitCode, CliError> {
    let (status, reply) = match call(target, Method::POST, "/v1/reload", Some(&json!({}))) {
        Ok(answer) => answer,
        // No daemon answered: the config may be why this CLI looked in the wrong place.
        Err(unreachable) => match local() {
            Err(problems) => {
                errln!("postern: {unreachable}");
                return Err(CliError::from(problems));
            }
            Ok(()) => return Err(unreachable),
        },
    };
    if json {
        print_json(&reply);
    }
    if status == StatusCode::UNPROCESSABLE_ENTITY {
        if !json {
            errln!(
                "postern: the config was refused ({}); the daemon keeps the one it had:",
                s(&reply["reload_id"])
            );
            for p in reply["problems"].as_array().into_iter().flatten() {
                errln!("  {}: {}", s(&p["path"]), s(&p["message"]));
            }
        }
        return Ok(ExitCode::FAILURE);
    }
    if status != StatusCode::OK {
        return Err(api_error(status, &reply));
    }
    if !json {
        outln!("postern: config reloaded ({})", s(&reply["reload_id"]));
        for (section, changes) in reply["changes"].as_object().into_iter().flatten() {
            outln!("  {section}: {changes}");
        }
        for warning in reply["warnings"].as_array().into_iter().flatten() {
            errln!("postern: warning: {}", s(warning));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `postern approve` / `postern deny`: answers a held request (SPEC §3.5).
pub fn answer(target: &AdminTarget, id: &str, approve: bool) -> Result<ExitCode, CliError> {
    let verb = if approve { "approve" } else { "deny" };
    let path = format!("/v1/approvals/{}/{verb}", percent_encode(id));
    let (status, reply) = call(target, Method::POST, &path, Some(&json!({})))?;
    if status != StatusCode::OK {
        return Err(api_error(status, &reply));
    }
    outln!("{}", render::decision(id, approve, &reply));
    Ok(ExitCode::SUCCESS)
}

/// `postern approvals`: the requests waiting for an answer, oldest first.
pub fn approvals(target: &AdminTarget, json: bool) -> Result<ExitCode, CliError> {
    let list = get(target, "/v1/approvals")?;
    if json {
        print_json(&list);
        return Ok(ExitCode::SUCCESS);
    }
    for line in render::approvals(&list) {
        outln!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Asks the daemon; with no daemon running, opens the journal itself.
pub fn audit_verify(
    target: &AdminTarget,
    home: &Home,
    json: bool,
    cluster: bool,
) -> Result<ExitCode, CliError> {
    let path = match cluster {
        true => "/v1/audit/verify?cluster=1",
        false => "/v1/audit/verify",
    };
    let report = match get(target, path) {
        Ok(v) => v,
        // The anchors are in the fleet's store, which only the daemon reaches.
        Err(CliError::Unreachable { .. }) if !cluster => offline_verify(home)?,
        Err(e) => return Err(e),
    };
    if json {
        print_json(&report);
    } else {
        print_verify(&report);
    }
    Ok(if report["ok"].as_bool() == Some(true) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_verify(report: &Value) {
    if report["chain_ok"].as_bool() == Some(false) || report.get("break").is_some() {
        outln!(
            "BROKEN at seq {}: {} ({} events verified before it)",
            report["break"]["seq"],
            s(&report["break"]["reason"]),
            report["events"]
        );
    } else {
        let from = match report.get("checkpoint") {
            Some(c) => format!(
                " from seq {} (checkpoint at seq {}, hash {})",
                report["from_seq"],
                c["seq"],
                s(&c["hash"])
            ),
            None => String::new(),
        };
        outln!(
            "ok: {} events{from}, head seq {} hash {}",
            report["events"],
            report["head_seq"],
            s(&report["head_hash"])
        );
    }
    for node in report["cluster"]["nodes"].as_array().into_iter().flatten() {
        let verdict = match node["ok"].as_bool() {
            Some(true) => "ok".to_owned(),
            Some(false) => format!("REWRITTEN: {}", s(&node["detail"])),
            None => "not checked yet".to_owned(),
        };
        outln!("node {}: {verdict}", s(&node["node"]));
    }
}

/// `postern audit export --since SEQ` (SPEC §5.8): every event from SEQ as a JSON line, page
/// by page from the daemon, or from the journal itself when no daemon runs.
pub fn audit_export(
    target: &AdminTarget,
    home: &Home,
    mut since: u64,
) -> Result<ExitCode, CliError> {
    loop {
        let page = match get(
            target,
            &format!("/v1/audit/export?since={since}&limit=1000"),
        ) {
            Ok(v) => v,
            Err(CliError::Unreachable { .. }) => return offline_export(home, since),
            Err(e) => return Err(e),
        };
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            return Ok(ExitCode::SUCCESS);
        }
        for event in &events {
            outln!("{event}");
        }
        since = page["next_since"].as_u64().unwrap_or(u64::MAX);
    }
}

fn offline_export(home: &Home, mut since: u64) -> Result<ExitCode, CliError> {
    let store = open_offline(home)?;
    loop {
        let page = crate::journal::export_page(&store, since, 1000)
            .map_err(|e| CliError::Failed(format!("cannot read the journal: {e}")))?;
        if page.events.is_empty() {
            return Ok(ExitCode::SUCCESS);
        }
        for event in &page.events {
            outln!("{}", json!(event));
        }
        since = page.next_since;
    }
}

/// The journal opened by the CLI itself (no daemon holds it).
fn open_offline(home: &Home) -> Result<crate::journal::FjallStore, CliError> {
    home.require().map_err(CliError::Failed)?;
    let dir = home.journal_dir();
    if !dir.exists() {
        return Err(CliError::Failed(format!("no journal at {}", dir.display())));
    }
    crate::journal::FjallStore::open(&dir)
        .map_err(|e| CliError::Failed(format!("cannot open the journal: {e}")))
}

fn offline_verify(home: &Home) -> Result<Value, CliError> {
    let store = open_offline(home)?;
    let report = crate::journal::verify(&store)
        .map_err(|e| CliError::Failed(format!("cannot read the journal: {e}")))?;
    Ok(json!(report))
}

/// The list's TARGET column: an SSH record adds its command (the target alone says nothing
/// about what ran), escaped so a control character cannot drive the terminal, and cut short.
/// Rows as columns as wide as their widest cell (the last one unpadded).
fn columns<const N: usize>(rows: &[[String; N]]) -> Vec<String> {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                match i + 1 == N {
                    true => line.push_str(cell),
                    false => {
                        let pad = widths[i].saturating_sub(cell.chars().count()) + 1;
                        line.push_str(cell);
                        line.push_str(&" ".repeat(pad));
                    }
                }
            }
            line
        })
        .collect()
}

fn list_target(record: &Value) -> String {
    let target = s(&record["target"]);
    match record["command"].as_str() {
        Some(command) => format!("{target} {}", shown_command(command, COMMAND_WIDTH)),
        None => target.to_string(),
    }
}

/// Characters of an SSH command `actions list` shows.
const COMMAND_WIDTH: usize = 60;

fn shown_command(command: &str, width: usize) -> String {
    let escaped: String = command.chars().flat_map(char::escape_debug).collect();
    let mut cut: String = escaped.chars().take(width).collect();
    if escaped.chars().count() > width {
        cut.push('…');
    }
    format!("`{cut}`")
}

#[cfg(test)]
mod columns_tests {
    use super::columns;

    /// Issue 40 (low 5): a long agent id or code pushed the columns after it out of line.
    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let rows = [
            ["ID", "AGENT", "CODE"].map(String::from),
            [
                "act_1",
                "a-very-long-agent-name",
                "BROKER_RESTARTED_BEFORE_DISPATCH",
            ]
            .map(String::from),
            ["act_2", "ci", "none"].map(String::from),
        ];
        let lines = columns(&rows);
        let at = |l: &str| {
            l.find("CODE")
                .or_else(|| l.find("BROKER"))
                .or_else(|| l.find("none"))
        };
        assert!(lines.iter().all(|l| at(l) == at(&lines[0])), "{lines:#?}");
    }
}
