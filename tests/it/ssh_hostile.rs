//! Hostile upstream SSH servers (russh's server API, one per fault) behind postern, driven by
//! the real OpenSSH client through `postern ssh-connect`: what the agent's `ssh` saw and what
//! the journal recorded must agree with SPEC §4. Also git over SSH against the real sshd.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use russh::keys::ssh_key::{Algorithm, PrivateKey};
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelId};
use serde_json::Value;
use tokio::sync::Notify;

use crate::ssh::{Front, TOKEN, canary, envelope, target_config};
use crate::sshd::keygen;
use crate::support::{BIN, Home, stderr};

/// What the upstream does to an `exec`.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Accepts, sends some stdout, closes the channel with no exit-status.
    ExitsWithoutStatus,
    /// Answers the exec with channel failure.
    RejectsExec,
    /// Never answers the exec, sends nothing, keeps the channel open.
    NeverAnswersExec,
    /// Accepts, sends a line, then nothing while the channel stays open.
    GoesSilentMidOutput,
    /// Accepts, sends a line and exit-status 0, then drops the TCP connection.
    StatusThenAbort,
}

struct Hostile {
    fault: Fault,
    /// Aborts this connection's TCP socket.
    kill: Arc<Notify>,
}

impl russh::server::Handler for Hostile {
    type Error = russh::Error;

    async fn auth_publickey(
        &mut self,
        _: &str,
        _: russh::server::VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        mut channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _: &mut Session,
    ) -> Result<(), Self::Error> {
        reply.accept().await;
        // Drain it, so the session never stalls on a full channel buffer.
        tokio::spawn(async move { while channel.wait().await.is_some() {} });
        Ok(())
    }

    async fn exec_request(
        &mut self,
        id: ChannelId,
        _command: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match self.fault {
            Fault::ExitsWithoutStatus => {
                session.channel_success(id)?;
                session.data(id, &b"partial output\n"[..])?;
                session.eof(id)?;
                session.close(id)?;
            }
            Fault::RejectsExec => session.channel_failure(id)?,
            Fault::NeverAnswersExec => {}
            Fault::GoesSilentMidOutput => {
                session.channel_success(id)?;
                session.data(id, &b"first line\n"[..])?;
            }
            Fault::StatusThenAbort => {
                session.channel_success(id)?;
                session.data(id, &b"done\n"[..])?;
                session.exit_status_request(id, 0)?;
                let kill = self.kill.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    kill.notify_one();
                });
            }
        }
        Ok(())
    }
}

/// A hostile upstream on a loopback port, with its host key in a known_hosts file.
struct HostileServer {
    port: u16,
    known_hosts: PathBuf,
    _runtime: tokio::runtime::Runtime,
}

impl HostileServer {
    fn start(fault: Fault, dir: &Path) -> Self {
        let host_key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
        let public = host_key.public_key().to_openssh().unwrap();
        let known_hosts = dir.join("hostile_known_hosts");
        std::fs::write(&known_hosts, format!("app1.internal {public}\n")).unwrap();
        let config = Arc::new(russh::server::Config {
            keys: vec![host_key],
            auth_rejection_time: Duration::ZERO,
            auth_rejection_time_initial: Some(Duration::ZERO),
            ..Default::default()
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        runtime.spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let config = config.clone();
                let kill = Arc::new(Notify::new());
                // The session talks over a pipe; the pump owns the socket, so `kill`
                // drops the TCP connection under the session's feet.
                let (ours, mut theirs) = tokio::io::duplex(1 << 16);
                let k = kill.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut tcp, &mut theirs) => {}
                        () = k.notified() => {}
                    }
                });
                tokio::spawn(async move {
                    let handler = Hostile { fault, kill };
                    if let Ok(running) = russh::server::run_stream(config, ours, handler).await {
                        let _ = running.await;
                    }
                });
            }
        });
        Self {
            port,
            known_hosts,
            _runtime: runtime,
        }
    }
}

/// postern in front of a hostile upstream with `fault`; `extra` goes into the target.
fn front(fault: Fault, extra: &str) -> (Front, HostileServer) {
    let home = Home::new();
    let server = HostileServer::start(fault, home.dir.path());
    let client = keygen(home.dir.path(), "client_key");
    let text = target_config("agent", server.port, &server.known_hosts, extra);
    let f = Front::serve(home, &text, "agent".into(), client.private, None);
    (f, server)
}

/// The vault's private key (every base64 line of its PEM) shows in none of: the agent's
/// output, `actions list`, `actions show` and `result` of every record, the daemon's log.
fn assert_no_key_anywhere(f: &Front, agent: &[&Output]) {
    let mut text = String::new();
    for out in agent {
        text.push_str(&String::from_utf8_lossy(&out.stdout));
        text.push_str(&stderr(out));
    }
    text.push_str(&f.all_text());
    for r in records(f) {
        let id = r["invocation_id"].as_str().unwrap_or("").to_owned();
        for args in [
            ["actions", "show", &id, "--json"],
            ["result", &id, "--json", ""],
        ] {
            let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
            let out = f.daemon.cli(&args, &[]);
            text.push_str(&String::from_utf8_lossy(&out.stdout));
            text.push_str(&stderr(&out));
        }
    }
    let lines: Vec<&str> = f
        .client_private
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .collect();
    assert!(!lines.is_empty());
    assert_eq!(canary(&f.client_private), lines[0]);
    for line in lines {
        assert!(!text.contains(line), "a line of the vault key leaked");
    }
}

fn records(f: &Front) -> Vec<Value> {
    let out = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    list["invocations"].as_array().cloned().unwrap_or_default()
}

/// The record of the one exec, with its events.
fn the_exec(f: &Front) -> Value {
    let list = records(f);
    let execs: Vec<&Value> = list.iter().filter(|r| r["method"] == "exec").collect();
    assert_eq!(execs.len(), 1, "one exec record: {list:?}");
    let id = execs[0]["invocation_id"].as_str().unwrap();
    let out = f.daemon.cli(&["actions", "show", id, "--json"], &[]);
    serde_json::from_slice(&out.stdout).unwrap()
}

fn kinds(shown: &Value) -> Vec<String> {
    shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// `a` comes before `b` in the events.
fn before(kinds: &[String], a: &str, b: &str) {
    let i = kinds.iter().position(|k| k == a);
    let j = kinds.iter().position(|k| k == b);
    assert!(
        matches!((i, j), (Some(i), Some(j)) if i < j),
        "{a} before {b}: {kinds:?}"
    );
}

/// What every unresolved exec shares: the agent saw exit 255 and the envelope of the record,
/// the record is `unknown` after `DISPATCH_STARTED`, nothing resolved it, no exit status.
fn assert_unknown(f: &Front, out: &Output, code: &str) -> Value {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(255), "no exit-status: 255: {err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["code"], code, "{err}");
    assert_eq!(env["error"]["phase"], "remote_execution", "{err}");
    assert_eq!(env["error"]["outcome"], "unknown", "{err}");
    assert_eq!(
        env["error"]["retry"], "reconcile",
        "exec is not idempotent: {err}"
    );
    let r = the_exec(f);
    assert_eq!(r["invocation_id"], env["invocation_id"], "{r}");
    assert_eq!(r["code"], code, "{r}");
    assert_eq!(r["phase"], "remote_execution", "{r}");
    assert_eq!(r["outcome"], "unknown", "{r}");
    assert_eq!(r["retry"], "reconcile", "{r}");
    assert!(
        r["result"].is_null() || r["result"]["exit_status"].is_null(),
        "no exit status is fabricated: {r}"
    );
    let k = kinds(&r);
    before(&k, "PREFLIGHT_VALIDATED", "DISPATCH_STARTED");
    before(&k, "DISPATCH_STARTED", "FAILED");
    assert!(!k.iter().any(|k| k == "RESULT_COMMITTED"), "{k:?}");
    assert_no_key_anywhere(f, &[out]);
    r
}

#[test]
fn exits_without_status() {
    let (f, _server) = front(Fault::ExitsWithoutStatus, "");
    let out = f.ssh(TOKEN, &["--", "", "make deploy"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "partial output\n",
        "what the remote sent is relayed: {}",
        stderr(&out)
    );
    let r = assert_unknown(&f, &out, "REMOTE_RESULT_INCOMPLETE");
    // SPEC §1.8: the exec was answered (channel success), its result is not complete.
    let env = envelope(&stderr(&out));
    for evidence in [&env["evidence"], &r["evidence"]] {
        assert_eq!(evidence["request_complete"], true, "{evidence}");
        assert_eq!(evidence["response_headers_received"], true, "{evidence}");
        assert_eq!(evidence["response_complete"], false, "{evidence}");
    }
}

#[test]
fn rejects_exec() {
    let (f, _server) = front(Fault::RejectsExec, "");
    let out = f.ssh(TOKEN, &["--", "", "make deploy"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert!(out.stdout.is_empty(), "{err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["code"], "REMOTE_EXEC_REJECTED", "{err}");
    assert_eq!(env["error"]["outcome"], "rejected", "{err}");
    assert_eq!(env["error"]["retry"], "after_correction", "{err}");
    let r = the_exec(&f);
    assert_eq!(r["code"], "REMOTE_EXEC_REJECTED", "{r}");
    assert_eq!(r["phase"], "remote_execution", "{r}");
    assert_eq!(r["outcome"], "rejected", "{r}");
    assert_eq!(r["retry"], "after_correction", "{r}");
    let k = kinds(&r);
    before(&k, "DISPATCH_STARTED", "FAILED");
    assert_no_key_anywhere(&f, &[&out]);
}

#[test]
fn never_answers_exec() {
    let (f, _server) = front(Fault::NeverAnswersExec, "response_timeout = \"1s\"");
    let started = std::time::Instant::now();
    let out = f.ssh(TOKEN, &["--", "", "make deploy"]);
    assert!(started.elapsed() < Duration::from_secs(20), "bounded");
    assert!(out.stdout.is_empty(), "{}", stderr(&out));
    let r = assert_unknown(&f, &out, "REMOTE_TIMEOUT");
    assert_eq!(r["envelope"]["error"]["code"], "REMOTE_TIMEOUT", "{r}");
    // Sent, never answered: the envelope tells the two apart.
    let evidence = &r["envelope"]["evidence"];
    assert_eq!(evidence["request_complete"], true, "{r}");
    assert_eq!(evidence["response_headers_received"], false, "{r}");
}

#[test]
fn goes_silent_mid_output() {
    let (f, _server) = front(Fault::GoesSilentMidOutput, "idle_timeout = \"1s\"");
    let out = f.ssh(TOKEN, &["--", "", "tail -f log"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "first line\n",
        "{}",
        stderr(&out)
    );
    assert_unknown(&f, &out, "REMOTE_RESULT_INCOMPLETE");
}

#[test]
fn status_then_abort() {
    let (f, _server) = front(Fault::StatusThenAbort, "");
    let out = f.ssh(TOKEN, &["--", "", "make deploy"]);
    let err = stderr(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n", "{err}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "the remote's exit status: {err}"
    );
    assert!(!err.contains("postern: "), "{err}");
    let r = the_exec(&f);
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["phase"], "remote_execution", "{r}");
    assert_eq!(r["retry"], "never", "{r}");
    assert!(r["code"].is_null(), "{r}");
    assert_eq!(r["result"]["exit_status"], 0, "{r}");
    let k = kinds(&r);
    before(&k, "DISPATCH_STARTED", "RESULT_COMMITTED");
    assert!(!k.iter().any(|k| k == "FAILED"), "{k:?}");
    let id = r["invocation_id"].as_str().unwrap();
    let result = f.daemon.cli(&["result", id, "--json"], &[]);
    let result: Value = serde_json::from_slice(&result.stdout).unwrap();
    assert_eq!(result["exit_status"], 0, "{result}");
    assert_eq!(result["stdout_base64"], "ZG9uZQo=", "{result}");
    assert_eq!(
        result["complete"], false,
        "the connection broke before the channel closed: {result}"
    );
    assert_no_key_anywhere(&f, &[&out]);
}

/// `git` with the agent's environment: its ssh goes through `postern ssh-connect`.
pub fn git(f: &Front, dir: &Path, args: &[&str]) -> Output {
    let ssh = format!(
        "ssh -F /dev/null -o 'ProxyCommand={BIN} ssh-connect %r %h %p' \
         -o 'UserKnownHostsFile={}' -o StrictHostKeyChecking=yes -o BatchMode=yes \
         -o ConnectTimeout=10 -o IdentitiesOnly=yes",
        f.known_hosts
    );
    Command::new("git")
        .args([
            "-c",
            "user.name=Agent",
            "-c",
            "user.email=agent@example.invalid",
        ])
        .args(["-c", "init.defaultBranch=main", "-c", "protocol.version=2"])
        .args(args)
        .current_dir(dir)
        .env("GIT_SSH_COMMAND", ssh)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("POSTERN_SSH_PROXY", &f.ssh_addr)
        .env("POSTERN_AGENT", "ci")
        .env("POSTERN_AGENT_TOKEN", TOKEN)
        .env_remove("POSTERN_CONFIG")
        .output()
        .expect("git must be installed (tests/run installs git)")
}

pub fn ok(out: &Output) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(out));
    assert!(out.status.success(), "{text}");
    text
}

#[test]
fn git_clone_and_push_over_ssh_through_postern() {
    let f = Front::start("");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bare = d.join("repo.git");
    ok(&git(
        &f,
        d,
        &["init", "--bare", "-q", bare.to_str().unwrap()],
    ));
    // Seed the bare repo directly (no postern).
    let seed = d.join("seed");
    ok(&git(&f, d, &["init", "-q", seed.to_str().unwrap()]));
    std::fs::write(seed.join("README"), "seed\n").unwrap();
    ok(&git(&f, &seed, &["add", "README"]));
    ok(&git(&f, &seed, &["commit", "-q", "-m", "seed"]));
    ok(&git(
        &f,
        &seed,
        &["push", "-q", bare.to_str().unwrap(), "HEAD:refs/heads/main"],
    ));

    let url = format!("ssh://{}@app1.internal{}", f.user, bare.display());
    let clone = git(&f, d, &["clone", &url, "work"]);
    ok(&clone);
    let work = d.join("work");
    assert_eq!(
        std::fs::read_to_string(work.join("README")).unwrap(),
        "seed\n"
    );
    std::fs::write(work.join("change"), "through postern\n").unwrap();
    ok(&git(&f, &work, &["add", "change"]));
    ok(&git(&f, &work, &["commit", "-q", "-m", "agent change"]));
    let push = git(&f, &work, &["push", "origin", "HEAD:main"]);
    ok(&push);
    let pushed = ok(&git(&f, &work, &["rev-parse", "HEAD"]));
    let in_bare = ok(&git(
        &f,
        d,
        &["--git-dir", bare.to_str().unwrap(), "rev-parse", "main"],
    ));
    assert_eq!(
        pushed.trim(),
        in_bare.trim(),
        "the pushed commit is in the bare repo"
    );

    let list = records(&f);
    let commands: Vec<String> = list
        .iter()
        .map(|r| r["command"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(
        commands.iter().any(|c| c.starts_with("git-upload-pack ")),
        "{commands:?}"
    );
    assert!(
        commands.iter().any(|c| c.starts_with("git-receive-pack ")),
        "{commands:?}"
    );
    assert_eq!(
        commands.len(),
        2,
        "one exec each, nothing retried: {commands:?}"
    );
    for r in &list {
        assert_eq!(r["protocol"], "ssh", "{r}");
        assert_eq!(r["method"], "exec", "{r}");
        assert_eq!(r["outcome"], "committed", "{r}");
        assert_eq!(r["result"]["exit_status"], 0, "{r}");
        assert!(r["code"].is_null(), "{r}");
    }
    assert_no_key_anywhere(&f, &[&clone, &push]);
}

/// SPEC §5.4: a target's `response_timeout` is the exec's wall time until its exit status.
#[test]
fn a_command_running_past_response_timeout_is_a_remote_timeout() {
    let f = Front::start("response_timeout = \"1s\"\nidle_timeout = \"10s\"");
    let out = f.ssh(TOKEN, &["--", "", "echo start; sleep 3; echo end"]);
    let err = stderr(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "start\n", "{err}");
    assert_unknown(&f, &out, "REMOTE_TIMEOUT");
    assert_no_key_anywhere(&f, &[&out]);
}

/// Before the exec is answered only `response_timeout` applies (SPEC §5.5: the idle
/// timeout is a gap in output after the head).
#[test]
fn never_answers_exec_is_a_response_timeout_even_with_a_shorter_idle_timeout() {
    let (f, _server) = front(
        Fault::NeverAnswersExec,
        "response_timeout = \"2s\"\nidle_timeout = \"1s\"",
    );
    let out = f.ssh(TOKEN, &["--", "", "make deploy"]);
    assert_unknown(&f, &out, "REMOTE_TIMEOUT");
}

/// One agent keeps at most `max_busy_per_agent` connections busy, SSH sessions included:
/// past it the next session is refused in the preamble, before any login upstream.
#[test]
fn an_agent_over_max_busy_per_agent_gets_no_more_ssh_sessions() {
    let f = crate::ssh::Front::start_with(
        "",
        |text| text.replacen("[proxy]\n", "[proxy]\nmax_busy_per_agent = 1\n", 1),
        &[],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("running");
    let hold = format!("touch {}; sleep 3", marker.display());
    let mut first = f
        .ssh_command(crate::ssh::TOKEN, &["-n", "--", "", &hold])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ssh");
    for _ in 0..200 {
        if marker.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(marker.exists(), "the first session runs");
    let second = f.ssh(crate::ssh::TOKEN, &["-n", "--", "", "echo hi"]);
    let said = crate::support::stderr(&second);
    let _ = first.wait();
    assert_ne!(second.status.code(), Some(0), "{said}");
    let env = crate::ssh::envelope(&said);
    assert_eq!(env["error"]["code"], "JOURNAL_UNAVAILABLE", "{said}");
    assert!(said.contains("max_busy_per_agent"), "{said}");
    let again = f.ssh(crate::ssh::TOKEN, &["-n", "--", "", "echo hi"]);
    assert_eq!(again.status.code(), Some(0), "the place came back");
}

/// A remote that answers TCP with an endless non-SSH banner: the failure names the stage it
/// happened in (the SSH version exchange), not a refused connection, and nothing was sent.
#[test]
fn a_remote_flooding_its_banner_fails_in_the_ssh_transport_stage() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(mut tcp) = tcp else { return };
            std::thread::spawn(move || {
                use std::io::Write;
                let line = format!("{}\r\n", "junk ".repeat(40));
                let started = std::time::Instant::now();
                while started.elapsed() < std::time::Duration::from_secs(20) {
                    if tcp.write_all(line.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let home = Home::new();
    let client = keygen(home.dir.path(), "client_key");
    let known = home.dir.path().join("known_hosts");
    std::fs::write(&known, "").unwrap();
    let text = target_config("agent", port, &known, "");
    let f = Front::serve(home, &text, "agent".into(), client.private, None);
    let out = f.ssh(TOKEN, &["--", "", "echo hi"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(255), "{err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["phase"], "connection_setup", "{err}");
    assert_eq!(env["error"]["outcome"], "not_attempted", "{err}");
    let message = env["error"]["message"].as_str().unwrap_or("");
    assert!(!message.contains("refused"), "the remote answered: {err}");
    assert!(
        message.contains("ssh_transport"),
        "the message names the stage: {err}"
    );
    let attempts = env["evidence"]["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let last = attempts.last().cloned().unwrap_or_default();
    assert_eq!(last["stage"], "ssh_transport", "{err}");
    assert_eq!(env["evidence"]["dispatch_started"], false, "{err}");
}
