//! The kill switch (SPEC §5.8): `postern agents suspend ID` / `resume ID`. One set of
//! suspended agents, read by the HTTP proxy and the SSH front before anything of a new
//! request or exec is spent, and changed only here: the operator's action is journaled
//! first (`AGENT_SUSPENDED` / `AGENT_RESUMED`, `operator_attested`, with the agent's row in
//! the same write), then put in force, then the agent's held approvals are denied. An
//! exchange already past the check runs to its end and is recorded as usual.

use std::collections::HashMap;
use std::sync::RwLock;

use serde::Serialize;
use serde_json::{Value, json};

use crate::contract::Code;
use crate::journal::{Failure, Journal, JournalError, StoreError, Suspension};
use crate::policy::approvals::Approvals;

/// The suspended agents in force, as the journal's `suspended_agents` rows say.
#[derive(Debug, Default)]
pub struct Suspended {
    agents: RwLock<HashMap<String, Suspension>>,
    /// One switch at a time: "already suspended?" and the write it decides must not race.
    switching: tokio::sync::Mutex<()>,
}

/// What one suspend or resume did, as the admin API answers it.
#[derive(Debug, Clone, Serialize)]
pub struct Switched {
    pub agent: String,
    pub suspended: bool,
    /// False when the agent already was as asked (nothing journaled: idempotent).
    pub changed: bool,
    /// The suspension in force (for a resume: none).
    pub suspension: Option<Suspension>,
    /// The operator event this call chained (`sus_…` / `rsm_…`) and its seq.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Held approvals denied by this suspension.
    pub denied_approvals: Vec<String>,
}

impl Suspended {
    /// The set as the journal left it (at start: suspensions survive a restart), with the
    /// approvals of every suspended agent barred.
    pub fn load(journal: &Journal, approvals: &Approvals) -> Result<Self, StoreError> {
        let rows = journal.suspensions()?;
        for row in &rows {
            approvals.bar(&row.agent, evidence(row));
        }
        let agents = rows.into_iter().map(|r| (r.agent.clone(), r)).collect();
        Ok(Self {
            agents: RwLock::new(agents),
            switching: Default::default(),
        })
    }

    /// The agent's suspension, if it is suspended.
    pub fn of(&self, agent: &str) -> Option<Suspension> {
        self.agents.read().ok()?.get(agent).cloned()
    }

    /// Every suspension in force, by agent id.
    pub fn list(&self) -> Vec<Suspension> {
        let mut out: Vec<Suspension> = self
            .agents
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.agent.cmp(&b.agent));
        out
    }

    /// `AGENT_SUSPENDED` for a request or exec of `agent`, when it is suspended: field
    /// `agent`, evidence naming the operator's event.
    pub fn refusal(&self, agent: &str) -> Option<Failure> {
        let suspension = self.of(agent)?;
        let mut failure = Failure::of(Code::AgentSuspended);
        failure.field = Some("agent".into());
        failure
            .evidence
            .insert("suspension".into(), evidence(&suspension));
        Some(failure)
    }

    /// Suspends (`suspend`) or resumes `agent`; the caller checked that the agent exists.
    pub async fn switch(
        &self,
        journal: &Journal,
        approvals: &Approvals,
        agent: &str,
        suspend: bool,
        note: Option<String>,
    ) -> Result<Switched, JournalError> {
        let _one = self.switching.lock().await;
        let before = self.of(agent);
        if before.is_some() == suspend {
            return Ok(Switched {
                agent: agent.to_owned(),
                suspended: suspend,
                changed: false,
                suspension: before,
                event_id: None,
                seq: None,
                denied_approvals: Vec::new(),
            });
        }
        // Journaled before it is in force: an action that cannot be recorded is not taken.
        let (id, seq) = journal.switch_agent(agent, suspend, note.clone()).await?;
        let suspension = suspend.then(|| Suspension {
            agent: agent.to_owned(),
            id: id.clone(),
            seq,
            since: crate::journal::rfc3339(time::OffsetDateTime::now_utc()),
            note,
        });
        // The stored row holds the event's own `ts`: keep to it where it reads back.
        let suspension = match journal.suspensions() {
            Ok(rows) => rows.into_iter().find(|r| r.agent == agent).or(suspension),
            Err(_) => suspension,
        };
        let denied_approvals = self.apply(approvals, agent, suspension.as_ref());
        Ok(Switched {
            agent: agent.to_owned(),
            suspended: suspend,
            changed: true,
            suspension,
            event_id: Some(id),
            seq: Some(seq),
            denied_approvals,
        })
    }

    /// Puts a journaled switch in force: the set first (new requests are refused), then
    /// the held approvals (denied; and so is any request held from now on).
    fn apply(&self, approvals: &Approvals, agent: &str, now: Option<&Suspension>) -> Vec<String> {
        if let Ok(mut agents) = self.agents.write() {
            match now {
                Some(s) => agents.insert(agent.to_owned(), s.clone()),
                None => agents.remove(agent),
            };
        }
        match now {
            Some(s) => approvals.bar(agent, evidence(s)),
            None => {
                approvals.lift(agent);
                Vec::new()
            }
        }
    }
}

/// The envelope's `suspension` evidence: where the operator's action is chained.
fn evidence(s: &Suspension) -> Value {
    json!({"event_id": s.id, "seq": s.seq, "since": s.since})
}
