//! `postern mcp --agent ID` (SPEC §3.9): an MCP server on stdin/stdout, the way an MCP host
//! starts a local server, whose tools act as the agent through the running daemon: each
//! call is a request to postern's proxy with the agent's identity (`agent`), so routes,
//! injection, approvals, journal and guard apply exactly as to the agent's own requests.
//! The tools and what their results say are `tools`.
//!
//! When the MCP pipe closes, the server stops at once and drops its connections: the daemon
//! sees its caller gone (`CALLER_CANCELLED`), the exchange runs on, and its result is kept
//! (`RESULT_DELIVERY_FAILED`/`fetch_result`) for a later session's `fetch_result`.

mod agent;
mod ssh;
mod tools;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use std::pin::Pin;
use std::task::{Context, Poll};

use rmcp::ServiceExt;
use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

pub use agent::{Agent, Ask};
pub use ssh::Front;
pub use tools::{BODY_LIMIT, Tools};

/// The longest JSON-RPC line read; a longer one is dropped (and logged) by the SDK.
const MAX_LINE: usize = 32 * 1024 * 1024;

/// What `postern mcp` needs to act as the agent.
pub struct Settings {
    pub proxy: SocketAddr,
    /// `Basic base64(agent:token)`.
    pub authorization: String,
    /// postern's CA certificate.
    pub ca: PathBuf,
    /// postern's SSH front, with the agent's identity and the front's host key.
    pub front: Front,
    /// The proxy's `max_request_bytes`: a larger body is refused here, as the daemon would
    /// (its early 413 is lost to a client still uploading).
    pub max_request_bytes: u64,
}

/// Serves MCP on stdin/stdout until the client closes it.
pub fn run(settings: Settings) -> ExitCode {
    let agent = match Agent::new(settings.proxy, &settings.authorization, &settings.ca) {
        Ok(a) => a,
        Err(e) => {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("postern mcp: {e}\n").as_bytes(),
            );
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("postern mcp: {e}\n").as_bytes(),
            );
            return ExitCode::from(1);
        }
    };
    let served = runtime.block_on(async move {
        let closed = CancellationToken::new();
        let stdin = PipeIn {
            inner: tokio::io::stdin(),
            closed: closed.clone(),
        };
        // A line carries one call: room for a body at the proxy's default limit (16 MiB) as
        // base64 in JSON.
        let transport =
            rmcp::transport::async_rw::AsyncRwTransport::new_server(stdin, tokio::io::stdout())
                .with_max_line_length(MAX_LINE);
        let service = Tools::new(agent, settings.front, closed)
            .with_body_limit(settings.max_request_bytes)
            .serve(transport)
            .await
            .map_err(|e| e.to_string())?;
        service.waiting().await.map_err(|e| e.to_string())?;
        Ok::<(), String>(())
    });
    // In-flight calls are not waited for: their connections close with the runtime.
    runtime.shutdown_background();
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("postern mcp: {e}\n").as_bytes(),
            );
            ExitCode::from(1)
        }
    }
}

/// The MCP pipe's read end: its end (or failure) cancels every call still running, so none
/// reads its answer to the end for a client that is gone (the daemon then records the
/// delivery failed, and keeps the result).
struct PipeIn {
    inner: tokio::io::Stdin,
    closed: CancellationToken,
}

impl AsyncRead for PipeIn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let ended = match &r {
            Poll::Ready(Ok(())) => buf.filled().len() == before && buf.remaining() > 0,
            Poll::Ready(Err(_)) => true,
            Poll::Pending => false,
        };
        if ended {
            self.closed.cancel();
        }
        r
    }
}
