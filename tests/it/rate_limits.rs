//! `rate_limit` on agents and routes (SPEC §5.8): a token bucket with a burst of one
//! interval's worth; past it `429 RATE_LIMITED` with `Retry-After`, nothing sent.

use serde_json::Value;

use crate::support::{Daemon, Home, curl};
use crate::tls_origin::{TlsOrigin, echo_origin};

const TOKENS: [(&str, &str); 3] = [
    ("a", "tok-a-0123456789abcdef"),
    ("b", "tok-b-0123456789abcdef"),
    ("c", "tok-c-0123456789abcdef"),
];

fn setup(origin: &TlsOrigin) -> (Home, Daemon) {
    let home = Home::new();
    let mut config = String::from(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n",
    );
    for (id, token) in TOKENS {
        let limit = if id == "a" {
            "rate_limit = \"2/h\"\n"
        } else {
            ""
        };
        config.push_str(&format!(
            "[[agents]]\nid = \"{id}\"\ntoken = \"{token}\"\n{limit}"
        ));
    }
    for (id, path, limit) in [
        ("open", "/open", ""),
        ("shared", "/shared", "rate_limit = \"3/h\"\n"),
    ] {
        config.push_str(&format!(
            "[[routes]]\nid = \"{id}\"\nmatch = {{ host = \"origin.test\", port = {}, path_prefix = \"{path}\" }}\nresolve = \"{}\"\nupstream_ca = \"{}\"\n{limit}",
            origin.addr.port(),
            origin.addr,
            origin.ca_file.display()
        ));
    }
    let daemon = Daemon::start(&home, Some(&config));
    (home, daemon)
}

/// One GET as `agent`: status, body, head.
fn get(
    home: &Home,
    daemon: &Daemon,
    origin: &TlsOrigin,
    agent: &str,
    path: &str,
) -> (u16, String, String) {
    let token = TOKENS.iter().find(|(id, _)| *id == agent).unwrap().1;
    let proxy = daemon
        .proxy
        .replace("http://", &format!("http://{agent}:{token}@"));
    let ca = home.root().join("certs/ca.pem");
    let url = format!("https://origin.test:{}{path}", origin.addr.port());
    curl(&["-x", &proxy, "--cacert", ca.to_str().unwrap(), &url])
}

fn code(body: &str) -> Value {
    let e: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    e["error"].clone()
}

#[test]
fn an_agents_limit_refuses_past_its_burst_with_retry_after_and_sends_nothing() {
    let origin = echo_origin();
    let (home, daemon) = setup(&origin);
    for _ in 0..2 {
        let (status, body, _) = get(&home, &daemon, &origin, "a", "/open/x");
        assert_eq!(status, 200, "{body}");
    }
    let (status, body, head) = get(&home, &daemon, &origin, "a", "/open/x");
    assert_eq!(status, 429, "{body}");
    let error = code(&body);
    assert_eq!(error["code"], "RATE_LIMITED", "{body}");
    assert_eq!(error["retry"], "backoff", "{body}");
    assert_eq!(error["outcome"], "not_attempted", "{body}");
    assert_eq!(error["field"], "agent.rate_limit", "{body}");
    let envelope: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(envelope["evidence"]["dispatch_started"], false, "{body}");
    let retry_after: u64 = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("retry-after:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("Retry-After: {head}"));
    assert!(
        (1..=1800).contains(&retry_after),
        "half an hour for the next of 2/h: {retry_after}"
    );
    // Another agent is not held back by a's limit.
    let (status, body, _) = get(&home, &daemon, &origin, "b", "/open/x");
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_routes_limit_is_shared_by_every_agent_on_it() {
    let origin = echo_origin();
    let (home, daemon) = setup(&origin);
    for agent in ["b", "c", "b"] {
        let (status, body, _) = get(&home, &daemon, &origin, agent, "/shared/x");
        assert_eq!(status, 200, "{agent}: {body}");
    }
    let (status, body, _) = get(&home, &daemon, &origin, "c", "/shared/x");
    assert_eq!(status, 429, "{body}");
    assert_eq!(code(&body)["field"], "route.rate_limit", "{body}");
    // The other route is not limited.
    let (status, body, _) = get(&home, &daemon, &origin, "c", "/open/x");
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_rate_that_is_not_one_is_a_config_error_naming_its_key() {
    let home = Home::new();
    let config = "[[agents]]\nid = \"a\"\ntoken = \"tok-a-0123456789abcdef\"\nrate_limit = \"ten per second\"\n";
    let path = home.config(config);
    assert!(home.cli(&["init"], &[]).status.success());
    let out = home.cli(&["env", "--config", path.to_str().unwrap()], &[]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("agents[0].rate_limit"), "{text}");
}

#[test]
fn a_routes_limit_covers_an_unread_tunnel() {
    let origin = echo_origin();
    let home = Home::new();
    let config = format!(
        "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n[journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n\
         [[routes]]\nid = \"pinned\"\nintercept = false\nrate_limit = \"1/h\"\nmatch = {{ host = \"origin.test\", port = {} }}\nresolve = \"{}\"\n",
        origin.addr.port(),
        origin.addr
    );
    let daemon = Daemon::start(&home, Some(&config));
    let url = format!("https://origin.test:{}/x", origin.addr.port());
    let ca = origin.ca_file.to_str().unwrap();
    let (status, body, _) = curl(&["-x", &daemon.proxy, "--cacert", ca, &url]);
    assert_eq!(status, 200, "the first tunnel: {body}");
    let (_, _, head) = curl(&["-x", &daemon.proxy, "--cacert", ca, &url]);
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
}
