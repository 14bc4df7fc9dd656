//! A new generation of an invocation that did not resolve: `RETRY_LEASED` made durable
//! before anything of the new generation happens (SPEC §2 counters, §3.4 leases).

use crate::contract::{Code, Envelope};
use crate::journal::{Body, Draft, Journal, Lease, Source};

use super::Invocation;

/// What a new generation is allowed.
#[derive(Debug, Clone, Default)]
pub struct LeaseTerms {
    /// `retry_budget` of the route or target: generations after the first.
    pub budget: u32,
    /// An operator vouched that repeating is safe although the verdict said otherwise.
    pub unsafe_override: bool,
    /// The operator's note, journaled with the lease.
    pub note: Option<String>,
}

impl Invocation {
    /// Opens the next generation of `invocation_id`; the returned invocation has not been
    /// dispatched in it. Refused (with the record's envelope) when the budget is spent or
    /// the journal refuses the lease.
    pub async fn lease(
        journal: Journal,
        invocation_id: &str,
        terms: LeaseTerms,
    ) -> Result<Invocation, Envelope> {
        let Ok(Some(state)) = journal.state(invocation_id) else {
            return Err(Self::resumed(journal, invocation_id).fallback(Code::JournalUnavailable));
        };
        let generation = state.record.generation + 1;
        let mut inv = Self::resumed(journal, invocation_id);
        if generation > terms.budget + 1 {
            return Err(inv
                .fail_with(Code::RetryBudgetExhausted, String::new())
                .await);
        }
        let source = match terms.unsafe_override {
            true => Source::OperatorAttested,
            false => Source::TransportObserved,
        };
        let lease = Body::RetryLeased(Lease {
            generation,
            unsafe_override: terms.unsafe_override,
            note: terms.note,
        });
        match inv
            .record(vec![Draft::observed(lease).source(source)])
            .await
        {
            Ok(_) => Ok(inv),
            Err(_) => Err(inv.fallback(Code::AttemptInProgress)),
        }
    }

    fn resumed(journal: Journal, invocation_id: &str) -> Self {
        Self {
            journal,
            id: invocation_id.to_owned(),
            pending: Vec::new(),
            dispatched: false,
            last_attempt: 0,
        }
    }
}
