//! Admin routes. Every error is `{"error":{"code","message"}}` with a fitting status.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};

use super::state::{
    AdminState, Problem, Reply, error, held_elsewhere, json_reply, not_found, reply_of,
    storage_error,
};
use crate::config::SecretSource;
use crate::contract::{Outcome, Phase};
use crate::journal::{
    Body, Draft, JournalError, Listed, Payload, Reconciliation, Record, Source, StoredResult,
    Whereabouts, unb64,
};
use crate::lifecycle::idempotency::in_progress_on;
use crate::listen::{Guarded, IdleRoster};
use crate::policy::approvals::{Decision, Verdict};
use crate::vault::{KeyState, Vault};

/// A client gets this long to send a request head (and to stay idle between requests).
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Accepts connections, at most `[admin] max_connections` at once.
/// At the cap, the connection idle longest makes room: idle or half-sent connections of
/// another local process cannot lock the operator out.
pub async fn serve(listener: Guarded, state: Arc<AdminState>) {
    let roster = IdleRoster::default();
    let mut listener = listener.evicting(roster.clone());
    loop {
        let (stream, slot) = listener.next().await;
        let state = state.clone();
        let member = Arc::new(roster.join());
        tokio::spawn(async move {
            let _slot = slot;
            let m = member.clone();
            let service = hyper::service::service_fn(move |req| {
                let (state, m) = (state.clone(), m.clone());
                async move {
                    m.busy();
                    let reply = match (local_host(&req), super::console::owns(req.uri().path())) {
                        (false, _) => misdirected().map(UnsyncBoxBody::new),
                        (true, true) => super::console::handle(state, req).await,
                        (true, false) => handle(&state, req).await.map(UnsyncBoxBody::new),
                    };
                    m.idle();
                    Ok::<_, Infallible>(reply)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                () = member.evicted() => {}
            }
        });
    }
}

/// A browser page on another name that resolves here (DNS rebinding) sends that name as
/// `Host`: the listener answers to `localhost` and to addresses only (rebinding needs a name).
fn local_host(req: &Request<Incoming>) -> bool {
    let Some(host) = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
    else {
        return true;
    };
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

fn misdirected() -> Reply {
    error(
        StatusCode::MISDIRECTED_REQUEST,
        "HOST_REFUSED",
        "The admin listener answers to localhost and its own address only.",
    )
}

fn authorized(state: &AdminState, req: &Request<Incoming>) -> bool {
    let config = state.live.current();
    let Some(token) = &config.admin.token else {
        return true;
    };
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110 §11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .is_some_and(|(_, t)| token.matches(t.trim()))
}

async fn handle(state: &AdminState, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = req.method().clone();
    if path == "/healthz" {
        return healthz(state);
    }
    // A page in the operator's browser may post here (with no admin token configured,
    // nothing else would stop it): a state change a browser marks cross-site is refused.
    if method != Method::GET && !super::console::same_origin(req.headers()) {
        let why = "A browser sent this from another site; the admin API takes none.";
        return error(StatusCode::FORBIDDEN, "CROSS_SITE_REFUSED", why);
    }
    if !authorized(state, &req) {
        state.auth_failures.inc();
        return error(
            StatusCode::UNAUTHORIZED,
            "ADMIN_UNAUTHENTICATED",
            "Send Authorization: Bearer <admin token>.",
        );
    }
    match (&method, segments.as_slice()) {
        (&Method::GET, ["metrics"]) => {
            let text = super::metrics::encode(&state.registry);
            let mut r = Response::new(Full::new(Bytes::from(text)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        (&Method::GET, ["v1", "invocations"]) => list(state, &query).await,
        (&Method::GET, ["v1", "invocations", id]) => record(state, id).await,
        (&Method::GET, ["v1", "invocations", id, "events"]) => events(state, id),
        (&Method::GET, ["v1", "invocations", id, "result"]) => result(state, id).await,
        (&Method::GET, ["v1", "invocations", id, "result", "body"]) => {
            let range = req
                .headers()
                .get(header::RANGE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            result_body(state, id, range.as_deref()).await
        }
        (&Method::POST, ["v1", "invocations", id, "reconcile"]) => {
            let id = (*id).to_owned();
            match read_json(req).await {
                Ok(body) => reconcile(state, &id, body).await,
                Err(r) => r,
            }
        }
        (&Method::GET, ["v1", "audit", "export"]) => export(state, &query),
        (&Method::GET, ["v1", "audit", "verify"]) => verify(state, &query).await,
        (&Method::GET, ["v1", "approvals"]) => json_reply(
            StatusCode::OK,
            &json!({"approvals": listed_approvals(state)}),
        ),
        (&Method::POST, ["v1", "approvals", id, verb @ ("approve" | "deny")]) => {
            let id = (*id).to_owned();
            let verdict = match *verb {
                "approve" => Verdict::Approve,
                _ => Verdict::Deny,
            };
            match read_json(req).await {
                Ok(body) => answer(state, &id, verdict, &body).await,
                Err(r) => r,
            }
        }
        (&Method::GET, ["v1", "agents"]) => super::agents::list(state),
        (&Method::POST, ["v1", "agents", id, verb @ ("suspend" | "resume")]) => {
            let (id, suspend) = (percent_decode(id), *verb == "suspend");
            match read_json(req).await {
                Ok(body) => super::agents::switch(state, &id, &body, suspend).await,
                Err(r) => r,
            }
        }
        (&Method::POST, ["v1", "reload"]) => match state.reloader.reload().await {
            Ok(report) => json_reply(StatusCode::OK, &report),
            Err(problems) => json_reply(StatusCode::UNPROCESSABLE_ENTITY, &problems),
        },
        (&Method::POST, ["v1", "invocations", id, "retry"]) => {
            let id = (*id).to_owned();
            match read_json(req).await {
                Ok(body) => super::retry::answer(state, &id, &body).await,
                Err(r) => r,
            }
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "No such admin endpoint.",
        ),
    }
}

fn healthz(state: &AdminState) -> Reply {
    let health = state.journal.health();
    let (status, overall, journal) = if health.is_fatal() {
        (StatusCode::SERVICE_UNAVAILABLE, "failed", "storage_fault")
    } else if health.refusing_dispatch() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "degraded",
            "refusing_dispatch",
        )
    } else {
        (StatusCode::OK, "ok", "ok")
    };
    let vault = match state.vault.key_state() {
        Ok(KeyState::Opens | KeyState::Empty) => "ok",
        _ => "locked",
    };
    let config = state.live.current();
    let missing = missing_names(&config, &state.vault);
    // Credentialed routes fail (VAULT_LOCKED, CREDENTIAL_MISSING) while the rest still serves:
    // degraded, with a 200 a restart would not change. No vault secrets: nothing needs the vault.
    let needs_vault = !secret_names(&config).is_empty();
    // A fleet's store away: keyed and resend-checked requests are refused, the rest serves.
    let cluster = state.journal.shared().map(|s| match s.reachable() {
        true => "ok",
        false => "unreachable",
    });
    let overall = match overall {
        "ok" if (needs_vault && vault == "locked") || !missing.is_empty() => "degraded",
        "ok" if cluster == Some("unreachable") => "degraded",
        other => other,
    };
    let mut body =
        json!({"status": overall, "journal": journal, "vault": vault, "missing_secrets": missing});
    if let Some(cluster) = cluster {
        body["cluster"] = json!(cluster);
    }
    json_reply(status, &body)
}

/// The chain walk; with `?cluster=1` also every fleet node's check against its anchors
/// (SPEC §7), and `ok` only when all hold.
async fn verify(state: &AdminState, query: &str) -> Reply {
    let Ok(report) = state.journal.verify() else {
        return storage_error();
    };
    let mut body = json!(report);
    if !query.split('&').any(|p| p == "cluster=1") {
        return json_reply(StatusCode::OK, &body);
    }
    let Some(shared) = state.journal.shared() else {
        let msg = "this node is not part of a fleet (no [cluster] in its config)";
        return error(StatusCode::BAD_REQUEST, "NOT_A_FLEET", msg);
    };
    match shared.audit(&state.journal).await {
        Ok(cluster) => {
            body["ok"] = json!(report.ok && cluster["ok"] == true);
            body["cluster"] = cluster;
            json_reply(StatusCode::OK, &body)
        }
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "JOURNAL_UNAVAILABLE",
            "The cluster store did not answer: the anchors could not be checked.",
        ),
    }
}

/// `?since=SEQ&limit=N` (1..=5000, 1000 unless given): the audit export's next page.
fn export(state: &AdminState, query: &str) -> Reply {
    let (mut since, mut limit) = (1u64, 1000usize);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let parsed = match k {
            "since" => v.parse().map(|n| since = n).ok(),
            "limit" => v
                .parse()
                .ok()
                .filter(|n| (1..=5000).contains(n))
                .map(|n| limit = n),
            _ => None,
        };
        if parsed.is_none() {
            let why = "since=SEQ and limit=1..5000 are the export's parameters";
            return error(StatusCode::BAD_REQUEST, "BAD_QUERY", why);
        }
    }
    match state.journal.export(since, limit) {
        Ok(page) => json_reply(StatusCode::OK, &json!(page)),
        Err(_) => storage_error(),
    }
}

/// `?agent=&outcome=&phase=&limit=&cursor=`
#[derive(Default)]
struct ListQuery {
    agent: Option<String>,
    outcome: Option<Outcome>,
    phase: Option<Phase>,
    limit: usize,
    cursor: Option<String>,
}

fn parse_list_query(query: &str) -> Result<ListQuery, Box<Reply>> {
    let mut q = ListQuery {
        limit: 50,
        ..ListQuery::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        let bad = |what: &str| Box::new(error(StatusCode::BAD_REQUEST, "BAD_QUERY", what));
        match k {
            "agent" => q.agent = Some(v),
            "outcome" => {
                q.outcome =
                    Some(Outcome::parse(&v).ok_or_else(|| bad("outcome is not a known outcome"))?)
            }
            "phase" => {
                q.phase = Some(Phase::parse(&v).ok_or_else(|| bad("phase is not a known phase"))?)
            }
            "limit" => {
                q.limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| bad("limit must be 1..1000"))?
            }
            "cursor" => q.cursor = Some(v),
            _ => {
                return Err(bad(
                    "unknown query parameter (agent, outcome, phase, limit, cursor)",
                ));
            }
        }
    }
    Ok(q)
}

fn matches(q: &ListQuery, r: &Record) -> bool {
    q.agent.as_ref().is_none_or(|a| &r.agent == a)
        && q.outcome.is_none_or(|o| r.outcome == o)
        && q.phase.is_none_or(|p| r.phase == p)
}

/// Newest first, this node's and (in a fleet) what the other nodes published, each of
/// theirs naming its `node`.
async fn list(state: &AdminState, query: &str) -> Reply {
    let q = match parse_list_query(query) {
        Ok(q) => q,
        Err(r) => return *r,
    };
    if let Some(c) = &q.cursor
        && !matches!(state.journal.find_record(c).await, Ok(Some(_)))
    {
        let msg = "cursor names no invocation (use the `next` of the previous page)";
        return error(StatusCode::BAD_REQUEST, "BAD_QUERY", msg);
    }
    let mut found: Vec<Listed> = Vec::new();
    let mut cursor = q.cursor.clone();
    let mut exhausted = false;
    while found.len() <= q.limit && !exhausted {
        let page = match state
            .journal
            .fleet_records_before(cursor.as_deref(), 256)
            .await
        {
            Ok(p) => p,
            Err(_) => return storage_error(),
        };
        exhausted = page.len() < 256;
        cursor = page.last().map(|l| l.record.invocation_id.clone());
        found.extend(page.into_iter().filter(|l| matches(&q, &l.record)));
    }
    let next = if found.len() > q.limit {
        found.truncate(q.limit);
        found.last().map(|l| l.record.invocation_id.clone())
    } else {
        None
    };
    let invocations: Vec<Value> = found.iter().map(Listed::json).collect();
    json_reply(
        StatusCode::OK,
        &json!({"invocations": invocations, "next": next}),
    )
}

/// The held requests, each marked `stale` when the config in force no longer has its
/// route (or SSH target) for its agent (approving an HTTP request or tunnel then answers
/// `ROUTE_DENIED`, nothing sent).
fn listed_approvals(state: &AdminState) -> Vec<Value> {
    let config = state.live.current();
    state
        .approvals
        .list()
        .into_iter()
        .map(|l| {
            let admits = |id: &str, agents: &crate::config::Agents| {
                id == l.held.route && crate::policy::admits(agents, &l.held.agent)
            };
            let routed = config.routes.iter().any(|r| admits(&r.id, &r.agents))
                || config.ssh_targets.iter().any(|t| admits(&t.id, &t.agents));
            let mut v = json!(l);
            v["stale"] = json!(!routed);
            v
        })
        .collect()
}

/// This node's record, or (in a fleet) the one its owner published, naming the owner;
/// one the owner has not settled yet is in progress there (SPEC §7).
async fn record(state: &AdminState, id: &str) -> Reply {
    match state.journal.locate(id).await {
        Ok(Some(Whereabouts::Here(s))) => json_reply(StatusCode::OK, &json!(s.record)),
        Ok(Some(Whereabouts::There { node, state, .. })) => {
            let mut v = match state {
                Some(s) => json!(s.record),
                None => json!(in_progress_on(id, &node)),
            };
            v["node"] = json!(node);
            json_reply(StatusCode::OK, &v)
        }
        Ok(None) => not_found(id),
        Err(_) => storage_error(),
    }
}

/// A record whose events retention took still answers: its events are gone, it is not.
fn events(state: &AdminState, id: &str) -> Reply {
    match state.journal.events(id) {
        Ok(ev) if ev.is_empty() => match state.journal.record(id) {
            Ok(Some(_)) => json_reply(
                StatusCode::OK,
                &json!({"events": ev, "events_pruned": true}),
            ),
            Ok(None) => not_found(id),
            Err(_) => storage_error(),
        },
        Ok(ev) => json_reply(StatusCode::OK, &json!({"events": ev})),
        Err(_) => storage_error(),
    }
}

async fn result(state: &AdminState, id: &str) -> Reply {
    match state.journal.find_result(id).await {
        Ok(Some(r)) => json_reply(StatusCode::OK, &json!(r)),
        Ok(None) => match state.journal.locate(id).await {
            Ok(Some(_)) => error(
                StatusCode::NOT_FOUND,
                "RESULT_NOT_STORED",
                "This invocation has no stored result (none was committed, or its retention ended).",
            ),
            Ok(None) => not_found(id),
            Err(_) => storage_error(),
        },
        Err(_) => storage_error(),
    }
}

async fn result_body(state: &AdminState, id: &str, range: Option<&str>) -> Reply {
    match state.journal.find_result(id).await {
        Ok(Some(stored)) => body_response(&stored, range).map(Full::new),
        Ok(None) => not_found(id),
        Err(_) => storage_error(),
    }
}

/// `GET …/result/body`, the admin's and an agent's (`postern.internal`): the stored body
/// (an exec's stdout), whole or the one `bytes=` range asked for (SPEC §2).
pub fn body_response(stored: &StoredResult, range: Option<&str>) -> Response<Bytes> {
    let mut r = ranged_body(stored, range);
    // A stored result is the operator's and its agent's: no cache keeps a copy.
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r
}

fn ranged_body(stored: &StoredResult, range: Option<&str>) -> Response<Bytes> {
    let coded = |status: StatusCode, code: &str, message: &str| {
        let body = json!({"error": {"code": code, "message": message}}).to_string();
        let mut r = Response::new(Bytes::from(body));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        r
    };
    let body = match &stored.payload {
        Payload::Http(h) => h.body_base64.as_deref().and_then(unb64),
        Payload::Ssh(s) => unb64(&s.stdout_base64),
        Payload::Tunnel(_) => None,
    };
    let Some(body) = body else {
        let why = "Only the digest of this body was kept.";
        return coded(StatusCode::NOT_FOUND, "BODY_NOT_STORED", why);
    };
    let total = body.len() as u64;
    let Some(spec) = range else {
        let mut r = Response::new(Bytes::from(body));
        r.headers_mut().insert(
            header::ACCEPT_RANGES,
            header::HeaderValue::from_static("bytes"),
        );
        return r;
    };
    let (mut r, content_range) = match parse_range(spec, total) {
        Some((start, end)) => {
            let part = body.get(start as usize..=end as usize).unwrap_or_default();
            let mut r = Response::new(Bytes::copy_from_slice(part));
            *r.status_mut() = StatusCode::PARTIAL_CONTENT;
            (r, format!("bytes {start}-{end}/{total}"))
        }
        None => {
            let why = "The range is outside the body.";
            let r = coded(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "RANGE_NOT_SATISFIABLE",
                why,
            );
            (r, format!("bytes */{total}"))
        }
    };
    if let Ok(v) = header::HeaderValue::from_str(&content_range) {
        r.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    r
}

/// One `bytes=` range, as inclusive offsets within `total`.
pub fn parse_range(spec: &str, total: u64) -> Option<(u64, u64)> {
    let (a, b) = spec.trim().strip_prefix("bytes=")?.split_once('-')?;
    if total == 0 {
        return None;
    }
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().ok()?;
            (total.saturating_sub(n), total - 1)
        }
        (s, "") => (s.parse().ok()?, total - 1),
        (s, e) => (s.parse().ok()?, e.parse::<u64>().ok()?.min(total - 1)),
    };
    (start <= end && start < total).then_some((start, end))
}

/// A JSON body; none at all reads as `{}` (`postern retry` sends none by default).
async fn read_json(req: Request<Incoming>) -> Result<Value, Reply> {
    let bad = |m: &str| error(StatusCode::BAD_REQUEST, "BAD_REQUEST_BODY", m);
    let body = Limited::new(req.into_body(), 64 * 1024)
        .collect()
        .await
        .map_err(|_| bad("The body could not be read (at most 64 KiB)."))?
        .to_bytes();
    if body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(&body).map_err(|_| bad("The body is not JSON."))
}

async fn reconcile(state: &AdminState, id: &str, body: Value) -> Reply {
    let outcome = match body.get("outcome").and_then(Value::as_str) {
        Some("committed") => Outcome::Committed,
        Some("rejected") => Outcome::Rejected,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "BAD_REQUEST_BODY",
                "outcome must be \"committed\" or \"rejected\".",
            );
        }
    };
    let note = body.get("note").and_then(Value::as_str).unwrap_or("");
    reply_of(reconciled(state, id, outcome, note, "api").await)
}

/// Journals an operator's reconciliation (`RECONCILED`, operator_attested) and returns the
/// record: the API's and the console's one path.
pub(super) async fn reconciled(
    state: &AdminState,
    id: &str,
    outcome: Outcome,
    note: &str,
    via: &'static str,
) -> Result<Value, Problem> {
    if note.trim().is_empty() {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST_BODY",
            "note must say how the outcome was established.",
        ));
    }
    match state.journal.record(id) {
        Ok(Some(_)) => {}
        Ok(None) => return Err(held_elsewhere(state, id).await),
        Err(_) => return Err(Problem::storage()),
    }
    let draft = Draft::observed(Body::Reconciled(Reconciliation {
        outcome,
        note: note.to_owned(),
        unsafe_retry: None,
        via: Some(via.to_owned()),
    }))
    .source(Source::OperatorAttested)
    .hop("postern");
    match state.journal.append(id, vec![draft]).await {
        Ok(appended) => Ok(json!(appended.state.record)),
        Err(JournalError::Refused(refusal)) => Err(Problem::new(
            StatusCode::CONFLICT,
            "RECONCILE_REFUSED",
            refusal.to_string(),
        )),
        Err(JournalError::Unavailable | JournalError::SharedUnavailable) => Err(Problem::storage()),
    }
}

/// An operator's verdict on a held request (`{"note": "…"}` optional); replies with the
/// record once it is journaled.
async fn answer(state: &AdminState, id: &str, verdict: Verdict, body: &Value) -> Reply {
    let note = match body.get("note") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.len() <= 1024 => Some(s.clone()),
        Some(_) => {
            let why = "note must be a string of at most 1024 bytes.";
            return error(StatusCode::BAD_REQUEST, "BAD_REQUEST_BODY", why);
        }
    };
    let decision = Decision {
        verdict,
        note: note.filter(|n| !n.trim().is_empty()),
        via: "api",
    };
    reply_of(decided(state, id, decision).await)
}

/// Hands a decision to a held request and waits for its journaled record: the API's and
/// the console's one path.
pub(super) async fn decided(
    state: &AdminState,
    id: &str,
    decision: Decision,
) -> Result<Value, Problem> {
    let Some(recorded) = state.approvals.answer(id, decision) else {
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            "NOT_PENDING",
            "No request is waiting for approval under this id.",
        ));
    };
    recorded.await.map_err(|_| {
        Problem::new(
            StatusCode::CONFLICT,
            "NOT_PENDING",
            "The request stopped waiting before the answer was recorded.",
        )
    })
}

pub(super) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |j: usize| bytes.get(j).and_then(|b| (*b as char).to_digit(16));
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One sentence per credential whose secret is missing (a vault entry not set, a file
/// absent, a variable unset, a command failing): names only, never a value.
pub fn missing_secrets(config: &crate::config::Config, vault: &Vault) -> Vec<String> {
    vault
        .unavailable(config)
        .into_iter()
        .map(|u| match u.source {
            SecretSource::Vault(name) => format!(
                "credential {}: secret {name} is not in the vault; its requests fail with \
                 CREDENTIAL_MISSING until `postern secret set {name}`",
                u.credential
            ),
            _ => format!(
                "credential {}: {}; its requests fail with CREDENTIAL_MISSING",
                u.credential, u.why
            ),
        })
        .collect()
}

/// `/healthz`'s `missing_secrets`: each missing secret's source label, once.
fn missing_names(config: &crate::config::Config, vault: &Vault) -> Vec<String> {
    let mut names: Vec<String> = vault
        .unavailable(config)
        .iter()
        .map(|u| u.source.label())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The vault entry names the configured credentials use.
pub fn secret_names(config: &crate::config::Config) -> Vec<String> {
    let mut names: Vec<String> = config
        .credentials
        .iter()
        .filter_map(|c| match &c.secret {
            SecretSource::Vault(name) => Some(name.clone()),
            _ => None,
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("bytes=0-3", 10), Some((0, 3)));
        assert_eq!(parse_range("bytes=4-", 10), Some((4, 9)));
        assert_eq!(parse_range("bytes=-3", 10), Some((7, 9)));
        assert_eq!(parse_range("bytes=5-100", 10), Some((5, 9)));
        assert_eq!(parse_range("bytes=10-", 10), None);
        assert_eq!(parse_range("bytes=3-1", 10), None);
        assert_eq!(parse_range("items=0-1", 10), None);
        assert_eq!(parse_range("bytes=0-0", 0), None);
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b+c"), "a b c");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
