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
const EVERY: Duration = Duration::from_secs(5);
/// How often a node checks its chain against its anchors (and at start).
const CHECK_EVERY: u32 = 12;

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
        let mut n = 0u32;
        loop {
            tick.tick().await;
            let Some(cluster) = cluster.upgrade() else {
                return;
            };
            // Checked before anchoring anew: a rewrite while the node was down shows at start.
            if n.is_multiple_of(CHECK_EVERY) {
                let _ = audit(&cluster, &journal).await;
            }
            n = n.wrapping_add(1);
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
        let (node, seq, at) = (
            self.node.clone(),
            i64::try_from(seq).unwrap_or(i64::MAX),
            now_ms(),
        );
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
            Ok(Some((seq, hash))) => self.anchor(seq, hash).await.map_err(|e| e.to_string()),
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

/// Checks this node's chain against its anchors, records the verdict for the fleet to
/// see, and reports every node's latest one.
pub async fn audit(cluster: &Cluster, journal: &Journal) -> Result<serde_json::Value, SharedError> {
    let chain = journal.verify().ok();
    let own = check_anchors(cluster, journal).await.ok();
    let (ok, detail) = match (&chain, &own) {
        (Some(c), _) if !c.ok => (false, Some("the hash chain is broken".to_owned())),
        (_, Some(a)) if !a.mismatches.is_empty() => (
            false,
            a.mismatches.first().map(|m| {
                format!(
                    "history rewritten: event {} does not match the hash anchored for it",
                    m.seq
                )
            }),
        ),
        (Some(_), Some(_)) => (true, None),
        _ => return Err(SharedError::Unavailable),
    };
    let (node, now) = (cluster.node.clone(), now_ms());
    let detail_db = detail.clone();
    cluster
        .call("audit", move |c| {
            Box::pin(async move {
                c.execute(
                    "UPDATE postern_nodes SET checked_ms = $2, check_ok = $3, check_detail = $4 WHERE node = $1",
                    &[&node, &now, &ok, &detail_db],
                )
                .await
                .map(drop)
            })
        })
        .await?;
    let rows = cluster
        .call("audit_nodes", move |c| {
            Box::pin(async move {
                c.query(
                    "SELECT node, seen_ms, checked_ms, check_ok, check_detail FROM postern_nodes ORDER BY node",
                    &[],
                )
                .await
            })
        })
        .await?;
    let nodes: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "node": r.get::<_, String>(0),
                "seen_ms": r.get::<_, i64>(1),
                "checked_ms": r.get::<_, Option<i64>>(2),
                "ok": r.get::<_, Option<bool>>(3),
                "detail": r.get::<_, Option<String>>(4),
            })
        })
        .collect();
    let all_ok = nodes
        .iter()
        .all(|n| n["ok"] != serde_json::Value::Bool(false));
    Ok(serde_json::json!({
        "ok": all_ok,
        "node": cluster.node,
        "anchors": own.map(|a| serde_json::json!({"written": a.anchors, "checked": a.checked, "mismatches": a.mismatches})),
        "nodes": nodes,
    }))
}
