//! `refresh_token` rotation (SPEC §3.8). An endpoint that rotates answers a new refresh
//! token with each access token and revokes the old one; many revoke the whole family
//! when an old one is presented again. So the new one is stored as a new vault version
//! **before** the access token is handed out (a crash after that restarts with the new
//! one), and each mint reads the vault's newest entry rather than the version the request
//! was bound to (a request bound to the version before a rotation must not present the
//! revoked token).

use std::sync::Arc;

use super::material::Material;
use super::{Ask, MintFailure, Slot};
use crate::config::Grant;
use crate::http::Proxy;

/// The material to mint with when it is not the request's own: for `refresh_token`, the
/// vault's newest entry (with a rotated token the vault could not store in its place),
/// and that version. `None` for every other grant.
pub(super) async fn current(
    proxy: &Proxy,
    ask: &Ask<'_>,
    slot: &Slot,
    newest: Option<String>,
) -> Result<Option<(Material, u64)>, MintFailure> {
    if ask.material.grant() != Grant::RefreshToken {
        return Ok(None);
    }
    let vault = proxy.vault.clone();
    let name = ask.secret.to_owned();
    let secret = tokio::task::spawn_blocking(move || vault.get(&name))
        .await
        .map_err(|_| MintFailure::new("vault", "reading the refresh entry was cut short"))?
        .map_err(|e| MintFailure::new("vault", format!("the refresh entry: {e}")))?;
    let unstored = slot
        .unstored
        .lock()
        .ok()
        .and_then(|u| u.clone())
        .filter(|(v, _)| *v == secret.version.vault_number());
    // In a fleet, the newest refresh token any node rotated to wins over this vault's.
    let unstored = newest
        .map(|token| (secret.version.vault_number(), token))
        .or(unstored);
    let mut material = Material::parse(Grant::RefreshToken, &secret.value)
        .map_err(|why| MintFailure::new("material", why))?;
    if let (
        Some((_, token)),
        Material::Refresh {
            refresh_token,
            entry,
            ..
        },
    ) = (unstored, &mut material)
    {
        entry.insert("refresh_token".into(), token.clone().into());
        *refresh_token = token;
    }
    Ok(Some((material, secret.version.vault_number())))
}

/// Stores `rotated` (when it is a new refresh token) under `secret` as the version after
/// `version`: the version the minted token stands for, and the rotated token (guarded).
/// If the vault cannot take it, the mint fails and the slot remembers the token, so the
/// next mint presents it and stores it again.
pub(super) async fn store(
    proxy: &Proxy,
    secret: &str,
    material: &Material,
    version: u64,
    rotated: Option<String>,
    slot: &Slot,
) -> Result<(u64, Option<Arc<str>>), MintFailure> {
    let Material::Refresh {
        refresh_token,
        entry,
        ..
    } = material
    else {
        return Ok((version, None));
    };
    let Some(rotated) = rotated.filter(|r| r != refresh_token) else {
        return Ok((version, None));
    };
    let mut entry = entry.clone();
    entry.insert("refresh_token".into(), rotated.clone().into());
    let value = serde_json::Value::Object(entry).to_string();
    let (vault, name) = (proxy.vault.clone(), secret.to_owned());
    let stored = tokio::task::spawn_blocking(move || vault.replace(&name, version, &value)).await;
    let remember = |why: String| {
        if let Ok(mut u) = slot.unstored.lock() {
            *u = Some((version, rotated.clone()));
        }
        MintFailure::new("vault", format!("storing the rotated refresh token: {why}"))
    };
    match stored {
        Ok(Ok(new_version)) => {
            if let Ok(mut u) = slot.unstored.lock() {
                *u = None;
            }
            Ok((new_version, Some(Arc::from(rotated))))
        }
        Ok(Err(e)) => Err(remember(e.to_string())),
        Err(_) => Err(remember("the write was cut short".into())),
    }
}
