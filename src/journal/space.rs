//! The free-space guard: a reserve file and a statvfs watch (SPEC §2, storage faults).

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

impl SpaceGuard {
    fn reserve_path(&self) -> PathBuf {
        self.dir.join("reserve.bin")
    }

    /// Creates the reserve file if it is missing and space allows.
    fn ensure_reserve(&self) -> std::io::Result<()> {
        let path = self.reserve_path();
        if path.exists() || self.reserve_bytes == 0 {
            return Ok(());
        }
        let file = std::fs::File::create(&path)?;
        file.set_len(self.reserve_bytes)?;
        file.sync_all()
    }

    /// One check: below the threshold, release the reserve and refuse dispatches.
    pub fn check(&self, health: &Health) {
        let free = available(&self.dir);
        if free < self.min_free_bytes {
            if !health.refusing_dispatch() {
                tracing::warn!(
                    free,
                    min = self.min_free_bytes,
                    "journal disk low; refusing new dispatches"
                );
            }
            let _ = std::fs::remove_file(self.reserve_path());
            health.set_refusing_dispatch(true);
        } else if free >= self.min_free_bytes.saturating_add(self.reserve_bytes)
            && self.ensure_reserve().is_ok()
        {
            health.set_refusing_dispatch(false);
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

fn available(dir: &Path) -> u64 {
    fs4::available_space(dir).unwrap_or(0)
}
