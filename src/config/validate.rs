//! Raw → validated: every problem reported with its key path, in one run.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::model::*;
pub use super::problem::{ConfigErrors, Problem};
use super::raw::*;
use super::units::{Quantity, parse_duration, parse_size};
use crate::contract::Outcome;
use crate::journal::Durability;

/// Shortest agent or admin token accepted (SPEC §3.1).
pub const MIN_TOKEN_CHARS: usize = 16;

mod audit;
mod oauth2;
mod secret;
mod ssh_target;
mod tunnel;
mod via;

/// Looks up a process environment variable (passed in, never read deep in code).
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

struct Checker<'a> {
    problems: Vec<Problem>,
    base: PathBuf,
    env: EnvLookup<'a>,
}

impl Checker<'_> {
    fn bad(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }

    fn section<T: DeserializeOwned + Default>(&mut self, path: &str, v: Option<&toml::Value>) -> T {
        match v {
            None => T::default(),
            Some(v) => self.item(path, v).unwrap_or_default(),
        }
    }

    fn item<T: DeserializeOwned>(&mut self, path: &str, v: &toml::Value) -> Option<T> {
        let (item, problems) = super::decode::decode(path, v);
        self.problems.extend(problems);
        item
    }

    fn list<T: DeserializeOwned>(&mut self, path: &str, v: Option<&toml::Value>) -> Vec<T> {
        let Some(v) = v else { return Vec::new() };
        let Some(items) = v.as_array() else {
            self.bad(path, "expected an array of tables ([[...]])");
            return Vec::new();
        };
        items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| self.item(&format!("{path}[{i}]"), item))
            .collect()
    }

    fn addr(&mut self, path: &str, v: Option<&str>, default: &str) -> SocketAddr {
        let text = v.unwrap_or(default);
        text.parse().unwrap_or_else(|_| {
            self.bad(
                path,
                format!("`{text}` is not an address such as \"127.0.0.1:3128\""),
            );
            SocketAddr::from(([127, 0, 0, 1], 0))
        })
    }

    fn duration(&mut self, path: &str, v: Option<&Quantity>, default: Duration) -> Duration {
        match v.map(parse_duration) {
            None => default,
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                self.bad(path, e);
                default
            }
        }
    }

    /// A duration that must not be zero (a zero timeout would refuse everything).
    fn timeout(&mut self, path: &str, v: &Option<Quantity>, default: Duration) -> Duration {
        let d = self.duration(path, v.as_ref(), default);
        if d.is_zero() {
            self.bad(path, "must be longer than 0");
            return default;
        }
        d
    }

    /// A count of at least 1.
    fn count(&mut self, path: &str, v: Option<u32>, default: usize) -> usize {
        match v {
            None => default,
            Some(0) => {
                self.bad(path, "must be at least 1");
                default
            }
            Some(n) => n as usize,
        }
    }

    fn size(&mut self, path: &str, v: Option<&Quantity>, default: u64) -> u64 {
        match v.map(parse_size) {
            None => default,
            Some(Ok(n)) => n,
            Some(Err(e)) => {
                self.bad(path, e);
                default
            }
        }
    }

    /// `env:NAME` reads the environment; anything else is a literal.
    /// An agent or admin token: long enough that guessing it is no way in.
    fn secret(&mut self, path: &str, v: &str) -> Option<SecretValue> {
        let value = match v.strip_prefix("env:") {
            Some(name) => match (self.env)(name) {
                Some(value) if !value.is_empty() => value,
                _ => {
                    self.bad(path, format!("environment variable {name} is not set"));
                    return None;
                }
            },
            None if v.is_empty() => {
                self.bad(path, "must not be empty");
                return None;
            }
            None => v.to_owned(),
        };
        let chars = value.chars().count();
        if chars < MIN_TOKEN_CHARS {
            // The length only: the value is a secret.
            self.bad(
                path,
                format!("a token must be at least {MIN_TOKEN_CHARS} characters (this one has {chars}); `openssl rand -hex 16` makes one"),
            );
            return None;
        }
        Some(SecretValue::new(value))
    }

    fn path(&self, v: &str) -> PathBuf {
        let p = Path::new(v);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }

    fn unique<'a>(
        &mut self,
        section: &str,
        ids: impl Iterator<Item = &'a str>,
    ) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        for (i, id) in ids.enumerate() {
            if id.is_empty() {
                self.bad(format!("{section}[{i}].id"), "must not be empty");
            } else if !seen.insert(id.to_owned()) {
                self.bad(format!("{section}[{i}].id"), format!("duplicate id `{id}`"));
            }
        }
        seen
    }
}

/// Parses and validates a config text.
pub fn parse(
    text: &str,
    source: Option<&Path>,
    env: EnvLookup<'_>,
) -> Result<Config, ConfigErrors> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        ConfigErrors(vec![Problem {
            path: "(file)".into(),
            message: e.to_string().trim().to_owned(),
        }])
    })?;
    let base = source
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let mut c = Checker {
        problems: Vec::new(),
        base,
        env,
    };
    const SECTIONS: &[&str] = &[
        "proxy",
        "ssh",
        "admin",
        "journal",
        "dns",
        "cluster",
        "audit",
        "agents",
        "credentials",
        "routes",
        "ssh_targets",
    ];
    for key in table.keys() {
        if !SECTIONS.contains(&key.as_str()) {
            c.bad(
                key.clone(),
                format!("unknown section (expected one of {})", SECTIONS.join(", ")),
            );
        }
    }
    let proxy: RawProxy = c.section("proxy", table.get("proxy"));
    let ssh: RawSsh = c.section("ssh", table.get("ssh"));
    let admin: RawAdmin = c.section("admin", table.get("admin"));
    let journal: RawJournal = c.section("journal", table.get("journal"));
    let dns: Option<RawDns> = table.get("dns").and_then(|v| c.item("dns", v));
    let cluster: Option<RawCluster> = table.get("cluster").and_then(|v| c.item("cluster", v));
    let audit: RawAudit = c.section("audit", table.get("audit"));
    let agents: Vec<RawAgent> = c.list("agents", table.get("agents"));
    let credentials: Vec<RawCredential> = c.list("credentials", table.get("credentials"));
    let routes: Vec<RawRoute> = c.list("routes", table.get("routes"));
    let ssh_targets: Vec<RawSshTarget> = c.list("ssh_targets", table.get("ssh_targets"));

    let config = Config {
        source: source.map(Path::to_path_buf),
        proxy: proxy_config(&mut c, &proxy),
        ssh: SshConfig {
            listen: c.addr("ssh.listen", ssh.listen.as_deref(), "127.0.0.1:2222"),
        },
        admin: AdminConfig {
            listen: c.addr("admin.listen", admin.listen.as_deref(), "127.0.0.1:3129"),
            token: admin
                .token
                .as_deref()
                .and_then(|t| c.secret("admin.token", t)),
            max_connections: c.count("admin.max_connections", admin.max_connections, 32),
        },
        journal: journal_config(&mut c, &journal),
        dns: dns.map(|d| DnsConfig {
            servers: d
                .servers
                .iter()
                .enumerate()
                .map(|(i, s)| c.addr(&format!("dns.servers[{i}]"), Some(s), ""))
                .collect(),
        }),
        cluster: cluster.and_then(|raw| cluster_config(&mut c, raw)),
        audit: audit::validate(&mut c, &audit),
        agents: agents
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let token = c.secret(&format!("agents[{i}].token"), &a.token)?;
                let rate_limit = rate(&mut c, format!("agents[{i}].rate_limit"), &a.rate_limit);
                Some(Agent {
                    id: a.id.clone(),
                    token,
                    rate_limit,
                })
            })
            .collect(),
        credentials: credentials
            .iter()
            .enumerate()
            .filter_map(|(i, cr)| credential(&mut c, i, cr))
            .collect(),
        routes: Vec::new(),
        ssh_targets: Vec::new(),
    };
    let agent_ids = c.unique("agents", agents.iter().map(|a| a.id.as_str()));
    let cred_ids = c.unique("credentials", credentials.iter().map(|a| a.id.as_str()));
    distinct_placeholders(&mut c, &config.credentials);
    c.unique("routes", routes.iter().map(|r| r.id.as_str()));
    c.unique("ssh_targets", ssh_targets.iter().map(|r| r.id.as_str()));
    let refs = Refs {
        agents: &agent_ids,
        credentials: &cred_ids,
    };
    let routes = routes
        .iter()
        .enumerate()
        .map(|(i, r)| route(&mut c, &refs, &config.credentials, i, r))
        .collect();
    let ssh_targets = ssh_targets
        .iter()
        .enumerate()
        .map(|(i, t)| ssh_target::validate(&mut c, &refs, &config.credentials, i, t))
        .collect();
    let config = Config {
        routes,
        ssh_targets,
        ..config
    };
    oauth2::token_routes(&mut c, &config);
    if config.agents.is_empty() && agents.is_empty() && !config.proxy.listen.ip().is_loopback() {
        c.bad(
            "proxy.listen",
            "a non-loopback listener needs [[agents]]: anonymous agents are allowed on loopback only",
        );
    }
    let anonymous_ssh = !config.ssh_targets.is_empty() && config.agents.is_empty();
    if anonymous_ssh && agents.is_empty() && !config.ssh.listen.ip().is_loopback() {
        c.bad(
            "ssh.listen",
            "a non-loopback listener needs [[agents]]: anonymous agents are allowed on loopback only",
        );
    }
    if c.problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigErrors(c.problems))
    }
}

fn proxy_config(c: &mut Checker<'_>, p: &RawProxy) -> ProxyConfig {
    let max_request_bytes = c.size(
        "proxy.max_request_bytes",
        p.max_request_bytes.as_ref(),
        16 << 20,
    );
    let buffer_budget = c.size("proxy.buffer_budget", p.buffer_budget.as_ref(), 256 << 20);
    if buffer_budget < max_request_bytes {
        c.bad(
            "proxy.buffer_budget",
            "must be at least proxy.max_request_bytes (a body that may be sent must fit)",
        );
    }
    // A quarter by default, so one agent cannot hold it all; never less than one body.
    let agent_default = (buffer_budget / 4)
        .max(max_request_bytes)
        .min(buffer_budget);
    let agent_buffer_budget = c.size(
        "proxy.agent_buffer_budget",
        p.agent_buffer_budget.as_ref(),
        agent_default,
    );
    let set = p.agent_buffer_budget.is_some();
    if set && (agent_buffer_budget < max_request_bytes || agent_buffer_budget > buffer_budget) {
        c.bad(
            "proxy.agent_buffer_budget",
            "must be at least proxy.max_request_bytes and at most proxy.buffer_budget",
        );
    }
    let secs = Duration::from_secs;
    ProxyConfig {
        listen: c.addr("proxy.listen", p.listen.as_deref(), "127.0.0.1:3128"),
        max_request_bytes,
        max_connections: p
            .max_connections
            .map(|n| c.count("proxy.max_connections", Some(n), 1)),
        max_busy_per_agent: p
            .max_busy_per_agent
            .map(|n| c.count("proxy.max_busy_per_agent", Some(n), 1)),
        header_read_timeout: c.timeout(
            "proxy.header_read_timeout",
            &p.header_read_timeout,
            secs(10),
        ),
        tls_handshake_timeout: c.timeout(
            "proxy.tls_handshake_timeout",
            &p.tls_handshake_timeout,
            secs(10),
        ),
        request_body_timeout: c.timeout(
            "proxy.request_body_timeout",
            &p.request_body_timeout,
            secs(30),
        ),
        buffer_budget,
        buffer_wait: c.duration("proxy.buffer_wait", p.buffer_wait.as_ref(), secs(2)),
        agent_buffer_budget,
        min_upload_rate: c.size("proxy.min_upload_rate", p.min_upload_rate.as_ref(), 4 << 10),
    }
}

/// `[cluster]`: a node id the fleet can tell apart, and a connection URL (or `env:NAME`).
fn cluster_config(c: &mut Checker<'_>, raw: RawCluster) -> Option<ClusterConfig> {
    let id_ok = (1..=16).contains(&raw.node.len())
        && raw
            .node
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !id_ok {
        c.bad(
            "cluster.node",
            "must be 1 to 16 characters of a-z, 0-9 and '-' (unique in the fleet)",
        );
    }
    // A value from the environment is checked when the daemon connects: the CLI's own
    // commands (`postern env`, `postern jail`) read the config without it.
    let url = match raw.postgres.strip_prefix("env:") {
        Some(name) => (c.env)(name).filter(|v| !v.is_empty()).or_else(|| {
            c.bad(
                "cluster.postgres",
                format!("environment variable {name} is not set"),
            );
            None
        }),
        // The URL may hold a password: say what is wrong, never what it says.
        None if !(raw.postgres.starts_with("postgres://")
            || raw.postgres.starts_with("postgresql://")) =>
        {
            c.bad(
                "cluster.postgres",
                "must be a postgres:// or postgresql:// URL, or env:NAME naming one",
            );
            None
        }
        None => Some(raw.postgres),
    }?;
    id_ok.then(|| ClusterConfig {
        postgres: SecretValue::new(url),
        node: raw.node,
    })
}

fn journal_config(c: &mut Checker<'_>, j: &RawJournal) -> JournalConfig {
    let durability = match j.durability.as_deref() {
        None | Some("fsync") => Durability::Fsync,
        Some("buffered") => Durability::Buffered,
        Some(other) => {
            c.bad(
                "journal.durability",
                format!("`{other}` is not \"fsync\" or \"buffered\""),
            );
            Durability::Fsync
        }
    };
    let result_retention = c.duration(
        "journal.result_retention",
        j.result_retention.as_ref(),
        Duration::from_secs(7 * 86_400),
    );
    JournalConfig {
        durability,
        result_retention,
        event_retention: event_retention(c, j, result_retention),
        max_result_bytes: c.size(
            "journal.max_result_bytes",
            j.max_result_bytes.as_ref(),
            16 << 20,
        ),
        buffer_limit: c.size("journal.buffer_limit", j.buffer_limit.as_ref(), 8 << 20),
        min_free_bytes: c.size(
            "journal.min_free_bytes",
            j.min_free_bytes.as_ref(),
            256 << 20,
        ),
        reserve_bytes: c.size("journal.reserve_bytes", j.reserve_bytes.as_ref(), 64 << 20),
    }
}

/// A record must outlive its result: `postern result` of a kept body finds its record.
fn event_retention(c: &mut Checker<'_>, j: &RawJournal, results: Duration) -> Duration {
    let path = "journal.event_retention";
    let default = Duration::from_secs(30 * 86_400).max(results);
    let d = c.timeout(path, &j.event_retention, default);
    if d < results {
        c.bad(
            path,
            "must be at least journal.result_retention (a kept result needs its record)",
        );
        return default;
    }
    d
}

fn credential(c: &mut Checker<'_>, i: usize, cr: &RawCredential) -> Option<Credential> {
    let path = format!("credentials[{i}].inject");
    let inj = &cr.inject;
    let modes = [
        inj.header.is_some(),
        inj.basic.is_some(),
        inj.query.is_some(),
        inj.ssh_key == Some(true),
        inj.ssh_password == Some(true),
        inj.aws_sigv4.is_some(),
        inj.oauth2.is_some(),
    ];
    if modes.iter().filter(|m| **m).count() != 1 {
        c.bad(
            &path,
            "name exactly one mode: header, basic, query, ssh_key, ssh_password, aws_sigv4 or oauth2",
        );
        return None;
    }
    if inj.format.is_some() && inj.header.is_none() {
        c.bad(format!("{path}.format"), "format goes with header");
    }
    let inject = if let Some(name) = &inj.header {
        let format = inj.format.clone().unwrap_or_else(|| "{secret}".into());
        if !format.contains("{secret}") {
            c.bad(format!("{path}.format"), "must contain {secret}");
        }
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            c.bad(
                format!("{path}.header"),
                format!("`{name}` is not a header name"),
            );
        }
        Inject::Header {
            name: name.clone(),
            format,
        }
    } else if let Some(b) = &inj.basic {
        Inject::Basic {
            user: b.user.clone(),
        }
    } else if let Some(q) = &inj.query {
        Inject::Query { param: q.clone() }
    } else if let Some(o) = &inj.oauth2 {
        Inject::OAuth2(oauth2::inject(c, &path, o)?)
    } else if let Some(a) = &inj.aws_sigv4 {
        Inject::AwsSigv4 {
            region: a.region.clone(),
            service: a.service.clone(),
        }
    } else if inj.ssh_key == Some(true) {
        Inject::SshKey
    } else {
        Inject::SshPassword
    };
    let secret = secret::source(c, i, &cr.secret)?;
    Some(Credential {
        id: cr.id.clone(),
        secret,
        inject,
        placeholder: placeholder(c, i, cr),
        placeholder_env: placeholder_env(c, i, cr),
    })
}

/// SPEC §3.7: `postern:<id>` unless the credential names its own (8 or more visible
/// characters, so it cannot be mistaken for a short real value).
fn placeholder(c: &mut Checker<'_>, i: usize, cr: &RawCredential) -> String {
    let Some(p) = &cr.placeholder else {
        return format!("postern:{}", cr.id);
    };
    if p.len() < 8 || !p.bytes().all(|b| b.is_ascii_graphic()) {
        c.bad(
            format!("credentials[{i}].placeholder"),
            "must be at least 8 visible ASCII characters (no spaces)",
        );
    }
    p.clone()
}

/// Two credentials with one placeholder would let an agent's value pick either.
fn distinct_placeholders(c: &mut Checker<'_>, credentials: &[Credential]) {
    let mut seen = BTreeSet::new();
    for (i, cr) in credentials.iter().enumerate() {
        if !seen.insert(cr.placeholder.as_str()) {
            c.bad(
                format!("credentials[{i}].placeholder"),
                format!("`{}` is another credential's placeholder", cr.placeholder),
            );
        }
    }
}

/// Variable names only: `postern env` prints `export NAME=<placeholder>`.
fn placeholder_env(c: &mut Checker<'_>, i: usize, cr: &RawCredential) -> Vec<String> {
    // An AWS SDK reads its access key id from the environment (SPEC §3.8).
    let aws = cr
        .inject
        .aws_sigv4
        .is_some()
        .then(|| vec!["AWS_ACCESS_KEY_ID".to_owned()]);
    let names = cr.placeholder_env.clone().or(aws).unwrap_or_default();
    for (j, name) in names.iter().enumerate() {
        let first_ok = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
        if !first_ok || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            c.bad(
                format!("credentials[{i}].placeholder_env[{j}]"),
                format!("`{name}` is not an environment variable name"),
            );
        }
    }
    names
}

struct Refs<'a> {
    agents: &'a BTreeSet<String>,
    credentials: &'a BTreeSet<String>,
}

impl Refs<'_> {
    fn check_agents(&self, c: &mut Checker<'_>, path: &str, agents: &[String]) {
        for (j, a) in agents.iter().enumerate() {
            if !self.agents.contains(a) {
                c.bad(
                    format!("{path}.agents[{j}]"),
                    format!("no agent with id `{a}`"),
                );
            }
        }
    }

    fn check_credential(&self, c: &mut Checker<'_>, path: String, id: &str) {
        if !self.credentials.contains(id) {
            c.bad(path, format!("no credential with id `{id}`"));
        }
    }
}

/// `approval` of a route or SSH target at `p`.
fn approval(c: &mut Checker<'_>, p: &str, v: Option<&str>) -> Approval {
    match v {
        None | Some("none") => Approval::None,
        Some("required") => Approval::Required,
        Some(other) => {
            c.bad(
                format!("{p}.approval"),
                format!("`{other}` is not \"none\" or \"required\""),
            );
            Approval::None
        }
    }
}

const DEFAULT_IDEMPOTENT: &[&str] = &["GET", "HEAD", "OPTIONS", "PUT", "DELETE"];

/// RFC 9110 methods, PATCH, and WebDAV's (git and CalDAV clients use them).
const KNOWN_METHODS: &[&str] = &[
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "DELETE",
    "CONNECT",
    "OPTIONS",
    "TRACE",
    "PATCH",
    "QUERY",
    "PROPFIND",
    "PROPPATCH",
    "MKCOL",
    "COPY",
    "MOVE",
    "LOCK",
    "UNLOCK",
    "REPORT",
    "SEARCH",
];

fn methods(c: &mut Checker<'_>, path: &str, list: &[String]) -> Vec<String> {
    list.iter()
        .enumerate()
        .map(|(j, m)| {
            let upper = m.to_ascii_uppercase();
            if !KNOWN_METHODS.contains(&upper.as_str()) {
                // A typo ("PSOT") would make the route silently never match.
                let hint = super::decode::closest(&upper, KNOWN_METHODS)
                    .map(|k| format!(" (did you mean `{k}`?)"))
                    .unwrap_or_default();
                c.bad(
                    format!("{path}[{j}]"),
                    format!("`{m}` is not a known HTTP method{hint}"),
                );
            }
            upper
        })
        .collect()
}

/// The header a credential's value goes in, for the modes that set one.
fn injected_header(inject: &Inject) -> Option<&str> {
    match inject {
        Inject::Header { name, .. } => Some(name),
        Inject::Basic { .. } => Some("authorization"),
        Inject::OAuth2(o) => Some(&o.header),
        _ => None,
    }
}

fn route(
    c: &mut Checker<'_>,
    refs: &Refs<'_>,
    defined: &[Credential],
    i: usize,
    r: &RawRoute,
) -> Route {
    let p = format!("routes[{i}]");
    let agents = Agents::new(r.agents.clone());
    refs.check_agents(c, &p, agents.named());
    tunnel::validate(c, &p, r);
    let credentials = match (&r.credential, &r.credentials) {
        (Some(_), Some(_)) => {
            c.bad(
                format!("{p}.credentials"),
                "use either credential or credentials, not both",
            );
            Vec::new()
        }
        (Some(one), None) => vec![one.clone()],
        (None, Some(list)) => list.clone(),
        (None, None) => Vec::new(),
    };
    let key = if r.credential.is_some() {
        "credential"
    } else {
        "credentials"
    };
    for (j, id) in credentials.iter().enumerate() {
        let path = if r.credential.is_some() {
            format!("{p}.{key}")
        } else {
            format!("{p}.{key}[{j}]")
        };
        refs.check_credential(c, path, id);
    }
    let m = &r.matcher;
    let scheme = match m.scheme.as_deref() {
        None | Some("https") => Scheme::Https,
        Some("http") => Scheme::Http,
        Some(other) => {
            c.bad(
                format!("{p}.match.scheme"),
                format!("`{other}` is not \"https\" or \"http\""),
            );
            Scheme::Https
        }
    };
    let host = m.host.clone().unwrap_or_default().to_ascii_lowercase();
    if host.is_empty() {
        c.bad(format!("{p}.match.host"), "a route must match a host");
    }
    let path_prefix = m.path_prefix.clone().unwrap_or_else(|| "/".into());
    if !path_prefix.starts_with('/') {
        c.bad(format!("{p}.match.path_prefix"), "must start with /");
    }
    let matcher = RouteMatch {
        scheme,
        host,
        port: m.port.unwrap_or(match scheme {
            Scheme::Https => 443,
            Scheme::Http => 80,
        }),
        methods: methods(
            c,
            &format!("{p}.match.methods"),
            m.methods.as_deref().unwrap_or(&[]),
        ),
        path_prefix,
    };
    let default_idem: Vec<String> = DEFAULT_IDEMPOTENT.iter().map(|s| s.to_string()).collect();
    let idempotent_methods = methods(
        c,
        &format!("{p}.idempotent_methods"),
        r.idempotent_methods.as_deref().unwrap_or(&default_idem),
    );
    let idempotency = r.idempotency.as_ref().map(|k| Idempotency {
        header: k.header.clone(),
        scope: k.scope.clone(),
        retention: c.duration(
            &format!("{p}.idempotency.retention"),
            Some(&k.retention),
            Duration::ZERO,
        ),
        safe_margin: c.duration(
            &format!("{p}.idempotency.safe_margin"),
            k.safe_margin.as_ref(),
            Duration::ZERO,
        ),
        generate: k.generate,
    });
    if let Some(k) = &idempotency {
        if k.safe_margin >= k.retention {
            c.bad(
                format!("{p}.idempotency.safe_margin"),
                "must be shorter than retention",
            );
        }
        let lower = k.header.to_ascii_lowercase();
        if http::HeaderName::from_bytes(k.header.as_bytes()).is_err() {
            c.bad(
                format!("{p}.idempotency.header"),
                format!("`{}` is not a header name", k.header),
            );
        } else if HOP_BY_HOP.contains(&lower.as_str()) || lower.starts_with("postern-") {
            // The key would be stripped before the origin, yet retries would count on it.
            c.bad(
                format!("{p}.idempotency.header"),
                format!(
                    "`{}` never reaches the origin (hop-by-hop, or postern's own)",
                    k.header
                ),
            );
        } else if let Some(cred) = defined
            .iter()
            .filter(|d| credentials.contains(&d.id))
            .find(|d| injected_header(&d.inject).is_some_and(|h| h.eq_ignore_ascii_case(&lower)))
        {
            // The credential's value would replace the key on the way out.
            c.bad(
                format!("{p}.idempotency.header"),
                format!(
                    "`{}` is the header credential `{}` injects",
                    k.header, cred.id
                ),
            );
        }
    }
    let approval = approval(c, &p, r.approval.as_deref());
    let delivery = match r.delivery.as_deref() {
        None | Some("auto") => Delivery::Auto,
        Some("stream") => Delivery::Stream,
        Some("buffer") => Delivery::Buffer,
        Some(other) => {
            c.bad(
                format!("{p}.delivery"),
                format!("`{other}` is not \"auto\", \"stream\" or \"buffer\""),
            );
            Delivery::Auto
        }
    };
    let mut status_outcomes = BTreeMap::new();
    for (k, v) in r.status_outcomes.iter().flatten() {
        let path = format!("{p}.status_outcomes.{k}");
        let status = k.parse::<u16>().ok().filter(|s| (200..=599).contains(s));
        let outcome = match v.as_str() {
            "committed" => Some(Outcome::Committed),
            "rejected" => Some(Outcome::Rejected),
            _ => None,
        };
        match (status, outcome) {
            (Some(s), Some(o)) => {
                status_outcomes.insert(s, o);
            }
            (None, _) => c.bad(path, "key must be a final HTTP status (200-599)"),
            (_, None) => c.bad(path, format!("`{v}` is not \"committed\" or \"rejected\"")),
        }
    }
    let resolve = r
        .resolve
        .as_deref()
        .map(|s| c.addr(&format!("{p}.resolve"), Some(s), ""));
    let via = via::validate(c, &p, r, defined);
    let upstream_ca = r.upstream_ca.as_deref().map(|s| c.path(s));
    if let Some(ca) = &upstream_ca
        && !ca.is_file()
    {
        c.bad(
            format!("{p}.upstream_ca"),
            format!("no file at {}", ca.display()),
        );
    }
    Route {
        id: r.id.clone(),
        agents,
        credentials,
        matcher,
        idempotent_methods,
        idempotency,
        approval,
        approval_timeout: c.timeout(
            &format!("{p}.approval_timeout"),
            &r.approval_timeout,
            Duration::from_secs(300),
        ),
        retry_budget: r.retry_budget.unwrap_or(3),
        connect_timeout: c.timeout(
            &format!("{p}.connect_timeout"),
            &r.connect_timeout,
            Duration::from_secs(5),
        ),
        response_timeout: c.timeout(
            &format!("{p}.response_timeout"),
            &r.response_timeout,
            Duration::from_secs(30),
        ),
        idle_timeout: c.timeout(
            &format!("{p}.idle_timeout"),
            &r.idle_timeout,
            Duration::from_secs(60),
        ),
        max_relay_lifetime: c.timeout(
            &format!("{p}.max_relay_lifetime"),
            &r.max_relay_lifetime,
            Duration::from_secs(3600),
        ),
        intercept: r.intercept.unwrap_or(true),
        allow_private: r.allow_private.unwrap_or(false),
        delivery,
        upstream_ca,
        resolve,
        via,
        status_outcomes,
        resend_window: c.duration(
            &format!("{p}.resend_window"),
            r.resend_window.as_ref(),
            Duration::from_secs(600),
        ),
        allow_deliberate_resend: r.allow_deliberate_resend.unwrap_or(true),
        rate_limit: rate(c, format!("{p}.rate_limit"), &r.rate_limit),
    }
}

/// A `rate_limit`, checked (SPEC §5.8).
fn rate(c: &mut Checker<'_>, path: String, text: &Option<String>) -> Option<super::Rate> {
    let text = text.as_ref()?;
    super::units::parse_rate(text)
        .map_err(|why| c.bad(path, why))
        .ok()
}
