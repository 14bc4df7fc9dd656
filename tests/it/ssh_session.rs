//! The upstream SSH session before the dispatch boundary: a target named by DNS resolves
//! through `[dns] servers` (the `dns` stage recorded).

use serde_json::Value;

use crate::dns::dns_server;
use crate::ssh::{Front, TOKEN, envelope, target_config};
use crate::ssh_peer::Peer;
use crate::sshd::keygen;
use crate::support::{Home, stderr, stdout};

/// postern with the key credential for `peer`; `more` is appended to the config.
fn key_front(peer: &Peer, home: Home, more: &str) -> Front {
    let client = keygen(home.dir.path(), "client_key");
    let text = target_config("deploy", peer.port, &peer.known_hosts, "") + more;
    Front::serve(home, &text, "deploy".into(), client.private, None)
}

/// Every exec record, newest first, each with its events (`actions show --json`).
pub fn exec_records(f: &Front) -> Vec<Value> {
    let out = f.daemon.cli(&["actions", "list", "--json"], &[]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let ids: Vec<String> = list["invocations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["method"] == "exec")
        .filter_map(|r| r["invocation_id"].as_str().map(str::to_owned))
        .collect();
    ids.iter()
        .map(|id| {
            let out = f.daemon.cli(&["actions", "show", id, "--json"], &[]);
            serde_json::from_slice(&out.stdout).unwrap()
        })
        .collect()
}

/// The `CONNECT_ATTEMPT` events' data, in order.
fn connect_attempts(shown: &Value) -> Vec<Value> {
    shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "CONNECT_ATTEMPT")
        .map(|e| e["data"].clone())
        .collect()
}

fn stage_summary(attempts: &[Value]) -> Vec<(u64, String, bool)> {
    attempts
        .iter()
        .map(|a| {
            (
                a["n"].as_u64().unwrap_or(0),
                a["stage"].as_str().unwrap_or("").to_owned(),
                a["ok"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

#[test]
fn a_target_named_by_dns_resolves_through_the_configured_servers() {
    let dns_port = dns_server("ssh.test");
    let home = Home::new();
    let peer = Peer::named(&["ssh.test"], home.dir.path());
    let port = peer.port;
    let kh = peer.known_hosts.display().to_string();
    let more = format!(
        "[[ssh_targets]]\nid = \"named\"\nhost = \"ssh.test\"\nport = {port}\nuser = \"deploy\"\n\
         agents = [\"ci\"]\ncredential = \"deploy-key\"\nknown_hosts = \"{kh}\"\nconnect_timeout = \"5s\"\n\
         [[ssh_targets]]\nid = \"missing\"\nhost = \"missing.test\"\nport = {port}\nuser = \"deploy\"\n\
         agents = [\"ci\"]\ncredential = \"deploy-key\"\nknown_hosts = \"{kh}\"\nconnect_timeout = \"5s\"\n\
         [dns]\nservers = [\"127.0.0.1:{dns_port}\"]\n"
    );
    let f = key_front(&peer, home, &more);
    let p = port.to_string();
    let out = f.ssh(TOKEN, &["-p", &p, "--", "deploy@ssh.test", "hello"]);
    assert_eq!(stdout(&out), "ran hello\n", "{}", stderr(&out));
    let r = &exec_records(&f)[0];
    assert_eq!(r["route"], "named", "{r}");
    assert_eq!(r["outcome"], "committed", "{r}");
    let attempts = connect_attempts(r);
    assert_eq!(attempts[0]["stage"], "dns", "{r}");
    assert_eq!(attempts[0]["ok"], true, "{r}");
    assert_eq!(attempts[0]["address"], format!("127.0.0.1:{port}"), "{r}");

    let out = f.ssh(TOKEN, &["-p", &p, "--", "deploy@missing.test", "hello"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(255), "{err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["code"], "DNS_ERROR", "{err}");
    assert_eq!(env["error"]["phase"], "connection_setup", "{err}");
    assert_eq!(env["error"]["outcome"], "not_attempted", "{err}");
    assert_eq!(env["error"]["retry"], "backoff", "{err}");
    assert_eq!(env["evidence"]["attempts"][0]["stage"], "dns", "{err}");
    let r = &exec_records(&f)[0];
    assert_eq!(r["route"], "missing", "{r}");
    let attempts = connect_attempts(r);
    assert_eq!(stage_summary(&attempts), [(1, "dns".into(), false)], "{r}");
    assert_eq!(attempts[0]["code"], "DNS_ERROR", "{r}");
    assert_eq!(peer.connections(), 1, "the unresolved name never connected");
}
