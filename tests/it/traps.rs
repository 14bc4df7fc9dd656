//! An operator's first day without traps (issue 20, section 4): what a newcomer hits before
//! reading the whole README is refused or explained where it happens.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ssh::{Front, TOKEN, envelope};
use crate::ssh_hostile::{git, ok};
use crate::support::{BIN, Daemon, Home, TEST_CONFIG, daemon_bin, get_json, secret_set};

/// A config with one SSH target; `extra` adds keys to it.
fn ssh_target_config(home: &Home, extra: &str) -> String {
    let known = home.dir.path().join("known_hosts");
    std::fs::write(
        &known,
        "app1.internal ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMwq\n",
    )
    .unwrap();
    format!(
        "{TEST_CONFIG}\n[[credentials]]\nid = \"k\"\nsecret = \"s\"\ninject = {{ ssh_key = true }}\n\
         [[ssh_targets]]\nid = \"t\"\nhost = \"app1.internal\"\nuser = \"deploy\"\ncredential = \"k\"\n\
         known_hosts = \"{}\"\n{extra}\n",
        known.display()
    )
}

/// `postern serve` with `text`, which must refuse to start (killed if it runs 20 s).
fn serve_refused(home: &Home, text: &str) -> String {
    let path = home.config(text);
    let err_path = home.dir.path().join("refused.stderr");
    let mut child = Command::new(daemon_bin())
        .args(["serve", "--config"])
        .arg(&path)
        .env("POSTERN_HOME", home.root())
        .env_remove("POSTERN_CONFIG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        match child.try_wait().unwrap() {
            Some(status) => break Some(status),
            None if Instant::now() > deadline => break None,
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "serve started:\n{err}"
    );
    err
}

/// `allow = ["shell"]` was accepted and then refused at run time as "not built yet".
#[test]
fn an_ssh_action_that_is_not_built_is_a_config_error_naming_its_key() {
    let home = Home::new();
    let err = serve_refused(
        &home,
        &ssh_target_config(
            &home,
            "allow = [\"exec\", \"shell\", \"port_forward\", \"subsystem\"]",
        ),
    );
    for j in 1..=3 {
        let key = format!("ssh_targets[0].allow[{j}]: ");
        assert!(err.contains(&key), "{key} missing from:\n{err}");
    }
    assert!(!err.contains("ssh_targets[0].allow[0]"), "{err}");
    assert!(err.contains("not built"), "{err}");
}

/// `^echo .*$` admitted `echo x; whoami`: the pattern saw one string, the remote shell two
/// commands. Shell syntax is refused before any connection unless the target opts in.
#[test]
fn shell_syntax_is_route_denied_where_commands_patterns_apply() {
    let f = Front::start("commands = [\"^echo .*$\", \"^git-(upload|receive)-pack '[^']*'$\"]");
    for command in [
        "echo x; whoami",
        "echo x | id",
        "echo $(id)",
        "echo `id`",
        "echo x > /tmp/f",
        "echo x && id",
    ] {
        let out = f.ssh(TOKEN, &["--", "", command]);
        let err = crate::support::stderr(&out);
        assert_eq!(out.status.code(), Some(255), "{command:?}: {err}");
        let env = envelope(&err);
        assert_eq!(env["error"]["code"], "ROUTE_DENIED", "{command:?}: {err}");
        assert_eq!(env["error"]["field"], "command", "{command:?}: {err}");
        assert!(
            env["evidence"]["shell_syntax"].is_string(),
            "{command:?}: {env}"
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).is_empty(),
            "{command:?} ran"
        );
    }
    let out = f.ssh(TOKEN, &["--", "", "echo x"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "x\n",
        "{}",
        crate::support::stderr(&out)
    );
    // git quotes its repository argument but uses none of the refused characters.
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("repo.git");
    ok(&git(
        &f,
        dir.path(),
        &["init", "--bare", "-q", bare.to_str().unwrap()],
    ));
    let url = format!("ssh://{}@app1.internal{}", f.user, bare.display());
    ok(&git(&f, dir.path(), &["clone", "-q", &url, "work"]));
    assert!(
        !f.daemon.stderr().contains("shell_syntax = true"),
        "no warning without the opt-in: {}",
        f.daemon.stderr()
    );
}

#[test]
fn a_target_that_opts_into_shell_syntax_runs_it_and_is_warned_about_at_start() {
    let f = Front::start("commands = [\"^echo .*$\", \"^uptime$\"]\nshell_syntax = true");
    let out = f.ssh(TOKEN, &["--", "", "echo x; echo y"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "x\ny\n",
        "{}",
        crate::support::stderr(&out)
    );
    let err = f.daemon.stderr();
    assert!(
        err.contains("ssh_targets[0] (deploy): shell_syntax = true and commands[0] admits"),
        "{err}"
    );
    assert!(
        !err.contains("commands[1]"),
        "^uptime$ admits no shell syntax: {err}"
    );
}

/// `/healthz` said `"status":"ok"` while every credentialed route failed.
#[test]
fn healthz_is_degraded_while_credentials_cannot_be_injected() {
    const KEY: &str = "traps vault key";
    let health = |daemon: &Daemon| {
        let (status, body) = get_json(&daemon.url("/healthz"), &[]);
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["journal"], "ok", "{body}");
        body
    };
    // Nothing needs the vault: locked is fine.
    let home = Home::new();
    let body = health(&Daemon::start(&home, Some(TEST_CONFIG)));
    assert_eq!(
        (body["status"].as_str(), body["vault"].as_str()),
        (Some("ok"), Some("locked")),
        "{body}"
    );

    let config = format!(
        "{TEST_CONFIG}[[credentials]]\nid = \"gh\"\nsecret = \"github-token\"\ninject = {{ header = \"X-Key\" }}\n"
    );
    let body = health(&Daemon::start(&home, Some(&config)));
    assert_eq!(
        (body["status"].as_str(), body["vault"].as_str()),
        (Some("degraded"), Some("locked")),
        "{body}"
    );

    let daemon = Daemon::start_with(&home, Some(&config), &[("POSTERN_VAULT_KEY", KEY)]);
    let body = health(&daemon);
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(
        body["missing_secrets"],
        serde_json::json!(["github-token"]),
        "{body}"
    );
    assert!(
        secret_set(&home, "github-token", "v", Some(KEY))
            .status
            .success()
    );
    let body = health(&daemon);
    assert_eq!(
        (
            body["status"].as_str(),
            body["vault"].as_str(),
            body["missing_secrets"].clone()
        ),
        (Some("ok"), Some("ok"), serde_json::json!([])),
        "{body}"
    );
}

/// Runs `cmd` for at most `limit`; `None` if it was still running (then killed).
fn exits_within(mut cmd: Command, limit: Duration) -> Option<std::process::Output> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A hung daemon (it takes the connection and never answers) held the CLI forever.
#[test]
fn the_cli_gives_up_on_a_daemon_that_never_answers_and_names_its_url() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().map_while(Result::ok) {
            held.push(stream);
        }
    });
    let home = Home::new();
    let mut cmd = Command::new(BIN);
    cmd.args(["actions", "list", "--admin", &url])
        .env("POSTERN_HOME", home.root())
        .env_remove("POSTERN_CONFIG")
        .env_remove("POSTERN_ADMIN")
        .env_remove("POSTERN_ADMIN_TOKEN");
    let started = Instant::now();
    let out = exits_within(cmd, Duration::from_secs(60)).expect("the CLI still waits after 60 s");
    let waited = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        waited >= Duration::from_secs(29),
        "gave up after {waited:?}: {err}"
    );
    assert!(
        err.contains(&url) && err.contains("no answer within 30 s"),
        "{err}"
    );
}

/// The CLI relayed the daemon's HTTP hint ("Send Authorization: Bearer <admin token>").
#[test]
fn the_cli_without_the_admin_token_names_postern_admin_token() {
    let admin = "[admin]\nlisten = \"127.0.0.1:0\"";
    let config = TEST_CONFIG.replace(admin, &format!("{admin}\ntoken = \"traps-admin-token\""));
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config));
    let out = daemon.cli(&["actions", "list"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("ADMIN_UNAUTHENTICATED") && err.contains("set POSTERN_ADMIN_TOKEN"),
        "{err}"
    );
    assert!(!err.contains("Authorization: Bearer"), "{err}");
    let out = daemon.cli(&["actions", "list"], &[("POSTERN_ADMIN_TOKEN", "wrong")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("POSTERN_ADMIN_TOKEN does not match"), "{err}");
    assert!(!err.contains("traps-admin-token"), "{err}");
    let ok = daemon.cli(
        &["actions", "list"],
        &[("POSTERN_ADMIN_TOKEN", "traps-admin-token")],
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// `postern ssh-connect` without a token said "proxy credentials".
#[test]
fn ssh_connect_without_a_token_names_the_variables_it_reads() {
    let f = Front::start("");
    let out = f
        .ssh_command(TOKEN, &["--", "", "echo hi"])
        .env_remove("POSTERN_AGENT_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert_eq!(
        envelope(&err)["error"]["code"],
        "AGENT_UNAUTHENTICATED",
        "{err}"
    );
    assert!(
        err.contains("POSTERN_AGENT") && err.contains("POSTERN_AGENT_TOKEN"),
        "{err}"
    );
}

/// `actions list` showed `ssh://user@host:port` and not what ran there.
#[test]
fn actions_list_shows_an_ssh_invocation_s_command_cut_to_width() {
    let f = Front::start("");
    let long = format!("echo {}", "y".repeat(200));
    for command in ["echo listed-command", long.as_str()] {
        let out = f.ssh(TOKEN, &["--", "", command]);
        assert!(out.status.success(), "{}", crate::support::stderr(&out));
    }
    let out = f.daemon.cli(&["actions", "list"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    let line = |needle: &str| text.lines().find(|l| l.contains(needle)).map(str::to_owned);
    let short = line("echo listed-command").unwrap_or_else(|| panic!("no command in:\n{text}"));
    assert!(
        short.contains("ssh://") && short.ends_with("`echo listed-command`"),
        "{short}"
    );
    let cut = line("echo yyy").unwrap_or_else(|| panic!("no long command in:\n{text}"));
    assert!(
        cut.ends_with("…`") && !cut.contains(&"y".repeat(100)),
        "{cut}"
    );
}

/// A `TLS_CERTIFICATE_ERROR` to a private origin said only "could not be verified".
#[test]
fn a_tls_certificate_error_names_the_class_of_problem_and_the_fix() {
    let home = Home::new();
    let right = crate::tls_origin::echo_origin();
    let wrong_name = crate::tls_origin::echo_origin_for("other.test");
    let route = |id: &str, origin: &crate::tls_origin::TlsOrigin, ca: bool| {
        let ca = if ca {
            format!("upstream_ca = \"{}\"\n", origin.ca_file.display())
        } else {
            String::new()
        };
        format!(
            "[[routes]]\nid = \"{id}\"\nmatch = {{ host = \"{id}.test\", port = {} }}\nresolve = \"{}\"\n{ca}",
            origin.addr.port(),
            origin.addr
        )
    };
    let config = format!(
        "{TEST_CONFIG}{}{}",
        route("private", &right, false),
        route("misnamed", &wrong_name, true)
    );
    let daemon = Daemon::start(&home, Some(&config));
    let ca = home.root().join("certs/ca.pem").display().to_string();
    let ask = |host: &str, port: u16| {
        let url = format!("https://{host}:{port}/x");
        let (status, body, _) = crate::support::curl(&["--cacert", &ca, "-x", &daemon.proxy, &url]);
        assert_eq!(status, 502, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let e = ask("private.test", right.addr.port());
    assert_eq!(e["error"]["code"], "TLS_CERTIFICATE_ERROR", "{e}");
    assert_eq!(e["evidence"]["tls_problem"], "untrusted_issuer", "{e}");
    let message = e["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("issuer is not trusted") && message.contains("upstream_ca"),
        "{e}"
    );
    // The TLS library's words stay in the journal's diagnostic.
    let id = e["invocation_id"].as_str().unwrap_or_default();
    let (_, events) = get_json(&daemon.url(&format!("/v1/invocations/{id}/events")), &[]);
    let text = events.to_string();
    assert!(
        text.contains("UnknownIssuer") || text.contains("unknown issuer"),
        "{text}"
    );
    assert!(
        !e.to_string().contains("UnknownIssuer") && !e.to_string().contains("invalid peer"),
        "{e}"
    );

    let e = ask("misnamed.test", wrong_name.addr.port());
    assert_eq!(e["error"]["code"], "TLS_CERTIFICATE_ERROR", "{e}");
    assert_eq!(e["evidence"]["tls_problem"], "name_mismatch", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("does not name the host"),
        "{e}"
    );
}
