//! The shared indexes: claims, lookups and touches of idempotency keys and twin slots,
//! each one statement. `postern_claim` (the migration) takes a key and a twin slot, both or
//! neither, with the invocation's directory row, so two nodes never both win one slot.

use std::sync::Arc;

use super::Cluster;
use crate::journal::{
    Directory, KeyClaim, KeyEntry, KeySlot, Leased, Lost, MintShared, Shared, SharedIndex, State,
    StoredResult, TwinClaim, TwinEntry, TwinSlot,
};

impl SharedIndex for Cluster {
    fn node(&self) -> &str {
        &self.node
    }

    fn claim<'a>(
        &'a self,
        invocation_id: &'a str,
        key: Option<&'a KeyClaim>,
        twin: Option<&'a TwinClaim>,
        now_ms: i64,
    ) -> Shared<'a, Result<(), Lost>> {
        Box::pin(self.claim_slots(invocation_id, key, twin, now_ms))
    }

    fn release<'a>(&'a self, invocation_id: &'a str) -> Shared<'a, ()> {
        Box::pin(self.release_claims(invocation_id))
    }

    fn key_entry<'a>(&'a self, slot: &'a KeySlot, now_ms: i64) -> Shared<'a, Option<KeyEntry>> {
        let slot = slot.index_key();
        Box::pin(async move {
            let row = self
                .call("key_lookup", move |c| {
                    Box::pin(async move {
                        c.query_opt(
                            "SELECT invocation_id, fingerprint, expires_at_ms FROM postern_keys \
                             WHERE slot = $1 AND expires_at_ms > $2",
                            &[&slot, &now_ms],
                        )
                        .await
                    })
                })
                .await?;
            Ok(row.map(|r| KeyEntry {
                invocation_id: r.get(0),
                fingerprint: r.get(1),
                expires_at_ms: r.get(2),
            }))
        })
    }

    fn touch_key<'a>(&'a self, claim: &'a KeyClaim) -> Shared<'a, ()> {
        let (slot, id, until) = (
            claim.slot.index_key(),
            claim.entry.invocation_id.clone(),
            claim.entry.expires_at_ms,
        );
        Box::pin(self.touch("key_touch", TOUCH_KEY, slot, id, until))
    }

    fn twin_entry<'a>(&'a self, slot: &'a TwinSlot, now_ms: i64) -> Shared<'a, Option<TwinEntry>> {
        let slot = slot.index_key();
        Box::pin(async move {
            let row = self
                .call("twin_lookup", move |c| {
                    Box::pin(async move {
                        c.query_opt(
                            "SELECT invocation_id, expires_at_ms FROM postern_twins \
                             WHERE slot = $1 AND expires_at_ms > $2",
                            &[&slot, &now_ms],
                        )
                        .await
                    })
                })
                .await?;
            Ok(row.map(|r| TwinEntry {
                invocation_id: r.get(0),
                expires_at_ms: r.get(1),
            }))
        })
    }

    fn touch_twin<'a>(&'a self, claim: &'a TwinClaim) -> Shared<'a, ()> {
        let (slot, id, until) = (
            claim.slot.index_key(),
            claim.entry.invocation_id.clone(),
            claim.entry.expires_at_ms,
        );
        Box::pin(self.touch("twin_touch", TOUCH_TWIN, slot, id, until))
    }

    fn lease<'a>(
        &'a self,
        invocation_id: &'a str,
        generation: u32,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Shared<'a, Leased> {
        let (id, node) = (invocation_id.to_owned(), self.node.clone());
        let g = i32::try_from(generation).unwrap_or(i32::MAX);
        Box::pin(async move {
            let row = self
                .call("lease", move |c| {
                    Box::pin(async move {
                        c.query_one(LEASE, &[&id, &g, &node, &now_ms, &ttl_ms])
                            .await
                    })
                })
                .await?;
            let (known, won): (i64, i64) = (row.get(0), row.get(1));
            Ok(match (known, won) {
                (0, _) => Leased::Unshared,
                (_, 0) => Leased::Lost,
                _ => Leased::Won,
            })
        })
    }

    fn confirm_dispatch<'a>(&'a self, invocation_id: &'a str, generation: u32) -> Shared<'a, bool> {
        let (id, node) = (invocation_id.to_owned(), self.node.clone());
        let g = i32::try_from(generation).unwrap_or(i32::MAX);
        Box::pin(async move {
            let row = self
                .call("confirm_dispatch", move |c| {
                    Box::pin(async move { c.query_one(CONFIRM, &[&id, &g, &node]).await })
                })
                .await?;
            let (known, held): (i64, i64) = (row.get(0), row.get(1));
            Ok(known == 0 || held > 0)
        })
    }

    fn mint_lock<'a>(
        &'a self,
        slot: &'a str,
        hold_ms: i64,
        now_ms: i64,
    ) -> Shared<'a, Option<MintShared>> {
        Box::pin(self.lock_minted(slot, hold_ms, now_ms))
    }

    fn mint_store<'a>(&'a self, slot: &'a str, kept: MintShared, now_ms: i64) -> Shared<'a, ()> {
        Box::pin(self.store_minted(slot, kept, now_ms))
    }

    fn mint_unlock<'a>(&'a self, slot: &'a str) -> Shared<'a, ()> {
        Box::pin(self.unlock_minted(slot))
    }

    fn lookup<'a>(&'a self, invocation_id: &'a str) -> Shared<'a, Option<Directory>> {
        Box::pin(self.find(invocation_id))
    }

    fn published_before<'a>(
        &'a self,
        before: Option<&'a str>,
        limit: usize,
    ) -> Shared<'a, Vec<(String, State)>> {
        Box::pin(self.list_published(before, limit))
    }

    fn result<'a>(&'a self, invocation_id: &'a str) -> Shared<'a, Option<StoredResult>> {
        Box::pin(self.find_result(invocation_id))
    }

    fn publish(&self, state: Arc<State>, result: Option<StoredResult>, version: u64) {
        self.enqueue(state, result, version);
    }

    fn reachable(&self) -> bool {
        self.reachable.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn audit<'a>(&'a self, journal: &'a crate::journal::Journal) -> Shared<'a, serde_json::Value> {
        Box::pin(super::anchors::audit(self, journal))
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.metrics.register(registry);
    }
}

const TOUCH_KEY: &str =
    "UPDATE postern_keys SET expires_at_ms = $3 WHERE slot = $1 AND invocation_id = $2";
const TOUCH_TWIN: &str =
    "UPDATE postern_twins SET expires_at_ms = $3 WHERE slot = $1 AND invocation_id = $2";

/// The next generation for `$3`, or nothing: the row must be at generation `$2`, and held by
/// `$3` already, or published closed at that generation, or not dispatched within the ttl
/// `$5` of its lease. Returns (rows known, rows leased).
const LEASE: &str = "WITH won AS (UPDATE postern_invocations SET generation = generation + 1, \
     node = $3, lease_started_ms = $4, dispatched = false \
     WHERE invocation_id = $1 AND generation = $2 AND (node = $3 \
       OR (pub_generation = $2 AND coalesce((state->'progress'->>'closed')::boolean, false)) \
       OR (NOT dispatched AND lease_started_ms + $5 <= $4)) \
     RETURNING 1) \
     SELECT (SELECT count(*) FROM postern_invocations WHERE invocation_id = $1), \
     (SELECT count(*) FROM won)";

/// Generation `$2` crosses the dispatch boundary on `$3`, if `$3` still holds it. Returns
/// (rows known, rows confirmed).
const CONFIRM: &str = "WITH held AS (UPDATE postern_invocations SET dispatched = true \
     WHERE invocation_id = $1 AND generation = $2 AND node = $3 RETURNING 1) \
     SELECT (SELECT count(*) FROM postern_invocations WHERE invocation_id = $1), \
     (SELECT count(*) FROM held)";

/// One statement: the unpublished row goes, and the claims with it.
const RELEASE: &str = "WITH gone AS (DELETE FROM postern_invocations \
     WHERE invocation_id = $1 AND state IS NULL RETURNING invocation_id), \
     k AS (DELETE FROM postern_keys WHERE invocation_id IN (SELECT invocation_id FROM gone)), \
     t AS (DELETE FROM postern_twins WHERE invocation_id IN (SELECT invocation_id FROM gone)) \
     SELECT count(*) FROM gone";

impl Cluster {
    async fn claim_slots(
        &self,
        invocation_id: &str,
        key: Option<&KeyClaim>,
        twin: Option<&TwinClaim>,
        now_ms: i64,
    ) -> Result<Result<(), Lost>, crate::journal::SharedError> {
        let id = invocation_id.to_owned();
        let node = self.node.clone();
        let k_slot = key.map(|k| k.slot.index_key());
        let k_id = key.map(|k| k.entry.invocation_id.clone());
        let k_fp = key.map(|k| k.entry.fingerprint.clone());
        let k_exp = key.map(|k| k.entry.expires_at_ms);
        let t_slot = twin.map(|t| t.slot.index_key());
        let t_id = twin.map(|t| t.entry.invocation_id.clone());
        let t_exp = twin.map(|t| t.entry.expires_at_ms);
        let t_saw = twin.and_then(|t| t.saw.clone());
        let row = self
            .call("claim", move |c| {
                Box::pin(async move {
                    c.query_one(
                        "SELECT lost, holder FROM postern_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                        &[&id, &node, &now_ms, &k_slot, &k_id, &k_fp, &k_exp, &t_slot, &t_id, &t_exp, &t_saw],
                    )
                    .await
                })
            })
            .await?;
        let lost: Option<String> = row.get(0);
        let holder: String = row.get::<_, Option<String>>(1).unwrap_or_default();
        Ok(match lost.as_deref() {
            None => Ok(()),
            Some("key") => Err(Lost::Key(holder)),
            Some(_) => Err(Lost::Twin(holder)),
        })
    }

    /// Drops the claims and the unpublished directory row of an invocation that is in no
    /// journal (its append failed, or this node stopped between claim and append).
    pub(super) async fn release_claims(
        &self,
        invocation_id: &str,
    ) -> Result<(), crate::journal::SharedError> {
        let id = invocation_id.to_owned();
        self.call("release", move |c| {
            Box::pin(async move { c.execute(RELEASE, &[&id]).await.map(drop) })
        })
        .await
    }

    async fn touch(
        &self,
        op: &'static str,
        sql: &'static str,
        slot: Vec<u8>,
        id: String,
        until: i64,
    ) -> Result<(), crate::journal::SharedError> {
        self.call(op, move |c| {
            Box::pin(async move { c.execute(sql, &[&slot, &id, &until]).await.map(drop) })
        })
        .await
    }
}

/// Removes expired index entries, directory rows and anchors (any node may; it is
/// idempotent).
pub(super) async fn sweep(cluster: &Cluster, now: i64) {
    let anchors_before = now.saturating_sub(cluster.anchor_retention_ms);
    let swept = cluster
        .call("sweep", move |c| {
            Box::pin(async move {
                c.execute(
                    "DELETE FROM postern_keys WHERE expires_at_ms <= $1",
                    &[&now],
                )
                .await?;
                c.execute(
                    "DELETE FROM postern_twins WHERE expires_at_ms <= $1",
                    &[&now],
                )
                .await?;
                c.execute(
                    "DELETE FROM postern_anchors WHERE at_ms <= $1",
                    &[&anchors_before],
                )
                .await?;
                c.execute(
                    "DELETE FROM postern_invocations WHERE expires_at_ms <= $1",
                    &[&now],
                )
                .await
            })
        })
        .await;
    if let Ok(n) = swept
        && n > 0
    {
        tracing::debug!(rows = n, "swept expired directory rows");
    }
}
