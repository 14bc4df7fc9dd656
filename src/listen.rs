//! The guard in front of every listener (proxy and admin): a connection cap, accept-error
//! backoff and throttled log lines, so no client can exhaust postern's file descriptors
//! or make its accept loop spin.
//!
//! File descriptor rule: at start the soft `RLIMIT_NOFILE` is raised to the hard limit.
//! Unless configured, the proxy's cap is `(nofile − admin cap − FD_RESERVE) / 2`: each agent
//! connection may hold an upstream connection too, and the reserve keeps the journal, the
//! listeners and the admin API answerable when the proxy is full.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::contract::{Code, Envelope, unjournaled_refusal};

/// Descriptors kept outside both caps: journal files, listeners, DNS, logs.
pub const FD_RESERVE: u64 = 64;

/// Sent to a connection over the cap before it is closed.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\nContent-Type: application/json\r\nContent-Length: 110\r\n\r\n{\"error\":{\"code\":\"AT_CONNECTION_CAP\",\"message\":\"This listener is at its max_connections; retry in a second.\"}}";

const BACKOFF_START: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit now in force.
pub fn raise_nofile() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum;
        }
    }
    limit.current
}

/// The proxy's connection cap: configured, or derived from the descriptor limit.
pub fn proxy_cap(configured: Option<usize>, nofile: Option<u64>, admin_cap: usize) -> usize {
    if let Some(n) = configured {
        return n;
    }
    let Some(nofile) = nofile else {
        return 65_536;
    };
    let spare = nofile.saturating_sub(admin_cap as u64 + FD_RESERVE);
    usize::try_from(spare / 2).unwrap_or(usize::MAX).max(1)
}

/// One line per interval for a repeated event, with how many happened since the last.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    count: u64,
}

impl Throttle {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            count: 0,
        }
    }

    /// Counts one event; `Some(n)` when a line is due (n events since the last line).
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        let due = self
            .last
            .is_none_or(|t| now.duration_since(t) >= self.every);
        if !due {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

/// Doubling sleeps after accept errors, reset by the next success.
#[derive(Debug, Default)]
struct Backoff(Option<Duration>);

impl Backoff {
    fn next(&mut self) -> Duration {
        let d = self.0.map_or(BACKOFF_START, |d| (d * 2).min(BACKOFF_MAX));
        self.0 = Some(d);
        d
    }
}

/// A connection's place, carried by each request on it: what outlives the connection's
/// HTTP serving (a WebSocket relay) keeps the place while it runs.
#[derive(Debug, Clone)]
pub struct HeldSlot(pub std::sync::Arc<Slot>);

/// A connection's place under the cap; dropping it frees the place.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Option<Gauge>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(g) = &self.open {
            g.dec();
        }
    }
}

/// A listener that admits at most `cap` connections at once.
pub struct Guarded {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    refused: Counter,
    errors: Counter,
    name: &'static str,
    /// Written to a connection over the cap before it is closed.
    over_cap: &'static [u8],
    backoff: Backoff,
    error_log: Throttle,
    refusal_log: Throttle,
    /// At the cap, the connection idle longest is closed to admit a new one.
    evict: Option<IdleRoster>,
    /// Connections open now.
    open: Option<Gauge>,
}

impl Guarded {
    pub fn new(inner: TcpListener, cap: usize, name: &'static str, refused: Counter) -> Self {
        Self {
            inner,
            slots: Arc::new(Semaphore::new(cap.min(Semaphore::MAX_PERMITS))),
            refused,
            errors: Counter::default(),
            name,
            over_cap: REFUSAL,
            backoff: Backoff::default(),
            error_log: Throttle::new(LOG_EVERY),
            refusal_log: Throttle::new(LOG_EVERY),
            evict: None,
            open: None,
        }
    }

    /// Admits connections under `other`'s cap instead of a cap of its own, making room
    /// from its idle connections: the SSH front and the proxy draw on one pool of
    /// descriptors, and idle proxy connections cannot lock SSH out.
    pub fn sharing_cap_of(mut self, other: &mut Guarded) -> Self {
        self.slots = other.slots.clone();
        self.evict = Some(other.idle_roster());
        self
    }

    /// The roster of this listener's idle connections (made on first use).
    pub fn idle_roster(&mut self) -> IdleRoster {
        self.evict.get_or_insert_with(IdleRoster::default).clone()
    }

    /// At the cap, closes the connection idle longest instead of refusing the new one
    /// (the admin API: idle or half-sent connections cannot lock an operator out).
    pub fn evicting(mut self, roster: IdleRoster) -> Self {
        self.evict = Some(roster);
        self
    }

    /// Keeps the number of open connections in this gauge.
    pub fn count_open(mut self, open: Gauge) -> Self {
        self.open = Some(open);
        self
    }

    fn slot(&self, permit: OwnedSemaphorePermit) -> Slot {
        if let Some(g) = &self.open {
            g.inc();
        }
        Slot {
            _permit: permit,
            open: self.open.clone(),
        }
    }

    /// Counts accept errors in this counter as well.
    pub fn count_errors(mut self, errors: Counter) -> Self {
        self.errors = errors;
        self
    }

    /// What a connection over the cap is told (default: an HTTP `503`).
    pub fn refusal(mut self, bytes: &'static [u8]) -> Self {
        self.over_cap = bytes;
        self
    }

    /// The next admitted connection. Connections over the cap get a `503` and are closed;
    /// accept errors (EMFILE, ENFILE…) sleep with a growing delay instead of spinning.
    pub async fn next(&mut self) -> (TcpStream, Slot) {
        loop {
            match self.inner.accept().await {
                Ok((stream, _)) => {
                    self.backoff = Backoff::default();
                    match self.admit().await {
                        Some(permit) => return (stream, self.slot(permit)),
                        None => self.refuse(stream),
                    }
                }
                Err(e) => {
                    self.errors.inc();
                    if let Some(n) = self.error_log.hit(Instant::now()) {
                        tracing::warn!(listener = self.name, error = %e, repeated = n, "accept failed; backing off");
                    }
                    tokio::time::sleep(self.backoff.next()).await;
                }
            }
        }
    }

    async fn admit(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Some(permit);
        }
        let roster = self.evict.as_ref()?;
        if !roster.evict_idlest() {
            return None;
        }
        let freed = self.slots.clone().acquire_owned();
        tokio::time::timeout(EVICTION_WAIT, freed).await.ok()?.ok()
    }

    fn refuse(&mut self, stream: TcpStream) {
        self.refused.inc();
        // Best effort: a full socket buffer just gets the close.
        let _ = stream.try_write(self.over_cap);
        if let Some(n) = self.refusal_log.hit(Instant::now()) {
            tracing::warn!(
                listener = self.name,
                refused = n,
                "connection cap reached; refusing connections"
            );
        }
    }
}

/// How long a new connection waits for an evicted one's place.
const EVICTION_WAIT: Duration = Duration::from_millis(500);

/// The connections of one listener and since when each is idle (no request running).
/// Joining and leaving take the lock; a request starting or ending is one atomic store.
#[derive(Debug, Clone)]
pub struct IdleRoster(Arc<Mutex<Roster>>, Instant);

impl Default for IdleRoster {
    fn default() -> Self {
        Self(Arc::default(), Instant::now())
    }
}

#[derive(Debug, Default)]
struct Roster {
    next: u64,
    members: HashMap<u64, (Arc<AtomicU64>, Arc<Notify>)>,
}

/// The `since` of a connection with a request running.
const BUSY: u64 = 0;

impl IdleRoster {
    /// A new connection, idle from now.
    pub fn join(&self) -> Member {
        let close = Arc::new(Notify::new());
        let since = Arc::new(AtomicU64::new(self.now()));
        let mut r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        r.next += 1;
        let id = r.next;
        r.members.insert(id, (since.clone(), close.clone()));
        Member {
            roster: self.clone(),
            id,
            since,
            running: AtomicU64::new(0),
            close,
        }
    }

    /// Nanoseconds since the roster began, never `BUSY`.
    fn now(&self) -> u64 {
        u64::try_from(self.1.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Tells the connection idle longest to close; false if none is idle.
    fn evict_idlest(&self) -> bool {
        let mut r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let idlest = r
            .members
            .iter()
            .map(|(id, (since, _))| (since.load(Ordering::Relaxed), *id))
            .filter(|(since, _)| *since != BUSY)
            .min();
        let Some((_, id)) = idlest else {
            return false;
        };
        if let Some((_, close)) = r.members.remove(&id) {
            close.notify_one();
        }
        true
    }
}

/// One connection on an `IdleRoster`; leaves it when dropped. Requests are counted, so
/// an h2 connection with several streams is idle only once the last one ended.
#[derive(Debug)]
pub struct Member {
    roster: IdleRoster,
    id: u64,
    since: Arc<AtomicU64>,
    running: AtomicU64,
    close: Arc<Notify>,
}

impl Member {
    /// A request started: not to be evicted while it runs.
    pub fn busy(&self) {
        self.running.fetch_add(1, Ordering::Relaxed);
        self.since.store(BUSY, Ordering::Relaxed);
    }

    /// A request ended (or the connection waits for its first): idle from now once no
    /// other request runs.
    pub fn idle(&self) {
        let before = self
            .running
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            })
            .unwrap_or(0);
        if before <= 1 {
            self.since.store(self.roster.now(), Ordering::Relaxed);
        }
    }

    /// Resolves when the listener needs this connection's place.
    pub async fn evicted(&self) {
        self.close.notified().await;
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut r = self.roster.0.lock().unwrap_or_else(|p| p.into_inner());
        r.members.remove(&self.id);
    }
}

/// How many connections each agent keeps busy at once (requests running, tunnels and
/// WebSockets open, SSH sessions), bounded by `[proxy] max_busy_per_agent` (default: a
/// quarter of the connection cap). Idle connections make room at the cap; busy ones cannot,
/// so without a bound one agent could keep every connection busy and lock the others out.
pub struct BusyPerAgent {
    limit: usize,
    held: Mutex<HashMap<String, usize>>,
    /// All agents' busy connections now.
    open: Gauge,
}

/// One busy connection of one agent; dropping it frees the place.
pub struct Busy {
    busy: Arc<BusyPerAgent>,
    agent: String,
}

impl BusyPerAgent {
    pub fn new(limit: usize, open: Gauge) -> Arc<Self> {
        Arc::new(Self {
            limit: limit.max(1),
            held: Mutex::default(),
            open,
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A place for one more busy connection of `agent`, or `None` at its limit.
    pub fn hold(self: &Arc<Self>, agent: &str) -> Option<Busy> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(agent.to_owned()).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        self.open.inc();
        Some(Busy {
            busy: self.clone(),
            agent: agent.to_owned(),
        })
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.busy.open.dec();
        let mut held = self.busy.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.agent);
            }
        }
    }
}

/// The refusal of an agent over its limit, unjournaled (a flood of them writes nothing):
/// the code for a capacity postern ran out of (`JOURNAL_UNAVAILABLE`, `backoff`), field
/// `agent`, a message naming the limit.
pub fn over_busy_limit(limit: usize) -> Envelope {
    let mut env = unjournaled_refusal(Code::JournalUnavailable, "agent");
    env.error.message = format!(
        "This agent already keeps {limit} connections busy (requests running, tunnels, WebSockets and SSH sessions open), the most [proxy] max_busy_per_agent allows; let one finish, or retry later."
    );
    env
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_refusal_body_has_the_length_its_head_says() {
        let text = String::from_utf8_lossy(super::REFUSAL);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert!(serde_json::from_str::<serde_json::Value>(body).is_ok());
    }

    use super::*;

    #[test]
    fn a_throttle_writes_one_line_per_interval_with_the_count() {
        let mut t = Throttle::new(Duration::from_secs(5));
        let start = Instant::now();
        assert_eq!(t.hit(start), Some(1));
        for i in 0..1000 {
            assert_eq!(t.hit(start + Duration::from_millis(i)), None);
        }
        assert_eq!(t.hit(start + Duration::from_secs(5)), Some(1001));
    }

    #[test]
    fn a_connection_is_idle_only_once_its_last_request_ended() {
        let roster = IdleRoster::default();
        let m = roster.join();
        m.busy();
        m.busy();
        m.idle();
        assert!(!roster.evict_idlest(), "one stream still runs");
        m.idle();
        m.idle();
        assert!(roster.evict_idlest(), "idle once none runs");
    }

    #[test]
    fn backoff_grows_to_a_ceiling() {
        let mut b = Backoff::default();
        let first = b.next();
        let later: Vec<Duration> = (0..20).map(|_| b.next()).collect();
        assert_eq!(first, BACKOFF_START);
        assert!(later.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(later.last(), Some(&BACKOFF_MAX));
    }

    #[test]
    fn the_derived_cap_leaves_room_for_upstreams_and_the_admin() {
        assert_eq!(proxy_cap(Some(7), Some(1024), 32), 7);
        assert_eq!(proxy_cap(None, Some(512), 32), (512 - 32 - 64) / 2);
        assert_eq!(proxy_cap(None, Some(10), 32), 1);
    }

    #[test]
    fn each_agent_keeps_at_most_the_limit_busy_and_a_dropped_hold_frees_its_place() {
        let busy = BusyPerAgent::new(2, Gauge::default());
        let a1 = busy.hold("a");
        let a2 = busy.hold("a");
        assert!(a1.is_some() && a2.is_some());
        assert!(busy.hold("a").is_none(), "a third for the same agent");
        assert!(busy.hold("b").is_some(), "another agent has its own");
        drop(a1);
        assert!(busy.hold("a").is_some());
    }
}
