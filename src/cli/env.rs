//! `postern env [--agent ID]`: the exports an agent needs (SPEC §5.1).

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use super::{CliError, Env, Home, percent_encode};
use crate::config::Config;

/// Stands in for an `env:` reference that is not set in this shell; never a real token.
pub(super) const UNSET: &str = "\u{1}postern-unset:";

/// Who the proxy URLs name: `ID:token@` (RFC 3986 userinfo, percent-encoded).
pub struct Identity {
    pub agent: String,
    pub token: String,
}

impl Identity {
    /// The `Proxy-Authorization` value.
    pub fn authorization(&self) -> String {
        use base64::Engine as _;
        let pair = format!("{}:{}", self.agent, self.token);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// The agent a command acts as (`jail`, `mcp`): `--agent`, else `POSTERN_AGENT`; its token:
/// `POSTERN_AGENT_TOKEN`, else the config's (with `--agent`). None when neither names one
/// (an agent-less config). `who` names the command in the refusal.
pub(super) fn acting_agent(
    config: &Config,
    flag: Option<&str>,
    env: Env<'_>,
    who: &str,
) -> Result<Option<Identity>, String> {
    let nonempty = |name: &str| env(name).filter(|v| !v.is_empty());
    let Some(agent) = flag
        .map(str::to_owned)
        .or_else(|| nonempty("POSTERN_AGENT"))
    else {
        return Ok(None);
    };
    if let Some(token) = nonempty("POSTERN_AGENT_TOKEN") {
        return Ok(Some(Identity { agent, token }));
    }
    let configured = config.agents.iter().find(|a| a.id == agent);
    let token = match configured {
        Some(a) if flag.is_some() => a.token.expose().to_owned(),
        _ => {
            let known: Vec<&str> = config.agents.iter().map(|a| a.id.as_str()).collect();
            let known = match known.is_empty() {
                true => "none".to_owned(),
                false => known.join(", "),
            };
            return Err(format!(
                "{who}: no token for agent `{agent}`: set POSTERN_AGENT_TOKEN, or pass \
                 --agent with a config whose [[agents]] holds it (this config's agents: {known})"
            ));
        }
    };
    if let Some(var) = token.strip_prefix(UNSET) {
        return Err(format!(
            "{who}: agent {agent}'s token comes from {var}, which is not set here \
             (set {var} or POSTERN_AGENT_TOKEN)"
        ));
    }
    Ok(Some(Identity { agent, token }))
}

/// The variables TLS clients read a CA bundle from (curl, Python, git, pip, cargo, Deno,
/// the AWS SDKs and CLI, gRPC): each names postern's bundle, in `postern env` and the jail.
pub const BUNDLE_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
    "AWS_CA_BUNDLE",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
];

/// `export` lines for curl, Python requests, Node, git and the rest of `BUNDLE_VARS`, and
/// the agent's identity for `postern ssh-connect` and `postern mcp`.
pub fn lines(home: &Home, proxy: SocketAddr, identity: Option<&Identity>) -> Vec<String> {
    let certs = std::fs::canonicalize(home.certs_dir()).unwrap_or_else(|_| home.certs_dir());
    let bundle = certs.join("bundle.pem");
    let ca = certs.join("ca.pem");
    let userinfo = identity
        .map(|i| format!("{}:{}@", percent_encode(&i.agent), percent_encode(&i.token)))
        .unwrap_or_default();
    let url = format!("http://{userinfo}{proxy}");
    let mut out = Vec::new();
    for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        out.push(export(name, &url));
    }
    for name in BUNDLE_VARS {
        out.push(export(name, &bundle.display().to_string()));
    }
    out.push(export("NODE_EXTRA_CA_CERTS", &ca.display().to_string()));
    if let Some(id) = identity {
        out.push(export("POSTERN_AGENT", &id.agent));
        out.push(export("POSTERN_AGENT_TOKEN", &id.token));
    }
    out
}

/// The CA files are public, but a state directory made by an older postern (or moved with
/// other modes) may keep them from an agent under another user: say so now, not as a TLS
/// error in the agent.
fn warn_unreadable(home: &Home) {
    for file in ["bundle.pem", "ca.pem"] {
        let path = home.certs_dir().join(file);
        if let Err(e) = std::fs::File::open(&path) {
            errln!(
                "postern env: {} is not readable by this user ({e}); an agent running as this user cannot trust postern",
                path.display()
            );
        }
    }
}

/// SPEC §3.7: what an SDK is given as its API key. Each credential the agent's routes
/// inject (every route's, without an agent) exports its placeholder under the variables its
/// `placeholder_env` names; one without them gets a comment naming its placeholder.
pub fn placeholder_lines(config: &Config, agent: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    for (cred, place) in injected(config, agent) {
        if cred.placeholder_env.is_empty() {
            out.push(format!(
                "# credential {}: send {} as its key ({}); postern puts the secret there",
                cred.id,
                cred.placeholder,
                place.field()
            ));
        }
        for (name, value) in vars_of(cred, &place) {
            out.push(export(&name, &value));
        }
    }
    out
}

/// The placeholder variables of `placeholder_lines` as name/value pairs (`postern jail`).
pub fn placeholder_vars(config: &Config, agent: Option<&str>) -> Vec<(String, String)> {
    injected(config, agent)
        .into_iter()
        .flat_map(|(cred, place)| vars_of(cred, &place))
        .collect()
}

/// An AWS SDK wants a secret key beside its key id to sign at all; postern re-signs, so
/// any value does (SPEC §3.8).
const AWS_SECRET_FILLER: &str = "postern-signs-at-the-egress-hop";

/// The variables one credential exports: its placeholder under each `placeholder_env`
/// name, and for SigV4 the secret key filler.
fn vars_of(
    cred: &crate::config::Credential,
    place: &crate::policy::placeholder::Place,
) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = cred
        .placeholder_env
        .iter()
        .map(|name| (name.clone(), cred.placeholder.clone()))
        .collect();
    if matches!(place, crate::policy::placeholder::Place::Sigv4 { .. }) {
        vars.push(("AWS_SECRET_ACCESS_KEY".into(), AWS_SECRET_FILLER.into()));
    }
    // Google client libraries ask the metadata server postern answers there (SPEC §3.8).
    let google = matches!(&cred.inject, crate::config::Inject::OAuth2(o) if o.grant == crate::config::Grant::JwtBearer);
    if google {
        for name in ["GCE_METADATA_HOST", "GCE_METADATA_IP"] {
            vars.push((name.into(), crate::http::agent::internal::HOST.into()));
        }
    }
    vars
}

/// The credentials the agent's routes inject (every route's without an agent) that have
/// a placeholder place.
fn injected<'c>(
    config: &'c Config,
    agent: Option<&str>,
) -> Vec<(
    &'c crate::config::Credential,
    crate::policy::placeholder::Place,
)> {
    let mut ids: Vec<&str> = Vec::new();
    for route in &config.routes {
        let for_agent = agent.is_none_or(|a| crate::policy::admits(&route.agents, a));
        if for_agent {
            for id in &route.credentials {
                if !ids.contains(&id.as_str()) {
                    ids.push(id);
                }
            }
        }
    }
    config
        .credentials
        .iter()
        .filter(|c| ids.contains(&c.id.as_str()))
        .filter_map(|c| crate::policy::placeholder::Place::of(&c.inject).map(|p| (c, p)))
        .collect()
}

/// One `export NAME=value` line that survives `eval` (paths may hold spaces).
fn export(name: &str, value: &str) -> String {
    let plain = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/_.:@%+=,-".contains(c));
    if plain {
        format!("export {name}={value}")
    } else {
        format!("export {name}='{}'", value.replace('\'', "'\\''"))
    }
}

pub fn run(
    config: Option<&Path>,
    home: &Home,
    agent: Option<&str>,
    env: Env<'_>,
) -> Result<ExitCode, CliError> {
    home.require().map_err(CliError::Failed)?;
    // An `env:` token unset here is a placeholder plus a note, not a config error.
    let lookup = |name: &str| {
        env(name)
            .filter(|v| !v.is_empty())
            .or_else(|| Some(format!("{UNSET}{name}")))
    };
    let config = crate::config::load(config, &lookup)?;
    let identity = match agent {
        Some(id) => Some(identity(&config, id)?),
        None => {
            note_missing_agent(&config);
            None
        }
    };
    for line in lines(home, config.proxy.listen, identity.as_ref()) {
        outln!("{line}");
    }
    for line in placeholder_lines(&config, agent) {
        outln!("{line}");
    }
    warn_unreadable(home);
    Ok(ExitCode::SUCCESS)
}

fn identity(config: &Config, id: &str) -> Result<Identity, CliError> {
    let agent = config.agents.iter().find(|a| a.id == id).ok_or_else(|| {
        let known: Vec<&str> = config.agents.iter().map(|a| a.id.as_str()).collect();
        CliError::Failed(format!(
            "no agent `{id}` in the config's [[agents]] (known: {})",
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        ))
    })?;
    // No exports at all rather than proxy URLs that cannot authenticate: an `eval` of them
    // would leave an agent whose every request is a 407 for a reason it cannot see.
    if let Some(var) = agent.token.expose().strip_prefix(UNSET) {
        return Err(CliError::Failed(format!(
            "env: agent {id}'s token comes from {var}, which is not set in this shell \
             (set {var} and run again)"
        )));
    }
    let token = agent.token.expose().to_owned();
    Ok(Identity {
        agent: id.to_owned(),
        token,
    })
}

fn note_missing_agent(config: &Config) {
    if let Some(first) = config.agents.first() {
        errln!(
            "postern env: this config has [[agents]]: without `--agent ID` (e.g. --agent {}) the proxy answers 407",
            first.id
        );
    }
}

/// The line the `serve` banner shows for the agent's shell.
pub fn eval_hint(config: &Config, config_flag: Option<&Path>, env: Env<'_>) -> String {
    let mut cmd = "postern env".to_owned();
    if let Some(agent) = config.agents.first() {
        cmd.push_str(&format!(" --agent {}", agent.id));
    }
    let from_env = env("POSTERN_CONFIG").map(std::path::PathBuf::from);
    if let Some(path) = config_flag.filter(|p| from_env.as_deref() != Some(*p)) {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        cmd.push_str(&format!(" --config {}", path.display()));
    }
    format!("eval \"$({cmd})\"")
}

/// What the daemon's proxy said of an agent's token.
pub enum IdentityCheck {
    /// A page only an admitted agent gets was answered.
    Taken,
    /// `407`: the envelope it answered with.
    Refused(String),
    /// No daemon answered there.
    Unreachable(String),
}

/// Asks the running daemon's proxy for an agent-only page (not journaled when the token is
/// right): a `407` means the token is wrong.
pub fn check_identity(proxy: SocketAddr, identity: Option<&Identity>) -> IdentityCheck {
    use std::io::{Read, Write};
    let addr = crate::jail::dialable(proxy);
    let unreachable = |e: std::io::Error| {
        IdentityCheck::Unreachable(format!("cannot reach postern's proxy at {addr}: {e}"))
    };
    let mut stream = match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(s) => s,
        Err(e) => return unreachable(e),
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(15)));
    let mut request = String::from(
        "GET http://postern.internal/v1/invocations/identity-check HTTP/1.0\r\n\
         Host: postern.internal\r\n",
    );
    if let Some(id) = identity {
        request.push_str(&format!("Proxy-Authorization: {}\r\n", id.authorization()));
    }
    request.push_str("\r\n");
    if let Err(e) = stream.write_all(request.as_bytes()) {
        return unreachable(e);
    }
    let mut answer = Vec::new();
    let _ = stream.take(256 * 1024).read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    match head.split_whitespace().nth(1).unwrap_or("") {
        "407" => IdentityCheck::Refused(body.trim().to_owned()),
        "" => IdentityCheck::Unreachable(format!(
            "postern's proxy at {addr} gave no answer to the identity check"
        )),
        _ => IdentityCheck::Taken,
    }
}

/// What to do about a refused identity.
pub fn refused_hint(agent: Option<&str>) -> String {
    match agent {
        Some(agent) => format!("postern refused agent `{agent}`'s token"),
        None => "postern's proxy requires an agent: pass --agent ID or set POSTERN_AGENT and \
                 POSTERN_AGENT_TOKEN"
            .to_owned(),
    }
}
