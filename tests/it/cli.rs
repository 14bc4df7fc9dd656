//! The first hour with postern (issue 11): what the CLI prints, through the built binary.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::approvals;
use crate::git::{bridge, seed};
use crate::origins::{self, Origin};
use crate::support::{
    BIN, Daemon, Home, TEST_CONFIG, curl, free_port, get_json, secret_set, stderr, stdout,
};

const VAULT_KEY: &str = "vault-passphrase-for-cli";
/// Characters a URL's userinfo cannot carry as they are.
const AGENT_TOKEN: &str = "t0k:en@/%+ #1-0123456789abcdef";

/// The test config with a fixed proxy port (`postern env` prints the configured address).
fn config_with(proxy_port: u16, extra: &str) -> String {
    let proxy = "[proxy]\nlisten = \"127.0.0.1:0\"";
    TEST_CONFIG.replace(
        proxy,
        &format!("[proxy]\nlisten = \"127.0.0.1:{proxy_port}\""),
    ) + extra
}

const AGENT: &str = "[[agents]]\nid = \"ci\"\ntoken = \"env:CLI_AGENT_TOKEN\"\n";

/// `sh -c SCRIPT` with no proxy or CA settings inherited from the test's environment.
fn fresh_sh(script: &str, envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script);
    for name in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "NODE_EXTRA_CA_CERTS",
        "POSTERN_CONFIG",
        "POSTERN_ADMIN",
    ] {
        cmd.env_remove(name);
    }
    cmd.env("GIT_TERMINAL_PROMPT", "0");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run sh")
}

#[test]
fn cli_env_with_an_agent_lets_python_and_git_work_after_eval() {
    let python = Command::new("python3")
        .args(["-c", "import requests"])
        .status();
    assert!(
        python.is_ok_and(|s| s.success()),
        "python3 with requests must be installed (tests/run installs python3-requests)"
    );
    let work = tempfile::tempdir().unwrap();
    seed(work.path());
    let origin = bridge(work.path());
    let home = Home::new();
    let route = format!(
        "{AGENT}[[routes]]\nid = \"git\"\nmatch = {{ host = \"git.test\", port = {port}, path_prefix = \"/team/\" }}\n\
         resolve = \"127.0.0.1:{port}\"\nupstream_ca = \"{ca}\"\n",
        port = origin.port,
        ca = work.path().join("ca.pem").display()
    );
    let config = config_with(free_port(), &route);
    let daemon = Daemon::start_with(&home, Some(&config), &[("CLI_AGENT_TOKEN", AGENT_TOKEN)]);
    let banner = daemon.stdout_until("postern env").join("\n");
    assert!(
        banner.contains("eval \"$(postern env --agent ci"),
        "{banner}"
    );
    let cfg = home.config(&config);
    let url = format!("https://git.test:{}/team/app.git", origin.port);
    let script = r#"set -e
eval "$("$POSTERN_BIN" env --agent ci --config "$CFG")"
python3 -c 'import requests, sys
r = requests.get(sys.argv[1] + "/info/refs?service=git-upload-pack")
print("python", r.status_code, r.headers["Postern-Outcome"])' "$URL"
git ls-remote "$URL"
"#;
    let home_dir = home.root().display().to_string();
    let cfg = cfg.display().to_string();
    let out = fresh_sh(
        script,
        &[
            ("POSTERN_BIN", BIN),
            ("POSTERN_HOME", &home_dir),
            ("CFG", &cfg),
            ("URL", &url),
            ("CLI_AGENT_TOKEN", AGENT_TOKEN),
        ],
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("python 200 outcome=committed"),
        "{text}\n{}",
        stderr(&out)
    );
    assert!(text.contains("refs/heads/main"), "{text}");
    let (_, list) = get_json(&daemon.url("/v1/invocations?agent=ci"), &[]);
    assert!(
        list["invocations"].as_array().is_some_and(|a| a.len() >= 2),
        "{list}"
    );
}

/// `postern env` run as the agent's shell would run it.
fn env_cmd(home: &Home, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut all = vec!["env"];
    all.extend_from_slice(args);
    home.cli(&all, envs)
}

fn export<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let prefix = format!("export {name}=");
    text.lines().find_map(|l| l.strip_prefix(prefix.as_str()))
}

#[test]
fn cli_env_prints_the_agent_identity_percent_encoded_and_absolute_paths() {
    let home = Home::new();
    assert!(home.cli(&["init"], &[]).status.success());
    let port = free_port();
    let cfg = home.config(&config_with(port, AGENT));
    let cfg = cfg.to_str().unwrap();
    let out = env_cmd(
        &home,
        &["--agent", "ci", "--config", cfg],
        &[("CLI_AGENT_TOKEN", AGENT_TOKEN)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let want = format!("http://ci:t0k%3Aen%40%2F%25%2B%20%231-0123456789abcdef@127.0.0.1:{port}");
    for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        assert_eq!(export(&text, name), Some(want.as_str()), "{name}: {text}");
    }
    let certs = home.root().join("certs");
    // Issue 40 (low 5): the identity `ssh-connect` and `mcp` read, and every bundle
    // variable the jail sets, too.
    assert_eq!(export(&text, "POSTERN_AGENT"), Some("ci"), "{text}");
    assert!(export(&text, "POSTERN_AGENT_TOKEN").is_some(), "{text}");
    for name in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "PIP_CERT",
        "AWS_CA_BUNDLE",
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    ] {
        let path = export(&text, name).unwrap_or_default();
        assert!(
            path.starts_with('/') && path.ends_with("/certs/bundle.pem"),
            "{name}: {text}"
        );
    }
    let node = export(&text, "NODE_EXTRA_CA_CERTS").unwrap_or_default();
    assert_eq!(
        std::path::Path::new(node),
        std::fs::canonicalize(certs.join("ca.pem")).unwrap()
    );

    // The agent's token variable unset: an error naming it, and nothing to eval.
    let unset = env_cmd(&home, &["--agent", "ci", "--config", cfg], &[]);
    assert!(!unset.status.success(), "{}", stdout(&unset));
    assert!(stdout(&unset).is_empty(), "{}", stdout(&unset));
    assert!(
        stderr(&unset).contains("CLI_AGENT_TOKEN"),
        "{}",
        stderr(&unset)
    );

    let bare = env_cmd(&home, &["--config", cfg], &[]);
    assert!(bare.status.success());
    assert!(stderr(&bare).contains("--agent ci"), "{}", stderr(&bare));

    let nobody = env_cmd(&home, &["--agent", "nobody", "--config", cfg], &[]);
    assert_eq!(nobody.status.code(), Some(1));
    assert!(stderr(&nobody).contains("nobody"), "{}", stderr(&nobody));
}

#[test]
fn cli_env_fails_naming_a_missing_state_directory() {
    let home = Home::new();
    let out = env_cmd(&home, &[], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains(&home.root().display().to_string()), "{err}");
    assert!(err.contains("postern init"), "{err}");
}

/// A vault holding `present` (key VAULT_KEY) and a credential whose secret is absent.
const VAULT_CREDENTIALS: &str = "[[credentials]]\nid = \"gh\"\nsecret = \"present\"\ninject = { header = \"X-Key\" }\n\
     [[credentials]]\nid = \"ghost\"\nsecret = \"never-set\"\ninject = { header = \"X-Key\" }\n";

fn vault_home() -> Home {
    let home = Home::new();
    let set = secret_set(&home, "present", "present-value-9d2c", Some(VAULT_KEY));
    assert!(set.status.success(), "{}", stderr(&set));
    home
}

/// Runs `cmd` and waits at most `limit` for it to exit on its own.
fn exits_within(mut cmd: Command, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().ok().flatten().is_some() {
            return child.wait_with_output().ok();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// `serve` with this config and vault key, if it exits within `limit`.
fn serve_exits_within(home: &Home, config: &str, key: &str, limit: Duration) -> Option<Output> {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--config"])
        .arg(home.config(config))
        .env("POSTERN_HOME", home.root())
        .env("POSTERN_VAULT_KEY", key);
    exits_within(cmd, limit)
}

#[test]
fn cli_serve_refuses_a_vault_key_that_does_not_open_the_vault() {
    let home = vault_home();
    let config = TEST_CONFIG.to_owned() + VAULT_CREDENTIALS;
    let out = serve_exits_within(&home, &config, "not-the-key", Duration::from_secs(20))
        .expect("serve with a wrong key kept running");
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("POSTERN_VAULT_KEY") && err.contains("vault.json"),
        "{err}"
    );
    assert!(!err.contains("not-the-key"), "{err}");
}

#[test]
fn cli_serve_names_missing_secrets_at_start_and_in_healthz() {
    let home = vault_home();
    let origin = origins::responds("200 OK", &[], "ok");
    let config = format!(
        "{TEST_CONFIG}{VAULT_CREDENTIALS}[[routes]]\nid = \"r\"\ncredential = \"ghost\"\n\
         match = {{ scheme = \"http\", host = \"origin.test\", port = {p} }}\nresolve = \"127.0.0.1:{p}\"\n",
        p = origin.port()
    );
    let daemon = Daemon::start_with(&home, Some(&config), &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    let (status, health) = get_json(&daemon.url("/healthz"), &[]);
    assert_eq!(status, 200);
    assert_eq!(
        (
            health["status"].as_str(),
            health["journal"].as_str(),
            health["vault"].as_str()
        ),
        (Some("degraded"), Some("ok"), Some("ok")),
        "{health}"
    );
    assert_eq!(health["missing_secrets"], serde_json::json!(["never-set"]));
    let warned = daemon.stderr();
    assert!(
        warned
            .lines()
            .any(|l| l.contains("ghost") && l.contains("never-set")),
        "{warned}"
    );
    assert!(!warned.contains("present-value-9d2c"));

    let url = format!("http://origin.test:{}/x", origin.port());
    let (code, body, _) = curl(&["-x", &daemon.proxy, &url]);
    assert_eq!(code, 500, "{body}");
    assert!(
        body.contains("CREDENTIAL_MISSING") && !body.contains("never-set"),
        "{body}"
    );
    let id = serde_json::from_str::<Value>(&body).unwrap()["invocation_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let (_, events) = get_json(&daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
    let failed = events["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["kind"] == "FAILED"))
        .cloned()
        .unwrap_or(Value::Null);
    let diagnostic = failed["data"]["diagnostic"].as_str().unwrap_or_default();
    assert!(diagnostic.contains("never-set"), "{failed}");

    assert!(
        secret_set(&home, "never-set", "now-set-4b1a", Some(VAULT_KEY))
            .status
            .success()
    );
    let (_, health) = get_json(&daemon.url("/healthz"), &[]);
    assert_eq!(health["missing_secrets"], serde_json::json!([]), "{health}");
    assert_eq!(health["status"], "ok", "{health}");
}

#[test]
fn cli_healthz_reports_a_locked_vault() {
    let home = vault_home();
    let config = TEST_CONFIG.to_owned() + VAULT_CREDENTIALS;
    let daemon = Daemon::start(&home, Some(&config));
    let (status, health) = get_json(&daemon.url("/healthz"), &[]);
    assert_eq!(status, 200);
    assert_eq!(health["vault"], "locked", "{health}");
    assert!(
        daemon.stderr().contains("POSTERN_VAULT_KEY"),
        "{}",
        daemon.stderr()
    );
}

#[test]
fn cli_secret_list_refuses_a_wrong_key_and_says_when_the_vault_is_empty() {
    let home = vault_home();
    let wrong = home.cli(&["secret", "list"], &[("POSTERN_VAULT_KEY", "wrong")]);
    assert_eq!(wrong.status.code(), Some(1), "{}", stdout(&wrong));
    assert!(stdout(&wrong).is_empty());
    assert!(
        stderr(&wrong).contains("POSTERN_VAULT_KEY"),
        "{}",
        stderr(&wrong)
    );
    let right = home.cli(&["secret", "list"], &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    assert_eq!(stdout(&right), "present\tversion 1\n");

    let empty = Home::new();
    assert!(empty.cli(&["init"], &[]).status.success());
    let out = empty.cli(&["secret", "list"], &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    assert!(out.status.success());
    assert!(stderr(&out).contains("no secrets"), "{}", stderr(&out));

    let missing = Home::new();
    let out = missing.cli(&["secret", "list"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&missing.root().display().to_string()),
        "{}",
        stderr(&out)
    );
}

#[test]
fn cli_approvals_show_method_target_body_and_the_decision() {
    let s = approvals::setup("20s");
    let target = format!("http://origin.test:{}/pay", s.origin.port());
    let pending = s.send_with(&["--data", "amount=5&api_token=agent-tok-77&note=hi"]);
    let held = s.held();
    let id = approvals::id_of(&held);
    assert_eq!(
        (held["method"].as_str(), held["target"].as_str()),
        (Some("POST"), Some(target.as_str())),
        "{held}"
    );
    assert_eq!(held["body_bytes"], 39, "{held}");
    let preview = held["body_preview"].as_str().unwrap_or_default();
    assert!(
        preview.contains("amount=5") && preview.contains("note=hi"),
        "{held}"
    );
    assert!(!preview.contains("agent-tok-77"), "{held}");

    let listed = stdout(&s.daemon.cli(&["approvals"], &[]));
    for want in [id.as_str(), "POST", target.as_str(), "39 bytes", "amount=5"] {
        assert!(listed.contains(want), "{want}: {listed}");
    }
    assert!(!listed.contains("agent-tok-77"), "{listed}");
    let json = s.daemon.cli(&["approvals", "--json"], &[]);
    let (_, api) = get_json(&s.daemon.url("/v1/approvals"), &[]);
    assert_eq!(
        serde_json::from_slice::<Value>(&json.stdout).ok(),
        Some(api)
    );

    let said = stdout(&s.daemon.cli(&["deny", &id], &[]));
    for want in [id.as_str(), "POST", target.as_str(), "denied"] {
        assert!(said.contains(want), "{want}: {said}");
    }
    let _ = pending.join();

    let body = s.home.dir.path().join("blob.bin");
    std::fs::write(&body, [0u8, 159, 146, 150, 1, 2, 3, 0xff]).unwrap();
    let at = format!("@{}", body.display());
    let pending = s.send_with(&["--data-binary", &at]);
    let held = s.held();
    assert_eq!(held["body_preview"], "(binary, 8 bytes)", "{held}");
    assert_eq!(held["body_hex"], "00 9f 92 96 01 02 03 ff", "{held}");
    let id = approvals::id_of(&held);
    let said = stdout(&s.daemon.cli(&["approve", &id], &[]));
    assert!(
        said.contains("approved") && said.contains(&target),
        "{said}"
    );
    let _ = pending.join();
}

/// One exchange through a plain-http route to `origin`; its invocation id.
fn exchange(origin: &Origin) -> (Home, Daemon, String) {
    let home = Home::new();
    let config = format!(
        "{TEST_CONFIG}[[routes]]\nid = \"r\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {p} }}\n\
         resolve = \"127.0.0.1:{p}\"\n",
        p = origin.port()
    );
    let daemon = Daemon::start(&home, Some(&config));
    let url = format!("http://origin.test:{}/thing", origin.port());
    let (_, _, head) = curl(&["-x", &daemon.proxy, &url]);
    let id = head
        .lines()
        .find_map(|l| l.strip_prefix("postern-invocation: "))
        .unwrap_or_default()
        .trim()
        .to_owned();
    assert!(id.starts_with("act_"), "{head}");
    (home, daemon, id)
}

#[test]
fn cli_result_prints_status_headers_and_the_text_body() {
    let origin = origins::responds(
        "201 Created",
        &["content-type: application/json", "x-origin: yes"],
        "{\"paid\":1}",
    );
    let (home, daemon, id) = exchange(&origin);
    let out = daemon.cli(&["result", &id], &[]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    for want in [
        "201",
        "committed",
        "content-type: application/json",
        "x-origin: yes",
        "{\"paid\":1}",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    assert!(!text.contains("body_base64"), "{text}");
    let json = daemon.cli(&["result", &id, "--json"], &[]);
    let (_, api) = get_json(&daemon.url(&format!("/v1/invocations/{id}/result")), &[]);
    assert_eq!(
        serde_json::from_slice::<Value>(&json.stdout).ok(),
        Some(api)
    );
    let file = home.dir.path().join("body.out");
    let saved = daemon.cli(&["result", &id, "--output", file.to_str().unwrap()], &[]);
    assert!(saved.status.success(), "{}", stderr(&saved));
    assert_eq!(std::fs::read(&file).unwrap(), b"{\"paid\":1}");
}

#[test]
fn cli_result_summarizes_a_binary_body() {
    let origin = origins::responds(
        "200 OK",
        &["content-type: application/octet-stream"],
        "\u{0}\u{1}\u{2}bin",
    );
    let (_home, daemon, id) = exchange(&origin);
    let text = stdout(&daemon.cli(&["result", &id], &[]));
    assert!(
        text.contains("(binary, 6 bytes; --output FILE to save)"),
        "{text}"
    );
}

fn help(args: &[&str]) -> String {
    let home = Home::new();
    let out = home.cli(args, &[]);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    stdout(&out)
}

/// Every argument line of a help text has a description.
fn undescribed(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('-') || l.starts_with('<') || l.starts_with('['))
        .filter(|l| !l.contains("  "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn cli_help_describes_every_flag_argument_and_environment_variable() {
    let top = help(&["--help"]);
    for var in [
        "POSTERN_HOME",
        "POSTERN_CONFIG",
        "POSTERN_VAULT_KEY",
        "POSTERN_ADMIN",
        "POSTERN_ADMIN_TOKEN",
    ] {
        assert!(top.contains(var), "{var}: {top}");
    }
    let serve = help(&["serve", "--help"]);
    assert!(
        serve.contains("proxy") && serve.contains("admin API"),
        "{serve}"
    );
    for cmd in [
        &["actions", "list"][..],
        &["actions", "show"],
        &["result"],
        &["approvals"],
        &["approve"],
        &["deny"],
        &["decide"],
        &["reconcile"],
        &["secret", "set"],
        &["secret", "rm"],
        &["env"],
        &["audit", "verify"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--help");
        let text = help(&args);
        assert!(
            undescribed(&text).is_empty(),
            "{cmd:?}: {:?}\n{text}",
            undescribed(&text)
        );
    }
    let list = help(&["actions", "list", "--help"]);
    for flag in [
        "--agent",
        "--outcome",
        "--phase",
        "--limit",
        "--json",
        "--admin",
    ] {
        assert!(list.contains(flag), "{flag}: {list}");
    }
    for cmd in ["serve", "init", "env"] {
        let text = help(&[cmd, "--help"]);
        assert!(!text.contains("--admin"), "{cmd}: {text}");
    }
}

#[test]
fn cli_invalid_enum_values_list_the_valid_ones() {
    let home = Home::new();
    let out = home.cli(&["actions", "list", "--outcome", "maybe"], &[]);
    assert_eq!(out.status.code(), Some(2));
    for v in ["not_attempted", "rejected", "committed", "unknown"] {
        assert!(stderr(&out).contains(v), "{v}: {}", stderr(&out));
    }
    let out = home.cli(&["actions", "list", "--phase", "later"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("credential_injection"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn cli_admin_is_accepted_only_where_the_daemon_is_used() {
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(TEST_CONFIG));
    let other = Home::new();
    let cfg = other.config(TEST_CONFIG);
    let nowhere = [("POSTERN_ADMIN", "http://127.0.0.1:9")];
    let before = daemon.cli(&["--admin", &daemon.admin, "approvals"], &nowhere);
    assert!(before.status.success(), "{}", stderr(&before));
    let after = daemon.cli(&["actions", "list", "--admin", &daemon.admin], &nowhere);
    assert!(after.status.success(), "{}", stderr(&after));
    for args in [
        &["serve", "--admin", "http://127.0.0.1:9"][..],
        &["--admin", "http://127.0.0.1:9", "serve"],
        &["env", "--admin", "http://127.0.0.1:9"],
        &["--admin", "http://127.0.0.1:9", "secret", "list"],
    ] {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .args(["--config", cfg.to_str().unwrap()])
            .env("POSTERN_HOME", other.root());
        let out = exits_within(cmd, Duration::from_secs(10)).expect("--admin was not refused");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("--admin"), "{}", stderr(&out));
    }
}
