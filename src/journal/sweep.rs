//! The sweeps of the result store and the key and twin indexes. A sweep removes every
//! row due when it starts, however many: a cap per sweep would let any rate above it grow
//! the store without end. It goes in batches, each its own write that it waits for, so
//! appends queued meanwhile go between two batches instead of behind the whole sweep.

use tokio::sync::oneshot;

use super::store::StoreError;
use super::writer::{Request, Swept};
use super::{Journal, JournalError, unix_ms};

/// Rows one write of a sweep removes.
pub const SWEEP_BATCH: usize = 1024;

impl Journal {
    /// Removes results (and kept requests) whose retention has passed; how many rows.
    pub async fn expire_results(&self) -> Result<usize, JournalError> {
        let now = unix_ms(self.now());
        let swept = self
            .sweep(
                |after| self.store.expired_results(now, after, SWEEP_BATCH),
                |results, reply| Request::Expire {
                    results,
                    keys: Vec::new(),
                    reply,
                },
            )
            .await?;
        // Body files go once every result in them expired (their rows may lag: a read of
        // one finds nothing, as the expired result it is).
        if let Err(e) = self.store.reclaim_bodies(now) {
            tracing::warn!(error = %e, "result body files were not reclaimed");
        }
        Ok(swept)
    }

    /// Removes idempotency key index entries whose retention has passed.
    pub async fn expire_keys(&self) -> Result<usize, JournalError> {
        let now = unix_ms(self.now());
        self.sweep(
            |after| self.store.expired_keys(now, after, SWEEP_BATCH),
            |keys, reply| Request::Expire {
                results: Vec::new(),
                keys,
                reply,
            },
        )
        .await
    }

    /// Removes twin index entries whose window has passed.
    pub async fn expire_twins(&self) -> Result<usize, JournalError> {
        let now = unix_ms(self.now());
        self.sweep(
            |after| self.store.expired_twins(now, after, SWEEP_BATCH),
            |twins, reply| Request::ExpireTwins { twins, reply },
        )
        .await
    }

    /// Batch after batch of the rows `due` reads from after the previous batch's last
    /// row, until one comes back short. Rows written meanwhile expire after the sweep's
    /// `now`, so it ends.
    async fn sweep<R: Clone>(
        &self,
        due: impl Fn(Option<&R>) -> Result<Vec<R>, StoreError>,
        request: impl Fn(Vec<R>, Swept) -> Request,
    ) -> Result<usize, JournalError> {
        let mut after = None;
        let mut swept = 0;
        loop {
            let rows = due(after.as_ref())?;
            let (n, last) = (rows.len(), rows.last().cloned());
            if n > 0 {
                let (reply, rx) = oneshot::channel();
                self.tx
                    .send(request(rows, reply))
                    .await
                    .map_err(|_| JournalError::Unavailable)?;
                rx.await.map_err(|_| JournalError::Unavailable)??;
                swept += n;
            }
            if n < SWEEP_BATCH {
                return Ok(swept);
            }
            after = last;
        }
    }
}

#[cfg(test)]
#[path = "sweep/tests.rs"]
mod tests;
