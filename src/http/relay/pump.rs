//! Bytes both ways through a tunnel or an upgraded connection, without parsing them: each
//! direction runs on its own (a slow reader on one side never stalls the other), an end of
//! input is passed on as a half-close, and the relay ends when both directions have ended,
//! one breaks, `idle_timeout` passes without a byte either way, or it has run for the route's
//! `max_relay_lifetime` (a relay is no place to park forever). The origin's bytes pass
//! a `Downstream` on their way (a plain tunnel's is `Unread`; a WebSocket's is the
//! reflection guard). What it reports is observation only: counts, who ended it.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::contract::{ClosedBy, TunnelEvidence};

const CHUNK: usize = 16 * 1024;

/// How long a relay may go quiet, and how long it may run at all.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub idle: Duration,
    pub lifetime: Duration,
}

impl Limits {
    pub fn of(route: &crate::config::Route) -> Self {
        Self {
            idle: route.idle_timeout,
            lifetime: route.max_relay_lifetime,
        }
    }
}

/// What a direction's bytes pass through before they are written on.
pub trait Downstream: Send {
    /// What of `chunk` goes out now (a part may be held back for later).
    fn pass<'a>(&mut self, chunk: &'a [u8]) -> Cow<'a, [u8]>;
    /// At the end of input: whatever was held back.
    fn finish(&mut self) -> Vec<u8>;
    /// A held-back tail that may go out once the stream has paused, if any.
    fn release(&mut self) -> Option<Vec<u8>> {
        None
    }
    fn holds_releasable(&self) -> bool {
        false
    }
    /// This direction is over for postern's own reason (what `pass` gave ends it).
    fn stopped(&self) -> bool {
        false
    }
}

/// Bytes passed on as they came.
pub struct Unread;

impl Downstream for Unread {
    fn pass<'a>(&mut self, chunk: &'a [u8]) -> Cow<'a, [u8]> {
        Cow::Borrowed(chunk)
    }

    fn finish(&mut self) -> Vec<u8> {
        Vec::new()
    }
}

/// What the relay saw.
pub struct Relayed {
    pub tunnel: TunnelEvidence,
    /// Every byte read from the origin was written to the agent.
    pub delivered: bool,
    /// Both directions ended with an end of input: no reset, no failed write, no timeout.
    pub clean: bool,
    /// `sha256:` over the origin's bytes as relayed.
    pub digest: String,
}

impl Relayed {
    /// Nothing relayed: the agent was gone before the tunnel could start.
    pub fn agent_gone() -> Self {
        Self {
            tunnel: TunnelEvidence {
                bytes_up: 0,
                bytes_down: 0,
                closed_by: ClosedBy::Agent,
            },
            delivered: true,
            clean: false,
            digest: crate::journal::sha256_tagged(b""),
        }
    }
}

/// One direction's tally; it outlives the pump, so a pump cut off by the idle timeout
/// still leaves its counts.
#[derive(Default)]
struct Tally {
    read: u64,
    written: u64,
    hash: Option<Sha256>,
    /// The filter ended this direction and what it had to say was written.
    stopped: bool,
}

/// How one direction ended, and which side ended it.
struct Ended {
    by: ClosedBy,
    clean: bool,
}

/// The time of the last byte either way, for the idle timeout.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Returns once the relay went quiet for `limits.idle` or ran for `limits.lifetime`.
    async fn quiet_or_over(&self, limits: Limits) {
        tokio::select! {
            () = self.idle_for(limits.idle) => {}
            () = tokio::time::sleep_until(self.start + limits.lifetime) => {}
        }
    }

    /// Returns once `limit` has passed since the last byte.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let quiet_until = self.last() + limit;
            if Instant::now() >= quiet_until {
                return;
            }
            tokio::time::sleep_until(quiet_until).await;
        }
    }
}

/// Copies `from` into `to`, through `filter`, until `from` ends (then `to` is shut down for
/// writing: the half-close travels on) or either side fails.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    sides: (ClosedBy, ClosedBy),
    tally: &mut Tally,
    activity: &Activity,
    filter: &mut dyn Downstream,
) -> Ended
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (from_side, to_side) = sides;
    let failed = |by| Ended { by, clean: false };
    let mut buf = vec![0u8; CHUNK];
    loop {
        let read = tokio::select! {
            r = from.read(&mut buf) => r,
            () = tokio::time::sleep(crate::guard::PAUSE), if filter.holds_releasable() => {
                let tail = filter.release().unwrap_or_default();
                if to.write_all(&tail).await.is_err() {
                    return failed(to_side);
                }
                tally.written += tail.len() as u64;
                continue;
            }
        };
        let n = match read {
            Ok(0) => {
                let tail = filter.finish();
                if to.write_all(&tail).await.is_err() {
                    return failed(to_side);
                }
                tally.written += tail.len() as u64;
                let _ = to.shutdown().await;
                return Ended {
                    by: from_side,
                    clean: true,
                };
            }
            Ok(n) => n,
            Err(_) => return failed(from_side),
        };
        let chunk = buf.get(..n).unwrap_or_default();
        tally.read += n as u64;
        if let Some(h) = tally.hash.as_mut() {
            h.update(chunk);
        }
        activity.touch();
        let out = filter.pass(chunk);
        if to.write_all(&out).await.is_err() {
            return failed(to_side);
        }
        tally.written += out.len() as u64;
        activity.touch();
        if filter.stopped() {
            let _ = to.shutdown().await;
            tally.stopped = true;
            return Ended {
                by: ClosedBy::Postern,
                clean: true,
            };
        }
    }
}

/// Relays between `agent` and `origin` until the tunnel ends, the origin's bytes through
/// `down`; see the module note.
pub async fn relay<A, O>(agent: A, origin: O, limits: Limits, down: &mut dyn Downstream) -> Relayed
where
    A: AsyncRead + AsyncWrite + Unpin,
    O: AsyncRead + AsyncWrite + Unpin,
{
    let (agent_r, agent_w) = tokio::io::split(agent);
    let (origin_r, origin_w) = tokio::io::split(origin);
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let mut up = Tally::default();
    let mut down_tally = Tally {
        hash: Some(Sha256::new()),
        ..Tally::default()
    };
    let mut unread = Unread;
    let (first, clean) = {
        let up_pump = pump(
            agent_r,
            origin_w,
            (ClosedBy::Agent, ClosedBy::Origin),
            &mut up,
            &activity,
            &mut unread,
        );
        let down_pump = pump(
            origin_r,
            agent_w,
            (ClosedBy::Origin, ClosedBy::Agent),
            &mut down_tally,
            &activity,
            down,
        );
        until_both_end(up_pump, down_pump, activity.quiet_or_over(limits)).await
    };
    let digest = down_tally
        .hash
        .take()
        .map(|h| crate::journal::sha256_tagged_digest(&h.finalize()))
        .unwrap_or_default();
    Relayed {
        tunnel: TunnelEvidence {
            bytes_up: up.read,
            bytes_down: down_tally.read,
            closed_by: first,
        },
        delivered: down_tally.stopped || down_tally.written == down_tally.read,
        clean,
        digest,
    }
}

/// How long the other direction may go on after a filter stopped one (the agent answering
/// a close frame), before postern closes both.
const LINGER: Duration = Duration::from_secs(1);

/// Runs both directions until both ended cleanly, one broke, or the tunnel went idle or ran
/// out its lifetime (then postern is the one that closed it). Dropping the pumps closes both connections.
async fn until_both_end(
    up: impl Future<Output = Ended>,
    down: impl Future<Output = Ended>,
    idle: impl Future<Output = ()>,
) -> (ClosedBy, bool) {
    tokio::pin!(up, down, idle);
    let (mut up_done, mut down_done) = (false, false);
    let (mut first, mut linger) = (None, None);
    while !(up_done && down_done) {
        let ended = tokio::select! {
            e = &mut up, if !up_done => { up_done = true; e }
            e = &mut down, if !down_done => { down_done = true; e }
            () = &mut idle => return (ClosedBy::Postern, false),
            () = tokio::time::sleep_until(linger.unwrap_or_else(Instant::now)), if linger.is_some() => {
                return (first.unwrap_or(ClosedBy::Postern), false);
            }
        };
        // Only a filter that stopped ends a pump as postern.
        if ended.by == ClosedBy::Postern {
            linger = Some(Instant::now() + LINGER);
        }
        let by = *first.get_or_insert(ended.by);
        if !ended.clean {
            return (by, false);
        }
    }
    (first.unwrap_or(ClosedBy::Postern), true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    /// An agent and an origin wired through `relay`; the test holds their far ends.
    fn wired(
        idle: Duration,
    ) -> (
        tokio::io::DuplexStream,
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<Relayed>,
    ) {
        wired_for(Limits {
            idle,
            lifetime: Duration::from_secs(3600),
        })
    }

    fn wired_for(
        limits: Limits,
    ) -> (
        tokio::io::DuplexStream,
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<Relayed>,
    ) {
        let (agent, agent_near) = duplex(64);
        let (origin, origin_near) = duplex(64);
        let run =
            tokio::spawn(async move { relay(agent_near, origin_near, limits, &mut Unread).await });
        (agent, origin, run)
    }

    #[tokio::test]
    async fn half_closes_travel_and_both_directions_are_counted() -> std::io::Result<()> {
        let (mut agent, mut origin, run) = wired(Duration::from_secs(30));
        agent.write_all(b"hello").await?;
        agent.shutdown().await?;
        let mut got = Vec::new();
        origin.read_to_end(&mut got).await?;
        assert_eq!(got, b"hello", "the agent's end of input reached the origin");
        // The origin still answers after the agent's half-close (more than the pipes
        // hold, so the agent reads while the origin writes).
        let answer = async {
            origin.write_all(&[7u8; 1000]).await?;
            origin.shutdown().await
        };
        let mut back = Vec::new();
        let (answered, read) = tokio::join!(answer, agent.read_to_end(&mut back));
        answered?;
        assert_eq!(read?, 1000);
        let r = run.await.map_err(std::io::Error::other)?;
        assert_eq!(
            r.tunnel,
            TunnelEvidence {
                bytes_up: 5,
                bytes_down: 1000,
                closed_by: ClosedBy::Agent
            }
        );
        assert!(r.delivered && r.clean);
        assert_eq!(r.digest, crate::journal::sha256_tagged(&[7u8; 1000]));
        Ok(())
    }

    #[tokio::test]
    async fn the_side_that_ends_first_closed_it() -> std::io::Result<()> {
        let (mut agent, mut origin, run) = wired(Duration::from_secs(30));
        origin.write_all(b"bye").await?;
        origin.shutdown().await?;
        let mut back = Vec::new();
        agent.read_to_end(&mut back).await?;
        agent.shutdown().await?;
        let r = run.await.map_err(std::io::Error::other)?;
        assert_eq!(r.tunnel.closed_by, ClosedBy::Origin);
        assert_eq!((r.tunnel.bytes_up, r.tunnel.bytes_down), (0, 3));
        Ok(())
    }

    #[tokio::test]
    async fn an_idle_tunnel_is_closed_by_postern_after_the_idle_timeout() -> std::io::Result<()> {
        // Real time (tokio's test-util is not enabled): margins of 400 ms either way.
        let (idle, pause) = (Duration::from_secs(1), Duration::from_millis(600));
        let (mut agent, mut origin, run) = wired(idle);
        agent.write_all(b"ping").await?;
        let mut four = [0u8; 4];
        origin.read_exact(&mut four).await?;
        tokio::time::sleep(pause).await;
        origin.write_all(b"pong").await?;
        agent.read_exact(&mut four).await?;
        // 1.2 s after the ping, but only 0.6 s after the pong: a byte re-arms the timeout.
        tokio::time::sleep(pause).await;
        assert!(!run.is_finished(), "a byte did not re-arm the idle timeout");
        let r = run.await.map_err(std::io::Error::other)?;
        assert_eq!(r.tunnel.closed_by, ClosedBy::Postern);
        assert_eq!((r.tunnel.bytes_up, r.tunnel.bytes_down), (4, 4));
        assert!(!r.clean);
        let mut rest = Vec::new();
        assert_eq!(agent.read_to_end(&mut rest).await?, 0, "agent side closed");
        Ok(())
    }

    /// Issue 40: a relay that never goes quiet still ends at its lifetime.
    #[tokio::test]
    async fn a_busy_tunnel_is_closed_by_postern_at_its_lifetime() -> std::io::Result<()> {
        let (mut agent, mut origin, run) = wired_for(Limits {
            idle: Duration::from_secs(30),
            lifetime: Duration::from_millis(800),
        });
        let mut one = [0u8; 1];
        for _ in 0..200 {
            if agent.write_all(b"x").await.is_err() || origin.read_exact(&mut one).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let r = tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .map_err(std::io::Error::other)?
            .map_err(std::io::Error::other)?;
        assert_eq!(r.tunnel.closed_by, ClosedBy::Postern);
        assert!(!r.clean);
        assert!(
            (20..=60).contains(&r.tunnel.bytes_up),
            "{}",
            r.tunnel.bytes_up
        );
        Ok(())
    }

    #[tokio::test]
    async fn an_agent_that_stops_reading_is_a_failed_delivery() -> std::io::Result<()> {
        let (agent, mut origin, run) = wired(Duration::from_secs(30));
        drop(agent);
        // The write to the gone agent fails; the origin's bytes were not delivered.
        let _ = origin.write_all(b"late answer").await;
        let r = run.await.map_err(std::io::Error::other)?;
        assert_eq!(r.tunnel.closed_by, ClosedBy::Agent);
        assert_eq!(r.tunnel.bytes_down, 11);
        assert!(!r.clean && !r.delivered);
        Ok(())
    }

    /// Passes `said` once, then says it stopped.
    struct Stops {
        said: &'static [u8],
        done: bool,
    }

    impl Downstream for Stops {
        fn pass<'a>(&mut self, _: &'a [u8]) -> Cow<'a, [u8]> {
            self.done = true;
            Cow::Borrowed(self.said)
        }

        fn finish(&mut self) -> Vec<u8> {
            Vec::new()
        }

        fn stopped(&self) -> bool {
            self.done
        }
    }

    #[tokio::test]
    async fn a_filter_that_stops_ends_the_relay_even_if_the_agent_stays() -> std::io::Result<()> {
        let (mut agent, agent_near) = duplex(64);
        let (mut origin, origin_near) = duplex(64);
        let mut stops = Stops {
            said: b"close",
            done: false,
        };
        let limits = Limits {
            idle: Duration::from_secs(30),
            lifetime: Duration::from_secs(3600),
        };
        let run =
            tokio::spawn(async move { relay(agent_near, origin_near, limits, &mut stops).await });
        origin.write_all(b"forbidden frame").await?;
        let mut got = Vec::new();
        agent.read_to_end(&mut got).await?;
        assert_eq!(
            got, b"close",
            "the filter's last word, then the end of input"
        );
        // The agent neither answers nor closes: postern ends it after `LINGER`.
        let r = tokio::time::timeout(LINGER * 3, run)
            .await
            .map_err(std::io::Error::other)?
            .map_err(std::io::Error::other)?;
        assert_eq!(r.tunnel.closed_by, ClosedBy::Postern);
        assert_eq!(r.tunnel.bytes_down, 15);
        assert!(r.delivered, "all the filter would hand on was handed on");
        Ok(())
    }
}
