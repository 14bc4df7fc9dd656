//! Name resolution for every transport: one hickory resolver honouring `[dns] servers`
//! (or the system's configuration), used by HTTP routes and SSH targets that have no
//! `resolve`. Callers record the lookup as the `dns` connection stage.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::DnsConfig;

/// Name resolution through hickory: `[dns] servers`, or the system's configuration.
pub struct Dns {
    resolver: Result<hickory_resolver::TokioResolver, String>,
}

impl Dns {
    /// Builds the resolver; must run inside the tokio runtime.
    pub fn new(config: Option<&DnsConfig>) -> Self {
        use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
        use hickory_resolver::net::runtime::TokioRuntimeProvider;
        let built = match config {
            Some(c) => {
                let servers = c
                    .servers
                    .iter()
                    .map(|addr| {
                        let mut udp = ConnectionConfig::udp();
                        udp.port = addr.port();
                        let mut tcp = ConnectionConfig::tcp();
                        tcp.port = addr.port();
                        let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                        ns.connections = vec![udp, tcp];
                        ns
                    })
                    .collect();
                let config = ResolverConfig::from_name_servers(servers);
                hickory_resolver::Resolver::builder_with_config(
                    config,
                    TokioRuntimeProvider::default(),
                )
                .build()
                .map_err(|e| e.to_string())
            }
            None => hickory_resolver::TokioResolver::builder_tokio()
                .and_then(|b| b.build())
                .map_err(|e| format!("system resolver configuration: {e}")),
        };
        Self { resolver: built }
    }

    /// The addresses of `host`, each with `port`; the text says why not (operators only).
    pub async fn lookup(
        &self,
        host: &str,
        port: u16,
        limit: Duration,
    ) -> Result<Vec<SocketAddr>, String> {
        let resolver = self.resolver.as_ref().map_err(Clone::clone)?;
        // A trailing dot keeps search domains out of it: configured hosts are absolute.
        let name = if host.ends_with('.') {
            host.to_owned()
        } else {
            format!("{host}.")
        };
        match tokio::time::timeout(limit, resolver.lookup_ip(name.as_str())).await {
            Ok(Ok(found)) => {
                let list: Vec<SocketAddr> =
                    found.iter().map(|ip| SocketAddr::new(ip, port)).collect();
                if list.is_empty() {
                    Err("no addresses".into())
                } else {
                    Ok(list)
                }
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("name resolution took longer than {limit:?}")),
        }
    }
}
