//! `postern jail` (SPEC §5.7): the real binary runs real clients in the jail; the daemon
//! runs outside it, its routes pin loopback origins in the host's network namespace.
//! Rootless where the machine allows (one test drops to uid 65534); every test prints a
//! note and passes when user namespaces are refused here.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::origins::{Origin, echoes_request};
use crate::support::{BIN, Daemon, Home, free_port, secret_set, stderr, stdout};
use crate::tls_origin::{TlsOrigin, echo_origin};

const VAULT_KEY: &str = "jail test vault key";
const TOKEN: &str = "jail-agent-token";
const CANARY: &str = "jail-canary-SECRET-4d2f";

/// Whether this machine lets an unprivileged process make user namespaces.
pub fn userns_allowed() -> bool {
    let ok = Command::new("unshare")
        .args(["-rn", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("note: user namespaces are refused here; postern jail tests skipped");
    }
    ok
}

/// A daemon with fixed listen ports (the jail finds them in the config), one agent and a
/// credentialed route to an HTTPS echo origin named `origin.test` on port 443.
pub struct Jail {
    pub daemon: Daemon,
    pub home: Home,
    pub config: PathBuf,
    pub proxy_port: u16,
    pub admin_port: u16,
    _origin: TlsOrigin,
    _plain: Origin,
}

impl Jail {
    pub fn start(extra: &str) -> Self {
        let origin = echo_origin();
        let plain = echoes_request();
        let (proxy_port, ssh_port, admin_port) = (free_port(), free_port(), free_port());
        let text = format!(
            "[proxy]\nlisten = \"127.0.0.1:{proxy_port}\"\n[ssh]\nlisten = \"127.0.0.1:{ssh_port}\"\n\
             [admin]\nlisten = \"127.0.0.1:{admin_port}\"\n\
             [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
             [[agents]]\nid = \"ci\"\ntoken = \"{TOKEN}\"\n\
             [[credentials]]\nid = \"api\"\nsecret = \"api-key\"\n\
             inject = {{ header = \"Authorization\", format = \"Bearer {{secret}}\" }}\n\
             placeholder_env = [\"ORIGIN_API_KEY\"]\n\
             [[routes]]\nid = \"origin\"\nagents = [\"ci\"]\ncredential = \"api\"\n\
             match = {{ host = \"origin.test\", port = 443 }}\nresolve = \"{addr}\"\nupstream_ca = \"{ca}\"\n\
             [[routes]]\nid = \"plain\"\nagents = [\"ci\"]\n\
             match = {{ scheme = \"http\", host = \"plain.test\", port = 80 }}\nresolve = \"{plain}\"\nallow_private = true\n\
             {extra}\n",
            addr = origin.addr,
            ca = origin.ca_file.display(),
            plain = plain.addr,
        );
        let home = Home::new();
        let out = secret_set(&home, "api-key", CANARY, Some(VAULT_KEY));
        assert!(out.status.success(), "{}", stderr(&out));
        let daemon = Daemon::start_with(&home, Some(&text), &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
        let config = home.dir.path().join("postern.toml");
        Self {
            daemon,
            home,
            config,
            proxy_port,
            admin_port,
            _origin: origin,
            _plain: plain,
        }
    }

    /// `postern jail --agent ci -- sh -c SCRIPT`, with the daemon's secrets in the caller's
    /// environment (the jail must not pass them on).
    pub fn command(&self, script: &str) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("jail")
            .arg("--config")
            .arg(&self.config)
            .args(["--agent", "ci", "--", "sh", "-c", script])
            .env("POSTERN_HOME", self.home.root())
            .env("POSTERN_VAULT_KEY", VAULT_KEY)
            .env("POSTERN_ADMIN_TOKEN", "admin-secret-0123456789abcdef")
            .env_remove("POSTERN_AGENT")
            .env_remove("POSTERN_AGENT_TOKEN")
            .env_remove("POSTERN_CONFIG")
            .env_remove("NODE_USE_ENV_PROXY");
        cmd
    }

    pub fn run(&self, script: &str) -> Output {
        run_within(self.command(script), Duration::from_secs(90))
    }
}

/// Runs `cmd` with a deadline (a hung jail fails the test instead of hanging it).
fn run_within(mut cmd: Command, bound: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(bound) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("postern jail did not finish within {bound:?}");
        }
    }
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "jail exited {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

/// The JSON lines of `text` (the echo origin's answers).
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(Value::is_object)
        .collect()
}

/// The operator's shell holds tokens of its own: CMD gets none of them unless named with
/// `--env` (issue 40: `echo $GITHUB_TOKEN` in the jail printed the operator's token).
#[test]
fn the_jail_passes_no_variable_of_the_callers_but_the_harmless_and_the_named() {
    if !userns_allowed() {
        return;
    }
    let jail = Jail::start("");
    let script =
        "echo \"gh=$GITHUB_TOKEN aws=$AWS_SECRET_ACCESS_KEY mode=$MODE path=${PATH:+set}\"";
    let mut cmd = jail.command(script);
    cmd.env("GITHUB_TOKEN", "ghp_operator_canary")
        .env("AWS_SECRET_ACCESS_KEY", "aws_operator_canary");
    let out = run_within(cmd, Duration::from_secs(60));
    assert_eq!(ok(&out).trim(), "gh= aws= mode= path=set");
    // Named: passed on (the caller's value, or the one given).
    let mut cmd = Command::new(BIN);
    cmd.arg("jail")
        .arg("--config")
        .arg(&jail.config)
        .args(["--agent", "ci", "--env", "GITHUB_TOKEN", "--env", "MODE=ci"])
        .args(["--", "sh", "-c", script])
        .env("POSTERN_HOME", jail.home.root())
        .env("GITHUB_TOKEN", "ghp_operator_canary")
        .env_remove("POSTERN_AGENT_TOKEN")
        .env_remove("POSTERN_CONFIG");
    let out = run_within(cmd, Duration::from_secs(60));
    assert_eq!(
        ok(&out).trim(),
        "gh=ghp_operator_canary aws= mode=ci path=set"
    );
    // The daemon's own secrets are refused by name, before CMD runs.
    let mut cmd = Command::new(BIN);
    cmd.arg("jail")
        .arg("--config")
        .arg(&jail.config)
        .args([
            "--agent",
            "ci",
            "--env",
            "POSTERN_VAULT_KEY",
            "--",
            "sh",
            "-c",
            "echo ran",
        ])
        .env("POSTERN_HOME", jail.home.root())
        .env("POSTERN_VAULT_KEY", VAULT_KEY)
        .env_remove("POSTERN_AGENT_TOKEN")
        .env_remove("POSTERN_CONFIG");
    let out = run_within(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(!stdout(&out).contains("ran"));
    assert!(
        stderr(&out).contains("--env POSTERN_VAULT_KEY"),
        "{}",
        stderr(&out)
    );
}

/// Issue 40: a jailed shell of the operator's uid moved the config's directory away and made
/// its own `postern.toml` for the next reload; and one jail renamed another's relay socket
/// and listened in its place. In the jail the config's directory and its ancestors are mount
/// points (no rename), the config file is one (no replace), and the directory where jails
/// keep their sockets shows only the jail's own.
#[test]
fn a_jailed_agent_can_neither_replace_the_config_nor_reach_another_jails_relay() {
    if !userns_allowed() {
        return;
    }
    let jail = Jail::start("");
    let config_before = std::fs::read_to_string(&jail.config).unwrap();
    // Another jail, running while the attacker looks.
    let mut other = jail.command("sleep 30");
    let mut other = other
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let root = PathBuf::from(format!("/tmp/postern-jail-{}", nix_uid()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while entries(&root) < 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let script = format!(
        r#"
d={dir}
mv "$d" "$d.gone" 2>/dev/null; echo "mv_dir=$?"
mv "$d/postern.toml" "$d/moved.toml" 2>/dev/null; echo "mv_file=$?"
rm -f "$d/postern.toml" 2>/dev/null; echo "rm_file=$?"
echo 'evil = true' > "$d/planted.toml" && mv -f "$d/planted.toml" "$d/postern.toml" 2>/dev/null; echo "swap=$?"
mv "$d/home" "$d/home.gone" 2>/dev/null; echo "mv_home=$?"
r=/tmp/postern-jail-$(id -u)
echo "jails=$(ls -A "$r" | wc -l)"
mv "$r" "$r.gone" 2>/dev/null; echo "mv_root=$?"
touch "$r/planted" 2>/dev/null; echo "touch_root=$?"
case "$SSL_CERT_FILE" in "$r"/*) echo "own=ok";; esac
test -S "$(dirname "$SSL_CERT_FILE")/relay.sock"; echo "own_socket=$?"
"#,
        dir = jail.config.parent().unwrap().display(),
    );
    let host_jails = entries(&root);
    let out = jail.run(&script);
    let _ = other.kill();
    let _ = other.wait();
    let text = ok(&out);
    assert!(
        host_jails >= 1,
        "the other jail's directory is there: {host_jails}"
    );
    for refused in [
        "mv_dir",
        "mv_file",
        "rm_file",
        "swap",
        "mv_home",
        "mv_root",
        "touch_root",
    ] {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{refused}=")))
            .unwrap_or_else(|| panic!("no {refused}= line: {text}"));
        assert_ne!(line, "0", "{refused} must fail in the jail: {text}");
    }
    assert!(text.contains("jails=1\n"), "only its own: {text}");
    assert!(text.contains("own=ok\nown_socket=0\n"), "{text}");
    assert_eq!(
        std::fs::read_to_string(&jail.config).unwrap(),
        config_before
    );
    let out = jail.daemon.cli(&["reload", "--json"], &[]);
    assert!(out.status.success(), "{}", stdout(&out));
}

fn nix_uid() -> u32 {
    std::fs::metadata("/proc/self").map_or(0, |m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    })
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

#[test]
fn curl_in_the_jail_reaches_a_route_through_the_proxy_with_the_credential_injected() {
    if !userns_allowed() {
        return;
    }
    let jail = Jail::start("");
    let out = jail.run("curl -sS --max-time 20 https://origin.test/v1/ping; echo");
    let text = ok(&out);
    let seen = json_lines(&text);
    assert_eq!(seen.len(), 1, "{text}\n{}", stderr(&out));
    assert_eq!(seen[0]["path"], "/v1/ping");
    // Injected at the egress hop; the reflection guard redacts it on the way back.
    assert_eq!(seen[0]["authorization"], "Bearer [postern:redacted]");
    assert!(!text.contains(CANARY));
    let list = jail.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let rec = &list["invocations"][0];
    assert_eq!(rec["agent"], "ci");
    assert_eq!(rec["route"], "origin");
    assert_eq!(rec["outcome"], "committed");
}

#[test]
fn clients_that_ignore_the_proxy_go_through_the_dns_stub_and_the_transparent_listeners() {
    if !userns_allowed() {
        return;
    }
    let jail = Jail::start("");
    let script = r#"
set -e
getent hosts origin.test
curl -sS --max-time 20 --noproxy '*' https://origin.test/curl; echo
curl -sS --max-time 20 --noproxy '*' http://plain.test/plain | head -1; echo
unset HTTPS_PROXY https_proxy HTTP_PROXY http_proxy
python3 -c 'import urllib.request, ssl, os
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
print(urllib.request.urlopen("https://origin.test/urllib", context=ctx).read().decode())'
python3 -c 'import requests; print(requests.get("https://origin.test/requests").text)'
NODE_USE_ENV_PROXY= node -e 'fetch("https://origin.test/node").then(r => r.text()).then(t => console.log(t))'
"#;
    let out = jail.run(script);
    let text = ok(&out);
    assert!(
        text.starts_with("127.0.0.1"),
        "the stub answers A with loopback: {text}"
    );
    let paths: Vec<String> = json_lines(&text)
        .iter()
        .map(|v| v["path"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        paths,
        ["/curl", "/urllib", "/requests", "/node"],
        "{text}\n{}",
        stderr(&out)
    );
    assert!(
        text.contains("GET /plain HTTP/1.1"),
        "port 80 reached the plain route: {text}"
    );
    // Each went through the proxy as the agent: the same routes, policy and journal.
    let list = jail.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let recs = list["invocations"].as_array().unwrap();
    assert_eq!(recs.len(), 5, "{list}");
    assert!(
        recs.iter()
            .all(|r| r["agent"] == "ci" && r["outcome"] == "committed"),
        "{list}"
    );
}

#[test]
fn nothing_but_postern_is_reachable_and_the_daemons_state_is_hidden() {
    if !userns_allowed() {
        return;
    }
    let jail = Jail::start("");
    let home = jail.home.root();
    let script = format!(
        r#"
curl -sS --max-time 5 --noproxy '*' http://127.0.0.2:1/ >/dev/null 2>&1; echo "other=$?"
curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:{admin}/healthz >/dev/null 2>&1; echo "admin=$?"
curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:{proxy}/ >/dev/null 2>&1; echo "daemon_proxy=$?"
echo "tls_unrouted=$(curl -s --max-time 5 --noproxy '*' -w ' %{{http_code}}' https://unrouted.test/)"
echo "plain_unrouted=$(curl -s --max-time 5 --noproxy '*' -o /dev/null -w '%{{http_code}}' http://unrouted.test/)"
python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); s.sendto(b"x", ("10.0.0.1", 53))' 2>/dev/null; echo "udp=$?"
cat {home}/vault.json 2>/dev/null; echo "vault=$?"
ls -A {home} | wc -l
umount {home} 2>/dev/null; echo "umount=$?"
cat {home}/vault.json 2>/dev/null; echo "vault_after_umount=$?"
wc -c < {config}
env | grep -c -E '^(POSTERN_VAULT_KEY|POSTERN_ADMIN_TOKEN|POSTERN_HOME|POSTERN_CONFIG)=' || true
env | grep -E '^(POSTERN_AGENT|POSTERN_AGENT_TOKEN|POSTERN_SSH_PROXY|NO_PROXY|https_proxy|ORIGIN_API_KEY)=' | sort
"#,
        admin = jail.admin_port,
        proxy = jail.proxy_port,
        home = home.display(),
        config = jail.config.display(),
    );
    let out = jail.run(&script);
    let text = ok(&out);
    for refused in [
        "other",
        "admin",
        "daemon_proxy",
        "udp",
        "vault",
        "vault_after_umount",
        "umount",
    ] {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{refused}=")))
            .unwrap_or_else(|| panic!("no {refused}= line: {text}"));
        assert_ne!(line, "0", "{refused} must fail in the jail: {text}");
    }
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("vault_after_umount="))
        .unwrap();
    assert_eq!(
        lines[at - 2],
        "0",
        "the state directory looks empty: {text}"
    );
    assert_eq!(lines[at + 1], "0", "the config file is empty: {text}");
    assert_eq!(lines[at + 2], "0", "none of the daemon's variables: {text}");
    assert_eq!(
        &lines[at + 3..],
        [
            "NO_PROXY=",
            "ORIGIN_API_KEY=postern:api",
            "POSTERN_AGENT=ci",
            format!("POSTERN_AGENT_TOKEN={TOKEN}").as_str(),
            "POSTERN_SSH_PROXY=127.0.0.1:2222",
            format!("https_proxy=http://ci:{TOKEN}@127.0.0.1:3128").as_str(),
        ],
        "{text}"
    );
    assert!(!text.contains(CANARY) && !text.contains(VAULT_KEY));
    assert!(
        text.contains("plain_unrouted=403\n"),
        "port 80 shows postern's refusal: {text}"
    );
    // Issue 40 (low 6): the unrouted name reached postern and was refused there, inside the
    // TLS the client expected: it reads postern's 403 envelope.
    let refused = text
        .lines()
        .find_map(|l| l.strip_prefix("tls_unrouted="))
        .unwrap_or_default();
    assert!(
        refused.contains("ROUTE_DENIED") && refused.ends_with(" 403"),
        "{text}"
    );
}

/// A descriptor the caller left open (the state directory, the config, a socket) does not
/// reach CMD: it would lead past the hiding mounts and the network namespace.
#[test]
fn descriptors_the_caller_left_open_do_not_reach_the_jailed_command() {
    if !userns_allowed() {
        return;
    }
    let jail = Jail::start("");
    let script = "for fd in 8 9; do [ -e /proc/self/fd/$fd ]; echo \"fd$fd=$?\"; done";
    let inner = jail.command(script);
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg("exec 8<\"$1\" 9<\"$2\"; shift 2; exec \"$@\"")
        .arg("bash")
        .arg(jail.home.root())
        .arg(&jail.config)
        .arg(inner.get_program())
        .args(inner.get_args());
    for (name, value) in inner.get_envs() {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let text = ok(&run_within(cmd, Duration::from_secs(90)));
    assert_eq!(text, "fd8=1\nfd9=1\n", "{text}");
}

/// CMD runs in a session of the jail's own: the caller's terminal is not its controlling
/// terminal, so it cannot push keystrokes (TIOCSTI) for the caller's shell to run later.
#[test]
fn the_jailed_command_has_a_session_of_its_own() {
    if !userns_allowed() {
        return;
    }
    let jail = Jail::start("");
    // Field 6 of /proc/self/stat is the session id, as the jail's PID namespace numbers it:
    // 0 for a session begun outside, 1 for the session the jail's init began.
    let text = ok(&jail.run("cut -d' ' -f6 /proc/self/stat"));
    assert_eq!(text.trim(), "1", "{text}");
}

/// Issue 40 (low 6 and 5): wget (GnuTLS) reads only the system CA store; a client calling
/// `https://host:8443` found nothing listening; plain `ssh host` bypassed postern. The jail's
/// bundle now covers the system CA stores, every port the agent's routes name is relayed, and
/// the system ssh_config sends ssh through `postern ssh-connect`.
#[test]
fn system_trust_route_ports_and_plain_ssh_lead_through_postern_in_the_jail() {
    if !userns_allowed() {
        return;
    }
    assert!(
        Command::new("wget").arg("--version").output().is_ok(),
        "wget must be installed (tests/run installs it)"
    );
    let origin = echo_origin();
    let extra = format!(
        "[[routes]]\nid = \"alt\"\nagents = [\"ci\"]\nmatch = {{ host = \"origin.test\", port = 8443 }}\n\
         resolve = \"{}\"\nupstream_ca = \"{}\"\n",
        origin.addr,
        origin.ca_file.display()
    );
    let jail = Jail::start(&extra);
    let script = r#"
unset HTTPS_PROXY https_proxy HTTP_PROXY http_proxy SSL_CERT_FILE CURL_CA_BUNDLE
wget -q -O - https://origin.test/wget; echo
curl -sS --max-time 20 https://origin.test:8443/alt; echo
ssh -G somewhere.example | grep -i '^proxycommand'
"#;
    let out = jail.run(script);
    let text = ok(&out);
    let paths: Vec<String> = json_lines(&text)
        .iter()
        .map(|v| v["path"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(paths, ["/wget", "/alt"], "{text}\n{}", stderr(&out));
    assert!(
        text.lines()
            .any(|l| l.starts_with("proxycommand ") && l.contains("ssh-connect %r %h %p")),
        "{text}"
    );
    drop(origin);
}

/// A private temp dir for one jail run, so "nothing left behind" is checked exactly.
fn own_tmpdir(cmd: &mut Command) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    cmd.env("TMPDIR", tmp.path());
    tmp
}

/// Whether any process runs with `marker` in its command line.
fn running(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
}

#[test]
fn exit_status_and_signals_pass_through_a_wrong_token_stops_before_cmd_and_nothing_stays() {
    if !userns_allowed() {
        return;
    }
    let jail = Jail::start("");
    let mut cmd = jail.command("dirname \"$SSL_CERT_FILE\"; exit 7");
    let tmp = own_tmpdir(&mut cmd);
    let out = run_within(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(7));
    let private = PathBuf::from(stdout(&out).trim());
    assert!(
        private.starts_with(format!("/tmp/postern-jail-{}", nix_uid())),
        "{private:?}"
    );
    let mut cmd = jail.command("kill -TERM $$");
    cmd.env("TMPDIR", tmp.path());
    assert_eq!(
        run_within(cmd, Duration::from_secs(60)).status.code(),
        Some(128 + 15)
    );

    // A signal sent to `postern jail` reaches CMD: a handler runs, an unhandled one ends it.
    let marker = format!("{}.{}", 40 + std::process::id() % 50, std::process::id());
    let script = format!("trap 'echo got-usr1; exit 3' USR1; echo ready; sleep {marker} & wait");
    for (signal, want) in [("-USR1", 3), ("-TERM", 128 + 15)] {
        let script = match signal {
            "-TERM" => format!("echo ready; exec sleep {marker}"),
            _ => script.clone(),
        };
        let mut cmd = jail.command(&script);
        cmd.env("TMPDIR", tmp.path());
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let pid = child.id().to_string();
        assert!(
            Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap()
                .success()
        );
        let started = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "jail ignored {signal}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(want), "{signal}");
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        if signal == "-USR1" {
            assert_eq!(rest.trim(), "got-usr1");
        }
    }
    // The USR1 run's shell left a background `sleep` when it exited: the jail's PID
    // namespace ended it with CMD.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !running(&format!("sleep {marker}")),
        "a process of CMD's outlived the jail"
    );

    // A wrong token: 125, the envelope on stderr, CMD never ran.
    let ran = tmp.path().join("ran");
    let mut cmd = jail.command(&format!("touch {}", ran.display()));
    cmd.env("TMPDIR", tmp.path())
        .env("POSTERN_AGENT_TOKEN", "not-the-token");
    let out = run_within(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let envelope: Value = stderr(&out)
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no envelope: {}", stderr(&out)));
    assert_eq!(envelope["error"]["code"], "AGENT_UNAUTHENTICATED");
    assert!(!ran.exists(), "CMD ran with a wrong token");
    assert!(!stderr(&out).contains("not-the-token"));

    // A state directory no daemon holds (a stray one): hiding it would leave the daemon's
    // own readable, so 125 before CMD.
    let stray = tmp.path().join("stray");
    std::fs::create_dir_all(stray.join("journal")).unwrap();
    std::fs::write(stray.join("journal").join("lock"), "").unwrap();
    for home in [stray.clone(), tmp.path().join("absent")] {
        let mut cmd = jail.command(&format!("touch {}", ran.display()));
        cmd.env("TMPDIR", tmp.path()).env("POSTERN_HOME", &home);
        let out = run_within(cmd, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("no running postern holds the state directory"),
            "{}",
            stderr(&out)
        );
        assert!(!ran.exists(), "CMD ran beside the daemon's readable state");
    }
    std::fs::remove_dir_all(&stray).unwrap();

    // No daemon: 125 before CMD too.
    let port = free_port();
    let text = std::fs::read_to_string(&jail.config)
        .unwrap()
        .replace(&format!(":{}\"", jail.proxy_port), &format!(":{port}\""));
    let other = tmp.path().join("other.toml");
    std::fs::write(&other, text).unwrap();
    let mut fixed = Command::new(BIN);
    fixed
        .args(["jail", "--config"])
        .arg(&other)
        .args(["--agent", "ci", "--", "touch"])
        .arg(&ran)
        .env("POSTERN_HOME", jail.home.root())
        .env("TMPDIR", tmp.path());
    let out = run_within(fixed, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr(&out).contains("cannot reach postern's proxy"),
        "{}",
        stderr(&out)
    );
    assert!(!ran.exists());

    // Nothing the jail made is left: no private directory, no socket.
    assert!(!private.exists(), "left behind: {private:?}");
}

#[test]
fn an_unprivileged_user_runs_the_jail_without_root() {
    if !userns_allowed() {
        return;
    }
    let have_setpriv = Command::new("setpriv").arg("--version").output().is_ok();
    if !have_setpriv || !nix_is_root() {
        eprintln!("note: needs root to drop to uid 65534 with setpriv; skipped");
        return;
    }
    let jail = Jail::start("");
    // The agent's user reads the config and passes through the state directory (0711) to
    // the public CA files; the vault stays the daemon's (0600).
    use std::os::unix::fs::PermissionsExt;
    let perm = |p: &Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    perm(jail.home.dir.path(), 0o755);
    perm(&jail.config, 0o644);
    let script = "id -u; curl -sS --max-time 20 https://origin.test/unprivileged; echo; \
                  curl -sS --max-time 20 --noproxy '*' https://origin.test/transparent; echo; \
                  cat $0 2>/dev/null; echo \"vault=$?\"";
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        BIN,
        "jail",
        "--config",
    ])
    .arg(&jail.config)
    .args(["--agent", "ci", "--", "sh", "-c", script])
    .arg(jail.home.root().join("vault.json"))
    .current_dir("/")
    .env("POSTERN_HOME", jail.home.root())
    .env_remove("POSTERN_VAULT_KEY")
    .env_remove("POSTERN_AGENT_TOKEN")
    .env("TMPDIR", "/tmp");
    let out = run_within(cmd, Duration::from_secs(90));
    let text = ok(&out);
    assert!(text.starts_with("65534\n"), "{text}");
    let paths: Vec<Value> = json_lines(&text)
        .iter()
        .map(|v| v["path"].clone())
        .collect();
    assert_eq!(
        paths,
        ["/unprivileged", "/transparent"],
        "{text}\n{}",
        stderr(&out)
    );
    assert!(text.contains("vault=1"), "{text}");
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[test]
fn git_over_https_goes_through_the_jails_proxy() {
    if !userns_allowed() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    crate::git::seed(work.path());
    let origin = crate::git::bridge(work.path());
    let route = format!(
        "[[routes]]\nid = \"git\"\nagents = [\"ci\"]\n\
         match = {{ host = \"git.test\", port = {port}, path_prefix = \"/team/\" }}\n\
         resolve = \"127.0.0.1:{port}\"\nupstream_ca = \"{ca}\"\n",
        port = origin.port,
        ca = work.path().join("ca.pem").display()
    );
    let jail = Jail::start(&route);
    let clone = work.path().join("clone");
    let out = jail.run(&format!(
        "GIT_TERMINAL_PROMPT=0 git clone -q https://git.test:{}/team/app.git {} && cat {}/README",
        origin.port,
        clone.display(),
        clone.display()
    ));
    assert_eq!(ok(&out), "first\n", "{}", stderr(&out));
    let list = jail.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let recs = list["invocations"].as_array().unwrap();
    assert!(
        recs.iter().any(|r| r["route"] == "git"
            && r["target"]
                .as_str()
                .is_some_and(|t| t.ends_with("/git-upload-pack"))),
        "{list}"
    );
}

#[test]
fn ssh_in_the_jail_reaches_a_target_through_the_jails_2222() {
    if !userns_allowed() {
        return;
    }
    let (proxy, ssh) = (free_port(), free_port());
    let sshd = crate::sshd::Sshd::start();
    let home = Home::new();
    let known = sshd.known_hosts(home.dir.path(), "app1.internal");
    let text = crate::ssh::target_config(&sshd.user, sshd.port, &known, "")
        .replacen(
            "[proxy]\nlisten = \"127.0.0.1:0\"",
            &format!("[proxy]\nlisten = \"127.0.0.1:{proxy}\""),
            1,
        )
        .replacen(
            "[ssh]\nlisten = \"127.0.0.1:0\"",
            &format!("[ssh]\nlisten = \"127.0.0.1:{ssh}\""),
            1,
        );
    let private = sshd.client_key.private.clone();
    let out = secret_set(
        &home,
        "deploy-ssh-key",
        &private,
        Some(crate::ssh::VAULT_KEY),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let daemon = Daemon::start_with(
        &home,
        Some(&text),
        &[("POSTERN_VAULT_KEY", crate::ssh::VAULT_KEY)],
    );
    let config = home.dir.path().join("postern.toml");
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains(&format!(":{ssh}\""))
    );
    let script = format!(
        "eval \"$GIT_SSH_COMMAND\" -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o ConnectTimeout=10 \
         {}@app1.internal echo hello-from-the-target",
        sshd.user
    );
    let mut cmd = Command::new(BIN);
    cmd.arg("jail")
        .arg("--config")
        .arg(&config)
        .args(["--agent", "ci", "--", "sh", "-c", &script])
        .env("POSTERN_HOME", &daemon.home)
        .env("POSTERN_AGENT_TOKEN", crate::ssh::TOKEN)
        .env_remove("POSTERN_CONFIG");
    let out = run_within(cmd, Duration::from_secs(90));
    assert_eq!(ok(&out), "hello-from-the-target\n", "{}", stderr(&out));
    assert!(!stderr(&out).contains(&crate::ssh::canary(&private)));
    let list = daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(list["invocations"][0]["protocol"], "ssh", "{list}");
    assert_eq!(list["invocations"][0]["outcome"], "committed", "{list}");
}

#[test]
fn host_processes_are_out_of_sight_and_their_environments_and_roots_stay_closed() {
    if !userns_allowed() {
        return;
    }
    let jail = Jail::start("");
    // The operator's shell holds the vault key; it is the same user and dumpable. The kernel
    // already refuses CMD its environ and /proc/PID/root (CMD is in a child user namespace);
    // the jail's own /proc also keeps host processes and their command lines out of sight.
    let marker = format!("jail-proc-marker-{}", std::process::id());
    let inner = "grep -l \"$0\" /proc/[0-9]*/environ 2>/dev/null | wc -l; \
                 ls /proc | grep -c '^[0-9]'; \
                 cat /proc/[0-9]*/root/\"$1\"/vault.json 2>/dev/null | wc -c";
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "\"$@\"; :", "wrapper"])
        .arg(BIN)
        .arg("jail")
        .arg("--config")
        .arg(&jail.config)
        .args(["--agent", "ci", "--", "sh", "-c", inner, &marker])
        .arg(jail.home.root())
        .env("POSTERN_HOME", jail.home.root())
        .env("POSTERN_VAULT_KEY", &marker)
        .env_remove("POSTERN_AGENT_TOKEN")
        .env_remove("POSTERN_CONFIG");
    let out = run_within(cmd, Duration::from_secs(60));
    let text = ok(&out);
    let counts: Vec<u32> = text.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(
        counts[0], 0,
        "a host process's environment was readable: {text}"
    );
    assert!(
        counts[1] <= 4,
        "only the jail's own processes are in /proc: {text}"
    );
    assert_eq!(
        counts[2], 0,
        "the state directory was reachable through /proc: {text}"
    );
}

#[test]
fn where_user_namespaces_are_refused_the_jail_says_what_to_do_and_exits_125_before_cmd() {
    if !userns_allowed() {
        return;
    }
    let jail = Jail::start("");
    let ran = jail.home.dir.path().join("ran");
    // A user namespace whose limit for further ones is 0 refuses them as such a system does.
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-Ur",
        "sh",
        "-c",
        "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"",
        "refuser",
    ])
    .arg(BIN)
    .arg("jail")
    .arg("--config")
    .arg(&jail.config)
    .args(["--agent", "ci", "--", "touch"])
    .arg(&ran)
    .env("POSTERN_HOME", jail.home.root())
    .env_remove("POSTERN_AGENT_TOKEN")
    .env_remove("POSTERN_CONFIG");
    let out = run_within(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("refuses unprivileged user namespaces"),
        "{err}"
    );
    assert!(err.contains("sysctl"), "says what to change: {err}");
    assert!(!ran.exists(), "CMD ran");
}

/// SPEC §3.7 through the jail's relay: the twin's close reaches postern through two relay
/// hops, the resend through the same ones on a new connection. Each resend right after its
/// twin's agent left is `ATTEMPT_IN_PROGRESS`, never sent a second time.
#[test]
fn a_resend_through_the_jails_relay_right_after_its_twin_was_left_is_not_sent_again() {
    if !userns_allowed() {
        return;
    }
    const TRIALS: usize = 15;
    let slow = crate::origins::slow_head(Duration::from_secs(4), "slow");
    let route = format!(
        "[[routes]]\nid = \"pay\"\nagents = [\"ci\"]\n\
         match = {{ scheme = \"http\", host = \"pay.test\", port = 80 }}\n\
         resolve = \"127.0.0.1:{}\"\nallow_private = true\n",
        slow.port()
    );
    let jail = Jail::start(&route);
    let script = format!(
        r#"python3 - <<'PY'
import base64, os, socket, time, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["http_proxy"])
auth = base64.b64encode(f"{{proxy.username}}:{{proxy.password}}".encode()).decode()
def request(n):
    body = f'{{{{"trial":{{n}}}}}}'
    return (f"POST http://pay.test/v1/charges HTTP/1.1\r\nHost: pay.test\r\n"
            f"Proxy-Authorization: Basic {{auth}}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {{len(body)}}\r\n\r\n{{body}}").encode()
for n in range({TRIALS}):
    twin = socket.create_connection((proxy.hostname, proxy.port))
    twin.sendall(request(n))
    time.sleep(0.3)
    twin.close()
    resend = socket.create_connection((proxy.hostname, proxy.port))
    resend.sendall(request(n))
    resend.settimeout(10)
    print("trial", n, resend.recv(12).decode(errors="replace"), flush=True)
    resend.close()
PY"#
    );
    let out = jail.run(&script);
    let text = ok(&out);
    let answers: Vec<&str> = text.lines().filter(|l| l.starts_with("trial")).collect();
    assert_eq!(answers.len(), TRIALS, "{text}\n{}", stderr(&out));
    let sent_again: Vec<_> = answers
        .iter()
        .filter(|l| !l.ends_with("HTTP/1.1 409"))
        .collect();
    assert!(
        sent_again.is_empty(),
        "resends not held back: {sent_again:?}"
    );
    assert_eq!(slow.hits(), TRIALS, "each trial reached the origin once");
}
