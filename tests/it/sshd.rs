//! A real OpenSSH `sshd`, run as this test's own process on a free loopback port, with a
//! fresh host key and one authorized client key (`tests/run` installs openssh-server).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

/// A key pair made with `ssh-keygen` (ed25519, no passphrase).
pub struct KeyPair {
    /// The OpenSSH private key PEM.
    pub private: String,
    /// `ssh-ed25519 AAAA… comment`.
    pub public: String,
}

pub fn keygen(dir: &Path, name: &str) -> KeyPair {
    let path = dir.join(name);
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&path)
        .status()
        .expect("ssh-keygen must be installed (tests/run installs openssh-client)");
    assert!(status.success());
    KeyPair {
        private: std::fs::read_to_string(&path).unwrap(),
        public: std::fs::read_to_string(path.with_extension("pub"))
            .unwrap()
            .trim()
            .to_owned(),
    }
}

/// The running sshd; killed on drop.
pub struct Sshd {
    child: Child,
    pub port: u16,
    pub host_key: KeyPair,
    /// The key `authorized_keys` lists.
    pub client_key: KeyPair,
    pub user: String,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn whoami() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

impl Sshd {
    pub fn start() -> Self {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing (tests/run installs openssh-server)"
        );
        // sshd insists on its privilege-separation directory.
        let _ = std::fs::create_dir_all("/run/sshd");
        let dir = tempfile::tempdir().unwrap();
        let host_key = keygen(dir.path(), "host_key");
        let client_key = keygen(dir.path(), "client_key");
        let authorized = dir.path().join("authorized_keys");
        std::fs::write(&authorized, format!("{}\n", client_key.public)).unwrap();
        let user = whoami();
        let port = free_port();
        let config = dir.path().join("sshd_config");
        let d = dir.path().display();
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile none\n\
                 UsePAM no\nStrictModes no\nAuthorizedKeysFile {}\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\n\
                 AllowUsers {user}\nLogLevel ERROR\n",
                authorized.display()
            ),
        )
        .unwrap();
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sshd");
        let sshd = Self {
            child,
            port,
            host_key,
            client_key,
            user,
            _dir: dir,
        };
        sshd.wait_listening();
        sshd
    }

    fn wait_listening(&self) {
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "sshd did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A known_hosts file naming `host` (port 22) with this sshd's host key.
    pub fn known_hosts(&self, dir: &Path, host: &str) -> PathBuf {
        let path = dir.join("known_hosts");
        std::fs::write(&path, format!("{host} {}\n", self.host_key.public)).unwrap();
        path
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
