//! Password logins (`inject = { ssh_password = true }`) and the reflection guard over what
//! a remote command prints (SPEC §1.8), through the real OpenSSH client and `postern
//! ssh-connect`. The upstream is a scripted russh peer: an sshd not running as root cannot
//! check passwords. The injected secret must surface nowhere an agent or operator reads.

use std::io::{Read, Write};
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use serde_json::Value;

use crate::ssh::{Front, TOKEN, envelope, target_config};
use crate::ssh_peer::Peer;
use crate::ssh_session::{exec_records, kinds};
use crate::sshd::keygen;
use crate::support::{Home, curl, stderr, stdout};

const PASSWORD: &str = "pw-canary-7c1e9d-SSH";

/// postern with one password credential for `peer`; the vault holds `vault_value`.
fn password_front(peer: &Peer, home: Home, vault_value: &str) -> Front {
    let text = target_config("deploy", peer.port, &peer.known_hosts, "")
        .replace("ssh_key = true", "ssh_password = true");
    Front::serve(home, &text, "deploy".into(), vault_value.into(), None)
}

/// The stored stdout and stderr of an invocation, decoded (empty without a result).
fn stored_output(f: &Front, id: &str) -> (String, String) {
    let out = f.daemon.cli(&["result", id, "--json"], &[]);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let decode = |k: &str| {
        let b = STANDARD
            .decode(result[k].as_str().unwrap_or(""))
            .unwrap_or_default();
        String::from_utf8_lossy(&b).into_owned()
    };
    (decode("stdout_base64"), decode("stderr_base64"))
}

/// The forms a leaked password would take.
fn forms(secret: &str) -> Vec<String> {
    let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
    vec![
        secret.to_owned(),
        hex.to_uppercase(),
        hex,
        STANDARD.encode(secret),
        STANDARD_NO_PAD.encode(secret),
        URL_SAFE_NO_PAD.encode(secret),
    ]
}

/// None of `canaries` in: the agent's output, the daemon's stdout and stderr, every view of
/// every record (`actions list/show`, `result`, JSON and text), `/metrics`, the stored
/// output decoded, the raw files under POSTERN_HOME and the journal's values decoded.
/// Stops the daemon.
fn assert_nowhere(f: &mut Front, agent: &[&Output], canaries: &[String]) {
    let mut seen = Vec::new();
    for out in agent {
        seen.push(("the agent's output".to_owned(), stdout(out) + &stderr(out)));
    }
    let daemon_out = f.daemon.stdout.join("\n") + &f.daemon.stdout_until("\u{0}").join("\n");
    seen.push(("the daemon's stdout".into(), daemon_out));
    seen.push(("the daemon's stderr".into(), f.daemon.stderr()));
    seen.push(("/metrics".into(), curl(&[&f.daemon.url("/metrics")]).1));
    seen.push((
        "actions list".into(),
        stdout(&f.daemon.cli(&["actions", "list"], &[])),
    ));
    for r in exec_records(f) {
        let id = r["invocation_id"].as_str().unwrap().to_owned();
        for args in [
            vec!["actions", "show", &id, "--json"],
            vec!["actions", "show", &id],
            vec!["result", &id, "--json"],
            vec!["result", &id],
        ] {
            let out = f.daemon.cli(&args, &[]);
            seen.push((args.join(" "), stdout(&out) + &stderr(&out)));
        }
        let (o, e) = stored_output(f, &id);
        seen.push((format!("the stored output of {id}"), o + &e));
    }
    seen.push((
        "the files and the journal's values".into(),
        crate::support::stored_text(&mut f.daemon),
    ));
    for (what, text) in &seen {
        for c in canaries {
            assert!(!text.contains(c.as_str()), "{what} holds {c}");
        }
    }
}

#[test]
fn a_password_login_runs_the_exec_and_the_echoed_password_is_redacted() {
    let home = Home::new();
    let peer = Peer::accepts_password(PASSWORD, home.dir.path());
    let mut f = password_front(&peer, home, PASSWORD);
    let out = f.ssh(TOKEN, &["--", "", "echo-password"]);
    let (agent_out, agent_err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{agent_err}");
    assert_eq!(
        agent_out, "you said: [postern:redacted]\nhex: [postern:redacted]\ndone\n",
        "the password, split across two messages, and its hex: {agent_err}"
    );
    assert!(
        agent_err.contains("b64: [postern:redacted]\n"),
        "stderr is guarded too: {agent_err}"
    );
    let r = &exec_records(&f)[0];
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["result"]["exit_status"], 0, "{r}");
    assert_eq!(r["evidence"]["credential"]["mode"], "ssh_password", "{r}");
    assert_eq!(
        r["evidence"]["redactions"], 3,
        "the count, never the value: {r}"
    );
    let id = r["invocation_id"].as_str().unwrap();
    let (stored_out, stored_err) = stored_output(&f, id);
    assert_eq!(
        stored_out, agent_out,
        "the stored result is the guarded one"
    );
    assert_eq!(stored_err, "b64: [postern:redacted]\n");
    assert_nowhere(&mut f, &[&out], &forms(PASSWORD));
}

/// A remote that prints the password with some characters escaped, an escape cut across
/// two messages: redacted for the agent and in the stored result, and no decoded form of
/// it anywhere.
#[test]
fn a_partly_escaped_password_is_redacted_for_the_agent_and_in_the_result() {
    let home = Home::new();
    let peer = Peer::accepts_password(PASSWORD, home.dir.path());
    let mut f = password_front(&peer, home, PASSWORD);
    let out = f.ssh(TOKEN, &["--", "", "echo-escaped"]);
    let (agent_out, agent_err) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{agent_err}");
    assert_eq!(agent_out, "json: [postern:redacted]\n", "{agent_err}");
    assert!(
        agent_err.contains("mixed: [postern:redacted]\n"),
        "{agent_err}"
    );
    let r = &exec_records(&f)[0];
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["evidence"]["redactions"], 2, "{r}");
    let id = r["invocation_id"].as_str().unwrap();
    let (stored_out, stored_err) = stored_output(&f, id);
    assert_eq!(
        stored_out, agent_out,
        "the stored result is the guarded one"
    );
    assert_eq!(stored_err, "mixed: [postern:redacted]\n");
    let mut canaries = forms(PASSWORD);
    canaries.extend([
        PASSWORD.replacen('w', "\\u0077", 1),
        "-canary-7c1e9d".to_owned(),
        PASSWORD.replacen('c', "%63", 1).replacen('S', "\\x53", 1),
    ]);
    assert_nowhere(&mut f, &[&out], &canaries);
}

#[test]
fn a_wrong_password_is_an_auth_failure_before_dispatch() {
    let home = Home::new();
    let peer = Peer::accepts_password("not-what-the-vault-holds", home.dir.path());
    let mut f = password_front(&peer, home, PASSWORD);
    let out = f.ssh(TOKEN, &["--", "", "echo hi"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert!(out.stdout.is_empty(), "{err}");
    let env = envelope(&err);
    assert_eq!(env["error"]["code"], "SSH_AUTH_FAILED", "{err}");
    assert_eq!(env["error"]["phase"], "connection_setup", "{err}");
    assert_eq!(env["error"]["outcome"], "not_attempted", "{err}");
    assert_eq!(env["error"]["retry"], "after_correction", "{err}");
    assert_eq!(env["evidence"]["dispatch_started"], false, "{err}");
    let attempts = env["evidence"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.last().unwrap()["stage"], "user_auth", "{env}");
    let r = &exec_records(&f)[0];
    assert_eq!(r["code"], "SSH_AUTH_FAILED", "{r}");
    assert_eq!(r["outcome"], "not_attempted", "{r}");
    let k = kinds(r);
    assert!(!k.iter().any(|k| k == "DISPATCH_STARTED"), "{k:?}");
    assert_nowhere(&mut f, &[&out], &forms(PASSWORD));
}

#[test]
fn a_private_key_the_remote_prints_is_redacted() {
    let home = Home::new();
    let client = keygen(home.dir.path(), "client_key");
    let peer = Peer::prints(&client.private, home.dir.path());
    let text = target_config("deploy", peer.port, &peer.known_hosts, "");
    let mut f = Front::serve(home, &text, "deploy".into(), client.private.clone(), None);
    let out = f.ssh(TOKEN, &["--", "", "print"]);
    let agent_out = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<String> = client
        .private
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .map(str::to_owned)
        .collect();
    assert!(lines.len() >= 3, "{}", client.private);
    assert!(
        agent_out.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----\n[postern:redacted]\n"),
        "{agent_out}"
    );
    let r = &exec_records(&f)[0];
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["evidence"]["redactions"], lines.len(), "{r}");
    // The first line encodes only the format and key type, the same in every ed25519
    // key (postern's own host key file has it too): the rest is this key's.
    assert_nowhere(&mut f, &[&out], &lines[1..]);
}

/// Output held back as a possible start of the password (`pw-`) goes out once the remote
/// pauses: a command waiting for the agent's answer to it (a prompt, git's protocol) is
/// not stalled until its idle timeout.
#[test]
fn held_back_output_goes_out_when_the_remote_pauses() {
    let home = Home::new();
    let peer = Peer::accepts_password(PASSWORD, home.dir.path());
    let f = password_front(&peer, home, PASSWORD);
    let mut child = f
        .ssh_command(TOKEN, &["--", "", "ask"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut agent_out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = agent_out.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    while !seen.ends_with(b"ready: pw-") {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(bytes) => seen.extend_from_slice(&bytes),
            Err(_) => {
                let _ = child.kill();
                panic!("the prompt never reached the agent: {seen:?}");
            }
        }
    }
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"yes\n").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    while let Ok(bytes) = rx.recv_timeout(Duration::from_secs(5)) {
        seen.extend_from_slice(&bytes);
    }
    assert_eq!(String::from_utf8_lossy(&seen), "ready: pw-\ngot yes\n");
    assert_eq!(status.code(), Some(0));
}
