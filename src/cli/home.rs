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

    /// postern's SSH host key and the known_hosts file for agents.
    pub fn ssh_dir(&self) -> PathBuf {
        self.root.join("ssh")
    }

    /// Creates the directories (mode 0700: they hold keys and the journal).
    pub fn create(&self) -> std::io::Result<()> {
        for dir in [
            &self.root,
            &self.journal_dir(),
            &self.certs_dir(),
            &self.ssh_dir(),
        ] {
            std::fs::create_dir_all(dir)?;
            restrict(dir)?;
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
fn restrict(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

#[cfg(not(unix))]
fn restrict(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}
