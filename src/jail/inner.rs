//! The inner process: enter the namespaces, listen on the jail's loopback, hide the state,
//! run CMD and relay what it opens.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::net::{TcpListener as StdTcpListener, UdpSocket as StdUdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket, UnixStream};

use super::namespace::{self, Ids};
use super::relay::Service;
use super::sniff::{self, Sniffed};
use super::{EXIT_SETUP, PLAN_VAR, Plan, dns, exit_code, files, signals};

/// `postern __jail-inside -- CMD…`, started by the outer process with the plan in its
/// environment. Must run before any thread starts: unshare refuses a threaded process.
pub fn inside(cmd: &[OsString]) -> ExitCode {
    match run(cmd) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            super::note(&e);
            ExitCode::from(EXIT_SETUP)
        }
    }
}

/// What the jail listens on, bound before the second user namespace (ports under 1024
/// need the first one's capabilities).
struct Listeners {
    proxy: StdTcpListener,
    ssh: StdTcpListener,
    https: StdTcpListener,
    http: StdTcpListener,
    dns: StdUdpSocket,
    /// The other ports the agent's routes name, with whether their scheme is https.
    extra: Vec<(StdTcpListener, u16, bool)>,
}

impl Listeners {
    fn bind(ports: &[(u16, bool)]) -> Result<Self, String> {
        let tcp = |port: u16| {
            let l = StdTcpListener::bind(("127.0.0.1", port))
                .map_err(|e| format!("cannot listen on 127.0.0.1:{port} in the jail: {e}"))?;
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            Ok::<_, String>(l)
        };
        let dns = StdUdpSocket::bind(("127.0.0.1", 53))
            .map_err(|e| format!("cannot listen on 127.0.0.1:53/udp in the jail: {e}"))?;
        dns.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut extra = Vec::new();
        for &(port, tls) in ports {
            if ![3128, 2222, 443, 80, 53].contains(&port) {
                extra.push((tcp(port)?, port, tls));
            }
        }
        Ok(Self {
            proxy: tcp(3128)?,
            ssh: tcp(2222)?,
            https: tcp(443)?,
            http: tcp(80)?,
            dns,
            extra,
        })
    }
}

fn run(cmd: &[OsString]) -> Result<u8, String> {
    let plan = std::env::var(PLAN_VAR)
        .map_err(|_| format!("{PLAN_VAR} is not set (run `postern jail`, not this)"))
        .and_then(|t| Plan::decode(&t))?;
    let Some((program, args)) = cmd.split_first() else {
        return Err("no command to run".into());
    };
    // If the outer process dies, so does the jail.
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let ids = Ids::current();
    namespace::enter(ids).map_err(|e| e.to_string())?;
    let listeners = Listeners::bind(&plan.ports)?;
    hide(&plan)?;
    reenter_cwd();
    let pending = signals::catch()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("postern-jail")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the jail's relay: {e}"))?;
    {
        let _guard = runtime.enter();
        start(listeners, Arc::new(plan))?;
    }
    // CMD and whatever it starts live in a PID namespace of their own, under `__jail-init`:
    // when CMD ends, the kernel ends every process left in it.
    let forward = signals::forwarder(pending);
    namespace::new_pid_namespace().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the postern binary to re-execute: {e}"))?;
    let mut child = Command::new(exe)
        .arg("__jail-init")
        .arg(format!("--uid={}", ids.uid))
        .arg(format!("--gid={}", ids.gid))
        .arg("--")
        .arg(program)
        .args(args)
        .env_remove(PLAN_VAR)
        .spawn()
        .map_err(|e| format!("cannot start the jail's init: {e}"))?;
    forward.to(child.id());
    let status = child
        .wait()
        .map_err(|e| format!("cannot wait for CMD: {e}"))?;
    runtime.shutdown_background();
    Ok(exit_code(status))
}

/// `postern __jail-init --uid U --gid G -- CMD…`: PID 1 of the jail's PID namespace. Mounts
/// the jail's /proc, locks the mounts behind a second user namespace where the caller's ids
/// are its own again, runs CMD, forwards signals to it (PID 1 only receives the signals it
/// handles), reaps orphans, and exits with CMD's status — which ends every process still in
/// the namespace.
pub fn init(caller: Ids, cmd: &[OsString]) -> ExitCode {
    let locked = namespace::mount_proc().and_then(|()| namespace::lock(caller));
    if let Err(e) = locked {
        super::note(&e.to_string());
        return ExitCode::from(EXIT_SETUP);
    }
    // A session of its own: the caller's terminal is no longer CMD's controlling one, so
    // CMD cannot push keystrokes into it (TIOCSTI) for the caller's shell to run after the
    // jail. Signals still reach CMD: postern forwards them.
    if let Err(e) = nix::unistd::setsid() {
        super::note(&format!("cannot start a session of the jail's own: {e}"));
        return ExitCode::from(EXIT_SETUP);
    }
    reenter_cwd();
    ExitCode::from(init_status(cmd))
}

fn init_status(cmd: &[OsString]) -> u8 {
    use nix::sys::wait::{WaitStatus, waitpid};
    let Some((program, args)) = cmd.split_first() else {
        return EXIT_SETUP;
    };
    let forward = match signals::catch() {
        Ok(p) => signals::forwarder(p),
        Err(e) => {
            super::note(&e);
            return EXIT_SETUP;
        }
    };
    let child = match Command::new(program).args(args).spawn() {
        Ok(c) => c,
        Err(e) => {
            super::note(&format!("cannot run {}: {e}", program.to_string_lossy()));
            return match e.kind() {
                ErrorKind::NotFound => 127,
                _ => 126,
            };
        }
    };
    let pid = child.id();
    forward.to(pid);
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(p, code)) if p.as_raw().unsigned_abs() == pid => {
                return u8::try_from(code & 0xff).unwrap_or(1);
            }
            Ok(WaitStatus::Signaled(p, signal, _)) if p.as_raw().unsigned_abs() == pid => {
                return u8::try_from((128 + signal as i32) & 0xff).unwrap_or(1);
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return 1,
        }
    }
}

/// The pinned ancestors, the jails' directory covered but for this jail's own, the state
/// directory and the config under empty mounts; the stub's resolv.conf.
fn hide(plan: &Plan) -> Result<(), String> {
    let own = open_own_dir(plan)?;
    for dir in &plan.pin_dirs {
        namespace::pin_dir(dir).map_err(|e| e.to_string())?;
    }
    if let (Some(root), Some(name)) = (plan.dir.parent(), plan.dir.file_name()) {
        let handle = PathBuf::from(format!("/proc/self/fd/{}", own.as_raw_fd()));
        namespace::cover_keeping(root, &handle, name).map_err(|e| e.to_string())?;
    }
    drop(own);
    for dir in &plan.hide_dirs {
        namespace::hide_dir(dir).map_err(|e| e.to_string())?;
    }
    let empty = plan.dir.join(files::EMPTY);
    for file in &plan.hide_files {
        namespace::bind_file(&empty, file).map_err(|e| e.to_string())?;
    }
    let resolv = plan.dir.join(files::RESOLV);
    if let Err(e) = namespace::bind_file(&resolv, Path::new("/etc/resolv.conf")) {
        super::note(&format!(
            "{e}; programs that ignore the proxy variables will not resolve names"
        ));
    }
    for (name, target) in &plan.binds {
        if let Err(e) = namespace::bind_file(&plan.dir.join(name), target) {
            super::note(&e.to_string());
        }
    }
    Ok(())
}

/// The private directory the outer process made, opened before anything is mounted over
/// its path and checked to be that very directory (not one put in its place).
fn open_own_dir(plan: &Plan) -> Result<std::fs::File, String> {
    use std::os::unix::fs::MetadataExt;
    let fail = |e: std::io::Error| format!("cannot open {}: {e}", plan.dir.display());
    let dir = std::fs::File::open(&plan.dir).map_err(fail)?;
    let meta = dir.metadata().map_err(fail)?;
    if !meta.is_dir() || (meta.dev(), meta.ino()) != plan.dir_id {
        return Err(format!(
            "{} was replaced before the jail started; CMD did not run",
            plan.dir.display()
        ));
    }
    Ok(dir)
}

/// A working directory inside a hidden directory would still reach what is under the
/// mount: look it up again by path.
fn reenter_cwd() {
    if let Ok(cwd) = std::env::current_dir()
        && std::env::set_current_dir(&cwd).is_err()
    {
        let _ = std::env::set_current_dir("/");
    }
}

/// The jail's listeners, as tasks on the current runtime.
fn start(l: Listeners, plan: Arc<Plan>) -> Result<(), String> {
    let tokio_tcp = |s: StdTcpListener| TcpListener::from_std(s).map_err(|e| e.to_string());
    let socket = Arc::new(plan.socket());
    let auth = Arc::new(plan.authorization.clone());
    tokio::spawn(accept(
        tokio_tcp(l.proxy)?,
        Kind::Forward(Service::Proxy),
        socket.clone(),
        auth.clone(),
    ));
    tokio::spawn(accept(
        tokio_tcp(l.ssh)?,
        Kind::Forward(Service::Ssh),
        socket.clone(),
        auth.clone(),
    ));
    tokio::spawn(accept(
        tokio_tcp(l.https)?,
        Kind::Transparent {
            port: 443,
            tls: true,
        },
        socket.clone(),
        auth.clone(),
    ));
    tokio::spawn(accept(
        tokio_tcp(l.http)?,
        Kind::Transparent {
            port: 80,
            tls: false,
        },
        socket.clone(),
        auth.clone(),
    ));
    for (listener, port, tls) in l.extra {
        tokio::spawn(accept(
            tokio_tcp(listener)?,
            Kind::Transparent { port, tls },
            socket.clone(),
            auth.clone(),
        ));
    }
    let dns = UdpSocket::from_std(l.dns).map_err(|e| e.to_string())?;
    tokio::spawn(serve_dns(dns));
    Ok(())
}

#[derive(Clone, Copy)]
enum Kind {
    /// Bytes to the service as they come.
    Forward(Service),
    /// A client that ignored the proxy: `CONNECT <name>:<port>` to the proxy first.
    Transparent { port: u16, tls: bool },
}

async fn accept(
    listener: TcpListener,
    kind: Kind,
    socket: Arc<PathBuf>,
    auth: Arc<Option<String>>,
) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (socket, auth) = (socket.clone(), auth.clone());
        tokio::spawn(async move {
            let _ = conn.set_nodelay(true);
            let _ = match kind {
                Kind::Forward(service) => forward(conn, service, &socket).await,
                Kind::Transparent { port, tls } => {
                    transparent(conn, (port, tls), &socket, auth.as_deref()).await
                }
            };
        });
    }
}

async fn dial(socket: &Path, service: Service) -> std::io::Result<UnixStream> {
    let mut up = UnixStream::connect(socket).await?;
    up.write_all(&[service.byte()]).await?;
    Ok(up)
}

async fn forward(mut conn: TcpStream, service: Service, socket: &Path) -> std::io::Result<()> {
    let mut up = dial(socket, service).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut up).await?;
    Ok(())
}

/// How long a transparent client may take to name its host, and postern to answer.
const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);

async fn transparent(
    mut conn: TcpStream,
    (port, tls): (u16, bool),
    socket: &Path,
    auth: Option<&str>,
) -> std::io::Result<()> {
    let mut early = Vec::with_capacity(4096);
    let host = loop {
        let sniffed = match tls {
            true => sniff::sni(&early),
            false => sniff::http_host(&early),
        };
        match sniffed {
            Sniffed::Name(host) => break host,
            Sniffed::Nameless => {
                super::note(&format!(
                    "a connection to 127.0.0.1:{port} named no host ({}); closed",
                    if tls { "no TLS SNI" } else { "no HTTP Host" }
                ));
                return Ok(());
            }
            Sniffed::More if early.len() >= sniff::MAX_PEEK => return Ok(()),
            Sniffed::More => {}
        }
        let n = tokio::time::timeout(SNIFF_TIMEOUT, conn.read_buf(&mut early)).await??;
        if n == 0 {
            return Ok(());
        }
    };
    let mut up = dial(socket, Service::Proxy).await?;
    up.write_all(connect_request(&host, port, auth, tls).as_bytes())
        .await?;
    let answer = tokio::time::timeout(SNIFF_TIMEOUT, read_head(&mut up)).await??;
    if answer.status == 200 {
        conn.write_all(&answer.rest).await?;
        up.write_all(&early).await?;
        tokio::io::copy_bidirectional(&mut conn, &mut up).await?;
        return Ok(());
    }
    let body = tokio::time::timeout(Duration::from_secs(2), read_body(&mut up, &answer))
        .await
        .unwrap_or_else(|_| answer.rest.clone());
    if tls {
        // A TLS client cannot be shown an HTTP answer: say it on the jail's stderr.
        super::note(&format!(
            "postern refused CONNECT {host}:{port}: {} {}",
            answer.line,
            String::from_utf8_lossy(&body).trim()
        ));
    } else {
        conn.write_all(&answer.head).await?;
        conn.write_all(&body).await?;
    }
    Ok(())
}

/// The CONNECT for a client that ignored the proxy. A TLS client cannot read the CONNECT's
/// answer, so postern is asked to refuse inside the TLS it expects (a 403 envelope it can
/// read) rather than to the CONNECT.
fn connect_request(host: &str, port: u16, auth: Option<&str>, tls: bool) -> String {
    let mut req = format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n");
    if let Some(auth) = auth {
        req.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
    }
    if tls {
        req.push_str("Postern-Refuse-Inside: tls\r\n");
    }
    req.push_str("\r\n");
    req
}

/// The proxy's answer to a CONNECT: its head, status, and the bytes read past the head.
struct Head {
    head: Vec<u8>,
    line: String,
    status: u16,
    rest: Vec<u8>,
}

const MAX_HEAD: usize = 16 * 1024;

async fn read_head(up: &mut UnixStream) -> std::io::Result<Head> {
    let mut buf = Vec::with_capacity(1024);
    loop {
        if let Some(end) = memchr::memmem::find(&buf, b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            let text = String::from_utf8_lossy(&buf);
            let line = text.lines().next().unwrap_or("").to_owned();
            let status = line
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            return Ok(Head {
                head: buf,
                line,
                status,
                rest,
            });
        }
        if buf.len() > MAX_HEAD || up.read_buf(&mut buf).await? == 0 {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                "postern closed the CONNECT without an answer",
            ));
        }
    }
}

/// A refusal's body (`Content-Length` of it, at most 64 KiB).
async fn read_body(up: &mut UnixStream, head: &Head) -> Vec<u8> {
    let text = String::from_utf8_lossy(&head.head).to_ascii_lowercase();
    let length = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0)
        .min(64 * 1024);
    let mut body = head.rest.clone();
    while body.len() < length {
        match up.read_buf(&mut body).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    body.truncate(length);
    body
}

async fn serve_dns(socket: UdpSocket) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        if let Some(reply) = buf.get(..n).and_then(dns::answer) {
            let _ = socket.send_to(&reply, from).await;
        }
    }
}
