//! SSH: the upstream connector against a real OpenSSH sshd, and the front + bridge with the
//! real OpenSSH client.

use std::path::Path;
use std::process::{Command, Output};

use postern::contract::{Code, Stage};
use postern::dns::Dns;
use postern::ssh::upstream;
use serde_json::Value;

use crate::sshd::{Sshd, keygen};
use crate::support::{BIN, Daemon, Home, TEST_CONFIG, secret_set, stderr};

pub const VAULT_KEY: &str = "ssh test vault key";
pub const TOKEN: &str = "ci-ssh-token-0123456789abcdef";

/// A config with one agent, one key credential and one target for `sshd` (host app1.internal).
fn config_text(sshd: &Sshd, known_hosts: &Path, extra: &str) -> String {
    target_config(&sshd.user, sshd.port, known_hosts, extra)
}

/// The same config for any upstream listening on `127.0.0.1:port`.
pub fn target_config(user: &str, port: u16, known_hosts: &Path, extra: &str) -> String {
    format!(
        "{TEST_CONFIG}\n[[agents]]\nid = \"ci\"\ntoken = \"{TOKEN}\"\n\
         [[credentials]]\nid = \"deploy-key\"\nsecret = \"deploy-ssh-key\"\ninject = {{ ssh_key = true }}\n\
         [[ssh_targets]]\nid = \"deploy\"\nhost = \"app1.internal\"\nuser = \"{user}\"\nagents = [\"ci\"]\n\
         credential = \"deploy-key\"\nknown_hosts = \"{kh}\"\nresolve = \"127.0.0.1:{port}\"\nconnect_timeout = \"5s\"\n{extra}\n",
        kh = known_hosts.display(),
    )
}

/// The body line of a PEM: a canary that must never show anywhere.
pub fn canary(pem: &str) -> String {
    pem.lines().nth(1).unwrap_or("").to_owned()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

struct Upstream {
    home: Home,
    config: postern::config::Config,
}

impl Upstream {
    fn new(sshd: &Sshd, key_pem: &str, known_host_key: Option<&str>) -> Self {
        let home = Home::new();
        let known = match known_host_key {
            Some(public) => {
                let p = home.dir.path().join("known_hosts");
                std::fs::write(&p, format!("app1.internal {public}\n")).unwrap();
                p
            }
            None => sshd.known_hosts(home.dir.path(), "app1.internal"),
        };
        let path = home.config(&config_text(sshd, &known, ""));
        let text = std::fs::read_to_string(&path).unwrap();
        let config = postern::config::parse(&text, Some(&path), &|_| None).unwrap();
        let out = secret_set(&home, "deploy-ssh-key", key_pem, Some(VAULT_KEY));
        assert!(out.status.success(), "{}", stderr(&out));
        Self { home, config }
    }

    fn connect(&self) -> Result<upstream::Upstream, upstream::SetupFailure> {
        let vault = postern::vault::Vault::new(&self.home.root(), Some(VAULT_KEY.into()));
        let target = &self.config.ssh_targets[0];
        runtime().block_on(async {
            upstream::connect(&self.config, target, &vault, &Dns::new(None)).await
        })
    }
}

fn stages(attempts: &[postern::journal::ConnectAttempt]) -> Vec<(Stage, bool)> {
    attempts.iter().map(|a| (a.stage, a.ok)).collect()
}

#[test]
fn the_upstream_authenticates_with_the_vault_key_and_runs_a_command() {
    let sshd = Sshd::start();
    let u = Upstream::new(&sshd, &sshd.client_key.private, None);
    let vault = postern::vault::Vault::new(&u.home.root(), Some(VAULT_KEY.into()));
    let target = u.config.ssh_targets[0].clone();
    let (out, status, evidence) = runtime().block_on(async {
        let mut up = upstream::connect(&u.config, &target, &vault, &Dns::new(None))
            .await
            .unwrap();
        let mut channel = up.open_channel().await.unwrap();
        channel.exec(true, "echo hi").await.unwrap();
        let (mut out, mut status) = (Vec::new(), None);
        while let Some(msg) = channel.wait().await {
            match msg {
                russh::ChannelMsg::Data { data } => out.extend_from_slice(&data),
                russh::ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
                _ => {}
            }
        }
        up.disconnect().await;
        (
            out,
            status,
            (up.host_key.clone(), up.address, up.attempts.clone()),
        )
    });
    assert_eq!(String::from_utf8_lossy(&out), "hi\n");
    assert_eq!(status, Some(0));
    let (fingerprint, address, attempts) = evidence;
    assert!(fingerprint.starts_with("SHA256:"), "{fingerprint}");
    assert_eq!(address.port(), sshd.port);
    assert_eq!(
        stages(&attempts),
        [
            (Stage::TcpConnect, true),
            (Stage::SshTransport, true),
            (Stage::HostKey, true),
            (Stage::UserAuth, true),
            (Stage::ChannelOpen, true)
        ]
    );
    let shown = format!("{attempts:?}");
    assert!(!shown.contains(&canary(&sshd.client_key.private)));
}

#[test]
fn an_unknown_upstream_host_key_is_a_mismatch_before_any_login() {
    let sshd = Sshd::start();
    let other = keygen(tempfile::tempdir().unwrap().path(), "other_host");
    let u = Upstream::new(&sshd, &sshd.client_key.private, Some(&other.public));
    let failure = u
        .connect()
        .err()
        .expect("a mismatching host key must be refused");
    assert_eq!(failure.code, Code::SshHostKeyMismatch);
    assert_eq!(
        stages(&failure.attempts),
        [
            (Stage::TcpConnect, true),
            (Stage::SshTransport, true),
            (Stage::HostKey, false)
        ],
        "no user_auth stage: nothing of the credential was sent"
    );
    assert!(!format!("{failure:?}").contains(&canary(&sshd.client_key.private)));
}

#[test]
fn a_key_the_upstream_does_not_know_is_an_auth_failure() {
    let sshd = Sshd::start();
    let stranger = keygen(tempfile::tempdir().unwrap().path(), "stranger");
    let u = Upstream::new(&sshd, &stranger.private, None);
    let failure = u.connect().err().expect("an unknown key must be refused");
    assert_eq!(failure.code, Code::SshAuthFailed);
    assert_eq!(
        failure.attempts.last().map(|a| a.stage),
        Some(Stage::UserAuth)
    );
    assert!(!format!("{failure:?}").contains(&canary(&stranger.private)));
}

/// A daemon serving one SSH target, with the agent's known_hosts from `postern ssh-config`.
pub struct Front {
    pub daemon: Daemon,
    pub ssh_addr: String,
    pub known_hosts: String,
    /// The upstream login user.
    pub user: String,
    /// The private key in the vault (a canary).
    pub client_private: String,
    /// The config text, for a restart on the same home.
    text: String,
    _sshd: Option<Sshd>,
    _home: Home,
}

impl Front {
    pub fn start(extra: &str) -> Self {
        Self::start_with(extra, |text| text, &[])
    }

    /// `start` with the whole config text edited by `edit` and extra daemon env.
    pub fn start_with(
        extra: &str,
        edit: impl FnOnce(String) -> String,
        envs: &[(&str, &str)],
    ) -> Self {
        let sshd = Sshd::start();
        let home = Home::new();
        let known = sshd.known_hosts(home.dir.path(), "app1.internal");
        let text = edit(config_text(&sshd, &known, extra));
        let (user, private) = (sshd.user.clone(), sshd.client_key.private.clone());
        let out = secret_set(&home, "deploy-ssh-key", &private, Some(VAULT_KEY));
        assert!(out.status.success(), "{}", stderr(&out));
        Self::serve_with(home, &text, user, private, Some(sshd), envs)
    }

    /// A daemon with `text` as config, the vault holding `client_private`.
    pub fn serve(
        home: Home,
        text: &str,
        user: String,
        client_private: String,
        sshd: Option<Sshd>,
    ) -> Self {
        let out = secret_set(&home, "deploy-ssh-key", &client_private, Some(VAULT_KEY));
        assert!(out.status.success(), "{}", stderr(&out));
        Self::serve_with(home, text, user, client_private, sshd, &[])
    }

    /// `serve` for a home whose vault already holds `client_private`, with extra env.
    pub fn serve_with(
        home: Home,
        text: &str,
        user: String,
        client_private: String,
        sshd: Option<Sshd>,
        envs: &[(&str, &str)],
    ) -> Self {
        let mut all = vec![("POSTERN_VAULT_KEY", VAULT_KEY)];
        all.extend_from_slice(envs);
        let daemon = Daemon::start_with(&home, Some(text), &all);
        let ssh_addr = ssh_front(&daemon);
        let key = home.root().join("ssh/host_ed25519");
        let first = std::fs::read(&key).expect("serve made postern's SSH host key");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let config = home.dir.path().join("postern.toml");
        let out = home.cli(&["ssh-config", "--config", config.to_str().unwrap()], &[]);
        assert!(out.status.success(), "{}", stderr(&out));
        let block = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(block.contains("Host app1.internal"), "{block}");
        assert!(block.contains("ssh-connect %r %h %p"), "{block}");
        assert!(block.contains("StrictHostKeyChecking yes"), "{block}");
        let known_hosts = block
            .lines()
            .find_map(|l| l.trim().strip_prefix("UserKnownHostsFile "))
            .expect("UserKnownHostsFile")
            .to_owned();
        assert!(Path::new(&known_hosts).is_absolute());
        assert_eq!(
            std::fs::read(&key).unwrap(),
            first,
            "the host key is reused, not remade"
        );
        Self {
            daemon,
            ssh_addr,
            known_hosts,
            user,
            client_private,
            text: text.to_owned(),
            _sshd: sshd,
            _home: home,
        }
    }

    /// A new daemon on the same home and config (after the old one died), without the
    /// vault key: enough to read records and results.
    pub fn restart(&mut self) {
        self.daemon = Daemon::start(&self._home, Some(&self.text));
        self.ssh_addr = ssh_front(&self.daemon);
    }

    /// `restart` with the vault unlocked: enough to dispatch again.
    pub fn restart_unlocked(&mut self) {
        self.restart_edited(|text| text);
    }

    /// `restart_unlocked` with the config edited by `edit` (after the old daemon ended).
    pub fn restart_edited(&mut self, edit: impl FnOnce(String) -> String) {
        self.text = edit(std::mem::take(&mut self.text));
        let env = [("POSTERN_VAULT_KEY", VAULT_KEY)];
        self.daemon = Daemon::start_with(&self._home, Some(&self.text), &env);
        self.ssh_addr = ssh_front(&self.daemon);
    }

    /// The real OpenSSH client through `postern ssh-connect`.
    pub fn ssh(&self, token: &str, args: &[&str]) -> Output {
        self.ssh_command(token, args)
            .output()
            .expect("ssh must be installed (tests/run installs openssh-client)")
    }

    pub fn ssh_command(&self, token: &str, args: &[&str]) -> Command {
        let user_at = format!("{}@app1.internal", self.user);
        let mut cmd = Command::new("ssh");
        cmd.args(["-F", "/dev/null", "-o"])
            .arg(format!("ProxyCommand={BIN} ssh-connect %r %h %p"))
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", self.known_hosts))
            .args(["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"])
            .args(["-o", "ConnectTimeout=10", "-o", "IdentitiesOnly=yes"])
            .env("POSTERN_SSH_PROXY", &self.ssh_addr)
            .env("POSTERN_AGENT", "ci")
            .env("POSTERN_AGENT_TOKEN", token)
            .env_remove("POSTERN_CONFIG");
        let (options, rest): (Vec<&str>, Vec<&str>) = {
            let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
            (
                args[..split].to_vec(),
                args.get(split + 1..).unwrap_or(&[]).to_vec(),
            )
        };
        let host = match rest.first().copied() {
            Some(h) if !h.is_empty() => h.to_owned(),
            _ => user_at,
        };
        cmd.args(options).arg(host).args(rest.iter().skip(1));
        cmd
    }

    pub fn all_text(&self) -> String {
        let out = self.daemon.cli(&["actions", "list", "--json"], &[]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            self.daemon.stderr()
        )
    }
}

fn ssh_front(daemon: &Daemon) -> String {
    daemon
        .stdout
        .iter()
        .find_map(|l| l.trim().strip_prefix("ssh").map(|a| a.trim().to_owned()))
        .expect("the banner names the SSH front")
}

/// The envelope in a `postern: {…}` stderr line (or the bridge's bare envelope line).
pub fn envelope(stderr_text: &str) -> Value {
    stderr_text
        .lines()
        .find_map(|l| {
            let json = l.strip_prefix("postern: ").unwrap_or(l);
            serde_json::from_str::<Value>(json)
                .ok()
                .filter(|v| v.get("error").is_some())
        })
        .unwrap_or(Value::Null)
}

#[test]
fn an_exec_through_postern_prints_its_output_exits_with_its_code_and_is_journaled() {
    let f = Front::start("");
    let out = f.ssh(TOKEN, &["--", "", "echo hi; echo oops >&2; exit 3"]);
    let err = stderr(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n", "{err}");
    assert!(err.contains("oops"), "{err}");
    assert_eq!(out.status.code(), Some(3), "the remote exit code: {err}");
    assert!(!err.contains("Host key verification failed"), "{err}");
    let list = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let r = &list["invocations"][0];
    assert_eq!(r["protocol"], "ssh", "{r}");
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["command"], "echo hi; echo oops >&2; exit 3");
    assert_eq!(r["result"]["exit_status"], 3, "{r}");
    let id = r["invocation_id"].as_str().unwrap();
    let result = f.daemon.cli(&["result", id, "--json"], &[]);
    let result: Value = serde_json::from_slice(&result.stdout).unwrap();
    assert_eq!(result["exit_status"], 3, "{result}");
    assert_eq!(result["stdout_base64"], "aGkK", "{result}");
    assert_eq!(result["complete"], true, "{result}");
    let shown = f.daemon.cli(&["actions", "show", id, "--json"], &[]);
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let kinds: Vec<&str> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or(""))
        .collect();
    let dispatched = kinds.iter().position(|k| *k == "DISPATCH_STARTED").unwrap();
    let committed = kinds.iter().position(|k| *k == "RESULT_COMMITTED").unwrap();
    assert!(dispatched < committed, "{kinds:?}");
    assert!(!f.all_text().contains(&canary(&f.client_private)));
}

/// A command that never reads its stdin exits while megabytes of it wait for the remote's
/// window: its exit status still comes back, at once (the stdin write used to block the
/// relay, so neither the exit status nor the timeouts were ever seen).
#[test]
fn a_command_that_ignores_megabytes_of_stdin_still_returns_its_exit_status() {
    let f = Front::start("response_timeout = \"20s\"");
    let mut child = f
        .ssh_command(TOKEN, &["--", "", "exit 7"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        use std::io::Write;
        let _ = stdin.write_all(&vec![b'y'; 3_000_000]);
    });
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > std::time::Duration::from_secs(15) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(7),
        "the exit status never came back ({:?})",
        started.elapsed()
    );
}

#[test]
fn stdin_reaches_the_remote_command() {
    let f = Front::start("");
    let mut cmd = f.ssh_command(TOKEN, &["--", "", "cat"]);
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"data through postern\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "data through postern\n",
        "{}",
        stderr(&out)
    );
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_wrong_agent_token_is_refused_by_the_bridge_with_the_envelope() {
    let f = Front::start("");
    let out = f.ssh("not-the-token", &["--", "", "echo hi"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(255), "{err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["code"], "AGENT_UNAUTHENTICATED", "{err}");
    assert_eq!(env["error"]["field"], "token", "{err}");
    assert!(!err.contains("not-the-token") && !f.all_text().contains("not-the-token"));
}

#[test]
fn an_unknown_target_is_route_denied_naming_the_host() {
    let f = Front::start("");
    let other = format!("{}@other.internal", f.user);
    let out = f.ssh(TOKEN, &["--", &other, "echo hi"]);
    let env = envelope(&stderr(&out));
    assert_eq!(out.status.code(), Some(255));
    assert_eq!(env["error"]["code"], "ROUTE_DENIED", "{}", stderr(&out));
    assert_eq!(env["error"]["field"], "target.host");
}

#[test]
fn a_command_outside_commands_is_route_denied_naming_the_command() {
    let f = Front::start("commands = [\"echo hi\", \"uptime\"]");
    let out = f.ssh(TOKEN, &["--", "", "echo hi; rm -rf /tmp/nothing"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(255), "{err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["code"], "ROUTE_DENIED", "{err}");
    assert_eq!(env["error"]["field"], "command", "{err}");
    // A listed command passes the check and runs.
    let out = f.ssh(TOKEN, &["--", "", "echo hi"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hi\n",
        "{}",
        stderr(&out)
    );
}

/// SPEC §5.8: an exec draws on its agent's `rate_limit` like an HTTP request: past it the
/// exec is `RATE_LIMITED` before any connection to the target.
#[test]
fn an_agents_rate_limit_covers_its_ssh_execs() {
    let f = Front::start_with(
        "",
        |text| {
            text.replace(
                &format!("token = \"{TOKEN}\"\n"),
                &format!("token = \"{TOKEN}\"\nrate_limit = \"2/h\"\n"),
            )
        },
        &[],
    );
    for _ in 0..2 {
        let out = f.ssh(TOKEN, &["--", "", "echo hi"]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hi\n",
            "{}",
            stderr(&out)
        );
    }
    let out = f.ssh(TOKEN, &["--", "", "echo hi"]);
    let err = stderr(&out);
    assert!(out.stdout.is_empty(), "{err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["code"], "RATE_LIMITED", "{err}");
    assert_eq!(env["error"]["field"], "agent.rate_limit", "{err}");
    assert_eq!(env["error"]["outcome"], "not_attempted", "{err}");
}

/// A control character can only fail at the remote (sshd drops a NUL, a terminal obeys an
/// escape): refused as malformed before any connection, so it makes no reconcile work.
#[test]
fn a_command_with_a_control_character_is_malformed_before_any_connection() {
    let f = Front::start("commands = [\"echo .*\"]");
    for command in ["echo a\u{1}b", "echo a\u{1b}[2Jb", "echo a\rb", "echo a\nb"] {
        let out = f.ssh(TOKEN, &["--", "", command]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(255), "{command:?}: {err}");
        assert!(out.stdout.is_empty(), "{command:?}: nothing ran");
        let env = envelope(&err);
        assert_eq!(
            env["error"]["code"], "MALFORMED_REQUEST",
            "{command:?}: {err}"
        );
        assert_eq!(env["error"]["field"], "command", "{err}");
        assert_eq!(env["error"]["outcome"], "not_attempted", "{err}");
    }
    let list = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap_or(Value::Null);
    let records = list["invocations"].as_array().cloned().unwrap_or_default();
    assert_eq!(records.len(), 4, "{records:?}");
    for r in &records {
        let id = r["invocation_id"].as_str().unwrap_or("");
        let shown = f.daemon.cli(&["actions", "show", id, "--json"], &[]);
        let text = String::from_utf8_lossy(&shown.stdout);
        assert!(!text.contains("CONNECT_ATTEMPT"), "no connection: {text}");
        assert!(!text.contains("DISPATCH_STARTED"), "{text}");
    }
    // A tab is no control character here: it runs.
    let out = f.ssh(TOKEN, &["--", "", "echo a\tb"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "a b\n",
        "{}",
        stderr(&out)
    );
}

#[test]
fn port_forwarding_and_sftp_are_unsupported_actions() {
    let f = Front::start("");
    let out = f.ssh(TOKEN, &["-s", "--", "", "sftp"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(255), "{err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["code"], "UNSUPPORTED_ACTION", "{err}");
    let out = f.ssh(TOKEN, &["-W", "127.0.0.1:9", "--", ""]);
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    let list = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap_or(Value::Null);
    let methods: Vec<(String, String)> = list["invocations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["method"].as_str().unwrap_or("").to_owned(),
                r["code"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    for method in ["subsystem", "port_forward"] {
        assert!(
            methods.contains(&(method.to_owned(), "UNSUPPORTED_ACTION".to_owned())),
            "{method}: {methods:?}"
        );
    }
    assert!(
        list["invocations"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|r| r["protocol"] == "ssh"
                && r["target"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("ssh://")))
    );
}

/// An authenticated upstream session is kept for the next exec on the same target and
/// credential version; the record says so.
#[test]
fn a_second_exec_reuses_the_authenticated_upstream_session() {
    let f = Front::start("");
    for expected in ["one\n", "two\n"] {
        let word = expected.trim();
        let out = f.ssh(TOKEN, &["--", "", &format!("echo {word}")]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            expected,
            "{}",
            stderr(&out)
        );
    }
    let list = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let (second, first) = (&list["invocations"][0], &list["invocations"][1]);
    assert_eq!(first["outcome"], "committed", "{first}");
    assert!(first["evidence"]["reused_connection"].is_null(), "{first}");
    assert_eq!(second["outcome"], "committed", "{second}");
    assert_eq!(second["evidence"]["reused_connection"], true, "{second}");
    assert_eq!(
        second["evidence"]["connection_id"],
        first["evidence"]["connection_id"]
    );
}

#[test]
fn a_forced_tty_still_shows_the_output_of_the_command_that_ran() {
    let f = Front::start("");
    let out = f.ssh(TOKEN, &["-tt", "--", "", "echo tty"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("tty"),
        "{}",
        stderr(&out)
    );
}

/// Resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024
}

/// An agent that stops reading holds the remote command back: postern relays no faster than
/// the agent takes the output, so what it holds stays bounded however much the command
/// writes, and the whole output still arrives, digested and counted, once the agent reads on.
#[test]
fn a_slow_agent_holds_back_the_remote_and_postern_stays_bounded() {
    use std::io::Read;
    let f = Front::start("");
    let total: u64 = 48 << 20;
    let mut child = f
        .ssh_command(TOKEN, &["--", "", &format!("head -c {total} /dev/zero")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = vec![0u8; 1 << 20];
    stdout.read_exact(&mut first).unwrap();
    let pid = f.daemon.child.id();
    let before = rss_mib(pid);
    // Without backpressure postern would take in the whole output meanwhile.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let during = rss_mib(pid);
    assert!(
        during < before + 24,
        "postern grew from {before} MiB to {during} MiB while the agent was not reading"
    );
    let rest = std::io::copy(&mut stdout, &mut std::io::sink()).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(first.len() as u64 + rest, total);
    let list = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let r = &list["invocations"][0];
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["result"]["bytes"], total, "{r}");
    let zeros = vec![0u8; total as usize];
    let hex: String = <sha2::Sha256 as sha2::Digest>::digest(&zeros)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let digest = format!("sha256:{hex}");
    assert_eq!(r["result"]["digest"], digest, "{r}");
}
