//! Refusals before any route or secret — failed logins (journaled as agent
//! `unauthenticated`, SPEC §3.1) and an authenticated agent's `ROUTE_DENIED`/
//! `INVALID_TARGET`/… — are journaled at a bounded rate per key (source address, agent),
//! with the stored target capped, so a flood of them cannot fill the journal. The rest
//! are refused all the same (`invocation_id: null`) and only counted in metrics.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The record's agent for a failed login: the claimed id is evidence only.
pub const UNAUTHENTICATED: &str = "unauthenticated";

/// The longest target (in bytes) a failed login's record keeps.
pub const MAX_STORED_TARGET: usize = 256;

/// Keys tracked at once; a full table journals nothing new until buckets refill.
const MAX_SOURCES: usize = 4096;

struct Bucket {
    tokens: u32,
    refilled: Instant,
}

impl Bucket {
    fn refill(&mut self, now: Instant, rate: &Rate) {
        let gained = now.duration_since(self.refilled).as_millis() / rate.refill.as_millis().max(1);
        if gained > 0 {
            let gained = u32::try_from(gained).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(gained).min(rate.burst);
            self.refilled = now;
        }
    }
}

/// Records a key may write at once, then one per `refill`.
struct Rate {
    burst: u32,
    refill: Duration,
}

/// A token bucket per key (a source address, an agent).
pub struct RefusalRate {
    rate: Rate,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RefusalRate {
    /// Failed logins, per source address: 10, then one per 10 s.
    pub fn failed_logins() -> Self {
        Self::new(10, Duration::from_secs(10))
    }

    /// An authenticated agent's refusals before any route: 30, then one per 2 s.
    pub fn refusals() -> Self {
        Self::new(30, Duration::from_secs(2))
    }

    fn new(burst: u32, refill: Duration) -> Self {
        Self {
            rate: Rate { burst, refill },
            buckets: Mutex::default(),
        }
    }

    /// Whether this refusal may be journaled now (takes a token if so).
    pub fn may_journal(&self, key: &str) -> bool {
        self.may_journal_at(key, Instant::now())
    }

    fn may_journal_at(&self, source: &str, now: Instant) -> bool {
        let (burst, rate) = (self.rate.burst, &self.rate);
        let Ok(mut buckets) = self.buckets.lock() else {
            return false;
        };
        if buckets.len() >= MAX_SOURCES && !buckets.contains_key(source) {
            buckets.retain(|_, b| {
                b.refill(now, rate);
                b.tokens < burst
            });
            if buckets.len() >= MAX_SOURCES {
                return false;
            }
        }
        let bucket = buckets.entry(source.to_owned()).or_insert(Bucket {
            tokens: burst,
            refilled: now,
        });
        bucket.refill(now, rate);
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
        let logins = RefusalRate::failed_logins();
        let (a, b) = ("127.0.0.1", "127.0.0.2");
        let refill = Duration::from_secs(10);
        let t0 = Instant::now();
        let first: Vec<bool> = (0..15).map(|_| logins.may_journal_at(a, t0)).collect();
        assert_eq!(first.iter().filter(|x| **x).count(), 10);
        assert!(
            logins.may_journal_at(b, t0),
            "another source has its own bucket"
        );
        assert!(!logins.may_journal_at(a, t0 + refill / 2));
        assert!(logins.may_journal_at(a, t0 + refill));
        assert!(!logins.may_journal_at(a, t0 + refill));
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
