//! Crash matrix: abort right after each durable transition, restart, and read
//! what recovery made of it. After DISPATCH_STARTED nothing is `not_attempted`.

use serde_json::Value;

use crate::support::{Daemon, Home, TEST_CONFIG, get_json, stdout};

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
