//! Loopback origins, each named after the way it misbehaves.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A scripted raw-TCP origin: reads one request per connection, then runs its script.
pub struct Origin {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    pub requests: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Connections accepted (a pooled request adds none).
    pub connections: Arc<AtomicUsize>,
}

/// What the origin reads before its script runs.
#[derive(Clone, Copy)]
enum Reads {
    /// One request per connection.
    OneRequest,
    /// Nothing: the script reads.
    Nothing,
    /// Every request of a kept-alive connection, the script answering each.
    EachRequest,
}

impl Origin {
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn last_request(&self) -> String {
        String::from_utf8_lossy(
            self.requests
                .lock()
                .unwrap()
                .last()
                .map(Vec::as_slice)
                .unwrap_or_default(),
        )
        .into_owned()
    }

    pub fn script(f: impl Fn(&mut TcpStream, &[u8]) + Send + Sync + 'static) -> Self {
        Self::serve(Reads::OneRequest, f)
    }

    /// Like `script`, but the script reads the request itself.
    pub fn raw(f: impl Fn(&mut TcpStream, &[u8]) + Send + Sync + 'static) -> Self {
        Self::serve(Reads::Nothing, f)
    }

    /// Like `script`, but a connection stays open for further requests (each counted in
    /// `hits`) as long as the script leaves it so: a kept connection postern may pool.
    pub fn keeps_alive(f: impl Fn(&mut TcpStream, &[u8]) + Send + Sync + 'static) -> Self {
        Self::serve(Reads::EachRequest, f)
    }

    fn serve(reads: Reads, f: impl Fn(&mut TcpStream, &[u8]) + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (h, r, c) = (hits.clone(), requests.clone(), connections.clone());
        let f = Arc::new(f);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                c.fetch_add(1, Ordering::SeqCst);
                let (h, r, f) = (h.clone(), r.clone(), f.clone());
                std::thread::spawn(move || {
                    loop {
                        let req = match reads {
                            Reads::Nothing => b"(raw)".to_vec(),
                            Reads::OneRequest | Reads::EachRequest => read_request(&mut stream),
                        };
                        if req.is_empty() {
                            return;
                        }
                        h.fetch_add(1, Ordering::SeqCst);
                        r.lock().unwrap().push(req.clone());
                        f(&mut stream, &req);
                        if !matches!(reads, Reads::EachRequest) {
                            return;
                        }
                    }
                });
            }
        });
        Self {
            addr,
            hits,
            requests,
            connections,
        }
    }
}

/// Reads a request head and its Content-Length body.
pub fn read_request(stream: &mut TcpStream) -> Vec<u8> {
    read_request_within(stream, Duration::from_secs(10))
}

/// Like `read_request`, giving up after `wait` without bytes.
pub fn read_request_within(stream: &mut TcpStream, wait: Duration) -> Vec<u8> {
    let _ = stream.set_read_timeout(Some(wait));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return buf,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    buf
}

fn write(stream: &mut TcpStream, bytes: &[u8]) {
    let _ = stream.write_all(bytes);
    let _ = stream.flush();
}

/// A complete, correctly framed response.
pub fn responds(status: &str, headers: &[&str], body: &str) -> Origin {
    let mut head = format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    let bytes = format!("{head}\r\n{body}").into_bytes();
    Origin::script(move |s, _| write(s, &bytes))
}

/// Reads the request, then closes without a byte of response.
pub fn closes_without_response() -> Origin {
    Origin::script(|s, _| {
        let _ = s.shutdown(std::net::Shutdown::Both);
    })
}

/// Promises 100 bytes, sends 5, closes.
pub fn partial_content_length() -> Origin {
    Origin::script(|s, _| write(s, b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello"))
}

/// A chunked body whose second chunk-size line is garbage.
pub fn broken_chunked() -> Origin {
    Origin::script(|s, _| {
        write(
            s,
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
        )
    })
}

/// A chunked body cut off before the last chunk.
pub fn half_a_chunked_body() -> Origin {
    Origin::script(|s, _| {
        write(
            s,
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
        )
    })
}

/// Waits before sending anything.
pub fn slow_head(delay: Duration, body: &'static str) -> Origin {
    Origin::script(move |s, _| {
        std::thread::sleep(delay);
        let r = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        write(s, r.as_bytes());
    })
}

/// Sends the head and part of the body, then goes quiet.
pub fn stalls_mid_body(quiet: Duration) -> Origin {
    Origin::script(move |s, _| {
        write(s, b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf");
        std::thread::sleep(quiet);
    })
}

/// Answers with the request it received as the body.
pub fn echoes_request() -> Origin {
    Origin::script(|s, req| {
        let mut r = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: text/plain\r\n\r\n",
            req.len()
        )
        .into_bytes();
        r.extend_from_slice(req);
        write(s, &r);
    })
}

/// A port nothing listens on: port 1 needs root to bind and nothing here does, so it
/// cannot be taken by another test's listener between the check and the use.
pub fn refused_port() -> u16 {
    1
}

/// On the first request byte, asks postern's admin API whether DISPATCH_STARTED is
/// already recorded for the newest invocation, and answers what it saw.
pub fn checks_dispatch_first(admin: Arc<Mutex<String>>) -> Origin {
    Origin::raw(move |s, _| {
        let admin = admin.lock().unwrap().clone();
        let mut first = [0u8; 1];
        if s.read_exact(&mut first).is_err() {
            return;
        }
        let out = std::process::Command::new("curl")
            .args(["-s", &format!("{admin}/v1/invocations?limit=1")])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let seen = v["invocations"][0]["evidence"]["dispatch_started"] == true;
        let _ = read_request(s);
        let body = if seen {
            "durable-before-first-byte"
        } else {
            "NOT-DURABLE"
        };
        let r = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        write(s, r.as_bytes());
    })
}

/// Keeps each connection for further requests (counted in `served`), closing it once
/// `idle` passes without one, as origins with a short keep-alive timeout do.
pub fn closes_idle_connections(idle: Duration, served: Arc<AtomicUsize>) -> Origin {
    Origin::raw(move |s, _| {
        loop {
            let req = read_request_within(s, idle);
            if req.is_empty() {
                return;
            }
            let n = served.fetch_add(1, Ordering::SeqCst) + 1;
            let body = format!("request {n}");
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
            write(s, format!("{head}{body}").as_bytes());
        }
    })
}
