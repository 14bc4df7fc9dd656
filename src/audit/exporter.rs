//! The export loop: read a page after the cursor, send it until a 2xx, move the cursor.
//! One page is held at a time, so memory stays bounded whatever the backlog.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;

use super::cursor::Cursor;
use super::receiver::{Acked, Receiver, SendError};
use super::{ExportMetrics, otlp};
use crate::config::OtlpEndpoint;
use crate::journal::{ExportPage, Journal, StoreError};

/// Events in one request at most.
pub const BATCH: usize = 512;
/// How often a caught-up exporter looks for new events.
const POLL: Duration = Duration::from_millis(250);
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What the export of one journal to one receiver needs.
pub struct Exporter {
    pub journal: Journal,
    pub endpoint: OtlpEndpoint,
    /// Where the cursor file lives (`POSTERN_HOME/audit`).
    pub dir: PathBuf,
    /// The fleet node id (`[cluster] node`), sent as a resource attribute.
    pub node: Option<String>,
    pub metrics: ExportMetrics,
}

/// What one look at the journal found after the cursor.
enum Read {
    Page(ExportPage),
    /// Nothing after the cursor yet.
    CaughtUp,
    /// The event at the cursor is there but does not decode (`postern audit verify`
    /// names it): waiting would never get past it.
    Unreadable,
}

impl Exporter {
    /// Runs until the process ends.
    pub async fn run(self) {
        let mut receiver = match Receiver::new(self.endpoint.clone()) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(endpoint = %self.endpoint, error = %e, "audit export cannot start: no TLS configuration");
                return;
            }
        };
        let cursor = Cursor::new(&self.dir, self.endpoint.to_string());
        let mut since = self.resume(&cursor).await + 1;
        let mut backoff = Backoff::default();
        loop {
            if let Some(page) = self.next_page(&mut since, &mut backoff).await {
                since = self
                    .export(page, since, &mut receiver, &mut backoff, &cursor)
                    .await;
            }
        }
    }

    /// The page from `since`; none after a wait (caught up, or the read failed) or after
    /// stepping past an event that does not decode.
    async fn next_page(&self, since: &mut u64, backoff: &mut Backoff) -> Option<ExportPage> {
        match self.read(*since).await {
            Ok(Read::Page(page)) => return Some(page),
            Ok(Read::CaughtUp) => tokio::time::sleep(POLL).await,
            Ok(Read::Unreadable) => {
                tracing::error!(
                    seq = *since,
                    "audit export: the journal's event at this seq does not decode (see `postern audit verify`); skipped"
                );
                self.metrics.skipped.inc();
                *since += 1;
            }
            Err(e) => {
                tracing::warn!(error = %e, "audit export cannot read the journal");
                tokio::time::sleep(backoff.failed(None)).await;
            }
        }
        None
    }

    /// Sends one page until it is acknowledged and moves the cursor past it; the seq after.
    async fn export(
        &self,
        page: ExportPage,
        since: u64,
        receiver: &mut Receiver,
        backoff: &mut Backoff,
        cursor: &Cursor,
    ) -> u64 {
        let (Some(first), Some(last)) = (page.events.first(), page.events.last()) else {
            return since;
        };
        let gone = first.seq.saturating_sub(since);
        if gone > 0 {
            tracing::warn!(
                from = since,
                to = first.seq - 1,
                "audit export: events no longer in the journal (retention) before they were exported"
            );
            self.metrics.skipped.inc_by(gone);
        }
        let last = last.seq;
        let body = otlp::encode(&page.events, self.node.as_deref());
        let acked = self.deliver(receiver, body, backoff).await;
        if acked.rejected > 0 {
            tracing::warn!(rejected = acked.rejected, message = %acked.message, "audit export: the receiver acknowledged a batch but says it dropped records");
        }
        // Saved before the gauge moves: a gauge at N means N is on disk (or its save failed
        // and was logged).
        self.save(cursor, last).await;
        self.metrics.events.inc_by(page.events.len() as u64);
        self.metrics
            .acked_seq
            .set(i64::try_from(last).unwrap_or(i64::MAX));
        page.next_since
    }

    /// The same batch until a 2xx: the receiver gets every event once and in order.
    async fn deliver(&self, receiver: &mut Receiver, body: Bytes, backoff: &mut Backoff) -> Acked {
        loop {
            match receiver.send(body.clone()).await {
                Ok(acked) => {
                    backoff.reset();
                    return acked;
                }
                Err(e) => {
                    self.metrics.failures.inc();
                    let wait = backoff.failed(e.retry_after());
                    self.log_failure(&e, wait);
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    fn log_failure(&self, e: &SendError, wait: Duration) {
        tracing::warn!(
            endpoint = %self.endpoint,
            error = %e,
            retry_in_ms = wait.as_millis() as u64,
            "audit export: the receiver did not acknowledge a batch; it is sent again"
        );
    }

    /// Where the last run stopped: the seq acknowledged last, or 0 to start from the
    /// journal's first event.
    async fn resume(&self, cursor: &Cursor) -> u64 {
        let (cursor, journal) = (cursor.clone(), self.journal.clone());
        let loaded = tokio::task::spawn_blocking(move || (cursor.load(), journal.head())).await;
        let (acked, head) = match loaded {
            Ok(found) => found,
            Err(_) => (Ok(0), Ok(None)),
        };
        let acked = acked.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "audit export: the cursor file is unreadable; exporting from the journal's start");
            0
        });
        let head = head.ok().flatten().map_or(0, |(seq, _)| seq);
        if acked > head {
            tracing::warn!(
                acked,
                head,
                "audit export: the cursor is past the journal's newest event (a new journal?); exporting from its start"
            );
            return 0;
        }
        self.metrics
            .acked_seq
            .set(i64::try_from(acked).unwrap_or(i64::MAX));
        acked
    }

    /// One page from `since`, read off the runtime's threads (the store's reads block).
    async fn read(&self, since: u64) -> Result<Read, StoreError> {
        let journal = self.journal.clone();
        tokio::task::spawn_blocking(move || read_page(&journal, since))
            .await
            .unwrap_or_else(|e| Err(StoreError::Io(e.to_string())))
    }

    async fn save(&self, cursor: &Cursor, acked: u64) {
        let cursor = cursor.clone();
        let stored = tokio::task::spawn_blocking(move || cursor.store(acked)).await;
        if let Ok(Err(e)) | Err(e) = stored.map_err(std::io::Error::other) {
            // The export goes on; a restart before the next save resends from the last one.
            tracing::warn!(error = %e, "audit export: cannot save the cursor");
        }
    }
}

/// The head is read before the page: an empty page with events up to that head already
/// stored means the one at `since` does not decode, not that it is yet to come.
fn read_page(journal: &Journal, since: u64) -> Result<Read, StoreError> {
    let head = journal.head()?.map_or(0, |(seq, _)| seq);
    let page = journal.export(since, BATCH)?;
    Ok(match (page.events.is_empty(), head >= since) {
        (false, _) => Read::Page(page),
        (true, true) => Read::Unreadable,
        (true, false) => Read::CaughtUp,
    })
}

/// 200 ms doubling to 30 s; a receiver's `Retry-After` stretches one wait (within the cap).
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: BACKOFF_FIRST,
        }
    }
}

impl Backoff {
    fn failed(&mut self, asked: Option<Duration>) -> Duration {
        let wait = self.next.max(asked.unwrap_or_default()).min(BACKOFF_MAX);
        self.next = (self.next * 2).min(BACKOFF_MAX);
        wait
    }

    fn reset(&mut self) {
        self.next = BACKOFF_FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_its_cap_and_heeds_retry_after() {
        let mut b = Backoff::default();
        let waits: Vec<u128> = (0..10).map(|_| b.failed(None).as_millis()).collect();
        assert_eq!(
            waits,
            [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
        );
        b.reset();
        assert_eq!(
            b.failed(Some(Duration::from_secs(5))),
            Duration::from_secs(5)
        );
        assert_eq!(b.failed(Some(Duration::from_secs(3600))), BACKOFF_MAX);
        assert_eq!(b.failed(None), Duration::from_millis(800));
    }
}
