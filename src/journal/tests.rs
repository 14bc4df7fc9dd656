//! The journal over a real fjall store in a temp dir.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::contract::{Completion, Outcome, Phase, Retry};

fn open(dir: &Path) -> Journal {
    open_for_test(dir, JournalOptions::default()).0
}

fn accepted(method: &str) -> Draft {
    Draft::observed(Body::ActionAccepted(Accepted {
        agent: "ci".into(),
        protocol: Protocol::Https,
        method: Some(method.into()),
        target: "https://api.test/x".into(),
        command: None,
    }))
}

fn preflight(idempotent: bool) -> Draft {
    Draft::observed(Body::PreflightValidated(Preflight {
        route: "r".into(),
        fingerprint: "sha256:f".into(),
        idempotent,
        credential: None,
        idempotency: None,
        safe_until_ms: None,
        retry_budget: None,
        credential_placeholder: false,
        resend: None,
    }))
}

fn dispatch() -> Draft {
    Draft::observed(Body::DispatchStarted(Dispatch::default())).hop("origin")
}

fn committed(id: &str, expires_at_ms: i64) -> (Draft, StoredResult) {
    let draft = Draft::observed(Body::ResultCommitted(ResultCommitted {
        outcome: Outcome::Committed,
        retry: Retry::Never,
        status: Some(201),
        exit_status: None,
        exit_signal: None,
        grpc_status: None,
        digest: sha256_tagged(b"hi"),
        bytes: 2,
        complete: true,
        completion: Some(Completion::ContentLength),
        evidence: serde_json::Map::new(),
    }))
    .source(Source::RemoteResponse)
    .hop("origin");
    let result = StoredResult {
        invocation_id: id.into(),
        outcome: Outcome::Committed,
        payload: Payload::Http(HttpResult {
            status: 201,
            headers: vec![],
            body_base64: Some(b64(b"hi")),
            body_stored: true,
            digest: sha256_tagged(b"hi"),
            bytes: 2,
            grpc_status: None,
            trailers: vec![],
        }),
        complete: true,
        expires_at_ms,
    };
    (draft, result)
}

/// Opens `id`, dispatches it and commits `result` with `draft`.
fn dispatch_and_commit(journal: &Journal, id: &str, draft: Draft, result: StoredResult) {
    let committed = rt().block_on(async {
        journal
            .append(id, vec![accepted("POST"), preflight(false), dispatch()])
            .await?;
        journal.commit_result(id, vec![draft], result).await
    });
    assert!(committed.is_ok(), "{committed:?}");
}

fn rt() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    }
}

#[test]
fn concurrent_appends_share_syncs_and_keep_one_unbroken_chain() {
    let dir = tempfile::tempdir().ok();
    let Some(dir) = dir else { return };
    let journal = open(dir.path());
    let rt = rt();
    let n = 200;
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..n {
            let j = journal.clone();
            tasks.push(tokio::spawn(async move {
                let id = new_invocation_id();
                j.append(&id, vec![accepted("POST"), preflight(false)])
                    .await?;
                j.append(&id, vec![dispatch()]).await
            }));
        }
        for t in tasks {
            let r = t.await.map_err(|e| e.to_string());
            assert!(matches!(r, Ok(Ok(_))), "{r:?}");
        }
    });
    let syncs = journal.metrics().syncs.get();
    assert!(syncs >= 1 && syncs < n, "{n} dispatches used {syncs} syncs");
    assert_eq!(journal.metrics().events.get(), 3 * n);
    let report = journal.verify().ok();
    assert!(
        report.as_ref().is_some_and(|r| r.ok && r.events == 3 * n),
        "{report:?}"
    );
}

#[test]
fn a_refused_append_writes_nothing_and_leaves_the_chain_whole() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let journal = open(dir.path());
    let id = new_invocation_id();
    let ok = journal.append_blocking(&id, vec![accepted("POST"), preflight(false), dispatch()]);
    assert!(ok.is_ok());
    let refused = journal.append_blocking(
        &id,
        vec![Draft::observed(Body::Failed(Failure::of(Code::DnsError)))],
    );
    assert_eq!(
        refused.err(),
        Some(JournalError::Refused(Refusal::NotAttemptedAfterDispatch(
            Code::DnsError
        )))
    );
    let next = journal.append_blocking(
        &id,
        vec![Draft::observed(Body::Failed(Failure::of(
            Code::RemoteTimeout,
        )))],
    );
    assert!(next.as_ref().is_ok_and(|a| a.seqs == vec![4]), "{next:?}");
    assert!(journal.verify().is_ok_and(|r| r.ok && r.events == 4));
    let record = journal.record(&id).ok().flatten();
    assert!(record.is_some_and(|r| r.outcome == Outcome::Unknown
        && r.code == Some(Code::RemoteTimeout)
        && r.retry == Retry::Reconcile));
}

#[test]
fn the_result_is_committed_with_its_resolving_event() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let journal = open(dir.path());
    let id = new_invocation_id();
    let (draft, result) = committed(&id, journal.result_expiry_ms());
    dispatch_and_commit(&journal, &id, draft, result.clone());
    assert_eq!(journal.result(&id).ok().flatten(), Some(result));
    let r = journal.record(&id).ok().flatten();
    assert!(r.is_some_and(|r| {
        r.outcome == Outcome::Committed
            && r.code.is_none()
            && r.result
                .is_some_and(|s| s.status == Some(201) && s.bytes == 2)
    }));
}

#[test]
fn the_listing_merges_live_and_settled_records_newest_first() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let journal = open(dir.path());
    let rt = rt();
    let ids: Vec<String> = (0..5).map(|_| new_invocation_id()).collect();
    let appended = rt.block_on(async {
        for (n, id) in ids.iter().enumerate() {
            journal.append(id, vec![accepted("GET")]).await?;
            if n % 2 == 0 {
                let (draft, result) = committed(id, journal.result_expiry_ms());
                let drafts = vec![preflight(true), dispatch(), draft];
                journal.commit_result(id, drafts, result).await?;
            }
        }
        Ok::<_, JournalError>(())
    });
    assert!(appended.is_ok(), "{appended:?}");
    let listed = |before: Option<&str>, limit| -> Vec<String> {
        let records = journal.records_before(before, limit).unwrap_or_default();
        records.into_iter().map(|r| r.invocation_id).collect()
    };
    // Ids order the listing (ids made in one millisecond need not be in creation order).
    let mut newest_first = ids.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(listed(None, 10), newest_first, "live ones are listed too");
    assert_eq!(listed(None, 2), newest_first[..2]);
    assert_eq!(listed(Some(&newest_first[1]), 2), newest_first[2..4]);
    // A live record is current, a settled one is read back from the store.
    let open = journal.record(&ids[1]).ok().flatten();
    assert!(open.is_some_and(|r| r.outcome == Outcome::NotAttempted));
    let settled = journal.record(&ids[2]).ok().flatten();
    assert!(settled.is_some_and(|r| r.outcome == Outcome::Committed));
}

#[test]
fn expired_results_are_removed_and_the_record_stays() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let journal = open(dir.path());
    let id = new_invocation_id();
    let rt = rt();
    let (draft, result) = committed(&id, 1);
    let removed = rt.block_on(async {
        journal
            .append(&id, vec![accepted("POST"), preflight(false), dispatch()])
            .await?;
        journal.commit_result(&id, vec![draft], result).await?;
        journal.expire_results().await
    });
    assert_eq!(removed, Ok(1));
    assert_eq!(journal.result(&id).ok().flatten(), None);
    assert!(journal.record(&id).ok().flatten().is_some());
}

#[test]
fn one_sweep_removes_every_expired_result_however_many() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let journal = open(dir.path());
    let rt = rt();
    // More than two batches of a sweep, and one result still kept.
    let many = 2 * sweep::SWEEP_BATCH + 100;
    let far = unix_ms(journal.now()) + 3_600_000;
    let kept = rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..=many {
            let j = journal.clone();
            let expires = if n < many { 1 } else { far };
            tasks.spawn(async move {
                let id = new_invocation_id();
                let (draft, result) = committed(&id, expires);
                j.append(&id, vec![accepted("POST"), preflight(false), dispatch()])
                    .await?;
                j.commit_result(&id, vec![draft], result).await?;
                Ok::<_, JournalError>((id, expires))
            });
        }
        let mut kept = None;
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(Ok((id, expires))) if expires == far => kept = Some(id),
                Ok(Ok(_)) => {}
                other => panic!("{other:?}"),
            }
        }
        kept
    });
    assert_eq!(rt.block_on(journal.expire_results()), Ok(many));
    let now = unix_ms(journal.now());
    let due = journal.store.expired_results(now, None, usize::MAX);
    assert_eq!(due.map(|d| d.len()), Ok(0), "no expired result is left");
    let Some(kept) = kept else {
        panic!("no kept result")
    };
    assert!(journal.result(&kept).is_ok_and(|r| r.is_some()));
}

#[test]
fn a_result_past_its_retention_is_not_served_before_the_sweep() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let journal = open(dir.path());
    let (gone, kept) = (new_invocation_id(), new_invocation_id());
    let rt = rt();
    let far = unix_ms(journal.now()) + 3_600_000;
    for (id, expires) in [(&gone, 1), (&kept, far)] {
        let (draft, result) = committed(id, expires);
        let stored = rt.block_on(async {
            journal
                .append(id, vec![accepted("POST"), preflight(false), dispatch()])
                .await?;
            journal.commit_result(id, vec![draft], result).await
        });
        assert!(stored.is_ok());
    }
    assert_eq!(journal.result(&gone).ok().flatten(), None);
    assert!(journal.result(&kept).ok().flatten().is_some());
}

/// Enough results to rotate memtables and compact tables many times over (2 MiB
/// memtables, 4 MiB tables, one background worker): nothing may go missing.
#[test]
fn every_record_and_result_survives_flushes_compactions_and_a_restart() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    const N: usize = 1200;
    let body = b64(&[b'r'; 16 << 10]);
    let options = || JournalOptions {
        durability: Durability::Buffered,
        ..JournalOptions::default()
    };
    let ids: Vec<String> = (0..N).map(|_| new_invocation_id()).collect();
    {
        let Ok((journal, _)) = Journal::open(dir.path(), options()) else {
            panic!("open");
        };
        let rt = rt();
        let written = rt.block_on(async {
            for chunk in ids.chunks(64) {
                let mut tasks = Vec::new();
                for id in chunk {
                    let (journal, id, body) = (journal.clone(), id.clone(), body.clone());
                    tasks.push(tokio::spawn(async move {
                        let (draft, mut result) = committed(&id, journal.result_expiry_ms());
                        if let Payload::Http(h) = &mut result.payload {
                            h.body_base64 = Some(body);
                        }
                        let drafts = vec![accepted("POST"), preflight(false), dispatch()];
                        journal.append(&id, drafts).await?;
                        journal.commit_result(&id, vec![draft], result).await?;
                        let delivered = Body::ResultDelivered(Delivered::default());
                        journal.append(&id, vec![Draft::observed(delivered)]).await
                    }));
                }
                for t in tasks {
                    t.await.map_err(|_| JournalError::Unavailable)??;
                }
            }
            journal.flush().await?;
            // fjall flushes memtables in the background: on a loaded machine it may lag.
            let keyspaces = dir.path().join("keyspaces");
            for _ in 0..100 {
                if count_tables(&keyspaces) >= 6 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Ok::<(), JournalError>(())
        });
        assert_eq!(written, Ok(()));
    }
    let tables = count_tables(&dir.path().join("keyspaces"));
    assert!(
        tables >= 6,
        "only {tables} tables: the load never left the memtables"
    );
    let (journal, report) = open_for_test(dir.path(), options());
    assert!(report.recovered.is_empty());
    let audit = journal.verify().ok();
    assert!(audit.is_some_and(|a| a.ok && a.events == (N * 5) as u64));
    for id in &ids {
        let record = journal.record(id).ok().flatten();
        assert!(
            record.is_some_and(|r| r.outcome == Outcome::Committed),
            "{id}"
        );
        let result = journal.result(id).ok().flatten();
        assert!(
            result.is_some_and(|r| matches!(&r.payload, Payload::Http(h) if h.body_base64.as_ref().is_some_and(|b| b.len() == body.len()))),
            "{id}"
        );
    }
    let listed = journal.records_before(None, N + 10).unwrap_or_default();
    assert_eq!(listed.len(), N);
}

/// Table files under every keyspace's `tables` directory.
fn count_tables(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let in_tables = dir.file_name().is_some_and(|n| n == "tables");
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => count_tables(&e.path()),
            _ => usize::from(in_tables),
        })
        .sum()
}

#[test]
fn the_sync_rule_matches_the_spec() {
    use EventKind::*;
    let waits = [
        DispatchStarted,
        ResultCommitted,
        RetryLeased,
        Reconciled,
        ApprovalGranted,
        ApprovalDenied,
    ];
    for &k in EventKind::ALL {
        let expect = waits.contains(&k);
        assert_eq!(needs_sync_rule(k, false), expect, "{k:?} before dispatch");
        assert_eq!(
            needs_sync_rule(k, true),
            expect || k == Failed,
            "{k:?} after dispatch"
        );
    }
}

/// A real fjall store whose sync (or a write carrying a result) can be made to fail, as a
/// dying disk would.
struct FailingSync {
    inner: FjallStore,
    fail: AtomicBool,
    fail_result_writes: AtomicBool,
}

impl FailingSync {
    fn open(dir: &Path) -> Option<Arc<Self>> {
        Some(Arc::new(Self {
            inner: FjallStore::open(dir).ok()?,
            fail: AtomicBool::new(false),
            fail_result_writes: AtomicBool::new(false),
        }))
    }
}

impl EventStore for FailingSync {
    fn write(&self, set: WriteSet) -> Result<(), StoreError> {
        if self.fail_result_writes.load(Ordering::SeqCst) && !set.results.is_empty() {
            return Err(StoreError::Io("write: ENOSPC".into()));
        }
        self.inner.write(set)
    }
    fn sync(&self) -> Result<(), StoreError> {
        if self.fail.load(Ordering::SeqCst) {
            Err(StoreError::Io("fdatasync: EIO".into()))
        } else {
            self.inner.sync()
        }
    }
    fn head(&self) -> Result<Option<Event>, StoreError> {
        self.inner.head()
    }
    fn raw_events(&self, from: u64, limit: usize) -> Result<Vec<RawEvent>, StoreError> {
        self.inner.raw_events(from, limit)
    }
    fn runs_of(&self, id: &str) -> Result<Vec<super::store::Run>, StoreError> {
        self.inner.runs_of(id)
    }
    fn checkpoint(&self) -> Result<Option<super::Checkpoint>, StoreError> {
        self.inner.checkpoint()
    }
    fn islands(&self) -> Result<Vec<Event>, StoreError> {
        self.inner.islands()
    }
    fn stored_row(&self, id: &str) -> Result<Option<super::store::StoredRow>, StoreError> {
        self.inner.stored_row(id)
    }
    fn islands_of(&self, invocation_id: &str) -> Result<Vec<Event>, StoreError> {
        self.inner.islands_of(invocation_id)
    }
    fn events_of(&self, id: &str) -> Result<Vec<Event>, StoreError> {
        self.inner.events_of(id)
    }
    fn state(&self, id: &str) -> Result<Option<State>, StoreError> {
        self.inner.state(id)
    }
    fn states_before(&self, before: Option<&str>, limit: usize) -> Result<Vec<State>, StoreError> {
        self.inner.states_before(before, limit)
    }
    fn open_invocations(&self) -> Result<Vec<String>, StoreError> {
        self.inner.open_invocations()
    }
    fn result(&self, id: &str) -> Result<Option<StoredResult>, StoreError> {
        self.inner.result(id)
    }
    fn request(&self, id: &str) -> Result<Option<StoredRequest>, StoreError> {
        self.inner.request(id)
    }
    fn expired_results(
        &self,
        now_ms: i64,
        after: Option<&(i64, String)>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        self.inner.expired_results(now_ms, after, limit)
    }
    fn key_entry(&self, index_key: &[u8]) -> Result<Option<super::KeyEntry>, StoreError> {
        self.inner.key_entry(index_key)
    }
    fn expired_keys(
        &self,
        now_ms: i64,
        after: Option<&(i64, Vec<u8>)>,
        limit: usize,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        self.inner.expired_keys(now_ms, after, limit)
    }
    fn twin_entry(&self, index_key: &[u8]) -> Result<Option<super::TwinEntry>, StoreError> {
        self.inner.twin_entry(index_key)
    }
    fn expired_twins(
        &self,
        now_ms: i64,
        after: Option<&(i64, Vec<u8>)>,
        limit: usize,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        self.inner.expired_twins(now_ms, after, limit)
    }
    fn index_entries(&self) -> super::IndexEntries {
        self.inner.index_entries()
    }
    fn suspensions(&self) -> Result<Vec<super::Suspension>, StoreError> {
        self.inner.suspensions()
    }
}

#[test]
fn a_failed_sync_stops_the_journal_and_refuses_dispatch() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let Some(store) = FailingSync::open(dir.path()) else {
        return;
    };
    let Ok((journal, _)) = Journal::with_store(store.clone(), JournalOptions::default()) else {
        return;
    };
    let id = new_invocation_id();
    assert!(
        journal
            .append_blocking(&id, vec![accepted("POST"), preflight(false)])
            .is_ok()
    );
    assert_eq!(journal.admit(), Ok(()));
    store.fail.store(true, Ordering::SeqCst);
    let r = journal.append_blocking(&id, vec![dispatch()]);
    assert_eq!(r.err(), Some(JournalError::Unavailable));
    assert!(journal.health().is_fatal());
    assert_eq!(journal.admit(), Err(Code::JournalUnavailable));
    let later = journal.append_blocking(&new_invocation_id(), vec![accepted("GET")]);
    assert_eq!(later.err(), Some(JournalError::Unavailable));
}

fn guard(dir: &Path, min_free_bytes: u64) -> SpaceGuard {
    SpaceGuard {
        dir: dir.to_path_buf(),
        reserve_bytes: 1 << 20,
        min_free_bytes,
        interval: std::time::Duration::from_secs(60),
    }
}

/// Bytes the file really holds on disk.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

#[test]
fn low_free_space_releases_the_reserve_and_refuses_new_dispatches() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let health = Health::default();
    let reserve = dir.path().join("reserve.bin");
    guard(dir.path(), 1).check(&health);
    assert!(!health.refusing_dispatch());
    // A sparse file (Blocks 0) would free nothing when released.
    assert!(
        allocated(&reserve) >= 1 << 20,
        "reserve holds {} bytes on disk",
        allocated(&reserve)
    );
    guard(dir.path(), u64::MAX / 2).check_low(&health);
    assert!(health.refusing_dispatch());
    assert!(!reserve.exists());
    // Only the timer resumes, once the threshold and a fresh reserve fit.
    guard(dir.path(), 1).check_low(&health);
    assert!(health.refusing_dispatch());
    guard(dir.path(), 1).check(&health);
    assert!(!health.refusing_dispatch());
    assert!(allocated(&reserve) >= 1 << 20);
}

#[test]
fn a_sparse_reserve_left_by_an_older_postern_is_allocated_at_start() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let reserve = dir.path().join("reserve.bin");
    let made = std::fs::File::create(&reserve).and_then(|f| f.set_len(1 << 20));
    assert!(made.is_ok());
    guard(dir.path(), 1).check(&Health::default());
    assert!(allocated(&reserve) >= 1 << 20);
}

#[test]
fn while_low_on_space_no_new_invocation_is_written_and_those_in_flight_resolve() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let journal = open(dir.path());
    let id = new_invocation_id();
    let started =
        journal.append_blocking(&id, vec![accepted("POST"), preflight(false), dispatch()]);
    assert!(started.is_ok());
    journal.health().set_low_space(true);
    let events = journal.metrics().events.get();
    let refused = journal.append_blocking(
        &new_invocation_id(),
        vec![
            accepted("GET"),
            Draft::observed(Body::Failed(Failure::of(Code::RouteDenied))),
        ],
    );
    assert_eq!(refused.err(), Some(JournalError::Unavailable));
    assert_eq!(
        journal.metrics().events.get(),
        events,
        "a refusal was written"
    );
    assert_eq!(journal.metrics().unrecorded_refusals.get(), 1);
    let failed = Draft::observed(Body::Failed(Failure::of(Code::RemoteTimeout)));
    assert!(journal.append_blocking(&id, vec![failed]).is_ok());
    assert!(!journal.health().is_fatal());
}

mod bodies;
mod fold;
mod recovery;
mod suspensions;
mod zeros_ahead;

#[test]
fn a_daemon_note_is_chained_between_invocations_and_survives_a_restart() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("no temp dir");
    };
    let note = || {
        Draft::observed(Body::ConfigReloaded(ConfigReload {
            result: "applied".into(),
            changes: serde_json::json!({"routes": {"added": ["b"]}}),
            problems: vec![],
        }))
        .source(Source::OperatorAttested)
    };
    let id = new_invocation_id();
    {
        let journal = open(dir.path());
        assert!(journal.append_blocking(&id, vec![accepted("POST")]).is_ok());
        let seq = rt().block_on(journal.note("rld_1", note()));
        assert_eq!(seq, Ok(2));
        // The note is no invocation: nothing projects it, and it cannot start one.
        assert!(journal.record("rld_1").is_ok_and(|r| r.is_none()));
        let refused = journal.append_blocking("rld_2", vec![note()]);
        assert_eq!(
            refused.err(),
            Some(JournalError::Refused(Refusal::UnknownInvocation))
        );
    }
    // Recovery closes the open invocation (seq 3); the chain goes on past the note.
    let journal = open(dir.path());
    let next = journal.append_blocking(&new_invocation_id(), vec![accepted("GET")]);
    assert!(next.as_ref().is_ok_and(|a| a.seqs == vec![4]), "{next:?}");
    assert!(journal.verify().is_ok_and(|r| r.ok && r.events == 4));
    let events = journal.events("rld_1").unwrap_or_default();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, EventKind::ConfigReloaded);
}

fn temp_dir() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("no temp dir: {e}"),
    }
}

fn open_pruning(dir: &Path) -> Journal {
    let options = JournalOptions {
        event_retention_ms: 0,
        ..JournalOptions::default()
    };
    open_for_test(dir, options).0
}

/// Settles one invocation with a committed result (kept an hour).
async fn settled(journal: &Journal) -> Result<String, JournalError> {
    let id = new_invocation_id();
    journal
        .append(&id, vec![accepted("POST"), preflight(false), dispatch()])
        .await?;
    let (draft, result) = committed(&id, unix_ms(journal.now()) + 3_600_000);
    journal.commit_result(&id, vec![draft], result).await?;
    let delivered = Draft::observed(Body::ResultDelivered(Delivered::default()));
    journal.append(&id, vec![delivered]).await?;
    Ok(id)
}

/// Events written in this millisecond are not older than a zero retention yet.
fn let_them_age() {
    std::thread::sleep(std::time::Duration::from_millis(5));
}

#[test]
fn retention_passes_a_live_record_and_keeps_its_events_aside_until_it_settles() {
    let dir = temp_dir();
    let rt = rt();
    let (a, b, open_one, d) =
        {
            let journal = open_pruning(dir.path());
            let ids = rt.block_on(async {
                let a = settled(&journal).await?;
                let b = settled(&journal).await?;
                let open_one = new_invocation_id();
                journal.append(&open_one, vec![accepted("GET")]).await?;
                let d = settled(&journal).await?;
                Ok::<_, JournalError>((a, b, open_one, d))
            });
            let Ok((a, b, open_one, d)) = ids else {
                panic!("appends: {ids:?}")
            };
            let_them_age();
            // The cut goes past the open invocation (issue 40: one long relay held every
            // agent's retention back); its event (seq 11) is kept aside.
            assert_eq!(rt.block_on(journal.prune_events()), Ok(16));
            for gone in [&a, &b, &d] {
                assert!(journal.record(gone).is_ok_and(|r| r.is_none()), "{gone}");
                assert!(journal.events(gone).is_ok_and(|e| e.is_empty()));
            }
            assert!(journal.record(&open_one).is_ok_and(|r| r.is_some()));
            let kept = journal.events(&open_one).unwrap_or_default();
            assert_eq!(kept.iter().map(|e| e.seq).collect::<Vec<_>>(), [11]);
            let report = journal.verify();
            let Ok(report) = report else {
                panic!("verify: {report:?}")
            };
            assert!(report.ok, "{report:?}");
            assert_eq!((report.from_seq, report.events, report.islands), (17, 1, 1));
            assert!(report.checkpoint.as_ref().is_some_and(|c| c.seq == 16
                && c.events == 16
                && c.records == 3
                && c.islands == 1));
            (a, b, open_one, d)
        };
    let _ = (a, b, d);
    // After a restart recovery replays the open one from its kept event and settles it; the
    // next cut takes its last events and what was kept aside.
    let journal = open_pruning(dir.path());
    let recovered = journal.events(&open_one).unwrap_or_default();
    assert_eq!(recovered.len(), 2, "{recovered:?}");
    assert!(journal.verify().is_ok_and(|r| r.ok && r.from_seq == 17));
    let_them_age();
    assert_eq!(
        rt.block_on(journal.prune_events()),
        Ok(2),
        "the note, the recovery"
    );
    assert!(journal.record(&open_one).is_ok_and(|r| r.is_none()));
    let report = journal.verify();
    assert!(
        report
            .as_ref()
            .is_ok_and(|r| r.ok && r.from_seq == 19 && r.events == 1 && r.islands == 0),
        "{report:?}"
    );
    let_them_age();
    // A cut of the last cut's note alone would only chain another: a quiet journal rests.
    assert_eq!(rt.block_on(journal.prune_events()), Ok(0));
    assert!(journal.verify().is_ok_and(|r| r.ok && r.from_seq == 19));
}

/// A record that just settled is read from memory, and reads the same as its events
/// replayed from the store. A cut that takes it makes the store answer again.
#[test]
fn a_settled_record_read_from_memory_is_what_its_events_replay_to() {
    let dir = temp_dir();
    let rt = rt();
    let journal = open_pruning(dir.path());
    let id = match rt.block_on(settled(&journal)) {
        Ok(id) => id,
        Err(e) => panic!("settle: {e:?}"),
    };
    assert!(journal.settled.get(&id).is_some(), "kept in memory");
    let from_memory = journal.state(&id).ok().flatten();
    assert!(from_memory.as_ref().is_some_and(|s| s.progress.closed));
    assert_eq!(from_memory, journal.store.state(&id).ok().flatten());
    let_them_age();
    assert!(rt.block_on(journal.prune_events()).is_ok_and(|n| n > 0));
    assert!(journal.settled.get(&id).is_none(), "forgotten by the cut");
    assert_eq!(journal.state(&id).ok().flatten(), None);
}

/// Issue 40: retention took the events of `unknown` records still waiting for
/// reconciliation (`/events` said not found). They are kept aside until reconciled.
#[test]
fn an_unknown_record_keeps_its_evidence_until_it_is_reconciled() {
    let dir = temp_dir();
    let rt = rt();
    let journal = open_pruning(dir.path());
    let id = new_invocation_id();
    let lost = Draft::observed(Body::Failed(Failure::of(Code::RemoteOutcomeUnknown)));
    let written = rt.block_on(journal.append(
        &id,
        vec![accepted("POST"), preflight(false), dispatch(), lost],
    ));
    assert!(written.is_ok(), "{written:?}");
    assert!(rt.block_on(settled(&journal)).is_ok());
    let_them_age();
    assert_eq!(rt.block_on(journal.prune_events()), Ok(9));
    let record = journal.record(&id).ok().flatten();
    assert!(record.is_some_and(|r| r.outcome == Outcome::Unknown));
    assert_eq!(journal.events(&id).unwrap_or_default().len(), 4);
    let report = journal.verify();
    assert!(
        report.as_ref().is_ok_and(|r| r.ok && r.islands == 4),
        "{report:?}"
    );
    // Reconciled: settled, and its evidence goes with its next events.
    let reconciled = Draft::observed(Body::Reconciled(Reconciliation {
        note: "the charge exists".into(),
        outcome: Outcome::Committed,
        unsafe_retry: None,
        via: None,
    }))
    .source(Source::OperatorAttested);
    assert!(rt.block_on(journal.append(&id, vec![reconciled])).is_ok());
    let_them_age();
    assert_eq!(rt.block_on(journal.prune_events()), Ok(2));
    assert!(journal.record(&id).is_ok_and(|r| r.is_none()));
    let report = journal.verify();
    assert!(
        report.as_ref().is_ok_and(|r| r.ok && r.islands == 0),
        "{report:?}"
    );
}

#[test]
fn a_record_an_idempotency_key_names_outlives_its_events_and_goes_with_the_key() {
    let dir = temp_dir();
    let journal = open_pruning(dir.path());
    let rt = rt();
    let id = new_invocation_id();
    let slot = KeySlot {
        scope: "payments".into(),
        agent: "ci".into(),
        key: "k1".into(),
    };
    let claim = |expires_at_ms| KeyClaim {
        slot: slot.clone(),
        entry: KeyEntry {
            invocation_id: id.clone(),
            fingerprint: "sha256:f".into(),
            expires_at_ms,
        },
    };
    let mut keyed = preflight(false);
    if let Body::PreflightValidated(p) = &mut keyed.body {
        p.idempotency = Some(crate::contract::IdempotencyEvidence {
            key: "k1".into(),
            scope: "payments".into(),
            fingerprint: "sha256:f".into(),
            remote_contract: "none".into(),
            safe_until: None,
        });
    }
    let failed = Draft::observed(Body::Failed(Failure::of(Code::DnsError)));
    let far = unix_ms(journal.now()) + 3_600_000;
    let written = rt.block_on(journal.append_claiming(
        &id,
        vec![accepted("POST"), keyed, failed],
        claim(far),
    ));
    assert!(written.is_ok(), "{written:?}");
    let_them_age();
    assert_eq!(rt.block_on(journal.prune_events()), Ok(3));
    assert!(journal.events(&id).is_ok_and(|e| e.is_empty()));
    let kept = journal.record(&id);
    assert!(kept.as_ref().is_ok_and(|r| r.is_some()), "{kept:?}");
    // Its history is gone: it cannot be replayed, so no new generation opens it.
    let lease = Draft::observed(Body::RetryLeased(Lease {
        generation: 2,
        ..Lease::default()
    }));
    let refused = rt.block_on(journal.append(&id, vec![lease]));
    assert_eq!(
        refused.err(),
        Some(JournalError::Refused(Refusal::LeaseRefused))
    );
    // The key runs out: the sweep takes the record with it.
    assert!(rt.block_on(journal.touch_key(claim(1))).is_ok());
    assert_eq!(rt.block_on(journal.expire_keys()).ok(), Some(1));
    assert!(journal.record(&id).is_ok_and(|r| r.is_none()));
    assert!(journal.verify().is_ok_and(|r| r.ok));
}

#[test]
fn a_checkpoint_no_journal_pruned_event_vouches_for_is_a_break() {
    let dir = temp_dir();
    let rt = rt();
    {
        let journal = open_pruning(dir.path());
        assert!(rt.block_on(settled(&journal)).is_ok());
        let_them_age();
        assert_eq!(rt.block_on(journal.prune_events()), Ok(5));
        assert!(rt.block_on(settled(&journal)).is_ok());
    }
    // Someone removes the note (seq 6) and the run 7..=9 behind a checkpoint whose hash
    // is right.
    let Ok(store) = FjallStore::open(dir.path()) else {
        panic!("store");
    };
    let events = store.raw_events(9, 1).unwrap_or_default();
    let Some(Ok(ninth)) = events.into_iter().next().map(|r| r.event) else {
        panic!("no seq 9");
    };
    let forged = Cut {
        checkpoint: Checkpoint {
            seq: 9,
            hash: ninth.hash,
            events: 4,
            records: 0,
            ..Checkpoint::default()
        },
        first_seq: 6,
        keys: vec![6, 7],
        runs: vec![],
        states: vec![],
        kept: vec![],
        islands: vec![],
        islands_released: vec![],
    };
    let written = store.write(WriteSet {
        cut: Some(forged),
        ..WriteSet::default()
    });
    assert!(written.is_ok(), "{written:?}");
    let report = verify(&store);
    assert!(
        report.as_ref().is_ok_and(|r| !r.ok
            && r.from_seq == 10
            && r.chain_break
                .as_ref()
                .is_some_and(|b| b.reason.contains("checkpoint not confirmed"))),
        "{report:?}"
    );
}

#[test]
fn a_record_that_does_not_read_back_stops_the_cut_and_not_postern() {
    let dir = temp_dir();
    let rt = rt();
    let id = {
        let journal = open_pruning(dir.path());
        let id = rt.block_on(settled(&journal));
        let Ok(id) = id else { panic!("{id:?}") };
        id
    };
    {
        let Ok(db) = fjall::Database::builder(dir.path()).open() else {
            panic!("open");
        };
        let Ok(states) = db.keyspace("states", fjall::KeyspaceCreateOptions::default) else {
            panic!("states");
        };
        assert!(states.insert(id.as_bytes(), b"\xB2damaged").is_ok());
        assert!(db.persist(fjall::PersistMode::SyncAll).is_ok());
    }
    let journal = open_pruning(dir.path());
    let_them_age();
    assert_eq!(rt.block_on(journal.prune_events()), Ok(0));
    // postern goes on: new work is still journaled.
    assert!(rt.block_on(settled(&journal)).is_ok());
    assert!(journal.verify().is_ok_and(|r| r.ok && r.from_seq == 1));
}
