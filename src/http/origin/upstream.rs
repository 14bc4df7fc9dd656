//! Connection setup toward the origin: `dns` → `tcp_connect` → (`proxy_tunnel` through a
//! `via` hop) → `tls_handshake`.
//!
//! Every stage is reported as a `ConnectAttempt`; nothing here decides an outcome.
//! All of it happens before the dispatch boundary, so bounded retries are allowed.

mod hop;

pub use hop::{Hop, bind_hop};

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::config::{Route, Scheme};
use crate::contract::{Code, Stage, TlsProblem};
use crate::dns::Dns;
use crate::journal::{ConnectAttempt, Failure, TlsIdentity};
use crate::policy::Target;

/// A byte stream to the origin.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// An established connection, ready for the dispatch boundary.
pub struct Dialed {
    pub stream: Box<dyn Io>,
    pub address: SocketAddr,
    /// The origin chose HTTP/2 by ALPN.
    pub h2: bool,
    pub attempts: Vec<ConnectAttempt>,
    /// Set for TLS origins: what verification proved.
    pub tls: Option<TlsIdentity>,
}

/// Connection setup failed: nothing was sent.
pub struct DialFailure {
    pub code: Code,
    pub attempts: Vec<ConnectAttempt>,
    /// The status a `via` hop refused the tunnel with.
    pub hop_status: Option<u16>,
    /// What is wrong with the origin's certificate (`TLS_CERTIFICATE_ERROR`), when known.
    pub tls_problem: Option<TlsProblem>,
    /// postern's own limit that stopped the connection (no file descriptor, no memory): the
    /// failure is postern's, never the destination's.
    pub postern_resource: Option<String>,
}

impl DialFailure {
    /// The `FAILED` event's body: the code, and the hop's status as evidence.
    pub fn failure(&self) -> Failure {
        let mut f = Failure::of(self.code);
        if let Some(problem) = self.tls_problem {
            f.evidence
                .insert("tls_problem".into(), problem.as_str().into());
        }
        if let Some(status) = self.hop_status {
            f.evidence.insert("hop_status".into(), status.into());
        }
        if let Some(what) = &self.postern_resource {
            f.evidence
                .insert(POSTERN_RESOURCE.into(), what.clone().into());
        }
        f
    }
}

const MAX_TCP_ATTEMPTS: usize = 3;

use crate::contract::POSTERN_RESOURCE;
use crate::lifecycle::resources::postern_resource;

/// What the origin is offered by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Offer {
    /// HTTP/2 or HTTP/1.1, the origin's choice.
    Any,
    /// HTTP/1.1 only: an `Upgrade` exists only there.
    Http1,
}

/// Upstream TLS configs, one per route and offer (roots: system + the route's `upstream_ca`).
#[derive(Default)]
pub struct TlsClients {
    configs: Mutex<HashMap<(String, Offer), Arc<rustls::ClientConfig>>>,
}

impl TlsClients {
    pub fn forget(&self) {
        if let Ok(mut m) = self.configs.lock() {
            m.clear();
        }
    }

    fn config(&self, route: &Route, offer: Offer) -> Result<Arc<rustls::ClientConfig>, String> {
        let key = (route.id.clone(), offer);
        if let Some(c) = self.configs.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(c);
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        if let Some(path) = &route.upstream_ca {
            add_pem_roots(&mut roots, path).map_err(|e| format!("upstream_ca {e}"))?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = match offer {
            Offer::Any => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Offer::Http1 => vec![b"http/1.1".to_vec()],
        };
        let config = Arc::new(config);
        if let Ok(mut m) = self.configs.lock() {
            m.insert(key, config.clone());
        }
        Ok(config)
    }
}

/// The stages of connection setup, numbered by attempt: dns, tcp_connect and
/// tls_handshake of one try share `n`; each further address tried is a new attempt.
#[derive(Default)]
struct Attempts {
    list: Vec<ConnectAttempt>,
    hop_status: Option<u16>,
    postern_resource: Option<String>,
}

impl Attempts {
    fn ok(&mut self, stage: Stage, address: Option<SocketAddr>) {
        self.push(stage, true, None, address, None);
    }

    fn failed(
        &mut self,
        stage: Stage,
        code: Code,
        address: Option<SocketAddr>,
        diagnostic: String,
    ) {
        self.push(stage, false, Some(code), address, Some(diagnostic));
    }

    fn push(
        &mut self,
        stage: Stage,
        ok: bool,
        code: Option<Code>,
        address: Option<SocketAddr>,
        diagnostic: Option<String>,
    ) {
        let last = self.list.last().map_or(1, |a| a.n);
        let tcp_tried = self.list.iter().any(|a| a.stage == Stage::TcpConnect);
        let n = if stage == Stage::TcpConnect && tcp_tried {
            last + 1
        } else {
            last
        };
        self.list.push(ConnectAttempt {
            n,
            stage,
            ok,
            code,
            address: address.map(|a| a.to_string()),
            diagnostic,
            hop: None,
        });
    }

    /// The last stage was the `via` hop's answer: its event names the hop.
    fn said_by(&mut self, hop: String) {
        if let Some(last) = self.list.last_mut() {
            last.hop = Some(hop);
        }
    }

    fn fail(self, code: Code) -> DialFailure {
        DialFailure {
            code,
            attempts: self.list,
            hop_status: self.hop_status,
            tls_problem: None,
            postern_resource: self.postern_resource,
        }
    }
}

/// A byte stream to the origin's port that passed the SSRF guard (`dns` → `tcp_connect`,
/// then `proxy_tunnel` through a `via` hop). `address` is the one postern connected to.
pub struct Connected {
    pub stream: Box<dyn Io>,
    pub address: SocketAddr,
    pub attempts: Vec<ConnectAttempt>,
}

/// The stages below TLS: what a tunnel (`intercept = false`) needs, since the agent's own
/// TLS runs inside it. With a `hop`, the stream is a `CONNECT` tunnel through it.
pub async fn connect_tcp(
    route: &Route,
    target: &Target,
    dns: &Dns,
    hop: Option<&Hop>,
) -> Result<Connected, DialFailure> {
    let mut at = Attempts::default();
    match reach_origin(route, target, dns, hop, &mut at).await {
        Ok((stream, address)) => Ok(Connected {
            stream,
            address,
            attempts: at.list,
        }),
        Err(code) => Err(at.fail(code)),
    }
}

/// `dns` → `tcp_connect`, then through `hop` (if any) `proxy_tunnel`.
async fn reach_origin(
    route: &Route,
    target: &Target,
    dns: &Dns,
    hop: Option<&Hop>,
    at: &mut Attempts,
) -> Result<(Box<dyn Io>, SocketAddr), Code> {
    let (tcp, address) = tcp_stages(route, target, dns, at).await?;
    let Some(hop) = hop else {
        return Ok((Box::new(tcp), address));
    };
    let opened = hop::open_tunnel(tcp, hop, target, route.connect_timeout).await;
    let stage = Stage::ProxyTunnel;
    let code = match opened {
        Ok(stream) => {
            at.ok(stage, Some(address));
            at.said_by(hop.evidence_name(None));
            return Ok((stream, address));
        }
        Err(hop::Refused::Status(status, named)) => {
            let diag = format!("the hop answered CONNECT with {status}");
            at.failed(stage, Code::ProxyTunnelRefused, Some(address), diag);
            at.said_by(hop.evidence_name(named.as_deref()));
            at.hop_status = Some(status.as_u16());
            Code::ProxyTunnelRefused
        }
        Err(hop::Refused::Broken(diag)) => {
            at.failed(stage, Code::ProxyTunnelRefused, Some(address), diag);
            Code::ProxyTunnelRefused
        }
        Err(hop::Refused::TimedOut) => {
            let diag = format!("no answer to CONNECT within {:?}", route.connect_timeout);
            at.failed(stage, Code::ConnectTimeout, Some(address), diag);
            Code::ConnectTimeout
        }
    };
    Err(code)
}

/// Sets up a connection for `target` under `route`, through `hop` when it has one: an
/// https origin by a `CONNECT` tunnel, an http one by requests in absolute form.
pub async fn dial(
    route: &Route,
    target: &Target,
    tls: &TlsClients,
    dns: &Dns,
    hop: Option<&Hop>,
) -> Result<Dialed, DialFailure> {
    dial_offering(route, target, tls, dns, hop, Offer::Any).await
}

/// `dial`, offering the origin only what `offer` names.
pub async fn dial_offering(
    route: &Route,
    target: &Target,
    tls: &TlsClients,
    dns: &Dns,
    hop: Option<&Hop>,
    offer: Offer,
) -> Result<Dialed, DialFailure> {
    let plain = target.scheme == Scheme::Http;
    let tunnel_hop = if plain { None } else { hop };
    let Connected {
        stream,
        address,
        attempts,
    } = connect_tcp(route, target, dns, tunnel_hop).await?;
    let mut at = Attempts {
        list: attempts,
        ..Attempts::default()
    };
    if plain {
        return Ok(Dialed {
            tls: None,
            stream,
            address,
            h2: false,
            attempts: at.list,
        });
    }
    let config = match tls.config(route, offer) {
        Ok(c) => c,
        Err(diag) => {
            at.failed(
                Stage::TlsHandshake,
                Code::TlsCertificateError,
                Some(address),
                diag,
            );
            return Err(at.fail(Code::TlsCertificateError));
        }
    };
    let name = match ServerName::try_from(target.host.clone()) {
        Ok(n) => n,
        Err(e) => {
            at.failed(
                Stage::TlsHandshake,
                Code::TlsHandshakeError,
                Some(address),
                e.to_string(),
            );
            return Err(at.fail(Code::TlsHandshakeError));
        }
    };
    let connector = tokio_rustls::TlsConnector::from(config);
    match tokio::time::timeout(route.connect_timeout, connector.connect(name, stream)).await {
        Ok(Ok(stream)) => {
            let session = stream.get_ref().1;
            let h2 = session.alpn_protocol() == Some(b"h2");
            let tls = session
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|leaf| TlsIdentity {
                    server_name: target.host.clone(),
                    leaf_sha256: crate::journal::sha256_tagged(leaf.as_ref()),
                });
            at.ok(Stage::TlsHandshake, Some(address));
            Ok(Dialed {
                tls,
                stream: Box::new(stream),
                address,
                h2,
                attempts: at.list,
            })
        }
        Ok(Err(e)) => {
            let (code, problem) = tls_code(&e);
            at.failed(Stage::TlsHandshake, code, Some(address), e.to_string());
            let mut failure = at.fail(code);
            failure.tls_problem = problem;
            Err(failure)
        }
        Err(_) => {
            at.failed(
                Stage::TlsHandshake,
                Code::ConnectTimeout,
                Some(address),
                "TLS handshake timed out".into(),
            );
            Err(at.fail(Code::ConnectTimeout))
        }
    }
}

/// `dns` then `tcp_connect` to each address in turn (at most `MAX_TCP_ATTEMPTS`), the SSRF
/// guard applied to each address and again to the one connected.
async fn tcp_stages(
    route: &Route,
    target: &Target,
    dns: &Dns,
    at: &mut Attempts,
) -> Result<(TcpStream, SocketAddr), Code> {
    let addresses = match resolve(route, target, dns).await {
        Ok(a) => {
            if route.resolve.is_none() {
                at.ok(Stage::Dns, a.first().copied());
            }
            a
        }
        Err(diag) => {
            at.failed(Stage::Dns, Code::DnsError, None, diag);
            return Err(Code::DnsError);
        }
    };
    let pinned = route.resolve.is_some() || route.allow_private;
    let mut last = Code::ConnectionRefused;
    let mut connected = None;
    for addr in addresses.into_iter().take(MAX_TCP_ATTEMPTS) {
        if !pinned && is_prohibited(addr.ip()) {
            at.failed(
                Stage::TcpConnect,
                Code::DestinationProhibited,
                Some(addr),
                prohibited_diag(addr, route),
            );
            last = Code::DestinationProhibited;
            continue;
        }
        match tokio::time::timeout(route.connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                // The guard is applied to the address actually connected.
                let peer = stream.peer_addr().unwrap_or(addr);
                if !pinned && is_prohibited(peer.ip()) {
                    at.failed(
                        Stage::TcpConnect,
                        Code::DestinationProhibited,
                        Some(peer),
                        prohibited_diag(peer, route),
                    );
                    return Err(Code::DestinationProhibited);
                }
                at.ok(Stage::TcpConnect, Some(peer));
                connected = Some((stream, peer));
                break;
            }
            Ok(Err(e)) => {
                if let Some(what) = postern_resource(&e) {
                    // Another address would fail the same way: this is postern's limit.
                    at.failed(
                        Stage::TcpConnect,
                        Code::ConnectionRefused,
                        None,
                        what.clone(),
                    );
                    at.postern_resource = Some(what);
                    return Err(Code::ConnectionRefused);
                }
                at.failed(
                    Stage::TcpConnect,
                    Code::ConnectionRefused,
                    Some(addr),
                    e.to_string(),
                );
                last = Code::ConnectionRefused;
            }
            Err(_) => {
                at.failed(
                    Stage::TcpConnect,
                    Code::ConnectTimeout,
                    Some(addr),
                    format!("no connection within {:?}", route.connect_timeout),
                );
                last = Code::ConnectTimeout;
            }
        }
    }
    let Some((tcp, address)) = connected else {
        return Err(last);
    };
    let _ = tcp.set_nodelay(true);
    Ok((tcp, address))
}

fn tls_code(e: &std::io::Error) -> (Code, Option<TlsProblem>) {
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::InvalidCertificate(cert)) => {
            (Code::TlsCertificateError, tls_problem(cert))
        }
        _ => (Code::TlsHandshakeError, None),
    }
}

/// The class a newcomer can act on; other certificate errors keep the code's message.
fn tls_problem(e: &rustls::CertificateError) -> Option<TlsProblem> {
    use rustls::CertificateError as E;
    Some(match e {
        E::UnknownIssuer => TlsProblem::UntrustedIssuer,
        E::NotValidForName | E::NotValidForNameContext { .. } => TlsProblem::NameMismatch,
        E::Expired | E::ExpiredContext { .. } => TlsProblem::Expired,
        E::NotValidYet | E::NotValidYetContext { .. } => TlsProblem::NotYetValid,
        E::Revoked => TlsProblem::Revoked,
        _ => return None,
    })
}

/// The addresses postern connects to: the `via` hop's when the route has one (the hop
/// resolves the origin), else the pinned one or the origin's.
async fn resolve(route: &Route, target: &Target, dns: &Dns) -> Result<Vec<SocketAddr>, String> {
    if let Some(pinned) = route.resolve {
        return Ok(vec![pinned]);
    }
    let (host, port) = match &route.via {
        Some(via) => (via.host.as_str(), via.port),
        None => (target.host.as_str(), target.port),
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let limit = route.connect_timeout.max(Duration::from_millis(100));
    dns.lookup(host, port, limit).await
}

/// The SSRF guard's ranges: loopback, private, link-local, CGNAT, metadata and friends.
pub fn is_prohibited(ip: IpAddr) -> bool {
    prohibited_class(ip).is_some()
}

/// Which prohibited range `ip` is in (`None`: a public address).
pub fn prohibited_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            let class = match () {
                () if v4.is_loopback() => "loopback",
                () if v4.is_private() => "private (RFC 1918)",
                () if v4.is_link_local() => "link-local",
                () if v4.is_unspecified() || o[0] == 0 => "unspecified (0.0.0.0/8)",
                () if v4.is_broadcast() || o[0] >= 240 => "reserved (240.0.0.0/4)",
                () if v4.is_multicast() => "multicast",
                () if o[0] == 100 && (64..128).contains(&o[1]) => "shared (CGNAT, 100.64.0.0/10)",
                () if o[0] == 192 && o[1] == 0 && o[2] == 0 => "IETF protocol (192.0.0.0/24)",
                () if o[0] == 198 && (o[1] == 18 || o[1] == 19) => "benchmarking (198.18.0.0/15)",
                () => return None,
            };
            Some(class)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return prohibited_class(IpAddr::V4(v4));
            }
            let s = v6.segments();
            let class = match () {
                () if v6.is_loopback() => "loopback",
                () if v6.is_unspecified() => "unspecified",
                () if v6.is_multicast() => "multicast",
                () if (s[0] & 0xfe00) == 0xfc00 => "unique local (fc00::/7)",
                () if (s[0] & 0xffc0) == 0xfe80 => "link-local",
                () if s[0] == 0x64 && s[1] == 0xff9b => "NAT64 (64:ff9b::/96)",
                () => return None,
            };
            Some(class)
        }
    }
}

/// Why an address was refused, and what lets the route reach it.
fn prohibited_diag(addr: SocketAddr, route: &Route) -> String {
    let class = prohibited_class(addr.ip()).unwrap_or("prohibited");
    format!(
        "{} is a {class} address, which routes may not reach by name; if route {} should reach \
         it, pin it there with `resolve = \"{addr}\"` or set `allow_private = true`",
        addr.ip(),
        route.id
    )
}

/// Adds every certificate of the PEM file at `path` to `roots`.
pub fn add_pem_roots(
    roots: &mut rustls::RootCertStore,
    path: &std::path::Path,
) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| fail(&e))? {
        roots
            .add(cert.map_err(|e| fail(&e))?)
            .map_err(|e| fail(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ssrf_guard_covers_the_usual_ranges() {
        for bad in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "224.0.0.1",
        ] {
            assert!(is_prohibited(bad.parse().unwrap()), "{bad}");
        }
        for good in ["8.8.8.8", "140.82.112.3", "2606:4700::1111", "100.128.0.1"] {
            assert!(!is_prohibited(good.parse().unwrap()), "{good}");
        }
    }
}
