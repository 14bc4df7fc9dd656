//! The validated config: every cross-field rule already checked.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::contract::Outcome;
use crate::journal::Durability;

/// A secret from the config (an agent or admin token). Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compares in constant time: digests of equal length, so the time tells neither where
    /// a guess differs nor how long the token is.
    pub fn matches(&self, candidate: &str) -> bool {
        use sha2::{Digest, Sha256};
        use subtle::ConstantTimeEq;
        let (a, b) = (Sha256::digest(&self.0), Sha256::digest(candidate));
        a.as_slice().ct_eq(b.as_slice()).into()
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretValue([redacted])")
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from; relative paths resolved against its directory.
    pub source: Option<PathBuf>,
    pub proxy: ProxyConfig,
    pub ssh: SshConfig,
    pub admin: AdminConfig,
    pub journal: JournalConfig,
    pub dns: Option<DnsConfig>,
    /// A fleet on PostgreSQL (SPEC §7); none on a node alone.
    pub cluster: Option<ClusterConfig>,
    pub audit: AuditConfig,
    pub agents: Vec<Agent>,
    pub credentials: Vec<Credential>,
    pub routes: Vec<Route>,
    pub ssh_targets: Vec<SshTarget>,
}

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    pub max_request_bytes: u64,
    /// Open agent connections; `None`: derived from `RLIMIT_NOFILE` at start.
    pub max_connections: Option<usize>,
    /// Connections one agent may keep busy (requests running, tunnels, WebSockets);
    /// `None`: a quarter of the cap.
    pub max_busy_per_agent: Option<usize>,
    /// Longest wait for a complete request head (also the HTTP/1 keep-alive idle time).
    pub header_read_timeout: Duration,
    /// Longest wait for the agent's TLS handshake after `CONNECT … 200`.
    pub tls_handshake_timeout: Duration,
    /// Longest gap between request body bytes before dispatch.
    pub request_body_timeout: Duration,
    /// Bytes held in memory at once: request bodies and buffered responses together.
    pub buffer_budget: u64,
    /// How long a request body waits for budget before it is refused.
    pub buffer_wait: Duration,
    /// Of `buffer_budget`, what one agent's request bodies may hold at once.
    pub agent_buffer_budget: u64,
    /// A request body slower than this on average (bytes/s), once `request_body_timeout`
    /// has passed since its first byte was awaited, is cut: it holds budget for nothing.
    pub min_upload_rate: u64,
}

#[derive(Debug, Clone)]
pub struct SshConfig {
    pub listen: SocketAddr,
}

#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    pub token: Option<SecretValue>,
    pub max_connections: usize,
}

#[derive(Debug, Clone)]
pub struct JournalConfig {
    pub durability: Durability,
    pub result_retention: Duration,
    /// Events (and the settled records they make) older than this are pruned behind a
    /// checkpoint.
    pub event_retention: Duration,
    pub max_result_bytes: u64,
    pub buffer_limit: u64,
    /// Below this much free disk, new dispatches are refused.
    pub min_free_bytes: u64,
    /// The reserve file released when space runs low.
    pub reserve_bytes: u64,
}

/// `[cluster]` (SPEC §7).
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The PostgreSQL connection URL (it may carry a password: kept as a secret).
    pub postgres: SecretValue,
    /// This node's id, unique in the fleet: `[a-z0-9-]{1,16}`.
    pub node: String,
}

/// `[audit]` (SPEC §5.8).
#[derive(Debug, Clone, Default)]
pub struct AuditConfig {
    /// The OTLP/HTTP receiver every journal event is sent to; none: no export.
    pub otlp_endpoint: Option<OtlpEndpoint>,
}

/// An OTLP/HTTP receiver's base URL, split up: logs go to `{base_path}/v1/logs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint {
    pub scheme: Scheme,
    /// Lower case; an IPv6 address without brackets.
    pub host: String,
    pub port: u16,
    /// The URL's path without its trailing `/` (empty for none).
    pub base_path: String,
}

impl OtlpEndpoint {
    /// The request target of an export. An endpoint given with the signal path already
    /// (`…/v1/logs`, as some collectors document it) is taken as it is.
    pub fn logs_path(&self) -> String {
        match self.base_path.ends_with("/v1/logs") {
            true => self.base_path.clone(),
            false => format!("{}/v1/logs", self.base_path),
        }
    }

    /// `host:port` as a `Host` header writes it.
    pub fn authority(&self) -> String {
        match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.port),
            false => format!("{}:{}", self.host, self.port),
        }
    }
}

impl std::fmt::Display for OtlpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}{}", self.authority(), self.base_path)
    }
}

#[derive(Debug, Clone)]
pub struct DnsConfig {
    pub servers: Vec<SocketAddr>,
}

#[derive(Debug, Clone)]
pub struct Agent {
    pub id: String,
    pub token: SecretValue,
    /// Requests and SSH execs this agent may start (SPEC §5.8); `None`: unlimited.
    pub rate_limit: Option<super::Rate>,
}

#[derive(Debug, Clone)]
pub struct Credential {
    pub id: String,
    /// Where the secret comes from (never its value, except an `env:` one, kept redacted).
    pub secret: SecretSource,
    pub inject: Inject,
    /// What an agent sends where the secret goes (SPEC §3.7); not secret.
    pub placeholder: String,
    /// Environment variables an SDK reads its key from, set to the placeholder by
    /// `postern env --agent` (e.g. `OPENAI_API_KEY`).
    pub placeholder_env: Vec<String>,
}

/// A credential's `secret` (SPEC §3.8 secret sources).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// A vault entry's name.
    Vault(String),
    /// `file:PATH`: read when used, so a rewritten file counts from the next request.
    File(PathBuf),
    /// `env:NAME`: read when the config is (start, reload); `None` when unset or empty.
    Env {
        name: String,
        value: Option<SecretValue>,
    },
    /// `{ command = [...], ttl = "5m" }`: run without a shell; stdout kept for `ttl`.
    Command { argv: Vec<String>, ttl: Duration },
}

impl SecretSource {
    /// How operators see the source: the vault name, `file:PATH`, `env:NAME` or
    /// `command:PROGRAM` (the program only: arguments may say more than they should).
    pub fn label(&self) -> String {
        match self {
            Self::Vault(name) => name.clone(),
            Self::File(path) => format!("file:{}", path.display()),
            Self::Env { name, .. } => format!("env:{name}"),
            Self::Command { argv, .. } => {
                format!("command:{}", argv.first().map_or("", String::as_str))
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inject {
    Header {
        name: String,
        format: String,
    },
    Basic {
        user: String,
    },
    Query {
        param: String,
    },
    SshKey,
    SshPassword,
    /// SPEC §3.8: the agent's SDK signs with the placeholder as its access key id; postern
    /// re-signs with the real key pair. `region`/`service` pin the scope when set.
    AwsSigv4 {
        region: Option<String>,
        service: Option<String>,
    },
    /// SPEC §3.8: postern mints a short-lived access token from the vault entry's grant
    /// material and injects it; the agent sends the placeholder where it goes.
    OAuth2(OAuth2),
}

/// A minted credential: how postern asks for the token, and where the token goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuth2 {
    pub grant: Grant,
    /// `https://…`, matched by some route (its `resolve`, `upstream_ca`, timeouts apply).
    pub token_url: String,
    pub scope: Option<String>,
    pub audience: Option<String>,
    /// The header the token goes in (default `Authorization`).
    pub header: String,
    /// Its value, with `{token}` for the token (default `Bearer {token}`).
    pub format: String,
}

/// The OAuth2 grant postern mints with; each names the vault entry's shape (SPEC §3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// RFC 6749 §4.4: the vault entry is `{"client_id","client_secret"}`.
    ClientCredentials,
    /// RFC 6749 §6: `{"client_id","client_secret"?,"refresh_token"}`; a rotated refresh
    /// token is stored back as a new vault version.
    RefreshToken,
    /// RFC 7523: a Google service-account key file; postern signs the RS256 assertion.
    JwtBearer,
    /// GitHub App installation tokens: `{"app_id","installation_id","private_key"}`.
    GithubApp,
}

impl Grant {
    pub const ALL: [Grant; 4] = [
        Self::ClientCredentials,
        Self::RefreshToken,
        Self::JwtBearer,
        Self::GithubApp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClientCredentials => "client_credentials",
            Self::RefreshToken => "refresh_token",
            Self::JwtBearer => "jwt_bearer",
            Self::GithubApp => "github_app",
        }
    }
}

impl Inject {
    pub fn mode(&self) -> &'static str {
        match self {
            Self::Header { .. } => "header",
            Self::Basic { .. } => "basic",
            Self::Query { .. } => "query",
            Self::SshKey => "ssh_key",
            Self::SshPassword => "ssh_password",
            Self::AwsSigv4 { .. } => "aws_sigv4",
            Self::OAuth2(_) => "oauth2",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// Which agents a route or SSH target admits (SPEC §5.4): without `agents`, every agent;
/// with a list, those it names — `[]` names none (a route only postern itself uses, such as
/// an OAuth2 token endpoint).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Agents(Option<Vec<String>>);

impl Agents {
    pub fn new(listed: Option<Vec<String>>) -> Self {
        Self(listed)
    }

    pub fn admits(&self, agent: &str) -> bool {
        self.0.as_ref().is_none_or(|l| l.iter().any(|a| a == agent))
    }

    /// No `agents` key: every agent.
    pub fn is_every(&self) -> bool {
        self.0.is_none()
    }

    /// The agents named (none for every agent).
    pub fn named(&self) -> &[String] {
        self.0.as_deref().unwrap_or(&[])
    }

    /// Some agent is admitted by both.
    pub fn overlap(&self, other: &Agents) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (None, Some(l)) | (Some(l), None) => !l.is_empty(),
            (Some(a), Some(b)) => a.iter().any(|v| b.contains(v)),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RouteMatch {
    pub scheme: Scheme,
    pub host: String,
    pub port: u16,
    /// Empty: any method.
    pub methods: Vec<String>,
    pub path_prefix: String,
}

#[derive(Debug, Clone)]
pub struct Idempotency {
    pub header: String,
    pub scope: String,
    pub retention: Duration,
    pub safe_margin: Duration,
    pub generate: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    None,
    Required,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Auto,
    Stream,
    Buffer,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub id: String,
    pub agents: Agents,
    /// Offered credentials; more than one means the agent picks with `Postern-Credential`.
    pub credentials: Vec<String>,
    pub matcher: RouteMatch,
    pub idempotent_methods: Vec<String>,
    pub idempotency: Option<Idempotency>,
    pub approval: Approval,
    pub approval_timeout: Duration,
    pub retry_budget: u32,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub idle_timeout: Duration,
    /// The longest a tunnel or WebSocket relay on this route may run (closed by postern).
    pub max_relay_lifetime: Duration,
    pub intercept: bool,
    pub allow_private: bool,
    pub delivery: Delivery,
    pub upstream_ca: Option<PathBuf>,
    pub resolve: Option<SocketAddr>,
    /// The upstream proxy hop the route's traffic goes through (SPEC §3.6).
    pub via: Option<Via>,
    pub status_outcomes: BTreeMap<u16, Outcome>,
    /// How long an invocation stays the twin of identical resends (SPEC §3.7); zero: off.
    pub resend_window: Duration,
    /// `Postern-Resend: deliberate` is honoured (else ignored: the resend is judged).
    pub allow_deliberate_resend: bool,
    /// Requests this route takes, from every agent together (SPEC §5.8); `None`: unlimited.
    pub rate_limit: Option<super::Rate>,
}

/// A `via` hop: `http://host:port`, and the Basic credential sent to it alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Via {
    /// Lower-case, IPv6 without brackets.
    pub host: String,
    pub port: u16,
    /// A credential id of inject mode `basic` (`via_credential`).
    pub credential: Option<String>,
}

impl Via {
    /// `host:port`, the hop's name in evidence (`proxy:<name>`) unless it names itself.
    pub fn name(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// What an agent may ask of an SSH target besides nothing (`allow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SshAction {
    Exec,
    Shell,
    PortForward,
    Subsystem,
}

impl SshAction {
    pub const ALL: &'static [SshAction] =
        &[Self::Exec, Self::Shell, Self::PortForward, Self::Subsystem];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::Shell => "shell",
            Self::PortForward => "port_forward",
            Self::Subsystem => "subsystem",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|a| a.as_str() == s)
    }

    /// Whether postern runs this action; the others are named so config can say "not yet".
    pub fn is_built(self) -> bool {
        self == Self::Exec
    }
}

/// An upstream SSH server agents may run commands on (`[[ssh_targets]]`).
#[derive(Debug, Clone)]
pub struct SshTarget {
    pub id: String,
    /// Lower-case host, as the agent names it in `ssh user@host`.
    pub host: String,
    pub port: u16,
    pub user: String,
    pub agents: Agents,
    /// A credential with inject mode `ssh_key` or `ssh_password`.
    pub credential: String,
    /// The upstream host keys postern accepts (strict: anything else is refused).
    pub known_hosts: PathBuf,
    pub resolve: Option<SocketAddr>,
    pub allow: Vec<SshAction>,
    /// Whole-command patterns (anchored); empty: any command.
    pub commands: Vec<regex::Regex>,
    /// Whether a command with shell syntax may meet `commands` (which see only the raw string).
    pub shell_syntax: bool,
    pub approval: Approval,
    pub approval_timeout: Duration,
    pub retry_budget: u32,
    pub connect_timeout: Duration,
    /// Exec wall time until `exit-status`.
    pub response_timeout: Duration,
    /// Longest gap in the command's output.
    pub idle_timeout: Duration,
}

impl SshTarget {
    pub fn allows(&self, action: SshAction) -> bool {
        self.allow.contains(&action)
    }

    /// `ssh://user@host:port`, the record's `target`.
    pub fn url(&self) -> String {
        format!("ssh://{}@{}:{}", self.user, self.host, self.port)
    }

    /// Whether `commands` lets this command run (no patterns: any command).
    pub fn permits_command(&self, command: &str) -> bool {
        self.command_refusal(command).is_none()
    }

    /// Why `commands` refuse this command (`ROUTE_DENIED`, field `command`), if they do.
    /// Shell syntax is refused first: a pattern sees the raw string, the remote shell runs
    /// every command in it.
    pub fn command_refusal(&self, command: &str) -> Option<CommandRefusal> {
        if self.commands.is_empty() {
            return None;
        }
        if !self.shell_syntax
            && let Some(c) = super::shell_syntax_in(command)
        {
            return Some(CommandRefusal::ShellSyntax(c));
        }
        let listed = self.commands.iter().any(|r| r.is_match(command));
        (!listed).then_some(CommandRefusal::NotListed)
    }
}

/// Why a target's `commands` refuse a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandRefusal {
    /// The command holds this shell-syntax character and the target has no `shell_syntax = true`.
    ShellSyntax(char),
    /// No pattern matches the command.
    NotListed,
}

/// Hop-by-hop headers (RFC 9110 §7.6.1): postern never sends them on (nor `postern-*`).
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];
