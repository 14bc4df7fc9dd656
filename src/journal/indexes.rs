//! The indexes as the journal's callers reach them: reads go to the store, index-only
//! writes (a key's or twin's expiry moved on) to the writer. The index types themselves
//! (`keys`, `twins`) depend on nothing above them.

use tokio::sync::oneshot;

use super::keys::{KeyClaim, KeyEntry, KeySlot};
use super::twins::{TwinClaim, TwinEntry, TwinSlot};
use super::writer::Request;
use super::{Journal, JournalError, StoreError, unix_ms};

impl Journal {
    /// The live index entry of a key (an expired one reads as none).
    pub fn key_entry(&self, slot: &KeySlot) -> Result<Option<KeyEntry>, StoreError> {
        let now = unix_ms(self.now());
        Ok(self
            .store
            .key_entry(&slot.index_key())?
            .filter(|e| e.expires_at_ms > now))
    }

    /// Moves a key's expiry on without an event (a replay is a use, not a transition).
    pub async fn touch_key(&self, claim: KeyClaim) -> Result<(), JournalError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Touch { claim, reply })
            .await
            .map_err(|_| JournalError::Unavailable)?;
        rx.await.map_err(|_| JournalError::Unavailable)?
    }
}

impl Journal {
    /// The live twin of a slot (an expired entry reads as none).
    pub fn twin_entry(&self, slot: &TwinSlot) -> Result<Option<TwinEntry>, StoreError> {
        let now = unix_ms(self.now());
        Ok(self
            .store
            .twin_entry(&slot.index_key())?
            .filter(|e| e.expires_at_ms > now))
    }

    /// Moves a twin's expiry on (a resend answered from it is a use), without an event
    /// and without waiting: losing it on a crash only shortens the window. A slot that
    /// names another invocation by now is left as it is.
    pub async fn touch_twin(&self, claim: TwinClaim) {
        let _ = self.tx.send(Request::TouchTwin { claim }).await;
    }
}
