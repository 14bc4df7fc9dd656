//! Where a credential's secret comes from (SPEC §3.8): a vault entry, a file (read at each
//! use, so a rewritten Kubernetes or Docker secret counts from the next request), an
//! environment variable (read with the config), or a command (run without a shell, kept
//! for its `ttl`). HTTP and SSH both fetch through `Vault::fetch`.
//!
//! Each secret carries a non-secret version for the record: the vault's number, else
//! `kind:` and 12 hex digits of an HMAC-SHA256 of the value under a random key kept in the
//! state directory, so a version tells a change without letting a guess be checked.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use serde_json::json;
use sha2::Sha256;

use super::command::{self, CommandFailure};
use super::{Secret, Vault, VaultError};
use crate::config::{Config, SecretSource};
use crate::contract::{Code, DIGEST_PREFIX, DigestOf, SecretVersion};
use crate::journal::Failure;

/// The digest key's file in the state directory (32 random bytes, owner-only).
pub const KEY_FILE: &str = "secret-digest.key";

/// A larger file is no secret postern injects.
const MAX_FILE: u64 = 1 << 20;

/// A failed command is run again no sooner than this (or its `ttl`, if shorter), so a
/// broken `op` is not started for every request.
const FAILURE_HOLD: Duration = Duration::from_secs(5);

/// Commands remembered at once; more (reload after reload) start the cache over.
const MAX_COMMANDS: usize = 256;

/// Why a file gave no secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFailure {
    NotFound,
    Unreadable(std::io::ErrorKind),
    Empty,
    TooLarge,
    NotText,
}

impl FileFailure {
    fn word(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::Unreadable(_) => "unreadable",
            Self::Empty => "empty",
            Self::TooLarge => "too_large",
            Self::NotText => "not_text",
        }
    }
}

impl std::fmt::Display for FileFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFound => write!(f, "does not exist"),
            Self::Unreadable(kind) => write!(f, "cannot be read ({kind})"),
            Self::Empty => write!(f, "is empty"),
            Self::TooLarge => write!(f, "is larger than {MAX_FILE} bytes"),
            Self::NotText => write!(f, "is not UTF-8 text"),
        }
    }
}

/// Why a secret could not be had. Names a path, variable or program; never a value, and
/// never what a command printed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("{}", vault_words(.0))]
    Vault(VaultError),
    #[error("file {} {why}", .path.display())]
    File { path: PathBuf, why: FileFailure },
    #[error("environment variable {0} is not set (or is empty) in postern's environment")]
    Env(String),
    #[error("command `{program}` {why} (its output is not kept)")]
    Command {
        program: String,
        why: CommandFailure,
    },
    #[error("the key for secret versions ({0})")]
    Key(String),
}

fn vault_words(e: &VaultError) -> String {
    match e {
        VaultError::Missing(name) => format!("secret {name} is not in the vault"),
        other => other.to_string(),
    }
}

impl SecretError {
    /// The contract code the request fails with.
    pub fn code(&self) -> Code {
        match self {
            Self::Vault(VaultError::Locked) => Code::VaultLocked,
            Self::Vault(VaultError::Missing(_)) => Code::CredentialMissing,
            Self::Vault(VaultError::DecryptFailed | VaultError::File(_)) => {
                Code::CredentialDecryptFailed
            }
            Self::File { .. } | Self::Env(_) | Self::Command { .. } | Self::Key(_) => {
                Code::CredentialMissing
            }
        }
    }

    /// What the record may show anyone: the kind of source and how it failed (a
    /// command's exit status), never a path, a name or a value.
    pub fn evidence(&self) -> Option<serde_json::Value> {
        Some(match self {
            Self::Vault(_) | Self::Key(_) => return None,
            Self::File { why, .. } => json!({"kind": "file", "failure": why.word()}),
            Self::Env(_) => json!({"kind": "env", "failure": "unset"}),
            Self::Command { why, .. } => {
                let mut e = json!({"kind": "command", "failure": why.word()});
                match why {
                    CommandFailure::Exit(n) => e["exit_status"] = json!(n),
                    CommandFailure::Signal(n) => e["signal"] = json!(n),
                    _ => {}
                }
                e
            }
        })
    }

    /// The journal's failure for `credential`: the code, the operator's diagnostic, the
    /// evidence (`secret_source`).
    pub fn failure(&self, credential: &str) -> Failure {
        let mut f = Failure::of(self.code());
        f.diagnostic = Some(format!("credential {credential}: {self}"));
        if let Some(e) = self.evidence() {
            f.evidence.insert("secret_source".into(), e);
        }
        f
    }
}

/// One command's last run: kept for its `ttl` (a failure for `FAILURE_HOLD` at most).
#[derive(Default)]
struct Kept {
    last: Option<(Instant, Result<Secret, CommandFailure>)>,
}

impl Kept {
    fn fresh(&self, ttl: Duration) -> Option<Result<Secret, CommandFailure>> {
        let (at, result) = self.last.as_ref()?;
        let hold = if result.is_ok() {
            ttl
        } else {
            ttl.min(FAILURE_HOLD)
        };
        (at.elapsed() < hold).then(|| result.clone())
    }
}

/// What the non-vault sources keep: the digest key and each command's last run.
pub struct Sources {
    home: PathBuf,
    key: Mutex<Option<[u8; 32]>>,
    commands: Mutex<HashMap<Vec<String>, Arc<Mutex<Kept>>>>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sources({})", self.home.display())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Sources {
    pub fn new(home: &Path) -> Self {
        Self {
            home: home.to_path_buf(),
            key: Mutex::new(None),
            commands: Mutex::new(HashMap::new()),
        }
    }

    /// The digest key, made on first use and kept in the state directory.
    fn key(&self) -> Result<[u8; 32], SecretError> {
        let mut held = lock(&self.key);
        if let Some(key) = *held {
            return Ok(key);
        }
        let key = load_or_create_key(&self.home).map_err(SecretError::Key)?;
        *held = Some(key);
        Ok(key)
    }

    /// `of:` and 12 hex digits of HMAC-SHA256(key, kind NUL value).
    fn version(&self, of: DigestOf, value: &str) -> Result<SecretVersion, SecretError> {
        let key = self.key()?;
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key)
            .map_err(|e| SecretError::Key(e.to_string()))?;
        mac.update(of.as_str().as_bytes());
        mac.update(b"\0");
        mac.update(value.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut prefix = [0u8; DIGEST_PREFIX];
        for (p, d) in prefix.iter_mut().zip(digest.iter()) {
            *p = *d;
        }
        Ok(SecretVersion::Digest { of, prefix })
    }

    fn secret(&self, of: DigestOf, value: String) -> Result<Secret, SecretError> {
        let version = self.version(of, &value)?;
        Ok(Secret { value, version })
    }

    fn file(&self, path: &Path) -> Result<Secret, SecretError> {
        let value = read_secret_file(path).map_err(|why| SecretError::File {
            path: path.to_path_buf(),
            why,
        })?;
        self.secret(DigestOf::File, value)
    }

    fn slot(&self, argv: &[String]) -> Arc<Mutex<Kept>> {
        let mut commands = lock(&self.commands);
        if commands.len() >= MAX_COMMANDS && !commands.contains_key(argv) {
            commands.clear();
        }
        commands.entry(argv.to_vec()).or_default().clone()
    }

    /// The command's secret, run again only once its `ttl` passed; one run at a time
    /// (others wait for it).
    fn command(&self, argv: &[String], ttl: Duration) -> Result<Secret, SecretError> {
        let slot = self.slot(argv);
        let failed = |why| SecretError::Command {
            program: argv.first().cloned().unwrap_or_default(),
            why,
        };
        off_the_runtime(|| {
            let mut kept = lock(&slot);
            if let Some(hit) = kept.fresh(ttl) {
                return hit.map_err(failed);
            }
            let result = match command::run(argv, command::TIMEOUT) {
                Ok(value) => self.secret(DigestOf::Command, value)?,
                Err(why) => {
                    kept.last = Some((Instant::now(), Err(why)));
                    return Err(failed(why));
                }
            };
            kept.last = Some((Instant::now(), Ok(result.clone())));
            Ok(result)
        })
    }
}

/// Runs `f` (which may wait for a command) without stalling a runtime worker's other tasks.
fn off_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A secret file's text: one trailing newline (`\n` or `\r\n`) is not part of it, as
/// `echo value > file` and most secret stores write it.
fn read_secret_file(path: &Path) -> Result<String, FileFailure> {
    let file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FileFailure::NotFound,
        kind => FileFailure::Unreadable(kind),
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| FileFailure::Unreadable(e.kind()))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(FileFailure::TooLarge);
    }
    let text = String::from_utf8(bytes).map_err(|_| FileFailure::NotText)?;
    let value = super::command::without_final_newline(text);
    if value.is_empty() {
        return Err(FileFailure::Empty);
    }
    Ok(value)
}

/// Reads the key, or makes it: written whole under a temporary name, then linked into
/// place, so two processes making it at once agree on the one that won.
fn load_or_create_key(home: &Path) -> Result<[u8; 32], String> {
    let path = home.join(KEY_FILE);
    let read = |p: &Path| -> Result<[u8; 32], String> {
        let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
        <[u8; 32]>::try_from(bytes.as_slice())
            .map_err(|_| format!("{}: not a 32-byte key", p.display()))
    };
    match std::fs::metadata(&path) {
        Ok(_) => return read(&path),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("{}: {e}", path.display()));
        }
        Err(_) => {}
    }
    let key: [u8; 32] = rand::random();
    let tmp = home.join(format!("{KEY_FILE}.{}.tmp", std::process::id()));
    let written = write_owner_only(&tmp, &key).and_then(|()| std::fs::hard_link(&tmp, &path));
    let _ = std::fs::remove_file(&tmp);
    match written {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read(&path),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn write_owner_only(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// A configured credential whose secret cannot be had now.
#[derive(Debug)]
pub struct Unavailable<'c> {
    pub credential: &'c str,
    pub source: &'c SecretSource,
    pub why: SecretError,
}

impl Vault {
    /// The secret `source` names, with its non-secret version.
    pub fn fetch(&self, source: &SecretSource) -> Result<Secret, SecretError> {
        let sources = &self.sources;
        match source {
            SecretSource::Vault(name) => self.get(name).map_err(SecretError::Vault),
            SecretSource::File(path) => sources.file(path),
            SecretSource::Env { name, value } => match value {
                Some(v) => sources.secret(DigestOf::Env, v.expose().to_owned()),
                None => Err(SecretError::Env(name.clone())),
            },
            SecretSource::Command { argv, ttl } => sources.command(argv, *ttl),
        }
    }

    /// The configured credentials whose secret is missing now (`CREDENTIAL_MISSING`), for
    /// `/healthz`, the start's and reload's warnings. A vault entry is looked up by name
    /// (no key needed); a file is read, a command run unless its last run still holds.
    pub fn unavailable<'c>(&self, config: &'c Config) -> Vec<Unavailable<'c>> {
        let held = self.list().ok();
        let mut out = Vec::new();
        for c in &config.credentials {
            let result = match &c.secret {
                SecretSource::Vault(name) => match &held {
                    Some(held) if !held.iter().any(|(h, _)| h == name) => {
                        Err(SecretError::Vault(VaultError::Missing(name.clone())))
                    }
                    _ => Ok(()),
                },
                other => self.fetch(other).map(drop),
            };
            if let Err(why) = result
                && why.code() == Code::CredentialMissing
            {
                out.push(Unavailable {
                    credential: &c.id,
                    source: &c.secret,
                    why,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
