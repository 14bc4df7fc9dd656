//! Idle upstream connections, reused per route and origin. A request on a pooled
//! connection is dispatched like any other: if it fails after `DISPATCH_STARTED`, the
//! outcome is `unknown`, never "connection error".

use std::collections::HashMap;
use std::sync::Mutex;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::tap::Tap;
use super::upstream::Hop;
use crate::config::Route;
use crate::http::deliver::body::{UpBody, body_error};
use crate::journal::TlsIdentity;
use crate::policy::Target;

const MAX_IDLE_PER_KEY: usize = 64;
/// How long a pooled connection may take to accept a request before it is passed over.
const READY_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// An HTTP/1.1 or HTTP/2 client connection to one origin.
pub enum Sender {
    H1(hyper::client::conn::http1::SendRequest<UpBody>),
    H2(hyper::client::conn::http2::SendRequest<UpBody>),
}

impl Sender {
    pub async fn handshake(io: Tap, h2: bool) -> Result<Self, String> {
        let io = TokioIo::new(io);
        if h2 {
            let (s, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            Ok(Self::H2(s))
        } else {
            let (s, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            Ok(Self::H1(s))
        }
    }

    /// An HTTP/1.1 connection that may switch protocols (it never returns to the pool).
    pub async fn handshake_upgradable(io: Tap) -> Result<Self, String> {
        let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn.with_upgrades());
        Ok(Self::H1(s))
    }

    pub fn is_h2(&self) -> bool {
        matches!(self, Self::H2(_))
    }

    fn is_usable(&self) -> bool {
        match self {
            Self::H1(s) => s.is_ready() && !s.is_closed(),
            Self::H2(s) => s.is_ready() && !s.is_closed(),
        }
    }

    /// Sends a request; hyper hands it back when it wrote none of it.
    pub async fn send(
        &mut self,
        req: http::Request<UpBody>,
    ) -> Result<http::Response<Incoming>, SendFailure> {
        let r = match self {
            Self::H1(s) => s.try_send_request(req).await,
            Self::H2(s) => s.try_send_request(req).await,
        };
        r.map_err(|mut e| {
            let diagnostic = body_error(e.error());
            match e.take_message() {
                Some(req) => SendFailure::Unwritten(Box::new(req), diagnostic),
                None => SendFailure::Failed(diagnostic),
            }
        })
    }

    /// Waits briefly until the connection takes a request; false if it will not.
    async fn ready(&mut self) -> bool {
        let ready = async {
            match self {
                Self::H1(s) => s.ready().await,
                Self::H2(s) => s.ready().await,
            }
        };
        matches!(tokio::time::timeout(READY_WAIT, ready).await, Ok(Ok(())))
    }
}

/// Why a send failed.
pub enum SendFailure {
    /// hyper returned the request unwritten: proof that nothing was sent.
    Unwritten(Box<http::Request<UpBody>>, String),
    /// It may have been written.
    Failed(String),
}

/// A connection and what its setup proved, kept for the evidence of later requests.
pub struct Conn {
    pub sender: Sender,
    pub address: String,
    pub tls: Option<TlsIdentity>,
}

/// Idle connections keyed by route, `via` hop and origin (a route fixes trust roots and
/// address; the hop is in the key too, so a reloaded route never mixes direct and hopped).
#[derive(Default)]
pub struct Pool {
    idle: Mutex<HashMap<String, Vec<Conn>>>,
}

impl Pool {
    /// Drops every idle connection.
    pub fn forget(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }

    pub fn key(route: &Route, target: &Target, hop: Option<&Hop>) -> String {
        let via = hop.map_or_else(|| "direct".to_owned(), |h| h.via().name());
        format!("{}|{via}|{}", route.id, target.authority())
    }

    /// An idle connection that takes a request now, checked before `DISPATCH_STARTED` so
    /// a connection that cannot is never the one an invocation is dispatched on.
    pub async fn take_ready(&self, key: &str) -> Option<Conn> {
        while let Some(mut conn) = self.take(key) {
            if conn.sender.ready().await {
                return Some(conn);
            }
        }
        None
    }

    fn take(&self, key: &str) -> Option<Conn> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(key)?;
        while let Some(conn) = list.pop() {
            if conn.sender.is_usable() {
                return Some(conn);
            }
        }
        None
    }

    pub fn give(&self, key: String, conn: Conn) {
        if !conn.sender.is_usable() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            let list = idle.entry(key).or_default();
            if list.len() < MAX_IDLE_PER_KEY {
                list.push(conn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Scheme;

    #[test]
    fn the_hop_is_part_of_the_key() -> Result<(), Box<dyn std::error::Error>> {
        let text = "[[routes]]\nid = \"r\"\nmatch = { host = \"o.test\" }\n";
        let direct = crate::config::parse(text, None, &|_| None)?;
        let hopped = crate::config::parse(
            &format!("{text}via = \"http://10.0.0.1:3128\"\n"),
            None,
            &|_| None,
        )?;
        let target = Target::new(Scheme::Https, "o.test", None, "/")
            .map_err(|e| format!("target: {}", e.field))?;
        let (d, h) = (&direct.routes[0], &hopped.routes[0]);
        let hop = h.via.clone().map(|v| Hop::new(v, None));
        assert_eq!(d.id, h.id);
        assert_ne!(
            Pool::key(d, &target, None),
            Pool::key(h, &target, hop.as_ref()),
            "a direct connection is never handed to a hopped request, nor the reverse"
        );
        Ok(())
    }
}
