//! `postern secret set NAME` (value on stdin) / `list` / `rm NAME`.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use super::{CliError, Env, Home, SecretCommand};
use crate::config::{SecretSource, SecretValue};
use crate::vault::Vault;

/// `home_named`: `POSTERN_HOME` names the state directory. Without it, `./.postern` is
/// used only where it exists: a secret set from another directory would otherwise go
/// into a fresh vault that the running daemon never reads.
pub fn run(
    (home, home_named, passphrase): (&Home, bool, Option<String>),
    command: SecretCommand,
    config: Option<&Path>,
    env: Env<'_>,
) -> Result<ExitCode, CliError> {
    super::home::not_dumpable().map_err(CliError::Failed)?;
    if !home_named && !home.root.is_dir() {
        return Err(CliError::Failed(format!(
            "no state directory at {} (POSTERN_HOME is not set, so postern looked in the current directory); \
             set POSTERN_HOME to the daemon's state directory, or run `postern init` here first",
            home.root.display()
        )));
    }
    if matches!(command, SecretCommand::Set { .. }) {
        home.create()
            .map_err(|e| CliError::Failed(format!("cannot create {}: {e}", home.root.display())))?;
    } else {
        home.require().map_err(CliError::Failed)?;
    }
    let vault = Vault::new(&home.root, passphrase);
    let fail = |e: crate::vault::VaultError| CliError::Failed(e.to_string());
    super::home::refuse_wrong_key(&vault)?;
    match command {
        SecretCommand::Set { name } => {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(CliError::Failed(
                    "secret names use letters, digits, '-', '_' and '.'".into(),
                ));
            }
            let mut value = String::new();
            std::io::stdin()
                .read_to_string(&mut value)
                .map_err(|e| CliError::Failed(format!("cannot read the value from stdin: {e}")))?;
            let value = value
                .strip_suffix('\n')
                .map(|v| v.strip_suffix('\r').unwrap_or(v))
                .unwrap_or(&value);
            if value.is_empty() {
                return Err(CliError::Failed("the value on stdin is empty".into()));
            }
            let version = vault.set(&name, value).map_err(fail)?;
            outln!("secret {name} set (version {version})");
        }
        SecretCommand::List => {
            let entries = vault.list().map_err(fail)?;
            if entries.is_empty() {
                errln!(
                    "postern: the vault at {} holds no secrets",
                    vault.path().display()
                );
            }
            for (name, version) in &entries {
                outln!("{name}\tversion {version}");
            }
            if config.is_some() {
                let config = crate::config::load_addresses(config, env)?;
                list_sources(&vault, &config, &entries, env);
            }
        }
        SecretCommand::Rm { name } => {
            if vault.remove(&name).map_err(fail)? {
                outln!("secret {name} removed");
            } else {
                return Err(CliError::Failed(format!("no secret named {name}")));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// With a config: one line per credential whose secret is not a vault entry listed above
/// (`SOURCE\tversion V\tcredential ID`), or is missing (`SOURCE\tmissing: WHY\tcredential ID`).
/// An `env:` source is looked up in this command's own environment; a command is run.
fn list_sources(
    vault: &Vault,
    config: &crate::config::Config,
    held: &[(String, u64)],
    env: Env<'_>,
) {
    for c in &config.credentials {
        let source = match &c.secret {
            SecretSource::Vault(name) if held.iter().any(|(h, _)| h == name) => continue,
            SecretSource::Vault(name) => {
                outln!("{name}\tmissing: not in the vault\tcredential {}", c.id);
                continue;
            }
            SecretSource::Env { name, .. } => SecretSource::Env {
                name: name.clone(),
                value: env(name).filter(|v| !v.is_empty()).map(SecretValue::new),
            },
            other => other.clone(),
        };
        let state = match vault.fetch(&source) {
            Ok(secret) => format!("version {}", secret.version),
            Err(why) => format!("missing: {why}"),
        };
        outln!("{}\t{state}\tcredential {}", source.label(), c.id);
    }
}
