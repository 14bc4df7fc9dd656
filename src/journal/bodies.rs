//! Large result bodies in files of the journal's own. fjall writes a value twice (its
//! journal, then a blob file when the memtable flushes): a 64 KiB body cost 136 KB of
//! disk. Here it is written once, into the active segment, and made durable before the
//! result row that names it (`BodyRef`) is written, so no durable row names a body that is
//! not. A segment goes when every result in it has expired (`reclaim`); one that no
//! committed row names (a crash before its first row) goes at open.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::store::StoreError;

/// Bodies from this size on go to a segment; smaller ones stay in the result row.
pub const BODY_FILE_FROM: usize = 16 << 10;

/// A segment takes bodies until it holds this much.
const SEGMENT_BYTES: u64 = 64 << 20;

const SUFFIX: &str = ".body";

/// Where a body is: its segment, offset, length and XXH3 checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyRef {
    pub segment: u64,
    pub offset: u64,
    pub len: u64,
    pub checksum: u64,
}

impl BodyRef {
    pub const BYTES: usize = 32;

    pub fn to_bytes(self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        let fields = [self.segment, self.offset, self.len, self.checksum];
        for (chunk, field) in out.chunks_exact_mut(8).zip(fields) {
            chunk.copy_from_slice(&field.to_le_bytes());
        }
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != Self::BYTES {
            return None;
        }
        let mut fields = bytes
            .chunks_exact(8)
            .map(|c| c.try_into().map(u64::from_le_bytes));
        Some(Self {
            segment: fields.next()?.ok()?,
            offset: fields.next()?.ok()?,
            len: fields.next()?.ok()?,
            checksum: fields.next()?.ok()?,
        })
    }
}

pub struct BodyFiles {
    dir: PathBuf,
    inner: Mutex<Segments>,
}

struct Segments {
    /// Made at the first append: opening the journal to read it (the CLI) writes nothing.
    active: Option<Active>,
    /// The id the next segment takes.
    next: u64,
    /// By segment: the latest expiry of a body in it (the active one's included; a
    /// known one whose file is missing too, so reading it is an error, not an expiry).
    expiry: BTreeMap<u64, i64>,
}

struct Active {
    id: u64,
    file: File,
    len: u64,
    /// Written since its last sync.
    dirty: bool,
}

fn io(e: std::io::Error) -> StoreError {
    StoreError::Io(format!("result body file: {e}"))
}

impl BodyFiles {
    /// Opens `dir`, keeping the segments `known` names (by id, with their latest expiry:
    /// what committed rows say) and removing the others.
    pub fn open(dir: &Path, known: BTreeMap<u64, i64>) -> Result<Self, StoreError> {
        if !dir.exists() {
            // Bodies are what origins answered: the operator's alone, as the journal is.
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(io)?;
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        let mut last = known.keys().next_back().copied().unwrap_or(0);
        let mut found = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let Some(id) = segment_id(&path) else {
                continue;
            };
            last = last.max(id);
            match known.contains_key(&id) {
                true => found.insert(id),
                false => {
                    std::fs::remove_file(&path).map_err(io)?;
                    false
                }
            };
        }
        for id in known.keys().filter(|id| !found.contains(*id)) {
            tracing::error!(
                segment = id,
                "a result body file is missing; its results cannot be fetched"
            );
        }
        let next = last
            .checked_add(1)
            .ok_or_else(|| StoreError::Io("result body files: no segment id left".into()))?;
        Ok(Self {
            dir: dir.to_owned(),
            inner: Mutex::new(Segments {
                active: None,
                next,
                expiry: known,
            }),
        })
    }

    /// Appends a body that expires at `expires_at_ms`. Returns where it is, and the
    /// segment's new latest expiry when this body moved it (the caller stores that row
    /// with the result's).
    pub fn append(
        &self,
        body: &[u8],
        expires_at_ms: i64,
    ) -> Result<(BodyRef, Option<(u64, i64)>), StoreError> {
        let mut guard = self.inner.lock().map_err(|_| StoreError::Poisoned)?;
        let s = &mut *guard;
        let full = s
            .active
            .as_ref()
            .is_none_or(|a| a.len > 0 && a.len + body.len() as u64 > SEGMENT_BYTES);
        if full {
            if let Some(a) = s.active.as_mut() {
                // The full segment's bodies must be durable before rows name them.
                a.sync()?;
            }
            let id = s.next;
            s.next = id
                .checked_add(1)
                .ok_or_else(|| StoreError::Io("result body files: no segment id left".into()))?;
            s.active = Some(Active::create(&self.dir, id)?);
        }
        let Some(a) = s.active.as_mut() else {
            return Err(StoreError::Io(
                "result body files: no active segment".into(),
            ));
        };
        a.file.write_all_at(body, a.len).map_err(io)?;
        let at = BodyRef {
            segment: a.id,
            offset: a.len,
            len: body.len() as u64,
            checksum: checksum(a.id, a.len, body),
        };
        a.len += body.len() as u64;
        a.dirty = true;
        let id = a.id;
        let latest = s.expiry.entry(id).or_insert(i64::MIN);
        let moved = (expires_at_ms > *latest).then(|| {
            *latest = expires_at_ms;
            (id, expires_at_ms)
        });
        Ok((at, moved))
    }

    /// Makes every appended body durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        let mut s = self.inner.lock().map_err(|_| StoreError::Poisoned)?;
        s.active.as_mut().map_or(Ok(()), Active::sync)
    }

    /// The body `at` names; `None` when its segment was reclaimed (every body in it had
    /// expired).
    pub fn read(&self, at: &BodyRef) -> Result<Option<Vec<u8>>, StoreError> {
        let corrupt = |detail: &str| StoreError::Corrupt {
            what: "result body",
            detail: format!("segment {}: {detail}", at.segment),
        };
        let file = match File::open(self.path(at.segment)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let known = self
                    .inner
                    .lock()
                    .is_ok_and(|s| s.expiry.contains_key(&at.segment));
                return match known {
                    true => Err(corrupt("its file is missing")),
                    false => Ok(None),
                };
            }
            Err(e) => return Err(io(e)),
        };
        // A damaged row must not make it allocate what the file does not hold.
        let size = file.metadata().map_err(io)?.len();
        if at.offset.checked_add(at.len).is_none_or(|end| end > size) {
            return Err(corrupt("shorter than its row says"));
        }
        let len = usize::try_from(at.len).map_err(|_| corrupt("impossible length"))?;
        let mut body = vec![0u8; len];
        file.read_exact_at(&mut body, at.offset)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => corrupt("shorter than its row says"),
                _ => io(e),
            })?;
        if checksum(at.segment, at.offset, &body) != at.checksum {
            return Err(corrupt("checksum differs"));
        }
        Ok(Some(body))
    }

    /// Segments whose every body expired before `now_ms`. An active one among them is
    /// retired (the next append starts a new one): a journal that went quiet after a burst
    /// does not keep the burst's bodies.
    pub fn expired(&self, now_ms: i64) -> Vec<u64> {
        let Ok(mut s) = self.inner.lock() else {
            return Vec::new();
        };
        let active = s.active.as_ref().map(|a| a.id);
        if active.is_some_and(|id| s.expiry.get(&id).is_some_and(|&at| at < now_ms)) {
            s.active = None;
        }
        let active = s.active.as_ref().map(|a| a.id);
        s.expiry
            .iter()
            .filter(|&(&id, &at)| Some(id) != active && at < now_ms)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Removes a segment `expired` named (its row is gone already).
    pub fn remove(&self, id: u64) -> Result<(), StoreError> {
        if let Ok(mut s) = self.inner.lock() {
            s.expiry.remove(&id);
        }
        match std::fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
            _ => Ok(()),
        }
    }

    fn path(&self, id: u64) -> PathBuf {
        segment_path(&self.dir, id)
    }
}

impl Active {
    /// A new, empty segment whose name is durable (a row may name it after one sync).
    fn create(dir: &Path, id: u64) -> Result<Self, StoreError> {
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(segment_path(dir, id))
            .map_err(io)?;
        sync_dir(dir)?;
        Ok(Self {
            id,
            file,
            len: 0,
            dirty: false,
        })
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        if self.dirty {
            self.file.sync_data().map_err(io)?;
            self.dirty = false;
        }
        Ok(())
    }
}

/// Makes a directory's entries durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)
}

/// A body's checksum, seeded with where it is: a reference into a segment whose id was
/// used again after a crash reads as damaged, never as another body.
fn checksum(segment: u64, offset: u64, body: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(body, segment ^ offset.rotate_left(32))
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}{SUFFIX}"))
}

fn segment_id(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?.strip_suffix(SUFFIX)?;
    u64::from_str_radix(name, 16).ok()
}
