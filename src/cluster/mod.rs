//! A fleet on PostgreSQL (SPEC §7): the shared index (`journal::SharedIndex`) over one
//! PostgreSQL database that every node of the fleet uses. It holds the idempotency-key and
//! twin indexes, the invocation directory and each node's chain anchors, nothing else:
//! every node keeps its own journal, seq and hash chain.
//!
//! Every decision is one statement (`postern_claim`, a conditional `UPDATE`), bounded by a
//! statement timeout and a client-side deadline; a store that does not answer in time is
//! `SharedError::Unavailable`, and the request that needed it is refused before dispatch.
//! Publications to the directory never hold a request: a bounded queue, written behind.

mod anchors;
mod claims;
mod directory;
mod metrics;
mod minted;
mod schema;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::mpsc;
use tokio_postgres::NoTls;

pub use anchors::{AnchorCheck, AnchorMismatch, check_anchors, spawn_anchoring};
pub use metrics::ClusterMetrics;

use crate::journal::SharedError;

/// The longest any statement may run (PostgreSQL's own `statement_timeout`).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(2);
/// The client's own deadline on a call, pool wait and connect included.
const CALL_DEADLINE: Duration = Duration::from_millis(2500);

/// What `[cluster]` says (SPEC §5.4, §7).
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub node: String,
    /// How long a published record and result stay in the directory.
    pub retention: Duration,
    /// How long a chain anchor is kept (the journal's event retention: an anchor older
    /// than the events it vouches for checks nothing).
    pub anchor_retention: Duration,
}

/// This node's handle on the fleet's PostgreSQL.
pub struct Cluster {
    node: String,
    pool: Pool,
    reachable: AtomicBool,
    publications: mpsc::Sender<directory::Publication>,
    retention_ms: i64,
    anchor_retention_ms: i64,
    metrics: ClusterMetrics,
}

impl Cluster {
    /// Connects, applies the migrations this build has (refusing a newer schema), and
    /// starts the directory's publisher and the heartbeat. `url` is secret: never logged.
    pub async fn connect(url: &str, options: ClusterOptions) -> Result<Arc<Self>, String> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|_| "cluster.postgres is not a PostgreSQL connection URL".to_owned())?;
        config.options(format!(
            "-c statement_timeout={}",
            STATEMENT_TIMEOUT.as_millis()
        ));
        config.connect_timeout(CALL_DEADLINE);
        config.application_name(format!("postern-{}", options.node));
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(16)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(CALL_DEADLINE))
            .create_timeout(Some(CALL_DEADLINE))
            .recycle_timeout(Some(CALL_DEADLINE))
            .build()
            .map_err(|e| format!("cannot set up the cluster pool: {e}"))?;
        schema::migrate(&pool).await?;
        let (tx, rx) = mpsc::channel(directory::QUEUE);
        let cluster = Arc::new(Self {
            node: options.node,
            pool,
            reachable: AtomicBool::new(true),
            publications: tx,
            retention_ms: i64::try_from(options.retention.as_millis()).unwrap_or(i64::MAX),
            anchor_retention_ms: i64::try_from(options.anchor_retention.as_millis())
                .unwrap_or(i64::MAX),
            metrics: ClusterMetrics::default(),
        });
        cluster.register_node().await?;
        tokio::spawn(directory::publisher(cluster.clone(), rx));
        tokio::spawn(heartbeat(Arc::downgrade(&cluster)));
        Ok(cluster)
    }

    pub fn node_id(&self) -> &str {
        &self.node
    }

    pub fn metrics(&self) -> &ClusterMetrics {
        &self.metrics
    }

    /// Runs one shared operation under the deadline, counting its latency and failures
    /// and keeping `reachable` current.
    async fn call<T, F>(&self, op: &'static str, f: F) -> Result<T, SharedError>
    where
        F: for<'c> FnOnce(&'c deadpool_postgres::Client) -> Statement<'c, T>,
    {
        let started = Instant::now();
        let done = tokio::time::timeout(CALL_DEADLINE, async {
            let client = self
                .pool
                .get()
                .await
                .map_err(|_| SharedError::Unavailable)?;
            f(&client).await.map_err(|e| {
                tracing::debug!(op, error = %e, "cluster statement failed");
                SharedError::Unavailable
            })
        })
        .await
        .unwrap_or(Err(SharedError::Unavailable));
        self.metrics.observe(op, started.elapsed(), done.is_ok());
        self.set_reachable(done.is_ok());
        done
    }

    fn set_reachable(&self, now: bool) {
        let was = self.reachable.swap(now, Ordering::Relaxed);
        if was != now {
            match now {
                true => tracing::warn!("the cluster store answers again"),
                false => tracing::error!(
                    "the cluster store does not answer: requests that need a shared check are refused"
                ),
            }
        }
    }

    async fn register_node(&self) -> Result<(), String> {
        let now = now_ms();
        let node = self.node.clone();
        self.call("register", move |c| {
            Box::pin(async move {
                c.execute(
                    "INSERT INTO postern_nodes (node, started_ms, seen_ms) VALUES ($1, $2, $2) \
                     ON CONFLICT (node) DO UPDATE SET started_ms = $2, seen_ms = $2",
                    &[&node, &now],
                )
                .await
            })
        })
        .await
        .map(drop)
        .map_err(|_| "the cluster store did not answer at start".to_owned())
    }
}

/// Every 2 s: this node is alive (`postern_nodes.seen_ms`), the store answers, and expired
/// index entries and directory rows go.
async fn heartbeat(cluster: std::sync::Weak<Cluster>) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    let mut n: u64 = 0;
    loop {
        tick.tick().await;
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        let (node, now) = (cluster.node.clone(), now_ms());
        let _ = cluster
            .call("heartbeat", move |c| {
                Box::pin(async move {
                    c.execute(
                        "UPDATE postern_nodes SET seen_ms = $2 WHERE node = $1",
                        &[&node, &now],
                    )
                    .await
                })
            })
            .await;
        n += 1;
        if n.is_multiple_of(30) {
            claims::sweep(&cluster, now).await;
        }
    }
}

/// One statement's answer, borrowing the pooled client.
type Statement<'c, T> = futures_util::future::BoxFuture<'c, Result<T, tokio_postgres::Error>>;

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    crate::journal::unix_ms(time::OffsetDateTime::now_utc())
}
