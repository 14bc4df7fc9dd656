//! Resends on an HTTP route (SPEC §3.7): before preflight, an identical request (same
//! agent, route and fingerprint) is looked up in the twin index, and `lifecycle::twin`
//! judges what it gets. A resend that goes out claims the twin slot with its preflight
//! (compare-and-set on the entry the lookup saw); one that loses the slot to another
//! request judges again against the winner. The answers that need no dispatch are
//! rendered here: `ATTEMPT_IN_PROGRESS` (with `Retry-After: 1`), the twin's stored result
//! (`Postern-Replayed: true`), `RESEND_REFUSED`; a same-key retry becomes a new generation
//! of the twin, which the idempotency path (`keyed`) then sends with the twin's key.

use http::{HeaderMap, HeaderValue, Response, header};
use serde_json::json;

use crate::config::Route;
use crate::contract::{Code, Envelope};
use crate::http::Exchange;
use crate::http::deliver::flushed::FlushWatch;
use crate::http::deliver::outgoing::Outgoing;
use crate::http::message::respond::{self, ProxyBody};
use crate::journal::Dispatch;
use crate::journal::Whereabouts;
use crate::journal::{
    Claims, Failure, JournalError, KeyClaim, Refusal, ResendEvidence, State, TwinClaim, TwinEntry,
    TwinSlot, unix_ms,
};
use crate::lifecycle::idempotency::in_progress_on;
use crate::lifecycle::lease::{LeaseError, LeaseTerms, attempt_in_progress};
use crate::lifecycle::twin::{Verdict, departure_matters, judge, judge_departed, twin_ref};
use crate::lifecycle::{Boundary, Invocation};

/// The request header that asks for a new invocation whatever the twin.
pub const POSTERN_RESEND: &str = "postern-resend";

/// How long an identical request waits before it is sent beside a twin whose agent waits.
const PARALLEL_SETTLE: std::time::Duration = std::time::Duration::from_millis(5);
/// The same where the twin's connection is asked through the kernel: a close shows there at
/// once, so this is only for a relay between agent and postern (`postern jail`'s, a
/// port forward) still carrying the close while the resend came through.
const LINE_SETTLE: std::time::Duration = std::time::Duration::from_millis(1);
/// How often the settle looks for the twin's agent's departure.
const SETTLE_STEP: std::time::Duration = std::time::Duration::from_millis(1);

/// A lost slot is judged again this many times before the request gives up (each loss
/// means another identical request just took the slot).
const MAX_REJUDGE: usize = 3;

/// What the resend check leaves for preflight: the evidence it journals (a resend sent
/// anyway) and the slot claim riding its write (in `Exchange::twin`).
pub(in crate::http) type Resend = Result<Option<ResendEvidence>, Response<ProxyBody>>;

impl Exchange {
    /// SPEC §3.7, before the idempotency key and preflight. Answers now (nothing sent), or
    /// goes on: as a new invocation claiming the slot, or as the twin's next generation.
    pub(in crate::http) async fn resend_check(
        &mut self,
        route: &Route,
        headers: &HeaderMap,
        fingerprint: &str,
        idempotent: bool,
    ) -> Resend {
        // A route that forbids it judges a "deliberate" resend like any other.
        let deliberate = match deliberate(headers) {
            Ok(d) => d && route.allow_deliberate_resend,
            Err(()) => {
                let mut f = Failure::of(Code::MalformedRequest);
                f.field = Some(format!("headers.{POSTERN_RESEND}"));
                return Err(self.fail(vec![], f).await);
            }
        };
        if !resend_checked(route, headers, idempotent) || self.inv.leased() {
            return Ok(None);
        }
        let slot = TwinSlot {
            agent: self.agent.clone(),
            route: route.id.clone(),
            fingerprint: fingerprint.to_owned(),
        };
        let journal = self.proxy.journal.clone();
        if journal.shared().is_some() && !deliberate && route.idempotency.is_none() {
            // In a fleet the claim is the lookup (one round trip): an empty slot is taken
            // with the preflight, and a held one comes back as its holder, judged then
            // (`rejudge`). A keyed route looks first: its verdict may be a same-key retry.
            self.twin = Some(self.twin_claim(route, slot, None));
            return Ok(None);
        }
        let Ok(seen) = journal.find_twin(&slot).await else {
            return Err(self.fallback(Code::JournalUnavailable));
        };
        let (twin, owner) = match &seen {
            Some(e) => match journal.locate(&e.invocation_id).await {
                Ok(found) => split(found),
                Err(_) => return Err(self.fallback(Code::JournalUnavailable)),
            },
            None => (None, None),
        };
        if let (None, Some(node)) = (&twin, &owner) {
            // Claimed on another node and not settled there: it may have run.
            let id = seen.map(|e| e.invocation_id).unwrap_or_default();
            return Err(answer(&in_progress_on(&id, node)));
        }
        let saw = seen.map(|e| e.invocation_id);
        let Some(twin) = twin else {
            self.twin = Some(self.twin_claim(route, slot, saw));
            return Ok(deliberate.then_some(ResendEvidence {
                resend_of: None,
                resend_deliberate: true,
            }));
        };
        if deliberate {
            self.twin = Some(self.twin_claim(route, slot, saw));
            return Ok(Some(ResendEvidence {
                resend_of: Some(twin_ref(&twin)),
                resend_deliberate: true,
            }));
        }
        let (twin, verdict) =
            match judge(&twin, unix_ms(journal.now()), route.idempotency.is_some()) {
                Verdict::Parallel => self.judge_again(route, twin).await?,
                v => (twin, v),
            };
        tracing::debug!(twin = %twin.record.invocation_id, ?verdict, "identical resend");
        // Only the owner leases a new generation: elsewhere a same-key retry is refused.
        let verdict = match (verdict, &owner) {
            (Verdict::SameKey, Some(_)) => Verdict::Refuse,
            (v, _) => v,
        };
        match verdict {
            Verdict::SameKey => self.same_key(route, twin, slot).await,
            v if v.dispatches_anew() => {
                self.twin = Some(self.twin_claim(route, slot, saw));
                Ok(None)
            }
            v => Err(self.answer_from_twin(route, v, &twin, slot).await),
        }
    }

    /// A twin whose agent seems to wait may have lost it a moment ago (issue 40: a resend
    /// right after its agent left was sent). Measured: with the notice waiting for its
    /// journal write, resends 1 ms after the close were all sent again, 10 ms after none;
    /// with the notice in memory at once (`Departures`), none even with no wait at all.
    /// A twin on an HTTP/1 connection of its own is asked through the kernel (its line,
    /// listed until the agent has its answer's head), so its wait is only a relay's margin
    /// (`LINE_SETTLE`); otherwise `PARALLEL_SETTLE` is a margin for a loaded scheduler.
    /// Either ends as soon as the departure shows. Then the twin's record (or its
    /// departure) decides.
    async fn judge_again(
        &mut self,
        route: &Route,
        twin: State,
    ) -> Result<(State, Verdict), Response<ProxyBody>> {
        let id = twin.record.invocation_id.clone();
        let settle = match (departure_matters(&twin), self.proxy.departures.watched(&id)) {
            (false, _) => std::time::Duration::ZERO,
            (true, true) => LINE_SETTLE,
            (true, false) => PARALLEL_SETTLE,
        };
        let settled = tokio::time::Instant::now() + settle;
        let mut left = self.proxy.departures.left(&id);
        while !left && tokio::time::Instant::now() < settled {
            tokio::time::sleep(SETTLE_STEP).await;
            left = self.proxy.departures.left(&id);
        }
        let journal = self.proxy.journal.clone();
        let twin = match journal.locate(&id).await {
            Ok(found) => split(found).0.unwrap_or(twin),
            Err(_) => return Err(self.fallback(Code::JournalUnavailable)),
        };
        let (now, keyed) = (unix_ms(journal.now()), route.idempotency.is_some());
        let verdict = match left {
            true => judge_departed(&twin, now, keyed),
            false => judge(&twin, now, keyed),
        };
        Ok((twin, verdict))
    }

    /// Records the preflight drafts with the index claims riding them (the key binding's
    /// and the twin slot's). A slot another request took meanwhile is judged again
    /// against that request; a key held by another is its `ATTEMPT_IN_PROGRESS`.
    pub(in crate::http) async fn record_claims(
        &mut self,
        drafts: Vec<crate::journal::Draft>,
        key: Option<KeyClaim>,
        route: &Route,
    ) -> Result<(), Response<ProxyBody>> {
        let mut drafts = drafts;
        for round in 0..=MAX_REJUDGE {
            self.watch_line();
            let claims = Claims {
                key: key.clone(),
                twin: self.contended_twin(round),
                reserved: self.key_reserved,
            };
            match self
                .inv
                .record_with(std::mem::take(&mut drafts), claims)
                .await
            {
                Ok(_) => {
                    self.twin = None;
                    return Ok(());
                }
                Err(JournalError::Refused(Refusal::KeyHeld(holder))) => {
                    return match self.proxy.journal.locate(&holder).await {
                        Ok(Some(Whereabouts::Here(s)))
                        | Ok(Some(Whereabouts::There { state: Some(s), .. })) => {
                            Err(respond::envelope(&attempt_in_progress(&s)))
                        }
                        Ok(Some(Whereabouts::There {
                            node, state: None, ..
                        })) => Err(answer(&in_progress_on(&holder, &node))),
                        // Claimed (reserved) a moment ago and not journaled yet.
                        Ok(None) => {
                            let node = journal_node(&self.proxy.journal);
                            Err(answer(&in_progress_on(&holder, &node)))
                        }
                        Err(_) => Err(self.fallback(Code::JournalUnavailable)),
                    };
                }
                Err(JournalError::Refused(Refusal::TwinMoved(holder))) => {
                    self.rejudge(route, &holder).await?;
                }
                Err(_) => return Err(self.fallback(Code::JournalUnavailable)),
            }
        }
        Err(self.fallback(Code::JournalUnavailable))
    }

    /// The dispatch boundary on a pooled connection with the twin slot claimed in the same
    /// write; a lost slot is judged again, as in `record_claims`.
    pub(in crate::http) async fn claimed_boundary(
        &mut self,
        route: &Route,
        dispatch: Dispatch,
    ) -> Result<(), Outgoing> {
        let hop = self.written_to();
        for round in 0..=MAX_REJUDGE {
            self.watch_line();
            let claims = Claims {
                twin: self.contended_twin(round),
                ..Claims::default()
            };
            let crossed = self
                .inv
                .dispatch_boundary_with(vec![], dispatch.clone(), &hop, claims)
                .await;
            match crossed {
                Ok(()) => {
                    self.twin = None;
                    return Ok(());
                }
                Err(Boundary::TwinMoved(holder)) => {
                    self.rejudge(route, &holder)
                        .await
                        .map_err(Outgoing::Respond)?;
                }
                Err(Boundary::Answer(env)) => {
                    return Err(Outgoing::Respond(respond::envelope(&env)));
                }
            }
        }
        Err(Outgoing::Respond(self.fallback(Code::JournalUnavailable)))
    }

    /// Lists the agent's own connection for resends judged against this invocation, before
    /// its slot claim is written (whoever finds the slot finds the line).
    fn watch_line(&mut self) {
        if self.line.is_some() || self.twin.is_none() {
            return;
        }
        let Some(wire) = self.flush.as_ref().and_then(FlushWatch::own_wire) else {
            return;
        };
        self.line = Some(self.proxy.departures.watch(self.inv.id(), wire));
    }

    /// The twin slot to claim in round `round` of `record_claims`/`claimed_boundary`. A slot
    /// that moved `MAX_REJUDGE` times, each holder judged a parallel request whose agent
    /// waits (else the round ended in an answer), is contended by identical requests sent
    /// at once: this one goes out too, without the slot (a later resend is judged against
    /// whichever holds it), rather than failing as if the journal were down.
    fn contended_twin(&mut self, round: usize) -> Option<crate::journal::TwinClaim> {
        if round < MAX_REJUDGE {
            return self.twin.clone();
        }
        self.twin = None;
        None
    }

    /// The slot names `holder` now (it won the compare-and-set): this request judges
    /// again against it, and claims the slot over it if it still goes out.
    async fn rejudge(&mut self, route: &Route, holder: &str) -> Result<(), Response<ProxyBody>> {
        let Some(mut claim) = self.twin.take() else {
            return Err(self.fallback(Code::JournalUnavailable));
        };
        let journal = self.proxy.journal.clone();
        let twin = match journal.locate(holder).await.map(split) {
            Ok((Some(s), _)) => s,
            Ok((None, Some(node))) => return Err(answer(&in_progress_on(holder, &node))),
            Ok((None, None)) => {
                claim.saw = Some(holder.to_owned());
                self.twin = Some(claim);
                return Ok(());
            }
            Err(_) => return Err(self.fallback(Code::JournalUnavailable)),
        };
        let (twin, verdict) =
            match judge(&twin, unix_ms(journal.now()), route.idempotency.is_some()) {
                Verdict::Parallel => self.judge_again(route, twin).await?,
                v => (twin, v),
            };
        if verdict.dispatches_anew() {
            claim.saw = Some(holder.to_owned());
            self.twin = Some(claim);
            return Ok(());
        }
        // Not a same-key retry this late: the preflight bound no key. Nothing is sent.
        let verdict = match verdict {
            Verdict::SameKey => Verdict::Refuse,
            v => v,
        };
        Err(self
            .answer_from_twin(route, verdict, &twin, claim.slot)
            .await)
    }

    /// A same-key retry of an `unknown` twin: its next generation, leased now; `keyed`
    /// then sends the key the twin recorded. The answer is the new generation's.
    async fn same_key(&mut self, route: &Route, twin: State, slot: TwinSlot) -> Resend {
        let id = twin.record.invocation_id.clone();
        let terms = LeaseTerms::for_route(route, Some("identical resend".into()));
        match Invocation::lease(self.proxy.journal.clone(), &id, terms).await {
            Ok(inv) => {
                self.inv = inv;
                // The twin stays the twin; its entry lives on from this use.
                self.twin = Some(self.twin_claim(route, slot, Some(id)));
                Ok(None)
            }
            Err(LeaseError::Resolved(s)) => {
                let now = unix_ms(self.proxy.journal.now());
                match judge(&s, now, route.idempotency.is_some()) {
                    v if v.dispatches_anew() => {
                        self.twin = Some(self.twin_claim(route, slot, Some(id)));
                        Ok(None)
                    }
                    v => Err(self.answer_from_twin(route, v, &s, slot).await),
                }
            }
            Err(LeaseError::NotFound) => {
                self.twin = Some(self.twin_claim(route, slot, Some(id)));
                Ok(None)
            }
            Err(LeaseError::Refused(env)) => Err(answer(&env)),
        }
    }

    /// The answers that send nothing: a use of the twin, which moves its expiry on.
    async fn answer_from_twin(
        &mut self,
        route: &Route,
        verdict: Verdict,
        twin: &State,
        slot: TwinSlot,
    ) -> Response<ProxyBody> {
        let id = twin.record.invocation_id.clone();
        let touch = TwinClaim {
            slot,
            entry: TwinEntry {
                invocation_id: id.clone(),
                expires_at_ms: self.twin_expiry(route),
            },
            saw: Some(id.clone()),
        };
        self.proxy.journal.touch_twin(touch).await;
        match verdict {
            Verdict::InProgress => answer(&attempt_in_progress(twin)),
            Verdict::Replay if matches!(self.proxy.journal.find_result(&id).await, Ok(Some(_))) => {
                self.replay(route, twin).await
            }
            _ => self.refuse_resend(twin).await,
        }
    }

    /// `RESEND_REFUSED`: its own record, naming the twin; never itself a twin.
    async fn refuse_resend(&mut self, twin: &State) -> Response<ProxyBody> {
        let mut f = Failure::of(Code::ResendRefused);
        f.evidence.insert("resend_of".into(), json!(twin_ref(twin)));
        tracing::info!(twin = %twin.record.invocation_id, agent = %self.agent, "refused an identical resend of an invocation that may have run");
        self.fail(vec![], f).await
    }

    /// This invocation's claim on the slot, over the entry the lookup saw.
    fn twin_claim(&self, route: &Route, slot: TwinSlot, saw: Option<String>) -> TwinClaim {
        TwinClaim {
            slot,
            entry: TwinEntry {
                invocation_id: self.inv.id().to_owned(),
                expires_at_ms: self.twin_expiry(route),
            },
            saw,
        }
    }

    fn twin_expiry(&self, route: &Route) -> i64 {
        unix_ms(self.proxy.journal.now() + route.resend_window)
    }
}

/// Whether the twin index has a say: not for an idempotent method, a request carrying the
/// route's idempotency key (§3.4 decides), or a route with `resend_window = "0s"`.
fn resend_checked(route: &Route, headers: &HeaderMap, idempotent: bool) -> bool {
    let own_key = route
        .idempotency
        .as_ref()
        .is_some_and(|c| headers.contains_key(c.header.to_ascii_lowercase().as_str()));
    !idempotent && !own_key && !route.resend_window.is_zero()
}

/// This node's id in a fleet (`local` alone, where a holder is always journaled).
fn journal_node(journal: &crate::journal::Journal) -> String {
    journal
        .shared()
        .map_or_else(|| "local".to_owned(), |s| s.node().to_owned())
}

/// `Postern-Resend: deliberate` (one value, that one; anything else is malformed).
fn deliberate(headers: &HeaderMap) -> Result<bool, ()> {
    let mut values = headers.get_all(POSTERN_RESEND).iter();
    let Some(v) = values.next() else {
        return Ok(false);
    };
    match values.next().is_none() && v.as_bytes().eq_ignore_ascii_case(b"deliberate") {
        true => Ok(true),
        false => Err(()),
    }
}

/// A located invocation's state, and the node that holds it when that is not this one.
/// Another node's unsettled state is not judged here (whether its agent still waits is
/// that node's to know): only its settled one; an unsettled one is in progress there.
fn split(found: Option<Whereabouts>) -> (Option<State>, Option<String>) {
    match found {
        Some(Whereabouts::Here(s)) => (Some(s), None),
        Some(Whereabouts::There { node, state, .. }) => {
            (state.filter(|s| s.progress.closed), Some(node))
        }
        None => (None, None),
    }
}

/// An envelope answer; `ATTEMPT_IN_PROGRESS` tells the agent when to ask again.
fn answer(env: &Envelope) -> Response<ProxyBody> {
    let mut resp = respond::envelope(env);
    if env.error.code == Code::AttemptInProgress {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}
