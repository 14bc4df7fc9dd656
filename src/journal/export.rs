//! The audit trail as it leaves postern (SPEC §5.8): events in `seq` order, each with its
//! hash and the invocation's agent, route, outcome and code as the journal now proves them.
//! Only these fields leave: never an event's data (bodies, diagnostics), never a secret.

use serde::Serialize;

use super::event::{EventKind, Source};
use super::store::{EventStore, StoreError};
use crate::contract::{Code, Outcome};

/// One exported event.
#[derive(Debug, Clone, Serialize)]
pub struct Exported {
    pub seq: u64,
    pub ts: String,
    pub invocation_id: String,
    pub kind: EventKind,
    pub source: Source,
    pub hop: String,
    pub hash: String,
    pub prev_hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<Code>,
}

/// One page of the export: events from `since`, and where the next page starts.
#[derive(Debug, Serialize)]
pub struct ExportPage {
    pub events: Vec<Exported>,
    pub next_since: u64,
}

/// At most `limit` events with seq >= `since`. A value that does not decode ends the page
/// before it (`audit verify` names it).
pub fn page(store: &dyn EventStore, since: u64, limit: usize) -> Result<ExportPage, StoreError> {
    let mut events: Vec<Exported> = Vec::new();
    let mut last: Option<(String, Option<super::Record>)> = None;
    for raw in store.raw_events(since.max(1), limit)? {
        let Ok(e) = raw.event else {
            break;
        };
        if last.as_ref().is_none_or(|(id, _)| *id != e.invocation_id) {
            let record = facts(store, &e.invocation_id)?;
            last = Some((e.invocation_id.clone(), record));
        }
        let record = last.as_ref().and_then(|(_, r)| r.as_ref());
        events.push(Exported {
            seq: e.seq,
            ts: e.ts,
            invocation_id: e.invocation_id,
            kind: e.kind,
            source: e.source,
            hop: e.hop,
            hash: e.hash,
            prev_hash: e.prev_hash,
            agent: record.map(|r| r.agent.clone()),
            route: record.and_then(|r| r.route.clone()),
            outcome: record.map(|r| r.outcome),
            code: record.and_then(|r| r.code),
        });
        if events.len() >= limit {
            break;
        }
    }
    let next_since = events.last().map_or(since.max(1), |e| e.seq + 1);
    Ok(ExportPage { events, next_since })
}

/// The invocation's record as the journal now proves it. A record that cannot be rebuilt
/// (one of its events does not decode) leaves its events without facts rather than
/// stopping the export at them; any other store failure is the caller's.
fn facts(store: &dyn EventStore, invocation_id: &str) -> Result<Option<super::Record>, StoreError> {
    match store.state(invocation_id) {
        Ok(state) => Ok(state.map(|s| s.record)),
        Err(StoreError::Corrupt { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}
