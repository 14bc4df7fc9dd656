//! The encrypted vault: `POSTERN_HOME/vault.json`.
//!
//! The key is derived with argon2id from `POSTERN_VAULT_KEY`; each secret is sealed
//! with XChaCha20-Poly1305 under its own nonce, its name and non-secret version as
//! associated data. Names and versions are plaintext; values never leave this module
//! except as a `SecretValue` handed to the injector.
//!
//! A credential's secret may come from elsewhere too (`source`: a file, an environment
//! variable, a command); `Vault::fetch` is the one way HTTP and SSH ask for any of them.

mod command;
mod source;

pub use command::CommandFailure;
pub use source::{FileFailure, KEY_FILE, SecretError, Unavailable};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::SystemTime;

use chacha20poly1305::aead::{Aead, Generate, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};

use crate::contract::SecretVersion;
use crate::journal::{b64, unb64};

/// A secret value and its non-secret version. Debug never shows the value.
#[derive(Clone)]
pub struct Secret {
    pub value: String,
    pub version: SecretVersion,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(version {}, [redacted])", self.version)
    }
}

/// Why a secret could not be had; each maps to one contract code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VaultError {
    #[error("the vault is locked (POSTERN_VAULT_KEY is unset or does not open it)")]
    Locked,
    #[error("no secret named {0}")]
    Missing(String),
    #[error("a secret could not be decrypted")]
    DecryptFailed,
    #[error("vault file: {0}")]
    File(String),
}

/// What `POSTERN_VAULT_KEY` does to the vault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// No key: the vault is locked.
    NoKey,
    /// A key and no vault file yet (the first `postern secret set` creates it).
    Empty,
    /// The key opens the vault.
    Opens,
    /// A key that does not open the vault (it was sealed under another).
    WrongKey,
}

const CHECK: &[u8] = b"postern-vault-check";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Sealed {
    nonce: String,
    ciphertext: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    version: u64,
    #[serde(flatten)]
    sealed: Sealed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct VaultFile {
    format: u32,
    kdf: String,
    salt: String,
    check: Sealed,
    secrets: BTreeMap<String, Entry>,
    /// The last version of each removed name: set again, it goes on from there, so a held
    /// request bound to the old value still sees a rotation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    removed: BTreeMap<String, u64>,
}

/// What identifies one version of the file: a rewrite renames a new inode into place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn file_stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&m);
    #[cfg(not(unix))]
    let inode = 0;
    Some(Stamp {
        modified: m.modified().ok(),
        len: m.len(),
        inode,
    })
}

struct Loaded {
    modified: Option<Stamp>,
    file: VaultFile,
    cipher: Option<XChaCha20Poly1305>,
}

/// The vault as the daemon sees it: reloaded when the file changes on disk.
pub struct Vault {
    path: PathBuf,
    passphrase: Option<String>,
    loaded: Mutex<Option<Loaded>>,
    /// The other secret sources' state: the digest key, commands' last runs.
    sources: source::Sources,
    /// The fleet's sealing key, derived once (`seal_for_fleet`).
    fleet: OnceLock<Option<XChaCha20Poly1305>>,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vault({})", self.path.display())
    }
}

fn derive(passphrase: &str, salt: &[u8]) -> Result<XChaCha20Poly1305, VaultError> {
    let params =
        argon2::Params::new(65536, 3, 1, Some(32)).map_err(|e| VaultError::File(e.to_string()))?;
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut key = [0u8; 32];
    argon
        .hash_password_into(passphrase.as_bytes(), salt, &mut key)
        .map_err(|e| VaultError::File(e.to_string()))?;
    XChaCha20Poly1305::new_from_slice(&key).map_err(|_| VaultError::Locked)
}

fn seal(cipher: &XChaCha20Poly1305, aad: &[u8], plain: &[u8]) -> Result<Sealed, VaultError> {
    let nonce = XNonce::try_generate().map_err(|e| VaultError::File(e.to_string()))?;
    let ciphertext = cipher
        .encrypt(&nonce, Payload { msg: plain, aad })
        .map_err(|_| VaultError::DecryptFailed)?;
    Ok(Sealed {
        nonce: b64(&nonce),
        ciphertext: b64(&ciphertext),
    })
}

fn open(cipher: &XChaCha20Poly1305, aad: &[u8], sealed: &Sealed) -> Result<Vec<u8>, VaultError> {
    let nonce = unb64(&sealed.nonce).ok_or(VaultError::DecryptFailed)?;
    let nonce = XNonce::try_from(nonce.as_slice()).map_err(|_| VaultError::DecryptFailed)?;
    let ct = unb64(&sealed.ciphertext).ok_or(VaultError::DecryptFailed)?;
    cipher
        .decrypt(&nonce, Payload { msg: &ct, aad })
        .map_err(|_| VaultError::DecryptFailed)
}

/// The salt of the fleet's sealing key (the same on every node, unlike a vault file's).
const FLEET_SALT: &[u8] = b"postern fleet seal, v1";

fn aad(name: &str, version: u64) -> Vec<u8> {
    format!("{name}\0{version}").into_bytes()
}

impl Vault {
    pub fn new(home: &Path, passphrase: Option<String>) -> Self {
        Self {
            path: home.join("vault.json"),
            passphrase: passphrase.filter(|p| !p.is_empty()),
            loaded: Mutex::new(None),
            sources: source::Sources::new(home),
            fleet: OnceLock::new(),
        }
    }

    /// The key a fleet's nodes seal what they share with (SPEC §7: a minted token, a
    /// rotated refresh token): derived from the vault passphrase every node of a fleet is
    /// given, under a salt of the fleet's own. None while the vault is locked.
    fn fleet_cipher(&self) -> Option<&XChaCha20Poly1305> {
        self.fleet
            .get_or_init(|| {
                let pass = self.passphrase.as_deref()?;
                derive(pass, FLEET_SALT).ok()
            })
            .as_ref()
    }

    /// `value` sealed for the other nodes of the fleet, bound to `context`.
    pub fn seal_for_fleet(&self, context: &str, value: &str) -> Result<String, VaultError> {
        let cipher = self.fleet_cipher().ok_or(VaultError::Locked)?;
        let sealed = seal(cipher, context.as_bytes(), value.as_bytes())?;
        serde_json::to_string(&sealed).map_err(|e| VaultError::File(e.to_string()))
    }

    /// A value another node sealed for `context`.
    pub fn open_from_fleet(&self, context: &str, sealed: &str) -> Result<String, VaultError> {
        let cipher = self.fleet_cipher().ok_or(VaultError::Locked)?;
        let sealed: Sealed = serde_json::from_str(sealed).map_err(|_| VaultError::DecryptFailed)?;
        let plain = open(cipher, context.as_bytes(), &sealed)?;
        String::from_utf8(plain).map_err(|_| VaultError::DecryptFailed)
    }

    fn read_file(&self) -> Result<Option<VaultFile>, VaultError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| VaultError::File(format!("{}: {e}", self.path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(VaultError::File(format!("{}: {e}", self.path.display()))),
        }
    }

    fn unlock(&self, file: &VaultFile) -> Result<XChaCha20Poly1305, VaultError> {
        let pass = self.passphrase.as_deref().ok_or(VaultError::Locked)?;
        let salt = unb64(&file.salt).ok_or(VaultError::Locked)?;
        let cipher = derive(pass, &salt)?;
        open(&cipher, b"check", &file.check).map_err(|_| VaultError::Locked)?;
        Ok(cipher)
    }

    /// The loaded file, reloaded if it changed since the last look (`None`: no vault file).
    fn current(&self) -> Result<MutexGuard<'_, Option<Loaded>>, VaultError> {
        let modified = file_stamp(&self.path);
        let mut guard = self.loaded.lock().map_err(|_| VaultError::Locked)?;
        let stale = guard.as_ref().is_none_or(|l| l.modified != modified);
        if stale {
            let Some(file) = self.read_file()? else {
                *guard = None;
                return Ok(guard);
            };
            // Reuse the derived key when the salt is unchanged (argon2 is deliberately slow).
            let same_salt = guard
                .as_ref()
                .is_some_and(|l| l.file.salt == file.salt && l.cipher.is_some());
            let cipher = if same_salt {
                guard.as_mut().and_then(|l| l.cipher.take())
            } else {
                self.unlock(&file).ok()
            };
            *guard = Some(Loaded {
                modified,
                file,
                cipher,
            });
        }
        Ok(guard)
    }

    /// Looks a secret up, reloading the file if it changed since the last look.
    pub fn get(&self, name: &str) -> Result<Secret, VaultError> {
        let guard = self.current()?;
        let Some(loaded) = guard.as_ref() else {
            return Err(if self.passphrase.is_none() {
                VaultError::Locked
            } else {
                VaultError::Missing(name.into())
            });
        };
        let cipher = loaded.cipher.as_ref().ok_or(VaultError::Locked)?;
        let entry = loaded
            .file
            .secrets
            .get(name)
            .ok_or_else(|| VaultError::Missing(name.into()))?;
        let plain = open(cipher, &aad(name, entry.version), &entry.sealed)?;
        let value = String::from_utf8(plain).map_err(|_| VaultError::DecryptFailed)?;
        Ok(Secret {
            value,
            version: SecretVersion::Vault(entry.version),
        })
    }

    /// Whether `POSTERN_VAULT_KEY` opens the vault; the daemon checks it at start so that a
    /// wrong key is an error there, not a locked vault found at request time.
    pub fn key_state(&self) -> Result<KeyState, VaultError> {
        if self.passphrase.is_none() {
            return Ok(KeyState::NoKey);
        }
        Ok(match self.current()?.as_ref() {
            None => KeyState::Empty,
            Some(l) if l.cipher.is_some() => KeyState::Opens,
            Some(_) => KeyState::WrongKey,
        })
    }

    /// Which of `names` have no entry (names are plaintext: no key needed).
    pub fn absent(&self, names: &[String]) -> Result<Vec<String>, VaultError> {
        let held = self.list()?;
        Ok(names
            .iter()
            .filter(|n| !held.iter().any(|(h, _)| h == *n))
            .cloned()
            .collect())
    }

    /// The vault file's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Names and versions: no key needed, no value shown.
    pub fn list(&self) -> Result<Vec<(String, u64)>, VaultError> {
        Ok(self
            .read_file()?
            .map(|f| f.secrets.into_iter().map(|(k, e)| (k, e.version)).collect())
            .unwrap_or_default())
    }

    /// Stores a value under `name`, raising its version. Returns the new version.
    pub fn set(&self, name: &str, value: &str) -> Result<u64, VaultError> {
        let pass = self.passphrase.as_deref().ok_or(VaultError::Locked)?;
        let _lock = self.lock()?;
        let (mut file, cipher) = match self.read_file()? {
            Some(f) => {
                let c = self.unlock(&f)?;
                (f, c)
            }
            None => {
                let salt = chacha20poly1305::aead::array::Array::<u8, chacha20poly1305::consts::U16>::try_generate()
                    .map_err(|e| VaultError::File(e.to_string()))?;
                let cipher = derive(pass, &salt)?;
                let check = seal(&cipher, b"check", CHECK)?;
                let file = VaultFile {
                    format: 1,
                    kdf: "argon2id-m65536-t3-p1".into(),
                    salt: b64(&salt),
                    check,
                    secrets: BTreeMap::new(),
                    removed: BTreeMap::new(),
                };
                (file, cipher)
            }
        };
        let last = file.secrets.get(name).map(|e| e.version);
        let version = last.or(file.removed.remove(name)).map_or(1, |v| v + 1);
        let sealed = seal(&cipher, &aad(name, version), value.as_bytes())?;
        file.secrets
            .insert(name.to_owned(), Entry { version, sealed });
        self.write(&file)?;
        Ok(version)
    }

    /// The daemon's write (a rotated refresh token, SPEC §3.8): `value` as the version
    /// after `expected`, only if `expected` is still the newest (an operator's `postern
    /// secret set` meanwhile wins). Sealed with the key the daemon already derived, so no
    /// argon2 run; durable (file and directory synced) before it returns.
    pub fn replace(&self, name: &str, expected: u64, value: &str) -> Result<u64, VaultError> {
        let _lock = self.lock()?;
        let guard = self.current()?;
        let loaded = guard
            .as_ref()
            .ok_or_else(|| VaultError::Missing(name.into()))?;
        let cipher = loaded.cipher.as_ref().ok_or(VaultError::Locked)?;
        let now = loaded.file.secrets.get(name).map(|e| e.version);
        if now != Some(expected) {
            return Err(VaultError::File(format!(
                "{name} is no longer version {expected} (now {now:?})"
            )));
        }
        let version = expected + 1;
        let sealed = seal(cipher, &aad(name, version), value.as_bytes())?;
        let mut file = loaded.file.clone();
        file.secrets
            .insert(name.to_owned(), Entry { version, sealed });
        // The guard is held across the write so a `get` meanwhile does not read half of it;
        // the next `get` reloads the file (its stamp changed) with the same key.
        self.write(&file)?;
        Ok(version)
    }

    /// One writer at a time, across processes (`postern secret set` and the daemon): each
    /// write reads the file, changes one entry and renames a new file into place, so two
    /// at once would lose one. Released when the returned file is dropped.
    fn lock(&self) -> Result<std::fs::File, VaultError> {
        let path = self.path.with_extension("lock");
        let err = |e: std::io::Error| VaultError::File(format!("{}: {e}", path.display()));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(err)?;
        file.lock().map_err(err)?;
        Ok(file)
    }

    /// Removes `name`; false if it was not there.
    pub fn remove(&self, name: &str) -> Result<bool, VaultError> {
        let _lock = self.lock()?;
        let Some(mut file) = self.read_file()? else {
            return Ok(false);
        };
        self.unlock(&file)?;
        let Some(gone) = file.secrets.remove(name) else {
            return Ok(false);
        };
        file.removed.insert(name.to_owned(), gone.version);
        self.write(&file)?;
        Ok(true)
    }

    fn write(&self, file: &VaultFile) -> Result<(), VaultError> {
        use std::io::Write;
        let err = |e: std::io::Error| VaultError::File(format!("{}: {e}", self.path.display()));
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(file).map_err(|e| VaultError::File(e.to_string()))?;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut f = options.open(&tmp).map_err(err)?;
        f.write_all(&bytes).map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        // The rename is durable only once the directory is (a crash could otherwise bring
        // back the old file: a revoked refresh token).
        #[cfg(unix)]
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_round_trip_and_versions_rise() {
        let dir = tempfile::tempdir().unwrap();
        let v = Vault::new(dir.path(), Some("pass".into()));
        assert_eq!(v.set("gh", "canary-1").unwrap(), 1);
        assert_eq!(v.set("gh", "canary-2").unwrap(), 2);
        let s = v.get("gh").unwrap();
        assert_eq!(
            (s.value.as_str(), s.version),
            ("canary-2", SecretVersion::Vault(2))
        );
        assert!(!format!("{s:?}").contains("canary"));
        assert_eq!(v.list().unwrap(), vec![("gh".to_owned(), 2)]);
        let raw = std::fs::read_to_string(dir.path().join("vault.json")).unwrap();
        assert!(!raw.contains("canary"));
        assert_eq!(
            v.get("nope").err(),
            Some(VaultError::Missing("nope".into()))
        );
        assert!(v.remove("gh").unwrap());
        assert_eq!(v.get("gh").err(), Some(VaultError::Missing("gh".into())));
        // Set again after a removal: the version goes on, so the value counts as rotated.
        assert_eq!(v.set("gh", "canary-3").ok(), Some(3));
        assert_eq!(v.list().ok(), Some(vec![("gh".to_owned(), 3)]));
    }

    #[test]
    fn the_daemon_replaces_only_the_version_it_read() {
        let dir = tempfile::tempdir().unwrap();
        let v = Vault::new(dir.path(), Some("pass".into()));
        assert_eq!(v.set("rt", "family-1").unwrap(), 1);
        assert_eq!(v.get("rt").unwrap().version.vault_number(), 1);
        assert_eq!(v.replace("rt", 1, "family-2").ok(), Some(2));
        // Another process (a fresh handle: `postern secret set`) sees it, sealed right.
        let other = Vault::new(dir.path(), Some("pass".into()));
        let s = other.get("rt").unwrap();
        assert_eq!(
            (s.value.as_str(), s.version.vault_number()),
            ("family-2", 2)
        );
        // A version set meanwhile wins: the stale replace is refused.
        assert_eq!(other.set("rt", "operator").ok(), Some(3));
        assert!(matches!(
            v.replace("rt", 2, "family-3"),
            Err(VaultError::File(_))
        ));
        assert_eq!(v.get("rt").unwrap().value, "operator");
        assert_eq!(
            Vault::new(dir.path(), None).replace("rt", 3, "x").err(),
            Some(VaultError::Locked)
        );
    }

    #[test]
    fn a_wrong_or_missing_key_is_locked() {
        let dir = tempfile::tempdir().unwrap();
        Vault::new(dir.path(), Some("right".into()))
            .set("a", "x")
            .unwrap();
        assert_eq!(
            Vault::new(dir.path(), Some("wrong".into())).get("a").err(),
            Some(VaultError::Locked)
        );
        assert_eq!(
            Vault::new(dir.path(), None).get("a").err(),
            Some(VaultError::Locked)
        );
        assert_eq!(
            Vault::new(dir.path(), None).set("a", "y").err(),
            Some(VaultError::Locked)
        );
    }

    #[test]
    fn the_key_state_tells_a_wrong_key_from_none() {
        let dir = tempfile::tempdir().unwrap();
        let state = |key: Option<&str>| Vault::new(dir.path(), key.map(Into::into)).key_state();
        assert_eq!(state(Some("right")), Ok(KeyState::Empty));
        Vault::new(dir.path(), Some("right".into()))
            .set("a", "x")
            .unwrap();
        assert_eq!(state(Some("right")), Ok(KeyState::Opens));
        assert_eq!(state(Some("wrong")), Ok(KeyState::WrongKey));
        assert_eq!(state(None), Ok(KeyState::NoKey));
        let v = Vault::new(dir.path(), None);
        assert_eq!(
            v.absent(&["a".into(), "b".into()]),
            Ok(vec!["b".to_owned()])
        );
    }

    #[test]
    fn a_tampered_ciphertext_fails_to_decrypt() {
        let dir = tempfile::tempdir().unwrap();
        let v = Vault::new(dir.path(), Some("k".into()));
        v.set("a", "value").unwrap();
        let path = dir.path().join("vault.json");
        let mut file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        // Claim a different version: the associated data no longer matches.
        file["secrets"]["a"]["version"] = 7.into();
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        let fresh = Vault::new(dir.path(), Some("k".into()));
        assert_eq!(fresh.get("a").err(), Some(VaultError::DecryptFailed));
    }
}
