//! Failed logins (a wrong `Proxy-Authorization`) are journaled as agent `unauthenticated`
//! at a bounded rate per source address, so a flood of them cannot fill the journal
//! (SPEC §3.1). The rest are refused all the same and only counted in metrics.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The record's agent for a failed login: the claimed id is evidence only.
pub const UNAUTHENTICATED: &str = "unauthenticated";

/// The longest target (in bytes) a failed login's record keeps.
pub const MAX_STORED_TARGET: usize = 256;

/// Records a source may write at once, then one per `REFILL`.
const BURST: u32 = 10;
const REFILL: Duration = Duration::from_secs(10);
/// Sources tracked at once; a full table journals nothing new until buckets refill.
const MAX_SOURCES: usize = 4096;

struct Bucket {
    tokens: u32,
    refilled: Instant,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let gained = now.duration_since(self.refilled).as_secs() / REFILL.as_secs();
        if gained > 0 {
            let gained = u32::try_from(gained).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(gained).min(BURST);
            self.refilled = now;
        }
    }
}

/// A token bucket per source address.
#[derive(Default)]
pub struct FailedLogins {
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

impl FailedLogins {
    /// Whether this failed login may be journaled now (takes a token if so).
    pub fn may_journal(&self, source: IpAddr) -> bool {
        self.may_journal_at(source, Instant::now())
    }

    fn may_journal_at(&self, source: IpAddr, now: Instant) -> bool {
        let Ok(mut buckets) = self.buckets.lock() else {
            return false;
        };
        if buckets.len() >= MAX_SOURCES && !buckets.contains_key(&source) {
            buckets.retain(|_, b| {
                b.refill(now);
                b.tokens < BURST
            });
            if buckets.len() >= MAX_SOURCES {
                return false;
            }
        }
        let bucket = buckets.entry(source).or_insert(Bucket {
            tokens: BURST,
            refilled: now,
        });
        bucket.refill(now);
        if bucket.tokens == 0 {
            return false;
        }
        bucket.tokens -= 1;
        true
    }
}

/// The target as a failed login's record keeps it: at most `MAX_STORED_TARGET` bytes.
pub fn capped_target(target: &str) -> (String, bool) {
    if target.len() <= MAX_STORED_TARGET {
        return (target.to_owned(), false);
    }
    let mut end = MAX_STORED_TARGET;
    while !target.is_char_boundary(end) {
        end -= 1;
    }
    (format!("{}…", &target[..end]), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_gets_a_burst_then_one_record_per_refill() {
        let logins = FailedLogins::default();
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        let t0 = Instant::now();
        let first: Vec<bool> = (0..BURST + 5)
            .map(|_| logins.may_journal_at(a, t0))
            .collect();
        assert_eq!(first.iter().filter(|x| **x).count(), BURST as usize);
        assert!(
            logins.may_journal_at(b, t0),
            "another source has its own bucket"
        );
        assert!(!logins.may_journal_at(a, t0 + REFILL / 2));
        assert!(logins.may_journal_at(a, t0 + REFILL));
        assert!(!logins.may_journal_at(a, t0 + REFILL));
    }

    #[test]
    fn long_targets_are_capped_on_a_char_boundary() {
        let (short, cut) = capped_target("https://h/x");
        assert_eq!((short.as_str(), cut), ("https://h/x", false));
        let long = format!("https://h/{}", "é".repeat(400));
        let (capped, cut) = capped_target(&long);
        assert!(cut && capped.len() <= MAX_STORED_TARGET + '…'.len_utf8());
        assert!(capped.ends_with('…'));
    }
}
