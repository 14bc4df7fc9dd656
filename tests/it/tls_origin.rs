//! Loopback HTTPS origins (h1 and h2 by ALPN) with their own CA: one that echoes what it
//! saw, one that counts what it received.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

use crate::origins::Origin;

pub struct TlsOrigin {
    pub addr: SocketAddr,
    /// The CA that signed the origin's certificate (a route's `upstream_ca`).
    pub ca_file: PathBuf,
    _dir: tempfile::TempDir,
}

/// What the origin saw, echoed back as JSON: method, path, version, selected headers, body.
pub fn echo_origin() -> TlsOrigin {
    echo_origin_for("origin.test")
}

/// A test CA and a leaf it signed for `name`.
pub struct Minted {
    pub ca_pem: String,
    pub leaf: rcgen::Certificate,
    pub leaf_key: KeyPair,
}

pub fn mint(name: &str) -> Minted {
    mint_names(&[name])
}

/// One leaf for several names (one origin standing in for several hosts).
pub fn mint_names(names: &[&str]) -> Minted {
    let name = names[0];
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "test upstream CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let sans: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut leaf = CertificateParams::new(sans).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, name);
    let leaf = leaf.signed_by(&leaf_key, &issuer).unwrap();
    Minted {
        ca_pem: ca_cert.pem(),
        leaf,
        leaf_key,
    }
}

/// The echo origin under another name.
pub fn echo_origin_for(name: &str) -> TlsOrigin {
    let service: Handler = Arc::new(|req: Request<Incoming>| {
        Box::pin(async move {
            if req.uri().path() == "/broken-stream" {
                return broken_stream();
            }
            echo(req).await
        })
    });
    serve_tls(name, &[b"h2", b"http/1.1"], Arc::default(), service)
}

/// An origin that counts what it received (its side-effect counter) and answers every
/// request with `status` and `body` after `pause`, keeping connections open for more.
/// `origin.hits` counts requests received whole, `origin.connections` TLS handshakes, and
/// `origin.requests` holds each request as HTTP/1-style text (head and body), whatever
/// its version. `h2`: ALPN offers only `h2`, else only `http/1.1`.
pub struct Counting {
    pub origin: Origin,
    pub tls: TlsOrigin,
}

pub fn counting(h2: bool, pause: Duration, status: u16, body: Bytes) -> Counting {
    let hits = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let connections = Arc::new(AtomicUsize::new(0));
    let (h, r) = (hits.clone(), requests.clone());
    let service: Handler = Arc::new(move |req: Request<Incoming>| {
        let (h, r, body) = (h.clone(), r.clone(), body.clone());
        Box::pin(async move {
            let (parts, incoming) = req.into_parts();
            let Ok(got) = incoming.collect().await else {
                // Not received whole: not counted.
                return Response::new(full(Bytes::new()));
            };
            let mut text = format!("{} {} {:?}\r\n", parts.method, parts.uri, parts.version);
            for (name, value) in &parts.headers {
                let value = String::from_utf8_lossy(value.as_bytes());
                text.push_str(&format!("{name}: {value}\r\n"));
            }
            let mut seen = text.into_bytes();
            seen.extend_from_slice(b"\r\n");
            seen.extend_from_slice(&got.to_bytes());
            h.fetch_add(1, Ordering::SeqCst);
            r.lock().unwrap().push(seen);
            tokio::time::sleep(pause).await;
            let mut resp = Response::new(full(body));
            *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
            resp.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            resp
        })
    });
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let tls = serve_tls("origin.test", alpn, connections.clone(), service);
    let origin = Origin {
        addr: tls.addr,
        hits,
        requests,
        connections,
    };
    Counting { origin, tls }
}

pub type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<TestBody>> + Send>>
        + Send
        + Sync,
>;

/// A TLS acceptor for `name` (a leaf of a fresh CA, written to `dir/upstream-ca.pem`) with
/// these ALPN protocols, and the CA file.
pub fn acceptor(name: &str, alpn: &[&[u8]], dir: &Path) -> (tokio_rustls::TlsAcceptor, PathBuf) {
    let Minted {
        ca_pem,
        leaf,
        leaf_key,
    } = mint(name);
    let ca_file = dir.join("upstream-ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca_file)
}

/// Serves `service` over TLS as `name` (a leaf of a fresh CA) with these ALPN protocols,
/// counting connections in `connections`.
pub fn serve_tls(
    name: &str,
    alpn: &[&[u8]],
    connections: Arc<AtomicUsize>,
    service: Handler,
) -> TlsOrigin {
    let dir = tempfile::tempdir().unwrap();
    let (acceptor, ca_file) = acceptor(name, alpn, dir.path());
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, service) = (acceptor.clone(), service.clone());
                let connections = connections.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    connections.fetch_add(1, Ordering::SeqCst);
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let answer = service(req);
                        async move { Ok::<_, Infallible>(answer.await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
    });
    TlsOrigin {
        addr,
        ca_file,
        _dir: dir,
    }
}

async fn echo(req: Request<Incoming>) -> Response<TestBody> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let h = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let v = serde_json::json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path_and_query().map(|p| p.as_str().to_owned()),
        "version": format!("{:?}", parts.version),
        "authorization": h("authorization"),
        "x-api-key": h("x-api-key"),
        "postern-credential": h("postern-credential"),
        "host": h("host").or_else(|| parts.uri.authority().map(|a| a.to_string())),
        "body": String::from_utf8_lossy(&body),
    });
    let text = v.to_string();
    // HEAD: the length GET would have, no body (hyper's h2 server would send one).
    let head = parts.method == hyper::Method::HEAD;
    let length = text.len();
    let mut resp = Response::new(full(if head {
        Bytes::new()
    } else {
        Bytes::from(text)
    }));
    if head {
        resp.headers_mut()
            .insert("content-length", length.to_string().parse().unwrap());
    }
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    if let Some(to) = parts.uri.query().and_then(|q| q.strip_prefix("redirect=")) {
        *resp.status_mut() = hyper::StatusCode::FOUND;
        resp.headers_mut().insert("location", to.parse().unwrap());
    }
    if let Some(auth) = h("authorization") {
        // Debug endpoints echo what they received in headers, too.
        resp.headers_mut()
            .insert("x-echo-authorization", auth.parse().unwrap());
    }
    resp
}

pub type TestBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

pub fn full(bytes: Bytes) -> TestBody {
    Full::new(bytes)
        .map_err(|never: Infallible| -> std::io::Error { match never {} })
        .boxed()
}

/// An event stream that sends one event, then fails: hyper aborts the stream.
fn broken_stream() -> Response<TestBody> {
    struct Broken {
        sent: bool,
        pause: std::pin::Pin<Box<tokio::time::Sleep>>,
    }
    impl hyper::body::Body for Broken {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            if !self.sent {
                self.sent = true;
                return std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(
                    Bytes::from_static(b"data: one\n\n"),
                ))));
            }
            // Break only after the head and the first event are surely out.
            match self.pause.as_mut().poll(cx) {
                std::task::Poll::Pending => std::task::Poll::Pending,
                std::task::Poll::Ready(()) => {
                    std::task::Poll::Ready(Some(Err(std::io::Error::other("origin broke"))))
                }
            }
        }
    }
    let body = Broken {
        sent: false,
        pause: Box::pin(tokio::time::sleep(std::time::Duration::from_millis(200))),
    };
    let mut resp = Response::new(body.boxed());
    resp.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    resp
}
