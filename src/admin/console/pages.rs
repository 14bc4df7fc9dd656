//! The console's pages (SPEC §5.8), rendered on the server from what the admin API serves:
//! held approvals, `unknown` invocations to reconcile, the journal, one record's timeline,
//! the audit check and the agents. Every value passes `html::esc`.

use std::fmt::Write;

use serde_json::Value;

use super::html::{csrf_field, esc, seg, table};
use crate::admin::state::AdminState;
use crate::contract::{Code, Outcome};
use crate::journal::{Event, Listed, Record};
use crate::policy::approvals;

/// How many records a journal search reads at most (newest first).
const SCAN_LIMIT: usize = 5000;
/// How many rows a list shows.
const SHOW_LIMIT: usize = 100;

/// The held requests, as the live list the page and its script refresh.
pub fn approvals_list(state: &AdminState, csrf: &str) -> String {
    let held = state.approvals.list();
    if held.is_empty() {
        return "<p class=\"empty\">No request is waiting for approval.</p>".into();
    }
    let mut out = String::new();
    for l in held {
        out.push_str(&held_card(&l, csrf));
    }
    out
}

fn held_card(l: &approvals::Listed, csrf: &str) -> String {
    let h = &l.held;
    let id = esc(&h.invocation_id);
    let credential = h.credential.as_deref().map_or("none".into(), esc);
    let gone = match l.caller_gone {
        true => {
            "<p class=\"problem\">The agent stopped waiting: approving still sends it, and its result is stored.</p>"
        }
        false => "",
    };
    let action = format!("/ui/approvals/{}", seg(&h.invocation_id));
    format!(
        "<article class=\"held\" id=\"held-{id}\" data-id=\"{id}\">\
         <h2>{method} <span class=\"target\">{target}</span></h2>{gone}\
         <dl><dt>Invocation</dt><dd><a href=\"/ui/invocations/{link}\">{id}</a></dd>\
         <dt>Agent</dt><dd class=\"agent\">{agent}</dd><dt>Route</dt><dd>{route}</dd>\
         <dt>Credential</dt><dd>{credential}</dd><dt>Fingerprint</dt><dd><code>{fp}</code></dd>\
         <dt>Requested</dt><dd>{at}</dd><dt>Expires</dt><dd>{until}</dd>{headers}\
         <dt>Body</dt><dd>{bytes} bytes (first {preview} shown, sensitive-looking values redacted)\
         <pre class=\"body\">{body}</pre>{hex}{cut}</dd></dl>\
         <form method=\"post\" action=\"{action}/approve\" class=\"decide\">{hidden}\
         <label>Note <input name=\"note\" maxlength=\"1024\"></label>\
         <button type=\"submit\" class=\"approve\">Approve</button>\
         <button type=\"submit\" class=\"deny\" formaction=\"{action}/deny\">Deny</button></form>\
         </article>",
        method = esc(&h.method),
        target = esc(&h.target),
        link = seg(&h.invocation_id),
        agent = esc(&h.agent),
        route = esc(&h.route),
        fp = esc(&h.fingerprint),
        at = esc(&h.requested_at),
        until = esc(&h.expires_at),
        bytes = h.body_bytes,
        preview = approvals::PREVIEW_BYTES,
        body = esc(&h.body_preview),
        hex = h.body_hex.as_deref().map_or(String::new(), |x| {
            format!(
                "<pre class=\"hex\" title=\"the first {} bytes\">{}</pre>",
                approvals::HEX_BYTES,
                esc(x)
            )
        }),
        hidden = csrf_field(csrf),
        headers = match h.headers.is_empty() {
            true => String::new(),
            false => {
                let lines: Vec<String> = h
                    .headers
                    .iter()
                    .map(|(n, v)| format!("{}: {}", esc(n), esc(v)))
                    .collect();
                let more = match h.headers_not_shown {
                    0 => String::new(),
                    n => format!(
                        "<p class=\"problem\">{n} more headers are not shown here, and \
                         approving sends them too: deny what you cannot read whole.</p>"
                    ),
                };
                format!(
                    "<dt>Headers</dt><dd><pre class=\"headers\">{}</pre>{more}</dd>",
                    lines.join("\n")
                )
            }
        },
        cut = match h.body_bytes > approvals::PREVIEW_BYTES {
            true => format!(
                "<p class=\"problem\">The body goes on for {} bytes not shown here, and \
                 approving sends all of it: deny what you cannot read whole.</p>",
                h.body_bytes - approvals::PREVIEW_BYTES
            ),
            false => String::new(),
        },
    )
}

/// The approvals page: the live list, refreshed by the script on every change.
pub fn approvals(state: &AdminState, csrf: &str) -> String {
    format!(
        "<p class=\"hint\">New requests appear here as they are held; a decision made \
         anywhere removes them.</p><section id=\"approvals\" data-live=\"/ui/approvals/list\">{}</section>",
        approvals_list(state, csrf)
    )
}

/// Newest records first, this node's and the fleet's, filtered.
pub async fn search(state: &AdminState, keep: impl Fn(&Record) -> bool) -> Option<Vec<Listed>> {
    let mut found = Vec::new();
    let (mut cursor, mut read) = (None::<String>, 0usize);
    while found.len() < SHOW_LIMIT && read < SCAN_LIMIT {
        let page = state
            .journal
            .fleet_records_before(cursor.as_deref(), 256)
            .await
            .ok()?;
        read += page.len();
        let done = page.len() < 256;
        cursor = page.last().map(|l| l.record.invocation_id.clone());
        found.extend(page.into_iter().filter(|l| keep(&l.record)));
        if done {
            break;
        }
    }
    found.truncate(SHOW_LIMIT);
    Some(found)
}

/// The `unknown` invocations, each with its evidence in words and a reconcile form.
pub async fn reconcile(state: &AdminState, csrf: &str) -> String {
    let Some(found) = search(state, |r| r.outcome == Outcome::Unknown).await else {
        return super::html::notice("The journal could not be read.", true);
    };
    if found.is_empty() {
        return "<p class=\"empty\">No invocation is unknown: nothing to reconcile.</p>".into();
    }
    let mut out = String::from(
        "<p class=\"hint\">Each of these may have happened. Find out at the remote, then \
         record what you found: postern repeats none of them meanwhile.</p>",
    );
    for l in found {
        let r = &l.record;
        let _ = write!(
            out,
            "<article class=\"unknown\" id=\"unknown-{id}\"><h2><a href=\"/ui/invocations/{link}\">{id}</a></h2>\
             <p>{summary}</p><ul class=\"evidence\">{words}</ul>{form}</article>",
            id = esc(&r.invocation_id),
            link = seg(&r.invocation_id),
            summary = summary(r, l.node.as_deref()),
            words = evidence_words(r),
            form = match &l.node {
                None => reconcile_form(&r.invocation_id, csrf),
                Some(node) => format!(
                    "<p class=\"hint\">Node {} holds it: reconcile it on that node's console.</p>",
                    esc(node)
                ),
            },
        );
    }
    out
}

/// The form that records `RECONCILED` (operator_attested).
pub fn reconcile_form(id: &str, csrf: &str) -> String {
    format!(
        "<form method=\"post\" action=\"/ui/invocations/{}/reconcile\" class=\"reconcile\">{}\
         <label>It <select name=\"outcome\"><option value=\"committed\">committed (it took effect)</option>\
         <option value=\"rejected\">rejected (it did not)</option></select></label>\
         <label>How you know <input name=\"note\" required maxlength=\"1024\"></label>\
         <button type=\"submit\">Reconcile</button></form>",
        seg(id),
        csrf_field(csrf)
    )
}

fn summary(r: &Record, node: Option<&str>) -> String {
    let what = r.command.as_deref().or(r.method.as_deref()).unwrap_or("");
    let node = node.map_or(String::new(), |n| format!(" · on node {}", esc(n)));
    format!(
        "<span class=\"agent\">{}</span> · {} {} · route {} · {}{}",
        esc(&r.agent),
        esc(what),
        esc(&r.target),
        esc(r.route.as_deref().unwrap_or("none")),
        esc(&r.created_at),
        node
    )
}

/// What the record proves, one sentence each: what was sent, what came back, where it
/// broke, which hop said so.
pub fn evidence_words(r: &Record) -> String {
    let e = &r.evidence;
    let mut words = vec![
        match (e.dispatch_started, e.request_complete) {
            (false, _) => "Nothing was sent to the remote.".to_owned(),
            (true, true) => "The request was sent completely.".to_owned(),
            (true, false) => {
                "Sending began, but the request may not have been written completely.".to_owned()
            }
        },
        match (e.response_headers_received, e.response_complete) {
            (false, _) => "No response came back.".to_owned(),
            (true, true) => "A complete response came back.".to_owned(),
            (true, false) => "A response began, but did not complete.".to_owned(),
        },
    ];
    words.push(match r.code {
        Some(code) => format!(
            "It stopped in phase {} with code {}: {}",
            r.phase.as_str(),
            code.as_str(),
            code.message()
        ),
        None => format!("It reached phase {} without an error.", r.phase.as_str()),
    });
    if !e.hop.is_empty() {
        words.push(format!("Reported by hop {}.", e.hop));
    }
    if let Some(s) = r.result.as_ref().and_then(|res| res.status) {
        words.push(format!("The stored result has status {s}."));
    }
    let plural = if r.attempts == 1 { "" } else { "s" };
    words.push(format!(
        "Generation {}, {} attempt{plural}; retry says {}.",
        r.generation,
        r.attempts,
        r.retry.as_str()
    ));
    words
        .iter()
        .map(|w| format!("<li>{}</li>", esc(w)))
        .collect()
}

/// The journal's search form and its results.
pub async fn journal(state: &AdminState, q: &Filter) -> String {
    let mut out = q.form();
    if let Some(why) = q.problem() {
        out.push_str(&super::html::notice(why, true));
        return out;
    }
    let Some(found) = search(state, |r| q.keeps(r)).await else {
        out.push_str(&super::html::notice("The journal could not be read.", true));
        return out;
    };
    let rows: Vec<Vec<String>> = found.iter().map(row).collect();
    out.push_str(&table(
        "results",
        &ROW_HEAD,
        &rows,
        "No invocation matches.",
    ));
    if found.len() >= SHOW_LIMIT {
        let more = format!(
            "The newest {SHOW_LIMIT} matches (of the newest {SCAN_LIMIT} invocations): narrow \
             the filter, or page with GET /v1/invocations and its cursor."
        );
        out.push_str(&format!("<p class=\"hint\">{}</p>", esc(&more)));
    }
    out
}

/// The columns of `row`.
const ROW_HEAD: [&str; 7] = [
    "Invocation",
    "Created",
    "Agent",
    "Route",
    "Target",
    "Outcome",
    "Code",
];

fn row(l: &Listed) -> Vec<String> {
    let r = &l.record;
    let what = r.command.as_deref().or(r.method.as_deref()).unwrap_or("");
    vec![
        format!(
            "<a href=\"/ui/invocations/{}\">{}</a>",
            seg(&r.invocation_id),
            esc(&r.invocation_id)
        ),
        esc(&r.created_at),
        esc(&r.agent),
        esc(r.route.as_deref().unwrap_or("")),
        format!("{} {}", esc(what), esc(&r.target)),
        format!("<span class=\"outcome {0}\">{0}</span>", r.outcome.as_str()),
        esc(r.code.map_or("", Code::as_str)),
    ]
}

/// The journal's filter: agent, route, outcome, code, and a time window on `created_at`.
#[derive(Debug, Default)]
pub struct Filter {
    pub agent: String,
    pub route: String,
    pub outcome: String,
    pub code: String,
    pub since: String,
    pub until: String,
}

impl Filter {
    pub fn parse(pairs: &[(String, String)]) -> Filter {
        let mut f = Filter::default();
        for (k, v) in pairs {
            let v = v.trim().to_owned();
            match k.as_str() {
                "agent" => f.agent = v,
                "route" => f.route = v,
                "outcome" => f.outcome = v,
                "code" => f.code = v,
                "since" => f.since = v,
                "until" => f.until = v,
                _ => {}
            }
        }
        f
    }

    /// Why the filter cannot be applied, if it cannot.
    fn problem(&self) -> Option<&'static str> {
        let day = |s: &str| {
            let b = s.as_bytes();
            b.len() >= 10
                && b.iter().take(10).enumerate().all(|(i, c)| match i {
                    4 | 7 => *c == b'-',
                    _ => c.is_ascii_digit(),
                })
        };
        if !self.outcome.is_empty() && Outcome::parse(&self.outcome).is_none() {
            return Some("Outcome is not one of postern's outcomes.");
        }
        if !self.code.is_empty() && Code::parse(&self.code).is_none() {
            return Some("Code is not one of postern's codes.");
        }
        let bad_time = |t: &str| !t.is_empty() && !day(t);
        if bad_time(&self.since) || bad_time(&self.until) {
            return Some("From and To are UTC times like 2026-12-07T14:30.");
        }
        None
    }

    fn keeps(&self, r: &Record) -> bool {
        let is = |want: &str, got: &str| want.is_empty() || want == got;
        is(&self.agent, &r.agent)
            && is(&self.route, r.route.as_deref().unwrap_or(""))
            && is(&self.outcome, r.outcome.as_str())
            && is(&self.code, r.code.map_or("", Code::as_str))
            // RFC 3339 UTC strings compare as times; a datetime-local value is a prefix.
            && (self.since.is_empty() || r.created_at.as_str() >= self.since.as_str())
            && (self.until.is_empty() || r.created_at.as_str() <= self.until.as_str())
    }

    fn form(&self) -> String {
        let mut outcomes = String::from("<option value=\"\">any</option>");
        for o in Outcome::ALL {
            let sel = if o.as_str() == self.outcome {
                " selected"
            } else {
                ""
            };
            let _ = write!(
                outcomes,
                "<option value=\"{0}\"{sel}>{0}</option>",
                o.as_str()
            );
        }
        let mut codes = String::from("<option value=\"\">any</option>");
        for c in Code::ALL {
            let sel = if c.as_str() == self.code {
                " selected"
            } else {
                ""
            };
            let _ = write!(codes, "<option value=\"{0}\"{sel}>{0}</option>", c.as_str());
        }
        format!(
            "<form method=\"get\" action=\"/ui/journal\" class=\"filter\" id=\"filter\">\
             <label>Agent <input name=\"agent\" value=\"{}\"></label>\
             <label>Route <input name=\"route\" value=\"{}\"></label>\
             <label>Outcome <select name=\"outcome\">{outcomes}</select></label>\
             <label>Code <select name=\"code\">{codes}</select></label>\
             <label>From (UTC) <input name=\"since\" type=\"datetime-local\" value=\"{}\"></label>\
             <label>To (UTC) <input name=\"until\" type=\"datetime-local\" value=\"{}\"></label>\
             <button type=\"submit\">Search</button></form>\
             <p><a href=\"/ui/audit\">Verify the journal's hash chain</a></p>",
            esc(&self.agent),
            esc(&self.route),
            esc(&self.since),
            esc(&self.until),
        )
    }
}

/// One record: its summary, evidence, a reconcile form while it is unknown, and its
/// events as a timeline (kind, time, source, hop, data).
pub fn invocation(record: &Record, node: Option<&str>, events: &[Event], csrf: &str) -> String {
    let mut out = format!(
        "<p>{}</p><p>Outcome <span class=\"outcome {o}\">{o}</span> · retry {}</p>\
         <ul class=\"evidence\">{}</ul>",
        summary(record, node),
        record.retry.as_str(),
        evidence_words(record),
        o = record.outcome.as_str(),
    );
    if record.outcome == Outcome::Unknown && node.is_none() {
        out.push_str(&reconcile_form(&record.invocation_id, csrf));
    }
    out.push_str("<h2>Events</h2><ol class=\"timeline\" id=\"timeline\">");
    for e in events {
        let kind = word(&e.kind);
        let data = match &e.data {
            Value::Object(m) if m.is_empty() => String::new(),
            v => format!("<pre>{}</pre>", esc(&v.to_string())),
        };
        let _ = write!(
            out,
            "<li class=\"event\" data-kind=\"{k}\"><span class=\"seq\">#{}</span> \
             <strong>{k}</strong> <time>{}</time> · source {} · hop {}{data}</li>",
            e.seq,
            esc(&e.ts),
            esc(&word(&e.source)),
            esc(&e.hop),
            k = esc(&kind),
        );
    }
    if events.is_empty() {
        out.push_str("<li>No events here (retention took them, or another node holds them).</li>");
    }
    out.push_str("</ol>");
    out
}

/// A wire enum's name (its serde string).
fn word<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// `audit verify`'s verdict on this node's chain.
pub fn audit(state: &AdminState) -> String {
    match state.journal.verify() {
        Ok(report) => {
            let v = serde_json::to_value(&report).unwrap_or_default();
            let verdict = match report.ok {
                true => super::html::notice("The hash chain holds.", false),
                false => super::html::notice("The hash chain is broken: see below.", true),
            };
            format!(
                "{verdict}<pre id=\"audit\">{}</pre>",
                esc(&serde_json::to_string_pretty(&v).unwrap_or_default())
            )
        }
        Err(_) => super::html::notice("The journal could not be read.", true),
    }
}

/// Each agent with its suspension, its recent invocations, and the switch.
pub async fn agents(state: &AdminState, csrf: &str) -> String {
    let config = state.live.current();
    let suspensions = state.suspended.list();
    let mut ids = crate::admin::agents::known_ids(&config);
    for s in &suspensions {
        if !ids.contains(&s.agent) {
            ids.push(s.agent.clone());
        }
    }
    let recent = search(state, |_| true).await.unwrap_or_default();
    let mut out = String::new();
    for id in ids {
        let suspension = suspensions.iter().find(|s| s.agent == id);
        let (status, verb, label) = match suspension {
            Some(s) => (
                format!(
                    "<p class=\"problem\">Suspended since {}{}</p>",
                    esc(&s.since),
                    s.note
                        .as_deref()
                        .map_or(String::new(), |n| format!(": {}", esc(n)))
                ),
                "resume",
                "Resume",
            ),
            None => (
                "<p class=\"done\">Active</p>".to_owned(),
                "suspend",
                "Suspend",
            ),
        };
        let rows: Vec<Vec<String>> = recent
            .iter()
            .filter(|l| l.record.agent == id)
            .take(5)
            .map(row)
            .collect();
        let _ = write!(
            out,
            "<article class=\"agent\" id=\"agent-{eid}\"><h2>{eid}</h2>{status}\
             <form method=\"post\" action=\"/ui/agents/{link}/{verb}\" class=\"switch\">{hidden}\
             <label>Note <input name=\"note\" maxlength=\"1024\"></label>\
             <button type=\"submit\" class=\"{verb}\">{label}</button></form>{recent}</article>",
            eid = esc(&id),
            link = seg(&id),
            hidden = csrf_field(csrf),
            recent = table(
                &format!("recent-{}", esc(&id)),
                &ROW_HEAD,
                &rows,
                "No recent invocation."
            ),
        );
    }
    out
}
