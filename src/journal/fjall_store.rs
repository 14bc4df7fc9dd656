//! The fjall implementation of `EventStore`. fjall types stay in this file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use fjall::config::CompressionPolicy;
use fjall::{
    CompressionType, Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions, PersistMode,
};

use super::bodies::BodyFiles;
use super::encoding::{
    Hashes, ResultRow, body_for_file, decode_request, decode_result_row, decode_stored,
    decode_stored_hashing, encode_group, encode_request, encode_result, encode_result_in_file,
    encode_sealed, fill_bodies, pack, unpack,
};
use super::event::{Checkpoint, Event, Sealed};
use super::keys::KeyEntry;
use super::prefill::Prefill;
use super::projection::{State, replay};
use super::request::StoredRequest;
use super::result::StoredResult;
use super::store::{Cut, EventStore, IndexEntries, RawEvent, Run, StoreError, StoredRow, WriteSet};
use super::suspensions::Suspension;
use super::twins::TwinEntry;
use crate::contract::is_resolved;

/// Journal storage in one fjall database.
pub struct FjallStore {
    db: Database,
    events: Keyspace,
    by_invocation: Keyspace,
    states: Keyspace,
    open: Keyspace,
    results: Keyspace,
    requests: Keyspace,
    result_expiry: Keyspace,
    /// Idempotency key index: scope, agent, key → `KeyEntry`.
    keys: Keyspace,
    key_expiry: Keyspace,
    /// Twin index (SPEC §3.7): agent, route, fingerprint → `TwinEntry`.
    twins: Keyspace,
    twin_expiry: Keyspace,
    /// Retention checkpoints by seq: the kept chain starts after the newest.
    checkpoints: Keyspace,
    /// Events a retention cut kept aside (records not settled): id, seq → event.
    islands: Keyspace,
    /// Suspended agents (SPEC §5.8 kill switch): agent id → `Suspension`.
    suspended: Keyspace,
    /// Large result bodies, outside fjall (see `bodies`).
    bodies: BodyFiles,
    /// Body segments a committed row names: id (u64 BE) → latest expiry (i64 LE).
    body_segments: Keyspace,
    /// Entries in `keys` and `twins`: counted at open, moved by every write.
    key_count: AtomicI64,
    twin_count: AtomicI64,
    /// The runs of open invocations, held here until they settle (see `Unindexed`).
    unindexed: Mutex<Unindexed>,
    /// How many seqs an invocation's runs stay unindexed before they are written anyway.
    fold_window: u64,
    /// Held by every write outside the writer's, so zeros ahead never meet an entry.
    prefill: Mutex<Prefill>,
}

/// An open invocation's runs are not written to `by_invocation` one row per write: a small
/// request would write four rows. They are held here and written as one row when it
/// settles. Its `open` row holds the seq its unindexed runs start at or after, so opening
/// the store after a crash finds them again by reading the events from there; one that
/// stays open for `fold_window` seqs has its runs written then, which bounds that read.
#[derive(Default)]
struct Unindexed {
    runs: HashMap<String, Vec<(u64, u32)>>,
    /// The head seq at which the long-open ones are looked for next.
    next_check: u64,
}

/// Seqs an open invocation's runs may stay unindexed (about 7,000 small requests).
const FOLD_WINDOW: u64 = 1 << 16;

/// Events read per page when the store opens and looks for unindexed runs.
const RESCAN_PAGE: usize = 4096;

impl From<fjall::Error> for StoreError {
    fn from(e: fjall::Error) -> Self {
        match e {
            fjall::Error::Locked => StoreError::Locked,
            fjall::Error::Poisoned => StoreError::Poisoned,
            other => StoreError::Io(format!("{other:?}")),
        }
    }
}

fn corrupt(what: &'static str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        what,
        detail: e.to_string(),
    }
}

fn to_json<T: serde::Serialize>(what: &'static str, v: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(v).map_err(|e| corrupt(what, e))
}

/// A record as stored: its JSON, packed.
fn to_record<T: serde::Serialize>(what: &'static str, v: &T) -> Result<Vec<u8>, StoreError> {
    to_json(what, v).map(pack)
}

/// A stored record, packed or plain JSON.
fn from_record<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    let json = unpack(bytes).map_err(|e| corrupt(what, e))?;
    serde_json::from_slice(&json).map_err(|e| corrupt(what, e))
}

fn seq_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// An index row's value: its runs after the first (which starts at the key's seq).
/// Empty: one event; four bytes: how many; then (first seq, count) for each further run.
fn encode_runs(runs: &[(u64, u32)]) -> Vec<u8> {
    match runs {
        [] | [(_, 1)] => Vec::new(),
        [(_, count), rest @ ..] => {
            let mut out = Vec::with_capacity(4 + rest.len() * 12);
            out.extend_from_slice(&count.to_le_bytes());
            for (first, count) in rest {
                out.extend_from_slice(&first.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
            out
        }
    }
}

fn decode_runs(row: u64, value: &[u8]) -> Result<Vec<Run>, StoreError> {
    let bad = || corrupt("index row", format!("{} bytes", value.len()));
    let run = |first, count| Run { row, first, count };
    let Some((count, rest)) = value.split_first_chunk::<4>() else {
        return match value.is_empty() {
            true => Ok(vec![run(row, 1)]),
            false => Err(bad()),
        };
    };
    if rest.len() % 12 != 0 {
        return Err(bad());
    }
    let mut out = vec![run(row, u32::from_le_bytes(*count))];
    for chunk in rest.chunks_exact(12) {
        let (first, count) = chunk.split_at(8);
        let first = u64::from_le_bytes(first.try_into().map_err(|_| bad())?);
        let count = u32::from_le_bytes(count.try_into().map_err(|_| bad())?);
        out.push(run(first, count));
    }
    Ok(out)
}

/// Adds one seq to an invocation's runs: the last grows, or a new one starts.
fn extend_runs(runs: &mut Vec<(u64, u32)>, first: u64, count: u32) {
    match runs.last_mut() {
        Some((f, c)) if f.saturating_add(u64::from(*c)) == first => *c = c.saturating_add(count),
        _ => runs.push((first, count)),
    }
}

fn invocation_key(id: &str, seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(id.len() + 9);
    key.extend_from_slice(id.as_bytes());
    key.push(0);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// The states row of a settled, resolved record whose events are all kept (an empty row:
/// settled, replay to see how). No packed record is one byte long.
const RESOLVED_MARK: &[u8] = &[1];

fn is_mark(row: &[u8]) -> bool {
    row.is_empty() || row == RESOLVED_MARK
}

/// The key prefix of one invocation's rows in a keyspace keyed by `invocation_key`.
fn id_prefix(id: &str) -> Vec<u8> {
    let mut prefix = id.as_bytes().to_vec();
    prefix.push(0);
    prefix
}

fn expiry_key(at_ms: i64, id: &str) -> Vec<u8> {
    expiry_key_bytes(at_ms, id.as_bytes())
}

fn expiry_key_bytes(at_ms: i64, id: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(id.len() + 8);
    key.extend_from_slice(&(at_ms.max(0) as u64).to_be_bytes());
    key.extend_from_slice(id);
    key
}

/// Splits an expiry row key into its time and the rest.
fn split_expiry(k: &[u8]) -> Result<(i64, &[u8]), StoreError> {
    let (at, rest) = k.split_at(8.min(k.len()));
    let at: [u8; 8] = at.try_into().map_err(|e| corrupt("expiry key", e))?;
    Ok((u64::from_be_bytes(at) as i64, rest))
}

/// The events of a write, cut where the invocation changes or seq skips.
fn invocation_runs(events: &[Sealed]) -> impl Iterator<Item = &[Sealed]> {
    events.chunk_by(|a, b| {
        a.event.invocation_id == b.event.invocation_id && a.event.seq + 1 == b.event.seq
    })
}

/// The body segments committed rows name, with their latest expiry.
fn known_segments(rows: &Keyspace) -> Result<BTreeMap<u64, i64>, StoreError> {
    let mut known = BTreeMap::new();
    for guard in rows.iter() {
        let (k, v) = guard.into_inner()?;
        let id: [u8; 8] = k[..]
            .try_into()
            .map_err(|e| corrupt("body segment key", e))?;
        let at: [u8; 8] = v[..]
            .try_into()
            .map_err(|e| corrupt("body segment row", e))?;
        known.insert(u64::from_be_bytes(id), i64::from_le_bytes(at));
    }
    Ok(known)
}

fn key_seq(k: &[u8]) -> Result<u64, StoreError> {
    let key: [u8; 8] = k.try_into().map_err(|e| corrupt("event key", e))?;
    Ok(u64::from_be_bytes(key))
}

impl FjallStore {
    /// Opens (or creates) the journal under `dir`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        // A proxy's journal is written far more than it is read: keep the block cache small.
        // One background worker: with two, fjall 3.1 makes worker 0 hand every compaction
        // request back to the queue, and it spins on it while worker 1 compacts (measured:
        // ~7% of postern's CPU at c=32; one worker gave 19-29% more requests/s).
        let db = Database::builder(dir)
            .manual_journal_persist(true)
            .cache_size(8 << 20)
            .worker_threads(1)
            // A keyspace written rarely (keys, twins, checkpoints) holds its journal file
            // until this bound forces a flush: fjall's default (512 MiB) would be most of
            // a small journal's size on disk.
            .max_journaling_size(64 << 20)
            .open()?;
        // Small memtables: fjall's default (64 MiB per keyspace) would hold hundreds of MB
        // of already-durable journal in memory after a busy hour.
        // LZ4 on every level: fjall leaves its first two levels uncompressed, and those are
        // the levels a journal's flushes and first merges write over and over.
        let options = || {
            KeyspaceCreateOptions::default()
                .max_memtable_size(2 << 20)
                .data_block_compression_policy(CompressionPolicy::all(CompressionType::Lz4))
        };
        let ks = |name: &str| db.keyspace(name, options);
        // Keyspaces keyed by invocation id settle out of key order, so their merges rewrite
        // whole tables: 4 MiB tables instead of 64 MiB cut disk writes per request by
        // 8-15% (measured at c=32). Events are keyed by seq and compact by moves.
        let small = || {
            options().compaction_strategy(std::sync::Arc::new(
                fjall::compaction::Leveled::default().with_table_target_size(4 << 20),
            ))
        };
        let ks_small = |name: &str| db.keyspace(name, small);
        let body_segments = ks_small("body_segments")?;
        let bodies = BodyFiles::open(&dir.join("bodies"), known_segments(&body_segments)?)?;
        let store = Self {
            events: ks("events")?,
            by_invocation: ks_small("by_invocation")?,
            states: ks_small("states")?,
            open: ks_small("open")?,
            // Result bodies live in blob files: merges move their keys, not the bodies.
            results: db.keyspace("results", || {
                // Packed already: blob files need no second compression.
                let blobs = KvSeparationOptions::default().compression(CompressionType::None);
                small().with_kv_separation(Some(blobs))
            })?,
            requests: ks_small("requests")?,
            result_expiry: ks_small("result_expiry")?,
            keys: ks_small("idempotency_keys")?,
            key_expiry: ks_small("idempotency_key_expiry")?,
            twins: ks_small("resend_twins")?,
            twin_expiry: ks_small("resend_twin_expiry")?,
            checkpoints: ks_small("checkpoints")?,
            islands: ks_small("islands")?,
            suspended: ks_small("suspended_agents")?,
            bodies,
            body_segments,
            key_count: AtomicI64::new(0),
            twin_count: AtomicI64::new(0),
            unindexed: Mutex::new(Unindexed::default()),
            fold_window: FOLD_WINDOW,
            prefill: Mutex::new(Prefill::new(dir)),
            db,
        };
        store.find_unindexed()?;
        // One scan at open; the index is bounded by its sweep, so this stays short.
        store
            .key_count
            .store(count(&store.keys)?, Ordering::Relaxed);
        store
            .twin_count
            .store(count(&store.twins)?, Ordering::Relaxed);
        Ok(store)
    }
}

#[cfg(test)]
impl FjallStore {
    /// A store whose open invocations' runs are indexed after `window` seqs.
    pub fn open_folding_within(dir: &Path, window: u64) -> Result<Self, StoreError> {
        let mut store = Self::open(dir)?;
        store.fold_window = window;
        Ok(store)
    }

    /// How many index rows list an invocation's runs.
    pub fn index_rows(&self, invocation_id: &str) -> usize {
        self.by_invocation.prefix(id_prefix(invocation_id)).count()
    }
}

fn count(keyspace: &Keyspace) -> Result<i64, StoreError> {
    Ok(i64::try_from(keyspace.len()?).unwrap_or(i64::MAX))
}

impl EventStore for FjallStore {
    fn write(&self, set: WriteSet) -> Result<(), StoreError> {
        let mut batch = self.db.batch();
        // One value for the write; an event the group frame cannot hold is stored alone.
        match (set.events.first(), encode_group(&set.events)) {
            (Some(first), Some(bytes)) => {
                batch.insert(&self.events, seq_key(first.event.seq), bytes)
            }
            _ => {
                for sealed in &set.events {
                    batch.insert(
                        &self.events,
                        seq_key(sealed.event.seq),
                        encode_sealed(sealed),
                    );
                }
            }
        }
        let settled = self.index_runs(&mut batch, &set)?;
        for state in &set.states {
            let id = state.record.invocation_id.as_bytes();
            // A settled record whose events are all kept is their projection: its row only
            // marks it settled (and lists it), and reading it replays them. A resolved one's
            // mark says so, so retention need not replay it to know.
            let row = match state.progress.closed && !state.progress.events_pruned {
                true if is_resolved(state.record.outcome) => RESOLVED_MARK.to_vec(),
                true => Vec::new(),
                false => to_record("state", state.as_ref())?,
            };
            batch.insert(&self.states, id, row);
        }
        // Only where bodies are synced before their rows: buffered, a row that outlived a
        // power loss would name a body that did not.
        let (mut segments, mut in_files) = (BTreeMap::new(), false);
        for result in &set.results {
            let id = result.invocation_id.as_bytes();
            let record = match body_for_file(result).filter(|_| set.sync_bodies) {
                Some((bare, bodies)) => {
                    let (at, moved) = self.bodies.append(&bodies.concat(), result.expires_at_ms)?;
                    segments.extend(moved);
                    in_files = true;
                    encode_result_in_file(&bare, at, &bodies)
                }
                None => encode_result(result),
            }
            .map_err(|e| corrupt("result", e))?;
            batch.insert(&self.results, id, record);
            batch.insert(
                &self.result_expiry,
                expiry_key(result.expires_at_ms, &result.invocation_id),
                [],
            );
        }
        for (segment, latest) in &segments {
            batch.insert(
                &self.body_segments,
                segment.to_be_bytes(),
                latest.to_le_bytes(),
            );
        }
        for request in &set.requests {
            let id = request.invocation_id.as_bytes();
            let record = encode_request(request).map_err(|e| corrupt("request", e))?;
            batch.insert(&self.requests, id, record);
            batch.insert(
                &self.result_expiry,
                expiry_key(request.expires_at_ms, &request.invocation_id),
                [],
            );
        }
        for (at_ms, id) in &set.expired_results {
            batch.remove(&self.results, id.as_bytes());
            batch.remove(&self.requests, id.as_bytes());
            batch.remove(&self.result_expiry, expiry_key(*at_ms, id));
        }
        let keys = self.write_keys(&mut batch, &set)?;
        let twins = self.write_twins(&mut batch, &set)?;
        let mut cut_runs: &[(String, u64)] = &[];
        if let Some(cut) = &set.cut {
            self.write_cut(&mut batch, cut)?;
            cut_runs = &cut.runs;
        }
        for s in &set.suspensions {
            match &s.row {
                Some(row) => batch.insert(
                    &self.suspended,
                    s.agent.as_bytes(),
                    to_json("suspension", row)?,
                ),
                None => batch.remove(&self.suspended, s.agent.as_bytes()),
            }
        }
        // Durable before a durable row can name them: fjall's journal reaches the OS on
        // commit, and the OS may write it back before the next sync.
        if in_files {
            self.bodies.sync()?;
        }
        batch.commit()?;
        // Only now: a reader between the commit and this sees a run twice, never not at all.
        self.forget_indexed(&settled, cut_runs);
        self.key_count.fetch_add(keys, Ordering::Relaxed);
        self.twin_count.fetch_add(twins, Ordering::Relaxed);
        self.db.persist(PersistMode::Buffer)?;
        Ok(())
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.bodies.sync()?;
        Ok(self.db.persist(PersistMode::SyncData)?)
    }

    fn head(&self) -> Result<Option<Event>, StoreError> {
        match self.events.last_key_value() {
            None => Ok(None),
            Some(guard) => {
                let (k, v) = guard.into_inner()?;
                let events = decode_stored(key_seq(&k)?, &v).map_err(|e| corrupt("event", e))?;
                Ok(events.into_iter().last())
            }
        }
    }

    fn raw_events(&self, from: u64, limit: usize) -> Result<Vec<RawEvent>, StoreError> {
        // `from` may sit inside a run stored under an earlier key.
        let start = match self.events.range(..=seq_key(from)).next_back() {
            Some(guard) => key_seq(&guard.key()?)?,
            None => from,
        };
        let mut out = Vec::new();
        for guard in self.events.range(seq_key(start)..) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = guard.into_inner()?;
            let key = key_seq(&k)?;
            match decode_stored(key, &v) {
                Ok(events) => {
                    let last = events.len().saturating_sub(1);
                    for (i, event) in events.into_iter().enumerate() {
                        let seq = key.saturating_add(i as u64);
                        if seq >= from {
                            out.push(RawEvent {
                                seq,
                                key,
                                ends_value: i == last,
                                event: Ok(event),
                            });
                        }
                    }
                }
                Err(e) if key >= from => out.push(RawEvent {
                    seq: key,
                    key,
                    ends_value: true,
                    event: Err(e),
                }),
                Err(_) => {}
            }
        }
        Ok(out)
    }

    fn runs_of(&self, invocation_id: &str) -> Result<Vec<Run>, StoreError> {
        // The unindexed ones first: a settling write indexes them before it forgets them.
        let mut out: Vec<Run> = self
            .unindexed()
            .runs
            .get(invocation_id)
            .into_iter()
            .flatten()
            .map(|&(first, count)| Run {
                row: first,
                first,
                count,
            })
            .collect();
        let prefix = id_prefix(invocation_id);
        for guard in self.by_invocation.prefix(&prefix) {
            let (k, value) = guard.into_inner()?;
            let Some(seq_bytes) = k.get(prefix.len()..) else {
                continue;
            };
            let key: [u8; 8] = seq_bytes.try_into().map_err(|e| corrupt("index key", e))?;
            out.extend(decode_runs(u64::from_be_bytes(key), &value)?);
        }
        out.sort_by_key(|r| (r.first, r.row));
        out.dedup_by_key(|r| r.first);
        Ok(out)
    }

    fn checkpoint(&self) -> Result<Option<Checkpoint>, StoreError> {
        match self.checkpoints.last_key_value() {
            None => Ok(None),
            Some(guard) => {
                let (_, v) = guard.into_inner()?;
                serde_json::from_slice(&v)
                    .map(Some)
                    .map_err(|e| corrupt("checkpoint", e))
            }
        }
    }

    fn islands(&self) -> Result<Vec<Event>, StoreError> {
        let mut out = Vec::new();
        for guard in self.islands.iter() {
            let (_, v) = guard.into_inner()?;
            out.push(from_record("island", &v)?);
        }
        Ok(out)
    }

    fn islands_of(&self, invocation_id: &str) -> Result<Vec<Event>, StoreError> {
        let mut out = Vec::new();
        for guard in self.islands.prefix(id_prefix(invocation_id)) {
            let (_, v) = guard.into_inner()?;
            out.push(from_record("island", &v)?);
        }
        Ok(out)
    }

    fn events_of(&self, invocation_id: &str) -> Result<Vec<Event>, StoreError> {
        self.read_events(invocation_id, Hashes::Computed)
    }

    fn stored_row(&self, invocation_id: &str) -> Result<Option<StoredRow>, StoreError> {
        let Some(row) = self.states.get(invocation_id.as_bytes())? else {
            return Ok(None);
        };
        Ok(Some(match row.as_ref() {
            RESOLVED_MARK => StoredRow::Resolved,
            [] => StoredRow::Settled,
            full => StoredRow::Full(Box::new(from_record("state", full)?)),
        }))
    }

    fn state(&self, invocation_id: &str) -> Result<Option<State>, StoreError> {
        match self.states.get(invocation_id.as_bytes())? {
            None => Ok(None),
            Some(v) => self.stored_state(invocation_id, &v),
        }
    }

    fn states_before(&self, before: Option<&str>, limit: usize) -> Result<Vec<State>, StoreError> {
        let iter = match before {
            Some(b) => self.states.range(..b.as_bytes().to_vec()),
            None => self.states.iter(),
        };
        let mut out = Vec::new();
        for guard in iter.rev().take(limit) {
            let (k, v) = guard.into_inner()?;
            let id = std::str::from_utf8(&k).map_err(|e| corrupt("state key", e))?;
            out.extend(self.stored_state(id, &v)?);
        }
        Ok(out)
    }

    fn open_invocations(&self) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for guard in self.open.iter() {
            let k = guard.key()?;
            out.push(String::from_utf8_lossy(&k).into_owned());
        }
        Ok(out)
    }

    fn result(&self, invocation_id: &str) -> Result<Option<StoredResult>, StoreError> {
        let Some(v) = self.results.get(invocation_id.as_bytes())? else {
            return Ok(None);
        };
        match decode_result_row(&v).map_err(|e| corrupt("result", e))? {
            ResultRow::Whole(result) => Ok(Some(result)),
            ResultRow::InFile(mut result, at, splits) => {
                let Some(body) = self.bodies.read(&at)? else {
                    // Reclaimed: every body in its segment had expired, this one too.
                    return Ok(None);
                };
                fill_bodies(&mut result, &body, &splits).map_err(|e| corrupt("result", e))?;
                Ok(Some(result))
            }
        }
    }

    fn reclaim_bodies(&self, now_ms: i64) -> Result<usize, StoreError> {
        let expired = self.bodies.expired(now_ms);
        let _flushed_before_zeros = self.prefill.lock();
        let removed = expired.iter().try_for_each(|&id| {
            // The row first: a segment without one goes at the next open anyway.
            self.body_segments.remove(id.to_be_bytes())?;
            self.bodies.remove(id)
        });
        self.db.persist(PersistMode::Buffer)?;
        removed.map(|()| expired.len())
    }

    fn prefill(&self, small: bool) {
        let Ok(mut prefill) = self.prefill.lock() else {
            return;
        };
        // Nothing of fjall's may wait in its buffer: its worker could write it out (a
        // rotation's sync) between the hole looked up and the zeros written.
        match small && self.db.persist(PersistMode::Buffer).is_ok() {
            true => prefill.step(),
            false => prefill.idle(),
        }
    }

    fn request(&self, invocation_id: &str) -> Result<Option<StoredRequest>, StoreError> {
        match self.requests.get(invocation_id.as_bytes())? {
            None => Ok(None),
            Some(v) => decode_request(&v)
                .map(Some)
                .map_err(|e| corrupt("request", e)),
        }
    }

    fn expired_results(
        &self,
        now_ms: i64,
        after: Option<&(i64, String)>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let after = after.map(|(at_ms, id)| expiry_key(*at_ms, id));
        let rows = due_rows(&self.result_expiry, now_ms, after, limit)?;
        Ok(rows
            .into_iter()
            .map(|(at_ms, id)| (at_ms, String::from_utf8_lossy(&id).into_owned()))
            .collect())
    }

    fn key_entry(&self, index_key: &[u8]) -> Result<Option<KeyEntry>, StoreError> {
        match self.keys.get(index_key)? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| corrupt("key entry", e)),
        }
    }

    fn expired_keys(
        &self,
        now_ms: i64,
        after: Option<&(i64, Vec<u8>)>,
        limit: usize,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        let after = after.map(|(at_ms, key)| expiry_key_bytes(*at_ms, key));
        due_rows(&self.key_expiry, now_ms, after, limit)
    }

    fn twin_entry(&self, index_key: &[u8]) -> Result<Option<TwinEntry>, StoreError> {
        match self.twins.get(index_key)? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(&v)
                .map(Some)
                .map_err(|e| corrupt("twin entry", e)),
        }
    }

    fn expired_twins(
        &self,
        now_ms: i64,
        after: Option<&(i64, Vec<u8>)>,
        limit: usize,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        let after = after.map(|(at_ms, key)| expiry_key_bytes(*at_ms, key));
        due_rows(&self.twin_expiry, now_ms, after, limit)
    }

    fn suspensions(&self) -> Result<Vec<Suspension>, StoreError> {
        let mut out = Vec::new();
        for guard in self.suspended.iter() {
            let (_, v) = guard.into_inner()?;
            out.push(serde_json::from_slice(&v).map_err(|e| corrupt("suspension", e))?);
        }
        Ok(out)
    }

    fn index_entries(&self) -> IndexEntries {
        let held = |n: &AtomicI64| u64::try_from(n.load(Ordering::Relaxed)).unwrap_or(0);
        IndexEntries {
            keys: held(&self.key_count),
            twins: held(&self.twin_count),
        }
    }
}

impl FjallStore {
    /// One invocation's events, kept aside or not, in seq order; with `Hashes::Skipped` the
    /// hashes a group does not store are left empty (for a projection).
    fn read_events(&self, invocation_id: &str, hashes: Hashes) -> Result<Vec<Event>, StoreError> {
        let mut out = self.islands_of(invocation_id)?;
        for Run { first, count, .. } in self.runs_of(invocation_id)? {
            let end = first.saturating_add(u64::from(count));
            // A run sits in one group stored under its first seq or an earlier one, or
            // (older journals) in one value of its own or one value per event.
            let mut values = Vec::new();
            for guard in self.events.range(..seq_key(end)).rev() {
                let (k, v) = guard.into_inner()?;
                let key = key_seq(&k)?;
                values.push((key, v));
                if key <= first {
                    break;
                }
            }
            for (key, v) in values.into_iter().rev() {
                let events = decode_stored_hashing(key, &v, first..end, hashes)
                    .map_err(|e| corrupt("event", e))?;
                out.extend(events);
            }
        }
        // A run the cut went into: its first events are kept aside and may still be read.
        out.sort_by_key(|e| e.seq);
        out.dedup_by_key(|e| e.seq);
        Ok(out)
    }

    fn unindexed(&self) -> std::sync::MutexGuard<'_, Unindexed> {
        // Nothing panics while holding it; a poisoned one is still consistent.
        self.unindexed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The index rows of a write: runs of invocations that stay open are held back, and
    /// those of one that settles now go in one row with its earlier ones. Returns the
    /// invocations whose held runs this write indexes.
    fn index_runs(
        &self,
        batch: &mut fjall::OwnedWriteBatch,
        set: &WriteSet,
    ) -> Result<Vec<String>, StoreError> {
        let mut held = self.unindexed();
        let closed: HashSet<&str> = set.closed.iter().map(String::as_str).collect();
        for id in set.opened.iter().filter(|id| !closed.contains(id.as_str())) {
            // Its runs are found again from here after a crash; a write without events
            // (none yet) leaves them indexed as they come.
            let value = match set.events.first() {
                Some(first) => {
                    held.runs.entry(id.clone()).or_default();
                    first.event.seq.to_be_bytes().to_vec()
                }
                None => Vec::new(),
            };
            batch.insert(&self.open, id.as_bytes(), value);
        }
        for run in invocation_runs(&set.events) {
            let first = &run[0].event;
            let count = u32::try_from(run.len()).unwrap_or(u32::MAX);
            match held.runs.get_mut(&first.invocation_id) {
                Some(runs) => extend_runs(runs, first.seq, count),
                None => batch.insert(
                    &self.by_invocation,
                    invocation_key(&first.invocation_id, first.seq),
                    encode_runs(&[(first.seq, count)]),
                ),
            }
        }
        let mut settled: Vec<String> = Vec::new();
        for id in &set.closed {
            batch.remove(&self.open, id.as_bytes());
            settled.push(id.clone());
        }
        if let Some(head) = set.events.last().map(|e| e.event.seq)
            && head >= held.next_check
        {
            held.next_check = head.saturating_add(self.fold_window / 4);
            for (id, runs) in &held.runs {
                let long_open = runs
                    .first()
                    .is_some_and(|&(first, _)| first.saturating_add(self.fold_window) < head);
                if long_open && !closed.contains(id.as_str()) {
                    // Open still: it stays listed, with nothing left to find again.
                    batch.insert(&self.open, id.as_bytes(), []);
                    settled.push(id.clone());
                }
            }
        }
        for id in &settled {
            if let Some(runs @ [(first, _), ..]) = held.runs.get(id).map(Vec::as_slice) {
                batch.insert(
                    &self.by_invocation,
                    invocation_key(id, *first),
                    encode_runs(runs),
                );
            }
        }
        Ok(settled)
    }

    /// After a write is committed: what it indexed is no longer held, and runs a cut
    /// removed are gone.
    fn forget_indexed(&self, settled: &[String], cut_runs: &[(String, u64)]) {
        if settled.is_empty() && cut_runs.is_empty() {
            return;
        }
        let mut held = self.unindexed();
        for id in settled {
            held.runs.remove(id);
        }
        for (id, row) in cut_runs {
            if let Some(runs) = held.runs.get_mut(id) {
                runs.retain(|(first, _)| first != row);
            }
        }
    }

    /// At open: the runs of invocations left open, read from the events after the seq
    /// their `open` row names (rows without one were indexed as they were written).
    fn find_unindexed(&self) -> Result<(), StoreError> {
        let mut from: HashMap<String, u64> = HashMap::new();
        for guard in self.open.iter() {
            let (k, v) = guard.into_inner()?;
            if let Ok(seq) = <[u8; 8]>::try_from(v.as_ref()) {
                from.insert(
                    String::from_utf8_lossy(&k).into_owned(),
                    u64::from_be_bytes(seq),
                );
            }
        }
        let Some(mut next) = from.values().min().copied() else {
            return Ok(());
        };
        let mut runs: HashMap<String, Vec<(u64, u32)>> =
            from.keys().map(|id| (id.clone(), Vec::new())).collect();
        loop {
            let page = self.raw_events(next, RESCAN_PAGE)?;
            let Some(after) = page.last().map(|r| r.seq.saturating_add(1)) else {
                break;
            };
            for event in page.into_iter().filter_map(|r| r.event.ok()) {
                let unindexed = from
                    .get(&event.invocation_id)
                    .is_some_and(|&f| event.seq >= f);
                if let (true, Some(list)) = (unindexed, runs.get_mut(&event.invocation_id)) {
                    extend_runs(list, event.seq, 1);
                }
            }
            if after <= next {
                break;
            }
            next = after;
        }
        self.unindexed().runs = runs;
        Ok(())
    }
}

/// What one write does to an index's number of entries. Expired entries go before the
/// batch's claims, so a claim over an entry removed in the same batch adds one again.
#[derive(Default)]
struct Tally<'a> {
    removed: HashSet<&'a [u8]>,
    delta: i64,
}

impl<'a> Tally<'a> {
    fn removed(&mut self, index_key: &'a [u8]) {
        if self.removed.insert(index_key) {
            self.delta -= 1;
        }
    }

    /// `replaces`: the expiry of the entry the writer saw in the slot (none: empty).
    fn written(&mut self, index_key: &[u8], replaces: Option<i64>) {
        let revived = self.removed.remove(index_key);
        if replaces.is_none() || revived {
            self.delta += 1;
        }
    }
}

/// Expiry rows (time, then the indexed key) due at or before `now_ms`, oldest first,
/// from after the row key `after`: a sweep's next batch seeks past the rows its previous
/// one removed instead of stepping over their tombstones.
fn due_rows(
    rows: &Keyspace,
    now_ms: i64,
    after: Option<Vec<u8>>,
    limit: usize,
) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
    let start = after.map_or(Bound::Unbounded, Bound::Excluded);
    let mut out = Vec::new();
    for guard in rows.range((start, Bound::Unbounded)).take(limit) {
        let k = guard.key()?;
        let (at_ms, index_key) = split_expiry(&k)?;
        if at_ms > now_ms {
            break;
        }
        out.push((at_ms, index_key.to_vec()));
    }
    Ok(out)
}

impl FjallStore {
    /// Key index rows: expired ones out first (an entry refreshed since keeps its newer
    /// expiry), then claims and refreshes, each moving its expiry row. Returns how the
    /// number of entries changes.
    fn write_keys(
        &self,
        batch: &mut fjall::OwnedWriteBatch,
        set: &WriteSet,
    ) -> Result<i64, StoreError> {
        let mut tally = Tally::default();
        for (at_ms, index_key) in &set.expired_keys {
            batch.remove(&self.key_expiry, expiry_key_bytes(*at_ms, index_key));
            let current = self.key_entry(index_key)?;
            if let Some(e) = current.filter(|e| e.expires_at_ms <= *at_ms) {
                batch.remove(&self.keys, index_key.as_slice());
                tally.removed(index_key);
                self.release_held(batch, set, &e.invocation_id)?;
            }
        }
        for w in &set.keys {
            tally.written(&w.index_key, w.replaces_expiry);
            if let Some(old) = w.replaces_expiry {
                batch.remove(&self.key_expiry, expiry_key_bytes(old, &w.index_key));
            }
            batch.insert(
                &self.keys,
                w.index_key.as_slice(),
                to_json("key entry", &w.entry)?,
            );
            batch.insert(
                &self.key_expiry,
                expiry_key_bytes(w.entry.expires_at_ms, &w.index_key),
                [],
            );
        }
        Ok(tally.delta)
    }

    /// Twin index rows, as `write_keys` does for the key index.
    fn write_twins(
        &self,
        batch: &mut fjall::OwnedWriteBatch,
        set: &WriteSet,
    ) -> Result<i64, StoreError> {
        let mut tally = Tally::default();
        for (at_ms, index_key) in &set.expired_twins {
            batch.remove(&self.twin_expiry, expiry_key_bytes(*at_ms, index_key));
            let current = self.twin_entry(index_key)?;
            if let Some(e) = current.filter(|e| e.expires_at_ms <= *at_ms) {
                batch.remove(&self.twins, index_key.as_slice());
                tally.removed(index_key);
                self.release_held(batch, set, &e.invocation_id)?;
            }
        }
        for w in &set.twins {
            tally.written(&w.index_key, w.replaces_expiry);
            if let Some(old) = w.replaces_expiry {
                batch.remove(&self.twin_expiry, expiry_key_bytes(old, &w.index_key));
            }
            batch.insert(
                &self.twins,
                w.index_key.as_slice(),
                to_json("twin entry", &w.entry)?,
            );
            batch.insert(
                &self.twin_expiry,
                expiry_key_bytes(w.entry.expires_at_ms, &w.index_key),
                [],
            );
        }
        Ok(tally.delta)
    }

    /// A state row: the record itself, or (empty) a mark that it settled and is the
    /// projection of its events.
    fn stored_state(&self, id: &str, row: &[u8]) -> Result<Option<State>, StoreError> {
        if !is_mark(row) {
            return from_record("state", row).map(Some);
        }
        // The events are read after the row: a lease may have reopened the record since,
        // and then they say so (the caller sees it open).
        Ok(replay(&self.read_events(id, Hashes::Skipped)?))
    }

    /// A retention cut: the events up to the checkpoint, the index runs that ended before
    /// it and the settled records with nothing left, removed; the checkpoint stored.
    fn write_cut(&self, batch: &mut fjall::OwnedWriteBatch, cut: &Cut) -> Result<(), StoreError> {
        for key in &cut.keys {
            batch.remove(&self.events, seq_key(*key));
        }
        for (id, first) in &cut.runs {
            batch.remove(&self.by_invocation, invocation_key(id, *first));
        }
        for id in &cut.states {
            batch.remove(&self.states, id.as_bytes());
        }
        for event in &cut.islands {
            let row = to_record("island", event)?;
            batch.insert(
                &self.islands,
                invocation_key(&event.invocation_id, event.seq),
                row,
            );
        }
        for id in &cut.islands_released {
            for guard in self.islands.prefix(id_prefix(id)) {
                batch.remove(&self.islands, guard.key()?);
            }
        }
        // Only the newest checkpoint is kept: the chain before it is gone anyway.
        if cut.first_seq > 1 {
            batch.remove(&self.checkpoints, seq_key(cut.first_seq - 1));
        }
        let row = to_json("checkpoint", &cut.checkpoint)?;
        batch.insert(&self.checkpoints, seq_key(cut.checkpoint.seq), row);
        Ok(())
    }

    /// An index entry that kept a pruned record (its events cut, its state held for the
    /// key or twin) is gone: the record goes too, unless this write touches it.
    fn release_held(
        &self,
        batch: &mut fjall::OwnedWriteBatch,
        set: &WriteSet,
        invocation_id: &str,
    ) -> Result<(), StoreError> {
        if set.touches(invocation_id)
            || !self.runs_of(invocation_id)?.is_empty()
            || !self.islands_of(invocation_id)?.is_empty()
        {
            return Ok(());
        }
        if self
            .state(invocation_id)?
            .is_some_and(|s| s.progress.closed)
        {
            batch.remove(&self.states, invocation_id.as_bytes());
        }
        Ok(())
    }
}
