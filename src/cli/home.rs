//! `POSTERN_HOME`: the state directory (journal, vault, CA key, SSH host key).

use std::path::{Path, PathBuf};

/// The layout of the state directory.
#[derive(Debug, Clone)]
pub struct Home {
    pub root: PathBuf,
}

impl Home {
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Self {
        let root = env("POSTERN_HOME")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(".postern"));
        Self { root }
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

    /// Creates the directories (mode 0700: they hold keys and the journal).
    pub fn create(&self) -> std::io::Result<()> {
        for dir in [&self.root, &self.journal_dir(), &self.certs_dir()] {
            std::fs::create_dir_all(dir)?;
            restrict(dir)?;
        }
        Ok(())
    }
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
