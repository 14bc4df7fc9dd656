//! `postern jail [--agent ID] -- CMD [ARGS…]` (SPEC §5.7): what the CLI resolves before the
//! jail is made — the config, the agent's identity (checked against the running daemon),
//! the files CMD is given and CMD's environment. The namespaces are `crate::jail`'s.

use std::cell::RefCell;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::env::{Identity, UNSET, acting_agent};
use super::{Env, Home, percent_encode};
use crate::config::Config;
use crate::jail::{self, EXIT_SETUP, Outer, Plan, PrivateDir, files, inside_addr};

#[derive(clap::Args, Debug)]
pub struct JailArgs {
    /// The agent CMD acts as (token: POSTERN_AGENT_TOKEN, else the config's [[agents]]).
    #[arg(long, value_name = "ID")]
    pub agent: Option<String>,
    /// A variable CMD gets besides the jail's own and a few harmless ones (PATH, HOME, LANG,
    /// TERM, TZ, …): NAME passes the caller's value, NAME=VALUE sets one. Repeatable.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub pass: Vec<String>,
    /// The command to run and its arguments (after `--`).
    #[arg(
        value_name = "CMD",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

/// The variables CMD never sees: the daemon's secrets and where its state lives.
const WITHHELD: &[&str] = &[
    "POSTERN_VAULT_KEY",
    "POSTERN_ADMIN_TOKEN",
    "POSTERN_ADMIN",
    "POSTERN_HOME",
    "POSTERN_CONFIG",
    "ALL_PROXY",
    "all_proxy",
];

/// A failure before CMD runs: printed, then exit 125.
struct Refusal(String);

pub fn run(config: Option<&Path>, home: &Home, args: JailArgs, env: Env<'_>) -> ExitCode {
    super::home::not_dumpable().ok();
    match prepare(config, home, &args, env) {
        Ok(outer) => ExitCode::from(jail::run(outer, &args.command)),
        Err(Refusal(message)) => {
            errln!("{message}");
            ExitCode::from(EXIT_SETUP)
        }
    }
}

fn prepare(
    config_path: Option<&Path>,
    home: &Home,
    args: &JailArgs,
    env: Env<'_>,
) -> Result<Outer, Refusal> {
    // Every `env:` name the config reads is a secret of the daemon's: CMD does not get it.
    let referenced = RefCell::new(Vec::<String>::new());
    let lookup = |name: &str| {
        referenced.borrow_mut().push(name.to_owned());
        env(name)
            .filter(|v| !v.is_empty())
            .or_else(|| Some(format!("{UNSET}{name}")))
    };
    let config = crate::config::load(config_path, &lookup)
        .map_err(|e| Refusal(format!("postern jail: {e}")))?;
    let identity =
        acting_agent(&config, args.agent.as_deref(), env, "postern jail").map_err(Refusal)?;
    check_identity(config.proxy.listen, identity.as_ref())?;
    check_home_is_the_daemons(home)?;
    let dir = PrivateDir::create().map_err(|e| {
        Refusal(format!(
            "postern jail: cannot make a private directory: {e}"
        ))
    })?;
    let strict = write_files(dir.path(), home, &config)?;
    let mut withheld: Vec<String> = WITHHELD.iter().map(|s| (*s).to_owned()).collect();
    withheld.extend(referenced.into_inner());
    let vars = jail_vars(dir.path(), &config, identity.as_ref(), strict);
    let env = environment(std::env::vars_os(), &withheld, vars, &args.pass)?;
    let mut hide_dirs = Vec::new();
    if home.root.is_dir() {
        hide_dirs.push(std::fs::canonicalize(&home.root).unwrap_or_else(|_| home.root.clone()));
    }
    let mut hide_files = Vec::new();
    if let Some(path) = config_path.filter(|p| p.is_file()) {
        refuse_movable_links(path)?;
        hide_files.push(std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()));
    }
    let pin_dirs = pinned_ancestors(hide_dirs.iter().chain(&hide_files));
    let plan = Plan {
        dir: dir.path().to_path_buf(),
        dir_id: dir.id(),
        pin_dirs,
        hide_dirs,
        hide_files,
        authorization: identity.as_ref().map(Identity::authorization),
        ports: route_ports(&config, identity.as_ref().map(|i| i.agent.as_str())),
        binds: system_binds(),
    };
    Ok(Outer {
        dir,
        proxy: config.proxy.listen,
        ssh: config.ssh.listen,
        env,
        plan,
    })
}

/// Every ancestor of `targets` (already canonical) that this user could rename, outermost
/// first: bound onto itself in the jail, where a mount point cannot be renamed (EBUSY), so
/// CMD cannot move the config's or the state's directory away and make its own in its place
/// for the daemon's next reload (issue 40). Their contents stay as writable as they were.
fn pinned_ancestors<'a>(targets: impl Iterator<Item = &'a PathBuf>) -> Vec<PathBuf> {
    use nix::unistd::{AccessFlags, access};
    let mut pins: Vec<PathBuf> = Vec::new();
    for target in targets {
        for dir in target.ancestors().filter(|d| d.parent().is_some()) {
            let parent = dir.parent().unwrap_or(Path::new("/"));
            let is_dir = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
            if is_dir && access(parent, AccessFlags::W_OK).is_ok() && !pins.iter().any(|p| p == dir)
            {
                pins.push(dir.to_path_buf());
            }
        }
    }
    // Outermost first: an inner pin goes on top of the outer one's copy.
    pins.sort_by_key(|p| p.components().count());
    pins
}

/// A symlink on the config's path in a directory this user can write: CMD could point it at
/// a config of its own, and no mount can hold a symlink in place. Refused, with the fix.
fn refuse_movable_links(path: &Path) -> Result<(), Refusal> {
    use nix::unistd::{AccessFlags, access};
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for at in absolute.ancestors() {
        let Some(parent) = at.parent() else { break };
        let link = std::fs::symlink_metadata(at).is_ok_and(|m| m.file_type().is_symlink());
        if link && access(parent, AccessFlags::W_OK).is_ok() {
            return Err(Refusal(format!(
                "postern jail: the config path {} goes through the symlink {} in a directory \
                 this user can write, which CMD could point at a config of its own; start \
                 postern serve and postern jail with the config's real path ({}); CMD did not run",
                absolute.display(),
                at.display(),
                std::fs::canonicalize(path)
                    .unwrap_or_else(|_| absolute.clone())
                    .display()
            )));
        }
    }
    Ok(())
}

/// The state directory hidden from CMD must be the running daemon's: one that no daemon
/// holds (a stray `./.postern`, another `POSTERN_HOME`) would be hidden while the real one
/// stays readable. The daemon holds its journal's lock; a directory this user cannot open
/// is not readable to CMD either.
fn check_home_is_the_daemons(home: &Home) -> Result<(), Refusal> {
    let lock = home.journal_dir().join("lock");
    let file = match std::fs::File::open(&lock) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return Ok(()),
        Err(_) => return Err(not_the_daemons(home)),
    };
    match file.try_lock_shared() {
        Err(std::fs::TryLockError::WouldBlock) => Ok(()),
        _ => Err(not_the_daemons(home)),
    }
}

fn not_the_daemons(home: &Home) -> Refusal {
    Refusal(format!(
        "postern jail: no running postern holds the state directory {} (POSTERN_HOME, else \
         ./.postern); run jail with the daemon's POSTERN_HOME so that CMD cannot read its \
         state; CMD did not run",
        home.root.display()
    ))
}

/// The daemon must be there and take the agent's token before CMD runs.
fn check_identity(proxy: SocketAddr, identity: Option<&Identity>) -> Result<(), Refusal> {
    use super::env::IdentityCheck;
    let name = identity.map(|i| i.agent.as_str());
    match super::env::check_identity(proxy, identity) {
        IdentityCheck::Taken => Ok(()),
        IdentityCheck::Unreachable(why) => Err(Refusal(format!(
            "postern jail: {why} (is `postern serve` running with this config?)"
        ))),
        IdentityCheck::Refused(body) => {
            let hint = super::env::refused_hint(name);
            Err(Refusal(match body.is_empty() {
                true => format!("postern jail: {hint}; CMD did not run"),
                false => format!("{body}\npostern jail: {hint}; CMD did not run"),
            }))
        }
    }
}

/// The CA copies, known_hosts, resolv.conf and the empty file. Returns whether the
/// known_hosts holds postern's host key (else ssh is told to accept it on first use).
fn write_files(dir: &Path, home: &Home, config: &Config) -> Result<bool, Refusal> {
    let fail = |what: &Path, e: std::io::Error| {
        Refusal(format!(
            "postern jail: cannot write {}: {e}",
            what.display()
        ))
    };
    for (name, to) in [("ca.pem", files::CA), ("bundle.pem", files::BUNDLE)] {
        let from = home.certs_dir().join(name);
        std::fs::copy(&from, dir.join(to)).map_err(|e| {
            Refusal(format!(
                "postern jail: cannot read postern's CA file {}: {e} (POSTERN_HOME must be the \
                 daemon's state directory)",
                from.display()
            ))
        })?;
    }
    let resolv = dir.join(files::RESOLV);
    std::fs::write(&resolv, "nameserver 127.0.0.1\n").map_err(|e| fail(&resolv, e))?;
    let empty = dir.join(files::EMPTY);
    std::fs::write(&empty, "").map_err(|e| fail(&empty, e))?;
    let known = dir.join(files::KNOWN_HOSTS);
    let line = known_hosts_line(home, config);
    std::fs::write(
        &known,
        line.as_deref()
            .map(|l| format!("{l}\n"))
            .unwrap_or_default(),
    )
    .map_err(|e| fail(&known, e))?;
    let strict = line.is_some();
    let system = std::fs::read_to_string(SYSTEM_SSH_CONFIG).unwrap_or_default();
    let ssh_config = dir.join(files::SSH_CONFIG);
    let text = ssh_config_text(&known.display().to_string(), strict, &system);
    std::fs::write(&ssh_config, text).map_err(|e| fail(&ssh_config, e))?;
    Ok(strict)
}

const SYSTEM_SSH_CONFIG: &str = "/etc/ssh/ssh_config";

/// What the jail binds over system files that exist: postern's bundle (its CA and the system
/// roots) over the system CA stores, so a TLS stack that reads only those (wget with GnuTLS)
/// trusts postern too; the jail's ssh_config over the system one, so plain `ssh host` goes
/// through postern's SSH front as `GIT_SSH_COMMAND` does.
fn system_binds() -> Vec<(String, PathBuf)> {
    let mut binds: Vec<(String, PathBuf)> = crate::http::agent::mitm::SYSTEM_CA_STORES
        .iter()
        .filter(|p| Path::new(p).is_file())
        .map(|p| (files::BUNDLE.to_owned(), PathBuf::from(p)))
        .collect();
    if Path::new(SYSTEM_SSH_CONFIG).is_file() {
        binds.push((files::SSH_CONFIG.to_owned(), SYSTEM_SSH_CONFIG.into()));
    }
    binds
}

/// The ports the agent's routes name besides 443 and 80, each with whether it is https.
fn route_ports(config: &Config, agent: Option<&str>) -> Vec<(u16, bool)> {
    let mut ports: Vec<(u16, bool)> = Vec::new();
    for r in &config.routes {
        let admits =
            r.agents.is_every() || agent.is_some_and(|a| crate::policy::admits(&r.agents, a));
        let port = r.matcher.port;
        if admits && port != 443 && port != 80 && !ports.iter().any(|(p, _)| *p == port) {
            ports.push((port, r.matcher.scheme == crate::config::Scheme::Https));
        }
    }
    ports
}

/// postern's host key for the configured targets' names, when this user can read it (the
/// key is the daemon user's; another user's jail accepts it on first use instead).
fn known_hosts_line(home: &Home, config: &Config) -> Option<String> {
    use crate::ssh::hostkey;
    let text = std::fs::read_to_string(hostkey::key_path(&home.ssh_dir())).ok()?;
    let key = russh::keys::PrivateKey::from_openssh(text.as_bytes()).ok()?;
    let names = hostkey::target_names(config);
    if names.is_empty() {
        return None;
    }
    hostkey::known_hosts_line(&names, &key).ok()
}

/// What CMD is given on top of the caller's environment (SPEC §5.7).
fn jail_vars(
    dir: &Path,
    config: &Config,
    identity: Option<&Identity>,
    strict: bool,
) -> Vec<(String, String)> {
    let path = |name: &str| dir.join(name).display().to_string();
    let userinfo = identity
        .map(|i| format!("{}:{}@", percent_encode(&i.agent), percent_encode(&i.token)))
        .unwrap_or_default();
    let proxy = format!("http://{userinfo}{}", inside_addr::PROXY);
    let mut vars = Vec::new();
    for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        vars.push((name.to_owned(), proxy.clone()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        vars.push((name.to_owned(), String::new()));
    }
    for name in super::env::BUNDLE_VARS {
        vars.push(((*name).to_owned(), path(files::BUNDLE)));
    }
    vars.push(("NODE_EXTRA_CA_CERTS".into(), path(files::CA)));
    vars.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
    if let Some(id) = identity {
        vars.push(("POSTERN_AGENT".into(), id.agent.clone()));
        vars.push(("POSTERN_AGENT_TOKEN".into(), id.token.clone()));
    }
    vars.push(("POSTERN_SSH_PROXY".into(), inside_addr::SSH.into()));
    vars.push((
        "GIT_SSH_COMMAND".into(),
        git_ssh_command(&path(files::KNOWN_HOSTS), strict),
    ));
    vars.extend(super::env::placeholder_vars(
        config,
        identity.map(|i| i.agent.as_str()),
    ));
    vars
}

/// `ssh` with postern's ProxyCommand (this binary, by absolute path) and the jail's
/// known_hosts, as a shell command line (git runs it through `sh`).
fn git_ssh_command(known_hosts: &str, strict: bool) -> String {
    let mut cmd = String::from("ssh");
    for (key, value) in ssh_options(known_hosts, strict) {
        cmd.push_str(" -o ");
        cmd.push_str(&shell_quote(&format!("{key}={value}")));
    }
    cmd
}

/// The ssh options that send ssh through postern's SSH front with the jail's known_hosts.
fn ssh_options(known_hosts: &str, strict: bool) -> [(&'static str, String); 3] {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| std::path::absolute(p).ok())
        .unwrap_or_else(|| PathBuf::from("postern"));
    let proxy = format!(
        "{} ssh-connect %r %h %p",
        shell_quote(&exe.display().to_string())
    );
    let checking = if strict { "yes" } else { "accept-new" };
    [
        ("ProxyCommand", proxy),
        ("UserKnownHostsFile", known_hosts.to_owned()),
        ("StrictHostKeyChecking", checking.to_owned()),
    ]
}

/// The jail's `/etc/ssh/ssh_config`: postern's options for every host, then the system's
/// own (ssh takes the first value it finds; a user's `~/.ssh/config` still comes first).
fn ssh_config_text(known_hosts: &str, strict: bool, system: &str) -> String {
    let mut text = String::from(
        "# postern jail: ssh reaches its targets through postern's SSH front.\nHost *\n",
    );
    for (key, value) in ssh_options(known_hosts, strict) {
        let value = match key {
            "UserKnownHostsFile" => format!("\"{value}\""),
            _ => value,
        };
        text.push_str(&format!("    {key} {value}\n"));
    }
    text.push('\n');
    text.push_str(system);
    text
}

fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/_.:@%+=,-".contains(c));
    match plain {
        true => s.to_owned(),
        false => format!("'{}'", s.replace('\'', "'\\''")),
    }
}

/// The caller's environment without `withheld`, with `vars` set over it.
/// What CMD may inherit from the caller without being asked: nothing a secret lives in.
const HARMLESS: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TERM",
    "COLORTERM",
    "TZ",
    "TMPDIR",
];

/// CMD's environment is an allowlist (the operator's shell holds tokens: `GITHUB_TOKEN`,
/// cloud keys): the harmless variables, the ones `--env` names, then the jail's own. A
/// variable the daemon reads (`withheld`) is never passed, not even when named.
fn environment(
    caller: impl Iterator<Item = (OsString, OsString)>,
    withheld: &[String],
    vars: Vec<(String, String)>,
    pass: &[String],
) -> Result<Vec<(OsString, OsString)>, Refusal> {
    let caller: Vec<(OsString, OsString)> = caller.collect();
    let mut named: Vec<(OsString, OsString)> = Vec::new();
    for spec in pass {
        let (name, value) = match spec.split_once('=') {
            Some((n, v)) => (n, Some(OsString::from(v))),
            None => (spec.as_str(), None),
        };
        if name.is_empty() || withheld.iter().any(|w| w == name) {
            return Err(Refusal(format!(
                "postern jail: --env {name}: CMD never gets a variable the daemon reads (its secrets and state)"
            )));
        }
        let value = value.or_else(|| {
            caller
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        });
        if let Some(value) = value {
            named.push((name.into(), value));
        }
    }
    let harmless = |k: &str| HARMLESS.contains(&k) || k.starts_with("LC_");
    let set: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
    let kept = |k: &OsString| {
        let k = k.to_string_lossy();
        !withheld.iter().any(|w| *w == k) && !set.contains(&k.as_ref())
    };
    let named_names: Vec<OsString> = named.iter().map(|(n, _)| n.clone()).collect();
    let mut out: Vec<(OsString, OsString)> = caller
        .into_iter()
        .filter(|(k, _)| harmless(&k.to_string_lossy()) && !named_names.contains(k))
        .chain(named)
        .filter(|(k, _)| kept(k))
        .collect();
    out.extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_withholds_the_daemons_secrets_and_sets_the_jail_addresses() {
        let caller = [
            ("PATH", "/bin"),
            ("GITHUB_TOKEN", "ghp_operator"),
            ("AWS_SECRET_ACCESS_KEY", "aws"),
            ("POSTERN_VAULT_KEY", "vk"),
            ("POSTERN_ADMIN_TOKEN", "at"),
            ("OTHER_AGENT_TOKEN", "other"),
            ("HTTPS_PROXY", "http://elsewhere:1"),
        ]
        .into_iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let mut withheld: Vec<String> = WITHHELD.iter().map(|s| (*s).to_owned()).collect();
        withheld.push("OTHER_AGENT_TOKEN".into());
        let vars = vec![("HTTPS_PROXY".to_owned(), "http://127.0.0.1:3128".to_owned())];
        let env = environment(caller.clone(), &withheld, vars.clone(), &[]).unwrap_or_default();
        let names: Vec<String> = env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into())
            .collect();
        assert_eq!(names, ["PATH", "HTTPS_PROXY"]);
        assert_eq!(env[1].1, "http://127.0.0.1:3128");
        // Named ones pass; the daemon's never do.
        let pass = ["GITHUB_TOKEN".to_owned(), "MODE=ci".to_owned()];
        let env = environment(caller.clone(), &withheld, vars.clone(), &pass).unwrap_or_default();
        let names: Vec<String> = env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into())
            .collect();
        assert_eq!(names, ["PATH", "GITHUB_TOKEN", "MODE", "HTTPS_PROXY"]);
        let refused = ["POSTERN_VAULT_KEY".to_owned()];
        assert!(environment(caller, &withheld, vars, &refused).is_err());
    }

    #[test]
    fn git_ssh_command_quotes_what_the_shell_would_split() {
        let cmd = git_ssh_command("/tmp/a b/known_hosts", true);
        assert!(cmd.starts_with("ssh -o 'ProxyCommand="), "{cmd}");
        assert!(cmd.contains(" ssh-connect %r %h %p'"), "{cmd}");
        assert!(
            cmd.contains("'UserKnownHostsFile=/tmp/a b/known_hosts'"),
            "{cmd}"
        );
        assert!(cmd.ends_with("StrictHostKeyChecking=yes"), "{cmd}");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
