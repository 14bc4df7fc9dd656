//! `postern ssh-connect` (the agent's ProxyCommand) and `postern ssh-config`.

use std::path::Path;
use std::process::ExitCode;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("cannot start the runtime: {e}")))?;
    let code = runtime.block_on(bridge(&address, &preamble));
    // stdin may still be blocked in a read: do not wait for it.
    runtime.shutdown_background();
    Ok(code)
}

/// Sends the preamble; on `OK` relays stdin → front → stdout until the front closes.
async fn bridge(address: &str, preamble: &Preamble) -> ExitCode {
    let stream = match tokio::net::TcpStream::connect(address).await {
        Ok(s) => s,
        Err(e) => {
            errln!(
                "postern: cannot reach postern's SSH front at {address}: {e} (is `postern serve` running? set --proxy or POSTERN_SSH_PROXY)"
            );
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    if let Err(e) = write.write_all(preamble.encode().as_bytes()).await {
        errln!("postern: postern's SSH front at {address} closed the connection: {e}");
        return ExitCode::from(EXIT_REFUSED);
    }
    let mut line = Vec::new();
    let got = (&mut read)
        .take(MAX_LINE as u64 * 4)
        .read_until(b'\n', &mut line)
        .await;
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
        return ExitCode::from(EXIT_REFUSED);
    }
    relay(read, write).await;
    ExitCode::SUCCESS
}

async fn relay(
    mut read: BufReader<tokio::net::tcp::OwnedReadHalf>,
    mut write: tokio::net::tcp::OwnedWriteHalf,
) {
    let upstream = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let _ = tokio::io::copy(&mut stdin, &mut write).await;
        let _ = write.shutdown().await;
    });
    let mut stdout = tokio::io::stdout();
    let _ = tokio::io::copy_buf(&mut read, &mut stdout).await;
    let _ = stdout.flush().await;
    upstream.abort();
}

/// `postern ssh-config`: the `~/.ssh/config` block and postern's known_hosts line; writes the
/// known_hosts file the block points at.
pub fn config(config: Option<&Path>, home: &Home, env: Env<'_>) -> Result<ExitCode, CliError> {
    let cfg = crate::config::load_addresses(config, env)?;
    home.create()
        .map_err(|e| CliError::Failed(format!("cannot create {}: {e}", home.root.display())))?;
    let key = super::serve::load_host_key(home)?;
    let mut names: Vec<String> = cfg
        .ssh_targets
        .iter()
        .map(|t| hostkey::known_hosts_name(&t.host, t.port))
        .collect();
    names.sort();
    names.dedup();
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
