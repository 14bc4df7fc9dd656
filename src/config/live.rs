//! The config in force, swapped whole by a reload (`SIGHUP`, `postern reload`). Readers take
//! a snapshot (`current`) and keep it for what they started: an invocation dispatches what
//! its snapshot allowed, and a reload changes only what starts after it (SPEC §2, §5.1).

use std::sync::{Arc, RwLock};

use super::Config;

pub struct Live {
    current: RwLock<Arc<Config>>,
}

impl Live {
    pub fn new(config: Config) -> Self {
        Self {
            current: RwLock::new(Arc::new(config)),
        }
    }

    /// The config in force now.
    pub fn current(&self) -> Arc<Config> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Puts `next` in force; returns the config it replaces.
    pub fn swap(&self, next: Config) -> Arc<Config> {
        let next = Arc::new(next);
        match self.current.write() {
            Ok(mut c) => std::mem::replace(&mut *c, next),
            Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), next),
        }
    }
}
