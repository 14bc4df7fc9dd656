//! SSH through postern against the same sshd directly, one run, ratios to direct:
//! exec round trip of `true` (the OpenSSH client process each time, as an agent runs it)
//! with postern's upstream session reused and cold, and output throughput.
//!
//! Throughput is timed from the first output byte to EOF ("streaming"): the client's
//! connection setup is not output, and it differs between the paths (direct, sshd logs the
//! client in; through postern, a reused upstream session). The whole command, setup
//! included, is shown beside it ("end to end"). Direct and postern runs alternate, `TRIALS`
//! each; the best and the median are shown, since one transfer on a shared machine is noisy
//! (a neighbour only ever slows a run down, so the best is the closest to capacity).
//!
//! `cargo bench --bench ssh` (needs /usr/sbin/sshd and ssh; `.ci/run` installs them).
//! `POSTERN_BENCH_BIN` measures another build; `POSTERN_BENCH_RUNS` sets the round trips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/it/sshd.rs"]
#[allow(dead_code)]
mod sshd;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sshd::Sshd;

const BIN: &str = env!("CARGO_BIN_EXE_postern");
const VAULT_KEY: &str = "bench-vault-key";
const TOKEN: &str = "bench-agent-token";

fn postern_bin() -> String {
    std::env::var("POSTERN_BENCH_BIN").unwrap_or_else(|_| BIN.to_owned())
}

struct Postern {
    child: Child,
    ssh_addr: String,
    _home: tempfile::TempDir,
}

impl Drop for Postern {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_postern(sshd: &Sshd) -> Postern {
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join("home");
    let mut set = Command::new(postern_bin())
        .args(["secret", "set", "deploy-ssh-key"])
        .env("POSTERN_HOME", &state)
        .env("POSTERN_VAULT_KEY", VAULT_KEY)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    set.stdin
        .take()
        .unwrap()
        .write_all(sshd.client_key.private.as_bytes())
        .unwrap();
    assert!(set.wait().unwrap().success());
    let known = sshd.known_hosts(home.path(), "app1.internal");
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[agents]]\nid = \"ci\"\ntoken = \"{TOKEN}\"\n\
         [[credentials]]\nid = \"deploy-key\"\nsecret = \"deploy-ssh-key\"\ninject = {{ ssh_key = true }}\n\
         [[ssh_targets]]\nid = \"deploy\"\nhost = \"app1.internal\"\nuser = \"{}\"\nagents = [\"ci\"]\n\
         credential = \"deploy-key\"\nknown_hosts = \"{}\"\nresolve = \"127.0.0.1:{}\"\n",
        sshd.user,
        known.display(),
        sshd.port
    );
    let cfg = home.path().join("postern.toml");
    std::fs::write(&cfg, config).unwrap();
    let mut child = Command::new(postern_bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("POSTERN_HOME", &state)
        .env("POSTERN_VAULT_KEY", VAULT_KEY)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut ssh_addr = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(a) = line.trim().strip_prefix("ssh") {
            ssh_addr = Some(a.trim().to_owned());
        }
        if line.trim().starts_with("admin") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let config_out = Command::new(postern_bin())
        .args(["ssh-config", "--config"])
        .arg(&cfg)
        .env("POSTERN_HOME", &state)
        .output()
        .unwrap();
    let block = String::from_utf8_lossy(&config_out.stdout).into_owned();
    let kh = block
        .lines()
        .find_map(|l| l.trim().strip_prefix("UserKnownHostsFile "))
        .unwrap()
        .to_owned();
    std::fs::copy(&kh, home.path().join("postern_known_hosts")).unwrap();
    Postern {
        child,
        ssh_addr: ssh_addr.unwrap(),
        _home: home,
    }
}

/// The OpenSSH client, direct to sshd or through `postern ssh-connect`.
fn ssh(sshd: &Sshd, key: &Path, via: Option<(&Postern, &Path)>, command: &str) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.args([
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    match via {
        None => {
            cmd.args(["-i"]).arg(key).args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-p",
            ]);
            cmd.arg(sshd.port.to_string())
                .arg(format!("{}@127.0.0.1", sshd.user));
        }
        Some((p, known)) => {
            cmd.arg("-o")
                .arg(format!(
                    "ProxyCommand={} ssh-connect %r %h %p",
                    postern_bin()
                ))
                .arg("-o")
                .arg(format!("UserKnownHostsFile={}", known.display()))
                .args(["-o", "StrictHostKeyChecking=yes"])
                .env("POSTERN_SSH_PROXY", &p.ssh_addr)
                .env("POSTERN_AGENT", "ci")
                .env("POSTERN_AGENT_TOKEN", TOKEN)
                .arg(format!("{}@app1.internal", sshd.user));
        }
    }
    cmd.arg(command);
    cmd
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Round trips of `true`: p50 and p99.
fn round_trips(runs: usize, mut make: impl FnMut() -> Command) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let out = make().output().unwrap();
        assert!(out.status.success(), "ssh failed");
        times.push(start.elapsed());
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99))
}

/// Output bytes per throughput run, and runs per path.
const BIG: u64 = 100_000_000;
const TRIALS: usize = 5;

/// Bytes per second of `head -c 100M /dev/zero` read to the end: (streaming, end to end).
fn throughput(mut cmd: Command) -> (f64, f64) {
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    out.read_exact(&mut first).unwrap();
    let first_byte = Instant::now();
    let rest = std::io::copy(&mut out, &mut std::io::sink()).unwrap();
    let eof = Instant::now();
    assert!(child.wait().unwrap().success());
    let exited = Instant::now();
    assert_eq!(1 + rest, BIG, "the whole output arrives");
    (
        rest as f64 / (eof - first_byte).as_secs_f64(),
        BIG as f64 / (exited - start).as_secs_f64(),
    )
}

/// (best, median) of the runs' rates.
fn best_and_median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() - 1], v[v.len() / 2])
}

fn main() {
    let runs: usize = std::env::var("POSTERN_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let sshd = Sshd::start();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("client_key");
    std::fs::write(&key, &sshd.client_key.private).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let p = start_postern(&sshd);
    let known = p._home.path().join("postern_known_hosts");
    let direct = round_trips(runs, || ssh(&sshd, &key, None, "true"));
    // Warm: the first exec logs in upstream; the rest reuse that session.
    let _ = ssh(&sshd, &key, Some((&p, &known)), "true").output();
    let reused = round_trips(runs, || ssh(&sshd, &key, Some((&p, &known)), "true"));
    // Cold: a fresh postern (started outside the clock) has no upstream session to reuse.
    let cold_runs = runs.min(10);
    let mut cold_times = Vec::with_capacity(cold_runs);
    for _ in 0..cold_runs {
        let fresh = start_postern(&sshd);
        let known = fresh._home.path().join("postern_known_hosts");
        let mut cmd = ssh(&sshd, &key, Some((&fresh, &known)), "true");
        let start = Instant::now();
        assert!(cmd.output().unwrap().status.success());
        cold_times.push(start.elapsed());
    }
    cold_times.sort();
    let cold = (percentile(&cold_times, 0.5), percentile(&cold_times, 0.99));
    let big = format!("head -c {BIG} /dev/zero");
    let (mut direct_runs, mut postern_runs) = (Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        direct_runs.push(throughput(ssh(&sshd, &key, None, &big)));
        postern_runs.push(throughput(ssh(&sshd, &key, Some((&p, &known)), &big)));
    }
    // streaming best, streaming median, end-to-end best, end-to-end median
    let rates = |runs: &[(f64, f64)]| {
        let (sb, sm) = best_and_median(runs.iter().map(|r| r.0).collect());
        let (eb, em) = best_and_median(runs.iter().map(|r| r.1).collect());
        [sb, sm, eb, em]
    };
    let (d, via) = (rates(&direct_runs), rates(&postern_runs));
    println!("| exec `true` ({runs} runs) | p50 | p99 | p50 ratio to direct |");
    println!("|---|---:|---:|---:|");
    for (name, (p50, p99)) in [
        ("direct", direct),
        ("postern, upstream session reused", reused),
        ("postern, cold upstream session", cold),
    ] {
        println!(
            "| {name} | {p50:?} | {p99:?} | {:.2} |",
            p50.as_secs_f64() / direct.0.as_secs_f64()
        );
    }
    println!(
        "\n| `head -c 100M /dev/zero`, {TRIALS} runs each | streaming best | median | end to end best | median |"
    );
    println!("|---|---:|---:|---:|---:|");
    let mb = |r: [f64; 4]| r.map(|x| format!("{:.0} MB/s", x / 1e6)).join(" | ");
    println!("| direct | {} |", mb(d));
    println!("| postern | {} |", mb(via));
    let ratio: Vec<String> = (0..4)
        .map(|i| format!("{:.0}%", 100.0 * via[i] / d[i]))
        .collect();
    println!("| postern / direct | {} |", ratio.join(" | "));
}
