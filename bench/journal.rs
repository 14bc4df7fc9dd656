//! Journal benchmark: durable appends/s and latency with group commit, against one
//! fdatasync per append on the same disk, and a bare `fdatasync` on a plain file.
//!
//! Run: `cargo bench --bench journal` (release build). All figures come from one run.
//! One "durable append" is one `Journal::append` carrying `ACTION_ACCEPTED` and
//! `DISPATCH_STARTED`, acked only after its fdatasync.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fjall::{Database, KeyspaceCreateOptions, PersistMode};
use postern::journal::{
    Accepted, Body, Dispatch, Draft, Journal, JournalOptions, Protocol, new_invocation_id,
};

const RUN: Duration = Duration::from_millis(1500);
const LEVELS: [usize; 4] = [1, 16, 64, 256];

struct Stats {
    count: usize,
    per_sec: f64,
    p50: Duration,
    p99: Duration,
}

fn stats(mut lat: Vec<Duration>, took: Duration) -> Stats {
    lat.sort();
    let at = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    Stats {
        count: lat.len(),
        per_sec: lat.len() as f64 / took.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn drafts() -> Vec<Draft> {
    vec![
        Draft::observed(Body::ActionAccepted(Accepted {
            agent: "bench".into(),
            protocol: Protocol::Https,
            method: Some("POST".into()),
            target: "https://bench.invalid/v1/payments".into(),
            command: None,
        })),
        Draft::observed(Body::DispatchStarted(Dispatch::default())).hop("origin"),
    ]
}

fn group_commit(rt: &tokio::runtime::Runtime, journal: &Journal, concurrency: usize) -> Stats {
    let started = Instant::now();
    let deadline = started + RUN;
    let lat = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..concurrency {
            let j = journal.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    j.append(&new_invocation_id(), drafts())
                        .await
                        .expect("append");
                    lat.push(t.elapsed());
                }
                lat
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("task"));
        }
        all
    });
    stats(lat, started.elapsed())
}

/// The same event bytes, one fdatasync per append (fjall, same disk).
fn sync_per_append(dir: &std::path::Path, concurrency: usize) -> Stats {
    let db = Database::builder(dir)
        .manual_journal_persist(true)
        .open()
        .expect("db");
    let ks = db
        .keyspace("events", KeyspaceCreateOptions::default)
        .expect("ks");
    let value = vec![b'x'; 600];
    let lat = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let deadline = started + RUN;
    std::thread::scope(|s| {
        for t in 0..concurrency {
            let (db, ks, value, lat) = (db.clone(), ks.clone(), value.clone(), lat.clone());
            s.spawn(move || {
                let mut mine = Vec::new();
                let mut n: u64 = 0;
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    n += 1;
                    let key = ((t as u64) << 40 | n).to_be_bytes();
                    ks.insert(key, value.clone()).expect("insert");
                    db.persist(PersistMode::SyncData).expect("sync");
                    mine.push(t0.elapsed());
                }
                lat.lock().unwrap().extend(mine);
            });
        }
    });
    let lat = std::mem::take(&mut *lat.lock().unwrap());
    stats(lat, started.elapsed())
}

fn bare_fdatasync(dir: &std::path::Path) -> Stats {
    let mut f = std::fs::File::create(dir.join("bare.log")).expect("file");
    let record = vec![b'x'; 600];
    let mut lat = Vec::new();
    let started = Instant::now();
    while started.elapsed() < RUN {
        let t = Instant::now();
        f.write_all(&record).expect("write");
        f.sync_data().expect("fdatasync");
        lat.push(t.elapsed());
    }
    stats(lat, started.elapsed())
}

fn us(d: Duration) -> String {
    format!("{:.0}µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    let base = tempfile::tempdir().expect("tempdir");
    // `cargo bench --bench journal -- profile`: group commit at 64 only, for perf.
    if std::env::args().any(|a| a == "profile") {
        let (journal, _) =
            Journal::open(&base.path().join("p"), JournalOptions::default()).expect("journal");
        let g = group_commit(&rt, &journal, 64);
        println!("group commit at 64: {:.0}/s p50 {}", g.per_sec, us(g.p50));
        return;
    }
    let bare = bare_fdatasync(base.path());
    println!(
        "journal benchmark ({}s per cell, 2 events per durable append)",
        RUN.as_secs_f64()
    );
    println!(
        "bare fdatasync of a 600-byte write: p50 {}, p99 {}",
        us(bare.p50),
        us(bare.p99)
    );
    println!();
    println!(
        "| concurrency | group commit appends/s | p50 | p99 | appends per sync | one sync per append appends/s | p50 | p99 | throughput ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut single = None;
    for (i, &c) in LEVELS.iter().enumerate() {
        let jdir = base.path().join(format!("journal-{i}"));
        let (journal, _) = Journal::open(&jdir, JournalOptions::default()).expect("journal");
        let syncs_before = journal.metrics().syncs.get();
        let g = group_commit(&rt, &journal, c);
        let syncs = journal.metrics().syncs.get() - syncs_before;
        drop(journal);
        let s = sync_per_append(&base.path().join(format!("plain-{i}")), c);
        if c == 1 {
            single = Some(g.p50);
        }
        println!(
            "| {c} | {:.0} | {} | {} | {:.1} | {:.0} | {} | {} | {:.1}x |",
            g.per_sec,
            us(g.p50),
            us(g.p99),
            g.count as f64 / syncs.max(1) as f64,
            s.per_sec,
            us(s.p50),
            us(s.p99),
            g.per_sec / s.per_sec
        );
    }
    if let Some(p50) = single {
        println!();
        println!(
            "uncontended durable append p50 {} vs bare fdatasync p50 {}: {:.2}x",
            us(p50),
            us(bare.p50),
            p50.as_secs_f64() / bare.p50.as_secs_f64()
        );
    }
}
