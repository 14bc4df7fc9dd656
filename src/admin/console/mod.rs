//! The operator's web console at `/ui/` on the admin listener (SPEC §5.8). Sign-in with the
//! admin token for a session cookie; every state change carries the session's CSRF token
//! and comes from this origin; each is the same journaled operator action as its API twin
//! (`api::decided`, `api::reconciled`, `agents::switched`). Pages are rendered on the
//! server with one small script (embedded, like the stylesheet: nothing is fetched from
//! outside, so it works offline); a strict Content-Security-Policy runs nothing else.

mod html;
mod pages;
mod session;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};

use super::state::{AdminState, Problem};
use crate::contract::Outcome;
use crate::policy::approvals::{Decision, Verdict};
pub use session::Sessions;

/// What every admin route answers with (the API's replies are `Full`, the console's
/// approvals feed streams).
pub type AdminBody = UnsyncBoxBody<Bytes, Infallible>;

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");
const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\"><rect width=\"16\" height=\"16\" rx=\"3\" fill=\"#1d232a\"/></svg>";

/// No inline script or style, nothing from another origin, never framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The longest note an action keeps (it is journaled).
const MAX_NOTE: usize = 1024;

/// A form body is read up to this size.
const MAX_FORM: usize = 16 * 1024;

/// How often the approvals feed sends a comment, so a dead connection is noticed.
const FEED_KEEPALIVE: Duration = Duration::from_secs(15);

/// Whether a path is the console's.
pub fn owns(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// A signed-in request: its session id and CSRF token.
struct Signed {
    id: String,
    csrf: String,
}

pub async fn handle(state: Arc<AdminState>, req: Request<Incoming>) -> Response<AdminBody> {
    let path = req.uri().path().to_owned();
    let segments: Vec<String> = path
        .trim_start_matches("/ui")
        .trim_matches('/')
        .split('/')
        .map(super::api::percent_decode)
        .collect();
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    let method = req.method().clone();
    match (&method, seg.as_slice()) {
        (&Method::GET, ["static", "console.css"]) => return asset(CSS, "text/css; charset=utf-8"),
        (&Method::GET, ["static", "console.js"]) => {
            return asset(JS, "text/javascript; charset=utf-8");
        }
        (&Method::GET, ["static", "favicon.svg"]) => return asset(ICON, "image/svg+xml"),
        (&Method::GET, ["login"]) => return html(StatusCode::OK, html::sign_in(None)),
        (&Method::POST, ["login"]) => return sign_in(&state, req).await,
        _ => {}
    }
    let Some(signed) = signed_in(&state, req.headers()) else {
        return match method {
            Method::GET | Method::HEAD => redirect("/ui/login", None),
            _ => refused("Sign in first."),
        };
    };
    if method == Method::POST {
        return post(&state, &signed, seg.as_slice(), req).await;
    }
    if method != Method::GET {
        return refused("The console takes GET and POST only.");
    }
    let query = req.uri().query().unwrap_or("").to_owned();
    get(state, &signed, seg.as_slice(), &query).await
}

async fn get(
    state: Arc<AdminState>,
    signed: &Signed,
    seg: &[&str],
    query: &str,
) -> Response<AdminBody> {
    let csrf = &signed.csrf;
    let notice = done_notice(query);
    let (title, active, main) = match seg {
        [""] => return redirect("/ui/approvals", None),
        ["approvals"] => ("Approvals", "approvals", pages::approvals(&state, csrf)),
        ["approvals", "list"] => {
            return html(StatusCode::OK, pages::approvals_list(&state, csrf));
        }
        ["events"] => return feed(state, signed.id.clone()),
        ["reconcile"] => (
            "Reconcile",
            "reconcile",
            pages::reconcile(&state, csrf).await,
        ),
        ["journal"] => {
            let filter = pages::Filter::parse(&form_pairs(query));
            ("Journal", "journal", pages::journal(&state, &filter).await)
        }
        ["audit"] => ("Audit", "journal", pages::audit(&state)),
        ["agents"] => ("Agents", "agents", pages::agents(&state, csrf).await),
        ["invocations", id] => match invocation(&state, id, csrf).await {
            Ok(main) => ("Invocation", "journal", main),
            Err(p) => return problem_page(&p, csrf),
        },
        _ => {
            let p = Problem::new(StatusCode::NOT_FOUND, "NOT_FOUND", "No such console page.");
            return problem_page(&p, csrf);
        }
    };
    let main = format!("{notice}{main}");
    html(StatusCode::OK, html::page(title, active, csrf, &main))
}

async fn invocation(state: &AdminState, id: &str, csrf: &str) -> Result<String, Problem> {
    use crate::journal::Whereabouts;
    let (record, node) = match state.journal.locate(id).await {
        Ok(Some(Whereabouts::Here(s))) => (s.record, None),
        Ok(Some(Whereabouts::There {
            node,
            state: Some(s),
            ..
        })) => (s.record, Some(node)),
        Ok(Some(Whereabouts::There { node, .. })) => {
            let msg = format!("Node {node} holds this invocation and has not settled it yet.");
            return Err(Problem::new(StatusCode::OK, "IN_PROGRESS", msg));
        }
        Ok(None) => return Err(super::state::not_found_problem(id)),
        Err(_) => return Err(Problem::storage()),
    };
    let events = state.journal.events(id).unwrap_or_default();
    let held = state
        .approvals
        .list()
        .iter()
        .any(|l| l.held.invocation_id == id);
    let mut page = pages::invocation(&record, node.as_deref(), &events, csrf);
    if held {
        let waiting = "<p class=\"problem\">It waits for an operator's approval: decide it on <a href=\"/ui/approvals\">Approvals</a>.</p>";
        page.insert_str(0, waiting);
    }
    Ok(page)
}

/// A state change: same origin, the session's CSRF token, then the action.
async fn post(
    state: &AdminState,
    signed: &Signed,
    seg: &[&str],
    req: Request<Incoming>,
) -> Response<AdminBody> {
    if !same_origin(req.headers()) {
        return refused("This request came from another site.");
    }
    let Ok(form) = read_form(req).await else {
        let p = Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BAD_FORM",
            "The form could not be read (at most 16 KiB of UTF-8).",
        );
        return problem_page(&p, &signed.csrf);
    };
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default()
    };
    if !session::csrf_matches(&signed.csrf, &field("csrf")) {
        return refused("The form's CSRF token is missing or stale: reload the page.");
    }
    let note = Some(field("note")).filter(|n| !n.is_empty());
    if note.as_ref().is_some_and(|n| n.len() > MAX_NOTE) {
        let p = Problem::new(
            StatusCode::BAD_REQUEST,
            "BAD_FORM",
            "A note is at most 1024 bytes.",
        );
        return problem_page(&p, &signed.csrf);
    }
    let (done, back) = match seg {
        ["logout"] => {
            state.console.close(&signed.id);
            return redirect("/ui/login", Some(&session::set_cookie("")));
        }
        ["approvals", id, verb @ ("approve" | "deny")] => {
            let verdict = match *verb {
                "approve" => Verdict::Approve,
                _ => Verdict::Deny,
            };
            let decision = Decision {
                verdict,
                note,
                via: "console",
            };
            let done = super::api::decided(state, id, decision).await;
            (done.map(|_| *verb), "approvals")
        }
        ["invocations", id, "reconcile"] => {
            let outcome = match field("outcome").as_str() {
                "committed" => Outcome::Committed,
                "rejected" => Outcome::Rejected,
                _ => {
                    let p = Problem::new(
                        StatusCode::BAD_REQUEST,
                        "BAD_FORM",
                        "Pick committed or rejected.",
                    );
                    return problem_page(&p, &signed.csrf);
                }
            };
            let note = note.unwrap_or_default();
            let done = super::api::reconciled(state, id, outcome, &note, "console").await;
            (done.map(|_| "reconciled"), "reconcile")
        }
        ["agents", id, verb @ ("suspend" | "resume")] => {
            let suspend = *verb == "suspend";
            let done = super::agents::switched(state, id, note, suspend).await;
            return match done {
                // The held requests the suspension denied are named, as the CLI names them.
                Ok(v) if suspend => {
                    let denied = denied_ids(&v);
                    redirect(&format!("/ui/agents?done=suspended&denied={denied}"), None)
                }
                Ok(_) => redirect("/ui/agents?done=resumed", None),
                Err(p) => problem_page(&p, &signed.csrf),
            };
        }
        _ => return refused("No such console action."),
    };
    match done {
        Ok(word) => redirect(&format!("/ui/{back}?done={word}"), None),
        Err(p) => problem_page(&p, &signed.csrf),
    }
}

/// At most this many denied requests are named after a suspension (the journal has all).
const MAX_NAMED: usize = 20;

/// An invocation id as postern mints them: nothing a URL or a page must escape.
fn plain_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The ids in a suspension's `denied_approvals`, comma-separated for a redirect's query.
fn denied_ids(switched: &serde_json::Value) -> String {
    let ids = switched["denied_approvals"].as_array();
    let ids = ids.into_iter().flatten().filter_map(|v| v.as_str());
    let ids: Vec<&str> = ids.filter(|id| plain_id(id)).take(MAX_NAMED).collect();
    ids.join(",")
}

/// `POST /ui/login` with `token`: a session cookie, or the form again.
async fn sign_in(state: &AdminState, req: Request<Incoming>) -> Response<AdminBody> {
    if !same_origin(req.headers()) {
        return refused("This request came from another site.");
    }
    let Ok(form) = read_form(req).await else {
        return html(
            StatusCode::BAD_REQUEST,
            html::sign_in(Some("The form could not be read.")),
        );
    };
    let token = form
        .iter()
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default();
    let config = state.live.current();
    let admitted = config
        .admin
        .token
        .as_ref()
        .is_none_or(|t| t.matches(&token));
    if !admitted {
        state.auth_failures.inc();
        if state.console.failed() == session::Failed::Counted {
            tracing::warn!("console: a sign-in with a wrong admin token");
            let page = html::sign_in(Some("That is not the admin token."));
            return html(StatusCode::UNAUTHORIZED, page);
        }
        // Past the allowance a guess is answered at once and not logged: a wait would hold
        // one of the admin listener's few connections, so guesses sent in parallel could
        // lock the operator out; the right token still gets in.
        let page = html::sign_in(Some("Too many wrong tokens this minute."));
        return html(StatusCode::TOO_MANY_REQUESTS, page);
    }
    let (id, _) = state.console.open(token_tag(state));
    redirect("/ui/approvals", Some(&session::set_cookie(&id)))
}

fn signed_in(state: &AdminState, headers: &HeaderMap) -> Option<Signed> {
    let id = session::cookie_of(headers)?;
    let csrf = state.console.csrf(&id, &token_tag(state))?;
    Some(Signed { id, csrf })
}

/// The admin token in force, as sessions are tagged with it (a rotation ends them).
fn token_tag(state: &AdminState) -> session::TokenTag {
    use sha2::{Digest, Sha256};
    let config = state.live.current();
    let token = config.admin.token.as_ref().map_or("", |t| t.expose());
    Sha256::digest(token.as_bytes()).into()
}

/// A browser names the page a request came from in `Origin` (and `Sec-Fetch-Site`): a
/// state change from any other site is refused. Without them (curl), the CSRF token and
/// the cookie still decide.
pub(super) fn same_origin(headers: &HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
    {
        return false;
    }
    let here = |origin: &str| get("host").is_some_and(|host| origin == format!("http://{host}"));
    match (get("origin"), get("referer")) {
        (Some(origin), _) => here(origin),
        // No `Origin` (an old browser, a plugin): a `Referer` still names the page.
        (None, Some(referer)) => here(origin_of(referer)),
        (None, None) => true,
    }
}

/// `scheme://host[:port]` of a URL (all of it when it has no path).
fn origin_of(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find(['/', '?', '#']) {
        Some(end) => &url[..after_scheme + end],
        None => url,
    }
}

/// The approvals feed (server-sent events): an `approvals` event whenever the held set
/// changes, for as long as the session lives.
fn feed(state: Arc<AdminState>, session: String) -> Response<AdminBody> {
    let rx = state.approvals.subscribe();
    let start = Bytes::from_static(b"retry: 2000\n\n");
    let stream = futures_util::stream::unfold(
        (state, rx, session, Some(start)),
        |(state, mut rx, session, first)| async move {
            if let Some(first) = first {
                return Some((Ok(Frame::data(first)), (state, rx, session, None)));
            }
            state.console.csrf(&session, &token_tag(&state))?;
            let chunk = match tokio::time::timeout(FEED_KEEPALIVE, rx.changed()).await {
                Ok(Ok(())) => {
                    let n = *rx.borrow_and_update();
                    Bytes::from(format!("event: approvals\ndata: {n}\n\n"))
                }
                Ok(Err(_)) => return None,
                Err(_) => Bytes::from_static(b": keep-alive\n\n"),
            };
            Some((Ok(Frame::data(chunk)), (state, rx, session, None)))
        },
    );
    let mut r = Response::new(UnsyncBoxBody::new(StreamBody::new(stream)));
    set(&mut r, header::CONTENT_TYPE, "text/event-stream");
    guard(r)
}

/// The `done=` word of a redirect after an action, as a fixed sentence.
fn done_notice(query: &str) -> String {
    let pairs = form_pairs(query);
    let word = pairs
        .iter()
        .find(|(k, _)| k == "done")
        .map(|(_, v)| v.clone());
    if word.as_deref() == Some("suspended") {
        let denied = pairs.iter().find(|(k, _)| k == "denied");
        let denied = denied.map_or("", |(_, v)| v.as_str());
        return suspended_notice(denied);
    }
    let text = match word.as_deref() {
        Some("approve") => "Approved: the request goes on, and its record says so.",
        Some("deny") => "Denied: the request was refused and nothing was sent.",
        Some("reconciled") => "Reconciled: the record carries your finding.",
        Some("suspended") => "Suspended: the agent's new requests are refused.",
        Some("resumed") => "Resumed: the agent's requests go on again.",
        _ => return String::new(),
    };
    html::notice(text, false)
}

/// The notice after a suspension: the held requests it denied, each linked to its record.
fn suspended_notice(denied: &str) -> String {
    let ids: Vec<&str> = denied
        .split(',')
        .filter(|id| plain_id(id))
        .take(MAX_NAMED)
        .collect();
    let text = "Suspended: the agent's new requests are refused.";
    if ids.is_empty() {
        return html::notice(text, false);
    }
    let links: Vec<String> = ids
        .iter()
        .map(|id| format!("<a href=\"/ui/invocations/{id}\">{id}</a>"))
        .collect();
    format!(
        "<p class=\"done\" role=\"status\">{} Held requests denied, nothing sent: {}.</p>",
        html::esc(text),
        links.join(", ")
    )
}

fn problem_page(p: &Problem, csrf: &str) -> Response<AdminBody> {
    let main = html::notice(&format!("{} ({})", p.message, p.code), true);
    let title = match p.status {
        StatusCode::NOT_FOUND => "Not found",
        s if s.is_server_error() => "Unavailable",
        _ => "Refused",
    };
    html(p.status, html::page(title, "", csrf, &main))
}

fn refused(why: &str) -> Response<AdminBody> {
    let body = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>postern · Refused</title>\
         <link rel=\"stylesheet\" href=\"/ui/static/console.css\"></head><body><main class=\"narrow\">\
         {}<p><a href=\"/ui/login\">Sign in</a></p></main></body></html>\n",
        html::notice(why, true)
    );
    html(StatusCode::FORBIDDEN, body)
}

async fn read_form(req: Request<Incoming>) -> Result<Vec<(String, String)>, ()> {
    let body = Limited::new(req.into_body(), MAX_FORM)
        .collect()
        .await
        .map_err(|_| ())?
        .to_bytes();
    let text = std::str::from_utf8(&body).map_err(|_| ())?;
    Ok(form_pairs(text))
}

/// `a=1&b=x%20y` as pairs (a query string or an urlencoded form).
fn form_pairs(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (super::api::percent_decode(k), super::api::percent_decode(v))
        })
        .collect()
}

fn asset(text: &'static str, kind: &'static str) -> Response<AdminBody> {
    let mut r = Response::new(full(Bytes::from_static(text.as_bytes())));
    set(&mut r, header::CONTENT_TYPE, kind);
    guard(r)
}

fn html(status: StatusCode, text: String) -> Response<AdminBody> {
    let mut r = Response::new(full(Bytes::from(text)));
    *r.status_mut() = status;
    set(&mut r, header::CONTENT_TYPE, "text/html; charset=utf-8");
    guard(r)
}

fn redirect(to: &str, cookie: Option<&str>) -> Response<AdminBody> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(c).ok()) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    guard(r)
}

fn full(b: Bytes) -> AdminBody {
    UnsyncBoxBody::new(Full::new(b))
}

/// The headers every console response carries.
fn guard(mut r: Response<AdminBody>) -> Response<AdminBody> {
    set(&mut r, header::CONTENT_SECURITY_POLICY, CSP);
    set(&mut r, header::X_FRAME_OPTIONS, "DENY");
    set(&mut r, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    // `no-referrer` would make a browser send `Origin: null` with this origin's own forms.
    set(&mut r, header::REFERRER_POLICY, "same-origin");
    set(&mut r, header::CACHE_CONTROL, "no-store");
    r
}

fn set(r: &mut Response<AdminBody>, name: header::HeaderName, value: &'static str) {
    r.headers_mut()
        .insert(name, HeaderValue::from_static(value));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_origin_may_change_state() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:3129"));
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:3129"),
        );
        assert!(same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("http://evil.test"));
        assert!(!same_origin(&h));
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!same_origin(&h));
        h.remove("sec-fetch-site");
        let referer = |v: &'static str, h: &mut HeaderMap| {
            h.insert(header::REFERER, HeaderValue::from_static(v));
            same_origin(h)
        };
        assert!(referer("http://127.0.0.1:3129/ui/agents", &mut h));
        assert!(referer("http://127.0.0.1:3129", &mut h));
        assert!(!referer("http://evil.test/x", &mut h));
        assert!(!referer("http://127.0.0.1:3129.evil.test/", &mut h));
        assert!(!referer("http://127.0.0.1:31290/", &mut h));
        assert!(!referer("garbage", &mut h));
    }

    #[test]
    fn forms_decode() {
        let pairs = form_pairs("token=a%2Bb+c&csrf=x");
        assert_eq!(pairs[0], ("token".into(), "a+b c".into()));
        assert_eq!(pairs[1], ("csrf".into(), "x".into()));
    }
}
