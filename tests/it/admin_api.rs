//! The admin API and the CLI over it: shapes of SPEC §5.5.

use serde_json::Value;

use crate::support::{Daemon, Home, TEST_CONFIG, curl, get_json, stderr, stdout};

const CANARY: &str = "canary-admin-token-7f3e1b";

fn config_with_token() -> String {
    let admin = "[admin]\nlisten = \"127.0.0.1:0\"";
    TEST_CONFIG.replace(admin, &format!("{admin}\ntoken = \"{CANARY}\""))
}

fn bearer() -> String {
    format!("Authorization: Bearer {CANARY}")
}

struct World {
    _home: Home,
    daemon: Daemon,
    committed: String,
    unknown: String,
}

fn world() -> World {
    let home = Home::new();
    let (committed, _) = home.drill("GET", "RESULT_DELIVERED", None);
    let (unknown, out) = home.drill("POST", "RESULT_DELIVERED", Some("REQUEST_SENT"));
    assert!(out.status.code().is_none());
    let daemon = Daemon::start(&home, Some(&config_with_token()));
    World {
        _home: home,
        daemon,
        committed,
        unknown,
    }
}

#[test]
fn the_admin_api_needs_its_token_but_healthz_does_not() {
    let w = world();
    let (status, body) = get_json(&w.daemon.url("/v1/invocations"), &[]);
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "ADMIN_UNAUTHENTICATED");
    let (status, _) = get_json(
        &w.daemon.url("/v1/invocations"),
        &["-H", "Authorization: Bearer wrong"],
    );
    assert_eq!(status, 401);
    // The scheme is case-insensitive; what the API answers is never cached.
    let lower = format!("Authorization: bearer {CANARY}");
    let (status, _, head) = curl(&["-i", "-H", &lower, &w.daemon.url("/v1/invocations")]);
    assert_eq!(status, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("cache-control: no-store"),
        "{head}"
    );
    let (status, body) = get_json(&w.daemon.url("/healthz"), &[]);
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
    let out = w.daemon.cli(&["actions", "list"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("ADMIN_UNAUTHENTICATED"));
}

#[test]
fn invocations_list_newest_first_with_filters_and_cursor() {
    let w = world();
    let auth = bearer();
    let h = ["-H", auth.as_str()];
    let (status, all) = get_json(&w.daemon.url("/v1/invocations"), &h);
    assert_eq!(status, 200);
    let ids: Vec<&str> = all["invocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["invocation_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [w.unknown.as_str(), w.committed.as_str()]);
    assert!(all["next"].is_null());

    let (_, page) = get_json(&w.daemon.url("/v1/invocations?limit=1"), &h);
    assert_eq!(page["invocations"].as_array().unwrap().len(), 1);
    let next = page["next"].as_str().unwrap().to_owned();
    let (_, rest) = get_json(
        &w.daemon
            .url(&format!("/v1/invocations?limit=1&cursor={next}")),
        &h,
    );
    assert_eq!(
        rest["invocations"][0]["invocation_id"],
        w.committed.as_str()
    );
    assert!(rest["next"].is_null());

    let (_, unknown) = get_json(&w.daemon.url("/v1/invocations?outcome=unknown"), &h);
    assert_eq!(unknown["invocations"].as_array().unwrap().len(), 1);
    assert_eq!(unknown["invocations"][0]["code"], "BROKER_RESTARTED");
    let (_, by_phase) = get_json(
        &w.daemon.url("/v1/invocations?phase=validation&agent=drill"),
        &h,
    );
    assert_eq!(by_phase["invocations"].as_array().unwrap().len(), 0);
    let (status, bad) = get_json(&w.daemon.url("/v1/invocations?outcome=maybe"), &h);
    assert_eq!(
        (status, bad["error"]["code"].as_str()),
        (400, Some("BAD_QUERY"))
    );

    let cli = w.daemon.cli(
        &["actions", "list", "--outcome", "committed", "--json"],
        &[("POSTERN_ADMIN_TOKEN", CANARY)],
    );
    let json: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(
        json["invocations"][0]["invocation_id"],
        w.committed.as_str()
    );
}

#[test]
fn a_record_has_every_pinned_field() {
    let w = world();
    let auth = bearer();
    let (status, r) = get_json(
        &w.daemon.url(&format!("/v1/invocations/{}", w.committed)),
        &["-H", &auth],
    );
    assert_eq!(status, 200);
    for key in [
        "invocation_id",
        "agent",
        "protocol",
        "route",
        "method",
        "target",
        "phase",
        "outcome",
        "retry",
        "code",
        "generation",
        "attempts",
        "created_at",
        "evidence",
        "result",
        "envelope",
    ] {
        assert!(r.get(key).is_some(), "missing {key} in {r}");
    }
    assert_eq!(r["protocol"], "https");
    assert_eq!(r["target"], "https://drill.invalid/v1/things");
    assert_eq!(r["attempts"], 1);
    assert_eq!(r["generation"], 1);
    assert!(r["code"].is_null() && r["envelope"].is_null());
    assert_eq!(r["result"]["status"], 200);
    assert!(
        r["result"]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    let created = r["created_at"].as_str().unwrap();
    assert!(created.ends_with('Z') && created.contains('T'), "{created}");

    let (status, missing) = get_json(
        &w.daemon
            .url("/v1/invocations/act_00000000000000000000000000"),
        &["-H", &auth],
    );
    assert_eq!(
        (status, missing["error"]["code"].as_str()),
        (404, Some("INVOCATION_NOT_FOUND"))
    );
}

#[test]
fn events_carry_seq_hashes_and_sources() {
    let w = world();
    let auth = bearer();
    let (_, ev) = get_json(
        &w.daemon
            .url(&format!("/v1/invocations/{}/events", w.unknown)),
        &["-H", &auth],
    );
    let events = ev["events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ACTION_ACCEPTED",
            "PREFLIGHT_VALIDATED",
            "CONNECT_ATTEMPT",
            "DISPATCH_STARTED",
            "REQUEST_SENT",
            "FAILED"
        ]
    );
    for e in events {
        for key in [
            "seq",
            "invocation_id",
            "attempt",
            "generation",
            "ts",
            "kind",
            "source",
            "hop",
            "data",
            "prev_hash",
            "hash",
        ] {
            assert!(e.get(key).is_some(), "missing {key} in {e}");
        }
    }
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(events[5]["source"], "recovery");

    let show = w.daemon.cli(
        &["actions", "show", &w.unknown, "--json"],
        &[("POSTERN_ADMIN_TOKEN", CANARY)],
    );
    let json: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(json["events"].as_array().unwrap().len(), 6);
    assert_eq!(json["outcome"], "unknown");
    let human = w.daemon.cli(
        &["actions", "show", &w.unknown],
        &[("POSTERN_ADMIN_TOKEN", CANARY)],
    );
    assert!(
        stdout(&human).contains("BROKER_RESTARTED") && stdout(&human).contains("DISPATCH_STARTED")
    );
}

#[test]
fn results_are_fetched_never_re_executed_with_range_support() {
    let w = world();
    let auth = bearer();
    let (status, res) = get_json(
        &w.daemon
            .url(&format!("/v1/invocations/{}/result", w.committed)),
        &["-H", &auth],
    );
    assert_eq!(status, 200);
    assert_eq!(res["invocation_id"], w.committed.as_str());
    assert_eq!(res["outcome"], "committed");
    assert_eq!(res["status"], 200);
    assert_eq!(res["body_base64"], "eyJvayI6dHJ1ZX0=");
    assert_eq!(res["complete"], true);
    assert!(res["headers"].is_array());

    let url = w
        .daemon
        .url(&format!("/v1/invocations/{}/result/body", w.committed));
    let (status, body, head) = curl(&["-H", &auth, "-H", "Range: bytes=0-4", &url]);
    assert_eq!((status, body.as_str()), (206, "{\"ok\""));
    assert!(
        head.to_ascii_lowercase()
            .contains("content-range: bytes 0-4/11"),
        "{head}"
    );
    let (status, body, _) = curl(&["-H", &auth, "-H", "Range: bytes=5-", &url]);
    assert_eq!((status, body.as_str()), (206, ":true}"));
    let (status, _, _) = curl(&["-H", &auth, "-H", "Range: bytes=50-", &url]);
    assert_eq!(status, 416);

    let (status, none) = get_json(
        &w.daemon
            .url(&format!("/v1/invocations/{}/result", w.unknown)),
        &["-H", &auth],
    );
    assert_eq!(
        (status, none["error"]["code"].as_str()),
        (404, Some("RESULT_NOT_STORED"))
    );
    let cli = w.daemon.cli(
        &["result", &w.committed],
        &[("POSTERN_ADMIN_TOKEN", CANARY)],
    );
    assert!(cli.status.success());
    assert!(stdout(&cli).contains("{\"ok\":true}"), "{}", stdout(&cli));
    let json = w.daemon.cli(
        &["result", &w.committed, "--json"],
        &[("POSTERN_ADMIN_TOKEN", CANARY)],
    );
    assert!(stdout(&json).contains("eyJvayI6dHJ1ZX0="));
}

#[test]
fn an_operator_reconciles_an_unknown_once() {
    let w = world();
    let envs = [("POSTERN_ADMIN_TOKEN", CANARY)];
    let bad = w.daemon.cli(
        &[
            "reconcile",
            &w.unknown,
            "--outcome",
            "committed",
            "--note",
            " ",
        ],
        &envs,
    );
    assert_eq!(bad.status.code(), Some(1));
    let out = w.daemon.cli(
        &[
            "reconcile",
            &w.unknown,
            "--outcome",
            "committed",
            "--note",
            "ledger shows the charge",
        ],
        &envs,
    );
    assert!(out.status.success(), "{out:?}");
    let auth = bearer();
    let (_, r) = get_json(
        &w.daemon.url(&format!("/v1/invocations/{}", w.unknown)),
        &["-H", &auth],
    );
    assert_eq!(r["outcome"], "committed");
    assert_eq!(r["retry"], "never");
    assert_eq!(r["evidence"]["reconciled"]["source"], "operator_attested");
    let (_, ev) = get_json(
        &w.daemon
            .url(&format!("/v1/invocations/{}/events", w.unknown)),
        &["-H", &auth],
    );
    let last = ev["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["kind"].as_str(), last["source"].as_str()),
        (Some("RECONCILED"), Some("operator_attested"))
    );
    assert_eq!(last["data"]["note"], "ledger shows the charge");

    let again = w.daemon.cli(
        &[
            "reconcile",
            &w.unknown,
            "--outcome",
            "rejected",
            "--note",
            "second thoughts",
        ],
        &envs,
    );
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("RECONCILE_REFUSED"));
    let committed = w.daemon.cli(
        &[
            "reconcile",
            &w.committed,
            "--outcome",
            "rejected",
            "--note",
            "x",
        ],
        &envs,
    );
    assert!(stderr(&committed).contains("RECONCILE_REFUSED"));
    assert!(w.daemon.cli(&["audit", "verify"], &envs).status.success());
}

#[test]
fn metrics_keep_phase_and_outcome_apart_and_no_secret_leaks() {
    let w = world();
    let auth = bearer();
    let (status, text, _) = curl(&["-H", &auth, &w.daemon.url("/metrics")]);
    assert_eq!(status, 200);
    let line = text
        .lines()
        .find(|l| l.starts_with("postern_invocations_total{"))
        .unwrap_or_else(|| panic!("no invocation counter in {text}"));
    assert!(
        line.contains("phase=\"remote_execution\"") && line.contains("outcome=\"unknown\""),
        "{line}"
    );
    assert!(line.contains("code=\"BROKER_RESTARTED\""), "{line}");
    // Issue 40 (low 5): by route too.
    assert!(line.contains("route=\""), "{line}");
    assert!(text.contains("postern_journal_events_total"));
    let mut seen = text.clone();
    for args in [vec!["actions", "list"], vec!["actions", "show", &w.unknown]] {
        let out = w.daemon.cli(&args, &[("POSTERN_ADMIN_TOKEN", CANARY)]);
        seen.push_str(&stdout(&out));
        seen.push_str(&stderr(&out));
    }
    let (_, list, _) = curl(&["-H", &auth, &w.daemon.url("/v1/invocations")]);
    seen.push_str(&list);
    seen.push_str(&w.daemon.stdout.join("\n"));
    seen.push_str(&w.daemon.stderr());
    assert!(!seen.contains(CANARY), "the admin token leaked");
}

#[test]
fn unknown_endpoints_and_bodies_get_coded_errors() {
    let w = world();
    let auth = bearer();
    let (status, body) = get_json(&w.daemon.url("/v1/nothing"), &["-H", &auth]);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("NOT_FOUND"))
    );
    let url = w
        .daemon
        .url(&format!("/v1/invocations/{}/reconcile", w.unknown));
    let (status, body, _) = curl(&["-H", &auth, "-X", "POST", "--data", "not json", &url]);
    assert_eq!(status, 400, "{body}");
    let (status, body, _) = curl(&[
        "-H",
        &auth,
        "-X",
        "POST",
        "--data",
        r#"{"outcome":"unknown","note":"x"}"#,
        &url,
    ]);
    assert_eq!(status, 400, "{body}");
}
