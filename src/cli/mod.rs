//! The `postern` command line (SPEC §5.1). Process environment is read here and
//! nowhere deeper: config, home and admin address are resolved, then passed in.

/// `println!` that never panics: a closed stdout (`postern serve | head`) must not
/// take the daemon down.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that never panics either.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod agents;
mod client;
#[cfg(feature = "failpoints")]
mod drill;
mod env;
mod home;
mod jail;
mod mcp;
mod operator;
mod render;
mod retry;
mod secret;
mod serve;
mod ssh;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::PossibleValuesParser;
use clap::{Parser, Subcommand};

pub use home::Home;

const ENVIRONMENT: &str = "\
Environment:
  POSTERN_HOME         state directory: journal, vault, CA, SSH host key (default ./.postern)
  POSTERN_CONFIG       TOML config file, as --config (default: the embedded loopback config)
  POSTERN_VAULT_KEY    passphrase that unlocks the vault (serve, secret)
  POSTERN_ADMIN        the daemon's admin API URL, as --admin (default: the config's [admin] listen)
  POSTERN_ADMIN_TOKEN  bearer token for the admin API
  POSTERN_SSH_PROXY    postern's SSH front for ssh-connect (as --proxy) and mcp (default: the config's [ssh] listen)
  POSTERN_AGENT        the agent id ssh-connect, jail and mcp send
  POSTERN_AGENT_TOKEN  the agent's token ssh-connect, jail and mcp send";

#[derive(Parser, Debug)]
#[command(
    name = "postern",
    version,
    about = "A credential-injecting forward proxy for AI agents with a durable action journal",
    after_help = ENVIRONMENT
)]
pub struct Cli {
    /// TOML config file (default: POSTERN_CONFIG, else the embedded default).
    #[arg(
        long,
        global = true,
        env = "POSTERN_CONFIG",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub config: Option<PathBuf>,
    /// The daemon's admin API URL, for the commands that talk to the daemon
    /// (default: POSTERN_ADMIN, else the config's [admin] listen).
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// `--admin` on the commands that talk to the daemon (SPEC §5.5: before or after the subcommand).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct AdminArgs {
    /// The daemon's admin API URL (default: POSTERN_ADMIN, else the config's [admin] listen).
    #[arg(long, global = true, value_name = "URL")]
    pub admin: Option<String>,
}

/// An invocation id, as `postern actions list` prints it.
#[derive(clap::Args, Debug)]
pub struct IdArg {
    /// The invocation id (act_<ULID>).
    #[arg(value_name = "ID")]
    pub id: String,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the HTTP(S) proxy, the SSH front and the admin API.
    ///
    /// Opens the journal and runs recovery, checks POSTERN_VAULT_KEY against the vault (a wrong
    /// key is an error; missing secrets are named), creates the state directory and CA on first
    /// start, and prints the listeners and the agent's `eval "$(postern env --agent ID)"` line.
    Serve,
    /// Create the state directory, CA and SSH host key (idempotent).
    Init,
    /// Print the shell exports an agent needs: eval "$(postern env --agent ID)".
    Env {
        /// The agent whose id and token the proxy URLs carry (from [[agents]] in the config).
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
    },
    /// Manage the encrypted vault (POSTERN_VAULT_KEY unlocks it).
    Secret {
        #[command(subcommand)]
        command: SecretCommand,
    },
    /// List or inspect invocations.
    Actions {
        #[command(subcommand)]
        command: ActionsCommand,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Print the stored result of an invocation (never re-executes).
    Result {
        #[command(flatten)]
        id: IdArg,
        /// Print the admin API's JSON (body base64-encoded).
        #[arg(long)]
        json: bool,
        /// Write the raw body (SSH: stdout) to FILE.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Re-read and validate the running daemon's config (as SIGHUP does): a bad one is
    /// refused with every problem and the old one stays; a good one is put in force whole
    /// (invocations in flight keep theirs).
    Reload {
        /// Print the daemon's JSON answer.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Print the decide() verdict for an invocation.
    Decide {
        #[command(flatten)]
        id: IdArg,
        /// Print JSON: {"invocation_id","verdict"}.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Act on the decide() verdict: send the kept request again as a new generation of the
    /// same invocation (RETRY_NEW_ATTEMPT, RETRY_SAME_KEY), or say why not (nothing is sent).
    Retry {
        #[command(flatten)]
        id: IdArg,
        /// Repeat although the verdict is RECONCILE: you established that the action did not
        /// happen. Journaled as operator-attested (with --note, if given). Never overrides
        /// STOP_FOR_CORRECTION.
        #[arg(long)]
        i_have_reconciled: bool,
        /// How you established that repeating is safe (journaled).
        #[arg(long, value_name = "TEXT")]
        note: Option<String>,
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Operator-attested resolution of an unknown outcome.
    Reconcile {
        #[command(flatten)]
        id: IdArg,
        /// What the operator established happened remotely.
        #[arg(long, value_parser = ["committed", "rejected"])]
        outcome: String,
        /// How the outcome was established (journaled with the attestation).
        #[arg(long, value_name = "TEXT")]
        note: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Let a request held for approval proceed (it dispatches unless something it bound changed).
    Approve {
        #[command(flatten)]
        id: IdArg,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Refuse a request held for approval (APPROVAL_DENIED; never dispatched).
    Deny {
        #[command(flatten)]
        id: IdArg,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The kill switch: list agents, suspend one (every new request refused, its held
    /// approvals denied) or resume it.
    Agents {
        #[command(subcommand)]
        command: agents::AgentsCommand,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The requests waiting for an operator's approval: method, target, body preview.
    Approvals {
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Journal audit.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// ProxyCommand bridge to postern's SSH front: `ProxyCommand postern ssh-connect %r %h %p`.
    #[command(name = "ssh-connect")]
    SshConnect(ssh::ConnectArgs),
    /// Print the ~/.ssh/config block for the configured SSH targets and postern's known_hosts line.
    #[command(name = "ssh-config")]
    SshConfig,
    /// Run CMD with postern as its only way out (own network namespace; the state directory
    /// and config hidden): `postern jail --agent ID -- CMD [ARGS…]`. Exits with CMD's status,
    /// 125 when the jail cannot be made.
    Jail(jail::JailArgs),
    /// Serve MCP on stdin/stdout as agent ID (for an MCP host): tools http_request, ssh_exec,
    /// fetch_result and get_invocation, each going through the running daemon as the agent's
    /// own requests do. Token: POSTERN_AGENT_TOKEN, else the config's [[agents]].
    Mcp {
        /// The agent the tools act as.
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
    },
    /// The jail's inner process (started by `postern jail`).
    #[command(name = "__jail-inside", hide = true)]
    JailInside {
        #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// PID 1 of the jail's PID namespace (started by `postern jail`).
    #[command(name = "__jail-init", hide = true)]
    JailInit {
        #[arg(long)]
        uid: u32,
        #[arg(long)]
        gid: u32,
        #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Test hook: write one synthetic invocation's events (failpoints builds only).
    #[cfg(feature = "failpoints")]
    #[command(hide = true)]
    Drill(drill::DrillArgs),
}

#[derive(Subcommand, Debug)]
pub enum SecretCommand {
    /// Store the value read from stdin under NAME (raises its version).
    Set {
        /// The vault entry's name (letters, digits, '-', '_', '.'), as a credential's `secret`.
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// Names and versions only (with POSTERN_VAULT_KEY set, it is checked against the vault).
    /// With a config, also each credential's file, env or command source, and what is missing.
    List,
    /// Remove NAME.
    Rm {
        /// The vault entry's name.
        #[arg(value_name = "NAME")]
        name: String,
    },
}

fn outcomes() -> PossibleValuesParser {
    PossibleValuesParser::new(crate::contract::Outcome::ALL.iter().map(|o| o.as_str()))
}

fn phases() -> PossibleValuesParser {
    PossibleValuesParser::new(crate::contract::Phase::ALL.iter().map(|p| p.as_str()))
}

#[derive(Subcommand, Debug)]
pub enum ActionsCommand {
    /// Invocations, newest first.
    List {
        /// Only this agent's invocations.
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
        /// Only invocations with this outcome.
        #[arg(long, value_parser = outcomes())]
        outcome: Option<String>,
        /// Only invocations that stopped in this phase.
        #[arg(long, value_parser = phases())]
        phase: Option<String>,
        /// At most this many invocations (1..1000).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: u16,
        /// Continue after this invocation id (the `next` of the previous page).
        #[arg(long, value_name = "ID")]
        cursor: Option<String>,
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Record, envelope and events of one invocation.
    Show {
        #[command(flatten)]
        id: IdArg,
        /// Print the record with its "events" array as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Verify the hash chain; exits non-zero on any break (opens the journal itself when no daemon runs).
    Verify {
        /// Print the verification report as JSON.
        #[arg(long)]
        json: bool,
        /// Also check every fleet node's chain against the anchors it wrote to the cluster
        /// store (SPEC §7); asks the daemon.
        #[arg(long)]
        cluster: bool,
    },
    /// Print every journal event from SEQ on as JSON lines: seq, ts, invocation_id, kind,
    /// source, hop, hash, prev_hash and the invocation's agent, route, outcome and code
    /// (opens the journal itself when no daemon runs).
    Export {
        /// The first seq to print.
        #[arg(long, default_value_t = 1)]
        since: u64,
    },
}

/// Exit codes: 0 ok, 1 failure (or a broken chain), 2 usage, 3 daemon unreachable.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let env = |name: &str| std::env::var(name).ok();
    let home = Home::from_env(&env);
    if cli.admin.is_some() && !talks_to_daemon(&cli.command) {
        errln!(
            "error: --admin is only for the commands that talk to the daemon (actions, result, decide, reconcile, approve, deny, approvals, agents, audit)"
        );
        return ExitCode::from(2);
    }
    match run(cli, &home, &env) {
        Ok(code) => code,
        Err(e) => {
            errln!("postern: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn talks_to_daemon(command: &Command) -> bool {
    match command {
        Command::Serve
        | Command::Init
        | Command::Env { .. }
        | Command::Secret { .. }
        | Command::SshConnect(_)
        | Command::SshConfig
        | Command::Jail(_)
        | Command::Mcp { .. }
        | Command::JailInside { .. }
        | Command::JailInit { .. } => false,
        #[cfg(feature = "failpoints")]
        Command::Drill(_) => false,
        _ => true,
    }
}

fn run(cli: Cli, home: &Home, env: Env<'_>) -> Result<ExitCode, CliError> {
    let config = cli.config.as_deref();
    let target = |sub: AdminArgs| cli_admin(sub.admin.or(cli.admin.clone()), config, env);
    match cli.command {
        Command::Serve => serve::run(config, home, env),
        Command::Init => serve::init(config, home, env),
        Command::Env { agent } => env::run(config, home, agent.as_deref(), env),
        Command::Secret { command } => {
            let named = env("POSTERN_HOME").is_some_and(|h| !h.is_empty());
            let vault = (home, named, env("POSTERN_VAULT_KEY"));
            secret::run(vault, command, config, env)
        }
        Command::SshConnect(args) => ssh::connect(config, &args, env),
        Command::SshConfig => ssh::config(config, home, env),
        Command::Jail(args) => Ok(jail::run(config, home, args, env)),
        Command::Mcp { agent } => Ok(mcp::run(config, home, agent.as_deref(), env)),
        Command::JailInside { command } => Ok(crate::jail::inside(&command)),
        Command::JailInit { uid, gid, command } => {
            Ok(crate::jail::init(crate::jail::Ids { uid, gid }, &command))
        }
        Command::Actions { command, admin } => operator::actions(&target(admin), command),
        Command::Result {
            id,
            json,
            output,
            admin,
        } => operator::result(&target(admin), &id.id, json, output.as_deref()),
        Command::Decide { id, json, admin } => operator::decide(&target(admin), &id.id, json),
        Command::Reload { json, admin } => {
            let local = || crate::config::load_addresses(config, env).map(|_| ());
            operator::reload(&target(admin), json, local)
        }
        Command::Retry {
            id,
            i_have_reconciled,
            note,
            json,
            admin,
        } => {
            let ask = retry::Ask {
                reconciled: i_have_reconciled,
                note,
                json,
            };
            retry::run(&target(admin), &id.id, &ask)
        }
        Command::Reconcile {
            id,
            outcome,
            note,
            admin,
        } => operator::reconcile(&target(admin), &id.id, &outcome, &note),
        Command::Approve { id, admin } => operator::answer(&target(admin), &id.id, true),
        Command::Deny { id, admin } => operator::answer(&target(admin), &id.id, false),
        Command::Approvals { json, admin } => operator::approvals(&target(admin), json),
        Command::Agents { command, admin } => agents::run(&target(admin), command),
        Command::Audit {
            command: AuditCommand::Verify { json, cluster },
            admin,
        } => operator::audit_verify(&target(admin), home, json, cluster),
        Command::Audit {
            command: AuditCommand::Export { since },
            admin,
        } => operator::audit_export(&target(admin), home, since),
        #[cfg(feature = "failpoints")]
        Command::Drill(args) => drill::run(home, &args),
    }
}

/// How the CLI reads the process environment (tests pass their own).
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A command failure, printed once on stderr.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigErrors),
    #[error(
        "cannot reach the postern daemon at {url}: {detail} (is `postern serve` running? set --admin or POSTERN_ADMIN)"
    )]
    Unreachable { url: String, detail: String },
    #[error(
        "the postern daemon at {url} took the connection but sent no answer within {secs} s (is it hung? its log tells; or is another program on that port? set --admin or POSTERN_ADMIN)"
    )]
    NoAnswer { url: String, secs: u64 },
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    fn exit_code(&self) -> u8 {
        match self {
            Self::Unreachable { .. } | Self::NoAnswer { .. } => 3,
            _ => 1,
        }
    }
}

/// Where the CLI finds the daemon (SPEC §5.5).
pub struct AdminTarget {
    pub url: String,
    pub token: Option<String>,
}

fn cli_admin(flag: Option<String>, config: Option<&std::path::Path>, env: Env<'_>) -> AdminTarget {
    let url = flag
        .or_else(|| env("POSTERN_ADMIN").filter(|u| !u.is_empty()))
        .unwrap_or_else(|| {
            let listen = crate::config::load_addresses(config, env)
                .map(|c| c.admin.listen.to_string())
                .ok()
                .or_else(|| raw_admin_listen(config))
                .unwrap_or_else(|| "127.0.0.1:3129".into());
            format!("http://{listen}")
        });
    AdminTarget {
        url,
        token: env("POSTERN_ADMIN_TOKEN"),
    }
}

/// `[admin] listen` as written, from a config that does not validate: the daemon still runs
/// on it (`postern reload` of a broken config must reach the daemon to hear why).
fn raw_admin_listen(config: Option<&std::path::Path>) -> Option<String> {
    let text = std::fs::read_to_string(config?).ok()?;
    let value: toml::Value = toml::from_str(&text).ok()?;
    Some(value.get("admin")?.get("listen")?.as_str()?.to_owned())
}

/// Percent-encodes everything but RFC 3986 unreserved characters (a path segment, a query
/// value, a URL's userinfo).
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
