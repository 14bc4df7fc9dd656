//! SSH's part of `postern retry`: the recorded command and the kept stdin run again, as a
//! new generation of the same invocation, with no agent attached; the output goes to the
//! stored result (`postern result ID`).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use super::dispatch::{AgentChannel, AgentInput, ExecCall};
use super::exec::Exec;
use super::upstream;
use crate::config::SshTarget;
use crate::contract::Code;
use crate::journal::{Record, StoredRequest, unb64};
use crate::lifecycle::Invocation;
use crate::lifecycle::lease::LeaseTerms;
use crate::lifecycle::retry::{Resend, SnapshotChanged, credential_holds};
use crate::policy::acts_now;

/// Runs kept SSH execs again for `postern retry`.
pub struct SshResend(pub Arc<Exec>);

impl SshResend {
    /// The target the invocation bound, if it still exists as it was named.
    fn target(&self, record: &Record) -> Option<SshTarget> {
        let config = self.0.live.current();
        config
            .ssh_targets
            .iter()
            .find(|t| Some(&t.id) == record.route.as_ref() && t.url() == record.target)
            .cloned()
    }
}

impl Resend for SshResend {
    fn snapshot_holds(&self, record: &Record, _: &StoredRequest) -> Result<(), SnapshotChanged> {
        let changed = |why: &str| Err(SnapshotChanged(why.to_owned()));
        let Some(target) = self.target(record) else {
            return changed("the target it bound no longer exists");
        };
        let config = self.0.live.current();
        if !acts_now(&config, &record.agent)
            || !crate::policy::admits(&target.agents, &record.agent)
        {
            return changed("the agent is no longer allowed on the target");
        }
        if !target.permits_command(record.command.as_deref().unwrap_or_default()) {
            return changed("the target's commands no longer permit the command");
        }
        let Some(bound) = &record.evidence.credential else {
            return Ok(());
        };
        let offered = std::slice::from_ref(&target.credential);
        credential_holds(bound, offered, || {
            upstream::login(&config, &target, &self.0.vault)
                .map(|l| l.evidence.version)
                .map_err(|f| f.code)
        })
    }

    fn terms(&self, record: &Record, note: Option<String>) -> Option<LeaseTerms> {
        let target = self.target(record)?;
        Some(LeaseTerms::for_ssh_target(&target, note))
    }

    fn resend(
        &self,
        inv: Invocation,
        record: Record,
        request: StoredRequest,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let exec = self.0.clone();
        let target = self.target(&record);
        Box::pin(async move {
            let mut inv = inv;
            let stdin = request.body_base64.as_deref().and_then(unb64);
            let (Some(target), Some(command), Some(stdin)) = (target, record.command, stdin) else {
                // `snapshot_holds` saw the target; only an unreadable kept stdin is left.
                let diagnostic = "the kept stdin cannot be read".to_owned();
                inv.fail_with(Code::MalformedRequest, diagnostic).await;
                return;
            };
            let stdin = Bytes::from(stdin);
            let call = ExecCall {
                agent: record.agent,
                target: Arc::new(target),
                command,
                // No agent connection: the operator asked through the CLI or admin API.
                source: IpAddr::V4(Ipv4Addr::LOCALHOST),
                report_invocation: false,
            };
            let input = AgentInput::replay(stdin);
            exec.rerun(inv, call, AgentChannel::detached(), input).await;
        })
    }
}
