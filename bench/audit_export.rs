//! Audit export benchmark (SPEC §5.8): what exporting one journal event costs.
//!
//! Run: `cargo bench --bench audit_export` (release build). A journal is filled first
//! (`EVENTS` events, two per invocation: `ACTION_ACCEPTED` + `DISPATCH_STARTED`, so a page
//! looks up a record every second event — more than real traffic's eight or nine events per
//! invocation), then the exporter sends it all to a loopback receiver that reads each body
//! and answers 200. Reported: wall time and process CPU (user + system, receiver included)
//! per event from the exporter's start to the last ack, bytes per event on the wire, and
//! the protobuf encoding alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use postern::audit::{BATCH, ExportMetrics, Exporter};
use postern::config::{OtlpEndpoint, Scheme};
use postern::journal::{
    Accepted, Body, Dispatch, Draft, Durability, Journal, JournalOptions, Protocol,
    new_invocation_id,
};

const EVENTS: u64 = 100_000;

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

async fn fill(journal: &Journal) {
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let j = journal.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..EVENTS / 2 / 64 {
                j.append(&new_invocation_id(), drafts())
                    .await
                    .expect("append");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
}

/// A receiver that reads each body, counts its bytes and answers 200.
async fn receiver(bytes: Arc<AtomicU64>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let bytes = bytes.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let bytes = bytes.clone();
                        async move {
                            let body = req.into_body().collect().await?.to_bytes();
                            bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                            Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::new())))
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    port
}

/// This process's user + system CPU time, from /proc (clock ticks of 10 ms).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after_name = stat.rsplit_once(')').unwrap().1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5); here 12 and 13 after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

fn encoding_alone(journal: &Journal) {
    let page = journal.export(1, BATCH).unwrap();
    let rounds = 400;
    let started = Instant::now();
    let mut total = 0;
    for _ in 0..rounds {
        total += postern::audit::encode(&page.events, Some("a")).len();
    }
    let per_event = started.elapsed() / (rounds * page.events.len()) as u32;
    println!(
        "encode alone: {per_event:?} per event ({} bytes per event)",
        total / (rounds * page.events.len())
    );
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let options = JournalOptions {
        durability: Durability::Buffered,
        ..JournalOptions::default()
    };
    let (journal, _) = Journal::open(dir.path(), options).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(fill(&journal));
    let head = journal.head().unwrap().unwrap().0;
    println!("journal filled: {head} events");
    encoding_alone(&journal);
    let bytes = Arc::new(AtomicU64::new(0));
    let port = rt.block_on(receiver(bytes.clone()));
    let metrics = ExportMetrics::default();
    let exporter = Exporter {
        journal: journal.clone(),
        endpoint: OtlpEndpoint {
            scheme: Scheme::Http,
            host: "127.0.0.1".into(),
            port,
            base_path: String::new(),
        },
        dir: dir.path().join("audit"),
        node: None,
        metrics: metrics.clone(),
    };
    let (cpu_before, started) = (cpu(), Instant::now());
    rt.spawn(exporter.run());
    while metrics.acked_seq.get() < head as i64 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (wall, used) = (started.elapsed(), cpu() - cpu_before);
    let n = head as u32;
    println!(
        "exported {head} events in {wall:?}: {:?} wall and {:?} CPU per event, {} bytes per event on the wire, {:.0} events/s",
        wall / n,
        used / n,
        bytes.load(Ordering::Relaxed) / head,
        head as f64 / wall.as_secs_f64()
    );
}
