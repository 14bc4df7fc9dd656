//! The operator's web console (SPEC §5.8) at `/ui/` on the admin listener: sign-in with the
//! admin token for an `HttpOnly`, `SameSite=Strict` session cookie; every state change
//! needs the session's CSRF token and this origin; strict security headers; whatever an
//! agent sent is shown as text; no secret on any page. `console/browser.rs` drives the
//! pages in headless Chromium.

mod browser;

use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use crate::origins::{self, Origin};
use crate::support::{Daemon, Home, curl, get_json, secret_set};

pub const ADMIN_TOKEN: &str = "console-admin-token-0123456789abcdef";
const VAULT_KEY: &str = "vault-passphrase-for-the-console";
/// The credential's secret: it must never be on a page.
pub const CANARY: &str = "canary-console-secret-7f3a9c";
pub const AGENTS: [(&str, &str); 2] = [
    ("a", "tok-a-console-0123456789"),
    ("b", "tok-b-console-0123456789"),
];

fn config(held: u16, open: u16, broken: u16) -> String {
    let mut text = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{ADMIN_TOKEN}\"\n\
         [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[credentials]]\nid = \"pay\"\nsecret = \"pay-key\"\ninject = {{ header = \"X-Api-Key\" }}\n"
    );
    for (id, token) in AGENTS {
        text.push_str(&format!("[[agents]]\nid = \"{id}\"\ntoken = \"{token}\"\n"));
    }
    for (id, port, extra) in [
        (
            "payments",
            held,
            "credential = \"pay\"\napproval = \"required\"\napproval_timeout = \"60s\"\n",
        ),
        ("open", open, "credential = \"pay\"\n"),
        ("broken", broken, ""),
    ] {
        text.push_str(&format!(
            "[[routes]]\nid = \"{id}\"\n{extra}match = {{ scheme = \"http\", host = \"{id}.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n"
        ));
    }
    text
}

/// A daemon with a held route (`payments.test`), an open one (`open.test`) and one whose
/// origin hangs up after the request (`broken.test`: `unknown`).
pub struct Console {
    _home: Home,
    pub daemon: Daemon,
    pub held: Origin,
    pub open: Origin,
    pub broken: Origin,
}

impl Console {
    pub fn start() -> Console {
        let held = origins::responds(
            "201 Created",
            &["content-type: application/json"],
            "{\"paid\":1}",
        );
        let open = origins::responds("200 OK", &["content-type: text/plain"], "hello");
        let broken = origins::closes_without_response();
        let home = Home::new();
        assert!(
            secret_set(&home, "pay-key", CANARY, Some(VAULT_KEY))
                .status
                .success()
        );
        let text = config(held.port(), open.port(), broken.port());
        let daemon = Daemon::start_with(&home, Some(&text), &[("POSTERN_VAULT_KEY", VAULT_KEY)]);
        Console {
            _home: home,
            daemon,
            held,
            open,
            broken,
        }
    }

    /// A request of `agent` to `host` (`payments`, `open`, `broken`) in a thread.
    pub fn send(&self, agent: &str, host: &str, body: &str) -> JoinHandle<(u16, String, String)> {
        let token = AGENTS
            .iter()
            .find(|(id, _)| *id == agent)
            .map_or("", |a| a.1);
        let proxy = self
            .daemon
            .proxy
            .replace("http://", &format!("http://{agent}:{token}@"));
        let port = match host {
            "payments" => self.held.port(),
            "open" => self.open.port(),
            _ => self.broken.port(),
        };
        let url = format!("http://{host}.test:{port}/do");
        let body = body.to_owned();
        std::thread::spawn(move || curl(&["-x", &proxy, "--data-binary", &body, &url]))
    }

    /// The admin API's JSON, with the token.
    pub fn api(&self, path: &str) -> Value {
        let bearer = format!("Authorization: Bearer {ADMIN_TOKEN}");
        get_json(&self.daemon.url(path), &["-H", &bearer]).1
    }

    /// The held requests' ids, once `n` are listed.
    pub fn held_ids(&self, n: usize) -> Vec<String> {
        for _ in 0..400 {
            let list = self.api("/v1/approvals");
            let ids: Vec<String> = list["approvals"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|h| h["invocation_id"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            if ids.len() >= n {
                return ids;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("{n} held request(s) never listed");
    }

    /// The first event of `kind` of an invocation (null when there is none).
    pub fn event(&self, id: &str, kind: &str) -> Value {
        let v = self.api(&format!("/v1/invocations/{id}/events"));
        let events = v["events"].as_array().cloned().unwrap_or_default();
        events
            .into_iter()
            .find(|e| e["kind"] == kind)
            .unwrap_or_default()
    }
}

/// `curl` against the console: (status, body, head).
fn ui(c: &Console, path: &str, extra: &[&str]) -> (u16, String, String) {
    let url = c.daemon.url(path);
    let mut args = extra.to_vec();
    args.push(&url);
    curl(&args)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Signs in; the session cookie and the CSRF token of its pages.
fn sign_in(c: &Console) -> (String, String) {
    let (status, _, head) = ui(
        c,
        "/ui/login",
        &["--data-urlencode", &format!("token={ADMIN_TOKEN}")],
    );
    assert_eq!(status, 303, "{head}");
    let cookie = header(&head, "set-cookie").unwrap_or_default().to_owned();
    let pair = cookie.split(';').next().unwrap_or_default().to_owned();
    let (_, page, _) = ui(c, "/ui/agents", &["-H", &format!("Cookie: {pair}")]);
    let marker = "name=\"csrf\" content=\"";
    let at = page.find(marker).map(|i| i + marker.len()).unwrap_or(0);
    let csrf: String = page[at..]
        .chars()
        .take_while(|ch| ch.is_ascii_hexdigit())
        .collect();
    assert_eq!(csrf.len(), 64, "{page}");
    (pair, csrf)
}

fn suspended(c: &Console, agent: &str) -> bool {
    let agents = c.api("/v1/agents");
    agents["agents"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|x| x["id"] == agent)
                .map(|x| x["suspended"] == true)
        })
        .unwrap_or(false)
}

#[test]
fn the_console_signs_in_with_the_admin_token_and_guards_every_state_change() {
    let c = Console::start();
    // No cookie: to the sign-in page; a state change is refused outright.
    let (status, _, head) = ui(&c, "/ui/approvals", &[]);
    assert_eq!(status, 303, "{head}");
    assert_eq!(header(&head, "location"), Some("/ui/login"));
    let (status, _, _) = ui(&c, "/ui/agents/b/suspend", &["--data", "csrf=x"]);
    assert_eq!(status, 403);
    assert!(!suspended(&c, "b"));
    // A wrong token: no session.
    let (status, body, head) = ui(&c, "/ui/login", &["--data", "token=not-the-token"]);
    assert_eq!(status, 401, "{head}");
    assert!(header(&head, "set-cookie").is_none(), "{head}");
    assert!(body.contains("not the admin token"), "{body}");
    // A sign-in posted from another site is refused.
    let evil = ["-H", "Origin: http://evil.test", "--data-urlencode"];
    let (status, _, head) = ui(
        &c,
        "/ui/login",
        &[evil[0], evil[1], evil[2], &format!("token={ADMIN_TOKEN}")],
    );
    assert_eq!(status, 403, "{head}");
    // The cookie's flags.
    let (status, _, head) = ui(
        &c,
        "/ui/login",
        &["--data-urlencode", &format!("token={ADMIN_TOKEN}")],
    );
    assert_eq!(status, 303);
    let cookie = header(&head, "set-cookie").unwrap_or_default();
    for flag in [
        "postern_session=",
        "HttpOnly",
        "SameSite=Strict",
        "Path=/ui",
    ] {
        assert!(cookie.contains(flag), "{flag} in {cookie}");
    }
    let (pair, csrf) = sign_in(&c);
    let with = ["-H", &format!("Cookie: {pair}")].map(str::to_owned);
    // Every page carries the security headers.
    for path in [
        "/ui/login",
        "/ui/approvals",
        "/ui/reconcile",
        "/ui/journal",
        "/ui/agents",
        "/ui/audit",
        "/ui/static/console.js",
    ] {
        let (status, _, head) = ui(&c, path, &[&with[0], &with[1]]);
        assert_eq!(status, 200, "{path}: {head}");
        let csp = header(&head, "content-security-policy").unwrap_or_default();
        for part in [
            "default-src 'none'",
            "script-src 'self'",
            "frame-ancestors 'none'",
            "form-action 'self'",
        ] {
            assert!(csp.contains(part), "{path}: {part} in {csp}");
        }
        assert_eq!(header(&head, "x-frame-options"), Some("DENY"), "{path}");
        assert_eq!(
            header(&head, "x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
    }
    // A state change without the CSRF token, with a wrong one, or from another origin.
    for extra in [
        vec!["--data", "note=x"],
        vec!["--data", "csrf=0000&note=x"],
        vec!["-H", "Origin: http://evil.test", "--data-urlencode"],
        vec!["-H", "Referer: http://evil.test/page", "--data-urlencode"],
    ] {
        let mut args = vec![with[0].as_str(), with[1].as_str()];
        args.extend(extra.iter().copied());
        let csrf_field = format!("csrf={csrf}");
        if extra.last() == Some(&"--data-urlencode") {
            args.push(&csrf_field);
        }
        let (status, _, head) = ui(&c, "/ui/agents/b/suspend", &args);
        assert_eq!(status, 403, "{extra:?}: {head}");
        assert!(!suspended(&c, "b"), "{extra:?} suspended the agent");
    }
    // The admin API refuses what a browser marks cross-site, even with the token.
    let bearer = format!("Authorization: Bearer {ADMIN_TOKEN}");
    let api = [
        "-H",
        &bearer,
        "-H",
        "Origin: http://evil.test",
        "-X",
        "POST",
    ];
    let (status, body, _) = ui(&c, "/v1/agents/b/suspend", &api);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("CROSS_SITE_REFUSED"), "{body}");
    assert!(!suspended(&c, "b"));
    // With both: done, as the same journaled action as the API's. b's held request is
    // denied by it, and the page after names it as the CLI does.
    let waiting = c.send("b", "payments", "{\"amount\":1}");
    let held = c.held_ids(1);
    let form = format!("csrf={csrf}&note=from+the+console");
    let (status, _, head) = ui(
        &c,
        "/ui/agents/b/suspend",
        &[&with[0], &with[1], "--data", &form],
    );
    assert_eq!(status, 303, "{head}");
    assert!(suspended(&c, "b"));
    let (status, _, _) = waiting.join().unwrap_or_default();
    assert_eq!(status, 403, "the held request was denied");
    let location = header(&head, "location").unwrap_or_default().to_owned();
    assert!(location.contains(&held[0]), "{location}");
    let (_, page, _) = ui(&c, &location, &[&with[0], &with[1]]);
    assert!(
        page.contains(&format!("<a href=\"/ui/invocations/{}\">", held[0])),
        "{page}"
    );
    // What the query names is shown only if it is an id.
    let (_, page, _) = ui(
        &c,
        "/ui/agents?done=suspended&denied=%3Cscript%3Ex,act_1",
        &[&with[0], &with[1]],
    );
    assert!(
        !page.contains("<script>x") && page.contains("act_1"),
        "{page}"
    );
    let (status, _, _) = c.send("b", "open", "x").join().unwrap_or_default();
    assert_eq!(status, 403);
    let (status, _, _) = ui(
        &c,
        "/ui/agents/b/resume",
        &[&with[0], &with[1], "--data", &form],
    );
    assert_eq!(status, 303);
    assert!(!suspended(&c, "b"));
    // Signed out: the cookie opens nothing.
    let (status, _, _) = ui(
        &c,
        "/ui/logout",
        &[&with[0], &with[1], "--data", &format!("csrf={csrf}")],
    );
    assert_eq!(status, 303);
    let (status, _, head) = ui(&c, "/ui/agents", &[&with[0], &with[1]]);
    assert_eq!(status, 303, "{head}");
    // A page on another name resolving here (DNS rebinding) reaches nothing.
    let port = c
        .daemon
        .admin
        .rsplit(':')
        .next()
        .unwrap_or("")
        .trim_end_matches('/')
        .to_owned();
    let evil = format!("Host: evil.test:{port}");
    for path in ["/v1/approvals", "/ui/login", "/healthz"] {
        let (status, body, _) = ui(&c, path, &["-H", &evil]);
        assert_eq!(status, 421, "{path}: {body}");
    }
    let (status, _, _) = ui(&c, "/ui/login", &["-H", &format!("Host: localhost:{port}")]);
    assert_eq!(status, 200);
    // A new admin token (a reload) ends the sessions opened under the old one.
    let (pair, _) = sign_in(&c);
    let cookie = format!("Cookie: {pair}");
    let text = config(c.held.port(), c.open.port(), c.broken.port());
    c._home
        .config(&text.replace(ADMIN_TOKEN, "console-admin-token-rotated-0123456789"));
    let bearer = format!("Authorization: Bearer {ADMIN_TOKEN}");
    let (status, body, _) = ui(&c, "/v1/reload", &["-X", "POST", "-H", &bearer]);
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("admin.token") && !body.contains("rotated"),
        "{body}"
    );
    let (status, _, head) = ui(&c, "/ui/agents", &["-H", &cookie]);
    assert_eq!(status, 303, "a session of the old token: {head}");
    // Wrong tokens past ten a minute (one was sent above) wait and get 429, unlogged; the
    // right token still gets in at once.
    let codes: Vec<u16> = (0..10)
        .map(|_| ui(&c, "/ui/login", &["--data", "token=wrong"]).0)
        .collect();
    assert_eq!(codes.iter().filter(|s| **s == 401).count(), 9, "{codes:?}");
    assert_eq!(codes.last(), Some(&429), "{codes:?}");
    let right = "token=console-admin-token-rotated-0123456789";
    assert_eq!(ui(&c, "/ui/login", &["--data", right]).0, 303);
    let logged = c.daemon.stderr().matches("wrong admin token").count();
    assert_eq!(logged, 10, "one line per counted guess");
    // Every guess counts in the metrics, the unlogged ones and the API's too.
    let (status, _, _) = ui(&c, "/v1/approvals", &["-H", "Authorization: Bearer nope"]);
    assert_eq!(status, 401);
    let bearer = "Authorization: Bearer console-admin-token-rotated-0123456789";
    let (_, metrics, _) = ui(&c, "/metrics", &["-H", bearer]);
    let failures = metrics
        .lines()
        .find_map(|l| l.strip_prefix("postern_admin_auth_failures_total "))
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert!(failures.is_some_and(|n| n >= 12), "{metrics}");
}

#[test]
fn what_an_agent_sent_is_shown_as_text_and_no_page_shows_a_secret() {
    let c = Console::start();
    let (pair, csrf) = sign_in(&c);
    let cookie = format!("Cookie: {pair}");
    let script = "<script>alert('pwned')</script><img src=x onerror=alert(1)> \u{202E}0005\u{202C}";
    let waiting = c.send(
        "a",
        "payments",
        &format!("note={script}&x-api-key=postern:pay"),
    );
    let id = c.held_ids(1).remove(0);
    let (status, list, _) = ui(&c, "/ui/approvals/list", &["-H", &cookie]);
    assert_eq!(status, 200);
    assert!(list.contains(&id), "{list}");
    assert!(
        list.contains("&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;"),
        "{list}"
    );
    assert!(
        !list.contains("<script>alert") && !list.contains("<img src=x"),
        "{list}"
    );
    assert!(list.contains("pay"), "the credential id is shown: {list}");
    assert!(
        list.contains("U+202E") && !list.contains('\u{202E}'),
        "a bidi override is shown, not obeyed: {list}"
    );
    // Approve it from the console, with a note: the record says who and how.
    let form = format!("csrf={csrf}&note=looked+fine");
    let (status, _, head) = ui(
        &c,
        &format!("/ui/approvals/{id}/approve"),
        &["-H", &cookie, "--data", &form],
    );
    assert_eq!(status, 303, "{head}");
    let (status, _, _) = waiting.join().unwrap_or_default();
    assert_eq!(status, 201);
    assert_eq!(c.held.hits(), 1);
    let granted = c.event(&id, "APPROVAL_GRANTED");
    assert_eq!(granted["data"]["via"], "console", "{granted}");
    assert_eq!(granted["data"]["note"], "looked fine", "{granted}");
    assert_eq!(granted["source"], "operator_attested", "{granted}");
    // A field padded out of a short preview is still shown; a body longer than the preview
    // says that approving sends what is not shown.
    let padded = format!("note={}&amount=1000000", "a".repeat(300));
    let waiting_padded = c.send("a", "payments", &padded);
    let long = format!("note={}", "b".repeat(5000));
    let waiting_long = c.send("a", "payments", &long);
    let held = c.held_ids(2);
    let (_, list, _) = ui(&c, "/ui/approvals/list", &["-H", &cookie]);
    assert!(list.contains("amount=1000000"), "{list}");
    // Its headers too, a sensitive one's value redacted.
    assert!(
        list.contains("content-type: application/x-www-form-urlencoded"),
        "{list}"
    );
    assert!(
        !list.contains("tok-a-console"),
        "the agent's token in {list}"
    );
    let api = c.api("/v1/approvals");
    let headers = &api["approvals"][0]["headers"];
    assert!(headers.as_array().is_some_and(|h| !h.is_empty()), "{api}");
    assert!(!api.to_string().contains("tok-"), "an agent token in {api}");
    assert!(list.contains("bytes not shown here"), "{list}");
    for id in &held {
        let (status, _, _) = ui(
            &c,
            &format!("/ui/approvals/{id}/deny"),
            &["-H", &cookie, "--data", &format!("csrf={csrf}")],
        );
        assert_eq!(status, 303);
    }
    for waiting in [waiting_padded, waiting_long] {
        assert_eq!(waiting.join().unwrap_or_default().0, 403);
    }
    assert_eq!(c.held.hits(), 1, "nothing denied was sent");
    // An unknown one, then every page: the secret is on none of them.
    let _ = c.send("a", "broken", "charge=1").join();
    let mut pages = vec![
        "/ui/approvals".to_owned(),
        "/ui/reconcile".into(),
        "/ui/journal".into(),
        "/ui/agents".into(),
        "/ui/audit".into(),
    ];
    pages.push(format!("/ui/invocations/{id}"));
    for path in &pages {
        let (status, page, _) = ui(&c, path, &["-H", &cookie]);
        assert_eq!(status, 200, "{path}");
        eprintln!("page weight {path}: {} bytes", page.len());
        assert!(!page.contains(CANARY), "{path} shows the secret");
        assert!(
            !page.contains("<script>alert"),
            "{path} runs what the agent sent"
        );
    }
    let (_, reconcile, _) = ui(&c, "/ui/reconcile", &["-H", &cookie]);
    assert!(
        reconcile.contains("Nothing was sent") || reconcile.contains("The request was sent"),
        "{reconcile}"
    );
}
