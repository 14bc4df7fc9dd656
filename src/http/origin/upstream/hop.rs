//! A route's `via` hop (SPEC §3.6). postern's TCP connection goes to the hop. An https
//! origin (and a tunnel route's) is reached by `CONNECT origin:port` through it (stage
//! `proxy_tunnel`), TLS with the origin running inside; an http origin gets its requests in
//! absolute form. The hop's credential is sent to the hop alone, never to the origin.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::Io;
use crate::config::{Config, Route, Via};
use crate::contract::Code;
use crate::http::origin::inject::{Injection, credential_failure};
use crate::journal::Failure;
use crate::policy::Target;

/// The hop of one invocation: where it is, and the credential it gets (`basic` mode,
/// checked when bound).
pub struct Hop {
    via: Via,
    credential: Option<Injection>,
}

impl Hop {
    pub fn new(via: Via, credential: Option<Injection>) -> Self {
        Self { via, credential }
    }

    pub fn via(&self) -> &Via {
        &self.via
    }

    /// The hop's credential, when it has one.
    pub fn credential(&self) -> Option<&Injection> {
        self.credential.as_ref()
    }

    /// `proxy:<name>`: the name the hop gives itself in `Proxy-Status` if it gave a usable
    /// one, else `host:port` of `via`.
    pub fn evidence_name(&self, named: Option<&str>) -> String {
        let usable = named.filter(|n| {
            !n.is_empty()
                && n.len() <= 128
                && n.bytes().all(|b| b.is_ascii_graphic())
                && !self
                    .credential
                    .as_ref()
                    .is_some_and(|c| c.reflected_in(n.as_bytes()))
        });
        format!(
            "proxy:{}",
            usable.map_or_else(|| self.via.name(), str::to_owned)
        )
    }

    /// `Proxy-Authorization` for a request to the hop (a `CONNECT`, or absolute form).
    pub fn authorize(&self, headers: &mut HeaderMap) {
        if let Some(v) = self
            .credential
            .as_ref()
            .and_then(Injection::proxy_authorization)
        {
            headers.insert(header::PROXY_AUTHORIZATION, v);
        }
    }
}

/// Why the hop opened no tunnel.
pub(super) enum Refused {
    /// It answered the `CONNECT` with a non-2xx status, naming itself or not.
    Status(StatusCode, Option<String>),
    /// The exchange broke before an answer: the transport's words.
    Broken(String),
    TimedOut,
}

/// `CONNECT origin:port` on `tcp` to the hop; on a 2xx the stream carries the origin's bytes.
/// The `CONNECT` carries no request byte, so whatever happens here is before dispatch.
pub(super) async fn open_tunnel(
    tcp: TcpStream,
    hop: &Hop,
    target: &Target,
    limit: Duration,
) -> Result<Box<dyn Io>, Refused> {
    match tokio::time::timeout(limit, connect(tcp, hop, target)).await {
        Ok(r) => r,
        Err(_) => Err(Refused::TimedOut),
    }
}

async fn connect(tcp: TcpStream, hop: &Hop, target: &Target) -> Result<Box<dyn Io>, Refused> {
    let broken = |e: hyper::Error| Refused::Broken(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(broken)?;
    tokio::spawn(conn.with_upgrades());
    let authority = target.connect_authority();
    let mut req = Request::builder()
        .method(Method::CONNECT)
        .uri(authority.as_str())
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| Refused::Broken(e.to_string()))?;
    let host = HeaderValue::from_str(&authority).map_err(|e| Refused::Broken(e.to_string()))?;
    req.headers_mut().insert(header::HOST, host);
    hop.authorize(req.headers_mut());
    let resp = sender.send_request(req).await.map_err(broken)?;
    let status = resp.status();
    if !status.is_success() {
        let named =
            crate::http::message::headers::intermediary_error(resp.headers()).map(|(n, _)| n);
        return Err(Refused::Status(status, named));
    }
    let upgraded = hyper::upgrade::on(resp).await.map_err(broken)?;
    Ok(Box::new(TokioIo::new(upgraded)))
}

/// The route's `via` hop with its `via_credential` fetched, refused like any credential
/// that cannot be had.
pub fn bind_hop(
    config: &Config,
    vault: &crate::vault::Vault,
    route: &Route,
) -> Result<Option<Hop>, Failure> {
    let Some(via) = &route.via else {
        return Ok(None);
    };
    let Some(id) = &via.credential else {
        return Ok(Some(Hop::new(via.clone(), None)));
    };
    let injection =
        Injection::resolve(config, vault, id).map_err(|f| credential_failure(config, id, f))?;
    if injection.proxy_authorization().is_none() {
        return Err(Failure::of(Code::InjectionModeUnsupported));
    }
    Ok(Some(Hop::new(via.clone(), Some(injection))))
}
