//! Crash matrix over real HTTP exchanges: a credential-injecting route to a loopback origin
//! that counts what it received, curl as the agent, `POSTERN_CRASH_AFTER` for every durable
//! event kind an exchange writes, a restart on the same home, then the recovered record,
//! `decide`, the stored result and the origin's count. Over plain `http://`, over `https://`
//! through postern's interception (a TLS origin offering only http/1.1), and with h2 on both
//! sides; on a fresh and on a pooled upstream connection; with an operator approving,
//! denying or (after the exchange ended `unknown`) reconciling.
//!
//! Kinds written in one atomic write crash together: ACTION_ACCEPTED, PREFLIGHT_VALIDATED and
//! CREDENTIAL_AUTHORIZED (and APPROVAL_REQUESTED on an approval route) go in one write;
//! CONNECT_ATTEMPT rides with DISPATCH_STARTED; REMOTE_RESPONSE_COMPLETE (and, buffered,
//! REMOTE_RESPONSE_STARTED) with RESULT_COMMITTED and its result. So a crash "after
//! REMOTE_RESPONSE_COMPLETE" of a real exchange finds the result committed and fetchable;
//! the state between the two is the drill's (`crash.rs`). On a pooled connection there is
//! no setup stage to wait for, so ACTION_ACCEPTED, PREFLIGHT_VALIDATED and
//! CREDENTIAL_AUTHORIZED ride with DISPATCH_STARTED: a crash "after PREFLIGHT_VALIDATED"
//! of a pooled request finds it dispatched (`unknown`), though nothing was sent.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::crash::{
    Answer, Expect, answer_held, before_dispatch, check_newest, delivered, denied,
    failed_after_dispatch, failed_before_dispatch, fetch, reconcile_newest, reconciled, restarted,
};
use crate::origins::{self, Origin};
use crate::support::{Daemon, Home, TEST_CONFIG, get_json, run_cells, secret_set, stdout};
use crate::tls_origin::{self, TlsOrigin};

const VAULT_KEY: &str = "vault-passphrase-for-crash-cells";
/// The injected secret: it must not show in any record, event or log line.
const SECRET: &str = "pay-key-v1-canary";
const BODY: &str = "{\"paid\":1}";
/// A body large enough for a body file of its own (`journal::bodies`, from 16 KiB).
static LARGE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let items: Vec<String> = (0..2000).map(|n| format!("{{\"n\":{n:05}}}")).collect();
    format!("[{}]", items.join(","))
});

#[derive(Debug, Clone, Copy, PartialEq)]
enum Delivery {
    Buffer,
    Stream,
}

/// How the agent reaches the origin.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Transport {
    /// `http://` in absolute form to a raw HTTP/1.1 origin.
    Http,
    /// `https://` through CONNECT and postern's interception (curl trusting postern's CA,
    /// HTTP/1.1) to a TLS origin that offers only http/1.1.
    Https,
    /// The same with h2 on both sides: curl asks for it, the origin offers only h2.
    H2,
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
    transport: Transport,
    /// The route needs an approval; the operator's answer (none to a crash at the hold).
    approval: Option<Answer>,
    remote: Remote,
    /// The agent leaves once the origin has the request (a cancelled caller).
    agent_gives_up: bool,
    /// The origin answers `LARGE`, not `BODY`.
    large: bool,
    /// A first request on the route ran and was delivered before, so this one goes out on
    /// its kept upstream connection; the failpoint counts the first one's writes (`KIND:2`).
    pooled: bool,
    /// An operator then reconciles the `unknown` invocation (as committed: true), with
    /// `RECONCILED` as failpoint: on the same daemon when that is `crash_after`, else on
    /// the one restarted after the crash.
    reconcile: Option<bool>,
    expect: Expect,
}

const fn cell(crash_after: &'static str, delivery: Delivery, expect: Expect) -> Cell {
    Cell {
        crash_after,
        delivery,
        method: "POST",
        transport: Transport::Http,
        approval: None,
        remote: Remote::Answers(0),
        agent_gives_up: false,
        large: false,
        pooled: false,
        reconcile: None,
        expect,
    }
}

/// `cell` over another transport.
const fn over(transport: Transport, crash_after: &'static str, d: Delivery, e: Expect) -> Cell {
    Cell {
        transport,
        ..cell(crash_after, d, e)
    }
}

/// `over`, answered with a body that goes to a body file.
fn large(transport: Transport, crash_after: &'static str, d: Delivery, e: Expect) -> Cell {
    Cell {
        large: true,
        ..over(transport, crash_after, d, e)
    }
}

impl Cell {
    fn body(&self) -> &'static str {
        match self.large {
            true => LARGE.as_str(),
            false => BODY,
        }
    }
}

/// `over`, the request going out on the kept connection of an earlier one.
const fn pooled(transport: Transport, crash_after: &'static str, e: Expect) -> Cell {
    Cell {
        pooled: true,
        ..over(transport, crash_after, Delivery::Buffer, e)
    }
}

fn cells() -> Vec<Cell> {
    use Delivery::*;
    use Transport::*;
    let set_up = before_dispatch("connection_setup");
    let mut cells = vec![
        cell("ACTION_ACCEPTED", Buffer, set_up),
        cell("PREFLIGHT_VALIDATED", Buffer, set_up),
        cell("CREDENTIAL_AUTHORIZED", Buffer, set_up),
        // Held in memory only: after the restart nothing is held, nothing can be approved.
        Cell {
            approval: Some(Answer::Approves),
            ..cell(
                "APPROVAL_REQUESTED",
                Buffer,
                before_dispatch("credential_injection"),
            )
        },
        Cell {
            approval: Some(Answer::Approves),
            ..cell("APPROVAL_GRANTED", Buffer, set_up)
        },
        // APPROVAL_DENIED goes in one write with its FAILED: nothing left for recovery.
        Cell {
            approval: Some(Answer::Denies),
            ..cell("APPROVAL_DENIED", Buffer, denied())
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
        // An operator's reconciliation of an exchange that ended unknown by itself…
        Cell {
            remote: Remote::ClosesWithoutResponse,
            reconcile: Some(false),
            ..cell(
                "RECONCILED",
                Buffer,
                reconciled("REMOTE_OUTCOME_UNKNOWN", false, 1),
            )
        },
        // …and of one that recovery settled after a crash.
        Cell {
            remote: Remote::Answers(3000),
            reconcile: Some(true),
            ..cell(
                "REQUEST_SENT",
                Buffer,
                reconciled("BROKER_RESTARTED", true, 1),
            )
        },
        // Preflight rides with DISPATCH_STARTED on a pooled connection: dispatched by the
        // journal, though no byte left.
        pooled(Http, "PREFLIGHT_VALIDATED", restarted(0)),
        pooled(Http, "DISPATCH_STARTED", restarted(0)),
        pooled(Https, "DISPATCH_STARTED", restarted(0)),
        pooled(H2, "DISPATCH_STARTED", restarted(0)),
        pooled(H2, "RESULT_COMMITTED", fetch()),
        Cell {
            approval: Some(Answer::Denies),
            ..over(Https, "APPROVAL_DENIED", Buffer, denied())
        },
    ];
    // Through the interception, to an http/1.1 and to an h2 origin.
    for t in [Https, H2] {
        cells.extend([
            over(t, "PREFLIGHT_VALIDATED", Buffer, set_up),
            over(t, "DISPATCH_STARTED", Buffer, restarted(0)),
            over(t, "RESULT_COMMITTED", Buffer, fetch()),
            over(t, "RESULT_COMMITTED", Stream, fetch()),
            over(t, "RESULT_DELIVERED", Buffer, delivered()),
        ]);
    }
    // Over h2 REQUEST_SENT means the request's end was handed to its stream, whose frames
    // may still be queued when the crash comes: the origin then saw it or not (the record
    // is `unknown` either way), so only HTTP/1.1 is crashed there (and over TLS the count
    // may be one short, see `run`).
    cells.push(Cell {
        remote: Remote::Answers(3000),
        ..over(Https, "REQUEST_SENT", Stream, restarted(1))
    });
    // A body in a body file: durable with its result, whole after the restart.
    cells.extend([
        large(Http, "RESULT_COMMITTED", Buffer, fetch()),
        large(Https, "RESULT_COMMITTED", Stream, fetch()),
        large(H2, "RESULT_DELIVERED", Buffer, delivered()),
    ]);
    cells
}

fn name(c: &Cell) -> String {
    let mut n = format!("{} (", c.crash_after);
    if c.transport != Transport::Http {
        n.push_str(&format!("{:?}, ", c.transport));
    }
    n.push_str(&format!("{:?}, {}", c.delivery, c.method));
    if c.pooled {
        n.push_str(", pooled");
    }
    match c.approval {
        Some(Answer::Approves) => n.push_str(", approval"),
        Some(Answer::Denies) => n.push_str(", approval denied"),
        None => {}
    }
    if !matches!(c.remote, Remote::Answers(_)) {
        n.push_str(&format!(", {:?}", c.remote));
    }
    if c.agent_gives_up {
        n.push_str(", agent gives up");
    }
    if c.large {
        n.push_str(", large body");
    }
    match c.reconcile {
        Some(true) => n.push_str(", reconciled committed"),
        Some(false) => n.push_str(", reconciled rejected"),
        None => {}
    }
    n + ")"
}

/// A cell's origin and, over TLS, the trust root its route names.
struct Upstream {
    origin: Origin,
    tls: Option<TlsOrigin>,
}

fn upstream(c: &Cell) -> Upstream {
    let remote = c.remote;
    let body = c.body();
    let origin = match (c.transport, remote) {
        (Transport::Http, Remote::Answers(pause)) => {
            let answer = move |s: &mut std::net::TcpStream, _: &[u8]| {
                use std::io::Write;
                std::thread::sleep(Duration::from_millis(pause));
                let r = format!(
                    "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(r.as_bytes());
            };
            // A pooled request needs the first one's connection kept open.
            if c.pooled {
                Origin::keeps_alive(answer)
            } else {
                Origin::script(answer)
            }
        }
        (Transport::Http, Remote::ClosesWithoutResponse) => origins::closes_without_response(),
        (Transport::Http, Remote::BreaksMidBody) => origins::half_a_chunked_body(),
        // Never connected to: its count stays 0.
        (Transport::Http, Remote::Refused) => origins::closes_without_response(),
        (t, Remote::Answers(pause)) => {
            let pause = Duration::from_millis(pause);
            let body = bytes::Bytes::from_static(body.as_bytes());
            let counting = tls_origin::counting(t == Transport::H2, pause, 201, body);
            return Upstream {
                origin: counting.origin,
                tls: Some(counting.tls),
            };
        }
        (t, r) => panic!("no {r:?} origin over {t:?}"),
    };
    Upstream { origin, tls: None }
}

fn config(port: u16, c: &Cell, upstream: &Upstream) -> String {
    let delivery = match c.delivery {
        Delivery::Buffer => "buffer",
        Delivery::Stream => "stream",
    };
    let approval = if c.approval.is_some() {
        "required"
    } else {
        "none"
    };
    let (scheme, trust) = match &upstream.tls {
        Some(tls) => (
            "https",
            format!("upstream_ca = \"{}\"\n", tls.ca_file.display()),
        ),
        None => ("http", String::new()),
    };
    format!(
        "{TEST_CONFIG}\n[[credentials]]\nid = \"pay\"\nsecret = \"pay-key\"\ninject = {{ header = \"X-Api-Key\" }}\n\
         [[routes]]\nid = \"payments\"\ncredential = \"pay\"\ndelivery = \"{delivery}\"\napproval = \"{approval}\"\n\
         match = {{ scheme = \"{scheme}\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n{trust}"
    )
}

/// What the agent (curl) got: a clean end, the status, the body.
struct Seen {
    clean: bool,
    status: u16,
    body: String,
}

impl Seen {
    fn got_all(&self, c: &Cell) -> bool {
        self.clean && self.status == 201 && self.body == c.body()
    }
}

/// curl's arguments for the cell's request through `proxy`; over TLS it trusts `ca`,
/// postern's CA, and asks for the cell's HTTP version.
fn curl_args(c: &Cell, proxy: &str, url: &str, ca: &std::path::Path) -> Vec<String> {
    let mut args: Vec<String> = ["-sS", "--max-time", "20", "-x", proxy, "-o", "-", "-w"]
        .map(str::to_owned)
        .to_vec();
    args.push("\n%{http_code}".into());
    match c.transport {
        Transport::Http => {}
        Transport::Https => args.push("--http1.1".into()),
        Transport::H2 => args.push("--http2".into()),
    }
    if c.transport != Transport::Http {
        args.extend(["--cacert".into(), ca.display().to_string()]);
    }
    if c.method == "POST" {
        args.extend(["--data".into(), "amount=5".into()]);
    }
    args.push(url.to_owned());
    args
}

/// Runs curl; with `gives_up`, kills it once that origin counter moved.
fn agent(args: Vec<String>, gives_up: Option<Arc<AtomicUsize>>) -> JoinHandle<Seen> {
    std::thread::spawn(move || {
        let mut child = Command::new("curl")
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("curl");
        if let Some(hits) = gives_up {
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

/// Waits for the failpoint's abort.
fn aborted(daemon: &mut Daemon, ctx: &str) {
    let exit = daemon.wait_exit(Duration::from_secs(20));
    assert!(
        exit.is_some_and(|s| s.code().is_none()),
        "{ctx}: the failpoint should abort serve, got {exit:?}\n{}",
        daemon.stderr()
    );
}

fn run(c: &Cell, template: &Home) {
    let ctx = name(c);
    let up = upstream(c);
    let origin = &up.origin;
    let port = match c.remote {
        Remote::Refused => origins::refused_port(),
        _ => origin.port(),
    };
    let text = config(port, c, &up);
    let home = Home::seeded_from(template);
    let vault = ("POSTERN_VAULT_KEY", VAULT_KEY);
    let failpoint = match c.pooled {
        true => format!("{}:2", c.crash_after),
        false => c.crash_after.to_owned(),
    };
    let crash = ("POSTERN_CRASH_AFTER", failpoint.as_str());
    let mut daemon = Daemon::start_with(&home, Some(&text), &[vault, crash]);
    let scheme = if up.tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://origin.test:{port}/pay");
    let args = curl_args(c, &daemon.proxy, &url, &home.root().join("certs/ca.pem"));
    if c.pooled {
        let first = agent(args.clone(), None).join().unwrap();
        assert!(
            first.got_all(c),
            "{ctx}: the first request: {} {:?}",
            first.status,
            first.body
        );
    }
    let gives_up = c.agent_gives_up.then(|| origin.hits.clone());
    let mut pending = Some(agent(args, gives_up));
    if let Some(answer) = c.approval
        && c.crash_after != "APPROVAL_REQUESTED"
    {
        answer_held(&daemon, answer);
    }
    let mut ended = None;
    if let Some(committed) = c.reconcile
        && c.crash_after == "RECONCILED"
    {
        // The exchange ends (unknown) on its own; then the operator's word.
        ended = pending.take().map(|p| p.join().unwrap());
        reconcile_newest(&daemon, committed);
    }
    aborted(&mut daemon, &ctx);
    let seen = ended
        .or_else(|| pending.map(|p| p.join().unwrap()))
        .unwrap();
    // Only a delivered result reached the agent whole: a streamed one's end is held back
    // until RESULT_COMMITTED is durable, and the crash came first.
    assert_eq!(
        seen.got_all(c),
        c.crash_after == "RESULT_DELIVERED",
        "{ctx}: the agent saw {} {:?} (clean end: {})",
        seen.status,
        seen.body,
        seen.clean
    );
    let mut crashed_log = daemon.stderr();
    drop(daemon);
    if let Some(committed) = c.reconcile
        && c.crash_after != "RECONCILED"
    {
        // Recovery settled it `unknown`; the operator reconciles on the restarted daemon.
        let crash = [("POSTERN_CRASH_AFTER", "RECONCILED")];
        let mut daemon = Daemon::start_with(&home, Some(&text), &crash);
        reconcile_newest(&daemon, committed);
        aborted(&mut daemon, &ctx);
        crashed_log.push_str(&daemon.stderr());
    }
    // Reading the record needs no vault: the restart skips its key derivation.
    let daemon = Daemon::start(&home, Some(&text));
    let earlier = usize::from(c.pooled);
    let (record, result) = check_newest(&daemon, 1 + earlier, &c.expect, &ctx);
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
    let effects = c.expect.effects + earlier;
    // Over TLS the origin has sent postern a session ticket it never read: the crash right
    // after REQUEST_SENT closes that socket with a reset, which can discard the request
    // before the origin reads it (seen under load). The record is `unknown` either way.
    let may_be_lost = c.crash_after == "REQUEST_SENT" && up.tls.is_some();
    let hits = origin.hits();
    match may_be_lost {
        true => assert!(
            (effects - c.expect.effects.min(1)..=effects).contains(&hits),
            "{ctx}: requests the origin saw: {hits}, expected {effects} or one lost"
        ),
        false => assert_eq!(hits, effects, "{ctx}: requests the origin saw"),
    }
    if c.pooled {
        let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
        let first = &list["invocations"][1];
        assert_eq!(
            (first["outcome"].as_str(), &first["code"]),
            (Some("committed"), &serde_json::Value::Null),
            "{ctx}: the first request stays delivered: {first}"
        );
        assert_eq!(evidence["reused_connection"], true, "{ctx}: {record}");
        assert_eq!(origin.connections(), 1, "{ctx}: one upstream connection");
    }
    if c.approval.is_some() {
        // Holds live in memory: none survives, and none can be answered into a dispatch.
        let (_, held) = get_json(&daemon.url("/v1/approvals"), &[]);
        assert_eq!(held["approvals"], serde_json::json!([]), "{ctx}");
        let id = record["invocation_id"].as_str().unwrap_or_default();
        let late = daemon.cli(&["approve", id], &[]);
        assert!(!late.status.success(), "{ctx}: approved after the restart");
        assert_eq!(origin.hits(), effects, "{ctx}: after a late approval");
    }
    if let Some(result) = result {
        assert_eq!(result["status"], 201, "{ctx}: {result}");
        let body = result["body_base64"]
            .as_str()
            .and_then(postern::journal::unb64);
        assert_eq!(
            body.as_deref(),
            Some(c.body().as_bytes()),
            "{ctx}: {result}"
        );
    }
    // Neither the restart nor fetching the result sent the request again.
    assert_eq!(origin.hits(), effects, "{ctx}: after the fetch");
    if effects > 0 {
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
