use std::time::Duration;

use super::*;
use crate::config::SecretValue;

fn sh(script: &str, ttl: Duration) -> SecretSource {
    SecretSource::Command {
        argv: ["sh", "-c", script].map(String::from).to_vec(),
        ttl,
    }
}

#[test]
fn a_file_is_read_at_each_use_and_its_version_follows_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let vault = Vault::new(dir.path(), None);
    let path = dir.path().join("token");
    let source = SecretSource::File(path.clone());
    std::fs::write(&path, "first-value\n").unwrap();
    let first = vault.fetch(&source).unwrap();
    assert_eq!(first.value, "first-value");
    assert!(first.version.to_string().starts_with("file:"));
    assert_eq!(first.version.to_string().len(), "file:".len() + 12);
    assert!(!format!("{first:?}").contains("first-value"));
    std::fs::write(&path, "second-value\r\n").unwrap();
    let second = vault.fetch(&source).unwrap();
    assert_eq!(second.value, "second-value");
    assert_ne!(first.version, second.version);
    std::fs::write(&path, "first-value").unwrap();
    assert_eq!(vault.fetch(&source).unwrap().version, first.version);
    std::fs::write(&path, "\n").unwrap();
    let empty = vault.fetch(&source).err().unwrap();
    assert_eq!(
        empty.evidence(),
        Some(json!({"kind": "file", "failure": "empty"}))
    );
    std::fs::remove_file(&path).unwrap();
    let gone = vault.fetch(&source).err().unwrap();
    assert_eq!(gone.code(), Code::CredentialMissing);
    let failure = gone.failure("gh");
    let diagnostic = failure.diagnostic.unwrap_or_default();
    assert!(diagnostic.contains("credential gh") && diagnostic.contains("does not exist"));
    assert_eq!(
        failure.evidence.get("secret_source"),
        Some(&json!({"kind": "file", "failure": "not_found"}))
    );
}

#[test]
fn versions_are_keyed_by_a_kept_per_home_key() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = SecretSource::Env {
        name: "X".into(),
        value: Some(SecretValue::new("1234".into())),
    };
    let version = |home: &Path| Vault::new(home, None).fetch(&env).unwrap().version;
    let first = version(a.path());
    assert!(first.to_string().starts_with("env:"));
    assert_eq!(version(a.path()), first, "the key is kept across restarts");
    assert_ne!(version(b.path()), first, "another home, another key");
    // Not the plain digest anyone could compute from a guess.
    use sha2::Digest;
    let plain = sha2::Sha256::digest(b"env\x001234");
    let plain_hex: String = plain.iter().take(6).map(|b| format!("{b:02x}")).collect();
    assert!(!first.to_string().contains(&plain_hex));
    let key = a.path().join(KEY_FILE);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    std::fs::write(&key, b"short").unwrap();
    let broken = Vault::new(a.path(), None).fetch(&env).err().unwrap();
    assert!(matches!(broken, SecretError::Key(_)), "{broken:?}");
}

#[test]
fn an_unset_variable_is_missing_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let vault = Vault::new(dir.path(), None);
    let unset = SecretSource::Env {
        name: "GH_TOKEN".into(),
        value: None,
    };
    let e = vault.fetch(&unset).err().unwrap();
    assert_eq!(e.code(), Code::CredentialMissing);
    assert!(e.to_string().contains("GH_TOKEN"));
}

#[test]
fn a_command_runs_once_per_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let vault = Vault::new(dir.path(), None);
    let runs = dir.path().join("runs");
    let script = format!("echo run >> {0}; wc -l < {0} | tr -d ' '", runs.display());
    let kept = sh(&script, Duration::from_secs(300));
    let first = vault.fetch(&kept).unwrap();
    assert_eq!(first.value, "1");
    assert!(first.version.to_string().starts_with("command:"));
    assert_eq!(vault.fetch(&kept).unwrap().value, "1", "kept for the ttl");
    let script = format!("echo run >> {0}; wc -l < {0} | tr -d ' '", runs.display());
    let brief = sh(&format!("{script} # brief"), Duration::ZERO);
    assert_eq!(vault.fetch(&brief).unwrap().value, "2");
    let third = vault.fetch(&brief).unwrap();
    assert_eq!(third.value, "3", "a zero ttl runs each time");
    assert_ne!(third.version, first.version);
}

#[test]
fn a_failing_command_gives_its_status_never_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let vault = Vault::new(dir.path(), None);
    let runs = dir.path().join("runs");
    let script = format!(
        "echo run >> {}; echo canary-out-51; echo canary-err-51 >&2; exit 3",
        runs.display()
    );
    let failing = sh(&script, Duration::from_secs(300));
    let e = vault.fetch(&failing).err().unwrap();
    assert_eq!(e.code(), Code::CredentialMissing);
    assert_eq!(
        e.evidence(),
        Some(json!({"kind": "command", "failure": "exit_status", "exit_status": 3}))
    );
    let shown = format!("{e} {e:?} {:?}", e.failure("op"));
    assert!(
        shown.contains("status 3") && shown.contains("`sh`"),
        "{shown}"
    );
    assert!(!shown.contains("canary"), "{shown}");
    // Held briefly: a broken command is not started for every request.
    assert!(vault.fetch(&failing).is_err());
    let count = std::fs::read_to_string(&runs).unwrap().lines().count();
    assert_eq!(count, 1);
}

#[test]
fn unavailable_names_every_kind_of_missing_secret() {
    let dir = tempfile::tempdir().unwrap();
    Vault::new(dir.path(), Some("k".into()))
        .set("present", "v")
        .unwrap();
    let text = format!(
        "[[credentials]]\nid = \"a\"\nsecret = \"present\"\ninject = {{ header = \"X-A\" }}\n\
         [[credentials]]\nid = \"b\"\nsecret = \"absent\"\ninject = {{ header = \"X-B\" }}\n\
         [[credentials]]\nid = \"c\"\nsecret = \"file:{0}/nope\"\ninject = {{ header = \"X-C\" }}\n\
         [[credentials]]\nid = \"d\"\nsecret = \"env:POSTERN_TEST_UNSET\"\ninject = {{ header = \"X-D\" }}\n\
         [[credentials]]\nid = \"e\"\nsecret = {{ command = [\"false\"] }}\ninject = {{ header = \"X-E\" }}\n\
         [[credentials]]\nid = \"f\"\nsecret = {{ command = [\"echo\", \"ok\"] }}\ninject = {{ header = \"X-F\" }}\n",
        dir.path().display()
    );
    let config = crate::config::parse(&text, None, &|_| None).unwrap();
    let vault = Vault::new(dir.path(), None);
    let missing: Vec<(&str, String)> = vault
        .unavailable(&config)
        .iter()
        .map(|u| (u.credential, u.source.label()))
        .collect();
    let nope = format!("file:{}/nope", dir.path().display());
    assert_eq!(
        missing,
        vec![
            ("b", "absent".to_owned()),
            ("c", nope),
            ("d", "env:POSTERN_TEST_UNSET".to_owned()),
            ("e", "command:false".to_owned()),
        ]
    );
}
