//! The free-space guard: a reserve file and a statvfs watch (SPEC §2, storage faults).
//!
//! The watch runs on a timer and, cheaply, before every group commit (the writer calls
//! `check_low`), so the journal flips to refusing new work before fjall meets ENOSPC.
//! Only the timer gives the reserve back and resumes: allocating it takes real writes.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::health::Health;

/// Thresholds for the guard.
#[derive(Debug, Clone)]
pub struct SpaceGuard {
    pub dir: PathBuf,
    pub reserve_bytes: u64,
    pub min_free_bytes: u64,
    pub interval: Duration,
}

/// The reserve is written in chunks of this size.
const CHUNK: usize = 1 << 20;

impl SpaceGuard {
    fn reserve_path(&self) -> PathBuf {
        self.dir.join("reserve.bin")
    }

    /// Makes the reserve file exist with every byte allocated: a sparse file (`set_len`)
    /// would free nothing when released.
    fn ensure_reserve(&self) -> std::io::Result<()> {
        let path = self.reserve_path();
        if self.reserve_bytes == 0 || allocated(&path) >= self.reserve_bytes {
            return Ok(());
        }
        let written = write_reserve(&path, self.reserve_bytes);
        if written.is_err() {
            // A partial reserve would only take space the journal needs now.
            let _ = std::fs::remove_file(&path);
        }
        written
    }

    /// Frees the reserve's blocks for the journal.
    fn release_reserve(&self) {
        let _ = std::fs::remove_file(self.reserve_path());
    }

    /// The fast check for the write path: below the threshold, release the reserve and
    /// refuse new dispatches. Never resumes. True while low.
    pub fn check_low(&self, health: &Health) -> bool {
        let free = available(&self.dir);
        if free >= self.min_free_bytes {
            return false;
        }
        if !health.low_space() {
            tracing::warn!(
                free,
                min = self.min_free_bytes,
                "journal disk low; refusing new dispatches"
            );
        }
        self.release_reserve();
        health.set_low_space(true);
        true
    }

    /// One timed check: `check_low`, or resume once the threshold and a fresh reserve fit.
    pub fn check(&self, health: &Health) {
        if self.check_low(health) {
            return;
        }
        let free = available(&self.dir);
        let reserve_missing = self
            .reserve_bytes
            .saturating_sub(allocated(&self.reserve_path()));
        // Looked at again after the reserve is written: the writer may have seen space
        // fall meanwhile, and only a check after the last write may resume.
        if free >= self.min_free_bytes.saturating_add(reserve_missing)
            && self.ensure_reserve().is_ok()
            && !self.check_low(health)
        {
            if health.low_space() {
                tracing::info!(free, "journal disk has room again; accepting dispatches");
            }
            health.set_low_space(false);
        }
    }

    /// Checks now, then every `interval` on a background thread.
    pub fn spawn(self, health: Arc<Health>) {
        self.check(&health);
        let _ = std::thread::Builder::new()
            .name("postern-space".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(self.interval);
                    self.check(&health);
                }
            });
    }
}

/// Bytes the file really holds on disk (0 if it is missing).
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.blocks().saturating_mul(512).min(m.len()))
}

/// Writes `len` bytes and syncs them. Not zeros: a filesystem that compresses or
/// detects zero blocks would store those as holes again.
fn write_reserve(path: &Path, len: u64) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    let chunk = vec![0xa5u8; CHUNK];
    let mut left = len;
    while left > 0 {
        let n = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    file.sync_all()
}

fn available(dir: &Path) -> u64 {
    fs4::available_space(dir).unwrap_or(0)
}
