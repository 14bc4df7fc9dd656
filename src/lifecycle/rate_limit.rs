//! `rate_limit` on agents and routes (SPEC §5.8): a token bucket per limited agent and per
//! limited route, holding one interval's worth (at least one), refilled evenly. A request
//! passes only when every bucket it draws on has a token; it then takes one from each. Past
//! a limit the request is `RATE_LIMITED`, told when the next token comes (`Retry-After`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::Rate;

/// Which bucket: an agent's or a route's (one name may be both).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Limited {
    Agent(String),
    Route(String),
}

impl Limited {
    /// The envelope's `field` for a request this bucket refused.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Agent(_) => "agent.rate_limit",
            Self::Route(_) => "route.rate_limit",
        }
    }
}

#[derive(Debug)]
struct Bucket {
    rate: Rate,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: Rate, now: Instant) -> Self {
        Self {
            rate,
            tokens: capacity(rate),
            at: now,
        }
    }

    /// Refills for the time since it was last seen; a changed rate (a reload) starts anew.
    fn refill(&mut self, rate: Rate, now: Instant) {
        if self.rate != rate {
            *self = Self::new(rate, now);
            return;
        }
        let per_sec = f64::from(rate.count) / rate.per.as_secs_f64();
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * per_sec;
        self.tokens = (self.tokens + earned).min(capacity(rate));
        self.at = now;
    }

    /// How long until this bucket has a token (zero: it has one).
    fn wait(&self) -> Duration {
        if self.tokens >= 1.0 {
            return Duration::ZERO;
        }
        let per_sec = f64::from(self.rate.count) / self.rate.per.as_secs_f64();
        Duration::from_secs_f64((1.0 - self.tokens) / per_sec)
    }
}

/// A burst of one interval's worth, at least one.
fn capacity(rate: Rate) -> f64 {
    f64::from(rate.count.max(1))
}

/// Every limited agent's and route's bucket. Keys come from the config, so it stays small.
#[derive(Debug, Default)]
pub struct RateLimits {
    buckets: Mutex<HashMap<Limited, Bucket>>,
}

impl RateLimits {
    /// Takes a token from each of `limits` if every one has one; otherwise takes none and
    /// names the bucket that refused, with how long until it would pass.
    pub fn admit(&self, limits: &[(Limited, Rate)]) -> Result<(), (Limited, Duration)> {
        self.admit_at(limits, Instant::now())
    }

    fn admit_at(
        &self,
        limits: &[(Limited, Rate)],
        now: Instant,
    ) -> Result<(), (Limited, Duration)> {
        if limits.is_empty() {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let mut refused: Option<(Limited, Duration)> = None;
        for (key, rate) in limits {
            let bucket = buckets
                .entry(key.clone())
                .or_insert_with(|| Bucket::new(*rate, now));
            bucket.refill(*rate, now);
            let wait = bucket.wait();
            if wait > refused.as_ref().map_or(Duration::ZERO, |r| r.1) {
                refused = Some((key.clone(), wait));
            }
        }
        if let Some(r) = refused {
            return Err(r);
        }
        for (key, _) in limits {
            if let Some(b) = buckets.get_mut(key) {
                b.tokens -= 1.0;
            }
        }
        Ok(())
    }
}

/// The buckets a request of `agent` on `route` draws on: the agent's and the route's limits.
pub fn limits_of(
    config: &crate::config::Config,
    agent: &str,
    route: &crate::config::Route,
) -> Vec<(Limited, Rate)> {
    let mut limits = Vec::new();
    let configured = config.agents.iter().find(|a| a.id == agent);
    if let Some(rate) = configured.and_then(|a| a.rate_limit) {
        limits.push((Limited::Agent(agent.to_owned()), rate));
    }
    if let Some(rate) = route.rate_limit {
        limits.push((Limited::Route(route.id.clone()), rate));
    }
    limits
}

/// The `RATE_LIMITED` failure for a request `who` refused, naming the limit and when the
/// next token comes (HTTP also sends it as `Retry-After`).
pub fn refusal(who: &Limited, wait: Duration) -> crate::journal::Failure {
    let mut failure = crate::journal::Failure::of(crate::contract::Code::RateLimited);
    failure.field = Some(who.field().into());
    let after = retry_after_secs(wait);
    failure
        .evidence
        .insert("retry_after_secs".into(), after.into());
    failure
}

/// Whole seconds for `Retry-After`, rounded up (at least 1).
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs_f64().ceil() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_sec(count: u32) -> Rate {
        Rate {
            count,
            per: Duration::from_secs(1),
        }
    }

    #[test]
    fn a_burst_of_one_interval_then_one_token_per_share_of_it() {
        let limits = RateLimits::default();
        let t0 = Instant::now();
        let agent = [(Limited::Agent("ci".into()), per_sec(2))];
        assert!(limits.admit_at(&agent, t0).is_ok());
        assert!(limits.admit_at(&agent, t0).is_ok());
        let (who, wait) = limits.admit_at(&agent, t0).unwrap_err();
        assert_eq!(who, Limited::Agent("ci".into()));
        assert_eq!(wait, Duration::from_millis(500));
        assert!(
            limits
                .admit_at(&agent, t0 + Duration::from_millis(500))
                .is_ok()
        );
    }

    #[test]
    fn a_refused_request_takes_no_token_from_the_other_bucket() {
        let limits = RateLimits::default();
        let t0 = Instant::now();
        let agent = (Limited::Agent("ci".into()), per_sec(5));
        let route = (Limited::Route("pay".into()), per_sec(1));
        assert!(limits.admit_at(&[agent.clone(), route.clone()], t0).is_ok());
        let refused = limits
            .admit_at(&[agent.clone(), route.clone()], t0)
            .unwrap_err();
        assert_eq!(refused.0, Limited::Route("pay".into()));
        // The agent's own bucket still has its four tokens.
        for _ in 0..4 {
            assert!(limits.admit_at(std::slice::from_ref(&agent), t0).is_ok());
        }
        assert!(limits.admit_at(&[agent], t0).is_err());
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
