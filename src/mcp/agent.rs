//! `postern mcp`'s requests, sent the way the agent's own would be: to the running daemon's
//! proxy with the agent's `Proxy-Authorization`, `https://` through a `CONNECT` and TLS that
//! trusts postern's CA, `http://` in absolute form. So the daemon applies the same routes,
//! injection, approvals, journal and guard; nothing here decides an outcome.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

/// What a call keeps of a body or output: a result shows 64 KiB of it, and the rest is read
/// (so the daemon sees it delivered), counted, and paged by `fetch_result` from the store.
/// Bounded so that 32 calls at once hold at most 32 MiB.
pub const KEPT_BYTES: usize = 1024 * 1024;

/// The agent, as the daemon's proxy knows it.
pub struct Agent {
    proxy: SocketAddr,
    authorization: HeaderValue,
    tls: Arc<rustls::ClientConfig>,
}

/// One request, its target checked.
pub struct Ask {
    pub method: Method,
    pub url: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Why no answer came back.
#[derive(Debug)]
pub enum Unsent {
    /// Nothing of the request left `postern mcp` (the proxy unreachable, the tunnel or
    /// TLS with postern failed): it cannot have run.
    NotSent(String),
    /// The request may have gone out and no answer came: it may have run.
    Unanswered(String),
}

/// What came back: the daemon's (or, through it, the origin's) answer.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Up to `KEPT_BYTES`.
    pub body: Bytes,
    /// Every body byte read, kept or not.
    pub bytes: u64,
    pub trailers: Option<HeaderMap>,
    /// The body ended at its framing end (else it broke, or was cut off).
    pub complete: bool,
    /// The proxy's own answer to `CONNECT` (a refusal): postern's, never the origin's.
    pub from_proxy: bool,
}

impl Agent {
    /// `ca`: postern's CA certificate (`certs/ca.pem` in its state directory).
    pub fn new(proxy: SocketAddr, authorization: &str, ca: &Path) -> Result<Self, String> {
        let mut roots = rustls::RootCertStore::empty();
        crate::http::origin::upstream::add_pem_roots(&mut roots, ca)
            .map_err(|e| format!("postern's CA {e}"))?;
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let authorization = HeaderValue::from_str(authorization)
            .map_err(|_| "the agent's token cannot be sent in a header".to_owned())?;
        Ok(Self {
            proxy,
            authorization,
            tls: Arc::new(tls),
        })
    }

    /// Sends `ask` through the proxy; `Err` says whether any of it can have gone out.
    pub async fn send(&self, ask: Ask) -> Result<Answer, Unsent> {
        let https = ask.url.scheme_str() == Some("https");
        let host = ask.url.host().unwrap_or_default().to_owned();
        let port = ask.url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let not_sent = Unsent::NotSent;
        let tcp = TcpStream::connect(self.proxy).await.map_err(|e| {
            not_sent(format!(
                "cannot reach postern's proxy at {}: {e}",
                self.proxy
            ))
        })?;
        let _ = tcp.set_nodelay(true);
        if !https {
            let req = self.request(&ask, true).map_err(not_sent)?;
            return exchange(tcp, req).await;
        }
        let opened = match self.connect(tcp, &host, port).await.map_err(not_sent)? {
            Ok(tunnel) => tunnel,
            Err(refusal) => return Ok(refusal),
        };
        let name = ServerName::try_from(host.clone())
            .map_err(|_| not_sent(format!("`{host}` is not a name TLS can check")))?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, TokioIo::new(opened))
            .await
            .map_err(|e| {
                not_sent(format!(
                    "postern answered CONNECT {host}:{port} but not with TLS ({e}): is the route for http://?"
                ))
            })?;
        let req = self.request(&ask, false).map_err(not_sent)?;
        exchange(tls, req).await
    }

    /// `CONNECT host:port`: the tunnel, or postern's refusal of it as the answer.
    async fn connect(
        &self,
        tcp: TcpStream,
        host: &str,
        port: u16,
    ) -> Result<Result<hyper::upgrade::Upgraded, Answer>, String> {
        let (mut sender, conn) = client_builder()
            .handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("postern's proxy: {e}"))?;
        tokio::spawn(conn.with_upgrades());
        let authority = format!("{host}:{port}");
        let req = Request::builder()
            .method(Method::CONNECT)
            .uri(authority.as_str())
            .header(header::HOST, authority.as_str())
            .header(header::PROXY_AUTHORIZATION, self.authorization.clone())
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("CONNECT {authority}: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("postern's proxy refused CONNECT {authority}: {e}"))?;
        if resp.status() != StatusCode::OK {
            let mut refusal = read(resp).await;
            refusal.from_proxy = true;
            return Ok(Err(refusal));
        }
        let upgraded = hyper::upgrade::on(resp)
            .await
            .map_err(|e| format!("CONNECT {authority}: {e}"))?;
        Ok(Ok(upgraded))
    }

    /// The request as the proxy expects it: absolute form (plain http, with the agent's
    /// identity) or origin form inside the tunnel.
    fn request(&self, ask: &Ask, absolute: bool) -> Result<Request<Full<Bytes>>, String> {
        let uri = match absolute {
            true => ask.url.clone(),
            false => ask
                .url
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .parse::<Uri>()
                .map_err(|e| e.to_string())?,
        };
        let mut req = Request::builder()
            .method(ask.method.clone())
            .uri(uri)
            .body(Full::new(ask.body.clone()))
            .map_err(|e| e.to_string())?;
        *req.headers_mut() = ask.headers.clone();
        let h = req.headers_mut();
        if let Some(authority) = ask.url.authority()
            && let Ok(v) = HeaderValue::from_str(authority.as_str())
        {
            h.insert(header::HOST, v);
        }
        // A streamed answer's outcome comes as a trailer.
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        if absolute {
            h.insert(header::PROXY_AUTHORIZATION, self.authorization.clone());
        }
        Ok(req)
    }
}

/// More header room than the daemon allows an origin (hyper's 100) plus the headers
/// postern adds: an answer the daemon passed on is never one this client cannot read (it
/// was delivered, so it would not be replayed).
fn client_builder() -> hyper::client::conn::http1::Builder {
    let mut builder = hyper::client::conn::http1::Builder::new();
    builder.max_headers(256).max_buf_size(1 << 20);
    builder
}

async fn exchange<T>(io: T, req: Request<Full<Bytes>>) -> Result<Answer, Unsent>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = client_builder()
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| Unsent::NotSent(format!("postern's proxy: {e}")))?;
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.map_err(|e| {
        Unsent::Unanswered(format!(
            "postern's proxy closed the connection without an answer: {e}"
        ))
    })?;
    Ok(read(resp).await)
}

/// Reads the whole body (the daemon records a delivery only once it went out), keeping
/// up to `KEPT_BYTES`.
async fn read(resp: Response<Incoming>) -> Answer {
    let (parts, mut body) = resp.into_parts();
    let mut kept = BytesMut::new();
    let mut bytes = 0u64;
    let mut trailers = None;
    let complete = loop {
        match body.frame().await {
            None => break true,
            Some(Err(_)) => break false,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    bytes += data.len() as u64;
                    let room = KEPT_BYTES.saturating_sub(kept.len());
                    kept.extend_from_slice(data.get(..room.min(data.len())).unwrap_or_default());
                }
                Err(frame) => trailers = frame.into_trailers().ok(),
            },
        }
    };
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: kept.freeze(),
        bytes,
        trailers,
        complete,
        from_proxy: false,
    }
}
