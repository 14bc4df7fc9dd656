//! Default deny: a request matches a route or is refused before any DNS or secret.

use super::path::normalize_path;
use crate::config::{Config, Route, Scheme};

/// The normalized destination of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub scheme: Scheme,
    /// Lower-case host; IPv6 without brackets.
    pub host: String,
    pub port: u16,
    /// Path and query, origin-form (`/x?y`).
    pub path_and_query: String,
}

/// Why a target is not a valid destination (`INVALID_TARGET`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetError {
    pub field: &'static str,
}

impl Target {
    /// Builds and normalizes a target; refuses odd hosts and paths origins read differently.
    pub fn new(
        scheme: Scheme,
        host: &str,
        port: Option<u16>,
        path_and_query: &str,
    ) -> Result<Self, TargetError> {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
        if !host_ok {
            return Err(TargetError {
                field: "target.host",
            });
        }
        let pq = if path_and_query.is_empty() {
            "/"
        } else {
            path_and_query
        };
        let (path, query) = match pq.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (pq, None),
        };
        let Ok(path) = normalize_path(path) else {
            return Err(TargetError {
                field: "target.path",
            });
        };
        let pq = match query {
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        let port = port.unwrap_or(match scheme {
            Scheme::Https => 443,
            Scheme::Http => 80,
        });
        if port == 0 {
            return Err(TargetError {
                field: "target.port",
            });
        }
        Ok(Self {
            scheme,
            host,
            port,
            path_and_query: pq,
        })
    }

    pub fn path(&self) -> &str {
        self.path_and_query.split('?').next().unwrap_or("/")
    }

    /// `host` or `host:port` when the port is not the scheme's default; IPv6 in brackets.
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let default = match self.scheme {
            Scheme::Https => 443,
            Scheme::Http => 80,
        };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    /// The absolute URL (the record's `target`).
    pub fn url(&self) -> String {
        let scheme = match self.scheme {
            Scheme::Https => "https",
            Scheme::Http => "http",
        };
        format!("{scheme}://{}{}", self.authority(), self.path_and_query)
    }
}

fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => {
            host.len() > suffix.len() + 1
                && host.ends_with(suffix)
                && host[..host.len() - suffix.len()].ends_with('.')
        }
        None => pattern == host,
    }
}

fn path_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" || path == prefix {
        return true;
    }
    path.starts_with(prefix) && (prefix.ends_with('/') || path[prefix.len()..].starts_with('/'))
}

fn agent_allowed(route: &Route, agent: &str) -> bool {
    route.agents.is_empty() || route.agents.iter().any(|a| a == agent)
}

/// The first route (in config order) that allows this request for this agent.
pub fn match_route<'a>(
    config: &'a Config,
    agent: &str,
    target: &Target,
    method: &str,
) -> Option<&'a Route> {
    config.routes.iter().find(|r| {
        let m = &r.matcher;
        m.scheme == target.scheme
            && m.port == target.port
            && host_matches(&m.host, &target.host)
            && (m.methods.is_empty() || m.methods.iter().any(|x| x == method))
            && path_matches(&m.path_prefix, target.path())
            && agent_allowed(r, agent)
    })
}

/// Whether any https route could allow requests inside a `CONNECT` tunnel.
pub fn route_exists_for_connect(config: &Config, agent: &str, host: &str, port: u16) -> bool {
    config.routes.iter().any(|r| {
        r.matcher.scheme == Scheme::Https
            && r.matcher.port == port
            && host_matches(&r.matcher.host, host)
            && agent_allowed(r, agent)
    })
}

/// `via` hops and `intercept = false` tunnels are not built yet: refusing such a route's
/// requests beats sending them straight out (past the hop) or intercepting them anyway.
pub fn route_is_built(route: &Route, scheme: Scheme) -> bool {
    route.via.is_none() && (route.intercept || scheme == Scheme::Http)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let text = r#"
[[agents]]
id = "ci"
token = "t"
[[agents]]
id = "other"
token = "u"
[[routes]]
id = "gh-read"
agents = ["ci"]
match = { host = "api.github.com", methods = ["GET"], path_prefix = "/repos" }
[[routes]]
id = "wild"
match = { host = "*.example.test", scheme = "http", port = 8080 }
"#;
        crate::config::parse(text, None, &|_| None).unwrap()
    }

    fn t(scheme: Scheme, host: &str, port: Option<u16>, path: &str) -> Target {
        Target::new(scheme, host, port, path).unwrap()
    }

    #[test]
    fn routes_match_every_dimension() {
        let c = config();
        let gh = t(Scheme::Https, "API.github.com", None, "/repos/a/b?x=1");
        assert_eq!(
            match_route(&c, "ci", &gh, "GET").map(|r| r.id.as_str()),
            Some("gh-read")
        );
        assert!(match_route(&c, "ci", &gh, "POST").is_none());
        assert!(match_route(&c, "other", &gh, "GET").is_none());
        assert!(
            match_route(
                &c,
                "ci",
                &t(Scheme::Https, "api.github.com", None, "/repository"),
                "GET"
            )
            .is_none()
        );
        assert!(
            match_route(
                &c,
                "ci",
                &t(Scheme::Https, "api.github.com", Some(8443), "/repos"),
                "GET"
            )
            .is_none()
        );
        assert!(
            match_route(
                &c,
                "ci",
                &t(Scheme::Http, "api.github.com", None, "/repos"),
                "GET"
            )
            .is_none()
        );
        let w = t(Scheme::Http, "a.example.test", Some(8080), "/");
        assert_eq!(
            match_route(&c, "other", &w, "DELETE").map(|r| r.id.as_str()),
            Some("wild")
        );
        assert!(
            match_route(
                &c,
                "other",
                &t(Scheme::Http, "example.test", Some(8080), "/"),
                "GET"
            )
            .is_none()
        );
        assert!(
            match_route(
                &c,
                "other",
                &t(Scheme::Http, "evilexample.test", Some(8080), "/"),
                "GET"
            )
            .is_none()
        );
    }

    #[test]
    fn targets_refuse_dot_segments_and_odd_hosts() {
        assert_eq!(
            Target::new(Scheme::Https, "x.test", None, "/a/../b").err(),
            Some(TargetError {
                field: "target.path"
            })
        );
        assert_eq!(
            Target::new(Scheme::Https, "x.test", None, "/a/%2E%2e/b").err(),
            Some(TargetError {
                field: "target.path"
            })
        );
        assert_eq!(
            Target::new(Scheme::Https, "x.test", None, "/a%2fb").err(),
            Some(TargetError {
                field: "target.path"
            })
        );
        assert_eq!(
            Target::new(Scheme::Https, "x y", None, "/").err(),
            Some(TargetError {
                field: "target.host"
            })
        );
        let v6 = t(Scheme::Https, "[::1]", Some(8443), "");
        assert_eq!(v6.url(), "https://[::1]:8443/");
        assert_eq!(
            t(Scheme::Http, "h.test", Some(80), "/p").url(),
            "http://h.test/p"
        );
    }

    #[test]
    fn connect_is_allowed_only_where_a_route_could_match() {
        let c = config();
        assert!(route_exists_for_connect(&c, "ci", "api.github.com", 443));
        assert!(!route_exists_for_connect(
            &c,
            "other",
            "api.github.com",
            443
        ));
        assert!(!route_exists_for_connect(&c, "ci", "api.github.com", 444));
    }
}
