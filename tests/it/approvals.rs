//! `approval = "required"`: the request waits before any connection for `postern approve`
//! or `deny`, or until `approval_timeout`; nothing reaches the origin before an approval.

use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use crate::origins::{self, Origin};
use crate::support::{Daemon, Home, curl, get_json, secret_set, stdout};

const VAULT_KEY: &str = "vault-passphrase-for-approvals";

fn config(port: u16, timeout: &str) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[credentials]]\nid = \"pay\"\nsecret = \"pay-key\"\ninject = {{ header = \"X-Api-Key\" }}\n\
         [[routes]]\nid = \"payments\"\ncredential = \"pay\"\napproval = \"required\"\napproval_timeout = \"{timeout}\"\n\
         match = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n"
    )
}

pub struct Setup {
    pub home: Home,
    pub daemon: Daemon,
    pub origin: Origin,
}

pub fn setup(timeout: &str) -> Setup {
    let origin = origins::responds(
        "201 Created",
        &["content-type: application/json"],
        "{\"paid\":1}",
    );
    let home = Home::new();
    assert!(
        secret_set(&home, "pay-key", "pay-key-v1", Some(VAULT_KEY))
            .status
            .success()
    );
    let daemon = Daemon::start_with(
        &home,
        Some(&config(origin.port(), timeout)),
        &[("POSTERN_VAULT_KEY", VAULT_KEY)],
    );
    Setup {
        home,
        daemon,
        origin,
    }
}

impl Setup {
    /// A POST that waits in postern; joined for its (status, body, head).
    fn send(&self) -> JoinHandle<(u16, String, String)> {
        self.send_with(&["--data", "amount=5"])
    }

    /// A POST with these curl body arguments.
    pub fn send_with(&self, body: &[&str]) -> JoinHandle<(u16, String, String)> {
        let proxy = self.daemon.proxy.clone();
        let url = format!("http://origin.test:{}/pay", self.origin.port());
        let mut args: Vec<String> = vec!["-x".into(), proxy];
        args.extend(body.iter().map(|a| a.to_string()));
        args.push(url);
        std::thread::spawn(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            curl(&args)
        })
    }

    /// The one held request, once postern lists it.
    pub fn held(&self) -> Value {
        for _ in 0..200 {
            let (_, list) = get_json(&self.daemon.url("/v1/approvals"), &[]);
            if let Some(first) = list["approvals"].as_array().and_then(|a| a.first()) {
                return first.clone();
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("no request was held for approval");
    }

    fn held_id(&self) -> String {
        let held = self.held();
        held["invocation_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// `postern approve|deny ID`, which must succeed; its stdout.
    fn answer(&self, verb: &str, id: &str) -> String {
        let out = self.daemon.cli(&[verb, id], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{verb}: {err}");
        stdout(&out)
    }

    pub fn kinds(&self, id: &str) -> Vec<(String, String)> {
        let (_, ev) = get_json(
            &self.daemon.url(&format!("/v1/invocations/{id}/events")),
            &[],
        );
        ev["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|e| {
                let field = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                (field("kind"), field("source"))
            })
            .collect()
    }
}

/// A listed request's invocation id.
pub fn id_of(held: &Value) -> String {
    held["invocation_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The envelope postern answered with, once the status is the expected one.
fn envelope(reply: (u16, String, String), status: u16, code: &str) -> Value {
    let (got, body, head) = reply;
    assert_eq!(got, status, "{head}\n{body}");
    let env: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(env["error"]["code"], code, "{body}");
    assert_eq!(env["error"]["outcome"], "not_attempted", "{body}");
    env
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[test]
fn an_approved_request_dispatches_only_after_the_approval() {
    let s = setup("20s");
    let pending = s.send();
    let held = s.held();
    let id = id_of(&held);
    assert_eq!(
        (held["agent"].as_str(), held["route"].as_str()),
        (Some("anonymous"), Some("payments"))
    );
    for field in ["fingerprint", "requested_at", "expires_at"] {
        assert!(
            held[field].as_str().is_some_and(|v| !v.is_empty()),
            "{field}: {held}"
        );
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.origin.hits(), 0, "nothing reaches the origin while held");
    assert!(
        !held.to_string().contains("pay-key-v1"),
        "no secret in the listing"
    );
    let listed = s.daemon.cli(&["approvals"], &[]);
    assert!(stdout(&listed).contains(&id), "{}", stdout(&listed));
    let said = s.answer("approve", &id);
    assert!(!said.contains("pay-key-v1"), "{said}");
    let (status, body, head) = pending.join().unwrap_or_default();
    assert_eq!((status, body.as_str()), (201, "{\"paid\":1}"), "{head}");
    assert_eq!(header(&head, "postern-invocation"), Some(id.as_str()));
    assert_eq!(s.origin.hits(), 1);
    assert!(
        s.origin.last_request().contains("pay-key-v1"),
        "the credential is injected"
    );
    let kinds = s.kinds(&id);
    let at = |k: &str| {
        kinds
            .iter()
            .position(|(kind, _)| kind == k)
            .unwrap_or_else(|| panic!("no {k}: {kinds:?}"))
    };
    assert!(
        at("APPROVAL_REQUESTED") < at("APPROVAL_GRANTED"),
        "{kinds:?}"
    );
    assert!(at("APPROVAL_GRANTED") < at("DISPATCH_STARTED"), "{kinds:?}");
    assert_eq!(kinds[at("APPROVAL_GRANTED")].1, "operator_attested");
    let again = s.daemon.cli(&["approve", &id], &[]);
    assert!(
        !again.status.success(),
        "an answered request is no longer pending"
    );
}

#[test]
fn a_denied_request_never_reaches_the_origin() {
    let s = setup("20s");
    // Headers past the shown ones are counted where the operator decides, never dropped
    // silently: an override header behind 70 others must not slip by.
    let mut args: Vec<String> = (0..70).map(|n| format!("X-Pad-{n}: x")).collect();
    args.push("X-HTTP-Method-Override: DELETE".into());
    let mut curl_args: Vec<&str> = args.iter().flat_map(|h| ["-H", h.as_str()]).collect();
    curl_args.extend(["--data", "amount=5"]);
    let pending = s.send_with(&curl_args);
    let held = s.held();
    assert!(held["headers_not_shown"].as_u64() >= Some(7), "{held}");
    let listed = stdout(&s.daemon.cli(&["approvals"], &[]));
    assert!(listed.contains("more headers not shown"), "{listed}");
    let id = id_of(&held);
    let said = s.answer("deny", &id);
    assert!(said.contains("APPROVAL_DENIED"), "{said}");
    let reply = pending.join().unwrap_or_default();
    let head = reply.2.clone();
    let env = envelope(reply, 403, "APPROVAL_DENIED");
    assert_eq!(env["error"]["retry"], "never");
    assert!(
        header(&head, "proxy-status").is_some_and(|v| v.contains("error=http_request_denied")),
        "{head}"
    );
    assert_eq!(s.origin.hits(), 0);
}

#[test]
fn an_unanswered_request_times_out_and_cannot_be_approved_later() {
    let s = setup("400ms");
    let env = envelope(s.send().join().unwrap_or_default(), 403, "APPROVAL_TIMEOUT");
    assert_eq!(env["error"]["retry"], "after_correction");
    assert_eq!(s.origin.hits(), 0);
    let (_, list) = get_json(&s.daemon.url("/v1/approvals"), &[]);
    assert_eq!(list["approvals"], serde_json::json!([]));
    let id = env["invocation_id"].as_str().unwrap_or_default();
    let late = s.daemon.cli(&["approve", id], &[]);
    assert!(!late.status.success());
}

#[test]
fn a_secret_rotated_while_held_is_a_changed_fingerprint() {
    let s = setup("20s");
    let pending = s.send();
    let id = s.held_id();
    let rotated = secret_set(&s.home, "pay-key", "pay-key-v2", Some(VAULT_KEY));
    assert!(rotated.status.success());
    s.answer("approve", &id);
    envelope(
        pending.join().unwrap_or_default(),
        409,
        "FINGERPRINT_CHANGED",
    );
    assert_eq!(
        s.origin.hits(),
        0,
        "what was approved is not what would be sent"
    );
}

#[test]
fn a_request_held_across_a_crash_is_settled_as_never_dispatched() {
    let s = setup("20s");
    let pending = s.send();
    let id = s.held_id();
    let Setup {
        home,
        daemon,
        origin,
    } = s;
    drop(daemon); // SIGKILL while held
    let _ = pending.join();
    let again = Daemon::start_with(
        &home,
        Some(&config(origin.port(), "20s")),
        &[("POSTERN_VAULT_KEY", VAULT_KEY)],
    );
    let (_, r) = get_json(&again.url(&format!("/v1/invocations/{id}")), &[]);
    assert_eq!(r["code"], "BROKER_RESTARTED_BEFORE_DISPATCH", "{r}");
    assert_eq!(r["outcome"], "not_attempted", "{r}");
    assert_eq!(r["phase"], "credential_injection", "held for approval: {r}");
    let (_, list) = get_json(&again.url("/v1/approvals"), &[]);
    assert_eq!(list["approvals"], serde_json::json!([]));
    assert_eq!(origin.hits(), 0);
}

/// A caller that gave up while held: the listing says so, so an abandoned duplicate is not
/// approved blindly (approving still dispatches: the result is stored and fetchable).
#[test]
fn a_held_request_whose_caller_left_is_listed_as_such() {
    let s = setup("30s");
    let url = format!("http://origin.test:{}/pay", s.origin.port());
    let (status, _, _) = curl(&["-m", "1", "-x", &s.daemon.proxy, "--data", "amount=5", &url]);
    assert_eq!(status, 0, "curl gave up");
    let mut listed = Value::Null;
    for _ in 0..200 {
        let (_, list) = get_json(&s.daemon.url("/v1/approvals"), &[]);
        listed = list["approvals"][0].clone();
        if listed["caller_gone"] == true {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(listed["caller_gone"], true, "{listed}");
    let out = s.daemon.cli(&["approvals"], &[]);
    assert!(stdout(&out).contains("CALLER GONE"), "{}", stdout(&out));
}

/// Issue 40 (low 1): a request held on a route that a reload then removed was dispatched
/// when approved. It is listed as stale, and approving it answers `ROUTE_DENIED`.
#[test]
fn a_request_whose_route_a_reload_removed_is_stale_and_not_sent_when_approved() {
    let s = setup("20s");
    let pending = s.send();
    let id = s.held_id();
    let without = config(s.origin.port(), "20s").replace(
        "[[routes]]\nid = \"payments\"",
        "[[routes]]\nid = \"other\"",
    );
    std::fs::write(s.home.dir.path().join("postern.toml"), without).unwrap();
    let out = s.daemon.cli(&["reload"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(s.held()["stale"], true, "{}", s.held());
    let listed = stdout(&s.daemon.cli(&["approvals"], &[]));
    assert!(listed.contains("STALE"), "{listed}");
    s.answer("approve", &id);
    envelope(pending.join().unwrap_or_default(), 403, "ROUTE_DENIED");
    assert_eq!(
        s.origin.hits(),
        0,
        "nothing was sent on a route that is gone"
    );
}
