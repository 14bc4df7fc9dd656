//! A `refresh_token` grant in a fleet (SPEC §3.8, §7). Each node minting alone would
//! present a refresh token another node already rotated away, and the endpoint would revoke
//! the whole family. So one node at a time asks (the fleet's lock on the slot), and the
//! token it got and the refresh token it rotated to are kept in the fleet's store, sealed
//! under the fleet's key: another node uses that token while it is fresh, and presents the
//! newest refresh token when it must ask. Other grants mint per node: asking twice revokes
//! nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Ask, MintFailure, Minter, Slot, Token};
use crate::config::{Config, Grant};
use crate::http::Proxy;
use crate::journal::{MintShared, SharedIndex, sha256_tagged, unix_ms};

/// How long a node may hold the lock (a token request is bounded well below it).
const HOLD: Duration = Duration::from_secs(30);
/// How long a request waits for another node's token request.
const WAIT: Duration = Duration::from_secs(10);

/// The fleet's store, when this grant needs it.
pub(super) fn shared_for<'a>(proxy: &'a Proxy, ask: &Ask<'_>) -> Option<&'a Arc<dyn SharedIndex>> {
    let rotating = ask.material.grant() == Grant::RefreshToken;
    proxy.journal.shared().filter(|_| rotating)
}

/// The slot's token: another node's while fresh, else minted here under the lock.
pub(super) async fn token(
    minter: &Minter,
    proxy: &Proxy,
    config: &Config,
    ask: &Ask<'_>,
    slot: &Slot,
    shared: &Arc<dyn SharedIndex>,
) -> Result<Token, MintFailure> {
    let key = sha256_tagged(ask.key().as_bytes());
    let held = lock(proxy, shared, &key).await?;
    let vault = &proxy.vault;
    let newest = held
        .refresh
        .as_ref()
        .and_then(|r| vault.open_from_fleet(&refresh_context(&key), r).ok());
    let now = now_ms(proxy);
    if let Some((sealed, until)) = &held.token
        && *until > now
        && let Ok(value) = vault.open_from_fleet(&key, sealed)
    {
        let _ = shared.mint_unlock(&key).await;
        let token = Token {
            value: Arc::from(value),
            serial: minter.next_serial(),
            refresh: newest.map(Arc::from),
        };
        let left = Duration::from_millis(u64::try_from(until - now).unwrap_or(0));
        slot.keep(token.clone(), left, ask.version);
        return Ok(token);
    }
    let minted = minter.mint(proxy, config, ask, slot, newest).await;
    let Ok((token, handed_out)) = minted else {
        let _ = shared.mint_unlock(&key).await;
        return minted.map(|(t, _)| t);
    };
    let until = now_ms(proxy) + i64::try_from(handed_out.as_millis()).unwrap_or(0);
    let kept = MintShared {
        token: vault
            .seal_for_fleet(&key, &token.value)
            .ok()
            .map(|sealed| (sealed, until)),
        refresh: token
            .refresh
            .as_ref()
            .and_then(|r| vault.seal_for_fleet(&refresh_context(&key), r).ok()),
    };
    // Not kept there (the store is away): the next node asks with the vault's newest.
    let _ = shared.mint_store(&key, kept, now_ms(proxy)).await;
    Ok(token)
}

/// The fleet's lock on the slot, waiting while another node's token request runs.
async fn lock(
    proxy: &Proxy,
    shared: &Arc<dyn SharedIndex>,
    key: &str,
) -> Result<MintShared, MintFailure> {
    let hold = i64::try_from(HOLD.as_millis()).unwrap_or(i64::MAX);
    let waited = Instant::now();
    loop {
        match shared.mint_lock(key, hold, now_ms(proxy)).await {
            Ok(Some(held)) => return Ok(held),
            Ok(None) if waited.elapsed() < WAIT => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(None) => {
                return Err(MintFailure::new(
                    "fleet",
                    "another node's token request for this credential did not finish",
                ));
            }
            Err(_) => {
                return Err(MintFailure::new(
                    "fleet",
                    "the cluster store did not answer: a rotating refresh token is not used on a guess",
                ));
            }
        }
    }
}

fn refresh_context(key: &str) -> String {
    format!("{key}#refresh")
}

fn now_ms(proxy: &Proxy) -> i64 {
    unix_ms(proxy.journal.now())
}
