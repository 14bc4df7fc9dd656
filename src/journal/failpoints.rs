//! `POSTERN_CRASH_AFTER=<EVENT_KIND>[:n]` (SPEC §6), compiled only with `failpoints`.

use super::event::EventKind;

/// Aborts the process right after the n-th durable write of one event kind.
#[derive(Debug, Default)]
pub struct Failpoints {
    #[cfg(feature = "failpoints")]
    target: Option<(EventKind, u32)>,
    #[cfg(feature = "failpoints")]
    seen: u32,
}

impl Failpoints {
    #[cfg(feature = "failpoints")]
    pub fn from_env() -> Self {
        let target = std::env::var("POSTERN_CRASH_AFTER")
            .ok()
            .and_then(|v| parse(&v));
        Self { target, seen: 0 }
    }

    #[cfg(not(feature = "failpoints"))]
    pub fn from_env() -> Self {
        Self::default()
    }

    #[cfg(feature = "failpoints")]
    pub fn after_durable_write(&mut self, kind: EventKind) {
        if let Some((k, n)) = self.target
            && k == kind
        {
            self.seen += 1;
            if self.seen >= n {
                eprintln!("postern: failpoint: crashing after {} #{n}", kind.as_str());
                std::process::abort();
            }
        }
    }

    #[cfg(not(feature = "failpoints"))]
    pub fn after_durable_write(&mut self, _kind: EventKind) {}
}

/// Parses `KIND[:n]`.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub fn parse(spec: &str) -> Option<(EventKind, u32)> {
    let (kind, n) = match spec.split_once(':') {
        Some((k, n)) => (k, n.trim().parse().ok()?),
        None => (spec, 1),
    };
    Some((EventKind::parse(kind.trim())?, n))
}

/// `POSTERN_PAUSE_BEFORE_SEND_MS=<ms>`: waits between `DISPATCH_STARTED` on a pooled
/// connection and handing the request to it, so a test can close that connection there.
#[cfg(feature = "failpoints")]
pub async fn pause_before_send() {
    let ms = std::env::var("POSTERN_PAUSE_BEFORE_SEND_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = ms {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

#[cfg(not(feature = "failpoints"))]
pub async fn pause_before_send() {}

/// `POSTERN_PAUSE_AFTER_LEASE_MS=<ms>`: the first worker of the process to take a lease
/// (claim a key, or lease a new generation) waits this long before going on toward the
/// dispatch boundary, so a test can let its lease expire and supersede it.
#[cfg(feature = "failpoints")]
pub async fn pause_after_lease() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static PAUSED: AtomicBool = AtomicBool::new(false);
    let ms = std::env::var("POSTERN_PAUSE_AFTER_LEASE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = ms
        && !PAUSED.swap(true, Ordering::SeqCst)
    {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

#[cfg(not(feature = "failpoints"))]
pub async fn pause_after_lease() {}

/// `POSTERN_LEASE_TTL_MS=<ms>`: every lease expires after this long (tests shorten it).
#[cfg(feature = "failpoints")]
pub fn lease_ttl_override() -> Option<std::time::Duration> {
    std::env::var("POSTERN_LEASE_TTL_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(std::time::Duration::from_millis)
}

#[cfg(not(feature = "failpoints"))]
pub fn lease_ttl_override() -> Option<std::time::Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(
            parse("DISPATCH_STARTED"),
            Some((EventKind::DispatchStarted, 1))
        );
        assert_eq!(parse("FAILED:3"), Some((EventKind::Failed, 3)));
        assert_eq!(parse("NOPE"), None);
        assert_eq!(parse("FAILED:x"), None);
    }
}
