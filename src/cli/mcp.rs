//! `postern mcp --agent ID` (SPEC §3.9): resolves the agent and the daemon's proxy from the
//! config, as `postern jail` does, then serves MCP on stdio (`crate::mcp`).

use std::path::Path;
use std::process::ExitCode;

use super::env::{UNSET, acting_agent};
use super::{Env, Home};

pub fn run(config: Option<&Path>, home: &Home, agent: Option<&str>, env: Env<'_>) -> ExitCode {
    match settings(config, home, agent, env) {
        Ok(settings) => crate::mcp::run(&settings),
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
    // An agent-less config runs everyone as `anonymous`, which needs no identity.
    let authorization = identity.map(|i| i.authorization()).unwrap_or_default();
    let ca = home.certs_dir().join("ca.pem");
    if !ca.is_file() {
        return Err(format!(
            "postern mcp: no CA at {} (is POSTERN_HOME the daemon's state directory? `postern serve` makes it)",
            ca.display()
        ));
    }
    Ok(crate::mcp::Settings {
        proxy: crate::jail::dialable(config.proxy.listen),
        authorization,
        ca,
    })
}
