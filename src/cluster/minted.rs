//! Minted tokens across a fleet (SPEC §3.8, §7): one node at a time asks the token endpoint
//! for a slot (a lock that runs out on its own, so a node lost mid-request frees it), and
//! the token and a rotated refresh token are kept sealed, so another node uses the token
//! instead of asking again, and presents the newest refresh token when it must ask.

use super::Cluster;
use crate::journal::{MintShared, SharedError};

const LOCK: &str = "INSERT INTO postern_minted (slot, lock_node, lock_until_ms) VALUES ($1, $2, $3) \
     ON CONFLICT (slot) DO UPDATE SET lock_node = $2, lock_until_ms = $3 \
     WHERE postern_minted.lock_until_ms IS NULL OR postern_minted.lock_until_ms <= $4 \
     OR postern_minted.lock_node = $2 \
     RETURNING token_sealed, token_until_ms, refresh_sealed";

const STORE: &str = "UPDATE postern_minted SET token_sealed = $2, token_until_ms = $3, \
     refresh_sealed = coalesce($4, refresh_sealed), lock_node = NULL, lock_until_ms = NULL, \
     updated_ms = $5 WHERE slot = $1 AND lock_node = $6";

const UNLOCK: &str = "UPDATE postern_minted SET lock_node = NULL, lock_until_ms = NULL WHERE slot = $1 AND lock_node = $2";

impl Cluster {
    pub(super) async fn lock_minted(
        &self,
        slot: &str,
        hold_ms: i64,
        now_ms: i64,
    ) -> Result<Option<MintShared>, SharedError> {
        let (slot, node) = (slot.to_owned(), self.node.clone());
        let until = now_ms.saturating_add(hold_ms);
        let row = self
            .call("mint_lock", move |c| {
                Box::pin(async move { c.query_opt(LOCK, &[&slot, &node, &until, &now_ms]).await })
            })
            .await?;
        Ok(row.map(|r| {
            let token: Option<String> = r.get(0);
            let until: Option<i64> = r.get(1);
            MintShared {
                token: token.zip(until),
                refresh: r.get(2),
            }
        }))
    }

    pub(super) async fn store_minted(
        &self,
        slot: &str,
        kept: MintShared,
        now_ms: i64,
    ) -> Result<(), SharedError> {
        let (slot, node) = (slot.to_owned(), self.node.clone());
        let (token, until) = kept.token.unzip();
        let refresh = kept.refresh;
        self.call("mint_store", move |c| {
            Box::pin(async move {
                c.execute(STORE, &[&slot, &token, &until, &refresh, &now_ms, &node])
                    .await
                    .map(drop)
            })
        })
        .await
    }

    pub(super) async fn unlock_minted(&self, slot: &str) -> Result<(), SharedError> {
        let (slot, node) = (slot.to_owned(), self.node.clone());
        self.call("mint_unlock", move |c| {
            Box::pin(async move { c.execute(UNLOCK, &[&slot, &node]).await.map(drop) })
        })
        .await
    }
}
