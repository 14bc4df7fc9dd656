//! The unix-socket hop between the jail and the host: one byte names the service, then
//! bytes flow both ways unchanged.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The first byte on a relay connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// postern's HTTP proxy (`[proxy] listen`).
    Proxy,
    /// postern's SSH front (`[ssh] listen`).
    Ssh,
}

impl Service {
    pub fn byte(self) -> u8 {
        match self {
            Self::Proxy => b'P',
            Self::Ssh => b'S',
        }
    }

    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            b'P' => Some(Self::Proxy),
            b'S' => Some(Self::Ssh),
            _ => None,
        }
    }
}

/// A listen address as a client dials it: a wildcard listener is reached on loopback.
pub fn dialable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_bytes_round_trip_and_wildcards_dial_loopback() {
        for s in [Service::Proxy, Service::Ssh] {
            assert_eq!(Service::from_byte(s.byte()), Some(s));
        }
        assert_eq!(Service::from_byte(b'A'), None);
        let any: SocketAddr = "0.0.0.0:3128".parse().unwrap();
        assert_eq!(dialable(any), "127.0.0.1:3128".parse().unwrap());
        let any6: SocketAddr = "[::]:2222".parse().unwrap();
        assert_eq!(dialable(any6), "[::1]:2222".parse().unwrap());
    }
}
