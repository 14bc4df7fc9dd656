//! The last seq the receiver acknowledged, in `POSTERN_HOME/audit/otlp-cursor.json`.
//!
//! A small file rather than a key in the journal: the journal's store is written only by
//! its writer thread, in group commits of chained events, and an ack is no event; it must
//! neither wait behind appends nor add writes to them. The file is replaced whole (temp
//! file, fsync, rename, fsync of the directory), so a crash leaves the old position or the
//! new one: at worst the batch after the old one is sent again.
//!
//! The position is kept per endpoint: a receiver that never acknowledged anything gets the
//! journal from its start rather than from where another receiver stopped.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

const FILE: &str = "otlp-cursor.json";

#[derive(Serialize, Deserialize)]
struct Stored {
    endpoint: String,
    acked_seq: u64,
}

/// Where the export of one endpoint stands.
#[derive(Debug, Clone)]
pub struct Cursor {
    dir: PathBuf,
    endpoint: String,
}

impl Cursor {
    /// The cursor of `endpoint` (its URL as written back: no credentials, validated).
    pub fn new(dir: &Path, endpoint: String) -> Self {
        Self {
            dir: dir.to_path_buf(),
            endpoint,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The seq this endpoint acknowledged last: 0 when it acknowledged none here (no file,
    /// or another endpoint's). An unreadable file is an error for the caller to judge.
    pub fn load(&self) -> std::io::Result<u64> {
        let text = match std::fs::read(self.path()) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let stored: Stored = serde_json::from_slice(&text)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        Ok(match stored.endpoint == self.endpoint {
            true => stored.acked_seq,
            false => 0,
        })
    }

    /// Replaces the stored position with `acked_seq`, durably.
    pub fn store(&self, acked_seq: u64) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let stored = Stored {
            endpoint: self.endpoint.clone(),
            acked_seq,
        };
        let json = serde_json::to_vec(&stored).map_err(std::io::Error::other)?;
        let tmp = self.dir.join(format!("{FILE}.tmp"));
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&json)?;
        file.sync_data()?;
        std::fs::rename(&tmp, self.path())?;
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::Cursor;

    #[test]
    fn a_cursor_survives_a_reopen_and_belongs_to_its_endpoint() {
        let dir = tempfile::tempdir().unwrap();
        let a = Cursor::new(dir.path(), "http://a:4318".into());
        assert_eq!(a.load().unwrap(), 0, "nothing acked yet");
        a.store(41).unwrap();
        a.store(42).unwrap();
        assert_eq!(
            Cursor::new(dir.path(), "http://a:4318".into())
                .load()
                .unwrap(),
            42
        );
        let b = Cursor::new(dir.path(), "http://b:4318".into());
        assert_eq!(b.load().unwrap(), 0, "another receiver acked nothing");
        std::fs::write(dir.path().join("otlp-cursor.json"), b"{").unwrap();
        assert!(a.load().is_err());
    }
}
