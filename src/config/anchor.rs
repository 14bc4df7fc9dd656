//! The config file a reload may read: the one `serve` started with, never a file someone
//! put in its place. At start postern notes the identity (device, inode) of every directory
//! on the file's path and of every symlink the path went through, holds the file's
//! directory open, and notes which of them another uid could write. A reload reads the file
//! through the held directory, and only after checking that no directory on the path was
//! moved or replaced, no symlink changed, and nothing became writable by another uid
//! (issue 40: a jailed agent moved the config's directory away and made a new one with its
//! own `postern.toml`). The file itself may be replaced (editors save by rename); its
//! directory may not.

use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

use super::Problem;

/// One file system object on the config's path, as it was at start.
#[derive(Debug)]
struct Pinned {
    path: PathBuf,
    dev: u64,
    ino: u64,
    /// Another uid could write it at start (then that is no news at a reload).
    open_to_others: bool,
    /// A symlink's target.
    target: Option<PathBuf>,
    /// Held open so that its inode number is not freed and given to an impostor.
    _held: Option<OwnedFd>,
}

/// The config's path as `serve` found it.
#[derive(Debug)]
pub struct Anchor {
    /// The path as given (absolute).
    path: PathBuf,
    /// The file's name in `dir`.
    name: PathBuf,
    /// The file's directory, held open.
    dir: OwnedFd,
    /// Every directory from `/` to the file's, and every symlink on the given path.
    pinned: Vec<Pinned>,
    file_open_to_others: bool,
}

impl Anchor {
    /// Notes `path`'s directories and holds its directory open.
    pub fn take(path: &Path) -> Result<Self, Problem> {
        let problem = |message: String| Problem {
            path: path.display().to_string(),
            message,
        };
        let path = std::path::absolute(path)
            .map_err(|e| problem(format!("cannot resolve the config path: {e}")))?;
        let real = std::fs::canonicalize(&path)
            .map_err(|e| problem(format!("cannot resolve the config path: {e}")))?;
        let (Some(parent), Some(name)) = (real.parent(), real.file_name()) else {
            return Err(problem("the config path names no file".into()));
        };
        let dir = openat(
            nix::fcntl::AT_FDCWD,
            parent,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| problem(format!("cannot open {}: {e}", parent.display())))?;
        let pinned = pin(&path, parent).map_err(problem)?;
        let file_open_to_others = std::fs::metadata(&real)
            .map(|m| open_to_others(&m))
            .unwrap_or(false);
        Ok(Self {
            path,
            name: PathBuf::from(name),
            dir,
            pinned,
            file_open_to_others,
        })
    }

    /// The path as given at start.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's text, if its path still leads where it led at start.
    pub fn read(&self) -> Result<String, Problem> {
        let problem = |message: String| Problem {
            path: self.path.display().to_string(),
            message,
        };
        self.check().map_err(problem)?;
        let fd = openat(
            &self.dir,
            &self.name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| problem(format!("cannot read the config file: {e}")))?;
        let mut file = File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| problem(format!("cannot read the config file: {e}")))?;
        if !meta.is_file() {
            return Err(problem(
                "the config path is no longer a regular file".into(),
            ));
        }
        if open_to_others(&meta) && !self.file_open_to_others {
            return Err(problem(format!(
                "the config file became writable by another user (owner uid {}, mode {:o}) \
                 since postern started; the old config stays",
                meta.uid(),
                meta.mode() & 0o7777
            )));
        }
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|e| problem(format!("cannot read the config file: {e}")))?;
        Ok(text)
    }

    /// Every pinned directory and symlink still is what it was.
    fn check(&self) -> Result<(), String> {
        for was in &self.pinned {
            let now = std::fs::symlink_metadata(&was.path).map_err(|e| {
                format!(
                    "{} is gone since postern started ({e}); the old config stays — restart \
                     postern to use a config elsewhere",
                    was.path.display()
                )
            })?;
            let target = std::fs::read_link(&was.path).ok();
            if (now.dev(), now.ino()) != (was.dev, was.ino) || target != was.target {
                return Err(format!(
                    "{} was moved or replaced since postern started (a reload reads only the \
                     config postern started with); the old config stays — restart postern to use \
                     a config elsewhere",
                    was.path.display()
                ));
            }
            if open_to_others(&now) && !was.open_to_others {
                return Err(format!(
                    "{} became writable by another user (owner uid {}, mode {:o}) since postern \
                     started; the old config stays",
                    was.path.display(),
                    now.uid(),
                    now.mode() & 0o7777
                ));
            }
        }
        Ok(())
    }
}

/// Every directory from `/` down to `real_dir`, every prefix of `given`'s directory (a
/// symlink among them pinned as a link), and `given` itself if it is a symlink.
fn pin(given: &Path, real_dir: &Path) -> Result<Vec<Pinned>, String> {
    let mut pinned = Vec::new();
    let mut note = |p: &Path| -> Result<(), String> {
        if pinned.iter().any(|x: &Pinned| x.path == p) {
            return Ok(());
        }
        let meta = std::fs::symlink_metadata(p)
            .map_err(|e| format!("cannot inspect {}: {e}", p.display()))?;
        pinned.push(Pinned {
            path: p.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
            open_to_others: open_to_others(&meta),
            target: std::fs::read_link(p).ok(),
            _held: openat(
                nix::fcntl::AT_FDCWD,
                p,
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .ok(),
        });
        Ok(())
    };
    for prefix in prefixes(real_dir) {
        note(&prefix)?;
    }
    for prefix in given.parent().map(prefixes).unwrap_or_default() {
        note(&prefix)?;
    }
    // The file may be replaced, a symlink naming it may not.
    if std::fs::symlink_metadata(given).is_ok_and(|m| m.file_type().is_symlink()) {
        note(given)?;
    }
    Ok(pinned)
}

/// `/a/b/c` → `/`, `/a`, `/a/b`, `/a/b/c`.
fn prefixes(path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut at = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::Normal(_) => at.push(c),
            Component::ParentDir => {
                at.pop();
            }
            Component::CurDir | Component::Prefix(_) => continue,
        }
        out.push(at.clone());
    }
    out
}

/// A uid other than this process's (and root's) could change it: owned by another uid, or
/// group- or world-writable (a sticky directory lets others add names, not replace ours).
fn open_to_others(meta: &std::fs::Metadata) -> bool {
    let me = nix::unistd::getuid().as_raw();
    let owner = meta.uid();
    if owner != me && owner != 0 {
        return true;
    }
    let sticky_dir = meta.is_dir() && meta.mode() & 0o1000 != 0;
    !meta.file_type().is_symlink() && meta.mode() & 0o022 != 0 && !sticky_dir
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn setup() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("conf");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let file = dir.join("postern.toml");
        std::fs::write(&file, "a = 1\n").unwrap();
        (root, file)
    }

    #[test]
    fn an_edited_or_renamed_over_file_is_read() {
        let (_root, file) = setup();
        let anchor = Anchor::take(&file).unwrap();
        std::fs::write(&file, "a = 2\n").unwrap();
        assert_eq!(anchor.read().unwrap(), "a = 2\n");
        let next = file.with_file_name("next.toml");
        std::fs::write(&next, "a = 3\n").unwrap();
        std::fs::rename(&next, &file).unwrap();
        assert_eq!(anchor.read().unwrap(), "a = 3\n");
    }

    #[test]
    fn a_directory_moved_away_and_made_again_is_refused() {
        let (root, file) = setup();
        let anchor = Anchor::take(&file).unwrap();
        let dir = file.parent().unwrap();
        std::fs::rename(dir, root.path().join("moved")).unwrap();
        std::fs::create_dir(dir).unwrap();
        std::fs::write(&file, "evil = true\n").unwrap();
        let problem = anchor.read().unwrap_err();
        assert!(
            problem.message.contains("was moved or replaced"),
            "{problem:?}"
        );
    }

    #[test]
    fn a_swapped_symlink_is_refused() {
        let (root, file) = setup();
        let link = root.path().join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let anchor = Anchor::take(&link).unwrap();
        assert_eq!(anchor.read().unwrap(), "a = 1\n");
        let other = root.path().join("other.toml");
        std::fs::write(&other, "evil = true\n").unwrap();
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&other, &link).unwrap();
        assert!(anchor.read().is_err());
    }

    #[test]
    fn a_directory_opened_to_others_is_refused() {
        let (_root, file) = setup();
        let anchor = Anchor::take(&file).unwrap();
        let dir = file.parent().unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let problem = anchor.read().unwrap_err();
        assert!(
            problem.message.contains("writable by another user"),
            "{problem:?}"
        );
    }

    #[test]
    fn prefixes_run_from_the_root() {
        let p = prefixes(Path::new("/a/b/../c"));
        assert_eq!(
            p,
            ["/", "/a", "/a/b", "/a", "/a/c"]
                .iter()
                .map(PathBuf::from)
                .collect::<Vec<_>>()
        );
    }
}
