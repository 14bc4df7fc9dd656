//! The invocation directory: which node owns an invocation, and the state and result it
//! published once settled, so any node answers for any invocation (SPEC §7). A node
//! publishes behind its requests (a bounded queue, batches on one connection); while the
//! store is away the queue holds what it can and counts what it drops.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{Cluster, now_ms};
use crate::journal::{Directory, Journal, SharedError, State, StoredResult};

/// Publications waiting at most; beyond it they are dropped (and counted).
pub(super) const QUEUE: usize = 16_384;
/// Publications written in one batch.
const BATCH: usize = 256;

pub(super) struct Publication {
    state: Arc<State>,
    result: Option<StoredResult>,
    version: u64,
}

const UPSERT: &str = "INSERT INTO postern_invocations \
     (invocation_id, node, claimed_ms, lease_started_ms, version, state, result, expires_at_ms, \
     pub_generation) VALUES ($1, $2, $3, $3, $4, $5, $6, $7, $8) \
     ON CONFLICT (invocation_id) DO UPDATE SET version = EXCLUDED.version, \
     pub_generation = EXCLUDED.pub_generation, state = EXCLUDED.state, \
     result = COALESCE(EXCLUDED.result, postern_invocations.result), \
     expires_at_ms = EXCLUDED.expires_at_ms \
     WHERE (postern_invocations.pub_generation, postern_invocations.version) \
     < (EXCLUDED.pub_generation, EXCLUDED.version) \
     AND EXCLUDED.pub_generation >= postern_invocations.generation";

impl Cluster {
    pub(super) fn enqueue(&self, state: Arc<State>, result: Option<StoredResult>, version: u64) {
        let publication = Publication {
            state,
            result,
            version,
        };
        if self.publications.try_send(publication).is_err() {
            self.metrics.dropped.inc();
        }
    }

    pub(super) async fn find(&self, invocation_id: &str) -> Result<Option<Directory>, SharedError> {
        let id = invocation_id.to_owned();
        let row = self
            .call("lookup", move |c| {
                Box::pin(async move {
                    c.query_opt(
                        "SELECT node, state, generation, dispatched, lease_started_ms \
                         FROM postern_invocations WHERE invocation_id = $1",
                        &[&id],
                    )
                    .await
                })
            })
            .await?;
        Ok(row.map(|r| {
            let state: Option<serde_json::Value> = r.get(1);
            Directory {
                node: r.get(0),
                state: state.and_then(|v| serde_json::from_value(v).ok()),
                lease: crate::journal::SharedLease {
                    generation: u32::try_from(r.get::<_, i32>(2)).unwrap_or(0),
                    dispatched: r.get(3),
                    started_ms: r.get(4),
                },
            }
        }))
    }

    /// Other nodes' published states, newest first, strictly older than `before`.
    pub(super) async fn list_published(
        &self,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, State)>, SharedError> {
        let (node, before) = (self.node.clone(), before.map(str::to_owned));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .call("list", move |c| {
                Box::pin(async move {
                    c.query(
                        "SELECT node, state FROM postern_invocations WHERE node <> $1 \
                         AND state IS NOT NULL AND ($2::text IS NULL OR invocation_id < $2) \
                         ORDER BY invocation_id DESC LIMIT $3",
                        &[&node, &before, &limit],
                    )
                    .await
                })
            })
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let state: serde_json::Value = r.get(1);
                Some((r.get(0), serde_json::from_value(state).ok()?))
            })
            .collect())
    }

    /// The stored result its node published, if any (read apart: it may be large).
    pub(super) async fn find_result(
        &self,
        invocation_id: &str,
    ) -> Result<Option<StoredResult>, SharedError> {
        let id = invocation_id.to_owned();
        let row = self
            .call("result", move |c| {
                Box::pin(async move {
                    c.query_opt(
                        "SELECT result FROM postern_invocations WHERE invocation_id = $1",
                        &[&id],
                    )
                    .await
                })
            })
            .await?;
        Ok(row
            .and_then(|r| r.get::<_, Option<serde_json::Value>>(0))
            .and_then(|v| serde_json::from_value(v).ok()))
    }

    /// At start: claims this node made for invocations its journal never recorded (it
    /// stopped between the claim and the append) are released; the others it published or
    /// will publish as recovery settles them.
    pub async fn release_unjournaled(&self, journal: &Journal) -> Result<usize, String> {
        let node = self.node.clone();
        let rows = self
            .call("unpublished", move |c| {
                Box::pin(async move {
                    c.query(
                        "SELECT invocation_id FROM postern_invocations WHERE node = $1 AND state IS NULL",
                        &[&node],
                    )
                    .await
                })
            })
            .await
            .map_err(|_| "the cluster store did not answer at start".to_owned())?;
        let mut released = 0;
        for row in rows {
            let id: String = row.get(0);
            match journal.state(&id) {
                Ok(None) if self.release_claims(&id).await.is_ok() => released += 1,
                Ok(Some(state)) if state.progress.closed => {
                    // Settled before the publication reached the store: publish it now.
                    let result = journal.result(&id).ok().flatten();
                    self.enqueue(Arc::new(state), result, u64::MAX >> 1);
                }
                _ => {}
            }
        }
        Ok(released)
    }
}

/// Writes publications in batches; a batch the store refused is tried again after a pause
/// (keeping order), so a publication is lost only when the queue overflows.
pub(super) async fn publisher(cluster: Arc<Cluster>, mut rx: mpsc::Receiver<Publication>) {
    let weak = Arc::downgrade(&cluster);
    drop(cluster);
    let mut batch: Vec<Publication> = Vec::with_capacity(BATCH);
    loop {
        if batch.is_empty() && rx.recv_many(&mut batch, BATCH).await == 0 {
            return;
        }
        let Some(cluster) = weak.upgrade() else {
            return;
        };
        match write(&cluster, &batch).await {
            Ok(()) => batch.clear(),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

async fn write(cluster: &Cluster, batch: &[Publication]) -> Result<(), SharedError> {
    let node = cluster.node.clone();
    let now = now_ms();
    let keep = cluster.retention_ms;
    let rows: Vec<_> = batch.iter().map(|p| row(p, now, keep)).collect();
    cluster
        .call("publish", move |c| {
            Box::pin(async move {
                let statement = c.prepare_cached(UPSERT).await?;
                // Pipelined on the one connection: one round trip's wait for the batch.
                let writes = rows.iter().map(|r| {
                    let statement = &statement;
                    let node = &node;
                    async move {
                        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
                            &r.id,
                            node,
                            &now,
                            &r.version,
                            &r.state,
                            &r.result,
                            &r.expires,
                            &r.generation,
                        ];
                        c.execute(statement, &params).await
                    }
                });
                for done in futures_util::future::join_all(writes).await {
                    done?;
                }
                Ok(())
            })
        })
        .await
}

struct Row {
    id: String,
    generation: i32,
    version: i64,
    state: Option<serde_json::Value>,
    result: Option<serde_json::Value>,
    expires: i64,
}

fn row(p: &Publication, now: i64, keep: i64) -> Row {
    let result_expiry = p.result.as_ref().map_or(0, |r| r.expires_at_ms);
    Row {
        id: p.state.record.invocation_id.clone(),
        generation: i32::try_from(p.state.record.generation).unwrap_or(i32::MAX),
        version: i64::try_from(p.version).unwrap_or(i64::MAX),
        state: serde_json::to_value(p.state.as_ref()).ok(),
        result: p.result.as_ref().and_then(|r| serde_json::to_value(r).ok()),
        expires: now.saturating_add(keep).max(result_expiry),
    }
}
