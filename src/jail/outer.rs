//! The outer process: the private directory, the unix-socket relay to the daemon, the
//! inner process, signals and the exit status.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpStream, UnixListener, UnixStream};

use super::relay::{Service, dialable};
use super::{EXIT_SETUP, PLAN_VAR, Plan, exit_code, signals};

/// The jail's private directory (mode 0700) under `ROOTS`' directory for this uid; removed
/// on drop, with the relay socket in it. Every jail covers that directory with an empty one
/// and shows only its own private directory there: no other jail of the same user can
/// rename, replace or read another's relay socket or CA files (issue 40).
pub struct PrivateDir {
    path: PathBuf,
    id: (u64, u64),
}

impl PrivateDir {
    pub fn create() -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let root = jails_root();
        own_private_dir(&root)?;
        let path = root.join(ulid::Ulid::generate().to_string());
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let meta = std::fs::symlink_metadata(&path)?;
        Ok(Self {
            path,
            id: (meta.dev(), meta.ino()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// (device, inode): the inner process checks it opened this very directory.
    pub fn id(&self) -> (u64, u64) {
        self.id
    }
}

/// Where this uid's jails keep their private directories: one fixed place (not `TMPDIR`,
/// which differs between callers), so every jail covers every other's.
pub fn jails_root() -> PathBuf {
    PathBuf::from(format!(
        "/tmp/postern-jail-{}",
        nix::unistd::getuid().as_raw()
    ))
}

/// Makes `dir` (0700) or checks that it is this uid's own, private, and no symlink: another
/// user could have made it first to watch the jails.
fn own_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let me = nix::unistd::getuid().as_raw();
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a directory of this user's with mode 0700 (owner uid {}, mode {:o});              remove it, postern jail makes it",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Everything the outer process needs, resolved by the CLI.
pub struct Outer {
    pub dir: PrivateDir,
    /// The daemon's proxy and SSH front (`[proxy] listen`, `[ssh] listen`).
    pub proxy: SocketAddr,
    pub ssh: SocketAddr,
    /// CMD's whole environment.
    pub env: Vec<(OsString, OsString)>,
    pub plan: Plan,
}

/// Runs CMD in the jail; returns its exit status (125 when the jail could not be made).
/// Marks every descriptor the caller handed down (3 and up) close-on-exec, so none reaches
/// CMD: an open directory or file would reach past the hidden state directory and config,
/// a socket past the network namespace (`exec 8<~/.postern; postern jail …`).
fn seal_inherited() {
    if close_range_cloexec(3) {
        return;
    }
    // Kernels before 5.11 have no close_range: one descriptor at a time.
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let numbers = fds
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok());
    for fd in numbers.filter(|fd| *fd >= 3) {
        set_cloexec(fd);
    }
}

#[allow(unsafe_code)]
fn close_range_cloexec(first: u32) -> bool {
    let flags = libc::CLOSE_RANGE_CLOEXEC as libc::c_int;
    // SAFETY: only descriptor flags change; no memory is passed.
    unsafe { libc::close_range(first, u32::MAX, flags) == 0 }
}

#[allow(unsafe_code)]
fn set_cloexec(fd: i32) {
    // SAFETY: fcntl on a descriptor number; one closed meanwhile fails with EBADF, harmlessly.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

pub fn run(outer: Outer, cmd: &[OsString]) -> u8 {
    match run_inner(&outer, cmd) {
        Ok(code) => code,
        Err(e) => {
            super::note(&e);
            EXIT_SETUP
        }
    }
    // `outer.dir` drops here: the socket and the copies go.
}

fn run_inner(outer: &Outer, cmd: &[OsString]) -> Result<u8, String> {
    seal_inherited();
    let forward = signals::forwarder(signals::catch()?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("postern-jail")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the relay: {e}"))?;
    let socket = outer.plan.socket();
    let listener = {
        let _guard = runtime.enter();
        UnixListener::bind(&socket)
            .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?
    };
    runtime.spawn(serve(listener, outer.proxy, outer.ssh));
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the postern binary to re-execute: {e}"))?;
    let mut child = Command::new(exe)
        .arg("__jail-inside")
        .arg("--")
        .args(cmd)
        .env_clear()
        .envs(outer.env.iter().map(|(k, v)| (k, v)))
        .env(PLAN_VAR, outer.plan.encode())
        .spawn()
        .map_err(|e| format!("cannot start the jail: {e}"))?;
    forward.to(child.id());
    let status = child
        .wait()
        .map_err(|e| format!("cannot wait for the jail: {e}"))?;
    runtime.shutdown_background();
    Ok(exit_code(status))
}

/// Bridges each unix connection to the service its first byte names.
async fn serve(listener: UnixListener, proxy: SocketAddr, ssh: SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                tokio::spawn(bridge(conn, proxy, ssh));
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}

async fn bridge(mut conn: UnixStream, proxy: SocketAddr, ssh: SocketAddr) {
    let Ok(first) = conn.read_u8().await else {
        return;
    };
    let target = match Service::from_byte(first) {
        Some(Service::Proxy) => proxy,
        Some(Service::Ssh) => ssh,
        None => return,
    };
    let Ok(mut up) = TcpStream::connect(dialable(target)).await else {
        return;
    };
    let _ = up.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
}
