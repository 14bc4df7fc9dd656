//! An operator's first day (issue: running next to an untrusted agent): the daemon keeps a
//! same-user agent out of its memory, the CA is readable by an agent under another user,
//! and the CLI does not silently work on a state directory the daemon never reads.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use crate::support::{Daemon, Home, TEST_CONFIG, daemon_bin};

const NOBODY: &str = "65534";

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs `args` as the unprivileged user the daemon runs as in the test.
fn as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "--",
        ])
        .args(args)
        .output()
        .expect("setpriv")
}

fn chown_nobody(path: &std::path::Path) {
    let ok = Command::new("chown")
        .args([
            "-R",
            &format!("{NOBODY}:{NOBODY}"),
            &path.display().to_string(),
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "chown {}", path.display());
}

#[test]
fn a_same_user_process_cannot_read_the_daemon_s_environment() {
    if !is_root() {
        eprintln!("skipped: needs root to run both sides as another user");
        return;
    }
    let home = Home::new();
    chown_nobody(home.dir.path());
    let wrapper = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    let vault_key = "same-user-vault-key-canary";
    let daemon = Daemon::start_wrapped(
        &home,
        Some(TEST_CONFIG),
        &[("POSTERN_VAULT_KEY", vault_key)],
        &wrapper,
    );
    let pid = daemon.child.id().to_string();
    let environ = format!("/proc/{pid}/environ");
    let read = as_nobody(&["cat", &environ]);
    assert!(
        !read.status.success() && !String::from_utf8_lossy(&read.stdout).contains(vault_key),
        "a process of the daemon's user read its environment"
    );
    let mem = as_nobody(&["cat", &format!("/proc/{pid}/maps")]);
    assert!(!mem.status.success(), "read the daemon's memory map");
    // The control: the same user reads a dumpable process of its own.
    let control = as_nobody(&["sh", "-c", "cat /proc/$$/environ >/dev/null"]);
    assert!(control.status.success(), "the check itself can read");
}

#[test]
fn the_ca_certificate_and_bundle_are_public_and_the_keys_are_not() {
    let home = Home::new();
    let _daemon = Daemon::start(&home, Some(TEST_CONFIG));
    let root = home.root();
    let mode = |p: &str| {
        std::fs::metadata(root.join(p))
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0)
    };
    assert_eq!(mode("certs/ca.pem"), 0o644);
    assert_eq!(mode("certs/bundle.pem"), 0o644);
    assert_eq!(mode("certs"), 0o755);
    assert_eq!(mode("certs/ca.key"), 0o600);
    assert_eq!(mode("journal"), 0o700);
    assert_eq!(mode("ssh"), 0o700);
    assert_eq!(mode(""), 0o711, "passable, not listable");
    let owner = std::fs::metadata(&root).map(|m| m.uid()).unwrap_or(1);
    if is_root() && owner == 0 {
        // An agent under another user trusts postern by the path `postern env` prints.
        let ca = root.join("certs/ca.pem").display().to_string();
        let read = as_nobody(&["cat", &ca]);
        assert!(
            read.status.success(),
            "another user reads the CA certificate"
        );
        let key = root.join("certs/ca.key").display().to_string();
        assert!(!as_nobody(&["cat", &key]).status.success());
        let list = as_nobody(&["ls", &root.display().to_string()]);
        assert!(
            !list.status.success(),
            "the state directory is not listable"
        );
    }
}

#[test]
fn secret_set_outside_the_state_directory_refuses_instead_of_making_a_new_one() {
    let elsewhere = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(daemon_bin());
    cmd.args(["secret", "set", "github-token"])
        .current_dir(elsewhere.path())
        .env_remove("POSTERN_HOME")
        .env("POSTERN_VAULT_KEY", "k")
        .stdin(std::process::Stdio::null());
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("POSTERN_HOME"), "{err}");
    assert!(err.contains("postern init"), "{err}");
    assert!(
        !elsewhere.path().join(".postern").exists(),
        "no fresh state directory was made"
    );
    // After `postern init` there, the same command works.
    let init = Command::new(daemon_bin())
        .arg("init")
        .current_dir(elsewhere.path())
        .env_remove("POSTERN_HOME")
        .env_remove("POSTERN_CONFIG")
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"value").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn init_needs_none_of_the_tokens_it_does_not_use() {
    let home = Home::new();
    let config = home.config(
        "[admin]\ntoken = \"env:FIRST_DAY_ADMIN_TOKEN\"\n[[agents]]\nid = \"ci\"\ntoken = \"env:FIRST_DAY_CI_TOKEN\"\n",
    );
    let out = Command::new(daemon_bin())
        .args(["init", "--config", &config.display().to_string()])
        .env("POSTERN_HOME", home.root())
        .env_remove("FIRST_DAY_ADMIN_TOKEN")
        .env_remove("FIRST_DAY_CI_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(home.root().join("certs/ca.pem").exists());
    // It offers a fresh token for each one unset, long enough for the config's rule.
    let said = String::from_utf8_lossy(&out.stdout);
    let fresh: Vec<&str> = said
        .lines()
        .filter_map(|l| l.split_once("export ").map(|(_, v)| v))
        .collect();
    assert_eq!(fresh.len(), 2, "{said}");
    for (line, name) in fresh
        .iter()
        .zip(["FIRST_DAY_ADMIN_TOKEN", "FIRST_DAY_CI_TOKEN"])
    {
        let value = line.strip_prefix(&format!("{name}=")).unwrap_or("");
        assert!(
            value.len() >= 32 && value.chars().all(|c| c.is_ascii_hexdigit()),
            "{line}"
        );
    }
    assert_ne!(fresh[0].split('=').nth(1), fresh[1].split('=').nth(1));
}
