//! postern's local CA and the per-host leaf certificates it mints for TLS interception.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Why the CA could not be loaded or a leaf minted.
#[derive(Debug, thiserror::Error)]
pub enum MitmError {
    #[error("CA file {path}: {detail}")]
    File { path: PathBuf, detail: String },
    #[error("certificate generation failed: {0}")]
    Generate(String),
}

/// The CA: its issuer, its PEM, and a cache of minted leaves.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Authority")
    }
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> MitmError {
    MitmError::File {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

fn gen_err(e: impl std::fmt::Display) -> MitmError {
    MitmError::Generate(e.to_string())
}

/// Where the CA lives under `POSTERN_HOME/certs`.
pub struct CaPaths {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub bundle: PathBuf,
}

impl CaPaths {
    pub fn in_dir(certs: &Path) -> Self {
        Self {
            cert: certs.join("ca.pem"),
            key: certs.join("ca.key"),
            bundle: certs.join("bundle.pem"),
        }
    }
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "postern local CA");
    dn.push(DnType::OrganizationName, "postern");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(3650);
    params
}

impl Authority {
    /// Loads the CA from `certs/`, creating it (key mode 0600) on first start.
    pub fn load_or_create(paths: &CaPaths) -> Result<Self, MitmError> {
        if !paths.cert.exists() || !paths.key.exists() {
            let key = KeyPair::generate().map_err(gen_err)?;
            let cert = ca_params().self_signed(&key).map_err(gen_err)?;
            write_private(&paths.key, key.serialize_pem().as_bytes())?;
            std::fs::write(&paths.cert, cert.pem()).map_err(|e| file_err(&paths.cert, e))?;
        }
        public(&paths.cert)?;
        let key_pem = std::fs::read_to_string(&paths.key).map_err(|e| file_err(&paths.key, e))?;
        let cert_pem =
            std::fs::read_to_string(&paths.cert).map_err(|e| file_err(&paths.cert, e))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| file_err(&paths.key, e))?;
        let issuer =
            Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|e| file_err(&paths.cert, e))?;
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e: rustls::pki_types::pem::Error| file_err(&paths.cert, e))?;
        write_bundle(&paths.bundle, &cert_pem)?;
        public(&paths.bundle)?;
        Ok(Self {
            issuer,
            ca_der: der,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// A leaf for `host` (DNS name or IP), minted once and cached.
    pub fn leaf(&self, host: &str) -> Result<Arc<CertifiedKey>, MitmError> {
        let host = host.to_ascii_lowercase();
        if let Some(hit) = self.leaves.lock().ok().and_then(|m| m.get(&host).cloned()) {
            return Ok(hit);
        }
        let leaf = Arc::new(self.mint(&host)?);
        if let Ok(mut m) = self.leaves.lock() {
            if m.len() > 10_000 {
                m.clear();
            }
            m.insert(host, leaf.clone());
        }
        Ok(leaf)
    }

    fn mint(&self, host: &str) -> Result<CertifiedKey, MitmError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.subject_alt_names = vec![match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(host.try_into().map_err(gen_err)?),
        }];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(90);
        let key = KeyPair::generate().map_err(gen_err)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(gen_err)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = rustls::crypto::ring::sign::any_supported_type(&key_der).map_err(gen_err)?;
        Ok(CertifiedKey::new(
            vec![cert.der().clone(), self.ca_der.clone()],
            signer,
        ))
    }

    /// A TLS server config that presents a leaf for the `CONNECT` host only: a ClientHello
    /// naming another host fails the handshake (no leaf minted); no SNI (an IP) gets it too.
    pub fn server_config(
        self: &Arc<Self>,
        connect_host: &str,
    ) -> Result<Arc<rustls::ServerConfig>, MitmError> {
        let resolver = LeafResolver {
            authority: self.clone(),
            host: connect_host.to_owned(),
        };
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(gen_err)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
        // `http/1.0` (curl --http1.0) is served by the HTTP/1 side; without it rustls would
        // refuse the handshake with no_application_protocol.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec(), b"http/1.0".to_vec()];
        Ok(Arc::new(config))
    }
}

#[derive(Debug)]
struct LeafResolver {
    authority: Arc<Authority>,
    /// The `CONNECT` authority's host, the only name a leaf is minted for.
    host: String,
}

impl ResolvesServerCert for LeafResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(sni) = hello.server_name()
            && !sni.eq_ignore_ascii_case(&self.host)
        {
            tracing::debug!("TLS SNI does not name the CONNECT host; handshake refused");
            return None;
        }
        self.authority.leaf(&self.host).ok()
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), MitmError> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(path).map_err(|e| file_err(path, e))?;
    f.write_all(bytes).map_err(|e| file_err(path, e))?;
    f.sync_all().map_err(|e| file_err(path, e))
}

/// The CA certificate and the bundle are public (SPEC §5.3): an agent under another OS
/// user must be able to trust postern. Mode 0644 whatever the umask.
fn public(path: &Path) -> Result<(), MitmError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| file_err(path, e))?;
    }
    Ok(())
}

/// Where systems keep their CA bundle (Debian, RHEL, Alpine and the BSDs), first found first.
pub const SYSTEM_CA_STORES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// System roots plus postern's CA, for clients that take one bundle file.
fn write_bundle(path: &Path, ca_pem: &str) -> Result<(), MitmError> {
    let mut bundle = SYSTEM_CA_STORES
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(ca_pem);
    std::fs::write(path, bundle).map_err(|e| file_err(path, e))
}
