//! `postern serve` as the README runs it.

use std::process::Command;

use crate::support::{BIN, Daemon, Home, TEST_CONFIG, get_json, stderr, stdout};

/// `cargo run -- serve` with the embedded default listens on 127.0.0.1:3128/3129, which a
/// postern already running here may hold. So the README command runs in a fresh network
/// namespace (`unshare -rn`) with its own loopback; only where none can be made does it run
/// here, and then a busy port must be refused with a message naming it.
#[test]
fn the_readme_run_command_serves_healthz_with_the_embedded_default() {
    let home = Home::new();
    match readme_run_in_a_fresh_netns(&home) {
        Some(out) => {
            assert!(out.contains("admin    http://127.0.0.1:3129"), "{out}");
            assert!(out.contains("healthz {\"journal\":\"ok\""), "{out}");
            assert!(out.contains("\"status\":\"ok\""), "{out}");
            assert!(out.contains("exit 0"), "{out}");
            assert!(home.root().join("journal").is_dir());
        }
        None if default_ports_free() => {
            let daemon = Daemon::start(&home, None);
            assert_eq!(daemon.admin, "http://127.0.0.1:3129");
            let (status, body) = get_json(&daemon.url("/healthz"), &[]);
            assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
            assert_eq!(daemon.terminate(), Some(0));
        }
        None => {
            let out = home.cli(&["serve"], &[]);
            assert_eq!(out.status.code(), Some(1));
            assert!(
                stderr(&out).contains("cannot listen on 127.0.0.1:312"),
                "{}",
                stderr(&out)
            );
            eprintln!(
                "no network namespace and the default ports are busy: only the refusal was checked"
            );
        }
    }
}

/// Runs `postern serve` (no config) and `curl /healthz` inside `unshare -rn`; their output.
fn readme_run_in_a_fresh_netns(home: &Home) -> Option<String> {
    let usable = Command::new("unshare")
        .args(["-rn", "ip", "link", "set", "lo", "up"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !usable {
        return None;
    }
    let script = r#"ip link set lo up
"$POSTERN_BIN" serve > "$HOME_DIR.out" 2>&1 &
pid=$!
for _ in $(seq 1 200); do
  body=$(curl -s http://127.0.0.1:3129/healthz) && break
  sleep 0.1
done
echo "healthz $body"
kill -TERM $pid
wait $pid
echo "exit $?"
cat "$HOME_DIR.out"
"#;
    let out = Command::new("unshare")
        .args(["-rn", "sh", "-c", script])
        .current_dir(home.dir.path())
        .env("POSTERN_BIN", BIN)
        .env("POSTERN_HOME", home.root())
        .env("HOME_DIR", home.root())
        .env_remove("POSTERN_CONFIG")
        .output()
        .ok()?;
    Some(format!("{}{}", stdout(&out), stderr(&out)))
}

fn default_ports_free() -> bool {
    [3128, 3129, 2222]
        .iter()
        .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
}

#[test]
fn sigterm_flushes_and_exits_cleanly_and_state_survives() {
    let home = Home::new();
    let (id, _) = home.drill("POST", "RESULT_DELIVERED", None);
    let daemon = Daemon::start(&home, Some(TEST_CONFIG));
    assert_eq!(daemon.terminate(), Some(0));
    let again = Daemon::start(&home, Some(TEST_CONFIG));
    let (status, r) = get_json(&again.url(&format!("/v1/invocations/{id}")), &[]);
    assert_eq!((status, r["outcome"].as_str()), (200, Some("committed")));
}

#[test]
fn a_second_daemon_on_the_same_home_is_refused() {
    let home = Home::new();
    let _first = Daemon::start(&home, Some(TEST_CONFIG));
    let cfg = home.config(TEST_CONFIG);
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(cfg)
        .env("POSTERN_HOME", home.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("another postern process"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_bad_config_is_refused_with_every_problem_and_its_path() {
    let home = Home::new();
    let cfg = home.config(
        r#"
[proxy]
listen = "0.0.0.0:3128"
[journal]
durability = "eventually"
[[routes]]
id = "gh"
credential = "missing"
match = { host = "api.github.com", method = "GET" }
"#,
    );
    let out = home.cli(&["serve", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    for path in [
        "proxy.listen",
        "journal.durability",
        "routes[0].credential",
        "routes[0].match.method",
    ] {
        assert!(
            err.contains(&format!("  {path}: ")),
            "{path} missing from:\n{err}"
        );
    }
    assert!(
        err.contains("unknown key (did you mean `methods`?)"),
        "{err}"
    );
}

#[test]
fn init_creates_the_state_directory_idempotently() {
    let home = Home::new();
    for _ in 0..2 {
        let out = home.cli(&["init"], &[]);
        assert!(out.status.success(), "{out:?}");
    }
    assert!(home.root().join("journal").is_dir() && home.root().join("certs").is_dir());
}

#[test]
fn low_disk_space_degrades_healthz() {
    let home = Home::new();
    let starved = TEST_CONFIG.replace(
        "min_free_bytes = \"1MiB\"",
        "min_free_bytes = \"1000000TiB\"",
    );
    let daemon = Daemon::start(&home, Some(&starved));
    let (status, body) = get_json(&daemon.url("/healthz"), &[]);
    assert_eq!(
        (status, body["journal"].as_str()),
        (503, Some("refusing_dispatch"))
    );
    assert!(!home.root().join("journal/reserve.bin").exists());
}

#[test]
fn a_closed_stdout_does_not_take_the_daemon_down() {
    let home = Home::new();
    let cfg = home.config(TEST_CONFIG);
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(cfg)
        .env("POSTERN_HOME", home.root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Close the read end before the daemon prints its banner, as `postern serve | head -0`
    // would: every later write to stdout then fails with EPIPE.
    drop(child.stdout.take());
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(alive, "postern serve died when its stdout closed");
}

/// The README quick start: only the daemon's environment holds the agent token, and the
/// agent's shell runs `postern env --config` and `postern actions list --config` without it.
#[test]
fn env_and_the_operator_cli_read_addresses_without_the_daemons_secrets() {
    let home = Home::new();
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let admin = free.local_addr().expect("addr");
    drop(free);
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"{admin}\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[agents]]\nid = \"ci\"\ntoken = \"env:QUICKSTART_AGENT_TOKEN\"\n"
    );
    let daemon = Daemon::start_with(
        &home,
        Some(&config),
        &[("QUICKSTART_AGENT_TOKEN", "s3cret-0123456789abcdef")],
    );
    let path = home.config(&config);
    let shell = |args: &[&str]| {
        Command::new(BIN)
            .args(args)
            .arg("--config")
            .arg(&path)
            .env("POSTERN_HOME", home.root())
            .env_remove("QUICKSTART_AGENT_TOKEN")
            .env_remove("POSTERN_CONFIG")
            .env_remove("POSTERN_ADMIN")
            .env_remove("POSTERN_ADMIN_TOKEN")
            .output()
            .expect("run postern")
    };
    let env = shell(&["env"]);
    assert!(env.status.success(), "postern env: {}", stderr(&env));
    let text = String::from_utf8_lossy(&env.stdout);
    assert!(
        text.contains("export HTTPS_PROXY=http://127.0.0.1:0"),
        "{text}"
    );
    assert!(
        !text.contains("s3cret-0123456789abcdef") && !text.contains("not set"),
        "{text}"
    );
    let list = shell(&["actions", "list", "--json"]);
    assert!(list.status.success(), "actions list: {}", stderr(&list));
    assert_eq!(daemon.admin, format!("http://{admin}"));
}

/// One run names every problem of a config with its key path (issue: they came in rounds).
#[test]
fn a_bad_config_is_refused_with_every_problem_in_one_run() {
    let home = Home::new();
    let path = home.config(
        "[journal]\ndurability = \"fsnc\"\n\
         [[credentials]]\nid = \"gh\"\nsecret = \"github-token\"\ninject = { header = \"Authorization\", format = \"Bearer {secret}\" }\n\
         [[routes]]\nid = \"r\"\ncredentail = \"gh\"\nretry_budget = \"three\"\nconnect_timeout = \"5 seconds\"\nmatch = { host = \"x.test\" }\n",
    );
    let out = home.cli(&["serve", "--config", path.to_str().unwrap()], &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    for line in [
        "journal.durability:",
        "routes[0].credentail: unknown key (did you mean `credential`?)",
        "routes[0].retry_budget: expected a whole number, got \"three\"",
        "routes[0].connect_timeout:",
    ] {
        assert!(err.contains(line), "{line} missing in:\n{err}");
    }
}

#[test]
fn an_admin_api_without_a_token_is_a_warning_when_agents_are_configured() {
    let home = Home::new();
    let config =
        format!("{TEST_CONFIG}\n[[agents]]\nid = \"ci\"\ntoken = \"t-0123456789abcdef\"\n");
    let daemon = Daemon::start(&home, Some(&config));
    assert!(
        daemon.stderr().contains("[admin] has no token"),
        "{}",
        daemon.stderr()
    );
}
