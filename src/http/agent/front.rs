//! The agent-facing listener: absolute-form `http://` requests and `CONNECT` with TLS
//! interception. It identifies the agent and hands each request to an exchange.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::sniff::FramingSniffer;
use super::{internal, metadata};
use crate::config::{Route, Scheme};
use crate::contract::{Code, unjournaled_refusal};
use crate::http::Inbound;
use crate::http::Proxy;
use crate::http::deliver::flushed::{FlushWatch, Flushed};
use crate::http::deliver::wire::{Wire, WireView};
use crate::http::exchange::drive;
use crate::http::exchange::tunnel;
use crate::http::message::respond::{self, ProxyBody};
use crate::journal::{Accepted, Body, Draft, Failure, Protocol, new_invocation_id};
use crate::lifecycle::refusals::{UNAUTHENTICATED, capped_target};
use crate::listen::{Guarded, HeldSlot, Member, Slot};
use crate::policy::{
    AgentAuth, Target, TargetError, authenticate, connect_denial_field, match_connect,
    match_connect_plain,
};

/// Accepts agent connections, at most `[proxy] max_connections` at once. A connection's
/// slot is shared with the tunnel a `CONNECT` on it opens, so the tunnel counts too. At the
/// cap, the connection idle longest (no request running, none sent yet) makes room: idle or
/// silent connections cannot lock agents out.
pub async fn serve(listener: Guarded, proxy: Arc<Proxy>) {
    let mut listener = listener;
    let roster = listener.idle_roster();
    loop {
        let (stream, slot) = listener.next().await;
        let member = Arc::new(roster.join());
        let source = stream
            .peer_addr()
            .map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        let slot = Arc::new(slot);
        tokio::spawn(async move {
            let header_timeout = proxy.config().proxy.header_read_timeout;
            if first_byte(&stream, header_timeout, &member).await {
                // Boxed: the connection's large future exists only once the agent spoke.
                Box::pin(serve_agent(stream, proxy, (source, slot, member))).await;
            }
        });
    }
}

/// Serves one agent connection's requests until it closes or is evicted.
async fn serve_agent(
    stream: tokio::net::TcpStream,
    proxy: Arc<Proxy>,
    (source, slot, member): (IpAddr, Arc<Slot>, Arc<Member>),
) {
    let header_timeout = proxy.config().proxy.header_read_timeout;
    let (stream, wire) = Wire::new(stream);
    let stream = FramingSniffer::new(stream);
    let conflict = stream.conflict.clone();
    let (stream, watch) = Flushed::new(stream, false, Some(wire));
    let m = member.clone();
    let failed_logins = Arc::new(AtomicU32::new(0));
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(watch.clone());
        req.extensions_mut().insert(HeldSlot(slot.clone()));
        let (proxy, slot, m) = (proxy.clone(), slot.clone(), m.clone());
        let failed_logins = failed_logins.clone();
        let framing_conflict = conflict.load(Ordering::SeqCst);
        async move {
            m.busy();
            let connect = req.method() == Method::CONNECT;
            let from = Peer {
                source,
                slot,
                member: m.clone(),
                failed_logins,
            };
            let resp = front_request(proxy, req, framing_conflict, from).await;
            // An opened `CONNECT` carries a tunnel or intercepted requests from now.
            if connect && resp.status().is_success() {
                return Ok::<_, Infallible>(resp);
            }
            Ok(idle_once_sent(respond::with_retry_hint(resp), m))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::select! {
        _ = conn => {}
        () = member.evicted() => {}
    }
}

/// Whether the agent sent a first byte within the header read timeout (and before its
/// connection was evicted); the head's own timeout runs from there. Until then a connection
/// holds no buffers: a silent one costs ~1.5 KB, not ~16 KB (hyper's connection and its
/// 8 KiB read buffer), so a thousand idle agents fit the memory budget.
async fn first_byte(stream: &tokio::net::TcpStream, limit: Duration, member: &Member) -> bool {
    let mut byte = [0u8; 1];
    tokio::select! {
        peeked = tokio::time::timeout(limit, stream.peek(&mut byte)) => matches!(peeked, Ok(Ok(1))),
        () = member.evicted() => false,
    }
}

/// The connection is idle again once the response body is sent (or dropped): a streamed
/// response is never evicted.
fn idle_once_sent(resp: Response<ProxyBody>, member: Arc<Member>) -> Response<ProxyBody> {
    use http_body_util::BodyExt;
    // A switched connection (WebSocket) carries its relay from now: busy until it closes.
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        return resp;
    }
    resp.map(|inner| IdleAtEnd { inner, member }.boxed())
}

/// A response body that marks its connection idle when it is dropped; framing (length,
/// end of stream) is the inner body's.
struct IdleAtEnd {
    inner: ProxyBody,
    member: Arc<Member>,
}

impl Drop for IdleAtEnd {
    fn drop(&mut self) {
        self.member.idle();
    }
}

impl hyper::body::Body for IdleAtEnd {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

fn plain(status: StatusCode) -> Response<ProxyBody> {
    let mut r = Response::new(respond::full(&b""[..]));
    *r.status_mut() = status;
    r
}

/// Where an agent connection comes from: its address, and its place under the cap.
struct Peer {
    source: IpAddr,
    slot: Arc<Slot>,
    /// Its place on the idle roster: intercepted requests inside a `CONNECT` keep it.
    member: Arc<Member>,
    /// Wrong tokens sent on this connection so far.
    failed_logins: Arc<AtomicU32>,
}

/// Wrong tokens one connection may send; the last one's answer closes it. Per connection,
/// so one agent guessing cannot lock another out.
const MAX_FAILED_LOGINS: u32 = 5;

/// Journals a refusal that happened before any exchange could start.
async fn refuse_early(
    proxy: &Proxy,
    agent: &str,
    target: String,
    method: &str,
    code: Code,
    field: &str,
) -> Response<ProxyBody> {
    if !proxy.journal.records_refusals() || !proxy.refusals.may_journal(agent) {
        proxy.metrics.refusals_unjournaled.inc();
        return respond::envelope(&unjournaled_refusal(code, field));
    }
    let mut failure = Failure::of(code);
    failure.field = Some(field.to_owned());
    let (target, truncated) = capped_target(&target);
    if truncated {
        failure
            .evidence
            .insert("target_truncated".into(), true.into());
    }
    journal_refusal(proxy, agent, target, method, failure).await
}

async fn journal_refusal(
    proxy: &Proxy,
    agent: &str,
    target: String,
    method: &str,
    failure: Failure,
) -> Response<ProxyBody> {
    let id = new_invocation_id();
    let accepted = Draft::observed(Body::ActionAccepted(Accepted {
        agent: agent.to_owned(),
        protocol: Protocol::Https,
        method: Some(method.to_owned()),
        target,
        command: None,
    }));
    match proxy
        .journal
        .append(&id, vec![accepted, Draft::observed(Body::Failed(failure))])
        .await
    {
        Ok(a) => match &a.state.record.envelope {
            Some(env) => respond::envelope(env),
            None => plain(StatusCode::BAD_GATEWAY),
        },
        Err(_) => plain(StatusCode::SERVICE_UNAVAILABLE),
    }
}

async fn identify(
    proxy: &Proxy,
    req: &Request<Incoming>,
    from: &Peer,
) -> Result<String, Response<ProxyBody>> {
    let header = req
        .headers()
        .get(header::PROXY_AUTHORIZATION)
        .map(|v| v.as_bytes());
    match authenticate(&proxy.config(), header) {
        AgentAuth::Anonymous => Ok("anonymous".into()),
        AgentAuth::Agent(id) => Ok(id),
        AgentAuth::Missing => {
            proxy.metrics.auth_challenges.inc();
            Err(respond::challenge())
        }
        AgentAuth::Wrong { claimed } => {
            let mut resp = failed_login(proxy, req, from.source, claimed).await;
            if from.failed_logins.fetch_add(1, Ordering::SeqCst) + 1 >= MAX_FAILED_LOGINS {
                resp.headers_mut()
                    .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
            }
            Err(resp)
        }
    }
}

/// A wrong token: journaled as agent `unauthenticated` with a capped target, at a bounded
/// rate per source; past it refused unjournaled (`invocation_id: null`) and counted.
async fn failed_login(
    proxy: &Proxy,
    req: &Request<Incoming>,
    source: IpAddr,
    claimed: Option<String>,
) -> Response<ProxyBody> {
    const FIELD: &str = "headers.proxy-authorization";
    proxy.metrics.auth_failures.inc();
    if !proxy.journal.records_refusals() || !proxy.failed_logins.may_journal(&source.to_string()) {
        proxy.metrics.auth_failures_unjournaled.inc();
        return respond::envelope(&unjournaled_refusal(Code::AgentUnauthenticated, FIELD));
    }
    // A `CONNECT`'s target is named as its tunnel records are: `https://host:port`.
    let target = match req.method() == Method::CONNECT {
        true => format!("https://{}", req.uri()),
        false => req.uri().to_string(),
    };
    let (target, truncated) = capped_target(&target);
    let (method, _) = capped_target(req.method().as_str());
    let mut failure = Failure::of(Code::AgentUnauthenticated);
    failure.field = Some(FIELD.to_owned());
    if let Some(claimed) = claimed {
        failure
            .evidence
            .insert("claimed_agent".into(), claimed.into());
    }
    failure
        .evidence
        .insert("source_address".into(), source.to_string().into());
    if truncated {
        failure
            .evidence
            .insert("target_truncated".into(), true.into());
    }
    journal_refusal(proxy, UNAUTHENTICATED, target, &method, failure).await
}

async fn front_request(
    proxy: Arc<Proxy>,
    req: Request<Incoming>,
    framing_conflict: bool,
    from: Peer,
) -> Response<ProxyBody> {
    let agent = match identify(&proxy, &req, &from).await {
        Ok(a) => a,
        Err(resp) if req.method() == Method::CONNECT => return respond::explain_in_reason(resp),
        Err(resp) => return resp,
    };
    if req.method() == Method::CONNECT {
        return respond::explain_in_reason(connect(proxy, agent, req, from).await);
    }
    let uri = req.uri();
    if uri
        .host()
        .is_some_and(|h| h.eq_ignore_ascii_case(internal::HOST))
    {
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let google = metadata::service_account(&proxy.config(), &agent).is_some();
        if google && metadata::is_metadata(path) {
            return metadata::respond(&proxy, &agent, req.headers(), path);
        }
        let range = req.headers().get(http::header::RANGE);
        let range = range.and_then(|v| v.to_str().ok());
        return internal::respond(&proxy, &agent, req.method(), path, range).await;
    }
    let target = match (uri.scheme_str(), uri.host()) {
        (Some("http"), Some(host)) => Target::new(
            Scheme::Http,
            host,
            uri.port_u16(),
            uri.path_and_query().map_or("/", |p| p.as_str()),
        ),
        // Absolute https:// to a plain proxy is not how clients speak TLS through us.
        (Some("https"), Some(_)) => Err(TargetError {
            field: "target.scheme",
        }),
        _ => Err(TargetError { field: "target" }),
    };
    match target {
        Ok(target) => {
            let framing_conflict =
                framing_conflict && req.headers().contains_key(header::TRANSFER_ENCODING);
            let inbound = Inbound {
                agent,
                target,
                request: req,
                framing_conflict,
            };
            drive::handle(proxy, inbound).await
        }
        Err(e) => {
            let url = req.uri().to_string();
            let method = req.method().as_str();
            refuse_early(&proxy, &agent, url, method, Code::InvalidTarget, e.field).await
        }
    }
}

/// `CONNECT host:port`: refused unless some route could match; then relayed as a tunnel
/// when the route deciding it says `intercept = false`, else intercepted.
async fn connect(
    proxy: Arc<Proxy>,
    agent: String,
    req: Request<Incoming>,
    from: Peer,
) -> Response<ProxyBody> {
    let Peer { slot, member, .. } = from;
    let authority = req.uri().authority().cloned();
    let Some(authority) = authority else {
        return refuse_early(
            &proxy,
            &agent,
            req.uri().to_string(),
            "CONNECT",
            Code::InvalidTarget,
            "target",
        )
        .await;
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = authority.port_u16().unwrap_or(443);
    let url = format!("https://{authority}");
    let config = proxy.config();
    if host == internal::HOST {
        let mut failure = Failure::of(Code::InvalidTarget);
        failure.field = Some("target.scheme".into());
        failure
            .evidence
            .insert("hint".into(), internal::HINT.into());
        return journal_refusal(&proxy, &agent, url, "CONNECT", failure).await;
    }
    let Some(route) = match_connect(&config, &agent, &host, port) else {
        if match_connect_plain(&config, &agent, &host, port).is_some() {
            // Plain HTTP inside the tunnel (`ws://` clients tunnel): read like `http://`.
            let caller = Caller::of(agent, &req);
            return serve_connected(req, slot, move |io, slot| {
                serve_inner(
                    proxy,
                    caller,
                    (host, port, Scheme::Http),
                    (io, member, slot),
                    false,
                )
            });
        }
        if refuse_inside(&req) {
            // The client cannot read a CONNECT's answer (a proxy-unaware one, behind the
            // jail's transparent listener): let it through and answer each request inside
            // with the refusal, which is matched and journaled as any request's.
            let caller = Caller::of(agent, &req);
            return serve_connected(req, slot, move |io, slot| {
                intercept(proxy, caller, host, port, (io, member, slot))
            });
        }
        let field = connect_denial_field(&config, &agent, &host, port);
        return refuse_early(&proxy, &agent, url, "CONNECT", Code::RouteDenied, field).await;
    };
    if !route.intercept {
        let route = route.clone();
        return connect_tunnel(proxy, agent, route, (&host, port), req, slot).await;
    }
    let caller = Caller::of(agent, &req);
    serve_connected(req, slot, move |io, slot| {
        intercept(proxy, caller, host, port, (io, member, slot))
    })
}

/// `Postern-Refuse-Inside: tls` on a `CONNECT` (sent by `postern jail`'s transparent
/// listeners): a refusal is answered inside the TLS the client expects, not to the CONNECT.
pub const REFUSE_INSIDE: &str = "postern-refuse-inside";

fn refuse_inside(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(REFUSE_INSIDE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"tls"))
}

/// Answers the `CONNECT` with `200` and hands the connection it opens to `serve`.
fn serve_connected<F, Fut>(
    mut req: Request<Incoming>,
    slot: Arc<Slot>,
    serve: F,
) -> Response<ProxyBody>
where
    F: FnOnce(TokioIo<hyper::upgrade::Upgraded>, HeldSlot) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        serve(TokioIo::new(upgraded), HeldSlot(slot)).await;
    });
    plain(StatusCode::OK)
}

/// A `CONNECT` on a tunnel route (`intercept = false`): its target checked as any request's,
/// then relayed unread (`tunnel`).
async fn connect_tunnel(
    proxy: Arc<Proxy>,
    agent: String,
    route: Route,
    (host, port): (&str, u16),
    req: Request<Incoming>,
    slot: Arc<Slot>,
) -> Response<ProxyBody> {
    let target = match Target::new(Scheme::Https, host, Some(port), "/") {
        Ok(t) => t,
        Err(e) => {
            let url = format!("https://{host}:{port}");
            return refuse_early(&proxy, &agent, url, "CONNECT", Code::InvalidTarget, e.field)
                .await;
        }
    };
    let opening = tunnel::Opening {
        agent,
        route,
        target,
    };
    tunnel::open(proxy, opening, req, slot).await
}

/// Terminates the agent's TLS with a minted leaf and serves the requests inside.
async fn intercept(
    proxy: Arc<Proxy>,
    caller: Caller,
    host: String,
    port: u16,
    (io, member, slot): (TokioIo<hyper::upgrade::Upgraded>, Arc<Member>, HeldSlot),
) {
    // No request runs before the agent's TLS handshake: a silent `CONNECT` makes room too.
    member.idle();
    let config = match proxy.authority.server_config(&host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot mint a certificate");
            return;
        }
    };
    let tls = tokio::select! {
        tls = handshake(&proxy, config, io) => tls,
        () = member.evicted() => None,
    };
    let Some(tls) = tls else {
        return;
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    serve_inner(
        proxy,
        caller,
        (host, port, Scheme::Https),
        (tls, member, slot),
        h2,
    )
    .await;
}

/// Who opened a `CONNECT`, with the proof it gave, so every request inside is admitted
/// under the config in force when it arrives.
#[derive(Clone)]
struct Caller {
    agent: String,
    proof: Option<Vec<u8>>,
    /// The TCP connection the `CONNECT` came on, which carries the tunnel's bytes.
    wire: Option<Arc<WireView>>,
}

impl Caller {
    fn of(agent: String, req: &Request<Incoming>) -> Self {
        let proof = req
            .headers()
            .get(header::PROXY_AUTHORIZATION)
            .map(|v| v.as_bytes().to_vec());
        let wire = req
            .extensions()
            .get::<FlushWatch>()
            .and_then(FlushWatch::wire);
        Self { agent, proof, wire }
    }

    fn still_admitted(&self, config: &crate::config::Config) -> Option<String> {
        let same = match authenticate(config, self.proof.as_deref()) {
            AgentAuth::Agent(id) => id == self.agent,
            AgentAuth::Anonymous => self.agent == "anonymous",
            AgentAuth::Missing | AgentAuth::Wrong { .. } => false,
        };
        same.then(|| self.agent.clone())
    }
}

/// Serves the requests inside a `CONNECT` (after TLS, or plain HTTP) for `host:port`.
async fn serve_inner<I>(
    proxy: Arc<Proxy>,
    caller: Caller,
    (host, port, scheme): (String, u16, Scheme),
    (io, member, slot): (I, Arc<Member>, HeldSlot),
    h2: bool,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    // Between requests (HTTP/1), or with no stream open (h2), the connection is idle and
    // may make room at the cap.
    member.idle();
    let m = member.clone();
    let proxy_header_timeout = proxy.config().proxy.header_read_timeout;
    let window = h2_window(proxy.config().proxy.max_request_bytes);
    let io = FramingSniffer::new(io);
    let conflict = io.conflict.clone();
    let (io, watch) = Flushed::new(io, h2, caller.wire.clone());
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(watch.clone());
        req.extensions_mut().insert(slot.clone());
        let proxy = proxy.clone();
        let caller = caller.clone();
        let host = host.clone();
        let m = m.clone();
        m.busy();
        let framing_conflict = conflict.load(Ordering::SeqCst)
            && req.headers().contains_key(header::TRANSFER_ENCODING);
        async move {
            let head = req.method() == Method::HEAD;
            // The tunnel's identity is checked again for every request: a reload that removed
            // the agent or changed its token admits nothing new on a connection it opened before.
            let Some(agent) = caller.still_admitted(&proxy.config()) else {
                proxy.metrics.auth_challenges.inc();
                let resp =
                    respond::fit_to_method(head, respond::with_retry_hint(respond::challenge()));
                return Ok::<_, Infallible>(idle_once_sent(resp, m));
            };
            let path = req
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            let resp = match Target::new(scheme, &host, Some(port), &path) {
                Ok(target) => {
                    let inbound = Inbound {
                        agent,
                        target,
                        request: req,
                        framing_conflict,
                    };
                    drive::handle(proxy, inbound).await
                }
                Err(e) => {
                    let scheme = match scheme {
                        Scheme::Http => "http",
                        Scheme::Https => "https",
                    };
                    let url = format!("{scheme}://{host}:{port}{path}");
                    refuse_early(
                        &proxy,
                        &agent,
                        url,
                        req.method().as_str(),
                        Code::InvalidTarget,
                        e.field,
                    )
                    .await
                }
            };
            let resp = respond::fit_to_method(head, respond::with_retry_hint(resp));
            Ok::<_, Infallible>(idle_once_sent(resp, m))
        }
    });
    // The protocol comes from ALPN, so no connection waits unbounded for a preface.
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(proxy_header_timeout);
    builder
        .http2()
        .initial_stream_window_size(window)
        .initial_connection_window_size(window);
    let builder = if h2 {
        builder.http2_only()
    } else {
        builder.http1_only()
    };
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::select! {
        _ = conn => {}
        () = member.evicted() => {}
    }
}

/// The h2 flow-control window an agent gets, per stream and per connection: one whole request
/// body (`max_request_bytes`, at least hyper's default 1 MiB). postern reads a body whole
/// before dispatch anyway, so a body it accepts never waits for a `WINDOW_UPDATE`: libcurl 7.88
/// (git's push) hangs for good when its window runs out at a body's last bytes. A connection
/// still holds at most one such body unread.
fn h2_window(max_request_bytes: u64) -> u32 {
    const HYPER_DEFAULT: u64 = 1 << 20;
    const H2_MAX: u64 = (1 << 31) - 1;
    let window = max_request_bytes.clamp(HYPER_DEFAULT, H2_MAX);
    u32::try_from(window).unwrap_or(u32::MAX >> 1)
}

/// The agent's TLS handshake, bounded by `[proxy] tls_handshake_timeout`.
async fn handshake(
    proxy: &Proxy,
    config: Arc<rustls::ServerConfig>,
    io: TokioIo<hyper::upgrade::Upgraded>,
) -> Option<tokio_rustls::server::TlsStream<TokioIo<hyper::upgrade::Upgraded>>> {
    let limit = proxy.config().proxy.tls_handshake_timeout;
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(io);
    match tokio::time::timeout(limit, accept).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "agent TLS handshake failed");
            None
        }
        Err(_) => {
            proxy.metrics.tls_handshake_timeouts.inc();
            None
        }
    }
}
