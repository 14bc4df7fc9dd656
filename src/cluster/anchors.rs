//! Chain anchors (SPEC §7): each node writes its journal's head (`seq`, `hash`) to the
//! cluster store periodically; `postern audit verify --cluster` checks the node's chain
//! against every anchor it wrote, so a history rewritten after an anchor is caught even
//! when the rewritten chain is consistent in itself.

use std::sync::Weak;
use std::time::Duration;

use serde::Serialize;

use super::{Cluster, now_ms};
use crate::journal::{Journal, SharedError};

/// How often a node anchors its head.
const EVERY: Duration = Duration::from_secs(10);

/// One anchor that the journal no longer matches.
#[derive(Debug, Clone, Serialize)]
pub struct AnchorMismatch {
    pub node: String,
    pub seq: u64,
    pub anchored_hash: String,
    /// None: the event is gone (pruned by retention, or removed).
    pub journal_hash: Option<String>,
}

/// What `audit verify --cluster` found for this node.
#[derive(Debug, Clone, Serialize)]
pub struct AnchorCheck {
    pub node: String,
    pub anchors: usize,
    pub checked: usize,
    pub mismatches: Vec<AnchorMismatch>,
}

/// Writes the journal's head every `EVERY` while the node runs.
pub fn spawn_anchoring(cluster: Weak<Cluster>, journal: Journal) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        let mut last = 0u64;
        loop {
            tick.tick().await;
            let Some(cluster) = cluster.upgrade() else {
                return;
            };
            let Ok(Some((seq, hash))) = journal.head() else {
                continue;
            };
            if seq == last {
                continue;
            }
            if cluster.anchor(seq, hash).await.is_ok() {
                last = seq;
            }
        }
    });
}

impl Cluster {
    async fn anchor(&self, seq: u64, hash: String) -> Result<(), SharedError> {
        let (node, seq, at) = (self.node.clone(), i64::try_from(seq).unwrap_or(i64::MAX), now_ms());
        self.call("anchor", move |c| {
            Box::pin(async move {
                c.execute(
                    "INSERT INTO postern_anchors (node, seq, hash, at_ms) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (node, seq) DO NOTHING",
                    &[&node, &seq, &hash, &at],
                )
                .await
                .map(drop)
            })
        })
        .await
    }

    /// Writes the head now (at a clean stop, and for tests).
    pub async fn anchor_now(&self, journal: &Journal) -> Result<(), String> {
        match journal.head() {
            Ok(Some((seq, hash))) => self
                .anchor(seq, hash)
                .await
                .map_err(|e| e.to_string()),
            Ok(None) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Compares this node's journal with every anchor it wrote.
pub async fn check_anchors(cluster: &Cluster, journal: &Journal) -> Result<AnchorCheck, String> {
    let node = cluster.node.clone();
    let rows = cluster
        .call("anchors", move |c| {
            Box::pin(async move {
                c.query(
                    "SELECT seq, hash FROM postern_anchors WHERE node = $1 ORDER BY seq",
                    &[&node],
                )
                .await
            })
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut check = AnchorCheck {
        node: cluster.node.clone(),
        anchors: rows.len(),
        checked: 0,
        mismatches: Vec::new(),
    };
    let oldest = journal.oldest_seq().map_err(|e| e.to_string())?;
    for row in rows {
        let seq = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
        let anchored_hash: String = row.get(1);
        if oldest.is_some_and(|o| seq < o) {
            continue; // pruned behind a checkpoint: the checkpoint carries the chain on
        }
        check.checked += 1;
        let found = journal.hash_at(seq).map_err(|e| e.to_string())?;
        if found.as_deref() != Some(anchored_hash.as_str()) {
            check.mismatches.push(AnchorMismatch {
                node: check.node.clone(),
                seq,
                anchored_hash,
                journal_hash: found,
            });
        }
    }
    Ok(check)
}
