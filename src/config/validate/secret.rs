//! A credential's `secret` (SPEC §3.8): a vault entry name, `file:PATH`, `env:NAME`, or
//! `{ command = [...], ttl = "5m" }`. An unset variable or an absent file is not a config
//! error: like a vault entry not yet set, it fails requests with `CREDENTIAL_MISSING` and
//! is named in `/healthz` and the reload's warnings (secrets may appear while postern runs).

use std::time::Duration;

use super::{Checker, RawCommandSecret, SecretSource, SecretValue};

/// How long a command's secret is kept when the config names no `ttl`.
const DEFAULT_TTL: Duration = Duration::from_secs(300);

const FORMS: &str =
    "a vault secret name, \"file:PATH\", \"env:NAME\" or { command = [\"…\"], ttl = \"5m\" }";

pub(super) fn source(c: &mut Checker<'_>, i: usize, v: &toml::Value) -> Option<SecretSource> {
    let path = format!("credentials[{i}].secret");
    match v {
        toml::Value::String(s) => named(c, &path, s),
        toml::Value::Table(_) => command(c, &path, v),
        _ => {
            c.bad(path, format!("expected {FORMS}"));
            None
        }
    }
}

fn named(c: &mut Checker<'_>, path: &str, s: &str) -> Option<SecretSource> {
    if let Some(file) = s.strip_prefix("file:") {
        if file.is_empty() {
            c.bad(path, "file: needs a path, e.g. \"file:/run/secrets/gh\"");
            return None;
        }
        return Some(SecretSource::File(c.path(file)));
    }
    if let Some(name) = s.strip_prefix("env:") {
        if name.is_empty() || name.contains(['=', '\0']) {
            c.bad(path, "env: needs a variable name, e.g. \"env:GH_TOKEN\"");
            return None;
        }
        let value = (c.env)(name)
            .filter(|v| !v.is_empty())
            .map(SecretValue::new);
        return Some(SecretSource::Env {
            name: name.to_owned(),
            value,
        });
    }
    if s.is_empty() {
        c.bad(path, format!("must be {FORMS}"));
        return None;
    }
    if let Some((kind, _)) = s.split_once(':') {
        // `postern secret set` takes no ':' in a name, so this can only be a mistyped source.
        c.bad(
            path,
            format!("`{kind}:` is not a secret source; expected {FORMS}"),
        );
        return None;
    }
    Some(SecretSource::Vault(s.to_owned()))
}

fn command(c: &mut Checker<'_>, path: &str, v: &toml::Value) -> Option<SecretSource> {
    let raw: RawCommandSecret = c.item(path, v)?;
    let at = format!("{path}.command");
    if raw.command.first().is_none_or(String::is_empty) {
        c.bad(
            at,
            "must name a program and its arguments, e.g. [\"op\", \"read\", \"op://vault/item/field\"]",
        );
        return None;
    }
    if raw.command.iter().any(|a| a.contains('\0')) {
        c.bad(at, "an argument holds a NUL byte");
        return None;
    }
    let ttl = c.duration(&format!("{path}.ttl"), raw.ttl.as_ref(), DEFAULT_TTL);
    let mut argv = raw.command;
    // A relative program path resolves like every other path in the config; a bare name
    // is looked up in PATH.
    if let Some(program) = argv.first_mut().filter(|p| p.contains('/')) {
        *program = c.path(program).display().to_string();
    }
    Some(SecretSource::Command { argv, ttl })
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::config::{Config, ConfigErrors, parse};

    fn with_secret(secret: &str) -> Result<Config, ConfigErrors> {
        let text = format!(
            "[[credentials]]\nid = \"gh\"\nsecret = {secret}\ninject = {{ header = \"X-Key\" }}\n"
        );
        let env = |name: &str| (name == "GH_TOKEN").then(|| "env-value-7f3a".to_owned());
        parse(&text, Some(Path::new("/etc/postern/postern.toml")), &env)
    }

    fn source(secret: &str) -> Option<SecretSource> {
        with_secret(secret)
            .ok()
            .and_then(|c| c.credentials.first().map(|c| c.secret.clone()))
    }

    fn problem(secret: &str) -> String {
        match with_secret(secret) {
            Ok(_) => String::new(),
            Err(e) => {
                e.0.iter()
                    .map(|p| format!("{}: {}\n", p.path, p.message))
                    .collect()
            }
        }
    }

    #[test]
    fn each_form_names_its_source() {
        assert_eq!(
            source("\"github-token\""),
            Some(SecretSource::Vault("github-token".into()))
        );
        assert_eq!(
            source("\"file:secrets/gh\""),
            Some(SecretSource::File(PathBuf::from("/etc/postern/secrets/gh")))
        );
        assert_eq!(
            source("\"file:/run/secrets/gh\""),
            Some(SecretSource::File(PathBuf::from("/run/secrets/gh")))
        );
        let env = source("\"env:GH_TOKEN\"");
        assert!(
            matches!(&env, Some(SecretSource::Env { name, value: Some(v) })
                if name == "GH_TOKEN" && v.expose() == "env-value-7f3a")
        );
        assert!(!format!("{:?}", with_secret("\"env:GH_TOKEN\"")).contains("env-value-7f3a"));
        // Unset is no config error: requests fail CREDENTIAL_MISSING, health names it.
        assert!(matches!(
            source("\"env:OTHER\""),
            Some(SecretSource::Env { value: None, .. })
        ));
        assert_eq!(
            source("{ command = [\"op\", \"read\", \"op://v/i/f\"], ttl = \"1m\" }"),
            Some(SecretSource::Command {
                argv: ["op", "read", "op://v/i/f"].map(String::from).to_vec(),
                ttl: Duration::from_secs(60),
            })
        );
        assert_eq!(
            source("{ command = [\"bin/get-token\"] }"),
            Some(SecretSource::Command {
                argv: vec!["/etc/postern/bin/get-token".into()],
                ttl: DEFAULT_TTL,
            })
        );
    }

    #[test]
    fn a_bad_secret_is_a_problem_at_its_path() {
        for (secret, words) in [
            ("\"\"", "must be a vault secret name"),
            ("\"file:\"", "file: needs a path"),
            ("\"env:\"", "env: needs a variable name"),
            ("\"op:vault/item\"", "`op:` is not a secret source"),
            ("3", "expected a vault secret name"),
            ("{ command = [] }", "must name a program"),
            (
                "{ command = [\"op\"], ttl = \"soon\" }",
                "credentials[0].secret.ttl",
            ),
            (
                "{ command = [\"op\"], shell = true }",
                "credentials[0].secret.shell",
            ),
        ] {
            let p = problem(secret);
            assert!(
                p.contains("credentials[0].secret") && p.contains(words),
                "{secret}: {p}"
            );
        }
    }
}
