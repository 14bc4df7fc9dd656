//! A journal disk that fills (SPEC §2, storage faults): on a small tmpfs under
//! `POSTERN_HOME`, postern must flip to `503 JOURNAL_UNAVAILABLE` before fjall meets
//! ENOSPC, keep answering on a full disk, and accept again once space returns.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::origins;
use crate::support::{Daemon, Home, curl, get_json, journal_dir, stdout};

const MIB: u64 = 1 << 20;
/// Small enough to fill in seconds, large enough for a CA, a host key and fjall's files.
const DISK: u64 = 48 * MIB;
const MIN_FREE: u64 = 4 * MIB;
const RESERVE: u64 = 2 * MIB;
const BODY: usize = 32 << 10;

/// A tmpfs mounted at a home's root, unmounted on drop. Needs root (CAP_SYS_ADMIN).
struct SmallDisk {
    root: PathBuf,
}

impl SmallDisk {
    /// `None`, with the reason printed, where no tmpfs can be mounted.
    fn mount(home: &Home) -> Option<Self> {
        let root = home.root();
        std::fs::create_dir_all(&root).expect("home root");
        let size = format!("size={DISK}");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "postern-it", root.to_str()?])
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Self { root }),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs (needs root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                None
            }
        }
    }

    fn free(&self) -> u64 {
        fs4::available_space(&self.root).expect("statvfs")
    }

    fn filler(&self) -> PathBuf {
        self.root.join("filler.bin")
    }

    /// Grows the filler until `leave` bytes are free (or, with 0, until ENOSPC).
    fn fill_until(&self, leave: u64) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.filler())
            .expect("filler");
        let chunk = vec![0x5au8; 64 << 10];
        while self.free() > leave {
            let n = (self.free() - leave).min(chunk.len() as u64) as usize;
            if f.write_all(&chunk[..n]).is_err() {
                break;
            }
        }
        let _ = f.sync_all();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.root).status();
    }
}

fn config(port: u16) -> String {
    format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"{MIN_FREE}\"\nreserve_bytes = \"{RESERVE}\"\n\n[[routes]]\nid = \"origin\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n"
    )
}

/// What the agent got for one POST.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Ok,
    /// `503 JOURNAL_UNAVAILABLE`; the invocation it names, if the journal recorded it (one
    /// admitted just before the disk ran low, refused at the dispatch boundary).
    Unavailable(Option<String>),
    /// Anything else: another status, a reset, no answer.
    Broken(String),
}

impl Answer {
    fn unavailable(&self) -> bool {
        matches!(self, Answer::Unavailable(_))
    }
}

/// A refusal that names an invocation names one the journal holds, settled `not_attempted`.
fn assert_named_records_exist(daemon: &Daemon, answers: &[Answer]) {
    for a in answers {
        if let Answer::Unavailable(Some(id)) = a {
            let id = id.to_uppercase().replacen("ACT_", "act_", 1);
            let (status, record) = get_json(&daemon.url(&format!("/v1/invocations/{id}")), &[]);
            assert_eq!(status, 200, "{id}: {record}");
            assert_eq!(record["outcome"], "not_attempted", "{record}");
        }
    }
}

/// One 32 KiB POST through the proxy on its own connection.
fn post(proxy: &str, port: u16) -> Answer {
    let addr = proxy.trim_start_matches("http://").trim_end_matches('/');
    let Ok(mut s) = TcpStream::connect(addr) else {
        return Answer::Broken("connect failed".into());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
    let head = format!(
        "POST http://origin.test:{port}/upload HTTP/1.1\r\nHost: origin.test:{port}\r\nContent-Length: {BODY}\r\nConnection: close\r\n\r\n"
    );
    let mut req = head.into_bytes();
    req.extend(std::iter::repeat_n(b'u', BODY));
    if let Err(e) = s.write_all(&req) {
        return Answer::Broken(format!("write: {e}"));
    }
    let mut resp = Vec::new();
    if let Err(e) = s.read_to_end(&mut resp) {
        return Answer::Broken(format!("read: {e} after {} bytes", resp.len()));
    }
    let text = String::from_utf8_lossy(&resp).to_ascii_lowercase();
    if text.starts_with("http/1.1 2") {
        Answer::Ok
    } else if text.starts_with("http/1.1 503")
        && text.contains("\"journal_unavailable\"")
        && text.contains("retry-after: 5")
    {
        let id = text
            .lines()
            .find_map(|l| l.strip_prefix("postern-invocation:"))
            .map(|id| id.trim().to_owned());
        Answer::Unavailable(id)
    } else {
        Answer::Broken(text.chars().take(300).collect())
    }
}

/// `threads` agents POSTing until `count` answers, `within` passes, or every agent was
/// refused `refusals` times in a row.
fn flood(proxy: &str, port: u16, count: usize, within: Duration) -> Vec<Answer> {
    let threads = 4;
    let refusals = 15;
    let deadline = Instant::now() + within;
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let done = &done;
                scope.spawn(move || {
                    let mut answers = Vec::new();
                    let mut refused_in_a_row = 0;
                    while Instant::now() < deadline
                        && refused_in_a_row < refusals
                        && done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < count
                    {
                        let a = post(proxy, port);
                        refused_in_a_row = match a {
                            Answer::Unavailable(_) => refused_in_a_row + 1,
                            _ => 0,
                        };
                        answers.push(a);
                    }
                    answers
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("agent thread"))
            .collect()
    })
}

fn metric(daemon: &Daemon, name: &str) -> u64 {
    let (_, text, _) = curl(&[&daemon.url("/metrics")]);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

fn bytes_under(dir: &Path) -> u64 {
    crate::support::files_under(dir)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

/// After space returned: one POST every 250 ms until one is accepted, for at most 20 s.
fn assert_accepted_again(daemon: &Daemon, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut answer = post(&daemon.proxy, port);
    while answer != Answer::Ok && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        answer = post(&daemon.proxy, port);
    }
    assert_eq!(
        answer,
        Answer::Ok,
        "not accepted again after space returned"
    );
}

/// `/healthz`'s journal state, polled until it is `want` (at most 15 s: three ticks).
fn wait_journal_state(daemon: &Daemon, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, health) = get_json(&daemon.url("/healthz"), &[]);
        let state = health["journal"].as_str().unwrap_or_default().to_owned();
        if state == want {
            return;
        }
        assert!(Instant::now() < deadline, "journal still {state}: {health}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn alive(daemon: &mut Daemon) -> bool {
    matches!(daemon.child.try_wait(), Ok(None))
}

fn assert_all_answered(answers: &[Answer], when: &str) {
    let broken: Vec<_> = answers
        .iter()
        .filter(|a| matches!(a, Answer::Broken(_)))
        .collect();
    assert!(
        broken.is_empty(),
        "{when}: {} of {} answers broken, first: {:?}",
        broken.len(),
        answers.len(),
        broken.first()
    );
}

#[test]
fn a_filling_disk_is_answered_with_503_until_space_returns_and_the_chain_verifies() {
    let home = Home::new();
    let Some(disk) = SmallDisk::mount(&home) else {
        return;
    };
    let origin = origins::responds("201 Created", &[], "stored");
    let mut daemon = Daemon::start(&home, Some(&config(origin.port())));
    let reserve = journal_dir(&home.root()).join("reserve.bin");
    let on_disk = std::fs::metadata(&reserve).map_or(0, |m| m.blocks() * 512);
    assert!(
        on_disk >= RESERVE,
        "the reserve holds {on_disk} bytes on disk"
    );

    // Just above the threshold: the flood crosses it between two ticks of the timer.
    disk.fill_until(MIN_FREE + MIB);
    let flooded = flood(&daemon.proxy, origin.port(), 1500, Duration::from_secs(60));
    assert!(alive(&mut daemon), "postern exited:\n{}", daemon.stderr());
    assert_all_answered(&flooded, "flood toward a full disk");
    assert_named_records_exist(&daemon, &flooded);
    let ok = flooded.iter().filter(|a| **a == Answer::Ok).count();
    assert!(ok > 0, "nothing was accepted before the disk ran low");
    assert!(
        flooded.iter().any(Answer::unavailable),
        "never refused: {ok} accepted"
    );

    // Refusals while low are counted, not journaled.
    std::thread::sleep(Duration::from_millis(500));
    let events = metric(&daemon, "postern_journal_events_total");
    let bytes = bytes_under(&journal_dir(&home.root()));
    let refused = flood(&daemon.proxy, origin.port(), 40, Duration::from_secs(30));
    assert_all_answered(&refused, "refusals while low");
    assert!(refused.iter().all(|a| *a == Answer::Unavailable(None)));
    assert_eq!(metric(&daemon, "postern_journal_events_total"), events);
    assert!(metric(&daemon, "postern_journal_refusals_unrecorded_total") >= 40);
    let grown = bytes_under(&journal_dir(&home.root())).saturating_sub(bytes);
    let named = flooded
        .iter()
        .filter(|a| matches!(a, Answer::Unavailable(Some(_))))
        .count();
    eprintln!(
        "flood: {ok} accepted, {} refused ({named} at the dispatch boundary); {} refusals while low grew the journal by {grown} bytes",
        flooded.len() - ok,
        refused.len()
    );

    // The disk full to the last byte: still answered, still alive.
    disk.fill_until(0);
    let full = flood(&daemon.proxy, origin.port(), 40, Duration::from_secs(30));
    assert!(alive(&mut daemon), "postern exited:\n{}", daemon.stderr());
    assert_all_answered(&full, "a full disk");
    assert!(full.iter().all(|a| *a == Answer::Unavailable(None)));

    // Space returns: accepted again within a few ticks of the timer.
    std::fs::remove_file(disk.filler()).expect("remove filler");
    assert_accepted_again(&daemon, origin.port());

    assert_eq!(daemon.terminate(), Some(0));
    let out = home.cli(&["audit", "verify"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).starts_with("ok: "), "{}", stdout(&out));
    drop(disk);
}

#[test]
fn a_disk_that_fills_while_postern_already_refuses_is_answered_not_fatal() {
    let home = Home::new();
    let Some(disk) = SmallDisk::mount(&home) else {
        return;
    };
    let origin = origins::responds("201 Created", &[], "stored");
    let mut daemon = Daemon::start(&home, Some(&config(origin.port())));
    // Below the threshold with nothing running: the timer flips the journal to refusing.
    disk.fill_until(MIN_FREE / 2);
    wait_journal_state(&daemon, "refusing_dispatch");
    disk.fill_until(0);
    assert!(disk.free() < 64 << 10, "{} bytes still free", disk.free());
    let events = metric(&daemon, "postern_journal_events_total");
    let full = flood(&daemon.proxy, origin.port(), 40, Duration::from_secs(30));
    assert!(alive(&mut daemon), "postern exited:\n{}", daemon.stderr());
    assert_all_answered(&full, "a full disk");
    assert!(full.iter().all(|a| *a == Answer::Unavailable(None)));
    assert_eq!(metric(&daemon, "postern_journal_events_total"), events);
    assert_eq!(origin.hits(), 0, "nothing was dispatched");

    std::fs::remove_file(disk.filler()).expect("remove filler");
    assert_accepted_again(&daemon, origin.port());
    wait_journal_state(&daemon, "ok");
    assert_eq!(daemon.terminate(), Some(0));
    let out = home.cli(&["audit", "verify"], &[]);
    assert!(out.status.success(), "{out:?}");
    drop(disk);
}
