//! Configuration in two steps: `raw` (as written, unknown keys refused) →
//! `model` (validated; every problem reported with its key path in one run).

mod anchor;
mod decode;
mod diff;
mod live;
mod model;
mod problem;
mod raw;
mod shell_syntax;
mod units;
mod validate;

use std::path::Path;

pub use anchor::Anchor;
pub use diff::{ConfigDiff, diff, diff_in_force};
pub use live::Live;
pub use model::*;
pub use shell_syntax::{SHELL_SYNTAX, admitted_by, shell_syntax_in};
pub use units::{Quantity, Rate, parse_duration, parse_rate, parse_size};
pub use validate::{ConfigErrors, EnvLookup, Problem, parse};

/// The embedded default: loopback listeners, no agents, no routes.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// Loads the config file, or the embedded default when none is given.
pub fn load(path: Option<&Path>, env: EnvLookup<'_>) -> Result<Config, ConfigErrors> {
    match path {
        None => parse(DEFAULT_CONFIG, None, env),
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                ConfigErrors(vec![Problem {
                    path: p.display().to_string(),
                    message: format!("cannot read the config file: {e}"),
                }])
            })?;
            parse(&text, Some(p), env)
        }
    }
}

/// Loads the config through `anchor` (the file `serve` started with, checked not to have
/// been moved or replaced), or the embedded default.
pub fn load_anchored(anchor: Option<&Anchor>, env: EnvLookup<'_>) -> Result<Config, ConfigErrors> {
    match anchor {
        None => parse(DEFAULT_CONFIG, None, env),
        Some(a) => {
            let text = a.read().map_err(|p| ConfigErrors(vec![p]))?;
            parse(&text, Some(a.path()), env)
        }
    }
}

/// For commands that only need the config's addresses (`postern env`, the operator CLI):
/// an `env:` secret reference need not be set in the caller's shell, so its value is a
/// placeholder. Never serve with a config loaded this way.
pub fn load_addresses(path: Option<&Path>, env: EnvLookup<'_>) -> Result<Config, ConfigErrors> {
    // As long as a token must be, so an unset variable is no "too short" problem.
    let placeholder = |name: &str| env(name).or_else(|| Some("(not set in this shell)".to_owned()));
    load(path, &placeholder)
}

#[cfg(test)]
mod tests;
