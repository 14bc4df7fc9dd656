//! Crash matrix: abort right after each durable transition, restart, and read
//! what recovery made of it. After DISPATCH_STARTED nothing is `not_attempted`.
//!
//! The drill here walks one synthetic invocation with one write per event kind; the
//! matrices over real exchanges (`crash_http`, `crash_ssh`) share `Expect` and
//! `check_recovered`.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{Daemon, Home, TEST_CONFIG, get_json, stdout};

/// What recovery must make of one crash cell.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub code: Option<&'static str>,
    pub phase: &'static str,
    pub outcome: &'static str,
    pub retry: &'static str,
    /// `postern decide`.
    pub verdict: &'static str,
    /// How often the remote saw the operation (its side-effect counter).
    pub effects: usize,
    /// Recovery settled it: the last event is `FAILED` from `recovery`.
    pub recovered: bool,
}

/// Stopped before `DISPATCH_STARTED`: nothing reached the remote, a new attempt is safe.
pub const fn before_dispatch(phase: &'static str) -> Expect {
    Expect {
        code: Some("BROKER_RESTARTED_BEFORE_DISPATCH"),
        phase,
        outcome: "not_attempted",
        retry: "backoff",
        verdict: "RETRY_NEW_ATTEMPT",
        effects: 0,
        recovered: true,
    }
}

/// Dispatched, not resolved: `unknown`, whatever the remote saw.
pub const fn restarted(effects: usize) -> Expect {
    Expect {
        code: Some("BROKER_RESTARTED"),
        phase: "remote_execution",
        outcome: "unknown",
        retry: "reconcile",
        verdict: "RECONCILE",
        effects,
        recovered: true,
    }
}

/// `RESULT_COMMITTED` durable with its result, not delivered: fetch it.
pub const fn fetch() -> Expect {
    Expect {
        code: Some("RESULT_DELIVERY_FAILED"),
        phase: "result_delivery",
        outcome: "committed",
        retry: "fetch_result",
        verdict: "FETCH",
        effects: 1,
        recovered: true,
    }
}

/// Delivered before the crash: a clean committed record, nothing for recovery to do.
pub const fn delivered() -> Expect {
    Expect {
        code: None,
        phase: "remote_execution",
        outcome: "committed",
        retry: "never",
        verdict: "RETURN_RECORDED_RESULT",
        effects: 1,
        recovered: false,
    }
}

/// A failure after dispatch recorded (and settled) before the crash: recovery leaves it.
pub const fn failed_after_dispatch(code: &'static str, effects: usize) -> Expect {
    Expect {
        code: Some(code),
        effects,
        recovered: false,
        ..restarted(effects)
    }
}

/// A failure before dispatch recorded before the crash: recovery leaves it.
pub const fn failed_before_dispatch(code: &'static str, phase: &'static str) -> Expect {
    Expect {
        code: Some(code),
        recovered: false,
        ..before_dispatch(phase)
    }
}

/// The operator denied the held request before the crash: it stays denied (APPROVAL_DENIED
/// goes in one write with its FAILED, so recovery has nothing to settle).
pub const fn denied() -> Expect {
    Expect {
        retry: "never",
        verdict: "STOP_FOR_CORRECTION",
        ..failed_before_dispatch("APPROVAL_DENIED", "credential_injection")
    }
}

/// An operator-attested resolution of an `unknown` (`postern reconcile`) recorded before the
/// crash: it stands, with `code` (the failure it resolved) and the retry of its outcome;
/// no result is stored, so the record itself is the answer.
pub const fn reconciled(code: &'static str, committed: bool, effects: usize) -> Expect {
    Expect {
        code: Some(code),
        phase: "remote_execution",
        outcome: if committed { "committed" } else { "rejected" },
        retry: if committed {
            "never"
        } else {
            "after_correction"
        },
        verdict: "RETURN_RECORDED_OUTCOME",
        effects,
        recovered: false,
    }
}

/// The operator's answer to a held request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Answer {
    Approves,
    Denies,
}

/// Answers the one held request once postern lists it.
pub fn answer_held(daemon: &Daemon, answer: Answer) {
    let verb = match answer {
        Answer::Approves => "approve",
        Answer::Denies => "deny",
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let (_, list) = get_json(&daemon.url("/v1/approvals"), &[]);
        if let Some(id) = list["approvals"][0]["invocation_id"].as_str() {
            // The daemon dies while answering: the reply does not matter.
            let _ = daemon.cli(&[verb, id], &[]);
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("the request was never held for approval");
}

/// What an operator writes when reconciling in the crash cells.
pub const RECONCILE_NOTE: &str = "checked the remote's own ledger";

/// `postern reconcile` of the newest invocation (the daemon may die answering).
pub fn reconcile_newest(daemon: &Daemon, committed: bool) {
    let (_, list) = get_json(&daemon.url("/v1/invocations?limit=1"), &[]);
    let id = list["invocations"][0]["invocation_id"]
        .as_str()
        .expect("an invocation to reconcile")
        .to_owned();
    let outcome = if committed { "committed" } else { "rejected" };
    let args = [
        "reconcile",
        &id,
        "--outcome",
        outcome,
        "--note",
        RECONCILE_NOTE,
    ];
    let _ = daemon.cli(&args, &[]);
}

/// Checks the one invocation of a restarted daemon against `e` (see `check_newest`).
pub fn check_recovered(daemon: &Daemon, e: &Expect, ctx: &str) -> (Value, Option<Value>) {
    check_newest(daemon, 1, e, ctx)
}

/// Checks the newest of the `count` invocations of a restarted daemon against `e`: record,
/// envelope, `decide`, events, and the rule that `fetch_result` (and a committed outcome
/// not attested by an operator) needs a stored result, which exists only after
/// `RESULT_COMMITTED`. A reconciliation must be the last event, from `operator_attested`.
/// Returns the record and the result.
pub fn check_newest(
    daemon: &Daemon,
    count: usize,
    e: &Expect,
    ctx: &str,
) -> (Value, Option<Value>) {
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    let all = list["invocations"].as_array().cloned().unwrap_or_default();
    assert_eq!(all.len(), count, "{ctx}: {count} invocation(s): {list}");
    let id = all[0]["invocation_id"].as_str().unwrap().to_owned();
    let (status, r) = get_json(&daemon.url(&format!("/v1/invocations/{id}")), &[]);
    let (_, events) = get_json(&daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
    let events = events["events"].as_array().cloned().unwrap_or_default();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or(""))
        .collect();
    let ctx = format!("{ctx}: events {kinds:?}: {r}");
    assert_eq!(status, 200, "{ctx}");
    let code = e.code.map_or(Value::Null, |c| Value::String(c.into()));
    assert_eq!(
        (
            &r["code"],
            r["phase"].as_str(),
            r["outcome"].as_str(),
            r["retry"].as_str()
        ),
        (&code, Some(e.phase), Some(e.outcome), Some(e.retry)),
        "{ctx}"
    );
    match e.code {
        None => assert!(r["envelope"].is_null(), "{ctx}"),
        Some(_) => {
            assert_eq!(r["envelope"]["error"]["code"], code, "{ctx}");
            assert_eq!(r["envelope"]["error"]["outcome"], e.outcome, "{ctx}");
            assert_eq!(r["envelope"]["error"]["retry"], e.retry, "{ctx}");
        }
    }
    let verdict = daemon.cli(&["decide", &id], &[]);
    assert_eq!(stdout(&verdict).trim(), e.verdict, "{ctx}");
    let dispatched = kinds.contains(&"DISPATCH_STARTED");
    assert_eq!(
        dispatched,
        r["evidence"]["dispatch_started"] == true,
        "{ctx}"
    );
    assert_eq!(dispatched, e.outcome != "not_attempted", "{ctx}");
    let last = events.last().cloned().unwrap_or_default();
    let by_recovery = last["kind"] == "FAILED" && last["source"] == "recovery";
    assert_eq!(by_recovery, e.recovered, "{ctx}");
    let reconciled = kinds.contains(&"RECONCILED");
    if reconciled {
        assert_eq!(
            (last["kind"].as_str(), last["source"].as_str()),
            (Some("RECONCILED"), Some("operator_attested")),
            "{ctx}"
        );
        let note = &r["evidence"]["reconciled"];
        assert_eq!(
            (note["note"].as_str(), note["source"].as_str()),
            (Some(RECONCILE_NOTE), Some("operator_attested")),
            "{ctx}"
        );
    }
    let out = daemon.cli(&["result", &id, "--json"], &[]);
    let result = out
        .status
        .success()
        .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap());
    let committed = kinds.contains(&"RESULT_COMMITTED");
    assert_eq!(
        result.is_some(),
        committed,
        "{ctx}: stored result {result:?}"
    );
    assert_eq!(committed, e.outcome == "committed" && !reconciled, "{ctx}");
    if e.retry == "fetch_result" {
        assert!(
            result.is_some(),
            "{ctx}: fetch_result without a stored result"
        );
    }
    (r, result)
}

struct Case {
    crash_after: &'static str,
    method: &'static str,
    code: Value,
    phase: &'static str,
    outcome: &'static str,
    retry: &'static str,
    verdict: &'static str,
}

fn case(
    crash_after: &'static str,
    method: &'static str,
    code: Option<&str>,
    phase: &'static str,
    outcome: &'static str,
    retry: &'static str,
    verdict: &'static str,
) -> Case {
    Case {
        crash_after,
        method,
        code: code.map_or(Value::Null, |c| Value::String(c.into())),
        phase,
        outcome,
        retry,
        verdict,
    }
}

#[test]
fn a_crash_between_any_two_durable_transitions_recovers_to_what_the_journal_proves() {
    let before = Some("BROKER_RESTARTED_BEFORE_DISPATCH");
    let after = Some("BROKER_RESTARTED");
    let cases = [
        case(
            "ACTION_ACCEPTED",
            "POST",
            before,
            "validation",
            "not_attempted",
            "backoff",
            "RETRY_NEW_ATTEMPT",
        ),
        case(
            "PREFLIGHT_VALIDATED",
            "POST",
            before,
            "credential_injection",
            "not_attempted",
            "backoff",
            "RETRY_NEW_ATTEMPT",
        ),
        case(
            "CONNECT_ATTEMPT",
            "POST",
            before,
            "connection_setup",
            "not_attempted",
            "backoff",
            "RETRY_NEW_ATTEMPT",
        ),
        case(
            "DISPATCH_STARTED",
            "POST",
            after,
            "remote_execution",
            "unknown",
            "reconcile",
            "RECONCILE",
        ),
        case(
            "DISPATCH_STARTED",
            "GET",
            after,
            "remote_execution",
            "unknown",
            "backoff",
            "RETRY_NEW_ATTEMPT",
        ),
        case(
            "REQUEST_SENT",
            "POST",
            after,
            "remote_execution",
            "unknown",
            "reconcile",
            "RECONCILE",
        ),
        case(
            "REMOTE_RESPONSE_STARTED",
            "POST",
            after,
            "remote_execution",
            "unknown",
            "reconcile",
            "RECONCILE",
        ),
        case(
            "REMOTE_RESPONSE_COMPLETE",
            "POST",
            after,
            "remote_execution",
            "unknown",
            "reconcile",
            "RECONCILE",
        ),
        case(
            "RESULT_COMMITTED",
            "POST",
            Some("RESULT_DELIVERY_FAILED"),
            "result_delivery",
            "committed",
            "fetch_result",
            "FETCH",
        ),
        case(
            "RESULT_DELIVERED",
            "POST",
            None,
            "remote_execution",
            "committed",
            "never",
            "RETURN_RECORDED_RESULT",
        ),
    ];
    for c in cases {
        let home = Home::new();
        let (id, out) = home.drill(c.method, "RESULT_DELIVERED", Some(c.crash_after));
        assert!(
            out.status.code().is_none(),
            "{}: drill should abort, got {:?}",
            c.crash_after,
            out.status
        );
        let daemon = Daemon::start(&home, Some(TEST_CONFIG));
        let (status, r) = get_json(&daemon.url(&format!("/v1/invocations/{id}")), &[]);
        let ctx = format!("crash after {} ({}): {r}", c.crash_after, c.method);
        assert_eq!(status, 200, "{ctx}");
        assert_eq!(r["code"], c.code, "{ctx}");
        assert_eq!(r["phase"], c.phase, "{ctx}");
        assert_eq!(r["outcome"], c.outcome, "{ctx}");
        assert_eq!(r["retry"], c.retry, "{ctx}");
        if c.code.is_null() {
            assert!(r["envelope"].is_null(), "{ctx}");
        } else {
            assert_eq!(r["envelope"]["error"]["code"], c.code, "{ctx}");
            assert_eq!(r["envelope"]["error"]["outcome"], c.outcome, "{ctx}");
        }
        let verdict = daemon.cli(&["decide", &id], &[]);
        assert_eq!(stdout(&verdict).trim(), c.verdict, "{ctx}");
        let (_, events) = get_json(&daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
        let kinds: Vec<&str> = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["kind"].as_str().unwrap_or(""))
            .collect();
        let dispatched = kinds.contains(&"DISPATCH_STARTED");
        assert_eq!(
            dispatched,
            r["evidence"]["dispatch_started"] == true,
            "{ctx}"
        );
        if dispatched {
            assert_ne!(r["outcome"], "not_attempted", "{ctx}");
        }
        if c.code.is_null() {
            assert_eq!(kinds.last(), Some(&"RESULT_DELIVERED"), "{ctx}");
        } else {
            let last = &events["events"].as_array().unwrap().last().unwrap().clone();
            assert_eq!(
                (last["kind"].as_str(), last["source"].as_str()),
                (Some("FAILED"), Some("recovery")),
                "{ctx}"
            );
        }
        if c.outcome == "committed" {
            let (status, result) =
                get_json(&daemon.url(&format!("/v1/invocations/{id}/result")), &[]);
            assert_eq!(
                (status, result["status"].as_u64()),
                (200, Some(200)),
                "{ctx}"
            );
        }
    }
}
