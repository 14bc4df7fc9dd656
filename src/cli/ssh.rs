//! `postern ssh-connect` (the agent's ProxyCommand) and `postern ssh-config`.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::process::ExitCode;

use super::{CliError, Env, Home};
use crate::ssh::hostkey;
use crate::ssh::preamble::{MAX_LINE, Preamble};

/// What ssh exits with when the connection fails; the bridge uses it for a refusal too.
const EXIT_REFUSED: u8 = 255;

#[derive(clap::Args, Debug)]
pub struct ConnectArgs {
    /// The remote user (%r).
    #[arg(value_name = "USER")]
    pub user: String,
    /// The host the agent's ssh names (%h).
    #[arg(value_name = "HOST")]
    pub host: String,
    /// The port (%p).
    #[arg(value_name = "PORT")]
    pub port: u16,
    /// postern's SSH front (default: POSTERN_SSH_PROXY, else the config's [ssh] listen, else 127.0.0.1:2222).
    #[arg(long, value_name = "ADDR")]
    pub proxy: Option<String>,
}

fn proxy_address(config: Option<&Path>, args: &ConnectArgs, env: Env<'_>) -> String {
    args.proxy
        .clone()
        .or_else(|| env("POSTERN_SSH_PROXY").filter(|s| !s.is_empty()))
        .or_else(|| {
            crate::config::load_addresses(config, env)
                .ok()
                .map(|c| c.ssh.listen.to_string())
        })
        .unwrap_or_else(|| "127.0.0.1:2222".into())
}

pub fn connect(
    config: Option<&Path>,
    args: &ConnectArgs,
    env: Env<'_>,
) -> Result<ExitCode, CliError> {
    let preamble = Preamble {
        agent: env("POSTERN_AGENT").filter(|s| !s.is_empty()),
        token: env("POSTERN_AGENT_TOKEN").filter(|s| !s.is_empty()),
        user: args.user.clone(),
        host: args.host.clone(),
        port: args.port,
    };
    let address = proxy_address(config, args, env);
    Ok(bridge(&address, &preamble))
}

/// Sends the preamble; on `OK` relays stdin → front → stdout until the front closes.
/// Plain blocking I/O on two threads: the bridge carries every byte of the session, and an
/// async stdout would hand each chunk to a blocking pool thread.
fn bridge(address: &str, preamble: &Preamble) -> ExitCode {
    let stream = match TcpStream::connect(address) {
        Ok(s) => s,
        Err(e) => {
            errln!(
                "postern: cannot reach postern's SSH front at {address}: {e} (is `postern serve` running? set --proxy or POSTERN_SSH_PROXY)"
            );
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    let _ = stream.set_nodelay(true);
    if let Err(e) = (&stream).write_all(preamble.encode().as_bytes()) {
        errln!("postern: postern's SSH front at {address} closed the connection: {e}");
        return ExitCode::from(EXIT_REFUSED);
    }
    let mut read = BufReader::new(&stream);
    let mut line = Vec::new();
    let got = (&mut read)
        .take(MAX_LINE as u64 * 4)
        .read_until(b'\n', &mut line);
    let text = String::from_utf8_lossy(&line);
    let text = text.trim_end();
    if got.is_err() || text != "OK" {
        let shown = text.strip_prefix("ERR ").unwrap_or(text);
        let shown = if shown.is_empty() {
            "(the SSH front closed the connection)"
        } else {
            shown
        };
        errln!("{shown}");
        if shown.contains("\"AGENT_UNAUTHENTICATED\"") {
            errln!("{}", identity_hint(preamble));
        }
        return ExitCode::from(EXIT_REFUSED);
    }
    // SSH bytes the front sent right behind `OK` are already in the line reader's buffer.
    let early = read.buffer().to_vec();
    if let Err(e) = relay(&stream, &early) {
        errln!("postern: cannot bridge stdin/stdout to postern's SSH front: {e}");
        return ExitCode::from(EXIT_REFUSED);
    }
    ExitCode::SUCCESS
}

/// The envelope says "proxy credentials" (its message is shared with the HTTP proxy); the
/// bridge's identity comes from two variables, so name them.
fn identity_hint(preamble: &Preamble) -> &'static str {
    match (&preamble.agent, &preamble.token) {
        (None, _) | (_, None) => {
            "postern: ssh-connect identifies the agent by POSTERN_AGENT (its [[agents]] id) and POSTERN_AGENT_TOKEN (its token): set both"
        }
        _ => {
            "postern: POSTERN_AGENT and POSTERN_AGENT_TOKEN do not name a configured agent with that token"
        }
    }
}

/// stdin → front on its own thread; front → stdout here until the front closes. The
/// process exits then, so a stdin thread still blocked in a read is not waited for.
fn relay(stream: &TcpStream, early: &[u8]) -> std::io::Result<()> {
    let stdin = owned(std::io::stdin().as_fd())?;
    let mut stdout = owned(std::io::stdout().as_fd())?;
    let up = stream.try_clone()?;
    std::thread::spawn(move || {
        pump(stdin, &up);
        let _ = up.shutdown(Shutdown::Write);
    });
    if stdout.write_all(early).is_ok() {
        pump(stream, stdout);
    }
    Ok(())
}

/// Bytes bridged per read: large enough that a bulk transfer costs few system calls.
const PUMP_BUFFER: usize = 128 * 1024;

/// Copies until EOF or an error, writing each read as soon as it arrives. (Not `io::copy`:
/// between a pipe and a socket it splices, and spliced writes stalled the SSH exchange.)
fn pump(mut from: impl Read, mut to: impl Write) {
    let mut buf = vec![0; PUMP_BUFFER];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let Some(chunk) = buf.get(..n) else { return };
                if to.write_all(chunk).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// stdin/stdout as files of their own: unbuffered, no line scanning, no stdio lock.
fn owned(fd: BorrowedFd<'_>) -> std::io::Result<File> {
    fd.try_clone_to_owned().map(File::from)
}

/// `postern ssh-config`: the `~/.ssh/config` block and postern's known_hosts line; writes the
/// known_hosts file the block points at.
pub fn config(config: Option<&Path>, home: &Home, env: Env<'_>) -> Result<ExitCode, CliError> {
    let cfg = crate::config::load_addresses(config, env)?;
    home.create()
        .map_err(|e| CliError::Failed(format!("cannot create {}: {e}", home.root.display())))?;
    let key = super::serve::load_host_key(home)?;
    let names = hostkey::target_names(&cfg);
    let mut hosts: Vec<String> = cfg.ssh_targets.iter().map(|t| t.host.clone()).collect();
    hosts.sort();
    hosts.dedup();
    if hosts.is_empty() {
        errln!("postern: the config has no [[ssh_targets]]; the block below matches no host");
    }
    let line = hostkey::known_hosts_line(&names, &key).map_err(CliError::Failed)?;
    let known = hostkey::known_hosts_path(&home.ssh_dir());
    std::fs::write(&known, format!("{line}\n"))
        .map_err(|e| CliError::Failed(format!("cannot write {}: {e}", known.display())))?;
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| std::path::absolute(p).ok())
        .map_or_else(|| "postern".into(), |p| p.display().to_string());
    let proxy = match cfg.ssh.listen.port() {
        0 | 2222 => String::new(),
        _ => format!(" --proxy {}", cfg.ssh.listen),
    };
    outln!("# postern: SSH targets reached through postern (postern ssh-config >> ~/.ssh/config)");
    outln!(
        "Host {}",
        if hosts.is_empty() {
            "postern.invalid".into()
        } else {
            hosts.join(" ")
        }
    );
    outln!("    ProxyCommand {exe} ssh-connect{proxy} %r %h %p");
    outln!("    UserKnownHostsFile {}", known.display());
    outln!("    StrictHostKeyChecking yes");
    outln!("# known_hosts line (written to {}):", known.display());
    outln!("# {line}");
    Ok(ExitCode::SUCCESS)
}
