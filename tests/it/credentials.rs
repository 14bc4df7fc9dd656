//! Credential injection from the vault, the reflection guard, and canary secrets
//! that must never surface anywhere an agent or operator can read.

use serde_json::Value;

use crate::support::{Daemon, Home, curl, get_json, secret_set};
use crate::tls_origin::{TlsOrigin, echo_origin, echo_origin_for};

const VAULT_KEY: &str = "vault-passphrase-for-tests";
const CANARY: &str = "canary-7c1d9e-SECRET-value";

fn base() -> String {
    "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n".into()
}

fn route(origin: &TlsOrigin, id: &str, host: &str, extra: &str) -> String {
    format!(
        "[[routes]]\nid = \"{id}\"\nmatch = {{ host = \"{host}\", port = {} }}\nresolve = \"{}\"\nupstream_ca = \"{}\"\n{extra}\n",
        origin.addr.port(),
        origin.addr,
        origin.ca_file.display()
    )
}

const CREDENTIALS: &str = r#"
[[credentials]]
id = "gh"
secret = "github-token"
inject = { header = "Authorization", format = "Bearer {secret}" }
[[credentials]]
id = "read"
secret = "read-key"
inject = { header = "X-Api-Key" }
[[credentials]]
id = "write"
secret = "write-key"
inject = { basic = { user = "deployer" } }
[[credentials]]
id = "ghost"
secret = "never-set"
inject = { query = "api_key" }
[[credentials]]
id = "maps"
secret = "maps-key"
inject = { query = "key" }
placeholder = "sdk-placeholder-maps"
placeholder_env = ["MAPS_API_KEY"]
"#;

struct Setup {
    home: Home,
    daemon: Daemon,
    origin: TlsOrigin,
}

fn setup(extra_route: &str, key: Option<&str>) -> Setup {
    let origin = echo_origin();
    let home = Home::new();
    if key.is_some() {
        for (name, value) in [
            ("github-token", CANARY),
            ("read-key", "read-key-value-1"),
            ("write-key", "write-key-value-1"),
            ("maps-key", "maps-key-value-1"),
        ] {
            assert!(secret_set(&home, name, value, key).status.success());
        }
    }
    let config = format!(
        "{}{CREDENTIALS}{}",
        base(),
        route(&origin, "api", "origin.test", extra_route)
    );
    let envs: Vec<(&str, &str)> = key
        .map(|k| vec![("POSTERN_VAULT_KEY", k)])
        .unwrap_or_default();
    let daemon = Daemon::start_with(&home, Some(&config), &envs);
    Setup {
        home,
        daemon,
        origin,
    }
}

impl Setup {
    fn get(&self, path: &str, extra: &[&str]) -> (u16, String, String) {
        let ca = self.home.root().join("certs/ca.pem").display().to_string();
        let url = format!("https://origin.test:{}{path}", self.origin.addr.port());
        let mut args = vec!["--cacert", ca.as_str(), "-x", self.daemon.proxy.as_str()];
        args.extend_from_slice(extra);
        args.push(&url);
        curl(&args)
    }
}

fn newest(daemon: &Daemon) -> Value {
    let (_, list) = get_json(&daemon.url("/v1/invocations?limit=1"), &[]);
    list["invocations"][0].clone()
}

#[test]
fn the_credential_is_injected_and_its_echo_redacted() {
    let s = setup("credential = \"gh\"", Some(VAULT_KEY));
    let (status, body, head) = s.get("/whoami", &[]);
    assert_eq!(status, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        echo["authorization"], "Bearer [postern:redacted]",
        "the origin got the secret; the agent sees it redacted"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("x-echo-authorization: bearer [postern:redacted]"),
        "{head}"
    );
    let r = newest(&s.daemon);
    assert_eq!(
        r["evidence"]["credential"],
        serde_json::json!({"id": "gh", "version": 1, "mode": "header"})
    );
    assert_eq!(r["evidence"]["redactions"], 2);
    let id = r["invocation_id"].as_str().unwrap_or_default();
    let (_, res) = get_json(&s.daemon.url(&format!("/v1/invocations/{id}/result")), &[]);
    let length = res["headers"].as_array().and_then(|h| {
        h.iter()
            .find(|kv| kv[0] == "content-length")
            .and_then(|kv| kv[1].as_str())
            .and_then(|v| v.parse::<usize>().ok())
    });
    assert_eq!(
        length,
        Some(body.len()),
        "the stored head matches the redacted body: {res}"
    );
    assert_eq!(res["bytes"], body.len());
}

#[test]
fn a_canary_secret_never_surfaces_anywhere() {
    let s = setup("credential = \"gh\"", Some(VAULT_KEY));
    let (_, body, head) = s.get("/echo", &["-X", "POST", "--data", "hello"]);
    let mut seen = format!("{body}\n{head}\n");
    let r = newest(&s.daemon);
    let id = r["invocation_id"].as_str().unwrap().to_owned();
    for path in [
        "/v1/invocations",
        &format!("/v1/invocations/{id}"),
        &format!("/v1/invocations/{id}/events"),
        &format!("/v1/invocations/{id}/result"),
        "/metrics",
        "/v1/audit/verify",
    ] {
        let (_, text, _) = curl(&[&s.daemon.url(path)]);
        seen.push_str(&text);
    }
    let (_, raw, _) = curl(&[&s.daemon.url(&format!("/v1/invocations/{id}/result/body"))]);
    seen.push_str(&raw);
    for args in [
        vec!["actions", "list"],
        vec!["actions", "show", &id],
        vec!["actions", "show", &id, "--json"],
        vec!["result", &id],
    ] {
        let out = s.daemon.cli(&args, &[]);
        seen.push_str(&String::from_utf8_lossy(&out.stdout));
        seen.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    let list = s
        .home
        .cli(&["secret", "list"], &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    let listed = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(listed.contains("github-token\tversion 1"), "{listed}");
    seen.push_str(&listed);
    seen.push_str(&s.daemon.stdout.join("\n"));
    seen.push_str(&s.daemon.stderr());
    seen.push_str(&std::fs::read_to_string(s.home.root().join("vault.json")).unwrap());
    assert!(!seen.contains(CANARY), "the canary leaked");
    assert!(!seen.contains(VAULT_KEY), "the vault key leaked");
    use base64::Engine;
    assert!(!seen.contains(&base64::engine::general_purpose::STANDARD.encode(CANARY)));
}

#[test]
fn an_agent_may_not_supply_the_injected_header() {
    let s = setup("credential = \"gh\"", Some(VAULT_KEY));
    let (status, body, head) = s.get("/x", &["-H", "Authorization: Bearer mine"]);
    assert_eq!(status, 403, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (e["error"]["code"].as_str(), e["error"]["field"].as_str()),
        (Some("FORBIDDEN_HEADER"), Some("headers.authorization"))
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("error=http_request_denied")
    );
    let r = newest(&s.daemon);
    assert_eq!(r["code"], "FORBIDDEN_HEADER", "{r}");
    assert!(r["route"].is_string(), "the route it matched: {r}");
}

#[test]
fn the_agent_picks_from_a_credential_list_and_unknown_names_are_not_echoed() {
    let s = setup("credentials = [\"read\", \"write\"]", Some(VAULT_KEY));
    let (status, body, _) = s.get("/x", &["-H", "Postern-Credential: write"]);
    assert_eq!(status, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert!(
        echo["postern-credential"].is_null(),
        "Postern-Credential is stripped before forwarding"
    );
    assert_eq!(echo["authorization"], "Basic [postern:redacted]");
    let (_, body, _) = s.get("/x", &[]);
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        echo["x-api-key"], "[postern:redacted]",
        "the first offered credential by default"
    );
    let (status, body, _) = s.get("/x", &["-H", "Postern-Credential: gh-admin-please"]);
    assert_eq!(status, 400);
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["code"], "UNKNOWN_CREDENTIAL");
    assert!(!body.contains("gh-admin-please"));
}

/// Two choices are no choice: the first must not be used silently (an agent could hide one).
#[test]
fn two_postern_credential_headers_are_malformed() {
    let s = setup("credentials = [\"read\", \"write\"]", Some(VAULT_KEY));
    for pair in [["read", "write"], ["write", "write"]] {
        let (a, b) = (
            format!("Postern-Credential: {}", pair[0]),
            format!("Postern-Credential: {}", pair[1]),
        );
        let (status, body, _) = s.get("/x", &["-H", &a, "-H", &b]);
        assert_eq!(status, 400, "{pair:?}: {body}");
        let e: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(
            (e["error"]["code"].as_str(), e["error"]["field"].as_str()),
            (
                Some("MALFORMED_REQUEST"),
                Some("headers.postern-credential")
            ),
            "{body}"
        );
        assert_eq!(e["error"]["outcome"], "not_attempted", "{body}");
    }
}

#[test]
fn a_missing_secret_and_a_locked_vault_fail_before_connecting() {
    let s = setup("credential = \"ghost\"", Some(VAULT_KEY));
    let (status, body, head) = s.get("/x", &[]);
    assert_eq!(status, 500, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (e["error"]["code"].as_str(), e["error"]["phase"].as_str()),
        (Some("CREDENTIAL_MISSING"), Some("credential_injection"))
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("error=proxy_configuration_error")
    );
    let locked = setup("credential = \"gh\"", None);
    let (status, body, head) = locked.get("/x", &[]);
    assert_eq!(status, 503, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (e["error"]["code"].as_str(), e["error"]["outcome"].as_str()),
        (Some("VAULT_LOCKED"), Some("not_attempted"))
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("error=proxy_internal_error")
    );
}

/// A secret with a line break cannot go into a header: refused at preflight with the
/// injection code (the operator's diagnostic says why), never sent and never a bad target.
#[test]
fn a_secret_a_header_cannot_carry_is_refused_at_injection() {
    let s = setup("credential = \"read\"", Some(VAULT_KEY));
    let set = secret_set(
        &s.home,
        "read-key",
        "line-one\r\nX-Injected: yes",
        Some(VAULT_KEY),
    );
    assert!(set.status.success());
    let (_, body, _) = s.get("/x", &[]);
    let e: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert_eq!(e["error"]["code"], "INJECTION_MODE_UNSUPPORTED", "{body}");
    assert_eq!(e["error"]["phase"], "credential_injection", "{body}");
    let id = e["invocation_id"].as_str().unwrap_or_default().to_owned();
    let out = s.daemon.cli(&["actions", "show", &id, "--json"], &[]);
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(shown.contains("cannot carry"), "{shown}");
    assert!(!shown.contains("X-Injected"), "{shown}");
}

#[test]
fn a_rotated_secret_is_used_without_a_restart() {
    let s = setup("credential = \"read\"", Some(VAULT_KEY));
    s.get("/x", &[]);
    assert_eq!(newest(&s.daemon)["evidence"]["credential"]["version"], 1);
    assert!(
        secret_set(&s.home, "read-key", "read-key-value-2", Some(VAULT_KEY))
            .status
            .success()
    );
    s.get("/x", &[]);
    assert_eq!(newest(&s.daemon)["evidence"]["credential"]["version"], 2);
}

#[test]
fn a_followed_redirect_never_carries_the_first_routes_credential() {
    let other = echo_origin_for("other.test");
    let first = echo_origin();
    let home = Home::new();
    assert!(
        secret_set(&home, "github-token", CANARY, Some(VAULT_KEY))
            .status
            .success()
    );
    let config = format!(
        "{}{CREDENTIALS}{}{}",
        base(),
        route(&first, "api", "origin.test", "credential = \"gh\""),
        route(&other, "plain", "other.test", "")
    );
    let daemon = Daemon::start_with(&home, Some(&config), &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    let ca = home.root().join("certs/ca.pem").display().to_string();
    let to = format!("https://other.test:{}/landing", other.addr.port());
    let url = format!(
        "https://origin.test:{}/start?redirect={to}",
        first.addr.port()
    );
    let (status, body, _) = curl(&["-L", "--cacert", &ca, "-x", &daemon.proxy, &url]);
    assert_eq!(status, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["path"], "/landing");
    assert!(
        echo["authorization"].is_null(),
        "the second origin got a credential: {echo}"
    );
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    let routes: Vec<&str> = list["invocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["route"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        routes,
        ["plain", "api"],
        "two invocations, each on its own route"
    );
}

#[test]
fn secret_commands_need_the_key_and_show_names_only() {
    let home = Home::new();
    let out = secret_set(&home, "x", "value-xyz", None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("locked"));
    assert!(
        secret_set(&home, "x", "value-xyz", Some(VAULT_KEY))
            .status
            .success()
    );
    let wrong = secret_set(&home, "x", "value-2", Some("wrong-key"));
    assert_eq!(wrong.status.code(), Some(1));
    let list = home.cli(&["secret", "list"], &[]);
    assert_eq!(String::from_utf8_lossy(&list.stdout), "x\tversion 1\n");
    let rm = home.cli(&["secret", "rm", "x"], &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    assert!(rm.status.success());
    assert_eq!(
        String::from_utf8_lossy(&home.cli(&["secret", "list"], &[]).stdout),
        ""
    );
}

fn header_of(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

fn refused_field(body: &str) -> (String, String) {
    let e: Value = serde_json::from_str(body).unwrap_or_default();
    (
        e["error"]["code"].as_str().unwrap_or_default().to_owned(),
        e["error"]["field"].as_str().unwrap_or_default().to_owned(),
    )
}

#[test]
fn an_sdk_s_placeholder_key_is_replaced_by_the_injected_credential() {
    let s = setup("credential = \"gh\"", Some(VAULT_KEY));
    for sent in ["Bearer postern:gh", "postern:gh", "token postern:gh"] {
        let auth = format!("Authorization: {sent}");
        let (status, body, _) = s.get("/sdk", &["-H", &auth]);
        assert_eq!(status, 200, "{sent}: {body}");
        let echo: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            echo["authorization"], "Bearer [postern:redacted]",
            "{sent}: the origin got the secret in the route's format, not the placeholder"
        );
        let r = newest(&s.daemon);
        assert_eq!(r["evidence"]["credential_placeholder"], true, "{r}");
    }
    // Without a placeholder the evidence says nothing of one.
    let (status, _, _) = s.get("/plain", &[]);
    assert_eq!(status, 200);
    assert!(newest(&s.daemon)["evidence"]["credential_placeholder"].is_null());
}

#[test]
fn another_credential_s_placeholder_or_a_real_looking_key_is_forbidden_and_nothing_is_sent() {
    let s = setup("credentials = [\"gh\", \"read\"]", Some(VAULT_KEY));
    for (header, field) in [
        (
            "Authorization: Bearer postern:read",
            "headers.authorization",
        ),
        (
            "Authorization: Bearer sk-live-4f9a8b7c6d5e",
            "headers.authorization",
        ),
        (
            "Authorization: Bearer postern:gh-typo",
            "headers.authorization",
        ),
        // The used credential's placeholder in the other credential's place.
        ("X-Api-Key: postern:gh", "headers.x-api-key"),
    ] {
        let (status, body, head) = s.get("/sdk", &["-H", header]);
        assert_eq!(status, 403, "{header}: {body}");
        assert_eq!(
            refused_field(&body),
            ("FORBIDDEN_HEADER".into(), field.into()),
            "{header}"
        );
        assert_eq!(header_of(&head, "x-should-retry").as_deref(), Some("false"));
        let r = newest(&s.daemon);
        assert_eq!(r["evidence"]["dispatch_started"], false, "{header}: {r}");
    }
    // The other credential, picked, takes its own placeholder in its own place.
    let (status, body, _) = s.get(
        "/sdk",
        &[
            "-H",
            "Postern-Credential: read",
            "-H",
            "X-Api-Key: postern:read",
        ],
    );
    assert_eq!(status, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["x-api-key"], "[postern:redacted]");
}

#[test]
fn basic_and_query_modes_take_the_placeholder_and_elsewhere_it_is_forwarded_unchanged() {
    let s = setup("credential = \"write\"", Some(VAULT_KEY));
    let (status, body, _) = s.get("/b", &["-u", "whoever:postern:write"]);
    assert_eq!(status, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echo["authorization"], "Basic [postern:redacted]", "{echo}");
    let (status, body, _) = s.get("/b", &["-u", "postern:write:extra"]);
    assert_eq!(status, 403, "{body}");

    let s = setup("credential = \"maps\"", Some(VAULT_KEY));
    let (status, body, _) = s.get(
        "/geo?q=1&key=sdk-placeholder-maps",
        &["-H", "X-Note: sdk-placeholder-maps"],
    );
    assert_eq!(status, 200, "{body}");
    let echo: Value = serde_json::from_str(&body).unwrap();
    let path = echo["path"].as_str().unwrap_or_default();
    assert!(path.starts_with("/geo?q=1&key="), "{path}");
    assert!(!path.contains("sdk-placeholder-maps"), "replaced: {path}");
    assert_eq!(path.matches("key=").count(), 1, "{path}");
    let (status, body, _) = s.get("/geo?key=maps-real-key", &[]);
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        refused_field(&body),
        ("FORBIDDEN_HEADER".into(), "query.key".into())
    );
    // The default placeholder `postern:maps` is not this credential's: it names its own.
    let (status, _, _) = s.get("/geo?key=postern:maps", &[]);
    assert_eq!(status, 403);
}

#[test]
fn postern_env_gives_an_sdk_its_placeholder_key() {
    let s = setup("credential = \"maps\"", Some(VAULT_KEY));
    let config = s.home.dir.path().join("postern.toml");
    let out = s
        .home
        .cli(&["env", "--config", config.to_str().unwrap()], &[]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.lines()
            .any(|l| l == "export MAPS_API_KEY=sdk-placeholder-maps"),
        "{text}"
    );
    assert!(!text.contains("maps-key-value-1"));
}
