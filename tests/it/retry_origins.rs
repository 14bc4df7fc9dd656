//! Loopback origins with an idempotency-key policy and a side-effect counter: `hits` counts
//! requests that arrived, `effects` the times the operation was executed.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::origins::read_request;

/// What the origin does with the key header.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// A seen key gets the first answer again; the operation runs once per key.
    Honours,
    /// Every request runs the operation.
    Ignores,
    /// Like `Honours`, but a seen key with another payload is a 422 (nothing runs).
    RejectsChangedPayload,
}

/// How the origin answers an operation it ran.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 201 with the charge.
    Always,
    /// Runs the first request, then closes without a byte of response; answers later ones.
    DropsFirst,
    /// Runs every request and never answers.
    DropsAll,
    /// Waits this long before answering.
    After(Duration),
    /// Drops the first answer, waits this long before each later one.
    DropsFirstThenAfter(Duration),
}

pub struct KeyedOrigin {
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    effects: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl KeyedOrigin {
    pub fn start(policy: Policy, answer: Answer) -> Self {
        Self::serve(TcpListener::bind("127.0.0.1:0").unwrap(), policy, answer)
    }

    /// On a port chosen earlier (one that refused connections until now).
    pub fn on_port(port: u16, policy: Policy, answer: Answer) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        Self::serve(listener, policy, answer)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }

    /// Every request head and body as received, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    fn serve(listener: TcpListener, policy: Policy, answer: Answer) -> Self {
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Ledger::default());
        let hits = Arc::new(AtomicUsize::new(0));
        let effects = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (h, e, r) = (hits.clone(), effects.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (h, e, r, state) = (h.clone(), e.clone(), r.clone(), state.clone());
                std::thread::spawn(move || {
                    let req = read_request(&mut stream);
                    if req.is_empty() {
                        return;
                    }
                    let text = String::from_utf8_lossy(&req).into_owned();
                    let n = h.fetch_add(1, Ordering::SeqCst) + 1;
                    r.lock().unwrap().push(text.clone());
                    let reply = state.handle(policy, &text, &e);
                    respond(&mut stream, answer, n, &reply);
                });
            }
        });
        Self {
            addr,
            hits,
            effects,
            requests,
        }
    }
}

/// What the origin remembers per key: the payload and the answer it gave.
#[derive(Default)]
struct Ledger {
    seen: Mutex<HashMap<String, (String, String)>>,
}

impl Ledger {
    fn handle(&self, policy: Policy, req: &str, effects: &AtomicUsize) -> String {
        let key = header(req, "idempotency-key");
        let body = req.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
        let mut seen = self.seen.lock().unwrap();
        if policy != Policy::Ignores
            && let Some(k) = &key
            && let Some((payload, answer)) = seen.get(k)
        {
            if policy == Policy::RejectsChangedPayload && payload != &body {
                return reply("422 Unprocessable Entity", "{\"error\":\"key reused\"}");
            }
            return answer.clone();
        }
        let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
        let answer = reply("201 Created", &format!("{{\"charge\":\"ch_{n}\"}}"));
        if let Some(k) = key {
            seen.insert(k, (body, answer.clone()));
        }
        answer
    }
}

fn reply(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn respond(stream: &mut TcpStream, answer: Answer, n: usize, reply: &str) {
    let drop = match answer {
        Answer::DropsFirst => n == 1,
        Answer::DropsAll => true,
        Answer::After(d) => {
            std::thread::sleep(d);
            false
        }
        Answer::DropsFirstThenAfter(_) if n == 1 => true,
        Answer::DropsFirstThenAfter(d) => {
            std::thread::sleep(d);
            false
        }
        Answer::Always => false,
    };
    if drop {
        let _ = stream.shutdown(std::net::Shutdown::Both);
        return;
    }
    let _ = stream.write_all(reply.as_bytes());
    let _ = stream.flush();
}

/// A request header's value (case-insensitive name).
pub fn header(req: &str, name: &str) -> Option<String> {
    let head = req.split("\r\n\r\n").next().unwrap_or("");
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// A loopback port that refuses connections now (its listener is gone) and can be bound
/// again later.
pub fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}
