//! Route precedence: the most specific route wins whatever the table order, so a broad
//! route listed first cannot skip a stricter one; ambiguity is a config error at start.

use crate::origins;
use crate::support::{Daemon, Home, curl, get_json};

fn base() -> &'static str {
    "[proxy]\nlisten = \"127.0.0.1:0\"\n[ssh]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
     [journal]\nmin_free_bytes = \"1MiB\"\nreserve_bytes = \"1MiB\"\n"
}

fn route(id: &str, port: u16, extra: &str) -> String {
    format!("[[routes]]\nid = \"{id}\"\nresolve = \"127.0.0.1:{port}\"\n{extra}\n")
}

#[test]
fn a_broad_route_listed_first_cannot_skip_an_approval() {
    let origin = origins::responds("200 OK", &[], "done");
    let port = origin.port();
    let config = format!(
        "{}{}{}",
        base(),
        route(
            "all",
            port,
            &format!("match = {{ scheme = \"http\", host = \"origin.test\", port = {port} }}")
        ),
        route(
            "admin",
            port,
            &format!(
                "approval = \"required\"\napproval_timeout = \"1s\"\nmatch = {{ scheme = \"http\", host = \"origin.test\", port = {port}, path_prefix = \"/admin\" }}"
            )
        ),
    );
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config));
    let url = format!("http://origin.test:{port}/admin/deploy");
    let (status, body, _) = curl(&["-x", &daemon.proxy, "-X", "POST", "--data", "go", &url]);
    assert_eq!(status, 403, "held, then timed out: {body}");
    assert!(body.contains("APPROVAL_TIMEOUT"), "{body}");
    assert_eq!(origin.hits(), 0, "nothing reached the origin unapproved");
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    assert_eq!(list["invocations"][0]["route"], "admin");

    let other = format!("http://origin.test:{port}/status");
    let (status, body, _) = curl(&["-x", &daemon.proxy, &other]);
    assert_eq!(
        (status, body.as_str()),
        (200, "done"),
        "the broad route still serves the rest"
    );
}

#[test]
fn a_denial_names_the_dimension_that_did_not_match() {
    let origin = origins::responds("200 OK", &[], "done");
    let port = origin.port();
    let config = format!(
        "{}{}",
        base(),
        route(
            "read",
            port,
            &format!(
                "match = {{ scheme = \"http\", host = \"origin.test\", port = {port}, methods = [\"GET\"], path_prefix = \"/repos\" }}"
            )
        ),
    );
    let home = Home::new();
    let daemon = Daemon::start(&home, Some(&config));
    let url = |p: &str| format!("http://origin.test:{port}{p}");
    let (status, body, _) = curl(&["-x", &daemon.proxy, "-X", "DELETE", &url("/repos/x")]);
    assert_eq!(status, 403);
    let env: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(env["error"]["code"], "ROUTE_DENIED");
    assert_eq!(env["error"]["field"], "method");
    let (_, body, _) = curl(&["-x", &daemon.proxy, &url("/users")]);
    let env: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(env["error"]["field"], "target.path");
    let (_, body, _) = curl(&["-x", &daemon.proxy, "http://elsewhere.test/"]);
    let env: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(env["error"]["field"], "target.host");
    assert_eq!(origin.hits(), 0);
}

#[test]
fn equally_specific_routes_are_refused_at_start() {
    let config = format!(
        "{}{}{}",
        base(),
        route(
            "a",
            1,
            "match = { host = \"h.test\", methods = [\"GET\", \"POST\"] }"
        ),
        route(
            "b",
            1,
            "approval = \"required\"\nmatch = { host = \"h.test\", methods = [\"POST\"] }"
        ),
    );
    let home = Home::new();
    let path = home.config(&config);
    let out = home.cli(&["serve", "--config", path.to_str().unwrap()], &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("routes[1]") && err.contains("routes[0] (`a`)"),
        "{err}"
    );
}

/// Clients print the status line of a refused CONNECT, not its body.
#[test]
fn a_refused_connect_says_why_in_its_status_line() {
    let home = Home::new();
    let config = format!(
        "{}{}",
        base(),
        route(
            "gh",
            1,
            "match = { host = \"api.github.test\", port = 443 }"
        )
    );
    let daemon = Daemon::start(&home, Some(&config));
    let script = "import urllib.request\n\
                  try:\n    urllib.request.urlopen('https://elsewhere.test/')\n\
                  except Exception as e:\n    print(e)\n";
    let proxy = daemon.proxy.clone();
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .env("https_proxy", &proxy)
        .env("HTTPS_PROXY", &proxy)
        .output()
        .expect("python3 must be installed (tests/run installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("403 ROUTE_DENIED act_"),
        "python prints the code and id: {text}"
    );
    let (_, body, _) = curl(&[
        "-x",
        &proxy,
        "https://postern.internal/v1/invocations/x",
        "-v",
    ]);
    let _ = body;
    let (_, list) = get_json(&daemon.url("/v1/invocations"), &[]);
    let r = &list["invocations"][0];
    assert_eq!(r["code"], "INVALID_TARGET", "{r}");
    assert_eq!(r["envelope"]["error"]["field"], "target.scheme");
    assert!(
        r["evidence"]["hint"]
            .as_str()
            .unwrap_or("")
            .contains("http://postern.internal"),
        "{r}"
    );
}
