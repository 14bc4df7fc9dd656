//! Config reload (`postern reload`, `SIGHUP`): a bad config is refused with every problem and
//! the old one stays; a good one is put in force whole; what is in flight keeps the snapshot
//! it started with, and only what starts after the reload sees the new routes.

use std::thread::JoinHandle;
use std::time::Duration;

use crate::origins::{self, Origin};
use crate::support::{Daemon, Home, TEST_CONFIG, curl, get_json, stdout};

fn route(id: &str, host: &str, port: u16, extra: &str) -> String {
    format!(
        "[[routes]]\nid = \"{id}\"\nmatch = {{ scheme = \"http\", host = \"{host}\", port = {port} }}\nresolve = \"127.0.0.1:{port}\"\n{extra}\n"
    )
}

struct Setup {
    home: Home,
    daemon: Daemon,
}

impl Setup {
    fn start(routes: &str) -> Self {
        let home = Home::new();
        let daemon = Daemon::start(&home, Some(&format!("{TEST_CONFIG}{routes}")));
        Self { home, daemon }
    }

    /// Writes the config file the daemon was started with, then `postern reload`.
    fn reload(&self, routes: &str) -> std::process::Output {
        self.home.config(&format!("{TEST_CONFIG}{routes}"));
        self.daemon.cli(&["reload", "--json"], &[])
    }

    fn get(&self, host: &str, port: u16) -> (u16, String, String) {
        let url = format!("http://{host}:{port}/x");
        curl(&["-x", &self.daemon.proxy, "--max-time", "20", &url])
    }

    fn get_later(&self, host: &str, port: u16) -> JoinHandle<(u16, String, String)> {
        let (proxy, url) = (self.daemon.proxy.clone(), format!("http://{host}:{port}/x"));
        std::thread::spawn(move || curl(&["-x", &proxy, "--max-time", "20", &url]))
    }

    fn code(body: &str) -> String {
        serde_json::from_str::<serde_json::Value>(body).unwrap_or_default()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

fn slow() -> Origin {
    origins::slow_head(Duration::from_millis(1500), "slow")
}

#[test]
fn a_route_added_is_used_and_a_request_in_flight_is_untouched() {
    let (a, b) = (slow(), origins::responds("200 OK", &[], "b"));
    let first = route("a", "a.test", a.port(), "");
    let s = Setup::start(&first);
    assert_eq!(Setup::code(&s.get("b.test", b.port()).1), "ROUTE_DENIED");
    let in_flight = s.get_later("a.test", a.port());
    std::thread::sleep(Duration::from_millis(400));
    let out = s.reload(&format!("{first}{}", route("b", "b.test", b.port(), "")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        report["changes"]["routes"]["added"],
        serde_json::json!(["b"])
    );
    let (status, body, _) = s.get("b.test", b.port());
    assert_eq!((status, body.as_str()), (200, "b"));
    let (status, body, _) = in_flight.join().unwrap();
    assert_eq!(
        (status, body.as_str()),
        (200, "slow"),
        "the reload cut nothing short"
    );
}

#[test]
fn a_credential_changed_by_a_reload_is_injected_from_the_next_request_on() {
    let origin = origins::echoes_request();
    let home = Home::new();
    let key = "reload-vault-key";
    assert!(
        crate::support::secret_set(&home, "k", "reload-secret-1", Some(key))
            .status
            .success()
    );
    let cred = |format: &str| {
        format!(
            "[[credentials]]\nid = \"c\"\nsecret = \"k\"\ninject = {{ header = \"X-Api-Key\", format = \"{format} {{secret}}\" }}\n"
        )
    };
    let routes = |format: &str| {
        format!(
            "{}{}",
            cred(format),
            route("a", "a.test", origin.port(), "credential = \"c\"")
        )
    };
    let daemon = Daemon::start_with(
        &home,
        Some(&format!("{TEST_CONFIG}{}", routes("v1"))),
        &[("POSTERN_VAULT_KEY", key)],
    );
    let s = Setup { home, daemon };
    let (status, body, _) = s.get("a.test", origin.port());
    assert_eq!(status, 200, "{body}");
    assert!(
        body.to_ascii_lowercase()
            .contains("x-api-key: v1 [postern:redacted]"),
        "{body}"
    );
    let out = s.reload(&routes("v2"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        report["changes"]["credentials"]["changed"],
        serde_json::json!(["c"])
    );
    let (status, body, _) = s.get("a.test", origin.port());
    assert_eq!(status, 200, "{body}");
    assert!(
        body.to_ascii_lowercase()
            .contains("x-api-key: v2 [postern:redacted]"),
        "{body}"
    );
    assert!(!report.to_string().contains("reload-secret-1"));
}

#[test]
fn a_route_removed_ends_nothing_running_but_admits_nothing_new() {
    let a = slow();
    let s = Setup::start(&route("a", "a.test", a.port(), ""));
    let in_flight = s.get_later("a.test", a.port());
    std::thread::sleep(Duration::from_millis(400));
    let out = s.reload("");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, body, _) = in_flight.join().unwrap();
    assert_eq!((status, body.as_str()), (200, "slow"));
    let (status, body, _) = s.get("a.test", a.port());
    assert_eq!((status, Setup::code(&body).as_str()), (403, "ROUTE_DENIED"));
}

#[test]
fn a_bad_config_is_refused_with_every_problem_and_the_old_one_stays() {
    let a = origins::responds("200 OK", &[], "a");
    let good = route("a", "a.test", a.port(), "");
    let s = Setup::start(&good);
    let bad = format!(
        "{good}[[routes]]\nid = \"b\"\nmatch = {{ host = \"b.test\" }}\ncredential = \"nope\"\nretry_budgets = 1\n"
    );
    let out = s.reload(&bad);
    assert!(!out.status.success());
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let paths: Vec<&str> = report["problems"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["path"].as_str())
        .collect();
    assert!(paths.len() >= 2, "every problem: {report}");
    assert!(paths.iter().any(|p| p.contains("credential")), "{report}");
    let (status, body, _) = s.get("a.test", a.port());
    assert_eq!(
        (status, body.as_str()),
        (200, "a"),
        "the old config still serves"
    );
    let (_, text) = {
        let (st, body, _) = curl(&["-s", &s.daemon.url("/metrics")]);
        (st, body)
    };
    assert!(
        text.contains("postern_config_reloads_total{result=\"refused\"} 1"),
        "{text}"
    );
}

#[test]
fn sighup_reloads_too() {
    let b = origins::responds("200 OK", &[], "b");
    let s = Setup::start("");
    s.home.config(&format!(
        "{TEST_CONFIG}{}",
        route("b", "b.test", b.port(), "")
    ));
    let pid = s.daemon.child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut last = (0, String::new());
    while std::time::Instant::now() < deadline {
        let (status, body, _) = s.get("b.test", b.port());
        last = (status, body);
        if last.0 == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!((last.0, last.1.as_str()), (200, "b"));
    let (_, text, _) = curl(&["-s", &s.daemon.url("/metrics")]);
    assert!(
        text.contains("postern_config_reloads_total{result=\"applied\"} 1"),
        "{text}"
    );
}

#[test]
fn an_approval_rule_changed_while_a_request_is_held_binds_only_new_requests() {
    let a = origins::responds("201 Created", &[], "paid");
    let held = route("a", "a.test", a.port(), "approval = \"required\"");
    let s = Setup::start(&held);
    let waiting = s.get_later("a.test", a.port());
    let mut id = String::new();
    for _ in 0..100 {
        let (_, list) = get_json(&s.daemon.url("/v1/approvals"), &[]);
        if let Some(first) = list["approvals"][0]["invocation_id"].as_str() {
            id = first.to_owned();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!id.is_empty(), "the request is held");
    let out = s.reload(&route("a", "a.test", a.port(), ""));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A new request no longer waits; the held one still does, under its own snapshot.
    let (status, body, _) = s.get("a.test", a.port());
    assert_eq!((status, body.as_str()), (201, "paid"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !waiting.is_finished(),
        "the held request still waits for its approval"
    );
    let approved = s.daemon.cli(&["approve", &id], &[]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let (status, body, _) = waiting.join().unwrap();
    assert_eq!((status, body.as_str()), (201, "paid"));
}

#[test]
fn an_agent_removed_by_a_reload_is_refused_on_a_tunnel_it_opened_before() {
    use std::io::{BufRead, BufReader, Write};
    let origin = crate::tls_origin::echo_origin();
    let agents = |with_ci: bool| {
        let ci = if with_ci {
            "[[agents]]\nid = \"ci\"\ntoken = \"ci-token-long-enough-1\"\n"
        } else {
            ""
        };
        format!(
            "{ci}[[agents]]\nid = \"other\"\ntoken = \"other-token-long-enough\"\n[[routes]]\nid = \"o\"\nmatch = {{ host = \"origin.test\", port = {} }}\nresolve = \"{}\"\nupstream_ca = \"{}\"\n",
            origin.addr.port(),
            origin.addr,
            origin.ca_file.display()
        )
    };
    let s = Setup::start(&agents(true));
    let proxy_port = s
        .daemon
        .proxy
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let ca = s.home.root().join("certs/ca.pem").display().to_string();
    // One CONNECT, two requests inside it, the reload between them.
    let script = format!(
        r#"
import base64, http.client, ssl, sys
ctx = ssl.create_default_context(cafile="{ca}")
conn = http.client.HTTPSConnection("127.0.0.1", {proxy_port}, context=ctx, timeout=20)
auth = base64.b64encode(b"ci:ci-token-long-enough-1").decode()
conn.set_tunnel("origin.test", {port}, headers={{"Proxy-Authorization": "Basic " + auth}})
for n in (1, 2):
    conn.request("GET", "/x")
    r = conn.getresponse(); r.read()
    print(n, r.status, flush=True)
    if n == 1:
        sys.stdin.readline()
"#,
        port = origin.addr.port()
    );
    let mut child = std::process::Command::new("python3")
        .args(["-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "1 200");
    let reloaded = s.reload(&agents(false));
    assert!(
        reloaded.status.success(),
        "{}",
        String::from_utf8_lossy(&reloaded.stderr)
    );
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(
        line.trim(),
        "2 407",
        "the removed agent is refused on its old tunnel"
    );
    let _ = child.wait();
}

#[test]
fn reload_of_a_config_the_cli_cannot_read_names_its_problems_not_a_missing_daemon() {
    let s = Setup::start("");
    let path = s.home.config(&format!(
        "{TEST_CONFIG}[[routes]]\nid = \"b\"\nmatch = {{ host = \"b.test\" }}\nretry_budgets = 1\n"
    ));
    let out = s
        .daemon
        .cli_command(&["reload"])
        .env_remove("POSTERN_ADMIN")
        .env("POSTERN_CONFIG", &path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("routes[0].retry_budgets"), "{err}");
}

/// The one `CONFIG_RELOADED` event chained under a reload's id.
fn reload_event(s: &Setup, report: &serde_json::Value) -> serde_json::Value {
    let id = report["reload_id"].as_str().unwrap_or_default();
    assert!(id.starts_with("rld_"), "{report}");
    let url = s.daemon.url(&format!("/v1/invocations/{id}/events"));
    let (status, events) = get_json(&url, &[]);
    assert_eq!(status, 200, "{events}");
    let events = events["events"].as_array().cloned().unwrap_or_default();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["kind"], "CONFIG_RELOADED");
    assert_eq!(events[0]["seq"], report["seq"]);
    events[0].clone()
}

#[test]
fn every_reload_is_in_the_hash_chain_with_what_changed_and_never_a_value() {
    let a = origins::responds("200 OK", &[], "a");
    let agent = |token: &str| format!("[[agents]]\nid = \"x\"\ntoken = \"{token}\"\n");
    let first = route("a", "a.test", a.port(), "");
    let s = Setup::start(&format!("{}{first}", agent("first-token-long-enough-1")));
    let next = format!(
        "{}{first}{}",
        agent("second-token-long-enough-2"),
        route("b", "b.test", a.port(), "")
    );
    let out = s.reload(&next);
    assert!(out.status.success(), "{}", stdout(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let event = reload_event(&s, &report);
    assert_eq!(event["source"], "operator_attested");
    assert_eq!(event["data"]["result"], "applied");
    assert_eq!(
        event["data"]["changes"]["routes"]["added"],
        serde_json::json!(["b"])
    );
    assert_eq!(
        event["data"]["changes"]["agents"]["changed"],
        serde_json::json!(["x"])
    );
    let text = event.to_string();
    assert!(
        !text.contains("token-long-enough"),
        "a token reached the journal: {text}"
    );

    // A refused reload is chained too, with its problems' config paths.
    let out = s.reload(&format!(
        "{next}[[routes]]\nid = \"c\"\nmatch = {{ host = \"c.test\" }}\ncredential = \"nope\"\n"
    ));
    assert!(!out.status.success());
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let event = reload_event(&s, &report);
    assert_eq!(event["data"]["result"], "refused");
    let paths = event["data"]["problems"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        paths
            .iter()
            .any(|p| p.as_str().is_some_and(|p| p.contains("credential"))),
        "{event}"
    );

    let out = s.daemon.cli(&["audit", "verify"], &[]);
    assert!(
        out.status.success(),
        "{}{}",
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Many requests in flight, fast and slow, while the config is reloaded again and again:
/// every one is answered by the route it started with, none is cut or refused.
#[test]
fn reloads_under_load_lose_no_request_in_flight() {
    let (fast, slow) = (origins::responds("200 OK", &[], "fast"), slow());
    let base = format!(
        "{}{}",
        route("f", "f.test", fast.port(), ""),
        route("s", "s.test", slow.port(), "")
    );
    let s = Setup::start(&base);
    let proxy = s.daemon.proxy.clone();
    let workers: Vec<_> = (0..6)
        .map(|i| {
            let proxy = proxy.clone();
            let (host, port, rounds) = match i {
                0 | 1 => ("s.test", slow.port(), 3),
                _ => ("f.test", fast.port(), 25),
            };
            std::thread::spawn(move || {
                let url = format!("http://{host}:{port}/x");
                (0..rounds)
                    .map(|_| curl(&["-x", &proxy, "--max-time", "20", &url]))
                    .map(|(status, body, _)| (status, body))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let extra = route("e", "e.test", fast.port(), "");
    for round in 0..12 {
        let routes = if round % 2 == 0 {
            format!("{base}{extra}")
        } else {
            base.clone()
        };
        let out = s.reload(&routes);
        assert!(out.status.success(), "{}", stdout(&out));
        std::thread::sleep(Duration::from_millis(150));
    }
    for (i, worker) in workers.into_iter().enumerate() {
        let want = if i < 2 { "slow" } else { "fast" };
        for (status, body) in worker.join().unwrap() {
            assert_eq!((status, body.as_str()), (200, want), "worker {i}");
        }
    }
    let (_, metrics, _) = curl(&["-s", &s.daemon.url("/metrics")]);
    assert!(
        metrics.contains("postern_config_reloads_total{result=\"applied\"} 12"),
        "{metrics}"
    );
    let out = s.daemon.cli(&["audit", "verify"], &[]);
    assert!(out.status.success(), "{}", stdout(&out));
}

/// Issue 40: an agent of the operator's uid moved the config's directory away and made a new
/// one holding its own `postern.toml` (a route of its own); the operator's next reload read
/// it. A reload reads only the config postern started with: this one is refused, the old
/// config stays, and a config edited in place is still reloaded.
#[test]
fn a_config_whose_directory_was_replaced_is_refused_and_the_old_one_stays() {
    let (a, evil) = (
        origins::responds("200 OK", &[], "a"),
        origins::responds("200 OK", &[], "evil"),
    );
    let good = format!("{TEST_CONFIG}{}", route("a", "a.test", a.port(), ""));
    let with_evil = format!("{good}{}", route("evil", "evil.test", evil.port(), ""));
    let home = Home::new();
    let dir = home.dir.path().join("project");
    std::fs::create_dir(&dir).unwrap();
    let config = dir.join("postern.toml");
    std::fs::write(&config, &good).unwrap();
    let s = Setup {
        daemon: Daemon::start_file(&home, &config),
        home,
    };
    let moved = dir.with_extension("moved");
    std::fs::rename(&dir, &moved).unwrap();
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(&config, &with_evil).unwrap();
    let out = s.daemon.cli(&["reload", "--json"], &[]);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap_or_default();
    assert!(!out.status.success(), "{report}");
    assert_eq!(report["reloaded"], false, "{report}");
    assert!(
        report["problems"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("was moved or replaced")),
        "{report}"
    );
    assert_eq!(
        Setup::code(&s.get("evil.test", evil.port()).1),
        "ROUTE_DENIED"
    );
    assert_eq!(s.get("a.test", a.port()).1, "a", "the old config serves");
    // The real file, edited where it is, reloads as before.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::rename(&moved, &dir).unwrap();
    std::fs::write(&config, &with_evil).unwrap();
    let out = s.daemon.cli(&["reload", "--json"], &[]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert_eq!(s.get("evil.test", evil.port()).1, "evil");
}

/// Issue 40 medium 6: a pending restart is measured against the settings in force (a second
/// reload did not forget it); text-mode `postern reload` names its `reload_id`, and
/// `postern actions show rld_…` shows the reload's journal event.
#[test]
fn a_pending_restart_survives_a_second_reload_and_a_reload_id_can_be_shown() {
    let a = origins::responds("200 OK", &[], "a");
    let first = route("a", "a.test", a.port(), "");
    let s = Setup::start(&first);
    let moved = TEST_CONFIG.replace("[proxy]\n", "[proxy]\nmax_connections = 500\n");
    let write = |routes: &str| s.home.config(&format!("{moved}{routes}"));
    write(&first);
    let out = s.daemon.cli(&["reload", "--json"], &[]);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap_or_default();
    assert_eq!(
        report["changes"]["restart_needed"],
        serde_json::json!(["proxy"]),
        "{report}"
    );
    write(&format!("{first}{}", route("b", "b.test", a.port(), "")));
    let out = s.daemon.cli(&["reload"], &[]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains("restart_needed") && text.contains("proxy"),
        "{text}"
    );
    let id = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| w.starts_with("rld_"))
        .unwrap_or_else(|| panic!("no reload id: {text}"))
        .to_owned();
    let out = s.daemon.cli(&["actions", "show", &id], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("CONFIG_RELOADED"), "{}", stdout(&out));
}

/// Issue 40 (low 5): a reload that adds a credential whose secret the vault lacks says so.
#[test]
fn a_reload_naming_a_secret_the_vault_lacks_warns_by_name() {
    let s = Setup::start("");
    let out = s.reload(
        "[[credentials]]\nid = \"pay\"\nsecret = \"pay-key\"\ninject = { header = \"X-Api-Key\" }\n",
    );
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap_or_default();
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("credential pay: secret pay-key is not in the vault")
            && warnings.contains("CREDENTIAL_MISSING"),
        "{report}"
    );
}
