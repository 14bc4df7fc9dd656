//! `postern agents list|suspend|resume` (SPEC §5.8 kill switch): the admin API's
//! `/v1/agents` routes, printed for an operator.

use std::process::ExitCode;

use clap::Subcommand;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::client::{api_error, call};
use super::{AdminTarget, CliError, percent_encode};

#[derive(Subcommand, Debug)]
pub enum AgentsCommand {
    /// The configured agents and which of them are suspended.
    List {
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Refuse every new request and SSH exec of agent ID (AGENT_SUSPENDED) and deny its held
    /// approvals; exchanges in flight finish. Journaled; survives a restart.
    Suspend {
        /// The agent id (from [[agents]]).
        #[arg(value_name = "ID")]
        id: String,
        /// Why (journaled with the suspension).
        #[arg(long, value_name = "TEXT")]
        note: Option<String>,
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lift agent ID's suspension. Journaled.
    Resume {
        /// The agent id.
        #[arg(value_name = "ID")]
        id: String,
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(target: &AdminTarget, command: AgentsCommand) -> Result<ExitCode, CliError> {
    match command {
        AgentsCommand::List { json } => list(target, json),
        AgentsCommand::Suspend { id, note, json } => switch(target, &id, Some(note), json),
        AgentsCommand::Resume { id, json } => switch(target, &id, None, json),
    }
}

fn list(target: &AdminTarget, json: bool) -> Result<ExitCode, CliError> {
    let reply = ask(target, Method::GET, "/v1/agents", None)?;
    if json {
        return Ok(print_json(&reply));
    }
    for agent in reply["agents"].as_array().into_iter().flatten() {
        outln!("{}", agent_line(agent));
    }
    Ok(ExitCode::SUCCESS)
}

/// The admin API's answer, or its error.
fn ask(
    target: &AdminTarget,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, CliError> {
    let (status, reply) = call(target, method, path, body)?;
    match status == StatusCode::OK {
        true => Ok(reply),
        false => Err(api_error(status, &reply)),
    }
}

fn print_json(reply: &Value) -> ExitCode {
    outln!(
        "{}",
        serde_json::to_string_pretty(reply).unwrap_or_default()
    );
    ExitCode::SUCCESS
}

/// `ci  active`, or `ci  SUSPENDED since … (sus_…, seq N): note`.
fn agent_line(agent: &Value) -> String {
    let id = agent["id"].as_str().unwrap_or("-");
    let s = &agent["suspension"];
    let mut line = match s.is_object() {
        false => format!("{id}  active"),
        true => format!(
            "{id}  SUSPENDED since {} ({}, seq {})",
            s["since"].as_str().unwrap_or("-"),
            s["id"].as_str().unwrap_or("-"),
            s["seq"]
        ),
    };
    if let Some(note) = s["note"].as_str() {
        line.push_str(&format!(": {note}"));
    }
    if agent["configured"] == false {
        line.push_str("  (not in the config in force)");
    }
    line
}

/// `suspend` when `note` is `Some` (its inner value may be none), else `resume`.
fn switch(
    target: &AdminTarget,
    id: &str,
    note: Option<Option<String>>,
    json: bool,
) -> Result<ExitCode, CliError> {
    let verb = if note.is_some() { "suspend" } else { "resume" };
    let body = json!({"note": note.flatten()});
    let path = format!("/v1/agents/{}/{verb}", percent_encode(id));
    let reply = ask(target, Method::POST, &path, Some(&body))?;
    if json {
        return Ok(print_json(&reply));
    }
    outln!("{}", switched_line(id, verb, &reply));
    for denied in reply["denied_approvals"].as_array().into_iter().flatten() {
        outln!(
            "  held approval {} denied (APPROVAL_DENIED)",
            denied.as_str().unwrap_or("-")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn switched_line(id: &str, verb: &str, reply: &Value) -> String {
    let state = if verb == "suspend" {
        "suspended"
    } else {
        "resumed"
    };
    match reply["changed"].as_bool() {
        Some(true) => format!(
            "agent {id} {state} ({}, seq {}, operator_attested)",
            reply["event_id"].as_str().unwrap_or("-"),
            reply["seq"]
        ),
        _ if verb == "suspend" => format!(
            "agent {id} was already suspended ({}); nothing changed",
            reply["suspension"]["id"].as_str().unwrap_or("-")
        ),
        _ => format!("agent {id} was not suspended; nothing changed"),
    }
}
