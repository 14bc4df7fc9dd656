//! Fixtures: a daemon in a temp home, the CLI, and curl.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_postern");

/// The daemon under test; `POSTERN_IT_BIN` points at another build (e.g. to check that a
/// new test fails on an older binary).
pub fn daemon_bin() -> String {
    std::env::var("POSTERN_IT_BIN").unwrap_or_else(|_| BIN.to_owned())
}

/// A state directory and config file of one test.
pub struct Home {
    pub dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub fn config(&self, text: &str) -> PathBuf {
        let path = self.dir.path().join("postern.toml");
        std::fs::write(&path, text).expect("write config");
        path
    }

    /// A fresh home holding `template`'s vault, CA and SSH host key, so a test that starts
    /// many daemons skips making them (key derivation and certificates cost most of a start).
    pub fn seeded_from(template: &Home) -> Self {
        let home = Self::new();
        for name in ["vault.json", "certs", "ssh"] {
            let from = template.root().join(name);
            if from.exists() {
                copy_tree(&from, &home.root().join(name));
            }
        }
        home
    }

    /// Runs the CLI with this home and no daemon.
    pub fn cli(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("POSTERN_HOME", self.root())
            .env_remove("POSTERN_CONFIG")
            .env_remove("POSTERN_ADMIN")
            .env_remove("POSTERN_ADMIN_TOKEN")
            .env("POSTERN_ADMIN", "http://127.0.0.1:9");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output().expect("run postern")
    }

    /// `postern drill` (a synthetic invocation), optionally crashing after a kind.
    pub fn drill(
        &self,
        method: &str,
        through: &str,
        crash_after: Option<&str>,
    ) -> (String, Output) {
        let mut envs = vec![];
        if let Some(kind) = crash_after {
            envs.push(("POSTERN_CRASH_AFTER", kind));
        }
        let out = self.cli(&["drill", "--method", method, "--through", through], &envs);
        let id = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned();
        assert!(id.starts_with("act_"), "drill printed no id: {out:?}");
        (id, out)
    }
}

/// A running `postern serve`; killed on drop.
pub struct Daemon {
    pub child: Child,
    pub admin: String,
    pub proxy: String,
    pub home: PathBuf,
    pub stdout: Vec<String>,
    pub stderr_path: PathBuf,
    /// The banner's (and any later) stdout lines after the admin line.
    rest: std::sync::Mutex<mpsc::Receiver<String>>,
}

pub const TEST_CONFIG: &str = r#"
[proxy]
listen = "127.0.0.1:0"
[ssh]
listen = "127.0.0.1:0"
[admin]
listen = "127.0.0.1:0"
[journal]
min_free_bytes = "1MiB"
reserve_bytes = "1MiB"
"#;

impl Daemon {
    pub fn start(home: &Home, config: Option<&str>) -> Self {
        Self::start_with(home, config, &[])
    }

    pub fn start_with(home: &Home, config: Option<&str>, envs: &[(&str, &str)]) -> Self {
        Self::start_wrapped(home, config, envs, &[])
    }

    /// Starts `postern serve` as the last arguments of `wrapper` (e.g. `sh -c 'ulimit …'`).
    pub fn start_wrapped(
        home: &Home,
        config: Option<&str>,
        envs: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Self {
        let path = config.map(|text| home.config(text));
        Self::spawn(home, path.as_deref(), envs, wrapper)
    }

    /// Starts `postern serve --config PATH` (a config file the test placed).
    pub fn start_file(home: &Home, config: &Path) -> Self {
        Self::spawn(home, Some(config), &[], &[])
    }

    fn spawn(home: &Home, config: Option<&Path>, envs: &[(&str, &str)], wrapper: &[&str]) -> Self {
        let stderr_path = home
            .dir
            .path()
            .join(format!("serve-{}.stderr", std::process::id()));
        let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(daemon_bin());
                c
            }
            None => Command::new(daemon_bin()),
        };
        cmd.arg("serve")
            .env("POSTERN_HOME", home.root())
            .env_remove("POSTERN_CONFIG")
            .env_remove("POSTERN_CRASH_AFTER")
            .stdout(Stdio::piped())
            .stderr(stderr);
        if let Some(path) = config {
            cmd.arg("--config").arg(path);
        }
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Keep draining after start: a closed pipe would be a different test.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut lines = Vec::new();
        let mut proxy = String::new();
        let admin = loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    let found = line
                        .trim()
                        .strip_prefix("admin")
                        .map(|s| s.trim().to_owned());
                    if let Some(p) = line.trim().strip_prefix("proxy") {
                        proxy = p.trim().to_owned();
                    }
                    lines.push(line);
                    if let Some(url) = found {
                        break url;
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                    panic!("serve did not start: {lines:?}\n{err}");
                }
            }
        };
        Self {
            child,
            admin,
            proxy,
            home: home.root(),
            stdout: lines,
            stderr_path,
            rest: std::sync::Mutex::new(rx),
        }
    }

    /// The stdout lines after the admin line, up to one containing `until`.
    pub fn stdout_until(&self, until: &str) -> Vec<String> {
        let rx = self.rest.lock().expect("stdout receiver");
        let mut lines = Vec::new();
        while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
            let done = line.contains(until);
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Runs the CLI against this daemon.
    pub fn cli(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        let mut cmd = self.cli_command(args);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output().expect("run postern")
    }

    /// The CLI against this daemon, not yet started.
    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("POSTERN_HOME", &self.home)
            .env("POSTERN_ADMIN", &self.admin)
            .env_remove("POSTERN_CONFIG")
            .env_remove("POSTERN_ADMIN_TOKEN");
        cmd
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.admin)
    }

    /// Waits for the daemon to end on its own (a failpoint's abort); `None` if it still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Sends SIGTERM and waits for the exit code.
    /// Kills the daemon and waits for it (a restart on the same home follows).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn terminate(mut self) -> Option<i32> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..100 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- postern serve stderr ---\n{}", self.stderr());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP request with curl: status, body text, headers text.
pub fn curl(args: &[&str]) -> (u16, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let headers = dir.path().join("h");
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "-D"])
        .arg(&headers)
        .args(["-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl must be installed (tests/run installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let mut head = std::fs::read_to_string(&headers).unwrap_or_default();
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.trim().is_empty() {
        // Kept out of the body; visible in failure messages that print the head.
        head.push_str(&format!("\n(curl: {})", err.trim()));
    }
    let status = code.trim().parse().unwrap_or(0);
    if status == 0 {
        eprintln!("curl {args:?} got no response: {}", err.trim());
    }
    (status, body.to_owned(), head)
}

/// GET a JSON document.
pub fn get_json(url: &str, extra: &[&str]) -> (u16, Value) {
    let mut args = extra.to_vec();
    args.push(url);
    let (code, body, _) = curl(&args);
    (code, serde_json::from_str(&body).unwrap_or(Value::Null))
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn journal_dir(home: &Path) -> PathBuf {
    home.join("journal")
}

/// `postern secret set NAME` with the value on stdin.
pub fn secret_set(home: &Home, name: &str, value: &str, key: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["secret", "set", name])
        .env("POSTERN_HOME", home.root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match key {
        Some(k) => cmd.env("POSTERN_VAULT_KEY", k),
        None => cmd.env_remove("POSTERN_VAULT_KEY"),
    };
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{value}\n").as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("create dir");
        for entry in std::fs::read_dir(from).expect("read dir").flatten() {
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).expect("create dir");
        }
        std::fs::copy(from, to).expect("copy file");
    }
}

/// Runs `check` on every cell, `width` at a time, and fails once at the end naming every
/// cell that failed (a table-driven test reports its whole table, not its first miss).
/// `POSTERN_IT_CELL=<text>` runs only the cells whose name contains it (to reproduce one).
pub fn run_cells<T: Sync>(
    cells: &[T],
    width: usize,
    name: impl Fn(&T) -> String + Sync,
    check: impl Fn(&T) + Sync,
) {
    let only = std::env::var("POSTERN_IT_CELL").ok();
    let cells: Vec<&T> = cells
        .iter()
        .filter(|c| only.as_deref().is_none_or(|o| name(c).contains(o)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..width.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(cell) = cells.get(i) else { break };
                    let run =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(cell)));
                    if let Err(panic) = run {
                        let why = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        failed
                            .lock()
                            .unwrap()
                            .push(format!("{}: {why}", name(cell)));
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap();
    assert!(
        failed.is_empty(),
        "{} of {} cells failed:\n{}",
        failed.len(),
        cells.len(),
        failed.join("\n")
    );
}

/// Reads until postern closes the connection (EOF or reset); how long that took, or
/// `None` if it stayed open for `bound`. Whatever was sent first is returned too.
pub fn closed_within(stream: &mut TcpStream, bound: Duration) -> (Option<Duration>, String) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < bound {
        stream
            .set_read_timeout(Some(
                bound
                    .saturating_sub(start.elapsed())
                    .max(Duration::from_millis(1)),
            ))
            .unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return (Some(start.elapsed()), String::from_utf8_lossy(&got).into()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break;
            }
            Err(_) => return (Some(start.elapsed()), String::from_utf8_lossy(&got).into()),
        }
    }
    (None, String::from_utf8_lossy(&got).into())
}

/// Reads a response head byte by byte (so no byte after it is consumed).
pub fn read_head(stream: &mut TcpStream) -> String {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16_384 {
        match stream.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Everything postern stored, as text, for a grep after a secret: the raw bytes of every
/// file under its home (the WAL, uncompressed blocks, other files) and every value in the
/// journal decoded (compact events, LZ4-packed records), which raw bytes do not show
/// whole. Stops the daemon: the journal opens only once it let go.
pub fn stored_text(daemon: &mut Daemon) -> String {
    daemon.kill();
    let mut text = String::new();
    for file in files_under(&daemon.home) {
        text += &String::from_utf8_lossy(&std::fs::read(file).unwrap_or_default());
    }
    let Ok(db) = fjall::Database::builder(journal_dir(&daemon.home)).open() else {
        panic!("the journal under {} does not open", daemon.home.display());
    };
    for name in [
        "events",
        "by_invocation",
        "states",
        "open",
        "results",
        "requests",
        "result_expiry",
        "idempotency_keys",
        "idempotency_key_expiry",
        "resend_twins",
        "resend_twin_expiry",
    ] {
        let keyspace = db
            .keyspace(name, fjall::KeyspaceCreateOptions::default)
            .unwrap_or_else(|e| panic!("keyspace {name}: {e:?}"));
        for guard in keyspace.iter() {
            let (k, v) = guard
                .into_inner()
                .unwrap_or_else(|e| panic!("{name}: {e:?}"));
            text += &String::from_utf8_lossy(&k);
            let seq = k.as_ref().try_into().map(u64::from_be_bytes).unwrap_or(0);
            text += &match postern::journal::decode_stored(seq, &v) {
                Ok(events) if name == "events" => {
                    serde_json::to_string(&events).unwrap_or_default()
                }
                _ => match postern::journal::unpack_record(&v) {
                    Ok(json) => String::from_utf8_lossy(&json).into_owned(),
                    Err(e) => panic!("{name} holds a value that does not unpack: {e}"),
                },
            };
        }
    }
    assert!(
        text.contains("\"kind\":\"ACTION_ACCEPTED\""),
        "the journal's events were read decoded"
    );
    text
}

/// Every file below `dir`.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A port free now, below Linux's ephemeral range (32768–60999): a port the kernel hands
/// out for `bind(0)` or an outgoing connection could be taken by another test before the
/// daemon binds it (seen once: `[admin] listen: Address already in use`).
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    // One seed per test process: n·7919 mod 12000 then visits every port once, so no two
    // calls hand out the same port (a seed per call did: seen once as `Address already in use`).
    static SEED: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        nanos ^ std::process::id().wrapping_mul(2_654_435_761)
    });
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let step = (u64::from(seed) + u64::from(n) * 7_919) % 12_000;
        let port = 20_000 + step as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// `tests/sdk/node`, where the Node clients run; fails (never skips) when `package` is not
/// installed there (`tests/run` installs it from the lock file).
pub fn node_sdk_dir(package: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/node");
    assert!(
        dir.join("node_modules").join(package).is_dir(),
        "the Node package {package} is not installed in {} (run tests/run, which installs it)",
        dir.display()
    );
    dir
}
