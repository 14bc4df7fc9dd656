//! SDK retry hints (SPEC §3.7): every answer to an agent says `X-Should-Retry` and
//! `Stripe-Should-Retry` from the record's retry, so an SDK's own retry loop repeats only
//! what the contract allows. Driven by curl against scripted loopback origins.

use std::time::Duration;

use crate::origins::{self, Origin};
use crate::support::{Daemon, Home, TEST_CONFIG, curl};

fn route(port: u16, extra: &str) -> String {
    format!(
        "{TEST_CONFIG}\n[[routes]]\nid = \"origin\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n{extra}\n"
    )
}

/// The two hints and the code of one answer, asserted equal to each other.
struct Answer {
    status: u16,
    hint: String,
    head: String,
}

fn send(daemon: &Daemon, port: u16, method: &str, extra: &[&str]) -> Answer {
    let url = format!("http://origin.test:{port}/op");
    let mut args = vec![
        "-x",
        daemon.proxy.as_str(),
        "-X",
        method,
        "--max-time",
        "20",
    ];
    args.extend_from_slice(extra);
    args.push(&url);
    let (status, _body, head) = curl(&args);
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_owned())
            })
            .unwrap_or_default()
    };
    let (x, stripe) = (header("x-should-retry"), header("stripe-should-retry"));
    assert_eq!(x, stripe, "both hints say the same: {head}");
    Answer {
        status,
        hint: x,
        head,
    }
}

fn hint_of(origin: &Origin, extra_route: &str, method: &str) -> Answer {
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&route(origin.port(), extra_route)));
    send(&daemon, origin.port(), method, &[])
}

#[test]
fn complete_answers_say_false_whatever_their_status() {
    for (status, method) in [
        ("200 OK", "GET"),
        ("201 Created", "POST"),
        ("500 Internal Server Error", "POST"),
        ("500 Internal Server Error", "GET"),
        ("400 Bad Request", "POST"),
        ("409 Conflict", "POST"),
    ] {
        let origin = origins::responds(status, &[], "{}");
        let a = hint_of(&origin, "", method);
        assert_eq!(a.hint, "false", "{method} {status}: {}", a.head);
    }
}

#[test]
fn a_429_with_retry_after_says_true_only_for_an_idempotent_method() {
    let origin = origins::responds("429 Too Many Requests", &["retry-after: 2"], "{}");
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&route(origin.port(), "")));
    let get = send(&daemon, origin.port(), "GET", &[]);
    assert_eq!(
        (get.status, get.hint.as_str()),
        (429, "true"),
        "{}",
        get.head
    );
    assert!(get.head.to_ascii_lowercase().contains("retry-after: 2"));
    let post = send(&daemon, origin.port(), "POST", &[]);
    assert_eq!(
        (post.status, post.hint.as_str()),
        (429, "false"),
        "{}",
        post.head
    );
}

#[test]
fn an_unknown_outcome_says_true_for_get_and_false_for_post() {
    let origin = origins::closes_without_response();
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&route(origin.port(), "")));
    let get = send(&daemon, origin.port(), "GET", &[]);
    assert_eq!(
        (get.status, get.hint.as_str()),
        (502, "true"),
        "{}",
        get.head
    );
    let post = send(&daemon, origin.port(), "POST", &[]);
    assert_eq!(
        (post.status, post.hint.as_str()),
        (502, "false"),
        "{}",
        post.head
    );
    assert!(post.head.contains("retry=reconcile"), "{}", post.head);
    // Under a remote idempotency contract the same request is a same-key retry: true.
    let contract = "idempotency = { header = \"Idempotency-Key\", scope = \"s\", retention = \"1h\", safe_margin = \"1m\" }";
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&route(origin.port(), contract)));
    let keyed = send(
        &daemon,
        origin.port(),
        "POST",
        &["-H", "Idempotency-Key: k-9"],
    );
    assert_eq!(
        (keyed.status, keyed.hint.as_str()),
        (502, "true"),
        "{}",
        keyed.head
    );
    assert!(
        keyed.head.contains("retry=same_idempotency_key"),
        "{}",
        keyed.head
    );
}

#[test]
fn connection_setup_says_true_for_backoff_and_false_for_after_correction() {
    let port = origins::refused_port();
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&route(port, "")));
    let refused = send(&daemon, port, "POST", &[]);
    assert_eq!(
        (refused.status, refused.hint.as_str()),
        (502, "true"),
        "CONNECTION_REFUSED is backoff: {}",
        refused.head
    );
    let denied = {
        let url = "http://elsewhere.test/op";
        let (status, _, head) = curl(&["-x", daemon.proxy.as_str(), "-X", "POST", url]);
        (status, head.to_ascii_lowercase())
    };
    assert_eq!(denied.0, 403);
    assert!(denied.1.contains("x-should-retry: false"), "{}", denied.1);
    assert!(
        denied.1.contains("stripe-should-retry: false"),
        "{}",
        denied.1
    );
}

#[test]
fn the_origin_s_own_hint_stands_and_is_recorded() {
    let origin = origins::responds("500 Internal Server Error", &["x-should-retry: true"], "{}");
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&route(origin.port(), "")));
    let a = send(&daemon, origin.port(), "POST", &[]);
    assert_eq!((a.status, a.hint.as_str()), (500, "true"), "{}", a.head);
    let (_, list) = crate::support::get_json(&daemon.url("/v1/invocations?limit=1"), &[]);
    let record = &list["invocations"][0];
    assert_eq!(
        record["evidence"]["origin_should_retry"], "true",
        "{record}"
    );
}

#[test]
fn an_attempt_in_progress_says_true_with_retry_after() {
    let origin = origins::slow_head(Duration::from_secs(3), "{}");
    let contract = "idempotency = { header = \"Idempotency-Key\", scope = \"s\", retention = \"1h\", safe_margin = \"1m\" }";
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&route(origin.port(), contract)));
    let first = {
        let proxy = daemon.proxy.clone();
        let port = origin.port();
        std::thread::spawn(move || {
            let url = format!("http://origin.test:{port}/op");
            curl(&[
                "-x",
                &proxy,
                "-X",
                "POST",
                "-H",
                "Idempotency-Key: k-1",
                &url,
            ])
        })
    };
    std::thread::sleep(Duration::from_millis(800));
    let second = send(
        &daemon,
        origin.port(),
        "POST",
        &["-H", "Idempotency-Key: k-1"],
    );
    assert_eq!(
        (second.status, second.hint.as_str()),
        (409, "true"),
        "{}",
        second.head
    );
    assert!(
        second.head.contains("code=ATTEMPT_IN_PROGRESS"),
        "{}",
        second.head
    );
    assert!(
        second.head.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        second.head
    );
    let (status, _, _) = first.join().unwrap();
    assert_eq!(status, 200);
}
