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

mod client;
#[cfg(feature = "failpoints")]
mod drill;
mod env;
mod home;
mod operator;
mod secret;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use home::Home;

#[derive(Parser, Debug)]
#[command(
    name = "postern",
    version,
    about = "A credential-injecting forward proxy for AI agents with a durable action journal"
)]
pub struct Cli {
    /// TOML config file (default: POSTERN_CONFIG, else the embedded default).
    #[arg(long, global = true, env = "POSTERN_CONFIG")]
    pub config: Option<PathBuf>,
    /// The daemon's admin API URL (default: POSTERN_ADMIN, else the config's [admin] listen).
    #[arg(long, global = true, env = "POSTERN_ADMIN")]
    pub admin: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run postern: journal, recovery and the admin API.
    Serve,
    /// Create the state directory and CA (idempotent).
    Init,
    /// Print the environment exports agents need.
    Env,
    /// Manage the encrypted vault (POSTERN_VAULT_KEY unlocks it).
    Secret {
        #[command(subcommand)]
        command: SecretCommand,
    },
    /// List or inspect invocations.
    Actions {
        #[command(subcommand)]
        command: ActionsCommand,
    },
    /// Print the stored result of an invocation (never re-executes).
    Result { id: String },
    /// Print the decide() verdict for an invocation.
    Decide {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Operator-attested resolution of an unknown outcome.
    Reconcile {
        id: String,
        #[arg(long, value_parser = ["committed", "rejected"])]
        outcome: String,
        #[arg(long)]
        note: String,
    },
    /// Let a request held for approval proceed (it dispatches unless something it bound changed).
    Approve { id: String },
    /// Refuse a request held for approval (APPROVAL_DENIED; never dispatched).
    Deny { id: String },
    /// The requests waiting for an operator's approval.
    Approvals {
        #[arg(long)]
        json: bool,
    },
    /// Journal audit.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Test hook: write one synthetic invocation's events (failpoints builds only).
    #[cfg(feature = "failpoints")]
    #[command(hide = true)]
    Drill(drill::DrillArgs),
}

#[derive(Subcommand, Debug)]
pub enum SecretCommand {
    /// Store the value read from stdin under NAME (raises its version).
    Set { name: String },
    /// Names and versions only.
    List,
    /// Remove NAME.
    Rm { name: String },
}

#[derive(Subcommand, Debug)]
pub enum ActionsCommand {
    /// Invocations, newest first.
    List {
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        outcome: Option<String>,
        #[arg(long)]
        phase: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
    },
    /// Record, envelope and events of one invocation.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Verify the hash chain; exits non-zero on any break.
    Verify {
        #[arg(long)]
        json: bool,
    },
}

/// Exit codes: 0 ok, 1 failure (or a broken chain), 2 usage, 3 daemon unreachable.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let env = |name: &str| std::env::var(name).ok();
    let home = Home::from_env(&env);
    let result = match cli.command {
        Command::Serve => serve::run(cli.config.as_deref(), &home, &env),
        Command::Init => serve::init(cli.config.as_deref(), &home, &env),
        Command::Env => env::run(cli.config.as_deref(), &home, &env),
        Command::Secret { command } => secret::run(&home, env("POSTERN_VAULT_KEY"), command),
        Command::Actions { command } => {
            operator::actions(&cli_admin(&cli.admin, &cli.config, &env), command)
        }
        Command::Result { id } => operator::result(&cli_admin(&cli.admin, &cli.config, &env), &id),
        Command::Decide { id, json } => {
            operator::decide(&cli_admin(&cli.admin, &cli.config, &env), &id, json)
        }
        Command::Reconcile { id, outcome, note } => operator::reconcile(
            &cli_admin(&cli.admin, &cli.config, &env),
            &id,
            &outcome,
            &note,
        ),
        Command::Approve { id } => {
            operator::answer(&cli_admin(&cli.admin, &cli.config, &env), &id, true)
        }
        Command::Deny { id } => {
            operator::answer(&cli_admin(&cli.admin, &cli.config, &env), &id, false)
        }
        Command::Approvals { json } => {
            operator::approvals(&cli_admin(&cli.admin, &cli.config, &env), json)
        }
        Command::Audit {
            command: AuditCommand::Verify { json },
        } => operator::audit_verify(&cli_admin(&cli.admin, &cli.config, &env), &home, json),
        #[cfg(feature = "failpoints")]
        Command::Drill(args) => drill::run(&home, &args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            errln!("postern: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// A command failure, printed once on stderr.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigErrors),
    #[error(
        "cannot reach the postern daemon at {url}: {detail} (is `postern serve` running? set --admin or POSTERN_ADMIN)"
    )]
    Unreachable { url: String, detail: String },
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    fn exit_code(&self) -> u8 {
        match self {
            Self::Unreachable { .. } => 3,
            _ => 1,
        }
    }
}

/// Where the CLI finds the daemon (SPEC §5.5).
pub struct AdminTarget {
    pub url: String,
    pub token: Option<String>,
}

fn cli_admin(
    flag: &Option<String>,
    config: &Option<PathBuf>,
    env: &dyn Fn(&str) -> Option<String>,
) -> AdminTarget {
    let url = flag.clone().unwrap_or_else(|| {
        let listen = crate::config::load_addresses(config.as_deref(), env)
            .map(|c| c.admin.listen.to_string())
            .unwrap_or_else(|_| "127.0.0.1:3129".into());
        format!("http://{listen}")
    });
    AdminTarget {
        url,
        token: env("POSTERN_ADMIN_TOKEN"),
    }
}
