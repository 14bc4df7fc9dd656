//! Default deny: a request matches a route or is refused before any DNS or secret.

use super::path::normalize_path;
use crate::config::{Config, Problem, Route, Scheme};

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

    /// The host as a URL writes it: IPv6 in brackets.
    fn url_host(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        }
    }

    /// A tunnel's target (SPEC §3.6): `https://host:port`, the port always named.
    pub fn connect_url(&self) -> String {
        format!("https://{}", self.connect_authority())
    }

    /// `host:port`, the port always named: a `CONNECT`'s authority-form target.
    pub fn connect_authority(&self) -> String {
        format!("{}:{}", self.url_host(), self.port)
    }

    /// `host` or `host:port` when the port is not the scheme's default; IPv6 in brackets.
    pub fn authority(&self) -> String {
        let host = self.url_host();
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
    admits(&route.agents, agent)
}

/// A route's or SSH target's `agents` admit `agent` (no list: every agent; `[]`: none).
pub fn admits(agents: &crate::config::Agents, agent: &str) -> bool {
    agents.admits(agent)
}

/// The config in force still has `route` (by id) and it still admits `agent`: what an
/// approval granted under an older config must find before it dispatches. What else a
/// reload changed on it binds new requests only; the held one keeps its snapshot.
pub fn still_routes(config: &crate::config::Config, route: &Route, agent: &str) -> bool {
    config
        .routes
        .iter()
        .any(|r| r.id == route.id && agent_allowed(r, agent))
}

/// The dimensions a route matches a request on, in the order a refusal names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dimension {
    Scheme,
    Port,
    Path,
    Method,
    Agent,
}

impl Dimension {
    fn field(self) -> &'static str {
        match self {
            Self::Scheme => "target.scheme",
            Self::Port => "target.port",
            Self::Path => "target.path",
            Self::Method => "method",
            Self::Agent => "agent",
        }
    }
}

/// The dimensions on which a route whose host matches does not allow this request.
fn mismatches(r: &Route, agent: &str, target: &Target, method: &str) -> Vec<Dimension> {
    let m = &r.matcher;
    let checks = [
        (Dimension::Scheme, m.scheme == target.scheme),
        (Dimension::Port, m.port == target.port),
        (Dimension::Path, path_matches(&m.path_prefix, target.path())),
        (
            Dimension::Method,
            m.methods.is_empty() || m.methods.iter().any(|x| x == method),
        ),
        (Dimension::Agent, agent_allowed(r, agent)),
    ];
    checks
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(d, _)| d)
        .collect()
}

/// How specific a route is; compared field by field, most specific first: an exact host
/// over a wildcard (a longer wildcard over a shorter), then the longer path prefix, then
/// explicit methods over any, then explicit agents over all. The table order never decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Specificity {
    exact_host: bool,
    host_len: usize,
    path_len: usize,
    explicit_methods: bool,
    explicit_agents: bool,
}

pub fn specificity(r: &Route) -> Specificity {
    let m = &r.matcher;
    Specificity {
        exact_host: !m.host.starts_with("*."),
        host_len: m.host.len(),
        path_len: m.path_prefix.len(),
        explicit_methods: !m.methods.is_empty(),
        explicit_agents: !r.agents.is_every(),
    }
}

/// The most specific route that allows this request for this agent (SPEC §3.1 default
/// deny). Two equally specific routes that both match are refused at start.
pub fn match_route<'a>(
    config: &'a Config,
    agent: &str,
    target: &Target,
    method: &str,
) -> Option<&'a Route> {
    config
        .routes
        .iter()
        .filter(|r| {
            host_matches(&r.matcher.host, &target.host)
                && mismatches(r, agent, target, method).is_empty()
        })
        .max_by_key(|r| specificity(r))
}

/// A token endpoint's URL as a target: `https` only (the client secret travels in it),
/// with a host and no userinfo or fragment.
pub fn token_target(url: &str) -> Result<Target, &'static str> {
    let uri: http::Uri = url.parse().map_err(|_| "is not a URL")?;
    if uri.scheme_str() != Some("https") {
        return Err("must be an https:// URL (the client secret is sent to it)");
    }
    let authority = uri.authority().ok_or("has no host")?;
    if authority.as_str().contains('@') || url.contains('#') {
        return Err("must not carry userinfo or a fragment");
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    Target::new(Scheme::Https, authority.host(), authority.port_u16(), path)
        .map_err(|_| "is not a valid destination")
}

/// Every credential a route injects into `host` (its offers included), whatever the
/// route's agents, methods and paths, and every `oauth2` one whose token endpoint is there
/// (postern sends it the client secret): the secrets an origin at that host may have kept.
/// `at` is where this request's route pins the host (`resolve`): a route pinned to the same
/// address, or naming its IP, reaches the same origin under another name.
pub fn credentials_at_host<'a>(
    config: &'a Config,
    host: &str,
    at: Option<std::net::SocketAddr>,
) -> Vec<&'a str> {
    let same_origin = |r: &&Route| {
        host_matches(&r.matcher.host, host)
            || (at.is_some() && r.resolve == at)
            || r.resolve.is_some_and(|a| a.ip().to_string() == host)
            || at.is_some_and(|a| a.ip().to_string() == r.matcher.host)
    };
    let token_endpoint_here = |c: &&crate::config::Credential| match &c.inject {
        crate::config::Inject::OAuth2(o) => {
            token_target(&o.token_url).is_ok_and(|t| t.host == host)
        }
        _ => false,
    };
    let mut ids: Vec<&str> = (config.routes.iter())
        .filter(same_origin)
        .flat_map(|r| r.credentials.iter().map(String::as_str))
        .chain(
            (config.credentials.iter())
                .filter(token_endpoint_here)
                .map(|c| c.id.as_str()),
        )
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The route postern's own token request (SPEC §3.8) goes through: `POST target`, whoever
/// the route's agents are (the token endpoint is postern's to call, not an agent's).
pub fn match_token_route<'a>(config: &'a Config, target: &Target) -> Option<&'a Route> {
    config
        .routes
        .iter()
        .filter(|r| {
            host_matches(&r.matcher.host, &target.host)
                && mismatches(r, "", target, "POST")
                    .iter()
                    .all(|d| matches!(d, Dimension::Agent))
        })
        .max_by_key(|r| specificity(r))
}

/// What a `ROUTE_DENIED` asks the agent to correct: the one dimension of the closest
/// route for this host that did not match, else the host.
pub fn denial_field(config: &Config, agent: &str, target: &Target, method: &str) -> &'static str {
    config
        .routes
        .iter()
        .filter(|r| host_matches(&r.matcher.host, &target.host))
        .map(|r| mismatches(r, agent, target, method))
        .min_by_key(Vec::len)
        .and_then(|dims| dims.first().map(|d| d.field()))
        .unwrap_or("target.host")
}

/// `denial_field` for a `CONNECT`, where only scheme, port and agent are known yet.
pub fn connect_denial_field(config: &Config, agent: &str, host: &str, port: u16) -> &'static str {
    let Ok(target) = Target::new(Scheme::Https, host, Some(port), "/") else {
        return "target.host";
    };
    config
        .routes
        .iter()
        .filter(|r| host_matches(&r.matcher.host, &target.host))
        .map(|r| {
            let mut dims = mismatches(r, agent, &target, "CONNECT");
            dims.retain(|d| matches!(d, Dimension::Scheme | Dimension::Port | Dimension::Agent));
            dims
        })
        .min_by_key(Vec::len)
        .and_then(|dims| dims.first().map(|d| d.field()))
        .unwrap_or("target.host")
}

/// Config problems that matching would hide: a route that can never match, and two
/// routes equally specific for some request (which applies would depend on table order).
pub fn route_problems(config: &Config) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (i, r) in config.routes.iter().enumerate() {
        let prefix = &r.matcher.path_prefix;
        match normalize_path(prefix) {
            Ok(n) if &n == prefix => {}
            Ok(n) => problems.push(Problem {
                path: format!("routes[{i}].match.path_prefix"),
                message: format!(
                    "never matches: request paths are normalized before matching; write `{n}`"
                ),
            }),
            Err(_) => problems.push(Problem {
                path: format!("routes[{i}].match.path_prefix"),
                message: "never matches: postern refuses such paths (INVALID_TARGET)".into(),
            }),
        }
        let earlier = config.routes[..i].iter().enumerate();
        if let Some((j, other)) = earlier.clone().find(|(_, o)| ambiguous(o, r)) {
            problems.push(Problem {
                path: format!("routes[{i}]"),
                message: format!(
                    "as specific as routes[{j}] (`{}`) for the same requests, so which one applies \
                     would depend on their order: make one more specific (host, path_prefix, \
                     methods, agents) or merge them",
                    other.id
                ),
            });
        } else if let Some((j, other)) = earlier.clone().find(|(_, o)| tunnel_or_not(o, r)) {
            problems.push(Problem {
                path: format!("routes[{i}].intercept"),
                message: format!(
                    "routes[{j}] (`{}`) matches the same CONNECT (host, port, agents) but the other \
                     `intercept`: postern cannot both relay and read one tunnel; make one more \
                     specific by host or agents",
                    other.id
                ),
            });
        }
    }
    problems
}

/// One is a tunnel, the other intercepted, and the same `CONNECT` matches both equally:
/// postern could not tell whether to relay its bytes or read them.
fn tunnel_or_not(a: &Route, b: &Route) -> bool {
    let (ma, mb) = (&a.matcher, &b.matcher);
    a.intercept != b.intercept
        && ma.scheme == Scheme::Https
        && ma.scheme == mb.scheme
        && ma.port == mb.port
        && ma.host == mb.host
        && connect_specificity(a) == connect_specificity(b)
        && a.agents.overlap(&b.agents)
}

/// Both routes can match one request and neither is more specific.
fn ambiguous(a: &Route, b: &Route) -> bool {
    let (ma, mb) = (&a.matcher, &b.matcher);
    let shared = |x: &[String], y: &[String]| {
        (x.is_empty() && y.is_empty()) || x.iter().any(|v| y.contains(v))
    };
    specificity(a) == specificity(b)
        && ma.scheme == mb.scheme
        && ma.port == mb.port
        && ma.host == mb.host
        && ma.path_prefix == mb.path_prefix
        && shared(&ma.methods, &mb.methods)
        && (a.agents.is_every() && b.agents.is_every()
            || shared(a.agents.named(), b.agents.named()))
}

/// The route that decides how a `CONNECT` is served (a tunnel, or interception), or `None`
/// when no https route could allow anything inside it. A `CONNECT` names no path or method,
/// so the most specific by host, then by explicit agents, decides.
pub fn match_connect<'a>(
    config: &'a Config,
    agent: &str,
    host: &str,
    port: u16,
) -> Option<&'a Route> {
    connect_route(config, agent, (host, port), Scheme::Https)
}

/// A `CONNECT` to the host and port of an `http` route: the client speaks plain HTTP inside
/// the tunnel (WebSocket clients tunnel `ws://` so), read as `http://` requests.
pub fn match_connect_plain<'a>(
    config: &'a Config,
    agent: &str,
    host: &str,
    port: u16,
) -> Option<&'a Route> {
    connect_route(config, agent, (host, port), Scheme::Http)
}

fn connect_route<'a>(
    config: &'a Config,
    agent: &str,
    (host, port): (&str, u16),
    scheme: Scheme,
) -> Option<&'a Route> {
    config
        .routes
        .iter()
        .filter(|r| {
            r.matcher.scheme == scheme
                && r.matcher.port == port
                && host_matches(&r.matcher.host, host)
                && agent_allowed(r, agent)
        })
        .max_by_key(|r| connect_specificity(r))
}

/// `specificity` without path and methods, which a `CONNECT` does not carry.
fn connect_specificity(r: &Route) -> (bool, usize, bool) {
    let s = specificity(r);
    (s.exact_host, s.host_len, s.explicit_agents)
}

/// A tunnel route (`intercept = false`) serves whole `CONNECT`s (`http::exchange::tunnel`), never a
/// request postern reads.
pub fn route_is_built(route: &Route, scheme: Scheme) -> bool {
    route.intercept || scheme == Scheme::Http
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let text = r#"
[[agents]]
id = "ci"
token = "t-0123456789abcdef"
[[agents]]
id = "other"
token = "u-0123456789abcdef"
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

    #[test]
    fn a_hosts_credentials_include_aliases_and_its_token_endpoints() {
        let text = r#"
[[credentials]]
id = "api"
secret = "a"
inject = { header = "Authorization", format = "Bearer {secret}" }
[[credentials]]
id = "idp"
secret = "i"
inject = { oauth2 = { grant = "client_credentials", token_url = "https://idp.test/token" } }
[[routes]]
id = "api"
credential = "api"
match = { host = "api.test" }
resolve = "127.0.0.1:9443"
[[routes]]
id = "idp"
match = { host = "idp.test" }
[[routes]]
id = "alias"
match = { host = "alias.test" }
resolve = "127.0.0.1:9443"
"#;
        let c = match crate::config::parse(text, None, &|_| None) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let at: Option<std::net::SocketAddr> = "127.0.0.1:9443".parse().ok();
        assert_eq!(credentials_at_host(&c, "api.test", at), ["api"]);
        assert_eq!(
            credentials_at_host(&c, "alias.test", at),
            ["api"],
            "same address"
        );
        assert_eq!(
            credentials_at_host(&c, "127.0.0.1", None),
            ["api"],
            "its IP"
        );
        assert_eq!(
            credentials_at_host(&c, "idp.test", None),
            ["idp"],
            "a token endpoint"
        );
        assert!(credentials_at_host(&c, "other.test", None).is_empty());
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
        assert_eq!(v6.connect_url(), "https://[::1]:8443");
        assert_eq!(
            t(Scheme::Https, "h.test", None, "/").connect_url(),
            "https://h.test:443"
        );
        assert_eq!(
            t(Scheme::Http, "h.test", Some(80), "/p").url(),
            "http://h.test/p"
        );
    }

    #[test]
    fn connect_is_allowed_only_where_a_route_could_match() {
        let c = config();
        let id = |agent: &str, port| {
            match_connect(&c, agent, "api.github.com", port).map(|r| r.id.as_str())
        };
        assert_eq!(id("ci", 443), Some("gh-read"));
        assert_eq!(id("other", 443), None);
        assert_eq!(id("ci", 444), None);
    }

    #[test]
    fn the_most_specific_host_decides_between_tunnel_and_interception() {
        let wild =
            "[[routes]]\nid = \"wild\"\nintercept = false\nmatch = { host = \"*.h.test\" }\n";
        let exact = "[[routes]]\nid = \"exact\"\nmatch = { host = \"api.h.test\", path_prefix = \"/v1\" }\n";
        for text in [format!("{wild}{exact}"), format!("{exact}{wild}")] {
            let c = parse(&text);
            assert!(route_problems(&c).is_empty(), "{:?}", route_problems(&c));
            let id = |host: &str| match_connect(&c, "a", host, 443).map(|r| r.id.as_str());
            assert_eq!(id("api.h.test"), Some("exact"));
            assert_eq!(id("pinned.h.test"), Some("wild"));
        }
    }

    #[test]
    fn a_tunnel_and_an_intercepted_route_for_the_same_connect_are_a_config_error() {
        let tunnel = "[[routes]]\nid = \"t\"\nintercept = false\nmatch = { host = \"h.test\" }\n";
        let read =
            "[[routes]]\nid = \"r\"\nmatch = { host = \"h.test\", path_prefix = \"/api\" }\n";
        let problems = route_problems(&parse(&format!("{tunnel}{read}")));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].message.contains("routes[0] (`t`)"),
            "{problems:?}"
        );
        let elsewhere = read.replace("h.test", "other.test");
        assert!(route_problems(&parse(&format!("{tunnel}{elsewhere}"))).is_empty());
    }

    fn parse(text: &str) -> Config {
        crate::config::parse(text, None, &|_| None).unwrap()
    }

    #[test]
    fn the_most_specific_route_wins_whatever_the_table_order() {
        let broad = "[[routes]]\nid = \"all\"\nmatch = { host = \"h.test\" }\n";
        let admin = "[[routes]]\nid = \"admin\"\napproval = \"required\"\nmatch = { host = \"h.test\", path_prefix = \"/admin\" }\n";
        let wild = "[[routes]]\nid = \"wild\"\nmatch = { host = \"*.test\", path_prefix = \"/admin/deploy\" }\n";
        let post = "[[routes]]\nid = \"post\"\nmatch = { host = \"h.test\", path_prefix = \"/admin\", methods = [\"POST\"] }\n";
        let deploy = t(Scheme::Https, "h.test", None, "/admin/deploy");
        for text in [
            format!("{broad}{admin}{wild}"),
            format!("{wild}{admin}{broad}"),
        ] {
            let c = parse(&text);
            assert!(route_problems(&c).is_empty(), "{:?}", route_problems(&c));
            let id = |path: &str| {
                let target = t(Scheme::Https, "h.test", None, path);
                match_route(&c, "a", &target, "POST").map(|r| r.id.clone())
            };
            assert_eq!(
                match_route(&c, "a", &deploy, "POST").map(|r| r.id.as_str()),
                Some("admin"),
                "exact host beats a wildcard"
            );
            assert_eq!(id("/admin"), Some("admin".into()));
            assert_eq!(id("/other"), Some("all".into()));
        }
        let c = parse(&format!("{admin}{post}"));
        assert_eq!(
            match_route(&c, "a", &deploy, "POST").map(|r| r.id.as_str()),
            Some("post")
        );
        assert_eq!(
            match_route(&c, "a", &deploy, "GET").map(|r| r.id.as_str()),
            Some("admin")
        );
    }

    #[test]
    fn equally_specific_overlapping_routes_and_unmatchable_prefixes_are_config_errors() {
        let a = "[[routes]]\nid = \"a\"\nmatch = { host = \"h.test\", methods = [\"GET\", \"POST\"] }\n";
        let b = "[[routes]]\nid = \"b\"\napproval = \"required\"\nmatch = { host = \"h.test\", methods = [\"POST\"] }\n";
        let c = "[[routes]]\nid = \"c\"\nmatch = { host = \"h.test\", methods = [\"PUT\"] }\n";
        let problems = route_problems(&parse(&format!("{a}{b}{c}")));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].path, "routes[1]");
        assert!(problems[0].message.contains("routes[0] (`a`)"));
        let odd = "[[routes]]\nid = \"odd\"\nmatch = { host = \"h.test\", path_prefix = \"/%61dmin\" }\n[[routes]]\nid = \"dots\"\nmatch = { host = \"h.test\", path_prefix = \"/a/../b\" }\n";
        let problems = route_problems(&parse(odd));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].message.contains("`/admin`"));
        assert_eq!(problems[1].path, "routes[1].match.path_prefix");
    }

    #[test]
    fn a_denial_names_what_did_not_match() {
        let c = config();
        let field = |agent: &str, scheme, port, path: &str, method: &str| {
            denial_field(&c, agent, &t(scheme, "api.github.com", port, path), method)
        };
        assert_eq!(
            field("ci", Scheme::Https, None, "/repos/x", "POST"),
            "method"
        );
        assert_eq!(
            field("other", Scheme::Https, None, "/repos/x", "GET"),
            "agent"
        );
        assert_eq!(
            field("ci", Scheme::Https, None, "/users", "GET"),
            "target.path"
        );
        assert_eq!(
            field("ci", Scheme::Https, Some(8443), "/repos", "GET"),
            "target.port"
        );
        let elsewhere = t(Scheme::Https, "nowhere.test", None, "/");
        assert_eq!(denial_field(&c, "ci", &elsewhere, "GET"), "target.host");
        assert_eq!(
            connect_denial_field(&c, "other", "api.github.com", 443),
            "agent"
        );
        assert_eq!(
            connect_denial_field(&c, "ci", "api.github.com", 444),
            "target.port"
        );
    }
}
