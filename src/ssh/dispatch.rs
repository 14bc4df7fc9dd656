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
    /// The agent asked to be told the invocation id (`REPORT_INVOCATION_ENV`).
    pub report_invocation: bool,
}

/// The channel environment variable (`env` request, value `1`) by which a client asks for
/// the exec's invocation id: it comes first, as extended data of type
/// `INVOCATION_DATA_TYPE` (RFC 4254 §5.2; stderr is type 1). OpenSSH never asks, so its
/// output is unchanged; `postern mcp` does.
pub const REPORT_INVOCATION_ENV: &str = "POSTERN_REPORT_INVOCATION";
pub const INVOCATION_DATA_TYPE: u32 = 2;

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

/// Writes to the agent's session channel. Errors mean the agent is gone. A detached
/// channel (`postern retry`: the operator is the caller) takes every write and drops it;
/// the output is kept in the stored result.
#[derive(Clone)]
pub struct AgentChannel(Option<(Handle, ChannelId)>);

/// The agent's channel went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentGone;

impl AgentChannel {
    pub(crate) fn new(handle: Handle, id: ChannelId) -> Self {
        Self(Some((handle, id)))
    }

    /// Runs one write on the live channel; a detached one takes it as done.
    async fn on_channel<F, Fut, T, E>(&self, write: F) -> Result<(), AgentGone>
    where
        F: FnOnce(Handle, ChannelId) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match &self.0 {
            None => Ok(()),
            Some((handle, id)) => write(handle.clone(), *id)
                .await
                .map(drop)
                .map_err(|_| AgentGone),
        }
    }

    /// No agent is attached: the exec runs for the journal only.
    pub fn detached() -> Self {
        Self(None)
    }

    /// Answers the exec request with success (the command was accepted).
    pub async fn accept(&self) -> Result<(), AgentGone> {
        self.on_channel(|h, id| async move { h.channel_success(id).await })
            .await
    }

    /// Answers the exec request with failure (the remote refused it).
    pub async fn reject(&self) -> Result<(), AgentGone> {
        self.on_channel(|h, id| async move { h.channel_failure(id).await })
            .await
    }

    pub async fn stdout(&self, data: Bytes) -> Result<(), AgentGone> {
        self.on_channel(|h, id| async move { h.data(id, data).await })
            .await
    }

    /// The invocation id, to a client that asked for it.
    pub async fn invocation(&self, id: &str) -> Result<(), AgentGone> {
        let data = Bytes::from(id.to_owned());
        self.on_channel(
            |h, ch| async move { h.extended_data(ch, INVOCATION_DATA_TYPE, data).await },
        )
        .await
    }

    pub async fn stderr(&self, data: Bytes) -> Result<(), AgentGone> {
        self.on_channel(|h, id| async move { h.extended_data(id, 1, data).await })
            .await
    }

    /// The remote's exit status, relayed (never invented).
    pub async fn exit_status(&self, status: u32) -> Result<(), AgentGone> {
        self.on_channel(|h, id| async move { h.exit_status_request(id, status).await })
            .await
    }

    /// The remote's exit signal, relayed.
    pub async fn exit_signal(
        &self,
        signal: russh::Sig,
        core_dumped: bool,
        message: String,
    ) -> Result<(), AgentGone> {
        self.on_channel(|h, id| async move {
            h.exit_signal_request(id, signal, core_dumped, message, String::new())
                .await
        })
        .await
    }

    pub async fn eof(&self) -> Result<(), AgentGone> {
        self.on_channel(|h, id| async move { h.eof(id).await })
            .await
    }

    pub async fn close(&self) -> Result<(), AgentGone> {
        self.on_channel(|h, id| async move { h.close(id).await })
            .await
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
pub struct AgentInput {
    events: mpsc::Receiver<InputEvent>,
    /// A replayed stdin holds its own sender: after the kept bytes and EOF it stays open
    /// (no caller went away; the operator waits for the record).
    _replay: Option<mpsc::Sender<InputEvent>>,
}

impl AgentInput {
    pub(crate) fn new(events: mpsc::Receiver<InputEvent>) -> Self {
        Self {
            events,
            _replay: None,
        }
    }

    /// The kept stdin of an exec, then EOF (`postern retry`).
    pub fn replay(stdin: Bytes) -> Self {
        let (tx, events) = mpsc::channel(2);
        if !stdin.is_empty() {
            let _ = tx.try_send(InputEvent::Data(stdin));
        }
        let _ = tx.try_send(InputEvent::Eof);
        Self {
            events,
            _replay: Some(tx),
        }
    }

    pub async fn next(&mut self) -> Option<InputEvent> {
        self.events.recv().await
    }

    /// What the agent already sent, without waiting.
    pub fn ready(&mut self) -> Option<InputEvent> {
        self.events.try_recv().ok()
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
