//! The config file as written: serde structs that refuse unknown keys.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::units::Quantity;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProxy {
    pub listen: Option<String>,
    pub max_request_bytes: Option<Quantity>,
    pub max_connections: Option<u32>,
    pub max_busy_per_agent: Option<u32>,
    pub header_read_timeout: Option<Quantity>,
    pub tls_handshake_timeout: Option<Quantity>,
    pub request_body_timeout: Option<Quantity>,
    pub buffer_budget: Option<Quantity>,
    pub buffer_wait: Option<Quantity>,
    pub agent_buffer_budget: Option<Quantity>,
    pub min_upload_rate: Option<Quantity>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSsh {
    pub listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub listen: Option<String>,
    pub token: Option<String>,
    pub max_connections: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJournal {
    pub durability: Option<String>,
    pub result_retention: Option<Quantity>,
    pub event_retention: Option<Quantity>,
    pub max_result_bytes: Option<Quantity>,
    pub buffer_limit: Option<Quantity>,
    pub min_free_bytes: Option<Quantity>,
    pub reserve_bytes: Option<Quantity>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    pub postgres: String,
    pub node: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAudit {
    pub otlp_endpoint: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDns {
    pub servers: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAgent {
    pub id: String,
    pub token: String,
    pub rate_limit: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCredential {
    pub id: String,
    /// A string (vault name, `file:`, `env:`) or a `{ command, ttl }` table, told apart
    /// in `validate::secret` so each form gets its own error.
    pub secret: toml::Value,
    pub inject: RawInject,
    pub placeholder: Option<String>,
    pub placeholder_env: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCommandSecret {
    pub command: Vec<String>,
    pub ttl: Option<Quantity>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInject {
    pub header: Option<String>,
    pub format: Option<String>,
    pub basic: Option<RawBasic>,
    pub query: Option<String>,
    pub ssh_key: Option<bool>,
    pub ssh_password: Option<bool>,
    pub aws_sigv4: Option<RawSigv4>,
    pub oauth2: Option<RawOAuth2>,
}

/// `inject = { oauth2 = { grant = "…", token_url = "https://…", … } }` (SPEC §3.8).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOAuth2 {
    pub grant: String,
    pub token_url: String,
    pub scope: Option<String>,
    pub audience: Option<String>,
    pub header: Option<String>,
    pub format: Option<String>,
}

/// `inject = { aws_sigv4 = {} }`, optionally pinning the signing scope (SPEC §3.8).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSigv4 {
    pub region: Option<String>,
    pub service: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBasic {
    pub user: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub methods: Option<Vec<String>>,
    pub path_prefix: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdempotency {
    pub header: String,
    pub scope: String,
    pub retention: Quantity,
    pub safe_margin: Option<Quantity>,
    #[serde(default)]
    pub generate: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub id: String,
    pub agents: Option<Vec<String>>,
    pub credential: Option<String>,
    pub credentials: Option<Vec<String>>,
    #[serde(rename = "match")]
    pub matcher: RawMatch,
    pub idempotent_methods: Option<Vec<String>>,
    pub idempotency: Option<RawIdempotency>,
    pub approval: Option<String>,
    pub approval_timeout: Option<Quantity>,
    pub retry_budget: Option<u32>,
    pub connect_timeout: Option<Quantity>,
    pub response_timeout: Option<Quantity>,
    pub idle_timeout: Option<Quantity>,
    pub max_relay_lifetime: Option<Quantity>,
    pub intercept: Option<bool>,
    pub allow_private: Option<bool>,
    pub delivery: Option<String>,
    pub upstream_ca: Option<String>,
    pub resolve: Option<String>,
    pub via: Option<String>,
    pub via_credential: Option<String>,
    pub status_outcomes: Option<BTreeMap<String, String>>,
    pub resend_window: Option<Quantity>,
    pub allow_deliberate_resend: Option<bool>,
    pub rate_limit: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSshTarget {
    pub id: String,
    pub host: String,
    pub port: Option<u16>,
    pub user: String,
    pub agents: Option<Vec<String>>,
    pub credential: Option<String>,
    pub known_hosts: Option<String>,
    pub resolve: Option<String>,
    pub allow: Option<Vec<String>>,
    pub commands: Option<Vec<String>>,
    pub shell_syntax: Option<bool>,
    pub approval: Option<String>,
    pub approval_timeout: Option<Quantity>,
    pub retry_budget: Option<u32>,
    pub connect_timeout: Option<Quantity>,
    pub response_timeout: Option<Quantity>,
    pub idle_timeout: Option<Quantity>,
}
