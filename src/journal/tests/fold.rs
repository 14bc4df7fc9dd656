//! An open invocation's index runs are held in memory and written as one row when it
//! settles; after a crash they are found again from the events.

use super::*;

fn kinds(journal: &Journal, id: &str) -> Vec<(u64, EventKind)> {
    let events = journal.events(id).unwrap_or_default();
    events.iter().map(|e| (e.seq, e.kind)).collect()
}

fn sent() -> Draft {
    Draft::observed(Body::RequestSent(RequestSent::default())).hop("origin")
}

fn delivered() -> Draft {
    Draft::observed(Body::ResultDelivered(Delivered::default()))
}

fn store_in(dir: &Path, window: u64) -> Arc<FjallStore> {
    for _ in 0..100 {
        if let Ok(store) = FjallStore::open_folding_within(dir, window) {
            return Arc::new(store);
        }
        // A dropped journal's threads may still hold the lock for a moment.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    match FjallStore::open_folding_within(dir, window) {
        Ok(store) => Arc::new(store),
        Err(e) => panic!("store: {e}"),
    }
}

fn journal_on(store: &Arc<FjallStore>) -> (Journal, RecoveryReport) {
    match Journal::with_store(store.clone(), JournalOptions::default()) {
        Ok(j) => j,
        Err(e) => panic!("journal: {e}"),
    }
}

/// Two invocations written in turns: each one's events are several runs.
fn interleaved(journal: &Journal, a: &str, b: &str) {
    let rt = rt();
    let r = rt.block_on(async {
        for id in [a, b] {
            journal
                .append(id, vec![accepted("POST"), preflight(false)])
                .await?;
        }
        for id in [a, b] {
            journal.append(id, vec![dispatch()]).await?;
        }
        for id in [a, b] {
            journal.append(id, vec![sent()]).await?;
        }
        Ok::<_, JournalError>(())
    });
    assert!(r.is_ok(), "{r:?}");
}

#[test]
fn a_settled_invocation_is_one_index_row_and_reads_back_whole() {
    let dir = temp_dir();
    let store = store_in(dir.path(), 1 << 16);
    let (journal, _) = journal_on(&store);
    let (a, b) = (new_invocation_id(), new_invocation_id());
    interleaved(&journal, &a, &b);
    let open = kinds(&journal, &a);
    assert_eq!(open.len(), 4, "{open:?}");
    assert_eq!(store.index_rows(&a), 0, "open: its runs are held");
    let (draft, result) = committed(&a, journal.result_expiry_ms());
    let r = rt().block_on(async {
        journal.commit_result(&a, vec![draft], result).await?;
        journal.append(&a, vec![delivered()]).await
    });
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(store.index_rows(&a), 1, "settled: one row");
    let settled = kinds(&journal, &a);
    assert_eq!(settled.len(), 6, "{settled:?}");
    assert_eq!(settled[..4], open[..]);
    assert_eq!(
        journal.record(&a).ok().flatten().map(|r| r.outcome),
        Some(Outcome::Committed)
    );
    drop(journal);
    drop(store);
    let store = store_in(dir.path(), 1 << 16);
    let (journal, report) = journal_on(&store);
    assert_eq!(kinds(&journal, &a), settled, "after a restart");
    assert_eq!(report.recovered.len(), 1, "only b was open: {report:?}");
}

#[test]
fn after_a_crash_the_held_runs_of_open_invocations_are_found_again() {
    let dir = temp_dir();
    let (a, b) = (new_invocation_id(), new_invocation_id());
    let before = {
        let store = store_in(dir.path(), 1 << 16);
        let (journal, _) = journal_on(&store);
        interleaved(&journal, &a, &b);
        // Dropped without settling them: what was held in memory is gone.
        (kinds(&journal, &a), kinds(&journal, &b))
    };
    let store = store_in(dir.path(), 1 << 16);
    let (journal, report) = journal_on(&store);
    let mut recovered: Vec<&str> = report.recovered.iter().map(|(id, _)| id.as_str()).collect();
    recovered.sort_unstable();
    let mut both = vec![a.as_str(), b.as_str()];
    both.sort_unstable();
    assert_eq!(recovered, both);
    for (id, was) in [(&a, &before.0), (&b, &before.1)] {
        let now = kinds(&journal, id);
        assert_eq!(now[..was.len()], was[..], "{id}");
        assert_eq!(now.last().map(|e| e.1), Some(EventKind::Failed));
        let record = journal.record(id).ok().flatten();
        assert_eq!(record.and_then(|r| r.code), Some(Code::BrokerRestarted));
        assert_eq!(store.index_rows(id), 1, "settled by recovery: one row");
    }
}

#[test]
fn an_invocation_open_past_the_window_is_indexed_and_still_found_after_a_crash() {
    let dir = temp_dir();
    let (long, other) = (new_invocation_id(), new_invocation_id());
    let before = {
        let store = store_in(dir.path(), 8);
        let (journal, _) = journal_on(&store);
        let rt = rt();
        let r = rt.block_on(async {
            journal
                .append(&long, vec![accepted("POST"), preflight(false)])
                .await?;
            for _ in 0..10 {
                let id = new_invocation_id();
                journal
                    .append(&id, vec![accepted("GET"), preflight(true)])
                    .await?;
            }
            journal.append(&long, vec![dispatch()]).await?;
            journal
                .append(&other, vec![accepted("GET"), preflight(true)])
                .await?;
            journal.append(&long, vec![sent()]).await
        });
        assert!(r.is_ok(), "{r:?}");
        assert!(store.index_rows(&long) >= 1, "past the window: indexed");
        kinds(&journal, &long)
    };
    assert_eq!(before.len(), 4, "{before:?}");
    let store = store_in(dir.path(), 8);
    let (journal, report) = journal_on(&store);
    assert!(report.recovered.iter().any(|(id, _)| id == &long));
    let now = kinds(&journal, &long);
    assert_eq!(now[..before.len()], before[..]);
    assert_eq!(now.len(), before.len() + 1, "{now:?}");
}
