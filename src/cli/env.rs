//! `postern env`: the exports an agent needs (SPEC §5.1).

use std::net::SocketAddr;
use std::process::ExitCode;

use super::{CliError, Home};

/// `export` lines for curl, Python requests, Node and git.
pub fn lines(home: &Home, proxy: SocketAddr) -> Vec<String> {
    let certs = std::fs::canonicalize(home.certs_dir()).unwrap_or_else(|_| home.certs_dir());
    let bundle = certs.join("bundle.pem");
    let ca = certs.join("ca.pem");
    let url = format!("http://{proxy}");
    let mut out = Vec::new();
    for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        out.push(format!("export {name}={url}"));
    }
    for name in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
    ] {
        out.push(format!("export {name}={}", bundle.display()));
    }
    out.push(format!("export NODE_EXTRA_CA_CERTS={}", ca.display()));
    out
}

pub fn run(
    config: Option<&std::path::Path>,
    home: &Home,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ExitCode, CliError> {
    let config = crate::config::load_addresses(config, env)?;
    for line in lines(home, config.proxy.listen) {
        outln!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
