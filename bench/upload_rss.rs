//! Memory under upload load: 40 agents each POST a 15 MiB body at once through postern
//! (plain `http://` route, loopback origin). Prints postern's RSS before, at its peak and
//! after, and how the uploads were answered. Run:
//! `cargo bench --profile dev --bench upload_rss`; `POSTERN_BENCH_BIN` points at another
//! build (e.g. the one before the buffer budget) for an A/B run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "procstat.rs"]
mod procstat;

use procstat::rss_mb;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const AGENTS: usize = 40;
const BODY: usize = 15 << 20;

/// Reads each request whole (by Content-Length) and answers 200.
fn origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || serve_one(stream));
        }
    });
    addr
}

fn serve_one(mut stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut len = 0usize;
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        line.clear();
    }
    let _ = std::io::copy(&mut reader.by_ref().take(len as u64), &mut std::io::sink());
    let _ =
        stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
}

fn start_postern(origin: SocketAddr, home: &std::path::Path) -> (Child, SocketAddr) {
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[routes]]\nid = \"up\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {} }}\nresolve = \"{origin}\"\n",
        origin.port()
    );
    let cfg = home.join("postern.toml");
    std::fs::write(&cfg, config).unwrap();
    let bin = std::env::var("POSTERN_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_postern").to_owned());
    let mut child = Command::new(bin)
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("POSTERN_HOME", home.join("home"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut proxy = None;
    for line in lines.by_ref().map_while(Result::ok) {
        if let Some(p) = line.trim().strip_prefix("proxy") {
            proxy = Some(p.trim().trim_start_matches("http://").parse().unwrap());
        }
        if line.trim().starts_with("admin") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    (child, proxy.unwrap())
}

/// One upload; the status postern (or the origin) answered, 0 if the connection broke.
fn upload(proxy: SocketAddr, port: u16) -> u16 {
    let Ok(mut s) = TcpStream::connect(proxy) else {
        return 0;
    };
    let head = format!(
        "POST http://origin.test:{port}/up HTTP/1.1\r\nHost: origin.test:{port}\r\nContent-Length: {BODY}\r\n\r\n"
    );
    let chunk = vec![b'u'; 64 * 1024];
    if s.write_all(head.as_bytes()).is_err() {
        return 0;
    }
    for _ in 0..BODY / chunk.len() {
        if s.write_all(&chunk).is_err() {
            break;
        }
    }
    let mut status = [0u8; 12];
    match s.read_exact(&mut status) {
        Ok(()) => String::from_utf8_lossy(&status[9..12]).parse().unwrap_or(0),
        Err(_) => 0,
    }
}

fn main() {
    let origin = origin();
    let home = tempfile::tempdir().unwrap();
    let (mut child, proxy) = start_postern(origin, home.path());
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(500));
    let before = rss_mb(pid);
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0f64;
            while !done.load(Ordering::SeqCst) {
                peak = peak.max(rss_mb(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let agents: Vec<_> = (0..AGENTS)
        .map(|_| std::thread::spawn(move || upload(proxy, origin.port())))
        .collect();
    let mut statuses: Vec<u16> = agents.into_iter().map(|a| a.join().unwrap()).collect();
    std::thread::sleep(Duration::from_secs(1));
    done.store(true, Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    let after = rss_mb(pid);
    statuses.sort_unstable();
    let count = |s: u16| statuses.iter().filter(|&&x| x == s).count();
    println!(
        "{AGENTS} agents x {} MiB uploads: RSS {before:.0} MB before, {peak:.0} MB peak, {after:.0} MB after; \
         answered 200: {}, 429: {}, other: {}",
        BODY >> 20,
        count(200),
        count(429),
        AGENTS - count(200) - count(429)
    );
    let _ = child.kill();
    let _ = child.wait();
}
