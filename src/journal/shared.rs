//! What a fleet shares (SPEC §7), as the journal sees it: one narrow interface. A node
//! alone has none and its own indexes decide (`keys`, `twins`, the writer's checks); with
//! `[cluster]`, an implementation over PostgreSQL (`crate::cluster`) is the authority for
//! the idempotency-key and twin indexes and keeps the invocation directory, and the
//! journal asks it before its own writer. The lifecycle never knows which is in use.
//!
//! Every claim is one atomic decision in the shared store, made before the append that
//! records it (and so before any `DISPATCH_STARTED`): a node whose claim lost never
//! dispatches. A shared store that cannot answer is `SharedError::Unavailable`, and a
//! request that needed it is refused before dispatch.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::keys::{KeyClaim, KeyEntry, KeySlot};
use super::projection::State;
use super::result::StoredResult;
use super::twins::{TwinClaim, TwinEntry, TwinSlot};

/// A shared store's answer, later.
pub type Shared<'a, T> = Pin<Box<dyn Future<Output = Result<T, SharedError>> + Send + 'a>>;

/// The shared store could not answer (down, slow past its statement timeout, refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SharedError {
    #[error("the cluster store is unavailable")]
    Unavailable,
}

/// Why a claim lost: the invocation that holds the slot now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    Key(String),
    Twin(String),
}

/// An invocation as the directory knows it: the node that holds it, what it published of
/// it, and the shared lease (its stored result is read apart: `SharedIndex::result`).
#[derive(Debug, Clone, PartialEq)]
pub struct Directory {
    pub node: String,
    /// None while the owner has claimed it but not published a settled state: it is in
    /// progress there (it may have dispatched).
    pub state: Option<State>,
    /// The lease as the shared store holds it (the authority on generations).
    pub lease: SharedLease,
}

/// An invocation's current generation in the fleet: which one, since when, and whether its
/// worker crossed the dispatch boundary (then nobody may supersede it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SharedLease {
    pub generation: u32,
    pub dispatched: bool,
    pub started_ms: i64,
}

/// What a lease attempt in the shared store came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leased {
    /// This node holds the next generation now.
    Won,
    /// Another generation or node holds it: nothing may be sent.
    Lost,
    /// The store does not know the invocation (it was never claimed there): this node's
    /// own journal decides alone.
    Unshared,
}

/// What a fleet keeps for a minted-token slot, sealed under the fleet's key (never clear).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MintShared {
    /// The access token and the unix ms it stops being handed out.
    pub token: Option<(String, i64)>,
    /// The newest refresh token, when the grant rotates it.
    pub refresh: Option<String>,
}

/// What several nodes share (SPEC §7). Implemented over PostgreSQL by `crate::cluster`.
pub trait SharedIndex: Send + Sync {
    /// This node's id.
    fn node(&self) -> &str;

    /// Claims a key and a twin slot for `invocation_id` together, or neither.
    fn claim<'a>(
        &'a self,
        invocation_id: &'a str,
        key: Option<&'a KeyClaim>,
        twin: Option<&'a TwinClaim>,
        now_ms: i64,
    ) -> Shared<'a, Result<(), Lost>>;

    /// Undoes the claims of an invocation whose append failed after its claim won.
    fn release<'a>(&'a self, invocation_id: &'a str) -> Shared<'a, ()>;

    /// The live entry of a key (an expired one reads as none).
    fn key_entry<'a>(&'a self, slot: &'a KeySlot, now_ms: i64) -> Shared<'a, Option<KeyEntry>>;

    /// Moves a key's expiry on, if the key still names the claim's invocation.
    fn touch_key<'a>(&'a self, claim: &'a KeyClaim) -> Shared<'a, ()>;

    /// The live twin of a slot.
    fn twin_entry<'a>(&'a self, slot: &'a TwinSlot, now_ms: i64) -> Shared<'a, Option<TwinEntry>>;

    /// Moves a twin's expiry on, if the slot still names the claim's invocation.
    fn touch_twin<'a>(&'a self, claim: &'a TwinClaim) -> Shared<'a, ()>;

    /// Leases generation `generation + 1` of an invocation for this node: won only while
    /// the store's current generation is `generation` and this node holds it, or its owner
    /// published it closed, or its worker did not dispatch within `ttl_ms`.
    fn lease<'a>(
        &'a self,
        invocation_id: &'a str,
        generation: u32,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Shared<'a, Leased>;

    /// Marks generation `generation` dispatched, if this node still holds it; false: it was
    /// superseded, and nothing may be sent. True for an invocation the store does not know.
    fn confirm_dispatch<'a>(&'a self, invocation_id: &'a str, generation: u32) -> Shared<'a, bool>;

    /// Takes the fleet's lock on a minted-token slot for `hold_ms`, with what the fleet
    /// keeps for it; None while another node holds it.
    fn mint_lock<'a>(
        &'a self,
        slot: &'a str,
        hold_ms: i64,
        now_ms: i64,
    ) -> Shared<'a, Option<MintShared>>;

    /// Keeps a minted token (and a rotated refresh token), sealed, and lets the lock go.
    fn mint_store<'a>(&'a self, slot: &'a str, kept: MintShared, now_ms: i64) -> Shared<'a, ()>;

    /// Lets the lock go without a new token.
    fn mint_unlock<'a>(&'a self, slot: &'a str) -> Shared<'a, ()>;

    /// Where an invocation lives, and what its owner published of it.
    fn lookup<'a>(&'a self, invocation_id: &'a str) -> Shared<'a, Option<Directory>>;

    /// Other nodes' published states, newest first, strictly older than `before` (for a
    /// listing): each with its node.
    fn published_before<'a>(
        &'a self,
        before: Option<&'a str>,
        limit: usize,
    ) -> Shared<'a, Vec<(String, State)>>;

    /// The stored result another node published for an invocation.
    fn result<'a>(&'a self, invocation_id: &'a str) -> Shared<'a, Option<StoredResult>>;

    /// Publishes a state (and its result) to the directory. Never waits: a bounded queue,
    /// written behind the request; `version` orders publications of one invocation.
    fn publish(&self, state: Arc<State>, result: Option<StoredResult>, version: u64);

    /// Whether the shared store answered its last call.
    fn reachable(&self) -> bool;

    /// Checks this node's chain against the anchors it wrote, records the verdict, and
    /// reports every node's latest verdict (`postern audit verify --cluster`).
    fn audit<'a>(&'a self, journal: &'a super::Journal) -> Shared<'a, serde_json::Value>;

    /// Its metrics (latency and failures per shared operation), on `/metrics`.
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry);
}
