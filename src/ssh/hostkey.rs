//! postern's own SSH host key (ed25519, `POSTERN_HOME/ssh/host_ed25519`, mode 0600): made
//! once, reused after, so agents' `known_hosts` stay valid across restarts.

use std::io::Write;
use std::path::{Path, PathBuf};

use russh::keys::ssh_key::{Algorithm, LineEnding, PrivateKey};

/// The key file under the state directory's `ssh/`.
pub fn key_path(ssh_dir: &Path) -> PathBuf {
    ssh_dir.join("host_ed25519")
}

/// The known_hosts file `postern ssh-config` writes for agents' `UserKnownHostsFile`.
pub fn known_hosts_path(ssh_dir: &Path) -> PathBuf {
    ssh_dir.join("known_hosts")
}

/// Loads the host key, creating it on first use.
pub fn load_or_create(ssh_dir: &Path) -> Result<PrivateKey, String> {
    let path = key_path(ssh_dir);
    match std::fs::read_to_string(&path) {
        Ok(text) => PrivateKey::from_openssh(text.as_bytes())
            .map_err(|e| format!("cannot read the SSH host key {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(&path),
        Err(e) => Err(format!(
            "cannot read the SSH host key {}: {e}",
            path.display()
        )),
    }
}

fn create(path: &Path) -> Result<PrivateKey, String> {
    let fail = |e: &dyn std::fmt::Display| {
        format!("cannot create the SSH host key {}: {e}", path.display())
    };
    let key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).map_err(|e| fail(&e))?;
    let text = key.to_openssh(LineEnding::LF).map_err(|e| fail(&e))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|e| fail(&e))?;
    file.write_all(text.as_bytes()).map_err(|e| fail(&e))?;
    file.sync_all().map_err(|e| fail(&e))?;
    Ok(key)
}

/// The name an OpenSSH client looks a host up by: `host`, or `[host]:port` off port 22.
pub fn known_hosts_name(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_owned()
    } else {
        format!("[{host}]:{port}")
    }
}

/// The known_hosts names of the configured targets, each once, sorted.
pub fn target_names(config: &crate::config::Config) -> Vec<String> {
    let mut names: Vec<String> = config
        .ssh_targets
        .iter()
        .map(|t| known_hosts_name(&t.host, t.port))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// One known_hosts line naming `hosts` with postern's public key.
pub fn known_hosts_line(hosts: &[String], key: &PrivateKey) -> Result<String, String> {
    let public = key
        .public_key()
        .to_openssh()
        .map_err(|e| format!("cannot encode the SSH host key: {e}"))?;
    // The key's comment (if any) is dropped: algorithm and base64 are what ssh compares.
    let mut parts = public.split_whitespace();
    let (algo, b64) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    Ok(format!("{} {algo} {b64}", hosts.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_key_is_made_once_with_mode_0600_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        let again = load_or_create(dir.path()).unwrap();
        assert_eq!(first.public_key(), again.public_key());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(key_path(dir.path()))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let line = known_hosts_line(&["a".into(), "[b]:2200".into()], &first).unwrap();
        assert!(line.starts_with("a,[b]:2200 ssh-ed25519 AAAA"), "{line}");
        assert_eq!(known_hosts_name("h", 22), "h");
        assert_eq!(known_hosts_name("h", 2200), "[h]:2200");
    }
}
