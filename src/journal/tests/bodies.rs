//! Large result bodies live in body files (`journal::bodies`): written once, read back
//! after a restart, reclaimed when every result in a file expired, checked when read.

use super::recovery::reopen;
use super::*;
use crate::journal::result::SshResult;

/// A committed result with a body of `len` bytes that expires at `expires_at_ms`.
fn large(journal: &Journal, len: usize, expires_at_ms: i64) -> (String, Vec<u8>) {
    let id = new_invocation_id();
    let body: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let (draft, mut result) = committed(&id, expires_at_ms);
    if let Payload::Http(http) = &mut result.payload {
        http.body_base64 = Some(b64(&body));
        http.digest = sha256_tagged(&body);
        http.bytes = len as u64;
    }
    dispatch_and_commit(journal, &id, draft, result);
    (id, body)
}

fn body_of(journal: &Journal, id: &str) -> Option<Vec<u8>> {
    let result = journal.result(id).ok().flatten()?;
    match result.payload {
        Payload::Http(http) => unb64(http.body_base64.as_deref()?),
        _ => None,
    }
}

/// A journal in a new directory, and an expiry an hour away.
fn fresh() -> (tempfile::TempDir, Journal, i64) {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let journal = open(dir.path());
    let far = unix_ms(journal.now()) + 3_600_000;
    (dir, journal, far)
}

/// Reading `id`'s result is refused as a damaged body.
fn assert_damaged(journal: &Journal, id: &str) {
    let read = journal.result(id);
    assert!(
        matches!(
            read,
            Err(StoreError::Corrupt {
                what: "result body",
                ..
            })
        ),
        "{read:?}"
    );
}

/// The body files and their sizes.
fn files(dir: &Path) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir(dir.join("bodies")) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u64)> = entries
        .flatten()
        .map(|e| {
            let len = e.metadata().map_or(0, |m| m.len());
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_large_body_is_kept_in_a_body_file_once_and_read_back_after_a_restart() {
    let (dir, journal, far) = fresh();
    let (big, body) = large(&journal, 64 << 10, far);
    let (small, small_body) = large(&journal, 1000, far);
    assert_eq!(body_of(&journal, &big), Some(body.clone()));
    assert_eq!(body_of(&journal, &small), Some(small_body.clone()));
    // Only the large one went to the file, whole.
    let written: u64 = files(dir.path()).iter().map(|(_, len)| len).sum();
    assert_eq!(written, 64 << 10);
    drop(journal);
    let (journal, _) = reopen(dir.path());
    assert_eq!(body_of(&journal, &big), Some(body));
    assert_eq!(body_of(&journal, &small), Some(small_body));
}

#[test]
fn a_body_file_goes_once_every_result_in_it_expired() {
    let (dir, journal, far) = fresh();
    let (gone, _) = large(&journal, 32 << 10, 1);
    drop(journal);
    // A new process writes to a new file: the first holds only the expired result.
    let (journal, _) = reopen(dir.path());
    let (kept, body) = large(&journal, 32 << 10, far);
    assert_eq!(files(dir.path()).len(), 2);
    assert_eq!(rt().block_on(journal.expire_results()), Ok(1));
    assert_eq!(files(dir.path()).len(), 1, "the expired file went");
    assert_eq!(journal.result(&gone), Ok(None));
    assert_eq!(body_of(&journal, &kept), Some(body.clone()));
    drop(journal);
    // The active file of that process holds a result still kept: it stays.
    let (journal, _) = reopen(dir.path());
    assert_eq!(rt().block_on(journal.expire_results()), Ok(0));
    assert_eq!(body_of(&journal, &kept), Some(body));
}

#[test]
fn the_file_a_quiet_journal_still_writes_to_goes_once_its_results_expired() {
    let (dir, journal, far) = fresh();
    let (gone, _) = large(&journal, 32 << 10, 1);
    assert_eq!(rt().block_on(journal.expire_results()), Ok(1));
    assert_eq!(files(dir.path()), Vec::new(), "the active file went");
    assert_eq!(journal.result(&gone), Ok(None));
    // The next body starts a new file.
    let (kept, body) = large(&journal, 32 << 10, far);
    assert_eq!(files(dir.path()).len(), 1);
    assert_eq!(body_of(&journal, &kept), Some(body));
}

#[test]
fn a_body_file_no_row_names_goes_at_open_and_a_damaged_body_is_not_served() {
    let (dir, journal, far) = fresh();
    let (id, _) = large(&journal, 20 << 10, far);
    drop(journal);
    // A crash between a body's write and its row's: a file no row names.
    let stray = dir.path().join("bodies").join("00000000000000ff.body");
    assert!(std::fs::write(&stray, b"half a body").is_ok());
    // And a bit flipped in the body a row names.
    let named = dir.path().join("bodies").join(&files(dir.path())[0].0);
    let Ok(mut bytes) = std::fs::read(&named) else {
        panic!("no body file");
    };
    bytes[100] ^= 1;
    assert!(std::fs::write(&named, bytes).is_ok());
    let (journal, _) = reopen(dir.path());
    assert!(!stray.exists());
    assert_damaged(&journal, &id);
}

#[test]
fn body_files_are_the_operators_alone() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, journal, far) = fresh();
    let _ = large(&journal, 20 << 10, far);
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
    let bodies = dir.path().join("bodies");
    assert_eq!(mode(&bodies).ok(), Some(0o700));
    for (name, _) in files(dir.path()) {
        assert_eq!(mode(&bodies.join(name)).ok(), Some(0o600));
    }
}

#[test]
fn a_reference_past_its_file_is_refused_before_anything_is_read() {
    use crate::journal::bodies::{BodyFiles, BodyRef};
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let Ok(files) = BodyFiles::open(dir.path(), Default::default()) else {
        panic!("no body files");
    };
    let Ok((at, _)) = files.append(b"a body", 1) else {
        panic!("no append");
    };
    assert_eq!(
        files.read(&at).ok().flatten().as_deref(),
        Some(&b"a body"[..])
    );
    for bad in [
        BodyRef {
            len: u64::MAX,
            ..at
        },
        BodyRef {
            offset: u64::MAX,
            ..at
        },
        BodyRef {
            len: at.len + 1,
            ..at
        },
    ] {
        assert!(
            matches!(files.read(&bad), Err(StoreError::Corrupt { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn buffered_a_body_stays_in_its_row_and_opening_to_read_writes_no_file() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let options = JournalOptions {
        durability: Durability::Buffered,
        ..JournalOptions::default()
    };
    let Ok((journal, _)) = Journal::open(dir.path(), options) else {
        panic!("no journal");
    };
    let (id, body) = large(&journal, 64 << 10, unix_ms(journal.now()) + 60_000);
    assert_eq!(body_of(&journal, &id), Some(body));
    // Never synced before its row, so never in a file: a power loss takes both or neither.
    assert_eq!(files(dir.path()), Vec::new());
}

#[test]
fn a_missing_body_file_that_rows_still_name_is_an_error_not_an_expiry() {
    let (dir, journal, far) = fresh();
    let (id, _) = large(&journal, 20 << 10, far);
    drop(journal);
    for (name, _) in files(dir.path()) {
        assert!(std::fs::remove_file(dir.path().join("bodies").join(name)).is_ok());
    }
    let (journal, _) = reopen(dir.path());
    assert_damaged(&journal, &id);
    // Opening to read made no file.
    assert_eq!(files(dir.path()), Vec::new());
}

#[test]
fn a_large_ssh_output_is_kept_in_a_body_file_and_read_back_after_a_restart() {
    let (dir, journal, far) = fresh();
    let id = new_invocation_id();
    let stdout: Vec<u8> = (0..20_000).map(|i| (i % 251) as u8).collect();
    let stderr = b"warning: something\n".to_vec();
    let (draft, mut result) = committed(&id, far);
    result.payload = Payload::Ssh(SshResult {
        exit_status: Some(0),
        exit_signal: None,
        stdout_base64: b64(&stdout),
        stderr_base64: b64(&stderr),
        output_stored: true,
    });
    dispatch_and_commit(&journal, &id, draft, result.clone());
    let written: u64 = files(dir.path()).iter().map(|(_, len)| len).sum();
    assert_eq!(written as usize, stdout.len() + stderr.len());
    assert_eq!(journal.result(&id).ok().flatten().as_ref(), Some(&result));
    drop(journal);
    let (journal, _) = reopen(dir.path());
    assert_eq!(journal.result(&id).ok().flatten(), Some(result));
}
