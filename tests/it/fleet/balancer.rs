//! A round-robin TCP balancer in front of the fleet's proxy ports, as a load balancer would
//! be: connection 0 goes to the first node, 1 to the second, and so on. Connection 0 is cut
//! (both sides) 50 ms after the agent's first bytes passed, so its answer is lost while the
//! node's dispatch runs on.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub struct RoundRobin {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl RoundRobin {
    /// `backends`: proxy URLs (`http://127.0.0.1:PORT`).
    pub fn start(backends: &[&str]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let backends: Vec<String> = backends
            .iter()
            .map(|u| {
                u.trim_start_matches("http://")
                    .trim_end_matches('/')
                    .to_owned()
            })
            .collect();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for agent in listener.incoming().flatten() {
                let n = count.fetch_add(1, Ordering::SeqCst);
                let to = backends[n % backends.len()].clone();
                std::thread::spawn(move || relay(agent, &to, n == 0));
            }
        });
        Self { port, accepted }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

fn relay(mut agent: TcpStream, to: &str, cut: bool) {
    let Ok(mut node) = TcpStream::connect(to) else {
        return;
    };
    let (Ok(mut agent_r), Ok(mut node_w)) = (agent.try_clone(), node.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match agent_r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if node_w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    if cut {
                        std::thread::sleep(Duration::from_millis(50));
                        let _ = node_w.shutdown(std::net::Shutdown::Both);
                        let _ = agent_r.shutdown(std::net::Shutdown::Both);
                        break;
                    }
                }
            }
        }
        let _ = node_w.shutdown(std::net::Shutdown::Write);
    });
    let mut buf = [0u8; 16 * 1024];
    loop {
        match node.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if agent.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = agent.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}
