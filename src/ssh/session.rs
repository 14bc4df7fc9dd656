//! The agent's SSH session, terminated with postern's host key. The preamble already named
//! agent and target, so the agent's own user auth (`none` or any key) is accepted (SPEC
//! §5.5). Per session channel: `exec` → `commands` → the `ExecDispatch` seam; everything
//! else is refused (`UNSUPPORTED_ACTION`), journaled, and never gets an exit-status.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelId, ChannelMsg};
use tokio::sync::mpsc;

use super::dispatch::{
    AgentChannel, AgentInput, ExecCall, ExecDispatch, InputEvent, REPORT_INVOCATION_ENV,
};
use super::refuse::{self, Refused};
use crate::config::Rate;
use crate::config::{CommandRefusal, SshTarget};
use crate::contract::{Code, unjournaled_refusal};
use crate::journal::{Failure, Journal};
use crate::lifecycle::rate_limit::{Limited, RateLimits, refusal};
use crate::lifecycle::refusals::RefusalRate;

/// Agent stdin messages buffered per channel before the dispatch reads them.
const INPUT_BUFFER: usize = 32;

/// Session channels one session may hold open before it uses them (sshd's `MaxSessions`
/// default): each holds a queue and a task, so an agent may not open them without end.
pub(crate) const MAX_UNUSED_CHANNELS: usize = 10;

/// Refusals one session may get before postern closes it: a session that keeps asking for
/// what it may not have is probing or flooding, not working.
pub(crate) const MAX_SESSION_REFUSALS: u32 = 32;

/// One agent connection after `OK`.
pub(crate) struct AgentSession {
    pub journal: Journal,
    pub dispatch: Arc<dyn ExecDispatch>,
    pub agent: String,
    pub target: Arc<SshTarget>,
    pub source: IpAddr,
    /// Each open session channel's stdin, until an exec takes it.
    pub inputs: HashMap<ChannelId, mpsc::Receiver<InputEvent>>,
    /// Channels whose client asked for the invocation id.
    pub report: std::collections::HashSet<ChannelId>,
    /// How often refusals are journaled, per agent over all its sessions.
    pub refusal_rate: Arc<RefusalRate>,
    /// Refusals past that rate: answered all the same, only counted.
    pub unjournaled: Counter,
    /// Refusals on this session so far.
    pub refused: u32,
    /// The agent's `rate_limit` and the buckets it draws on, if it has one.
    pub rate: Option<(Arc<RateLimits>, Rate)>,
    /// Suspended agents (SPEC §5.8): checked on every exec, not only at the preamble.
    pub suspended: Arc<crate::lifecycle::suspended::Suspended>,
}

/// Moves the channel's stdin into a queue, so the session never stalls on a full channel
/// buffer; a refused channel's queue is dropped and its input discarded.
async fn drain(mut channel: Channel<Msg>, tx: mpsc::Sender<InputEvent>) {
    while let Some(msg) = channel.wait().await {
        let event = match msg {
            ChannelMsg::Data { data } => InputEvent::Data(data),
            ChannelMsg::Eof => InputEvent::Eof,
            ChannelMsg::Close => break,
            _ => continue,
        };
        if !tx.is_closed() {
            let _ = tx.send(event).await;
        }
    }
}

impl AgentSession {
    /// Journals a refused channel request and tells the agent on the channel's stderr.
    fn refuse_channel(&mut self, id: ChannelId, session: &mut Session, what: Refusal) {
        self.inputs.remove(&id);
        self.journal_refusal(what, Some(AgentChannel::new(session.handle(), id)));
        self.close_if_it_keeps_asking(session);
    }

    /// Journals a refusal that has no channel to write to (forwarding requests).
    fn refuse_quietly(&mut self, session: &mut Session, what: Refusal) {
        self.journal_refusal(what, None);
        self.close_if_it_keeps_asking(session);
    }

    fn close_if_it_keeps_asking(&self, session: &mut Session) {
        if self.refused >= MAX_SESSION_REFUSALS {
            tracing::info!(agent = %self.agent, refused = self.refused, "closing an SSH session that keeps asking for refused things");
            let _ = session.disconnect(
                russh::Disconnect::ByApplication,
                "postern: too many refused requests on this session",
                "",
            );
        }
    }

    /// Past the agent's journaling rate the refusal is answered with an unjournaled
    /// envelope and counted, so one session cannot fill the disk with them.
    fn journal_refusal(&mut self, what: Refusal, channel: Option<AgentChannel>) {
        self.refused = self.refused.saturating_add(1);
        if !self.refusal_rate.may_journal(&self.agent) {
            self.unjournaled.inc();
            if let Some(channel) = channel {
                let field = what.failure.field.clone().unwrap_or_default();
                let envelope = unjournaled_refusal(what.failure.code, &field);
                tokio::spawn(async move {
                    let _ = channel.refuse(&envelope).await;
                });
            }
            return;
        }
        let journal = self.journal.clone();
        let (agent, target) = (self.agent.clone(), self.target.url());
        tokio::spawn(async move {
            let refused = Refused {
                agent: &agent,
                target,
                method: what.method,
                command: what.command,
            };
            let envelope = refuse::journal(&journal, refused, what.failure).await;
            if let Some(channel) = channel {
                let _ = channel.refuse(&envelope).await;
            }
        });
    }

    /// SPEC §5.8: an exec draws on its agent's `rate_limit` like an HTTP request does.
    fn over_rate(&self) -> Option<Failure> {
        let (rates, rate) = self.rate.as_ref()?;
        let limit = [(Limited::Agent(self.agent.clone()), *rate)];
        let (who, wait) = rates.admit(&limit).err()?;
        Some(refusal(&who, wait))
    }

    /// `UNSUPPORTED_ACTION` for `method` (config accepts no `allow` value but exec).
    fn unsupported(&self, method: &'static str) -> Refusal {
        Refusal {
            method,
            command: None,
            failure: refuse::failure(Code::UnsupportedAction, "action"),
        }
    }
}

/// `ROUTE_DENIED` for `command`; shell syntax is named, so the operator knows the way out.
fn command_denied(why: CommandRefusal) -> Failure {
    let mut failure = refuse::failure(Code::RouteDenied, "command");
    if let CommandRefusal::ShellSyntax(c) = why {
        let shown = c.escape_default().to_string();
        let note = format!(
            "the command holds shell syntax (`{shown}`), which the target's commands patterns cannot see through; the target allows it only with shell_syntax = true"
        );
        failure.evidence.insert("shell_syntax".into(), shown.into());
        failure.evidence.insert("note".into(), note.into());
    }
    failure
}

/// A NUL or other control character (tab aside) in a command.
fn holds_control(command: &str) -> bool {
    command.chars().any(|c| c.is_control() && c != '\t')
}

/// A refused request, for the journal.
struct Refusal {
    method: &'static str,
    command: Option<String>,
    failure: Failure,
}

impl russh::server::Handler for AgentSession {
    type Error = russh::Error;

    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        Ok(Auth::Accept)
    }

    async fn auth_publickey(
        &mut self,
        _: &str,
        _: russh::server::VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.inputs.len() >= MAX_UNUSED_CHANNELS {
            let mut refusal = self.unsupported("session");
            let evidence = &mut refusal.failure.evidence;
            evidence.insert("unused_channels".into(), MAX_UNUSED_CHANNELS.into());
            let note =
                "too many session channels open and not yet used: run a command on one or close it";
            evidence.insert("note".into(), note.into());
            self.refuse_quietly(session, refusal);
            reply
                .reject(russh::ChannelOpenFailure::ResourceShortage)
                .await;
            return Ok(());
        }
        reply.accept().await;
        let (tx, rx) = mpsc::channel(INPUT_BUFFER);
        self.inputs.insert(channel.id(), rx);
        tokio::spawn(drain(channel, tx));
        Ok(())
    }

    /// A channel closed before any exec gives its place back.
    async fn channel_close(
        &mut self,
        id: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.inputs.remove(&id);
        self.report.remove(&id);
        Ok(())
    }

    async fn exec_request(
        &mut self,
        id: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Ok(command) = String::from_utf8(data.to_vec()) else {
            let mut refusal = self.unsupported("exec");
            refusal.failure = refuse::failure(Code::MalformedRequest, "command");
            self.refuse_channel(id, session, refusal);
            return Ok(());
        };
        if holds_control(&command) {
            // It can only fail at the remote (sshd drops a NUL): refused before any connection.
            let refusal = Refusal {
                method: "exec",
                command: Some(command),
                failure: refuse::failure(Code::MalformedRequest, "command"),
            };
            self.refuse_channel(id, session, refusal);
            return Ok(());
        }
        if let Some(why) = self.target.command_refusal(&command) {
            let refusal = Refusal {
                method: "exec",
                command: Some(command),
                failure: command_denied(why),
            };
            self.refuse_channel(id, session, refusal);
            return Ok(());
        }
        // SPEC §5.8: a session opened before its agent was suspended runs no new exec.
        if let Some(failure) = self.suspended.refusal(&self.agent) {
            let refusal = Refusal {
                method: "exec",
                command: Some(command),
                failure,
            };
            self.refuse_channel(id, session, refusal);
            return Ok(());
        }
        if let Some(failure) = self.over_rate() {
            let refusal = Refusal {
                method: "exec",
                command: Some(command),
                failure,
            };
            self.refuse_channel(id, session, refusal);
            return Ok(());
        }
        let Some(rx) = self.inputs.remove(&id) else {
            // A second exec on one channel: the first one owns it.
            session.channel_failure(id)?;
            return Ok(());
        };
        let call = ExecCall {
            agent: self.agent.clone(),
            target: self.target.clone(),
            command,
            source: self.source,
            report_invocation: self.report.remove(&id),
        };
        let channel = AgentChannel::new(session.handle(), id);
        tokio::spawn(self.dispatch.exec(call, channel, AgentInput::new(rx)));
        Ok(())
    }

    async fn shell_request(
        &mut self,
        id: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let refusal = self.unsupported("shell");
        self.refuse_channel(id, session, refusal);
        Ok(())
    }

    async fn subsystem_request(
        &mut self,
        id: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let mut refusal = self.unsupported("subsystem");
        refusal
            .failure
            .evidence
            .insert("subsystem".into(), name.into());
        self.refuse_channel(id, session, refusal);
        Ok(())
    }

    /// No terminal is allocated, but the request is answered with success: `ssh -tt` treats a
    /// refused pty as fatal and exits while the exec it already sent still runs, so the agent
    /// would not see the output of a command that did run. The exec runs without a pty.
    #[allow(clippy::too_many_arguments)]
    async fn pty_request(
        &mut self,
        id: ChannelId,
        _term: &str,
        _cols: u32,
        _rows: u32,
        _pix_w: u32,
        _pix_h: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(id)?;
        Ok(())
    }

    async fn x11_request(
        &mut self,
        id: ChannelId,
        _single: bool,
        _protocol: &str,
        _cookie: &str,
        _screen: u32,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_failure(id)?;
        Ok(())
    }

    /// Only postern's own variable is taken (never passed on); the remote gets no
    /// environment from the agent.
    async fn env_request(
        &mut self,
        id: ChannelId,
        name: &str,
        value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if name == REPORT_INVOCATION_ENV && value == "1" && self.inputs.contains_key(&id) {
            self.report.insert(id);
            session.channel_success(id)?;
        } else {
            session.channel_failure(id)?;
        }
        Ok(())
    }

    /// Agent forwarding would hand the upstream the agent's keys: refused, the exec goes on.
    async fn agent_request(
        &mut self,
        _id: ChannelId,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        let refusal = self.unsupported("agent_forward");
        self.refuse_quietly(session, refusal);
        Ok(false)
    }

    #[allow(clippy::too_many_arguments)]
    async fn channel_open_direct_tcpip(
        &mut self,
        _channel: Channel<Msg>,
        host: &str,
        port: u32,
        _originator: &str,
        _originator_port: u32,
        reply: russh::server::ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let mut refusal = self.unsupported("port_forward");
        let destination = format!("{host}:{port}");
        refusal
            .failure
            .evidence
            .insert("forward".into(), destination.into());
        self.refuse_quietly(session, refusal);
        reply
            .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
            .await;
        Ok(())
    }

    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        let mut refusal = self.unsupported("port_forward");
        let listen = format!("{address}:{port}");
        refusal
            .failure
            .evidence
            .insert("remote_forward".into(), listen.into());
        self.refuse_quietly(session, refusal);
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_nul_or_escape_is_a_control_character_and_a_tab_is_not() {
        for bad in ["echo a\0; id", "ls\u{7f}", "echo \u{9b}31m"] {
            assert!(super::holds_control(bad), "{bad:?}");
        }
        assert!(!super::holds_control("printf 'a\tb' é"));
    }
}
