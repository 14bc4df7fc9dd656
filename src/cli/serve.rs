//! `postern serve` and `postern init`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;

use super::{CliError, Env, Home};
use crate::admin::{self, AdminState, metrics::FrontMetrics};
use crate::cluster::{Cluster, ClusterOptions};
use crate::config::{self, Config};
use crate::http::agent::mitm::{Authority, CaPaths};
use crate::http::deliver::budget::Budget;
use crate::http::{self as proxy_http, Proxy};
use crate::journal::{
    Durability, Journal, JournalOptions, SharedHandle, SharedIndex, SpaceGuard, StoreError,
};
use crate::lifecycle::suspended::Suspended;
use crate::listen::{self, Guarded};
use crate::vault::{KeyState, Vault};

/// Exit code after a storage fault: restart postern so recovery can run.
const EXIT_STORAGE_FAULT: u8 = 70;

fn load(config_path: Option<&Path>, env: Env<'_>) -> Result<Config, CliError> {
    checked(config::load(config_path, env)?)
}

fn checked(config: Config) -> Result<Config, CliError> {
    let problems = crate::policy::route_problems(&config);
    if !problems.is_empty() {
        return Err(config::ConfigErrors(problems).into());
    }
    Ok(config)
}

fn create_home(home: &Home) -> Result<(), CliError> {
    home.create()
        .map_err(|e| CliError::Failed(format!("cannot create {}: {e}", home.root.display())))
}

fn load_ca(home: &Home) -> Result<Authority, CliError> {
    Authority::load_or_create(&CaPaths::in_dir(&home.certs_dir()))
        .map_err(|e| CliError::Failed(format!("cannot load or create the CA: {e}")))
}

/// postern's SSH host key, made on first start (SPEC §5.1).
pub(super) fn load_host_key(home: &Home) -> Result<russh::keys::PrivateKey, CliError> {
    crate::ssh::hostkey::load_or_create(&home.ssh_dir()).map_err(CliError::Failed)
}

pub fn init(config_path: Option<&Path>, home: &Home, env: Env<'_>) -> Result<ExitCode, CliError> {
    // The config is checked, but init uses no token: an `env:` reference unset here stands
    // in as a long dummy value instead of failing.
    let unset = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let lenient = |name: &str| {
        env(name).filter(|v| !v.is_empty()).or_else(|| {
            unset.borrow_mut().insert(name.to_owned());
            Some(format!("postern-init-unset-{name}"))
        })
    };
    load(config_path, &lenient)?;
    create_home(home)?;
    for name in unset.borrow().iter() {
        outln!(
            "postern: {name} is not set; a fresh token for it: export {name}={}",
            fresh_token()
        );
    }
    load_ca(home)?;
    load_host_key(home)?;
    outln!("postern: state directory ready at {}", home.root.display());
    outln!(
        "postern: CA certificate at {}",
        home.certs_dir().join("ca.pem").display()
    );
    outln!(
        "postern: SSH host key at {}",
        crate::ssh::hostkey::key_path(&home.ssh_dir()).display()
    );
    Ok(ExitCode::SUCCESS)
}

/// 32 hex digits from a cryptographic generator: what a token should look like.
fn fresh_token() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `[cluster]` (SPEC §7): connects to the fleet's PostgreSQL and migrates it, or stops
/// here: a node that cannot reach it at start would run without the fleet's guarantees.
async fn join_cluster(config: &Config) -> Result<Option<Arc<Cluster>>, CliError> {
    let Some(c) = &config.cluster else {
        return Ok(None);
    };
    let options = ClusterOptions {
        node: c.node.clone(),
        retention: config.journal.result_retention,
        anchor_retention: config.journal.event_retention,
    };
    let cluster = Cluster::connect(c.postgres.expose(), options)
        .await
        .map_err(|e| CliError::Failed(format!("cluster: {e}")))?;
    outln!(
        "postern: node {} of a fleet (cluster store reached)",
        c.node
    );
    Ok(Some(cluster))
}

/// Claims this node made for invocations its journal never recorded are released, and
/// its chain head is anchored from now on.
async fn settle_cluster_claims(cluster: &Arc<Cluster>, journal: &Journal) -> Result<(), CliError> {
    let released = cluster
        .release_unjournaled(journal)
        .await
        .map_err(|e| CliError::Failed(format!("cluster: {e}")))?;
    if released > 0 {
        tracing::warn!(
            released,
            "released cluster claims of invocations this node never journaled"
        );
    }
    let _ = cluster.anchor_now(journal).await;
    crate::cluster::spawn_anchoring(Arc::downgrade(cluster), journal.clone());
    Ok(())
}

fn open_journal(
    config: &Config,
    home: &Home,
    cluster: Option<Arc<Cluster>>,
) -> Result<Journal, CliError> {
    let options = JournalOptions {
        shared: cluster.map(|c| SharedHandle(c as Arc<dyn SharedIndex>)),
        durability: config.journal.durability,
        result_retention_ms: config.journal.result_retention.as_millis() as i64,
        event_retention_ms: config.journal.event_retention.as_millis() as i64,
        space: Some(SpaceGuard {
            dir: home.journal_dir(),
            reserve_bytes: config.journal.reserve_bytes,
            min_free_bytes: config.journal.min_free_bytes,
            interval: Duration::from_secs(5),
        }),
        ..JournalOptions::default()
    };
    let (journal, report) = Journal::open(&home.journal_dir(), options).map_err(|e| match e {
        StoreError::Locked => CliError::Failed(format!(
            "another postern process is using {} (one daemon per POSTERN_HOME)",
            home.root.display()
        )),
        other => CliError::Failed(format!("cannot open the journal: {other}")),
    })?;
    for (id, code) in &report.recovered {
        tracing::warn!(invocation = %id, code = code.as_str(), "recovered an invocation that was live when postern stopped");
    }
    if !report.recovered.is_empty() {
        errln!(
            "postern: recovery settled {} invocation(s)",
            report.recovered.len()
        );
    }
    Ok(journal)
}

/// Logs go to stderr, as text or (with `POSTERN_LOG_FORMAT=json`) one JSON object a line;
/// `RUST_LOG` filters them (`postern::access=off` silences the access log).
fn init_tracing(json: bool) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,fjall=warn,lsm_tree=warn"));
    // The AWS signer traces the request it signs with the real key id: never above warn,
    // whatever RUST_LOG asks (no secret, nor the key pair's id, reaches a log).
    if let Ok(cap) = "aws_sigv4=warn".parse() {
        filter = filter.add_directive(cap);
    }
    // Colours only for a terminal: a log file or collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

pub fn run(config_path: Option<&Path>, home: &Home, env: Env<'_>) -> Result<ExitCode, CliError> {
    super::home::not_dumpable().map_err(CliError::Failed)?;
    init_tracing(env("POSTERN_LOG_FORMAT").as_deref() == Some("json"));
    // A reload reads only this file, through the directory held here (config::Anchor).
    let anchor = config_path
        .map(config::Anchor::take)
        .transpose()
        .map_err(|p| config::ConfigErrors(vec![p]))?;
    let config = checked(config::load_anchored(anchor.as_ref(), env)?)?;
    warn_unbuilt(&config);
    warn_shell_syntax(&config);
    create_home(home)?;
    let vault = Arc::new(Vault::new(&home.root, env("POSTERN_VAULT_KEY")));
    check_vault(&config, &vault)?;
    let authority = Arc::new(load_ca(home)?);
    let host_key = load_host_key(home)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("cannot start the runtime: {e}")))?;
    let cluster = runtime.block_on(join_cluster(&config))?;
    let journal = open_journal(&config, home, cluster.clone())?;
    if let Some(cluster) = &cluster {
        runtime.block_on(settle_cluster_claims(cluster, &journal))?;
    }
    let hint = super::env::eval_hint(&config, config_path, env);
    runtime.block_on(serve_until_stopped(
        Arc::new(config),
        journal,
        authority,
        vault,
        host_key,
        Banner {
            home: home.clone(),
            anchor,
            hint,
        },
    ))
}

/// A wrong key is an error here; a missing key or secret is a warning, since secrets may
/// be added while postern runs (SPEC §5.5). Names only, never a value.
fn check_vault(config: &Config, vault: &Vault) -> Result<(), CliError> {
    super::home::refuse_wrong_key(vault)?;
    let uses_vault = !admin::secret_names(config).is_empty();
    if uses_vault && vault.key_state().ok() == Some(KeyState::NoKey) {
        errln!(
            "postern: warning: POSTERN_VAULT_KEY is not set: the vault is locked and credentialed routes fail with VAULT_LOCKED"
        );
    }
    for warning in admin::missing_secrets(config, vault) {
        errln!("postern: warning: {warning}");
    }
    Ok(())
}

/// What the start banner shows besides the listeners.
struct Banner {
    home: Home,
    /// The config file a reload reads again.
    anchor: Option<config::Anchor>,
    /// `eval "$(postern env --agent ID …)"` for the agent's shell.
    hint: String,
}

/// `SIGHUP` reloads the config, as `postern reload` does. Installed before the banner
/// says the daemon serves, so a SIGHUP from then on never takes the default (exit).
fn reload_on_hangup(reloader: Arc<admin::reload::Reloader>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; reload with `postern reload`");
        return;
    };
    tokio::spawn(async move { hangup_loop(&mut hangups, reloader).await });
}

async fn hangup_loop(
    hangups: &mut tokio::signal::unix::Signal,
    reloader: Arc<admin::reload::Reloader>,
) {
    while hangups.recv().await.is_some() {
        if let Err(report) = reloader.reload().await {
            errln!("postern: config reload refused, the old config stays: {report}");
        }
    }
}

/// An admin API without a token while agents are configured: any local process, an agent
/// included, could then approve its own held requests.
fn warn_unbuilt(config: &Config) {
    if config.admin.token.is_none() && !config.agents.is_empty() {
        errln!(
            "postern: WARNING: [admin] has no token, so any local process (agents included) can approve held requests and reconcile outcomes; set [admin] token = \"env:POSTERN_ADMIN_TOKEN\""
        );
    }
}

/// A target with `shell_syntax = true` whose patterns admit a shell character lets an agent
/// chain any command after one that matches (`^echo .*$` admits `echo x; whoami`).
fn warn_shell_syntax(config: &Config) {
    for (i, t) in config.ssh_targets.iter().enumerate() {
        if !t.shell_syntax {
            continue;
        }
        for (j, re) in t.commands.iter().enumerate() {
            if let Some(c) = crate::config::admitted_by(re.as_str()) {
                errln!(
                    "postern: WARNING: ssh_targets[{i}] ({}): shell_syntax = true and commands[{j}] admits `{}`, so an agent may run any command after one the pattern matches",
                    t.id,
                    c.escape_default()
                );
            }
        }
    }
}

async fn bind(addr: std::net::SocketAddr, key: &str) -> Result<tokio::net::TcpListener, CliError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::Failed(format!("cannot listen on {addr} ({key}): {e}")))
}

async fn serve_until_stopped(
    config: Arc<Config>,
    journal: Journal,
    authority: Arc<Authority>,
    vault: Arc<Vault>,
    host_key: russh::keys::PrivateKey,
    mut banner: Banner,
) -> Result<ExitCode, CliError> {
    let proxy_listener = bind(config.proxy.listen, "[proxy] listen").await?;
    let ssh_listener = bind(config.ssh.listen, "[ssh] listen").await?;
    let admin_listener = bind(config.admin.listen, "[admin] listen").await?;
    let proxy_addr = proxy_listener.local_addr().unwrap_or(config.proxy.listen);
    let ssh_addr = ssh_listener.local_addr().unwrap_or(config.ssh.listen);
    let admin_addr = admin_listener.local_addr().unwrap_or(config.admin.listen);
    let front = FrontMetrics::default();
    let (mut proxy_listener, admin_listener) =
        guard(&config, proxy_listener, admin_listener, &front);
    let ssh_listener = guard_ssh(ssh_listener, &front).sharing_cap_of(&mut proxy_listener);
    let approvals = Arc::new(crate::policy::approvals::Approvals::default());
    let dns = Arc::new(crate::dns::Dns::new(config.dns.as_ref()));
    let live = Arc::new(crate::config::Live::new((*config).clone()));
    let exec = Arc::new(crate::ssh::Exec {
        live: live.clone(),
        journal: journal.clone(),
        vault: vault.clone(),
        approvals: approvals.clone(),
        sessions: Default::default(),
        dns: dns.clone(),
        guards: Default::default(),
    });
    // One bound per agent over HTTP and SSH alike.
    let busy = crate::listen::BusyPerAgent::new(busy_limit(&config), front.busy.clone());
    // One set of `rate_limit` buckets over HTTP and SSH alike.
    let rates = Arc::new(crate::lifecycle::rate_limit::RateLimits::default());
    // The kill switch's set as the journal left it: a suspension survives a restart.
    let suspended = Suspended::load(&journal, &approvals)
        .map_err(|e| CliError::Failed(format!("cannot read the suspended agents: {e}")))?;
    let suspended = Arc::new(suspended);
    let ssh_front = Arc::new(crate::ssh::SshFront::new(
        live.clone(),
        journal.clone(),
        host_key,
        exec.clone(),
        busy.clone(),
        front.ssh_refusals_unjournaled.clone(),
        (rates.clone(), suspended.clone()),
    ));
    let proxy = Arc::new(Proxy {
        live: live.clone(),
        journal: journal.clone(),
        authority,
        tls: Default::default(),
        pool: Default::default(),
        dns,
        vault: vault.clone(),
        budget: Budget::new(
            config.proxy.buffer_budget,
            config.proxy.agent_buffer_budget,
            config.proxy.buffer_wait,
            &front,
        ),
        metrics: front.clone(),
        approvals: approvals.clone(),
        failed_logins: crate::lifecycle::refusals::RefusalRate::failed_logins(),
        refusals: crate::lifecycle::refusals::RefusalRate::refusals(),
        guards: Default::default(),
        minter: Default::default(),
        rates,
        suspended: suspended.clone(),
        busy,
        departures: Default::default(),
    });
    let reload_counter = admin::reload::ReloadCounter::default();
    let reloader = Arc::new(admin::reload::Reloader {
        anchor: banner.anchor.take(),
        live: live.clone(),
        started: live.current(),
        on_swap: {
            let proxy = proxy.clone();
            Box::new(move || proxy.forget_upstreams())
        },
        counter: reload_counter.clone(),
        journal: journal.clone(),
        running: Default::default(),
        vault: vault.clone(),
    });
    reload_on_hangup(reloader.clone());
    let mut registry = admin::metrics::registry(journal.metrics(), &front, &reload_counter);
    if let Some(shared) = journal.shared() {
        shared.register_metrics(&mut registry);
    }
    start_audit_export(&config, &journal, &banner.home, &mut registry);
    let state = Arc::new(AdminState {
        registry,
        journal: journal.clone(),
        live: live.clone(),
        approvals: approvals.clone(),
        suspended,
        vault: vault.clone(),
        reloader: reloader.clone(),
        resend: Arc::new(crate::lifecycle::retry::Transports {
            http: Arc::new(crate::http::exchange::retry::HttpResend(proxy.clone())),
            ssh: Arc::new(crate::ssh::retry::SshResend(exec)),
        }),
        console: admin::Sessions::default(),
        auth_failures: front.admin_auth_failures.clone(),
    });
    tokio::spawn(admin::serve(admin_listener, state));
    tokio::spawn(proxy_http::serve(proxy_listener, proxy));
    tokio::spawn(crate::ssh::serve(ssh_listener, ssh_front));
    tokio::spawn(expire_results(
        journal.clone(),
        config.journal.event_retention,
    ));
    tokio::spawn(expire_index_entries(journal.clone()));
    let shutdown = Shutdown::install();
    let durability = match config.journal.durability {
        Durability::Fsync => "fsync",
        Durability::Buffered => "buffered",
    };
    outln!("postern {} serving", env!("CARGO_PKG_VERSION"));
    outln!("  proxy    http://{proxy_addr}");
    outln!("  ssh      {ssh_addr}");
    outln!("  admin    http://{admin_addr}");
    outln!(
        "  journal  {} (durability {durability})",
        banner.home.journal_dir().display()
    );
    if let Some(endpoint) = &config.audit.otlp_endpoint {
        outln!("  audit    {endpoint} (OTLP logs)");
    }
    outln!("agent environment (in the agent's shell):");
    outln!("  {}", banner.hint);
    if config.agents.is_empty() {
        for line in super::env::lines(&banner.home, proxy_addr, None) {
            outln!("  {line}");
        }
    }
    let fatal = journal.health().clone();
    tokio::select! {
        () = shutdown.wait() => {
            let flushed = journal.flush().await;
            errln!("postern: stopping; journal flushed");
            Ok(if flushed.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_STORAGE_FAULT) })
        }
        () = fatal.fatal_notify.notified() => {
            errln!(
                "postern: journal storage fault ({}); exiting for a restart",
                fatal.reason().unwrap_or_default()
            );
            Ok(ExitCode::from(EXIT_STORAGE_FAULT))
        }
    }
}

/// `[audit] otlp_endpoint` (SPEC §5.8): the export runs beside the request path, on its
/// own task, with its metrics on `/metrics`.
fn start_audit_export(config: &Config, journal: &Journal, home: &Home, registry: &mut Registry) {
    let Some(endpoint) = &config.audit.otlp_endpoint else {
        return;
    };
    let metrics = crate::audit::ExportMetrics::default();
    metrics.register(registry);
    let exporter = crate::audit::Exporter {
        journal: journal.clone(),
        endpoint: endpoint.clone(),
        dir: home.audit_dir(),
        node: config.cluster.as_ref().map(|c| c.node.clone()),
        metrics,
    };
    tokio::spawn(exporter.run());
}

/// Caps both listeners; the proxy's cap leaves descriptors for upstreams and the admin API.
fn guard(
    config: &Config,
    proxy: tokio::net::TcpListener,
    admin: tokio::net::TcpListener,
    front: &FrontMetrics,
) -> (Guarded, Guarded) {
    let nofile = listen::raise_nofile();
    let admin_cap = config.admin.max_connections;
    let derived = listen::proxy_cap(None, nofile, admin_cap);
    let cap = listen::proxy_cap(config.proxy.max_connections, nofile, admin_cap);
    if cap > derived {
        tracing::warn!(
            max_connections = cap,
            safe = derived,
            nofile = nofile.unwrap_or(0),
            "[proxy] max_connections exceeds what the descriptor limit can hold with upstreams"
        );
    }
    tracing::info!(proxy = cap, admin = admin_cap, "connection caps");
    let proxy = Guarded::new(proxy, cap, "proxy", front.proxy_refused.clone())
        .count_errors(front.accept_errors.clone())
        .count_open(front.proxy_open.clone());
    let admin = Guarded::new(admin, admin_cap, "admin", front.admin_refused.clone())
        .count_errors(front.accept_errors.clone());
    (proxy, admin)
}

/// Connections one agent may keep busy: configured, or a quarter of the connection cap.
fn busy_limit(config: &Config) -> usize {
    config.proxy.max_busy_per_agent.unwrap_or_else(|| {
        let cap = listen::proxy_cap(
            config.proxy.max_connections,
            listen::raise_nofile(),
            config.admin.max_connections,
        );
        (cap / 4).max(1)
    })
}

/// The SSH front counts against the proxy's cap (its connections hold an upstream too);
/// over it a connection gets an `ERR` line.
fn guard_ssh(ssh: tokio::net::TcpListener, front: &FrontMetrics) -> Guarded {
    Guarded::new(ssh, 0, "ssh", front.proxy_refused.clone())
        .count_errors(front.accept_errors.clone())
        .refusal(crate::ssh::front::OVER_CAP)
}

/// The retention sweeps of events and results: every minute, or a quarter of a shorter
/// event retention.
async fn expire_results(journal: Journal, event_retention: Duration) {
    let every = (event_retention / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if let Err(e) = journal.prune_events().await {
            tracing::warn!(error = %e, "event retention sweep failed");
        }
        if let Err(e) = journal.expire_results().await {
            tracing::warn!(error = %e, "result retention sweep failed");
        }
    }
}

/// How long an expired key or twin index entry may stay: the indexes hold what was used
/// within their windows and this (docs/sdk.md, docs/retries.md).
const INDEX_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The key and twin index sweeps. Lookups ignore an expired entry already; this reclaims
/// its space, often enough that a short window (a resend window of seconds) bounds the
/// index by its own length rather than the sweep's.
async fn expire_index_entries(journal: Journal) {
    let mut tick = tokio::time::interval(INDEX_SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = journal.expire_keys().await {
            tracing::warn!(error = %e, "idempotency key retention sweep failed");
        }
        if let Err(e) = journal.expire_twins().await {
            tracing::warn!(error = %e, "resend twin window sweep failed");
        }
    }
}

/// SIGTERM/SIGINT, installed before the banner: a supervisor that signals as soon as it
/// sees the banner must get a clean stop, not the default (killed by the signal).
struct Shutdown {
    #[cfg(unix)]
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Shutdown {
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let signals = signal(SignalKind::terminate())
                .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)))
                .ok();
            Self { signals }
        }
        #[cfg(not(unix))]
        Self {}
    }

    async fn wait(self) {
        #[cfg(unix)]
        if let Some((mut term, mut int)) = self.signals {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}
