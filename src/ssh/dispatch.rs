//! The seam between the SSH front and the invocation lifecycle: one `exec` of one agent on
//! one target. The front has identified the agent, matched the target and checked
//! `commands`; everything after (preflight, credential, approval, `upstream` connection
//! stages, `DISPATCH_STARTED`, result, delivery) belongs to the implementation.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use russh::ChannelId;
use russh::server::Handle;
use tokio::sync::mpsc;

use super::refuse::{self, Refused};
use crate::config::SshTarget;
use crate::contract::{Code, Envelope};
use crate::journal::Journal;

/// One `exec` the front accepted for dispatch.
#[derive(Debug, Clone)]
pub struct ExecCall {
    pub agent: String,
    pub target: Arc<SshTarget>,
    pub command: String,
    /// The agent's address (its connection to the SSH front).
    pub source: IpAddr,
}

/// Runs an `exec`. The implementation answers the agent's exec request exactly once
/// (`AgentChannel::accept` or `reject`), relays output, and ends with `exit_status` /
/// `exit_signal` only when the remote sent one — postern never fabricates one
/// (`AgentChannel::refuse` for its own errors).
pub trait ExecDispatch: Send + Sync + 'static {
    fn exec(
        &self,
        call: ExecCall,
        channel: AgentChannel,
        input: AgentInput,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
}

/// Writes to the agent's session channel. Errors mean the agent is gone.
#[derive(Clone)]
pub struct AgentChannel {
    handle: Handle,
    id: ChannelId,
}

/// The agent's channel went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentGone;

impl AgentChannel {
    pub(crate) fn new(handle: Handle, id: ChannelId) -> Self {
        Self { handle, id }
    }

    /// Answers the exec request with success (the command was accepted).
    pub async fn accept(&self) -> Result<(), AgentGone> {
        self.handle
            .channel_success(self.id)
            .await
            .map_err(|_| AgentGone)
    }

    /// Answers the exec request with failure (the remote refused it).
    pub async fn reject(&self) -> Result<(), AgentGone> {
        self.handle
            .channel_failure(self.id)
            .await
            .map_err(|_| AgentGone)
    }

    pub async fn stdout(&self, data: Bytes) -> Result<(), AgentGone> {
        self.handle.data(self.id, data).await.map_err(|_| AgentGone)
    }

    pub async fn stderr(&self, data: Bytes) -> Result<(), AgentGone> {
        self.handle
            .extended_data(self.id, 1, data)
            .await
            .map_err(|_| AgentGone)
    }

    /// The remote's exit status, relayed (never invented).
    pub async fn exit_status(&self, status: u32) -> Result<(), AgentGone> {
        self.handle
            .exit_status_request(self.id, status)
            .await
            .map_err(|_| AgentGone)
    }

    /// The remote's exit signal, relayed.
    pub async fn exit_signal(
        &self,
        signal: russh::Sig,
        core_dumped: bool,
        message: String,
    ) -> Result<(), AgentGone> {
        self.handle
            .exit_signal_request(self.id, signal, core_dumped, message, String::new())
            .await
            .map_err(|_| AgentGone)
    }

    pub async fn eof(&self) -> Result<(), AgentGone> {
        self.handle.eof(self.id).await.map_err(|_| AgentGone)
    }

    pub async fn close(&self) -> Result<(), AgentGone> {
        self.handle.close(self.id).await.map_err(|_| AgentGone)
    }

    /// postern's own error (SPEC §4): success for the request (so the client shows stderr),
    /// one line `postern: <envelope JSON>` on stderr, EOF, close — no exit-status.
    pub async fn refuse(&self, envelope: &Envelope) -> Result<(), AgentGone> {
        self.accept().await?;
        let line = format!("postern: {}\n", refuse::json(envelope));
        self.stderr(Bytes::from(line)).await?;
        self.eof().await?;
        self.close().await
    }
}

/// What the agent sends on its channel after the exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputEvent {
    Data(Bytes),
    Eof,
}

/// The agent's stdin; `None` once the channel closed (or the agent disconnected).
pub struct AgentInput(pub(crate) mpsc::Receiver<InputEvent>);

impl AgentInput {
    pub async fn next(&mut self) -> Option<InputEvent> {
        self.0.recv().await
    }
}

/// The default until the lifecycle is wired in: every exec is refused, journaled, with
/// `UNSUPPORTED_ACTION` and a note saying so.
pub struct NotBuilt {
    pub journal: Journal,
}

/// The note `NotBuilt` puts in the envelope's evidence.
pub const NOT_BUILT_NOTE: &str = "exec dispatch is not built yet";

impl ExecDispatch for NotBuilt {
    fn exec(
        &self,
        call: ExecCall,
        channel: AgentChannel,
        _input: AgentInput,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let journal = self.journal.clone();
        Box::pin(async move {
            let mut failure = refuse::failure(Code::UnsupportedAction, "action");
            failure
                .evidence
                .insert("note".into(), NOT_BUILT_NOTE.into());
            let what = Refused {
                agent: &call.agent,
                target: call.target.url(),
                method: "exec",
                command: Some(call.command.clone()),
            };
            let envelope = refuse::journal(&journal, what, failure).await;
            let _ = channel.refuse(&envelope).await;
        })
    }
}
