//! The SSH front: the listener `postern ssh-connect` talks to. It reads the preamble,
//! identifies the agent and matches a target (refusals: `ERR <envelope>`), answers `OK`, then
//! runs the agent's SSH session over the same connection.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use russh::keys::ssh_key::PrivateKey;
use russh::{MethodKind, MethodSet};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::dispatch::ExecDispatch;
use super::preamble::{MAX_LINE, Preamble};
use super::refuse::{self, Refused};
use super::session::AgentSession;
use crate::config::{Config, SshTarget};
use crate::contract::{Code, Envelope, unjournaled_refusal};
use crate::lifecycle::rate_limit::RateLimits;
use crate::lifecycle::suspended::Suspended;
use crate::listen::Guarded;
use crate::policy::{AgentAuth, authenticate_pair};

/// How long a new connection may take to send its preamble line.
pub const PREAMBLE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a connection over the SSH front's cap is told before the close.
pub const OVER_CAP: &[u8] =
    b"ERR postern: the SSH front is at its connection cap ([proxy] max_connections); retry later\n";

use crate::lifecycle::refusals::{RefusalRate, UNAUTHENTICATED};
use crate::listen::{BusyPerAgent, over_busy_limit};

/// Everything an agent connection needs.
pub struct SshFront {
    /// The config in force; a session keeps the target it was admitted to.
    pub live: Arc<crate::config::Live>,
    pub journal: crate::journal::Journal,
    pub dispatch: Arc<dyn ExecDispatch>,
    server: Arc<russh::server::Config>,
    /// Wrong-token preambles journaled per source address (bounded), as for HTTP.
    failed_logins: RefusalRate,
    /// Connections each agent keeps busy, shared with the HTTP proxy.
    busy: Arc<BusyPerAgent>,
    /// Refusals inside sessions journaled per agent (bounded); the rest counted.
    refusals: Arc<RefusalRate>,
    refusals_unjournaled: Counter,
    /// `rate_limit` buckets, shared with the HTTP proxy: an agent's limit covers its execs.
    rates: Arc<RateLimits>,
    /// Suspended agents (SPEC §5.8 kill switch), shared with the HTTP proxy.
    suspended: Arc<Suspended>,
}

impl SshFront {
    pub fn new(
        live: Arc<crate::config::Live>,
        journal: crate::journal::Journal,
        host_key: PrivateKey,
        dispatch: Arc<dyn ExecDispatch>,
        busy: Arc<BusyPerAgent>,
        refusals_unjournaled: Counter,
        (rates, suspended): (Arc<RateLimits>, Arc<Suspended>),
    ) -> Self {
        let server = russh::server::Config {
            keys: vec![host_key],
            methods: MethodSet::from(&[MethodKind::None, MethodKind::PublicKey][..]),
            // The preamble is the identity; an OpenSSH login must not wait for a rejection.
            auth_rejection_time: Duration::ZERO,
            auth_rejection_time_initial: Some(Duration::ZERO),
            nodelay: true,
            ..Default::default()
        };
        Self {
            failed_logins: RefusalRate::failed_logins(),
            busy,
            refusals: Arc::new(RefusalRate::refusals()),
            refusals_unjournaled,
            rates,
            suspended,
            live,
            journal,
            dispatch,
            server: Arc::new(server),
        }
    }
}

/// Accepts agent connections, at most the listener's cap at once.
pub async fn serve(mut listener: Guarded, front: Arc<SshFront>) {
    loop {
        let (stream, slot) = listener.next().await;
        let front = front.clone();
        tokio::spawn(async move {
            let _slot = slot;
            connection(front, stream).await;
        });
    }
}

async fn connection(front: Arc<SshFront>, stream: TcpStream) {
    let source = stream
        .peer_addr()
        .map_or(IpAddr::from([0, 0, 0, 0]), |a| a.ip());
    let mut stream = BufReader::new(stream);
    let line = match tokio::time::timeout(PREAMBLE_TIMEOUT, read_line(&mut stream)).await {
        Ok(Some(line)) => line,
        _ => {
            answer(&mut stream, Err(malformed("preamble"))).await;
            return;
        }
    };
    let mut admitted = admit(&front, &line, source).await;
    // The session keeps its agent's connection busy as long as it lasts.
    let mut busy = None;
    if let Ok((agent, _)) = &admitted {
        busy = front.busy.hold(agent);
        if busy.is_none() {
            admitted = Err(over_busy_limit(front.busy.limit()));
        }
    }
    let ok = admitted.is_ok();
    let Some((agent, target)) = answer(&mut stream, admitted).await.filter(|_| ok) else {
        return;
    };
    let _busy = busy;
    let rate = front
        .live
        .current()
        .agents
        .iter()
        .find(|a| a.id == agent)
        .and_then(|a| a.rate_limit);
    let handler = AgentSession {
        rate: rate.map(|r| (front.rates.clone(), r)),
        suspended: front.suspended.clone(),
        journal: front.journal.clone(),
        dispatch: front.dispatch.clone(),
        agent,
        target,
        source,
        inputs: HashMap::new(),
        report: std::collections::HashSet::new(),
        refusal_rate: front.refusals.clone(),
        unjournaled: front.refusals_unjournaled.clone(),
        refused: 0,
    };
    match russh::server::run_stream(front.server.clone(), stream, handler).await {
        Ok(running) => {
            if let Err(e) = running.await {
                tracing::debug!(error = %e, "agent SSH session ended with an error");
            }
        }
        Err(e) => tracing::debug!(error = %e, "agent SSH handshake failed"),
    }
}

/// One line, at most `MAX_LINE` bytes; `None` on EOF or an overlong line.
async fn read_line<R: AsyncRead + Unpin>(stream: &mut BufReader<R>) -> Option<String> {
    let mut buf = Vec::new();
    let mut limited = (&mut *stream).take(MAX_LINE as u64);
    limited.read_until(b'\n', &mut buf).await.ok()?;
    if buf.last() != Some(&b'\n') {
        return None;
    }
    buf.pop();
    String::from_utf8(buf).ok()
}

/// Writes `OK` or `ERR <envelope>`; gives back the admission when `OK` went out.
async fn answer(
    stream: &mut BufReader<TcpStream>,
    admitted: Result<(String, Arc<SshTarget>), Envelope>,
) -> Option<(String, Arc<SshTarget>)> {
    let line = match &admitted {
        Ok(_) => "OK\n".to_owned(),
        Err(env) => format!("ERR {}\n", refuse::json(env)),
    };
    let written = stream.get_mut().write_all(line.as_bytes()).await;
    if admitted.is_err() {
        let _ = stream.get_mut().shutdown().await;
    }
    written.ok()?;
    admitted.ok()
}

fn malformed(field: &str) -> Envelope {
    unjournaled_refusal(Code::MalformedRequest, field)
}

/// The preamble's agent and target, or the refusal (journaled once the line parsed).
async fn admit(
    front: &SshFront,
    line: &str,
    source: IpAddr,
) -> Result<(String, Arc<SshTarget>), Envelope> {
    let p = Preamble::parse(line).map_err(|m| malformed(m.0))?;
    let url = format!("ssh://{}@{}:{}", p.user, p.host, p.port);
    let config = front.live.current();
    let agent = match identify(&config, &p, source) {
        Ok(agent) => agent,
        Err(failure) if !front.failed_logins.may_journal(&source.to_string()) => {
            return Err(unjournaled_refusal(failure.code, "token"));
        }
        Err(failure) => {
            let what = Refused {
                agent: UNAUTHENTICATED,
                target: url,
                method: "session",
                command: None,
            };
            return Err(refuse::journal(&front.journal, what, failure).await);
        }
    };
    match match_target(&config, &agent, &p) {
        Ok(_) if front.suspended.of(&agent).is_some() => Err(suspended(front, &agent, url).await),
        Ok(target) => Ok((agent, Arc::new(target.clone()))),
        Err(field) => {
            let what = Refused {
                agent: &agent,
                target: url,
                method: "session",
                command: None,
            };
            let failure = refuse::failure(Code::RouteDenied, field);
            Err(refuse::journal(&front.journal, what, failure).await)
        }
    }
}

/// SPEC §5.8: a suspended agent opens no new session (`AGENT_SUSPENDED`), journaled at the
/// refusals' bounded rate per agent.
async fn suspended(front: &SshFront, agent: &str, url: String) -> Envelope {
    let Some(failure) = front.suspended.refusal(agent) else {
        return unjournaled_refusal(Code::AgentSuspended, "agent");
    };
    if !front.refusals.may_journal(agent) {
        front.refusals_unjournaled.inc();
        return unjournaled_refusal(failure.code, "agent");
    }
    let what = Refused {
        agent,
        target: url,
        method: "session",
        command: None,
    };
    refuse::journal(&front.journal, what, failure).await
}

/// Same rules as the HTTP front: no `[[agents]]` → `anonymous`, loopback only; else the
/// preamble's agent and token must match one (the claimed id is evidence only).
fn identify(
    config: &Config,
    p: &Preamble,
    source: IpAddr,
) -> Result<String, crate::journal::Failure> {
    let id = p.agent.as_deref().unwrap_or("");
    let claimed = match authenticate_pair(config, id, p.token.as_deref().unwrap_or("")) {
        AgentAuth::Anonymous if source.is_loopback() => return Ok("anonymous".into()),
        AgentAuth::Agent(id) if p.token.is_some() => return Ok(id),
        AgentAuth::Wrong { claimed } => claimed.filter(|c| !c.is_empty()),
        _ => None,
    };
    let field = if p.agent.is_none() { "agent" } else { "token" };
    let mut failure = refuse::failure(Code::AgentUnauthenticated, field);
    if let Some(claimed) = claimed {
        failure
            .evidence
            .insert("claimed_agent".into(), claimed.into());
    }
    let source = source.to_string();
    failure
        .evidence
        .insert("source_address".into(), source.into());
    Err(failure)
}

/// The target for host, port, user and agent, or the first dimension nothing matched.
pub fn match_target<'a>(
    config: &'a Config,
    agent: &str,
    p: &Preamble,
) -> Result<&'a SshTarget, &'static str> {
    let mut candidates: Vec<&SshTarget> = config.ssh_targets.iter().collect();
    type Dimension = (&'static str, fn(&SshTarget, &str, &Preamble) -> bool);
    let dimensions: [Dimension; 4] = [
        ("target.host", |t, _, p| t.host == p.host),
        ("target.port", |t, _, p| t.port == p.port),
        ("user", |t, _, p| t.user == p.user),
        ("agent", |t, a, _| crate::policy::admits(&t.agents, a)),
    ];
    for (field, keep) in dimensions {
        candidates.retain(|t| keep(t, agent, p));
        if candidates.is_empty() {
            return Err(field);
        }
    }
    candidates.first().copied().ok_or("target.host")
}
