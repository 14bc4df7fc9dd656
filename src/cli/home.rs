//! `POSTERN_HOME`: the state directory (journal, vault, CA key, SSH host key).

use std::path::{Path, PathBuf};

/// The layout of the state directory.
#[derive(Debug, Clone)]
pub struct Home {
    pub root: PathBuf,
}

impl Home {
    /// `POSTERN_HOME`, else `./.postern`; made absolute so that every path the CLI
    /// prints (exports, messages) works from any directory.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Self {
        let root = env("POSTERN_HOME")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(".postern"));
        let root = std::path::absolute(&root).unwrap_or(root);
        Self { root }
    }

    /// Fails, naming the directory, when it does not exist yet.
    pub fn require(&self) -> Result<(), String> {
        if self.root.is_dir() {
            return Ok(());
        }
        Err(format!(
            "the state directory {} does not exist (POSTERN_HOME; `postern init` or `postern serve` creates it)",
            self.root.display()
        ))
    }

    pub fn at(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    pub fn journal_dir(&self) -> PathBuf {
        self.root.join("journal")
    }

    pub fn certs_dir(&self) -> PathBuf {
        self.root.join("certs")
    }

    /// The audit export's cursor (the last seq its receiver acknowledged).
    pub fn audit_dir(&self) -> PathBuf {
        self.root.join("audit")
    }

    /// postern's SSH host key and the known_hosts file for agents.
    pub fn ssh_dir(&self) -> PathBuf {
        self.root.join("ssh")
    }

    /// Creates the directories. The journal and SSH keys are the daemon user's alone (0700);
    /// the state directory can be passed through but not listed (0711) and `certs/` read
    /// (0755), so an agent under another user reaches the public CA certificate and bundle
    /// by their paths. The vault and the CA key are files of mode 0600.
    pub fn create(&self) -> std::io::Result<()> {
        for (dir, mode) in [
            (&self.root, 0o711),
            (&self.journal_dir(), 0o700),
            (&self.certs_dir(), 0o755),
            (&self.ssh_dir(), 0o700),
            (&self.audit_dir(), 0o700),
        ] {
            std::fs::create_dir_all(dir)?;
            set_mode(dir, mode)?;
        }
        Ok(())
    }
}

/// Refuses a `POSTERN_VAULT_KEY` that does not open the vault (serve, secret): an error
/// naming the file, never the key, instead of a locked vault found later.
pub fn refuse_wrong_key(vault: &crate::vault::Vault) -> Result<(), super::CliError> {
    use crate::vault::KeyState;
    let state = vault
        .key_state()
        .map_err(|e| super::CliError::Failed(format!("cannot read the vault: {e}")))?;
    if state == KeyState::WrongKey {
        return Err(super::CliError::Failed(format!(
            "POSTERN_VAULT_KEY does not open the vault at {} (it was sealed with another key)",
            vault.path().display()
        )));
    }
    Ok(())
}

#[cfg(unix)]
fn set_mode(dir: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_dir: &Path, _mode: u32) -> std::io::Result<()> {
    Ok(())
}

/// SPEC §5.3: like `ssh-agent`, a process holding the vault key is not dumpable, so no
/// other process of the same user reads its memory, environment or descriptors through
/// `/proc` or ptrace.
pub fn not_dumpable() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{DumpableBehavior, set_dumpable_behavior};
        set_dumpable_behavior(DumpableBehavior::NotDumpable)
            .map_err(|e| format!("cannot make the process non-dumpable: {e}"))?;
    }
    Ok(())
}
