//! Secret sources (SPEC §3.8): a credential's secret from a file (read at each use: a
//! rewritten file counts from the next request, no reload), an environment variable, or a
//! command (no shell; kept for its ttl; a failure is CREDENTIAL_MISSING with the exit status,
//! never its output). No vault key is set in these tests: none of them needs the vault.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::origins::{self, Origin};
use crate::ssh::{Front, TOKEN, envelope};
use crate::support::{Daemon, Home, TEST_CONFIG, curl, get_json, stderr, stdout, stored_text};

fn credential(id: &str, secret: &str) -> String {
    format!(
        "[[credentials]]\nid = \"{id}\"\nsecret = {secret}\n\
         inject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n"
    )
}

/// A plain-HTTP route for `host` (resolved to `origin`) injecting `credential`.
fn route(host: &str, credential: &str, origin: &Origin) -> String {
    format!(
        "[[routes]]\nid = \"{host}\"\ncredential = \"{credential}\"\n\
         match = {{ scheme = \"http\", host = \"{host}\", port = {p} }}\nresolve = \"127.0.0.1:{p}\"\n",
        p = origin.port()
    )
}

fn get(daemon: &Daemon, origin: &Origin, host: &str) -> (u16, Value) {
    let url = format!("http://{host}:{}/x", origin.port());
    let (status, body, _) = curl(&["-x", &daemon.proxy, &url]);
    let json = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, json)
}

/// The `Authorization` value the origin last received.
fn injected(origin: &Origin) -> String {
    origin
        .last_request()
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default()
}

fn newest(daemon: &Daemon) -> Value {
    let (_, list) = get_json(&daemon.url("/v1/invocations?limit=1"), &[]);
    list["invocations"][0].clone()
}

fn version(daemon: &Daemon) -> String {
    let r = newest(daemon);
    r["evidence"]["credential"]["version"]
        .as_str()
        .unwrap_or_else(|| panic!("a string version: {r}"))
        .to_owned()
}

fn is_digest_version(v: &str, kind: &str) -> bool {
    v.strip_prefix(kind)
        .and_then(|h| h.strip_prefix(':'))
        .is_some_and(|h| h.len() == 12 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn ok_origin() -> Origin {
    origins::responds("200 OK", &[], "ok")
}

#[test]
fn a_rewritten_secret_file_is_injected_from_the_next_request_without_a_reload() {
    let (home, origin) = (Home::new(), ok_origin());
    let secrets = home.dir.path().join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    let file = secrets.join("gh");
    std::fs::write(&file, "file-value-one-4e1b\n").unwrap();
    // Relative: resolved against the config file's directory.
    let config = format!(
        "{TEST_CONFIG}{}{}",
        credential("gh", "\"file:secrets/gh\""),
        route("origin.test", "gh", &origin)
    );
    let daemon = Daemon::start(&home, Some(&config));

    let (status, body) = get(&daemon, &origin, "origin.test");
    assert_eq!(status, 200, "{body}");
    assert_eq!(injected(&origin), "Bearer file-value-one-4e1b");
    let first = version(&daemon);
    assert!(is_digest_version(&first, "file"), "{first}");

    // As Kubernetes updates a mounted secret: a new file renamed into place.
    let tmp = secrets.join(".gh.tmp");
    std::fs::write(&tmp, "file-value-two-9c0d\n").unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    let (status, body) = get(&daemon, &origin, "origin.test");
    assert_eq!(status, 200, "{body}");
    assert_eq!(injected(&origin), "Bearer file-value-two-9c0d");
    let second = version(&daemon);
    assert!(is_digest_version(&second, "file"), "{second}");
    assert_ne!(first, second, "a new value is a new version");

    std::fs::remove_file(&file).unwrap();
    let hits = origin.hits();
    let (status, body) = get(&daemon, &origin, "origin.test");
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "CREDENTIAL_MISSING", "{body}");
    assert_eq!(
        body["evidence"]["secret_source"],
        json!({"kind": "file", "failure": "not_found"}),
        "{body}"
    );
    assert!(
        !body.to_string().contains("secrets/gh"),
        "the path stays internal: {body}"
    );
    assert_eq!(origin.hits(), hits, "nothing was sent");
    let events = events_of(&daemon, body["invocation_id"].as_str().unwrap_or_default());
    assert!(
        events.contains("secrets/gh") && events.contains("does not exist"),
        "{events}"
    );
}

#[test]
fn a_missing_secret_file_is_named_by_health_reload_and_secret_list() {
    let (home, origin) = (Home::new(), ok_origin());
    let present = home.dir.path().join("present");
    std::fs::write(&present, "present-value-22aa").unwrap();
    let absent = home.dir.path().join("absent");
    let config = format!(
        "{TEST_CONFIG}{}{}",
        credential("ok", &format!("\"file:{}\"", present.display())),
        route("origin.test", "ok", &origin)
    );
    let daemon = Daemon::start(&home, Some(&config));
    let (_, health) = get_json(&daemon.url("/healthz"), &[]);
    assert_eq!(
        (health["status"].as_str(), health["missing_secrets"].clone()),
        (Some("ok"), json!([])),
        "{health}"
    );

    let edited = format!(
        "{config}{}",
        credential("gone", &format!("\"file:{}\"", absent.display()))
    );
    let config_path = home.config(&edited);
    let out = daemon.cli(&["reload", "--json"], &[]);
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(answer["reloaded"], true, "{answer} {}", stderr(&out));
    let warnings = answer["warnings"].to_string();
    assert!(
        warnings.contains("credential gone") && warnings.contains(&absent.display().to_string()),
        "{answer}"
    );
    let (_, health) = get_json(&daemon.url("/healthz"), &[]);
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(
        health["missing_secrets"],
        json!([format!("file:{}", absent.display())]),
        "{health}"
    );

    let config_arg = config_path.display().to_string();
    let list = home.cli(&["secret", "list", "--config", &config_arg], &[]);
    let listed = stdout(&list);
    assert!(list.status.success(), "{listed} {}", stderr(&list));
    let line = |id: &str| {
        listed
            .lines()
            .find(|l| l.ends_with(&format!("\tcredential {id}")))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        line("gone").starts_with(&format!("file:{}\tmissing: ", absent.display())),
        "{listed}"
    );
    let ok = line("ok");
    let listed_version = ok.split('\t').nth(1).unwrap_or_default();
    let (status, _) = get(&daemon, &origin, "origin.test");
    assert_eq!(status, 200);
    assert_eq!(
        listed_version,
        format!("version {}", version(&daemon)),
        "the CLI and the daemon share the digest key"
    );
    assert!(!listed.contains("present-value-22aa"), "{listed}");
}

#[test]
fn an_env_secret_is_read_from_the_daemons_environment() {
    let (home, origin) = (Home::new(), ok_origin());
    let config = format!(
        "{TEST_CONFIG}{}{}{}{}",
        credential("set", "\"env:POSTERN_IT_SECRET\""),
        credential("unset", "\"env:POSTERN_IT_UNSET\""),
        route("set.test", "set", &origin),
        route("unset.test", "unset", &origin)
    );
    let daemon = Daemon::start_with(
        &home,
        Some(&config),
        &[("POSTERN_IT_SECRET", "env-value-5d8e")],
    );
    let (status, body) = get(&daemon, &origin, "set.test");
    assert_eq!(status, 200, "{body}");
    assert_eq!(injected(&origin), "Bearer env-value-5d8e");
    assert!(is_digest_version(&version(&daemon), "env"));

    let (status, body) = get(&daemon, &origin, "unset.test");
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "CREDENTIAL_MISSING", "{body}");
    assert_eq!(
        body["evidence"]["secret_source"],
        json!({"kind": "env", "failure": "unset"})
    );
    let (_, health) = get_json(&daemon.url("/healthz"), &[]);
    assert_eq!(
        health["missing_secrets"],
        json!(["env:POSTERN_IT_UNSET"]),
        "{health}"
    );
    assert!(
        daemon.stderr().contains("credential unset")
            && daemon.stderr().contains("POSTERN_IT_UNSET"),
        "warned at start: {}",
        daemon.stderr()
    );
    assert!(
        !daemon.stderr().contains("POSTERN_VAULT_KEY is not set"),
        "no credential here uses the vault: {}",
        daemon.stderr()
    );
    assert!(!daemon.stderr().contains("env-value-5d8e"));
}

/// A shell script for `sh -c` (the test's choice: postern itself runs the argv, no shell)
/// that counts its runs in `count` and prints `value-N`.
fn counting(count: &Path) -> String {
    format!(
        "n=$(( $(cat {c} 2>/dev/null || echo 0) + 1 )); echo $n > {c}; echo cmd-value-$n",
        c = count.display()
    )
}

fn runs(count: &Path) -> u32 {
    std::fs::read_to_string(count)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_command_secret_is_kept_for_its_ttl() {
    let (home, origin) = (Home::new(), ok_origin());
    let (long, short) = (home.dir.path().join("long"), home.dir.path().join("short"));
    let command = |count: &Path, ttl: &str| {
        let argv = json!(["sh", "-c", counting(count)]);
        format!("{{ command = {argv}, ttl = \"{ttl}\" }}")
    };
    let config = format!(
        "{TEST_CONFIG}{}{}{}{}",
        credential("long", &command(&long, "5m")),
        credential("short", &command(&short, "1s")),
        route("long.test", "long", &origin),
        route("short.test", "short", &origin)
    );
    let daemon = Daemon::start(&home, Some(&config));
    let mut versions = Vec::new();
    for _ in 0..3 {
        let (status, body) = get(&daemon, &origin, "long.test");
        assert_eq!(status, 200, "{body}");
        assert_eq!(injected(&origin), "Bearer cmd-value-1");
        versions.push(version(&daemon));
    }
    assert_eq!(
        runs(&long),
        1,
        "run once (at the start's check) for three requests"
    );
    assert!(is_digest_version(&versions[0], "command"), "{versions:?}");
    assert!(versions.iter().all(|v| *v == versions[0]), "{versions:?}");

    let (status, _) = get(&daemon, &origin, "short.test");
    assert_eq!(status, 200);
    let (before, before_version) = (injected(&origin), version(&daemon));
    std::thread::sleep(Duration::from_millis(1500));
    let (status, _) = get(&daemon, &origin, "short.test");
    assert_eq!(status, 200);
    let (after, after_version) = (injected(&origin), version(&daemon));
    assert_ne!(before, after, "the ttl passed: run again");
    assert_ne!(before_version, after_version);
    assert_eq!(after, format!("Bearer cmd-value-{}", runs(&short)));
}

#[test]
fn a_failing_command_is_credential_missing_with_its_status_and_never_its_output() {
    const CANARY: &str = "cmd-canary-3f9a71";
    let (home, origin) = (Home::new(), ok_origin());
    let script = format!("echo {CANARY}-out; echo {CANARY}-err >&2; exit 3");
    let config = format!(
        "{TEST_CONFIG}{}{}",
        credential(
            "op",
            &format!("{{ command = {} }}", json!(["sh", "-c", script]))
        ),
        route("origin.test", "op", &origin)
    );
    let mut daemon = Daemon::start(&home, Some(&config));
    let url = format!("http://origin.test:{}/x", origin.port());
    let (status, text, head) = curl(&["-x", &daemon.proxy, &url]);
    assert_eq!(status, 500, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"]["code"], "CREDENTIAL_MISSING", "{body}");
    assert_eq!(body["error"]["phase"], "credential_injection");
    assert_eq!(
        body["evidence"]["secret_source"],
        json!({"kind": "command", "failure": "exit_status", "exit_status": 3}),
        "{body}"
    );
    assert_eq!(origin.hits(), 0, "nothing was sent");
    let id = body["invocation_id"].as_str().unwrap().to_owned();
    let events = events_of(&daemon, &id);
    assert!(events.contains("exited with status 3"), "{events}");

    let mut seen = format!("{text}\n{head}\n{events}\n");
    for path in [
        format!("/v1/invocations/{id}"),
        "/v1/invocations".into(),
        "/metrics".into(),
        "/healthz".into(),
    ] {
        seen += &curl(&[&daemon.url(&path)]).1;
    }
    let (_, health) = get_json(&daemon.url("/healthz"), &[]);
    assert_eq!(health["missing_secrets"], json!(["command:sh"]), "{health}");
    seen += &stdout(&daemon.cli(&["actions", "show", &id], &[]));
    seen += &daemon.stdout.join("\n");
    seen += &daemon.stdout_until("\u{0}").join("\n");
    seen += &daemon.stderr();
    seen += &stored_text(&mut daemon);
    assert!(!seen.contains(CANARY), "the command's output leaked");
}

#[test]
fn an_ssh_key_from_a_file_logs_in() {
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("deploy.pem");
    let from_file = format!("secret = \"file:{}\"", pem.display());
    let f = Front::start_with(
        "",
        |t| t.replace("secret = \"deploy-ssh-key\"", &from_file),
        &[],
    );

    let out = f.ssh(TOKEN, &["--", "", "echo hi"]);
    let env = envelope(&stderr(&out));
    assert_eq!(
        env["error"]["code"],
        "CREDENTIAL_MISSING",
        "{}",
        stderr(&out)
    );
    assert_eq!(env["evidence"]["secret_source"]["kind"], "file", "{env}");

    std::fs::write(&pem, &f.client_private).unwrap();
    let out = f.ssh(TOKEN, &["--", "", "echo hi"]);
    assert_eq!(stdout(&out), "hi\n", "{}", stderr(&out));
    let list = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let v = list["invocations"][0]["evidence"]["credential"]["version"].clone();
    assert!(is_digest_version(v.as_str().unwrap_or(""), "file"), "{v}");
}

fn events_of(daemon: &Daemon, id: &str) -> String {
    let (_, events) = get_json(&daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
    events.to_string()
}
