//! The kill switch's durable half (SPEC §5.8): which agents an operator suspended. Each
//! suspend or resume is an `AGENT_SUSPENDED` / `AGENT_RESUMED` event of the daemon's own,
//! and the same write sets or removes the agent's row in a small keyspace, so a restart
//! reads the set back without replaying the chain — and retention, which prunes old
//! events, cannot lift a suspension.

use serde::{Deserialize, Serialize};

use super::event::{AgentSwitch, Body, Draft, Event, Source};
use super::{Journal, JournalError, StoreError};

/// One suspended agent's row: where the operator's action is chained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspension {
    pub agent: String,
    /// The `AGENT_SUSPENDED` event's own id (`sus_<ULID>`): `postern actions show` it.
    pub id: String,
    /// That event's seq.
    pub seq: u64,
    /// That event's `ts` (RFC 3339 UTC).
    pub since: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A row written with its event: `Some` suspends, `None` (resume) removes the agent's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuspensionWrite {
    pub agent: String,
    pub row: Option<Suspension>,
}

impl SuspensionWrite {
    /// The row a sealed `AGENT_SUSPENDED` / `AGENT_RESUMED` event stands for.
    pub(super) fn of(event: &Event, switch: &AgentSwitch, suspend: bool) -> Self {
        let row = suspend.then(|| Suspension {
            agent: switch.agent.clone(),
            id: event.invocation_id.clone(),
            seq: event.seq,
            since: event.ts.clone(),
            note: switch.note.clone(),
        });
        Self {
            agent: switch.agent.clone(),
            row,
        }
    }
}

impl Journal {
    /// Chains an operator's suspend (or resume) of `agent` and writes its row in the same
    /// durable write; the event's id and seq once synced.
    pub async fn switch_agent(
        &self,
        agent: &str,
        suspend: bool,
        note: Option<String>,
    ) -> Result<(String, u64), JournalError> {
        let prefix = if suspend { "sus" } else { "rsm" };
        let id = format!("{prefix}_{}", ulid::Ulid::generate());
        let switch = AgentSwitch {
            agent: agent.to_owned(),
            note,
        };
        let body = match suspend {
            true => Body::AgentSuspended(switch),
            false => Body::AgentResumed(switch),
        };
        let draft = Draft::observed(body)
            .source(Source::OperatorAttested)
            .hop("postern");
        let seq = self.note(&id, draft).await?;
        Ok((id, seq))
    }

    /// Every suspended agent, as stored.
    pub fn suspensions(&self) -> Result<Vec<Suspension>, StoreError> {
        self.store.suspensions()
    }
}
