//! Crash matrix over real SSH execs: the OpenSSH client through `postern ssh-connect` to a
//! real sshd, a command that appends a line to a counter file before it prints and exits 3,
//! `POSTERN_CRASH_AFTER` for every durable event kind an exec writes, a restart on the same
//! home, then the recovered record, `decide`, the stored SSH result and the counter.
//!
//! An exec writes ACTION_ACCEPTED, PREFLIGHT_VALIDATED and CREDENTIAL_AUTHORIZED in one write
//! (with APPROVAL_REQUESTED on an approval target), the connection stages (CONNECT_ATTEMPT)
//! with DISPATCH_STARTED, and REMOTE_RESPONSE_COMPLETE with RESULT_COMMITTED and its result;
//! it has no REQUEST_SENT or REMOTE_RESPONSE_STARTED. An exec the remote refuses (a
//! scripted russh peer answers it with channel failure) ends in one FAILED write from the
//! remote's own answer (`rejected`); one killed by a signal commits with `exit_signal` and no
//! exit status.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::crash::{
    Answer, Expect, answer_held, before_dispatch, check_recovered, delivered, denied,
    failed_after_dispatch, failed_before_dispatch, fetch, restarted,
};
use crate::ssh::{Front, TOKEN, VAULT_KEY, canary, target_config};
use crate::ssh_peer::Peer;
use crate::sshd::{Sshd, keygen};
use crate::support::{Daemon, Home, run_cells, secret_set, stderr, stdout};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Run {
    /// Counts, prints `out` and `err`, exits 3.
    Exits,
    /// Counts, then sleeps past the target's one-second response timeout.
    OutlivesItsTimeout,
    /// Counts, then sleeps; the agent's client is killed meanwhile.
    AgentLeaves,
    /// The target's known_hosts names another key: refused before any login.
    WrongHostKey,
    /// Counts, prints `out` and `err`, then kills its shell with SIGTERM: `exit-signal`.
    Signalled,
    /// A scripted peer refuses the exec (channel failure): nothing runs.
    Refused,
}

#[derive(Debug)]
struct Cell {
    crash_after: &'static str,
    /// The target needs an approval; the operator's answer (none to a crash at the hold).
    approval: Option<Answer>,
    run: Run,
    expect: Expect,
}

const fn cell(crash_after: &'static str, expect: Expect) -> Cell {
    Cell {
        crash_after,
        approval: None,
        run: Run::Exits,
        expect,
    }
}

/// The remote refused the dispatched exec before the crash: `rejected` stands, with no
/// result stored (the refusal is all the remote said).
const fn exec_rejected() -> Expect {
    Expect {
        code: Some("REMOTE_EXEC_REJECTED"),
        phase: "remote_execution",
        outcome: "rejected",
        retry: "after_correction",
        verdict: "RETURN_RECORDED_OUTCOME",
        effects: 0,
        recovered: false,
    }
}

fn cells() -> Vec<Cell> {
    let set_up = before_dispatch("connection_setup");
    vec![
        cell("ACTION_ACCEPTED", set_up),
        cell("PREFLIGHT_VALIDATED", set_up),
        cell("CREDENTIAL_AUTHORIZED", set_up),
        Cell {
            approval: Some(Answer::Approves),
            ..cell(
                "APPROVAL_REQUESTED",
                before_dispatch("credential_injection"),
            )
        },
        Cell {
            approval: Some(Answer::Approves),
            ..cell("APPROVAL_GRANTED", set_up)
        },
        Cell {
            approval: Some(Answer::Denies),
            ..cell("APPROVAL_DENIED", denied())
        },
        // The stages (the login included) ride with DISPATCH_STARTED; no exec was sent.
        cell("CONNECT_ATTEMPT", restarted(0)),
        cell("DISPATCH_STARTED", restarted(0)),
        cell("REMOTE_RESPONSE_COMPLETE", fetch()),
        cell("RESULT_COMMITTED", fetch()),
        cell("RESULT_DELIVERED", delivered()),
        Cell {
            run: Run::OutlivesItsTimeout,
            ..cell("FAILED", failed_after_dispatch("REMOTE_TIMEOUT", 1))
        },
        // CALLER_CANCELLED leaves the exec running: recovery settles it.
        Cell {
            run: Run::AgentLeaves,
            ..cell("FAILED", restarted(1))
        },
        Cell {
            run: Run::WrongHostKey,
            ..cell(
                "FAILED",
                Expect {
                    retry: "after_correction",
                    verdict: "STOP_FOR_CORRECTION",
                    ..failed_before_dispatch("SSH_HOST_KEY_MISMATCH", "connection_setup")
                },
            )
        },
        // The refusal is the remote's answer, written (and synced) as one FAILED.
        Cell {
            run: Run::Refused,
            ..cell("FAILED", exec_rejected())
        },
        Cell {
            run: Run::Signalled,
            ..cell("RESULT_COMMITTED", fetch())
        },
        Cell {
            run: Run::Signalled,
            ..cell("RESULT_DELIVERED", delivered())
        },
    ]
}

fn name(c: &Cell) -> String {
    let mut n = format!("{} (ssh, {:?}", c.crash_after, c.run);
    match c.approval {
        Some(Answer::Approves) => n.push_str(", approval"),
        Some(Answer::Denies) => n.push_str(", approval denied"),
        None => {}
    }
    n + ")"
}

/// Lines the remote command appended: how often it ran.
fn runs(counter: &Path) -> usize {
    std::fs::read_to_string(counter).map_or(0, |t| t.lines().count())
}

fn command(run: Run, counter: &Path) -> String {
    let count = format!("echo ran >> {}", counter.display());
    match run {
        Run::Exits | Run::WrongHostKey => format!("{count}; echo out; echo err >&2; exit 3"),
        Run::OutlivesItsTimeout | Run::AgentLeaves => format!("{count}; sleep 10"),
        Run::Signalled => format!("{count}; echo out; echo err >&2; kill -TERM $$"),
        Run::Refused => "refuse".into(),
    }
}

/// Where a cell's exec goes and how its side effects are counted.
enum Remote {
    /// The shared sshd; the command appends to this counter file.
    Sshd(PathBuf),
    /// A scripted peer of the cell's own, which counts what it ran.
    Peer(Peer),
}

impl Remote {
    fn runs(&self) -> usize {
        match self {
            Self::Sshd(counter) => runs(counter),
            Self::Peer(peer) => peer.ran(),
        }
    }
}

/// The agent's ssh client: its exit code and stdout.
fn agent(front: &Front, command: String, leaves: Option<PathBuf>) -> JoinHandle<(i32, String)> {
    let mut cmd = front.ssh_command(TOKEN, &["--", "", &command]);
    std::thread::spawn(move || {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ssh");
        if let Some(counter) = leaves {
            let deadline = Instant::now() + Duration::from_secs(10);
            while runs(&counter) == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
        }
        let out = child.wait_with_output().expect("ssh");
        let code = out.status.code().unwrap_or(-1);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if code == 255 && text.is_empty() && !stderr(&out).is_empty() {
            // Kept for a failure message: what the client said about the lost connection.
            return (code, format!("(stderr: {})", stderr(&out).trim()));
        }
        (code, text)
    })
}

struct Shared {
    sshd: Sshd,
    /// A home whose vault holds the sshd's client key, with CA and host key made.
    template: Home,
    /// A known_hosts naming a key the sshd does not have.
    wrong_known_hosts: PathBuf,
    dir: tempfile::TempDir,
}

fn run(c: &Cell, shared: &Shared) {
    let ctx = name(c);
    let home = Home::seeded_from(&shared.template);
    let sshd = &shared.sshd;
    let counter = shared.dir.path().join(format!("{}.count", cell_file(c)));
    let remote = match c.run {
        Run::Refused => Remote::Peer(Peer::named(&[], home.dir.path())),
        _ => Remote::Sshd(counter.clone()),
    };
    let (user, port, known) = match (&remote, c.run) {
        (Remote::Peer(peer), _) => ("deploy".to_owned(), peer.port, peer.known_hosts.clone()),
        (_, Run::WrongHostKey) => (
            sshd.user.clone(),
            sshd.port,
            shared.wrong_known_hosts.clone(),
        ),
        _ => (
            sshd.user.clone(),
            sshd.port,
            sshd.known_hosts(home.dir.path(), "app1.internal"),
        ),
    };
    let mut extra = String::from("response_timeout = \"1s\"\n");
    if c.approval.is_some() {
        extra.push_str("approval = \"required\"\n");
    }
    let text = target_config(&user, port, &known, &extra);
    // The peer takes any key: the vault's (the sshd's client key) serves both.
    let private = sshd.client_key.private.clone();
    let crash = [("POSTERN_CRASH_AFTER", c.crash_after)];
    let mut front = Front::serve_with(home, &text, user, private, None, &crash);
    let leaves = (c.run == Run::AgentLeaves).then(|| counter.clone());
    let command = command(c.run, &counter);
    let seen = agent(&front, command.clone(), leaves);
    if let Some(answer) = c.approval
        && c.crash_after != "APPROVAL_REQUESTED"
    {
        answer_held(&front.daemon, answer);
    }
    let exit = front.daemon.wait_exit(Duration::from_secs(20));
    assert!(
        exit.is_some_and(|s| s.code().is_none()),
        "{ctx}: the failpoint should abort serve, got {exit:?}\n{}",
        front.daemon.stderr()
    );
    let (code, out) = seen.join().unwrap();
    match c.run {
        // No exit status exists to relay: the client has none, whatever it got.
        Run::Signalled | Run::Refused => {
            assert_eq!(
                code, 255,
                "{ctx}: the agent's ssh exited {code} with {out:?}"
            )
        }
        // postern never fabricates an exit status: before RESULT_DELIVERED the client has
        // none. After it, the status was sent, but the abort may reset the connection
        // before the client reads it (the client's channel-close reply meets a closed
        // socket).
        _ if c.crash_after != "RESULT_DELIVERED" => {
            assert_ne!(code, 3, "{ctx}: the agent's ssh exited {code} with {out:?}")
        }
        _ => {}
    }
    if c.run == Run::Refused {
        // Empty stdout (`agent` then keeps the client's complaint about the lost link).
        let nothing = out.is_empty() || out.starts_with("(stderr: ");
        assert!(nothing, "{ctx}: nothing ran, yet the agent got {out:?}");
    }
    let crashed_log = front.daemon.stderr();
    front.restart();
    let (r, result) = check_recovered(&front.daemon, &c.expect, &ctx);
    assert_eq!(r["protocol"], "ssh", "{ctx}: {r}");
    assert_eq!(r["command"], command.as_str(), "{ctx}: {r}");
    assert_eq!(remote.runs(), c.expect.effects, "{ctx}: runs on the remote");
    if let Remote::Peer(peer) = &remote {
        // Dispatched and answered: the exec request reached the remote, which ran nothing.
        assert_eq!(peer.execs(), 1, "{ctx}: exec requests the peer saw");
    }
    if let Some(result) = result {
        check_result(c.run, &r, &result, &ctx);
    }
    // Neither the restart nor fetching the result ran the command again.
    assert_eq!(remote.runs(), c.expect.effects, "{ctx}: after the fetch");
    let id = r["invocation_id"].as_str().unwrap_or_default();
    let shown = front.daemon.cli(&["actions", "show", id, "--json"], &[]);
    let all = format!("{}{crashed_log}{}", stdout(&shown), front.all_text());
    let key_line = canary(&front.client_private);
    assert!(
        !all.contains(&key_line),
        "{ctx}: a line of the private key leaked"
    );
}

/// The stored SSH result (and the record's summary of it): what the remote printed, and
/// how it ended — an exit status, or a signal and no exit status at all.
fn check_result(run: Run, record: &Value, result: &Value, ctx: &str) {
    let (status, signal) = match run {
        Run::Signalled => (Value::Null, json!("TERM")),
        _ => (json!(3), Value::Null),
    };
    assert_eq!(
        (
            &result["outcome"],
            &result["exit_status"],
            &result["exit_signal"],
            &result["stdout_base64"],
            &result["complete"]
        ),
        (
            &json!("committed"),
            &status,
            &signal,
            &json!(postern::journal::b64(b"out\n")),
            &json!(true)
        ),
        "{ctx}: {result}"
    );
    let summary = &record["result"];
    assert_eq!(
        (&summary["exit_status"], &summary["exit_signal"]),
        (&status, &signal),
        "{ctx}: {record}"
    );
    assert_eq!(record["evidence"]["exit_status"], status, "{ctx}: {record}");
    let err = result["stderr_base64"]
        .as_str()
        .and_then(postern::journal::unb64);
    assert_eq!(err.as_deref(), Some(&b"err\n"[..]), "{ctx}: {result}");
    assert!(result.get("status").is_none(), "{ctx}: SSH shape: {result}");
}

/// A file name unique to the cell.
fn cell_file(c: &Cell) -> String {
    format!("{}-{:?}-{:?}", c.crash_after, c.run, c.approval)
}

#[test]
fn a_crash_after_any_durable_write_of_an_ssh_exec_recovers_to_what_the_journal_proves() {
    let sshd = Sshd::start();
    let template = Home::new();
    let key = &sshd.client_key.private;
    let out = secret_set(&template, "deploy-ssh-key", key, Some(VAULT_KEY));
    assert!(out.status.success(), "{}", stderr(&out));
    let known = sshd.known_hosts(template.dir.path(), "app1.internal");
    let text = target_config(&sshd.user, sshd.port, &known, "");
    // One start makes the CA and host key every cell's home copies.
    let _ = Daemon::start_with(&template, Some(&text), &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
    let dir = tempfile::tempdir().unwrap();
    let other = keygen(dir.path(), "not_the_host_key");
    let wrong_known_hosts = dir.path().join("wrong_known_hosts");
    std::fs::write(
        &wrong_known_hosts,
        format!("app1.internal {}\n", other.public),
    )
    .unwrap();
    let shared = Shared {
        sshd,
        template,
        wrong_known_hosts,
        dir,
    };
    let started = Instant::now();
    run_cells(&cells(), 4, name, |c| run(c, &shared));
    eprintln!("ssh crash matrix: {:?}", started.elapsed());
}
