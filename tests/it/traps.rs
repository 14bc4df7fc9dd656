//! An operator's first day without traps (issue 20, section 4): what a newcomer hits before
//! reading the whole README is refused or explained where it happens.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Home, TEST_CONFIG, daemon_bin};

/// A config with one SSH target; `extra` adds keys to it.
fn ssh_target_config(home: &Home, extra: &str) -> String {
    let known = home.dir.path().join("known_hosts");
    std::fs::write(
        &known,
        "app1.internal ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMwq\n",
    )
    .unwrap();
    format!(
        "{TEST_CONFIG}\n[[credentials]]\nid = \"k\"\nsecret = \"s\"\ninject = {{ ssh_key = true }}\n\
         [[ssh_targets]]\nid = \"t\"\nhost = \"app1.internal\"\nuser = \"deploy\"\ncredential = \"k\"\n\
         known_hosts = \"{}\"\n{extra}\n",
        known.display()
    )
}

/// `postern serve` with `text`, which must refuse to start (killed if it runs 20 s).
fn serve_refused(home: &Home, text: &str) -> String {
    let path = home.config(text);
    let err_path = home.dir.path().join("refused.stderr");
    let mut child = Command::new(daemon_bin())
        .args(["serve", "--config"])
        .arg(&path)
        .env("POSTERN_HOME", home.root())
        .env_remove("POSTERN_CONFIG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        match child.try_wait().unwrap() {
            Some(status) => break Some(status),
            None if Instant::now() > deadline => break None,
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "serve started:\n{err}"
    );
    err
}

/// `allow = ["shell"]` was accepted and then refused at run time as "not built yet".
#[test]
fn an_ssh_action_that_is_not_built_is_a_config_error_naming_its_key() {
    let home = Home::new();
    let err = serve_refused(
        &home,
        &ssh_target_config(
            &home,
            "allow = [\"exec\", \"shell\", \"port_forward\", \"subsystem\"]",
        ),
    );
    for j in 1..=3 {
        let key = format!("ssh_targets[0].allow[{j}]: ");
        assert!(err.contains(&key), "{key} missing from:\n{err}");
    }
    assert!(!err.contains("ssh_targets[0].allow[0]"), "{err}");
    assert!(err.contains("not built"), "{err}");
}
