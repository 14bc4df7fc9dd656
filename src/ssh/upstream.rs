//! Connection setup toward an SSH target: `dns` → `tcp_connect` → `ssh_transport` →
//! `host_key` → `user_auth`, and `channel_open` per exec. Each stage is a `ConnectAttempt`
//! observation; nothing here decides an outcome. All of it is before the dispatch boundary.
//!
//! The host key is checked strictly against the target's `known_hosts` (unknown or changed:
//! `SSH_HOST_KEY_MISMATCH`, and the key exchange stops before any credential is sent).
//! The injected key or password never leaves this module.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, Handle};
use russh::keys::ssh_key::{HashAlg, PrivateKey, PublicKey};
use russh::keys::{PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::{Channel, client::AuthResult};
use tokio::net::TcpStream;

use crate::config::{Config, Inject, SshTarget};
use crate::contract::{Code, CredentialEvidence, Stage};
use crate::dns::Dns;
use crate::guard::{GuardCache, ReflectionGuard};
use crate::journal::{ConnectAttempt, Failure};
use crate::vault::Vault;

const MAX_TCP_ATTEMPTS: usize = 3;

/// Bytes read from the upstream socket at once.
const READ_BUFFER: usize = 128 * 1024;

/// The largest data packet the upstream may send (russh's ceiling; its default is 32 KiB):
/// fewer packets per byte of output to decrypt, hand over and relay.
const MAX_PACKET: u32 = 65535;

enum Secret {
    /// The decoded key, and its PEM for the reflection guard.
    Key(Arc<PrivateKey>, String),
    Password(String),
}

/// The injected login, fetched from the vault. Debug never shows it.
pub struct Login {
    secret: Secret,
    /// Which credential: id, non-secret version, mode.
    pub evidence: CredentialEvidence,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Login({:?}, [redacted])", self.evidence)
    }
}

impl Login {
    /// The reflection guard for what the remote prints: the password in every encoded
    /// form, or the key's PEM body lines. `None` if it cannot be built.
    pub fn guard(&self, cache: &GuardCache) -> Option<Arc<ReflectionGuard>> {
        let evidence = &self.evidence;
        cache.get(&evidence.id, evidence.version, || match &self.secret {
            Secret::Key(_, pem) => ReflectionGuard::for_pem(pem),
            Secret::Password(p) => ReflectionGuard::new(p.as_bytes(), p.as_bytes()),
        })
    }
}

/// The target's credential from its secret source: an OpenSSH private key (`ssh_key`) or a
/// password (`ssh_password`). The failure says why not (credential_injection phase).
pub fn login(config: &Config, target: &SshTarget, vault: &Vault) -> Result<Login, Failure> {
    let credential = config
        .credentials
        .iter()
        .find(|c| c.id == target.credential)
        .ok_or(Code::CredentialMissing)?;
    let secret = vault
        .fetch(&credential.secret)
        .map_err(|e| e.failure(&credential.id))?;
    let evidence = CredentialEvidence {
        id: credential.id.clone(),
        version: secret.version,
        mode: credential.inject.mode().to_owned(),
    };
    let secret = match credential.inject {
        Inject::SshKey => russh::keys::decode_secret_key(&secret.value, None)
            .map(|k| Secret::Key(Arc::new(k), secret.value))
            // A value that is no private key cannot be injected as one.
            .map_err(|_| Code::InjectionModeUnsupported)?,
        Inject::SshPassword => Secret::Password(secret.value),
        _ => return Err(Code::InjectionModeUnsupported.into()),
    };
    Ok(Login { secret, evidence })
}

/// An authenticated upstream session, ready for `channel_open`.
pub struct Upstream {
    handle: Handle<Verifier>,
    /// The address connected to.
    pub address: SocketAddr,
    /// The verified host key, `SHA256:…`.
    pub host_key: String,
    /// Every stage so far, in order.
    pub attempts: Vec<ConnectAttempt>,
    connect_timeout: Duration,
}

/// Connection setup failed before anything of the invocation was sent.
#[derive(Debug)]
pub struct SetupFailure {
    pub code: Code,
    pub attempts: Vec<ConnectAttempt>,
}

/// The stages of one setup; a further address tried is a new attempt `n`.
#[derive(Default)]
struct Stages {
    list: Vec<ConnectAttempt>,
}

impl Stages {
    fn record(
        &mut self,
        stage: Stage,
        code: Option<Code>,
        address: Option<SocketAddr>,
        diagnostic: Option<String>,
    ) {
        let last = self.list.last().map_or(1, |a| a.n);
        let retried = stage == Stage::TcpConnect && self.list.iter().any(|a| a.stage == stage);
        self.list.push(ConnectAttempt {
            n: if retried { last + 1 } else { last },
            stage,
            ok: code.is_none(),
            code,
            address: address.map(|a| a.to_string()),
            diagnostic,
            hop: None,
        });
    }

    fn ok(&mut self, stage: Stage, address: Option<SocketAddr>) {
        self.record(stage, None, address, None);
    }

    fn fail(
        mut self,
        stage: Stage,
        code: Code,
        address: Option<SocketAddr>,
        diagnostic: String,
    ) -> SetupFailure {
        self.record(stage, Some(code), address, Some(diagnostic));
        SetupFailure {
            code,
            attempts: self.list,
        }
    }
}

/// `login` from the vault, then `connect_with`.
pub async fn connect(
    config: &Config,
    target: &SshTarget,
    vault: &Vault,
    dns: &Dns,
) -> Result<Upstream, SetupFailure> {
    let login = login(config, target, vault).map_err(|f| SetupFailure {
        code: f.code,
        attempts: Vec::new(),
    })?;
    connect_with(target, &login, dns).await
}

/// Numbers a further connection's stages after the `n` attempts already recorded for the
/// invocation (each connection is one attempt, SPEC §2 counters).
pub fn number_after(attempts: &mut [ConnectAttempt], n: u32) {
    for a in attempts {
        a.n += n;
    }
}

/// A stage that failed: which, its code, the address, the library's words (operators only).
type StageError = (Stage, Code, Option<SocketAddr>, String);

/// Every stage up to an authenticated session, each bounded by `connect_timeout`.
pub async fn connect_with(
    target: &SshTarget,
    login: &Login,
    dns: &Dns,
) -> Result<Upstream, SetupFailure> {
    let mut stages = Stages::default();
    match setup(target, login, dns, &mut stages).await {
        Ok((handle, address, host_key)) => Ok(Upstream {
            handle,
            address,
            host_key,
            attempts: stages.list,
            connect_timeout: target.connect_timeout,
        }),
        Err((stage, code, address, diagnostic)) => {
            Err(stages.fail(stage, code, address, diagnostic))
        }
    }
}

async fn setup(
    target: &SshTarget,
    login: &Login,
    dns: &Dns,
    stages: &mut Stages,
) -> Result<(Handle<Verifier>, SocketAddr, String), StageError> {
    let addresses = resolve(target, dns, stages).await?;
    let (tcp, address) = tcp_connect(target, &addresses, stages).await?;
    let (mut handle, host_key) = transport(target, tcp, address, stages).await?;
    authenticate(&mut handle, target, login, address, stages).await?;
    Ok((handle, address, host_key))
}

async fn resolve(
    target: &SshTarget,
    dns: &Dns,
    stages: &mut Stages,
) -> Result<Vec<SocketAddr>, StageError> {
    if let Some(pinned) = target.resolve {
        return Ok(vec![pinned]);
    }
    if let Ok(ip) = target.host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, target.port)]);
    }
    match dns
        .lookup(&target.host, target.port, target.connect_timeout)
        .await
    {
        Ok(list) => {
            stages.ok(Stage::Dns, list.first().copied());
            Ok(list)
        }
        Err(diag) => Err((Stage::Dns, Code::DnsError, None, diag)),
    }
}

async fn tcp_connect(
    target: &SshTarget,
    addresses: &[SocketAddr],
    stages: &mut Stages,
) -> Result<(TcpStream, SocketAddr), StageError> {
    let mut last: Option<StageError> = None;
    for &addr in addresses.iter().take(MAX_TCP_ATTEMPTS) {
        if let Some((stage, code, a, diag)) = last.take() {
            stages.record(stage, Some(code), a, Some(diag));
        }
        match tokio::time::timeout(target.connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let peer = stream.peer_addr().unwrap_or(addr);
                let _ = stream.set_nodelay(true);
                stages.ok(Stage::TcpConnect, Some(peer));
                return Ok((stream, peer));
            }
            Ok(Err(e)) => {
                // postern's own limit (EMFILE…) is named as such, not as the remote's refusal.
                let diag =
                    crate::lifecycle::resources::postern_resource(&e).unwrap_or(e.to_string());
                last = Some((Stage::TcpConnect, Code::ConnectionRefused, Some(addr), diag))
            }
            Err(_) => {
                let diag = format!("no connection within {:?}", target.connect_timeout);
                last = Some((Stage::TcpConnect, Code::ConnectTimeout, Some(addr), diag));
            }
        }
    }
    Err(last.unwrap_or((Stage::Dns, Code::DnsError, None, "no addresses".into())))
}

/// What the host key check saw: the verified fingerprint, or why the key was refused.
type Verdict = Arc<Mutex<Option<Result<String, String>>>>;

/// Checks the upstream's host key against the target's `known_hosts`, nothing else.
pub struct Verifier {
    host: String,
    port: u16,
    known_hosts: std::path::PathBuf,
    verdict: Verdict,
}

impl Verifier {
    fn check(&self, key: &PublicKey) -> Result<String, String> {
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        let known = russh::keys::known_hosts::known_host_keys_path(
            &self.host,
            self.port,
            &self.known_hosts,
        )
        .map_err(|e| format!("cannot read {}: {e}", self.known_hosts.display()))?;
        if known.iter().any(|(_, k)| k == key) {
            return Ok(fingerprint);
        }
        let name = crate::ssh::hostkey::known_hosts_name(&self.host, self.port);
        Err(if known.is_empty() {
            format!(
                "{} lists no key for {name}; the server offered {fingerprint}",
                self.known_hosts.display()
            )
        } else {
            format!(
                "the server's key {fingerprint} is not the one {} lists for {name}",
                self.known_hosts.display()
            )
        })
    }
}

impl client::Handler for Verifier {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        offered: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let verdict = match offered {
            PublicKeyOrCertificate::PublicKey { key, .. } => self.check(key),
            PublicKeyOrCertificate::Certificate(_) => {
                Err("host certificates are not supported; list the host key".into())
            }
        };
        let accepted = verdict.is_ok();
        if let Ok(mut v) = self.verdict.lock() {
            *v = Some(verdict);
        }
        Ok(accepted)
    }
}

/// Version and key exchange, with the host key check inside it.
async fn transport(
    target: &SshTarget,
    tcp: TcpStream,
    address: SocketAddr,
    stages: &mut Stages,
) -> Result<(Handle<Verifier>, String), StageError> {
    let verdict: Verdict = Arc::default();
    let verifier = Verifier {
        host: target.host.clone(),
        port: target.port,
        known_hosts: target.known_hosts.clone(),
        verdict: verdict.clone(),
    };
    let config = Arc::new(client::Config {
        nodelay: true,
        preferred: preferred_algorithms(),
        maximum_packet_size: MAX_PACKET,
        ..Default::default()
    });
    let limit = target.connect_timeout;
    // russh reads each packet with two exact reads (length, then the rest): buffered, a
    // bulk transfer takes one system call per many packets instead of two per packet.
    let tcp = tokio::io::BufReader::with_capacity(READ_BUFFER, tcp);
    let result = tokio::time::timeout(limit, client::connect_stream(config, tcp, verifier)).await;
    let seen = verdict.lock().ok().and_then(|v| v.clone());
    let at = Some(address);
    match (result, seen) {
        (_, Some(Err(diag))) => {
            stages.ok(Stage::SshTransport, at);
            Err((Stage::HostKey, Code::SshHostKeyMismatch, at, diag))
        }
        (Ok(Ok(handle)), Some(Ok(fingerprint))) => {
            stages.ok(Stage::SshTransport, at);
            stages.ok(Stage::HostKey, at);
            Ok((handle, fingerprint))
        }
        (Err(_), _) => Err((
            Stage::SshTransport,
            Code::ConnectTimeout,
            at,
            format!("no SSH key exchange within {limit:?}"),
        )),
        (Ok(Err(e)), _) => Err((
            Stage::SshTransport,
            Code::ConnectionRefused,
            at,
            e.to_string(),
        )),
        (Ok(Ok(_)), None) => Err((
            Stage::HostKey,
            Code::SshHostKeyMismatch,
            at,
            "the host key was never checked".into(),
        )),
    }
}

/// russh's defaults, with AES-GCM first where the CPU has AES instructions: postern
/// decrypts every byte of output, and there AES-GCM costs a fraction of ChaCha20-Poly1305
/// (for sshd too). Without them ChaCha20-Poly1305 stays first.
fn preferred_algorithms() -> russh::Preferred {
    use russh::cipher::{
        AES_128_CTR, AES_128_GCM, AES_192_CTR, AES_256_CTR, AES_256_GCM, CHACHA20_POLY1305,
    };
    const AES_FIRST: &[russh::cipher::Name] = &[
        AES_256_GCM,
        AES_128_GCM,
        CHACHA20_POLY1305,
        AES_256_CTR,
        AES_192_CTR,
        AES_128_CTR,
    ];
    let mut preferred = russh::Preferred::default();
    if hardware_aes() {
        preferred.cipher = std::borrow::Cow::Borrowed(AES_FIRST);
    }
    preferred
}

fn hardware_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

async fn authenticate(
    handle: &mut Handle<Verifier>,
    target: &SshTarget,
    login: &Login,
    address: SocketAddr,
    stages: &mut Stages,
) -> Result<(), StageError> {
    let at = Some(address);
    let limit = target.connect_timeout;
    let attempt = async {
        match &login.secret {
            Secret::Key(key, _) => {
                let hash = handle.best_supported_rsa_hash().await?.flatten();
                let key = PrivateKeyWithHashAlg::new(key.clone(), hash);
                handle
                    .authenticate_publickey(target.user.clone(), key)
                    .await
            }
            Secret::Password(password) => {
                handle
                    .authenticate_password(target.user.clone(), password.clone())
                    .await
            }
        }
    };
    match tokio::time::timeout(limit, attempt).await {
        Ok(Ok(AuthResult::Success)) => {
            stages.ok(Stage::UserAuth, at);
            Ok(())
        }
        Ok(Ok(AuthResult::Failure { .. })) => {
            let diag = format!(
                "the server refused {} for user {}",
                login.evidence.mode, target.user
            );
            Err((Stage::UserAuth, Code::SshAuthFailed, at, diag))
        }
        Ok(Err(e)) => Err((Stage::UserAuth, Code::ConnectionRefused, at, e.to_string())),
        Err(_) => Err((
            Stage::UserAuth,
            Code::ConnectTimeout,
            at,
            format!("no answer to user auth within {limit:?}"),
        )),
    }
}

impl Upstream {
    /// Opens a session channel (`channel_open`), recorded with the other stages.
    pub async fn open_channel(&mut self) -> Result<Channel<client::Msg>, Code> {
        let limit = self.connect_timeout;
        let at = Some(self.address);
        let mut stages = Stages {
            list: std::mem::take(&mut self.attempts),
        };
        let result = match tokio::time::timeout(limit, self.handle.channel_open_session()).await {
            Ok(Ok(channel)) => {
                stages.ok(Stage::ChannelOpen, at);
                Ok(channel)
            }
            Ok(Err(e)) => {
                stages.record(
                    Stage::ChannelOpen,
                    Some(Code::SshChannelFailed),
                    at,
                    Some(e.to_string()),
                );
                Err(Code::SshChannelFailed)
            }
            Err(_) => {
                let diag = format!("no channel within {limit:?}");
                stages.record(
                    Stage::ChannelOpen,
                    Some(Code::ConnectTimeout),
                    at,
                    Some(diag),
                );
                Err(Code::ConnectTimeout)
            }
        };
        self.attempts = stages.list;
        result
    }

    /// The session can carry another channel.
    pub fn is_usable(&self) -> bool {
        !self.handle.is_closed()
    }

    /// Starts a new invocation's stages on a reused session (only `channel_open` follows).
    pub fn begin_reuse(&mut self) {
        self.attempts.clear();
    }

    /// Ends the session politely.
    pub async fn disconnect(&self) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
    }
}
