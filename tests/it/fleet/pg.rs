//! A PostgreSQL of the test's own: `initdb` into a temporary directory, started on a free
//! loopback port (as the `postgres` user when the test runs as root: PostgreSQL refuses
//! root), stopped and removed at the end. Fails, never skips, when PostgreSQL is missing.
//! Shared with `bench/http.rs` (the cluster cell), so it depends on nothing of the tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A loopback port free now (PostgreSQL binds it a moment later).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

pub struct Postgres {
    _dir: tempfile::TempDir,
    data: PathBuf,
    sockets: PathBuf,
    log: PathBuf,
    bin: PathBuf,
    pub port: u16,
}

/// Debian's PostgreSQL binaries (`/usr/lib/postgresql/N/bin`), the newest.
fn bin_dir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    found.retain(|p| p.join("initdb").exists());
    found.sort();
    found
        .pop()
        .expect("PostgreSQL is not installed (tests/run installs Debian's postgresql)")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs a PostgreSQL program, as `postgres` when this test is root.
fn run(bin: &Path, program: &str, args: &[&str]) -> Output {
    let exe = bin.join(program);
    let mut cmd = match is_root() {
        true => {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        }
        false => Command::new(&exe),
    };
    cmd.args(args).output().expect("run a PostgreSQL program")
}

fn chown_to_postgres(path: &Path) {
    if is_root() {
        let ok = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path)
            .status()
            .expect("chown")
            .success();
        assert!(ok, "chown {} to postgres", path.display());
    }
}

impl Postgres {
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        let data = dir.path().join("data");
        let sockets = dir.path().join("sock");
        std::fs::create_dir_all(&sockets).expect("socket dir");
        let log = dir.path().join("log");
        std::fs::write(&log, b"").expect("log file");
        chown_to_postgres(dir.path());
        let init = run(
            &bin,
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "postern",
                "--no-sync",
            ],
        );
        assert!(
            init.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let pg = Self {
            _dir: dir,
            data,
            sockets,
            log,
            bin,
            port: free_port(),
        };
        pg.start_again();
        pg
    }

    /// postgres://… for `[cluster] postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postern@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server (again, after `stop`) and waits until it takes connections.
    pub fn start_again(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.sockets.display()
        );
        let out = run(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                self.data.to_str().unwrap(),
                "-o",
                &options,
                "-l",
                self.log.to_str().unwrap(),
                "-w",
                "start",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start: {} {}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// Stops the server at once (connections are cut).
    pub fn stop(&self) {
        let _ = run(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                self.data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    /// One SQL statement through psql; its output rows.
    pub fn sql(&self, statement: &str) -> String {
        let out = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postern",
            ])
            .args(["-d", "postgres", "-At", "-c", statement])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
