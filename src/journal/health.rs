//! The journal's health: storage faults and the free-space guard.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Shared between the writer, the space guard and the front ends.
#[derive(Debug, Default)]
pub struct Health {
    fatal: AtomicBool,
    /// Free space is below `min_free_bytes` (the space guard).
    low_space: AtomicBool,
    reason: Mutex<Option<String>>,
    /// Woken once when a storage fault makes a restart necessary.
    pub fatal_notify: Notify,
}

impl Health {
    pub fn is_fatal(&self) -> bool {
        self.fatal.load(Ordering::SeqCst)
    }

    pub fn set_fatal(&self, reason: String) {
        if let Ok(mut r) = self.reason.lock() {
            *r = Some(reason);
        }
        self.fatal.store(true, Ordering::SeqCst);
        self.fatal_notify.notify_waiters();
        self.fatal_notify.notify_one();
    }

    /// New dispatches are refused (low space or a fault); resolutions still record.
    pub fn refusing_dispatch(&self) -> bool {
        self.is_fatal() || self.low_space()
    }

    pub fn low_space(&self) -> bool {
        self.low_space.load(Ordering::SeqCst)
    }

    pub fn set_low_space(&self, low: bool) {
        self.low_space.store(low, Ordering::SeqCst);
    }

    pub fn reason(&self) -> Option<String> {
        self.reason.lock().ok().and_then(|r| r.clone())
    }
}
