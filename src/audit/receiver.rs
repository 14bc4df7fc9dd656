//! The OTLP/HTTP receiver: one kept HTTP/1.1 connection (TLS for `https`), one POST of
//! `application/x-protobuf` per batch, a 2xx the ack.
//!
//! The endpoint is the operator's own collector, named in the config: neither routes nor
//! the SSRF guard apply (they police where agents go), and its name is resolved by the
//! system's resolver like any local service. Nothing here journals: an export is no action.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceResponse;
use prost::Message;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::config::{OtlpEndpoint, Scheme};

/// How long one POST may take, connection included: a receiver that never answers stalls
/// the export by this much per try, nothing else.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The most of an answer read (its partial-success note); past it the answer is cut.
const MAX_ANSWER: usize = 64 << 10;

/// Why a batch was not acknowledged. Nothing here carries a secret: the endpoint has
/// none (the config refuses credentials in it) and the body is never quoted.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("the exchange broke: {0}")]
    Exchange(String),
    #[error("answered {status}")]
    Status {
        status: StatusCode,
        /// `Retry-After` in seconds, as a 429 or 503 may say.
        retry_after: Option<Duration>,
    },
    #[error("no answer within {} s", TIMEOUT.as_secs())]
    TimedOut,
}

impl SendError {
    /// How long the receiver asked to be left alone, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// A 2xx: what the receiver says it refused of the batch (OTLP partial success).
#[derive(Debug, Default)]
pub struct Acked {
    pub rejected: i64,
    pub message: String,
}

/// One receiver and the connection kept to it.
pub struct Receiver {
    endpoint: OtlpEndpoint,
    tls: Option<tokio_rustls::TlsConnector>,
    conn: Option<SendRequest<Full<Bytes>>>,
}

impl Receiver {
    pub fn new(endpoint: OtlpEndpoint) -> Result<Self, String> {
        let tls = match endpoint.scheme {
            Scheme::Http => None,
            Scheme::Https => Some(tls_connector()?),
        };
        Ok(Self {
            endpoint,
            tls,
            conn: None,
        })
    }

    /// Posts one batch. A kept connection the receiver closed while idle fails before any
    /// answer: the batch goes once more on a fresh one, not after a backoff.
    pub async fn send(&mut self, body: Bytes) -> Result<Acked, SendError> {
        let reused = self.conn.is_some();
        match self.send_once(body.clone()).await {
            Err(SendError::Exchange(_)) if reused => self.send_once(body).await,
            other => other,
        }
    }

    async fn send_once(&mut self, body: Bytes) -> Result<Acked, SendError> {
        tokio::time::timeout(TIMEOUT, self.exchange(body))
            .await
            .unwrap_or(Err(SendError::TimedOut))
    }

    /// The connection is taken for the exchange and kept again only after a whole answer.
    async fn exchange(&mut self, body: Bytes) -> Result<Acked, SendError> {
        let mut sender = match self.conn.take().filter(|s| !s.is_closed()) {
            Some(sender) => sender,
            None => self.connect().await?,
        };
        let broke = |e: hyper::Error| SendError::Exchange(e.to_string());
        sender.ready().await.map_err(broke)?;
        let req = Request::post(self.endpoint.logs_path())
            .header(header::HOST, self.endpoint.authority())
            .header(header::CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(body))
            .map_err(|e| SendError::Exchange(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(broke)?;
        let status = resp.status();
        let retry_after = retry_after(resp.headers());
        let answer = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| SendError::Exchange(e.to_string()))?
            .to_bytes();
        self.conn = Some(sender);
        if !status.is_success() {
            return Err(SendError::Status {
                status,
                retry_after,
            });
        }
        Ok(partial_success(&answer))
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, SendError> {
        let failed = |e: &dyn std::fmt::Display| SendError::Connect(e.to_string());
        let tcp = TcpStream::connect((self.endpoint.host.as_str(), self.endpoint.port))
            .await
            .map_err(|e| failed(&e))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => handshake(tcp).await,
            Some(tls) => {
                let name =
                    ServerName::try_from(self.endpoint.host.clone()).map_err(|e| failed(&e))?;
                let stream = tls.connect(name, tcp).await.map_err(|e| failed(&e))?;
                handshake(stream).await
            }
        }
    }
}

async fn handshake<S>(io: S) -> Result<SendRequest<Full<Bytes>>, SendError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| SendError::Connect(e.to_string()))?;
    // Ends when the sender is dropped or the receiver closes.
    tokio::spawn(conn);
    Ok(sender)
}

/// System roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured), HTTP/1.1 by ALPN.
fn tls_connector() -> Result<tokio_rustls::TlsConnector, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `Retry-After: <seconds>` (the date form is rare from collectors and is ignored).
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse().ok().map(Duration::from_secs)
}

/// The receiver's partial-success note; an answer that is not one is a plain ack.
fn partial_success(answer: &[u8]) -> Acked {
    let Some(partial) = ExportLogsServiceResponse::decode(answer)
        .ok()
        .and_then(|r| r.partial_success)
    else {
        return Acked::default();
    };
    Acked {
        rejected: partial.rejected_log_records,
        message: partial.error_message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_after_in_seconds_is_read_and_a_date_is_not() {
        let mut h = http::HeaderMap::new();
        h.insert(header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(
            header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn a_partial_success_names_what_the_receiver_refused() {
        use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsPartialSuccess;
        let answer = ExportLogsServiceResponse {
            partial_success: Some(ExportLogsPartialSuccess {
                rejected_log_records: 2,
                error_message: "too old".into(),
            }),
        };
        let acked = partial_success(&answer.encode_to_vec());
        assert_eq!((acked.rejected, acked.message.as_str()), (2, "too old"));
        assert_eq!(partial_success(b"").rejected, 0);
        assert_eq!(partial_success(b"{\"json\":1}").rejected, 0);
    }
}
