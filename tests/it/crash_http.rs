//! Crash matrix over real HTTP exchanges: a credential-injecting route to a loopback origin
//! that counts what it received, curl as the agent, `POSTERN_CRASH_AFTER` for every durable
//! event kind an exchange writes, a restart on the same home, then the recovered record,
//! `decide`, the stored result and the origin's count.
//!
//! Kinds written in one atomic write crash together: ACTION_ACCEPTED, PREFLIGHT_VALIDATED and
//! CREDENTIAL_AUTHORIZED (and APPROVAL_REQUESTED on an approval route) go in one write;
//! CONNECT_ATTEMPT rides with DISPATCH_STARTED; REMOTE_RESPONSE_COMPLETE (and, buffered,
//! REMOTE_RESPONSE_STARTED) with RESULT_COMMITTED and its result. So a crash "after
//! REMOTE_RESPONSE_COMPLETE" of a real exchange finds the result committed and fetchable;
//! the state between the two is the drill's (`crash.rs`).

use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::crash::{
    Expect, approve_held, before_dispatch, check_recovered, delivered, failed_after_dispatch,
    failed_before_dispatch, fetch, restarted,
};
use crate::origins::{self, Origin};
use crate::support::{Daemon, Home, TEST_CONFIG, run_cells, secret_set, stdout};

const VAULT_KEY: &str = "vault-passphrase-for-crash-cells";
/// The injected secret: it must not show in any record, event or log line.
const SECRET: &str = "pay-key-v1-canary";
const BODY: &str = "{\"paid\":1}";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Delivery {
    Buffer,
    Stream,
}

/// The origin's behaviour after it counted the request.
#[derive(Debug, Clone, Copy)]
enum Remote {
    /// 201 with `BODY`, after a pause (ms) that keeps REQUEST_SENT in a write of its own.
    Answers(u64),
    ClosesWithoutResponse,
    /// A chunked body that stops before its last chunk.
    BreaksMidBody,
    /// Nothing listens: the connection is refused.
    Refused,
}

#[derive(Debug)]
struct Cell {
    crash_after: &'static str,
    delivery: Delivery,
    method: &'static str,
    approval: bool,
    remote: Remote,
    /// The agent leaves once the origin has the request (a cancelled caller).
    agent_gives_up: bool,
    expect: Expect,
}

const fn cell(crash_after: &'static str, delivery: Delivery, expect: Expect) -> Cell {
    Cell {
        crash_after,
        delivery,
        method: "POST",
        approval: false,
        remote: Remote::Answers(0),
        agent_gives_up: false,
        expect,
    }
}

fn cells() -> Vec<Cell> {
    use Delivery::*;
    let set_up = before_dispatch("connection_setup");
    vec![
        cell("ACTION_ACCEPTED", Buffer, set_up),
        cell("PREFLIGHT_VALIDATED", Buffer, set_up),
        cell("CREDENTIAL_AUTHORIZED", Buffer, set_up),
        Cell {
            approval: true,
            ..cell(
                "APPROVAL_REQUESTED",
                Buffer,
                before_dispatch("credential_injection"),
            )
        },
        Cell {
            approval: true,
            ..cell("APPROVAL_GRANTED", Buffer, set_up)
        },
        // Rides with DISPATCH_STARTED: dispatched, though no byte left.
        cell("CONNECT_ATTEMPT", Buffer, restarted(0)),
        cell("DISPATCH_STARTED", Buffer, restarted(0)),
        Cell {
            method: "GET",
            ..cell(
                "DISPATCH_STARTED",
                Buffer,
                Expect {
                    retry: "backoff",
                    verdict: "RETRY_NEW_ATTEMPT",
                    ..restarted(0)
                },
            )
        },
        // The origin's pause costs nothing: postern is gone before it answers.
        Cell {
            remote: Remote::Answers(3000),
            ..cell("REQUEST_SENT", Buffer, restarted(1))
        },
        Cell {
            remote: Remote::Answers(3000),
            ..cell("REQUEST_SENT", Stream, restarted(1))
        },
        // Buffered, the head is journaled with the commit.
        cell("REMOTE_RESPONSE_STARTED", Buffer, fetch()),
        cell("REMOTE_RESPONSE_STARTED", Stream, restarted(1)),
        cell("REMOTE_RESPONSE_COMPLETE", Buffer, fetch()),
        cell("REMOTE_RESPONSE_COMPLETE", Stream, fetch()),
        cell("RESULT_COMMITTED", Buffer, fetch()),
        cell("RESULT_COMMITTED", Stream, fetch()),
        cell("RESULT_DELIVERED", Buffer, delivered()),
        cell("RESULT_DELIVERED", Stream, delivered()),
        Cell {
            remote: Remote::ClosesWithoutResponse,
            ..cell(
                "FAILED",
                Buffer,
                failed_after_dispatch("REMOTE_OUTCOME_UNKNOWN", 1),
            )
        },
        Cell {
            remote: Remote::BreaksMidBody,
            ..cell(
                "FAILED",
                Stream,
                failed_after_dispatch("REMOTE_RESULT_INCOMPLETE", 1),
            )
        },
        // CALLER_CANCELLED leaves the exchange running: recovery settles it.
        Cell {
            remote: Remote::Answers(10_000),
            agent_gives_up: true,
            ..cell("FAILED", Buffer, restarted(1))
        },
        Cell {
            remote: Remote::Refused,
            ..cell(
                "FAILED",
                Buffer,
                failed_before_dispatch("CONNECTION_REFUSED", "connection_setup"),
            )
        },
    ]
}

fn name(c: &Cell) -> String {
    let mut n = format!("{} ({:?}, {}", c.crash_after, c.delivery, c.method);
    if c.approval {
        n.push_str(", approval");
    }
    if !matches!(c.remote, Remote::Answers(_)) {
        n.push_str(&format!(", {:?}", c.remote));
    }
    if c.agent_gives_up {
        n.push_str(", agent gives up");
    }
    n + ")"
}

fn origin(remote: Remote) -> Origin {
    match remote {
        Remote::Answers(pause) => Origin::script(move |s, _| {
            use std::io::Write;
            std::thread::sleep(Duration::from_millis(pause));
            let r = format!(
                "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{BODY}",
                BODY.len()
            );
            let _ = s.write_all(r.as_bytes());
        }),
        Remote::ClosesWithoutResponse => origins::closes_without_response(),
        Remote::BreaksMidBody => origins::half_a_chunked_body(),
        // Never connected to: its count stays 0.
        Remote::Refused => origins::closes_without_response(),
    }
}

fn config(port: u16, c: &Cell) -> String {
    let delivery = match c.delivery {
        Delivery::Buffer => "buffer",
        Delivery::Stream => "stream",
    };
    let approval = if c.approval { "required" } else { "none" };
    format!(
        "{TEST_CONFIG}\n[[credentials]]\nid = \"pay\"\nsecret = \"pay-key\"\ninject = {{ header = \"X-Api-Key\" }}\n\
         [[routes]]\nid = \"payments\"\ncredential = \"pay\"\ndelivery = \"{delivery}\"\napproval = \"{approval}\"\n\
         match = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n"
    )
}

/// What the agent (curl) got: a clean end, the status, the body.
struct Seen {
    clean: bool,
    status: u16,
    body: String,
}

fn agent(proxy: &str, url: String, c: &Cell, origin: &Origin) -> JoinHandle<Seen> {
    let mut args = vec![
        "-sS".to_owned(),
        "--max-time".into(),
        "20".into(),
        "-x".into(),
        proxy.to_owned(),
        "-o".into(),
        "-".into(),
        "-w".into(),
        "\n%{http_code}".into(),
    ];
    if c.method == "POST" {
        args.extend(["--data".into(), "amount=5".into()]);
    }
    args.push(url);
    let (gives_up, hits) = (c.agent_gives_up, origin.hits.clone());
    std::thread::spawn(move || {
        let mut child = Command::new("curl")
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("curl");
        if gives_up {
            let deadline = Instant::now() + Duration::from_secs(10);
            while hits.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
        }
        let out = child.wait_with_output().expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        Seen {
            clean: out.status.success(),
            status: code.trim().parse().unwrap_or(0),
            body: body.to_owned(),
        }
    })
}

fn run(c: &Cell, template: &Home) {
    let ctx = name(c);
    let origin = origin(c.remote);
    let port = match c.remote {
        Remote::Refused => origins::refused_port(),
        _ => origin.port(),
    };
    let text = config(port, c);
    let home = Home::seeded_from(template);
    let vault = ("POSTERN_VAULT_KEY", VAULT_KEY);
    let crash = ("POSTERN_CRASH_AFTER", c.crash_after);
    let mut daemon = Daemon::start_with(&home, Some(&text), &[vault, crash]);
    let url = format!("http://origin.test:{port}/pay");
    let seen = agent(&daemon.proxy, url, c, &origin);
    if c.approval && c.crash_after != "APPROVAL_REQUESTED" {
        approve_held(&daemon);
    }
    let exit = daemon.wait_exit(Duration::from_secs(20));
    assert!(
        exit.is_some_and(|s| s.code().is_none()),
        "{ctx}: the failpoint should abort serve, got {exit:?}\n{}",
        daemon.stderr()
    );
    let seen = seen.join().unwrap();
    let got_all = seen.clean && seen.status == 201 && seen.body == BODY;
    // Only a delivered result reached the agent whole: a streamed one's end is held back
    // until RESULT_COMMITTED is durable, and the crash came first.
    assert_eq!(
        got_all,
        c.crash_after == "RESULT_DELIVERED",
        "{ctx}: the agent saw {} {:?} (clean end: {})",
        seen.status,
        seen.body,
        seen.clean
    );
    let crashed_log = daemon.stderr();
    drop(daemon);
    // Reading the record needs no vault: the restart skips its key derivation.
    let daemon = Daemon::start(&home, Some(&text));
    let (record, result) = check_recovered(&daemon, &c.expect, &ctx);
    let evidence = &record["evidence"];
    if evidence["response_headers_received"] == true && result.is_none() {
        // A head without RESULT_COMMITTED: its status is evidence, not an outcome.
        let status = if matches!(c.remote, Remote::BreaksMidBody) {
            200
        } else {
            201
        };
        assert_eq!(evidence["response_status"], status, "{ctx}: {record}");
    }
    assert_eq!(
        origin.hits(),
        c.expect.effects,
        "{ctx}: requests the origin saw"
    );
    if let Some(result) = result {
        assert_eq!(result["status"], 201, "{ctx}: {result}");
        let body = result["body_base64"]
            .as_str()
            .and_then(postern::journal::unb64);
        assert_eq!(body.as_deref(), Some(BODY.as_bytes()), "{ctx}: {result}");
    }
    // Neither the restart nor fetching the result sent the request again.
    assert_eq!(origin.hits(), c.expect.effects, "{ctx}: after the fetch");
    if c.expect.effects > 0 {
        // The secret was injected (so its absence below means something).
        let sent = origin.last_request().to_ascii_lowercase();
        assert!(
            sent.contains(&format!("x-api-key: {SECRET}")),
            "{ctx}: {sent}"
        );
    }
    let id = record["invocation_id"].as_str().unwrap_or_default();
    let shown = daemon.cli(&["actions", "show", id, "--json"], &[]);
    let all = format!("{}{crashed_log}{}", stdout(&shown), daemon.stderr());
    assert!(!all.contains(SECRET), "{ctx}: the secret leaked");
}

#[test]
fn a_crash_after_any_durable_write_of_an_http_exchange_recovers_to_what_the_journal_proves() {
    let template = Home::new();
    let out = secret_set(&template, "pay-key", SECRET, Some(VAULT_KEY));
    assert!(out.status.success());
    // One start makes the CA and host key every cell's home copies.
    let _ = Daemon::start_with(
        &template,
        Some(TEST_CONFIG),
        &[("POSTERN_VAULT_KEY", VAULT_KEY)],
    );
    let started = Instant::now();
    run_cells(&cells(), 4, name, |c| run(c, &template));
    eprintln!("http crash matrix: {:?}", started.elapsed());
}
