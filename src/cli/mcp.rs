//! `postern mcp --agent ID` (SPEC §3.9): resolves the agent and the daemon's proxy from the
//! config, as `postern jail` does, then serves MCP on stdio (`crate::mcp`).

use std::path::Path;
use std::process::ExitCode;

use super::env::{UNSET, acting_agent};
use super::{Env, Home};

pub fn run(config: Option<&Path>, home: &Home, agent: Option<&str>, env: Env<'_>) -> ExitCode {
    match settings(config, home, agent, env) {
        Ok(settings) => crate::mcp::run(settings),
        Err(message) => {
            errln!("{message}");
            ExitCode::from(1)
        }
    }
}

fn settings(
    config: Option<&Path>,
    home: &Home,
    agent: Option<&str>,
    env: Env<'_>,
) -> Result<crate::mcp::Settings, String> {
    let lookup = |name: &str| {
        env(name)
            .filter(|v| !v.is_empty())
            .or_else(|| Some(format!("{UNSET}{name}")))
    };
    let config = crate::config::load(config, &lookup).map_err(|e| format!("postern mcp: {e}"))?;
    let identity = acting_agent(&config, agent, env, "postern mcp")?;
    if identity.is_none()
        && let Some(first) = config.agents.first()
    {
        return Err(format!(
            "postern mcp: this config has [[agents]]: pass --agent ID (e.g. --agent {}) or set POSTERN_AGENT",
            first.id
        ));
    }
    // An agent-less config runs everyone as `anonymous`, which needs no identity.
    let authorization = identity
        .as_ref()
        .map(super::env::Identity::authorization)
        .unwrap_or_default();
    // A wrong token is said now, not at every call; a daemon not up yet is each call's news,
    // and a warning now (a config that is not the daemon's names another address).
    match super::env::check_identity(config.proxy.listen, identity.as_ref()) {
        super::env::IdentityCheck::Refused(body) => {
            let hint = super::env::refused_hint(identity.as_ref().map(|i| i.agent.as_str()));
            return Err(format!("{body}\npostern mcp: {hint}"));
        }
        super::env::IdentityCheck::Unreachable(why) => errln!(
            "postern mcp: warning: {why}; every call is CONNECTION_REFUSED until the daemon answers \
             there (is this the daemon's config? --config or POSTERN_CONFIG names it)"
        ),
        super::env::IdentityCheck::Taken => {}
    }
    let ca = home.certs_dir().join("ca.pem");
    if !ca.is_file() {
        return Err(format!(
            "postern mcp: no CA at {} (is POSTERN_HOME the daemon's state directory? `postern serve` makes it)",
            ca.display()
        ));
    }
    // As for ssh-connect: POSTERN_SSH_PROXY names the front where the config cannot.
    let ssh = env("POSTERN_SSH_PROXY")
        .and_then(|a| a.parse().ok())
        .unwrap_or(config.ssh.listen);
    let front = crate::mcp::Front {
        addr: crate::jail::dialable(ssh),
        agent: identity.as_ref().map(|i| i.agent.clone()),
        token: identity.map(|i| i.token),
        host_key: front_key(home),
    };
    Ok(crate::mcp::Settings {
        proxy: crate::jail::dialable(config.proxy.listen),
        authorization,
        ca,
        front,
        max_request_bytes: config.proxy.max_request_bytes,
    })
}

/// postern's SSH host key: from the key itself where this user may read it, else from the
/// `known_hosts` file `postern ssh-config` writes beside it.
fn front_key(home: &Home) -> Option<russh::keys::PublicKey> {
    use crate::ssh::hostkey;
    let dir = home.ssh_dir();
    if let Ok(text) = std::fs::read_to_string(hostkey::key_path(&dir))
        && let Ok(key) = russh::keys::PrivateKey::from_openssh(text.as_bytes())
    {
        return Some(key.public_key().clone());
    }
    let text = std::fs::read_to_string(hostkey::known_hosts_path(&dir)).ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace().skip(1);
        let key = format!("{} {}", fields.next()?, fields.next()?);
        russh::keys::PublicKey::from_openssh(&key).ok()
    })
}
