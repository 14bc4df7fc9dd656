//! Zeros written ahead of fjall's active journal file, while the journal's groups are small.
//!
//! fjall makes each journal file sparse (`set_len` to 64 MiB). A small group's fdatasync that
//! reaches a block never written before also commits ext4's allocation of that block: on this
//! machine such syncs took ~160 µs, against ~115 µs into blocks written before. Zeros written
//! a MiB ahead of fjall leave a small group's sync a data write alone, and one allocation per
//! MiB instead of one per 4 KiB block.
//!
//! Why zeros never land on an entry:
//! - fjall writes a journal file front to back from one position, and its entries reach the
//!   file only while the caller holds this prefill (the writer between its groups, or
//!   `reclaim_bodies`, which flushes before it lets go). So the first hole at or after our
//!   mark is at or past fjall's position, and zeros go only from there on.
//! - Never at or past the file's length: a file fjall reopened after a crash is appended to,
//!   and entries after a run of our zeros would be past the end its recovery reads to.
//! - Zeros read as the holes they replace, so a crash at any point leaves the journal as
//!   fjall's recovery expects it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::SeekFrom;

/// How far ahead of fjall one fill reaches: its write and sync (on the writer thread, after
/// the acks) are what the next request may wait for.
const AHEAD: u64 = 256 << 10;
/// A page at a time: a larger write makes the page cache hold larger folios, and every later
/// small write to one counts (in `/proc/PID/io`) as dirtying all of it.
const ZEROS: [u8; 4096] = [0; 4096];
/// fjall starts a new journal file once the active one nears its end: look for it this often,
/// and let go of the file after this many large groups (fjall deletes old files).
const LOOK_EVERY: u32 = 1024;
/// Whether fjall has moved on from a file with nothing left to fill: this often.
const LOOK_WHEN_DONE: u32 = 64;
/// ext4: where it was measured. On a copy-on-write file system zeros ahead save nothing, and
/// a file system's `SEEK_HOLE` must see written-but-unsynced data for the rule above to hold.
const EXT4_MAGIC: u64 = 0xEF53;

pub(super) struct Prefill {
    dir: PathBuf,
    active: Option<Active>,
    steps: u32,
    idle: u32,
    /// After an I/O error, or on a file system other than ext4, the journal goes on without
    /// zeros ahead.
    stopped: bool,
}

struct Active {
    id: u64,
    file: File,
    len: u64,
    /// Where our zeros end (the file's length once there is nothing left to fill): fjall
    /// has not written past here while the first hole from here is here.
    mark: u64,
}

impl Prefill {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            active: None,
            steps: 0,
            idle: 0,
            stopped: false,
        }
    }

    /// A large group went by: no zeros, and after a while the file is let go, so one fjall
    /// has deleted is not kept on disk by this handle.
    pub fn idle(&mut self) {
        self.idle += 1;
        if self.idle >= LOOK_EVERY {
            self.idle = 0;
            self.active = None;
        }
    }

    /// One look, with fjall's writes flushed: zeros ahead once fjall has passed the last ones.
    pub fn step(&mut self) {
        if self.stopped {
            return;
        }
        if let Err(e) = self.try_step() {
            tracing::warn!(error = %e, "the journal goes on without zeros ahead of its file");
            self.stopped = true;
        }
    }

    fn try_step(&mut self) -> io::Result<()> {
        self.steps = self.steps.wrapping_add(1);
        self.idle = 0;
        self.follow()?;
        match self.active.as_mut() {
            Some(active) => active.ahead(),
            None => Ok(()),
        }
    }

    /// Opens the newest journal file, and again once fjall has started a newer one.
    fn follow(&mut self) -> io::Result<()> {
        let look = match &self.active {
            None => true,
            Some(a) if a.mark >= a.len => self.steps.is_multiple_of(LOOK_WHEN_DONE),
            Some(_) => self.steps.is_multiple_of(LOOK_EVERY),
        };
        if !look {
            return Ok(());
        }
        let Some(id) = newest(&self.dir)? else {
            return Ok(());
        };
        if self.active.as_ref().is_some_and(|a| a.id == id) {
            return Ok(());
        }
        let file = OpenOptions::new()
            .write(true)
            .open(path_of(&self.dir, id))?;
        if !on_ext4(&file)? {
            self.stopped = true;
            return Ok(());
        }
        let len = file.metadata()?.len();
        self.active = Some(Active {
            id,
            file,
            len,
            mark: 0,
        });
        Ok(())
    }
}

impl Active {
    fn ahead(&mut self) -> io::Result<()> {
        if self.len == 0 {
            // Opened before fjall sized it.
            self.len = self.file.metadata()?.len();
        }
        // Done, or a file with no hole: fjall appends to a file it reopened.
        if self.mark >= self.len {
            return Ok(());
        }
        let hole = match rustix::fs::seek(&self.file, SeekFrom::Hole(self.mark)) {
            Ok(at) => at,
            // Nothing but data from the mark to the end.
            Err(rustix::io::Errno::NXIO) => self.len,
            Err(e) => return Err(e.into()),
        };
        // fjall has not reached our zeros yet (a new file's first look fills from 0).
        if hole == self.mark && hole > 0 {
            return Ok(());
        }
        let end = (hole + AHEAD).min(self.len);
        let mut at = hole;
        while at < end {
            let n = (end - at).min(ZEROS.len() as u64);
            let Ok(len) = usize::try_from(n) else {
                break;
            };
            self.file.write_all_at(&ZEROS[..len], at)?;
            at += n;
        }
        if end > hole {
            self.file.sync_data()?;
        }
        self.mark = end;
        Ok(())
    }
}

fn on_ext4(file: &File) -> io::Result<bool> {
    let fs = rustix::fs::fstatfs(file)?;
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    let magic = fs.f_type as u64;
    Ok(magic == EXT4_MAGIC)
}

/// Whether the directory is on ext4, the one file system zeros ahead are written on.
#[cfg(test)]
pub(super) fn dir_on_ext4(dir: &Path) -> bool {
    File::open(dir).and_then(|d| on_ext4(&d)).unwrap_or(false)
}

fn path_of(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id}.jnl"))
}

/// The journal file fjall writes to: the one with the highest number.
fn newest(dir: &Path) -> io::Result<Option<u64>> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let id = name
            .to_str()
            .and_then(|n| n.strip_suffix(".jnl"))
            .and_then(|n| n.parse::<u64>().ok());
        newest = newest.max(id);
    }
    Ok(newest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, Write};
    use std::os::unix::fs::MetadataExt;

    /// A sparse file written front to back in pieces of many sizes, as fjall writes its
    /// journal, with a step after each: every byte written reads back, and zeros went ahead.
    #[test]
    fn zeros_ahead_never_land_on_what_was_written() {
        let Ok(dir) = tempfile::tempdir() else {
            panic!("no temp dir");
        };
        let path = path_of(dir.path(), 0);
        let Ok(mut file) = File::create_new(&path) else {
            panic!("cannot create {path:?}");
        };
        let len = 8 << 20;
        assert!(file.set_len(len).is_ok());
        let ext4 = dir_on_ext4(dir.path());
        let mut prefill = Prefill::new(dir.path());
        let mut written = Vec::new();
        let mut ahead = 0;
        let mut size = 1usize;
        while (written.len() as u64) < len - (64 << 10) {
            size = (size * 7 + 13) % 9000 + 1;
            let piece: Vec<u8> = (0..size).map(|i| (i % 251) as u8 | 1).collect();
            assert!(file.write_all(&piece).is_ok());
            written.extend_from_slice(&piece);
            prefill.step();
            assert_eq!(prefill.stopped, !ext4);
            let Ok(meta) = file.metadata() else {
                panic!("no metadata");
            };
            ahead = ahead.max((meta.blocks() * 512).saturating_sub(written.len() as u64));
        }
        match ext4 {
            true => assert!(ahead >= AHEAD / 2, "zeros went at most {ahead} bytes ahead"),
            // Elsewhere none at all.
            false => assert!(ahead < 16 << 10, "zeros went {ahead} bytes ahead"),
        }
        let Ok(meta) = file.metadata() else {
            panic!("no metadata");
        };
        assert_eq!(meta.len(), len, "the file was not lengthened");
        assert!(file.rewind().is_ok());
        let Ok(read) = std::fs::read(&path) else {
            panic!("cannot read {path:?}");
        };
        assert!(
            read[..written.len()] == written[..],
            "a written byte changed"
        );
        assert!(read[written.len()..].iter().all(|b| *b == 0));
    }

    /// A file with no hole (fjall appends to a journal it reopened) gets no zeros, and the
    /// next file is followed once it appears.
    #[test]
    fn a_file_without_holes_is_left_alone_and_the_next_is_followed() {
        let Ok(dir) = tempfile::tempdir() else {
            panic!("no temp dir");
        };
        let old = path_of(dir.path(), 3);
        assert!(std::fs::write(&old, vec![7u8; 10_000]).is_ok());
        if !dir_on_ext4(dir.path()) {
            let mut prefill = Prefill::new(dir.path());
            prefill.step();
            assert!(prefill.stopped && prefill.active.is_none());
            return;
        }
        let mut prefill = Prefill::new(dir.path());
        prefill.step();
        let Ok(meta) = std::fs::metadata(&old) else {
            panic!("no metadata");
        };
        assert_eq!(meta.len(), 10_000);
        let next = path_of(dir.path(), 4);
        let Ok(file) = File::create_new(&next) else {
            panic!("cannot create {next:?}");
        };
        assert!(file.set_len(4 << 20).is_ok());
        for _ in 0..LOOK_WHEN_DONE {
            prefill.step();
        }
        let Some(active) = &prefill.active else {
            panic!("no active file");
        };
        assert_eq!(active.id, 4);
        let Ok(meta) = file.metadata() else {
            panic!("no metadata");
        };
        assert!(
            meta.blocks() * 512 >= AHEAD,
            "{} bytes",
            meta.blocks() * 512
        );
    }
}
