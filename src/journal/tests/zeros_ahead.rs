//! Zeros written ahead of fjall's journal file (`journal::prefill`) while groups are small:
//! every entry is still there after a restart, and the zeros did go ahead.

use std::os::unix::fs::MetadataExt;

use super::*;

/// A committed result with `len` bytes of body that does not compress.
async fn commit_noise(journal: &Journal, seed: u64, len: usize, far: i64) -> (String, Vec<u8>) {
    let id = new_invocation_id();
    let mut x = seed | 1;
    let body: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let (draft, mut result) = committed(&id, far);
    if let Payload::Http(http) = &mut result.payload {
        http.body_base64 = Some(b64(&body));
        http.digest = sha256_tagged(&body);
        http.bytes = len as u64;
    }
    let appended = journal
        .append(&id, vec![accepted("POST"), preflight(false), dispatch()])
        .await;
    assert!(appended.is_ok(), "{appended:?}");
    let committed = journal.commit_result(&id, vec![draft], result).await;
    assert!(committed.is_ok(), "{committed:?}");
    (id, body)
}

/// Bytes allocated past the last non-zero byte of the newest journal file.
fn allocated_past_entries(dir: &Path) -> u64 {
    let newest = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jnl"))
        .max_by_key(|p| {
            p.file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse::<u64>().ok())
        });
    let Some(path) = newest else {
        panic!("no journal file in {dir:?}");
    };
    let (Ok(bytes), Ok(meta)) = (std::fs::read(&path), std::fs::metadata(&path)) else {
        panic!("cannot read {path:?}");
    };
    let entries_end = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1) as u64;
    (meta.blocks() * 512).saturating_sub(entries_end)
}

#[test]
fn zeros_ahead_of_the_journal_file_lose_no_entry_across_restarts() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let rt = rt();
    let mut kept = Vec::new();
    let mut ahead = Vec::new();
    let mut events = 0;
    for round in 0..2u64 {
        let journal = open(dir.path());
        let far = unix_ms(journal.now()) + 3_600_000;
        // One at a time, as from one agent: each group small, past the last zeros many
        // times over (about 2.6 MB of entries, zeros 256 KiB at a time).
        let mut most = 0;
        for i in 0..400 {
            kept.push(rt.block_on(commit_noise(&journal, round << 32 | i, 5000, far)));
            if i % 10 == 9 {
                most = most.max(allocated_past_entries(dir.path()));
            }
        }
        ahead.push(most);
        events = journal.verify().map_or(0, |r| r.events);
        drop(journal);
    }
    // The first file was fjall's new, sparse one; after the restart fjall appends to it and
    // gets no zeros. Off ext4 there are none at all.
    let first = match crate::journal::prefill::dir_on_ext4(dir.path()) {
        true => 128 << 10..u64::MAX,
        false => 0..16 << 10,
    };
    assert!(
        first.contains(&ahead[0]),
        "allocated past the entries: {ahead:?}"
    );
    assert!(ahead[1] < 16 << 10, "allocated past the entries: {ahead:?}");
    let journal = open(dir.path());
    for (id, body) in &kept {
        let Ok(Some(result)) = journal.result(id) else {
            panic!("{id}: no result after the restart");
        };
        let Payload::Http(http) = result.payload else {
            panic!("{id}: not an HTTP result");
        };
        assert_eq!(
            http.body_base64.as_deref().and_then(unb64),
            Some(body.clone())
        );
    }
    let Ok(report) = journal.verify() else {
        panic!("the chain cannot be walked");
    };
    assert!(report.ok, "{report:?}");
    // Recovery adds its own events for the invocations left open; none went missing.
    assert!(
        events > 0 && report.events >= events,
        "{events} then {report:?}"
    );
}
