//! The tools `postern mcp` offers (SPEC §3.9), their schemas, and what the model reads in
//! each result: the daemon's verdict (`outcome`, `phase`, `retry`, `code`) and the record's
//! evidence, beside the answer itself. postern's own refusals are `isError` results carrying
//! the envelope; a complete origin answer of any status is a normal result.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{
    CallToolResult, Implementation, ProgressNotificationParam, RequestMetaObject,
    ServerCapabilities, ServerConfig,
};
use rmcp::{Peer, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::agent::{Agent, Answer, Ask, Unsent};
use super::ssh::{Front, Ran};
use crate::contract::{
    Code, Envelope, never_sent, read_postern_outcome, unanswered, unjournaled_refusal,
};

/// The most body text (or base64) one tool result carries: more would flood the model's
/// context. The rest is paged with `fetch_result`'s `offset`.
pub const BODY_LIMIT: usize = 64 * 1024;

/// Calls that reach the daemon at once: a flood of tool calls waits here (each in turn, and
/// cancellable) instead of opening a connection each, as a bounded agent would.
pub const CALLS_AT_ONCE: usize = 16;

/// More request headers than any API needs (the proxy's own limit answers a bare 431).
const MAX_HEADERS: usize = 64;

/// How often a call that waits (for an approval, or a slow origin) says it is still waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

const INTERNAL: &str = "http://postern.internal/v1/invocations";

#[derive(Debug, Deserialize, JsonSchema)]
pub struct HttpRequestArgs {
    /// The HTTP method: GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS.
    pub method: String,
    /// The absolute `https://` or `http://` URL, without a `user:password@` part.
    pub url: String,
    /// Request headers, name to value. Send no credentials: postern injects them.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The request body as text (UTF-8).
    pub body: Option<String>,
    /// The request body as base64, for bytes that are not text (instead of `body`).
    pub body_base64: Option<String>,
    /// An idempotency key, sent as the `Idempotency-Key` header.
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SshExecArgs {
    /// The SSH target as `user@host` or `user@host:port` (port 22 by default).
    pub target: String,
    /// The command to run (no shell is started: the remote's login shell runs it).
    pub command: String,
    /// Text sent to the command's standard input, then end of input.
    pub stdin: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct InvocationArgs {
    /// The invocation id (`act_…`) a result named.
    pub invocation_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct FetchArgs {
    /// The invocation id (`act_…`) whose stored result to read.
    pub invocation_id: String,
    /// Where in the body to start (a result too large for one answer says `next_offset`).
    #[serde(default)]
    pub offset: u64,
}

/// What every tool result says (fields that do not apply are left out).
#[derive(Debug, Default, Serialize, JsonSchema)]
pub struct ToolOutcome {
    /// The invocation postern journaled (null for a refusal it did not journal).
    pub invocation_id: Option<String>,
    /// not_attempted, rejected, committed or unknown: what is known about remote execution.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Where postern stopped: validation, credential_injection, connection_setup,
    /// remote_execution or result_delivery.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// What may be done now: never, after_correction, backoff, same_idempotency_key,
    /// reconcile (it may have happened: never repeat it) or fetch_result (call fetch_result).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<String>,
    /// postern's error code, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The argument to correct, for validation errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The origin's HTTP status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// The body as text, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The body as base64, when it is not text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
    /// The command's exit status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<u32>,
    /// The signal that ended the command, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// The body's whole length in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Only part of the body is here: call fetch_result with `next_offset` for the rest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// The answer is an earlier identical request's stored result: nothing was sent again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<bool>,
    /// How postern knows: the journal's evidence for this invocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Value>,
}

/// `postern mcp`'s server: the agent's tools.
#[derive(Clone)]
pub struct Tools {
    agent: Arc<Agent>,
    front: Arc<Front>,
    /// The MCP pipe closed: every call still running stops.
    pipe_closed: CancellationToken,
    /// `CALLS_AT_ONCE` permits for actions; reads of postern.internal have their own, so a
    /// call's record is never queued behind calls still waiting.
    calls: Arc<tokio::sync::Semaphore>,
    reads: Arc<tokio::sync::Semaphore>,
    /// The proxy's `max_request_bytes`.
    body_limit: u64,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Tools {
    pub fn new(agent: Agent, front: Front, pipe_closed: CancellationToken) -> Self {
        Self {
            agent: Arc::new(agent),
            front: Arc::new(front),
            pipe_closed,
            calls: Arc::new(tokio::sync::Semaphore::new(CALLS_AT_ONCE)),
            reads: Arc::new(tokio::sync::Semaphore::new(CALLS_AT_ONCE)),
            body_limit: u64::MAX,
            tool_router: Self::tool_router(),
        }
    }

    /// Refuses bodies over `limit` bytes (`PAYLOAD_LIMIT`) before sending them.
    pub fn with_body_limit(mut self, limit: u64) -> Self {
        self.body_limit = limit;
        self
    }

    #[tool(
        description = "Sends one HTTP(S) request through postern, which adds the credentials and journals it. Read `outcome` and `retry` in the result before anything else: `reconcile` means it may have happened, so never send it again; `fetch_result` means call fetch_result with the invocation_id instead of repeating it; `backoff` may be sent again later; `never` and `after_correction` must not be repeated as they are. Bodies over 64 KiB come in parts (`next_offset`).",
        output_schema = schema_for_output::<ToolOutcome>()
    )]
    async fn http_request(
        &self,
        Parameters(args): Parameters<HttpRequestArgs>,
        meta: RequestMetaObject,
        peer: Peer<RoleServer>,
        cancelled: CancellationToken,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let ask = match ask_of(args, self.body_limit) {
            Ok(ask) => ask,
            Err((code, field)) => {
                return Ok(envelope_result(&unjournaled_refusal(code, &field)));
            }
        };
        let waiting = progress(peer, meta);
        let sent = tokio::select! {
            sent = in_turn(&self.calls, self.agent.send(ask)) => sent,
            // Dropping the exchange closes its connection: the daemon records the caller gone.
            () = cancelled.cancelled() => Err(Unsent::Unanswered("the client cancelled the call".into())),
            () = self.pipe_closed.cancelled() => Err(Unsent::Unanswered("the MCP pipe closed".into())),
        };
        drop(waiting);
        match sent {
            Ok(answer) => Ok(self.answered(answer).await),
            Err(unsent) => Ok(unsent_result(unsent)),
        }
    }

    #[tool(
        description = "Runs one command on an SSH target through postern, which logs in with the target's key and journals it. Read `outcome` and `retry` first: `reconcile` means it may have run, so never run it again; `fetch_result` means call fetch_result with the invocation_id; a non-zero exit_status is a complete answer (committed), not a postern error.",
        output_schema = schema_for_output::<ToolOutcome>()
    )]
    async fn ssh_exec(
        &self,
        Parameters(args): Parameters<SshExecArgs>,
        cancelled: CancellationToken,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let Some(target) = ssh_target(&args.target) else {
            let refusal = unjournaled_refusal(Code::InvalidTarget, "target");
            return Ok(envelope_result(&refusal));
        };
        let stdin = args.stdin.map(Bytes::from);
        let (user, host, port) = (target.0.as_str(), target.1.as_str(), target.2);
        let exec = self.front.exec((user, host, port), &args.command, stdin);
        let ran = tokio::select! {
            ran = in_turn(&self.calls, exec) => ran,
            () = cancelled.cancelled() => Err(Unsent::Unanswered("the client cancelled the call".into())),
            () = self.pipe_closed.cancelled() => Err(Unsent::Unanswered("the MCP pipe closed".into())),
        };
        match ran {
            Ok(ran) => Ok(self.ran(ran).await),
            Err(unsent) => Ok(unsent_result(unsent)),
        }
    }

    #[tool(
        description = "Returns the stored result of one of your earlier invocations without sending anything again; use it whenever a result says retry `fetch_result`, and with `offset` to read a large body in parts.",
        output_schema = schema_for_output::<ToolOutcome>()
    )]
    async fn fetch_result(
        &self,
        Parameters(args): Parameters<FetchArgs>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let url = format!("{INTERNAL}/{}/result", encode(&args.invocation_id));
        let (ok, value) = match self.internal(&url).await {
            Ok(got) => got,
            Err(unsent) => return Ok(read_failed(unsent)),
        };
        if !ok {
            return Ok(not_found(&args.invocation_id, &value));
        }
        let mut out = ToolOutcome {
            invocation_id: Some(args.invocation_id),
            outcome: text(&value, "outcome"),
            status: value["status"].as_u64().and_then(|s| u16::try_from(s).ok()),
            exit_status: value["exit_status"]
                .as_u64()
                .and_then(|s| u32::try_from(s).ok()),
            signal: text(&value, "exit_signal"),
            ..ToolOutcome::default()
        };
        let decoded = |key: &str| {
            let b64 = value[key].as_str()?;
            base64::engine::general_purpose::STANDARD.decode(b64).ok()
        };
        match decoded("body_base64") {
            Some(bytes) => put_body(&mut out, &bytes, args.offset),
            None if value.get("body_base64").is_some() => {
                out.message = Some(NOT_KEPT.into());
            }
            None => {}
        }
        if value["output_stored"] == false {
            // Not an empty output: none was kept.
            out.message = Some(NOT_KEPT.into());
        } else {
            if let Some(stdout) = decoded("stdout_base64") {
                put_output(&mut out, &stdout, args.offset);
            }
            out.stderr = decoded("stderr_base64").map(|e| capped(&e));
        }
        out.headers = value["headers"].as_array().map(|pairs| {
            joined(
                pairs
                    .iter()
                    .filter_map(|p| Some((p[0].as_str()?.to_owned(), p[1].as_str()?.to_owned()))),
            )
        });
        // How postern knows: the record's evidence (its verdict stays the stored result's:
        // the record may still say `fetch_result`, which this is).
        if let Some(id) = &out.invocation_id
            && let Some(record) = self.record(id).await
        {
            out.evidence = Some(record["evidence"].clone());
        }
        Ok(structured(&out, false))
    }

    #[tool(
        description = "Returns postern's record of one of your invocations (outcome, retry, code, evidence, events summary), to learn what happened before deciding to repeat anything; it never sends anything."
    )]
    async fn get_invocation(
        &self,
        Parameters(args): Parameters<InvocationArgs>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let url = format!("{INTERNAL}/{}", encode(&args.invocation_id));
        match self.internal(&url).await {
            Ok((true, record)) => Ok(CallToolResult::structured(record)),
            Ok((false, value)) => Ok(not_found(&args.invocation_id, &value)),
            Err(unsent) => Ok(read_failed(unsent)),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("postern", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Every action goes through postern, which holds the credentials and journals it. \
                 Each result says outcome and retry: never repeat an action whose retry is \
                 reconcile, and call fetch_result when it says fetch_result.",
            )
    }
}

impl Tools {
    /// An exec's output with the record's verdict and evidence. Without an invocation the
    /// front refused before any command ran, and its envelope (the preamble's answer, or its
    /// `postern: ` line) is the result; with one, only the record speaks: a command can print
    /// anything on its stderr.
    async fn ran(&self, ran: Ran) -> CallToolResult {
        if ran.invocation_id.is_none() {
            let text = String::from_utf8_lossy(&ran.stderr).into_owned();
            let own = ran.refused.clone().or_else(|| {
                text.lines()
                    .find_map(|l| l.strip_prefix("postern: "))
                    .map(str::to_owned)
            });
            if let Some(envelope) = own.and_then(|j| serde_json::from_str::<Envelope>(&j).ok()) {
                return envelope_result(&envelope);
            }
        }
        let record = match &ran.invocation_id {
            Some(id) => self.record(id).await,
            None => None,
        };
        let mut out = ToolOutcome {
            invocation_id: ran.invocation_id.clone(),
            exit_status: ran.exit_status,
            signal: ran.exit_signal.clone(),
            stderr: Some(capped(&ran.stderr)),
            ..ToolOutcome::default()
        };
        put_output(&mut out, &ran.stdout, 0);
        out.bytes = Some(ran.stdout_bytes);
        match &record {
            Some(r) => {
                verdict_of_record(&mut out, r);
                if r["evidence"]["output_stored"] == false && out.next_offset.is_some() {
                    out.next_offset = None;
                    out.message = Some(NOT_KEPT.into());
                }
                out.evidence = Some(r["evidence"].clone());
            }
            // The exec was asked for and nothing says what became of it: it may have run.
            None => without_verdict(&mut out, unanswered()),
        }
        let failed = out.code.is_some() || (ran.exit_status.is_none() && ran.exit_signal.is_none());
        structured(&out, failed)
    }

    async fn record(&self, id: &str) -> Option<Value> {
        let url = format!("{INTERNAL}/{}", encode(id));
        match self.internal(&url).await {
            Ok((true, record)) => Some(record),
            _ => None,
        }
    }

    /// A GET of the agent's own view at postern.internal: (found, JSON).
    async fn internal(&self, url: &str) -> Result<(bool, Value), Unsent> {
        let ask = Ask {
            method: Method::GET,
            url: url
                .parse()
                .map_err(|_| Unsent::NotSent("not an invocation id".into()))?,
            headers: HeaderMap::new(),
            body: Bytes::new(),
        };
        let answer = in_turn(&self.reads, self.agent.send(ask)).await?;
        let value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        Ok((answer.status.is_success(), value))
    }

    /// An answer through the proxy: postern's own refusal, or the origin's answer with the
    /// daemon's verdict and the record's evidence.
    async fn answered(&self, answer: Answer) -> CallToolResult {
        if let Some(envelope) = own_error(&answer) {
            return envelope_result(&envelope);
        }
        let id = header(&answer.headers, "postern-invocation");
        if id.is_none() {
            // Every answer on a route names its invocation: this is the proxy's HTTP layer
            // refusing the request before any route saw it (a head too large: 431).
            let mut refusal = unjournaled_refusal(Code::MalformedRequest, "headers");
            refusal.error.message = format!(
                "postern's proxy refused the request before reading it (HTTP {}): nothing was sent",
                answer.status.as_u16()
            );
            return envelope_result(&refusal);
        }
        let record = match &id {
            Some(id) => self.record(id).await,
            None => None,
        };
        let verdict = answer
            .trailers
            .as_ref()
            .and_then(|t| header(t, "postern-outcome"))
            .or_else(|| header(&answer.headers, "postern-outcome"));
        let mut out = ToolOutcome {
            invocation_id: id,
            status: Some(answer.status.as_u16()),
            headers: Some(headers_of(&answer.headers)),
            replayed: header(&answer.headers, "postern-replayed").map(|v| v == "true"),
            ..ToolOutcome::default()
        };
        put_body(&mut out, &answer.body, 0);
        out.bytes = Some(answer.bytes);
        let told = answer.complete && verdict.is_some_and(|v| read_verdict(&mut out, &v));
        if let (false, Some(r)) = (told, &record) {
            verdict_of_record(&mut out, r);
        }
        let evidence = record.map(|r| r["evidence"].clone());
        if evidence.as_ref().is_some_and(|e| e["body_stored"] == false) && out.next_offset.is_some()
        {
            out.next_offset = None;
            out.message = Some(NOT_KEPT.into());
        }
        out.evidence = evidence;
        // A stream that broke is postern's error, not an origin answer.
        let failed = !answer.complete || out.code.is_some();
        structured(&out, failed)
    }
}

/// The tool call's arguments as a request, or the refusal postern would give, code and
/// field (not journaled: nothing reached the daemon).
fn ask_of(args: HttpRequestArgs, body_limit: u64) -> Result<Ask, (Code, String)> {
    let refuse = |code: Code, field: &str| (code, field.to_owned());
    let method = Method::from_bytes(args.method.trim().to_ascii_uppercase().as_bytes())
        .map_err(|_| refuse(Code::MalformedRequest, "method"))?;
    if method == Method::CONNECT || method == Method::TRACE {
        return Err(refuse(Code::UnsupportedAction, "method"));
    }
    let url: Uri = args
        .url
        .trim()
        .parse()
        .map_err(|_| refuse(Code::InvalidTarget, "url"))?;
    let plausible = matches!(url.scheme_str(), Some("http" | "https"))
        && url.host().is_some_and(|h| !h.is_empty())
        && !url.authority().is_some_and(|a| a.as_str().contains('@'));
    if !plausible {
        return Err(refuse(Code::InvalidTarget, "url"));
    }
    if args.headers.len() > MAX_HEADERS {
        return Err(refuse(Code::MalformedRequest, "headers"));
    }
    let mut headers = HeaderMap::new();
    for (name, value) in &args.headers {
        let field = format!("headers.{}", name.to_ascii_lowercase());
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| refuse(Code::MalformedRequest, &field))?;
        let value =
            HeaderValue::from_str(value).map_err(|_| refuse(Code::MalformedRequest, &field))?;
        // postern's proxy identity is the agent's, set here; framing is hyper's.
        let reserved = matches!(
            name.as_str(),
            "proxy-authorization"
                | "host"
                | "content-length"
                | "transfer-encoding"
                | "connection"
                | "te"
                | "upgrade"
        );
        if reserved {
            // Framing and identity are postern's to set, not a credential it injects.
            return Err(refuse(Code::MalformedRequest, &field));
        }
        headers.append(name, value);
    }
    if let Some(key) = &args.idempotency_key {
        let value = HeaderValue::from_str(key)
            .map_err(|_| refuse(Code::MalformedRequest, "idempotency_key"))?;
        headers.insert("idempotency-key", value);
    }
    let body = match (args.body, args.body_base64) {
        (Some(_), Some(_)) => return Err(refuse(Code::MalformedRequest, "body_base64")),
        (Some(text), None) => Bytes::from(text),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map(Bytes::from)
            .map_err(|_| refuse(Code::MalformedRequest, "body_base64"))?,
        (None, None) => Bytes::new(),
    };
    if body.len() as u64 > body_limit {
        return Err(refuse(Code::PayloadLimit, "body"));
    }
    Ok(Ask {
        method,
        url,
        headers,
        body,
    })
}

/// postern's own error, as its envelope: the proxy's refusal of the `CONNECT`, or an answer
/// whose `Proxy-Status` carries an error (RFC 9209; an origin's never does: postern turns it
/// into `UPSTREAM_HOP_ERROR`) and whose envelope names the invocation the answer does. An
/// origin's body that looks like an envelope is the origin's answer.
fn own_error(answer: &Answer) -> Option<Envelope> {
    let named = answer
        .headers
        .get_all("proxy-status")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("error="));
    if !answer.from_proxy && !named {
        return None;
    }
    let envelope: Envelope = serde_json::from_slice(&answer.body).ok()?;
    let invocation = header(&answer.headers, "postern-invocation");
    (answer.from_proxy || envelope.invocation_id == invocation).then_some(envelope)
}

fn envelope_result(env: &Envelope) -> CallToolResult {
    let e = &env.error;
    let out = ToolOutcome {
        invocation_id: env.invocation_id.clone(),
        outcome: Some(e.outcome.as_str().to_owned()),
        phase: Some(e.phase.as_str().to_owned()),
        retry: Some(e.retry.as_str().to_owned()),
        code: Some(e.code.as_str().to_owned()),
        message: Some(e.message.clone()),
        field: e.field.clone(),
        evidence: serde_json::to_value(&env.evidence).ok(),
        ..ToolOutcome::default()
    };
    structured(&out, true)
}

/// No answer: `contract` says what that means, by whether the request can have left.
fn unsent_result(unsent: Unsent) -> CallToolResult {
    let mut envelope = match &unsent {
        Unsent::NotSent(_) => never_sent(),
        Unsent::Unanswered(_) => unanswered(),
    };
    envelope.error.message = match unsent {
        Unsent::NotSent(why) => format!("Nothing was sent: {why}."),
        Unsent::Unanswered(why) => format!(
            "postern gave no answer ({why}); it may have run: do not repeat it, ask the operator to reconcile it"
        ),
    };
    envelope_result(&envelope)
}

/// A read of postern.internal that failed: nothing ran either way.
fn read_failed(unsent: Unsent) -> CallToolResult {
    let (Unsent::NotSent(why) | Unsent::Unanswered(why)) = unsent;
    unsent_result(Unsent::NotSent(why))
}

/// Runs `call` once one of `permits` is free.
async fn in_turn<T>(
    permits: &tokio::sync::Semaphore,
    call: impl std::future::Future<Output = Result<T, Unsent>>,
) -> Result<T, Unsent> {
    let _permit = permits
        .acquire()
        .await
        .map_err(|_| Unsent::NotSent("postern mcp is stopping".into()))?;
    call.await
}

/// Said where a stored result kept no body (over `max_result_bytes`: only its digest).
const NOT_KEPT: &str = "postern kept only the digest of this result (it was larger than journal.max_result_bytes): the rest cannot be fetched";

fn not_found(id: &str, value: &Value) -> CallToolResult {
    let out = ToolOutcome {
        invocation_id: Some(id.to_owned()),
        code: text(&value["error"], "code"),
        message: text(&value["error"], "message"),
        ..ToolOutcome::default()
    };
    structured(&out, true)
}

fn structured(out: &ToolOutcome, error: bool) -> CallToolResult {
    let value = serde_json::to_value(out).unwrap_or(Value::Null);
    match error {
        true => CallToolResult::structured_error(value),
        false => CallToolResult::structured(value),
    }
}

/// The facts of `envelope` where no record gives them.
fn without_verdict(out: &mut ToolOutcome, envelope: Envelope) {
    let e = envelope.error;
    out.outcome = Some(e.outcome.as_str().to_owned());
    out.phase = Some(e.phase.as_str().to_owned());
    out.retry = Some(e.retry.as_str().to_owned());
    out.code = Some(e.code.as_str().to_owned());
    out.message = Some(e.message);
    out.evidence = serde_json::to_value(&envelope.evidence).ok();
}

fn verdict_of_record(out: &mut ToolOutcome, record: &Value) {
    out.outcome = text(record, "outcome");
    out.phase = text(record, "phase");
    out.retry = text(record, "retry");
    out.code = text(record, "code");
}

/// `user@host[:port]`.
fn ssh_target(target: &str) -> Option<(String, String, u16)> {
    let (user, rest) = target.trim().split_once('@')?;
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) => (host, port.parse().ok()?),
        None => (rest, 22),
    };
    let fine = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() && b != b'@');
    (fine(user) && fine(host)).then(|| (user.to_owned(), host.to_owned(), port))
}

/// stdout from `offset` as text (lossy), at most `BODY_LIMIT`, with `next_offset` and
/// `bytes` when there is more.
fn put_output(out: &mut ToolOutcome, bytes: &[u8], offset: u64) {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let rest = bytes.get(start..).unwrap_or_default();
    let part = rest.get(..rest.len().min(BODY_LIMIT)).unwrap_or_default();
    out.stdout = Some(String::from_utf8_lossy(part).into_owned());
    out.bytes = Some(bytes.len() as u64);
    if part.len() < rest.len() {
        out.next_offset = Some((start + part.len()) as u64);
    }
}

/// Output as text (lossy), at most `BODY_LIMIT`.
fn capped(bytes: &[u8]) -> String {
    let text =
        String::from_utf8_lossy(bytes.get(..bytes.len().min(BODY_LIMIT)).unwrap_or_default());
    text.into_owned()
}

/// The daemon's verdict from `Postern-Outcome`; false when it says none.
fn read_verdict(out: &mut ToolOutcome, value: &str) -> bool {
    let Some((outcome, phase, retry, code)) = read_postern_outcome(value) else {
        return false;
    };
    out.outcome = Some(outcome.as_str().to_owned());
    out.phase = Some(phase.as_str().to_owned());
    out.retry = Some(retry.as_str().to_owned());
    out.code = code.map(|c| c.as_str().to_owned());
    true
}

/// The body from `offset`: text when it is UTF-8, else base64, at most `BODY_LIMIT`.
fn put_body(out: &mut ToolOutcome, bytes: &[u8], offset: u64) {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let rest = bytes.get(start..).unwrap_or_default();
    out.bytes = Some(bytes.len() as u64);
    // Kept bytes may end inside a character: that is still text.
    let text = match std::str::from_utf8(rest) {
        Ok(text) => Some(text),
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => rest
            .get(..e.valid_up_to())
            .and_then(|r| std::str::from_utf8(r).ok()),
        Err(_) => None,
    };
    match text {
        Some(text) => {
            let mut end = text.len().min(BODY_LIMIT);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            out.body = Some(text.get(..end).unwrap_or_default().to_owned());
            if end < rest.len() {
                out.next_offset = Some((start + end) as u64);
            }
        }
        None => {
            let part = rest
                .get(..rest.len().min(BODY_LIMIT * 3 / 4))
                .unwrap_or_default();
            out.body_base64 = Some(base64::engine::general_purpose::STANDARD.encode(part));
            if part.len() < rest.len() {
                out.next_offset = Some((start + part.len()) as u64);
            }
        }
    }
}

fn headers_of(map: &HeaderMap) -> BTreeMap<String, String> {
    joined(map.iter().map(|(name, value)| {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        (name.as_str().to_owned(), value)
    }))
}

/// Repeated fields as one value each: joined with `, ` (RFC 9110 §5.3), but `Set-Cookie`
/// with a line break, since a cookie's own value may hold a comma (RFC 6265 §3).
fn joined(pairs: impl Iterator<Item = (String, String)>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in pairs {
        let between = match name.eq_ignore_ascii_case("set-cookie") {
            true => "\n",
            false => ", ",
        };
        out.entry(name)
            .and_modify(|v| {
                v.push_str(between);
                v.push_str(&value);
            })
            .or_insert(value);
    }
    out
}

fn header(map: &HeaderMap, name: &str) -> Option<String> {
    map.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn text(value: &Value, key: &str) -> Option<String> {
    value.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// An id as one path segment (RFC 3986 unreserved bytes kept, the rest escaped).
fn encode(id: &str) -> String {
    crate::ssh::preamble::pct(id)
}

/// Says "still waiting" every `PROGRESS_EVERY` while the returned guard lives, when the
/// client asked for progress.
fn progress(peer: Peer<RoleServer>, meta: RequestMetaObject) -> Waiting {
    let Some(token) = meta.get_progress_token() else {
        return Waiting(None);
    };
    let task = tokio::spawn(async move {
        let mut n = 0u32;
        loop {
            tokio::time::sleep(PROGRESS_EVERY).await;
            n += 1;
            let note = ProgressNotificationParam::new(token.clone(), f64::from(n)).with_message(
                "waiting: postern holds the request (an approval, or the origin's answer)",
            );
            if peer.notify_progress(note).await.is_err() {
                return;
            }
        }
    });
    Waiting(Some(task))
}

/// Stops the progress notes when the call ends.
struct Waiting(Option<tokio::task::JoinHandle<()>>);

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41 residue: two cookies were joined with ", " (a cookie's Expires holds one),
    /// and a stored result's repeated fields kept only the last.
    #[test]
    fn repeated_fields_are_joined_and_cookies_kept_apart() {
        let mut map = HeaderMap::new();
        map.append(
            "set-cookie",
            HeaderValue::from_static("a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT"),
        );
        map.append("set-cookie", HeaderValue::from_static("b=2"));
        map.append("vary", HeaderValue::from_static("accept"));
        map.append("vary", HeaderValue::from_static("origin"));
        let got = headers_of(&map);
        assert_eq!(
            got["set-cookie"],
            "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT\nb=2"
        );
        assert_eq!(got["vary"], "accept, origin");
        let stored =
            [("vary", "accept"), ("vary", "origin")].map(|(n, v)| (n.to_owned(), v.to_owned()));
        assert_eq!(joined(stored.into_iter())["vary"], "accept, origin");
    }

    #[test]
    fn a_body_cut_inside_a_character_is_text_and_pages_on() {
        // "é" is two bytes: keep only its first after 70 KiB of text.
        let mut body = "a".repeat(70 * 1024).into_bytes();
        body.push(0xC3);
        let mut out = ToolOutcome::default();
        put_body(&mut out, &body, 0);
        assert_eq!(out.body.as_ref().map(String::len), Some(BODY_LIMIT));
        assert_eq!(out.next_offset, Some(BODY_LIMIT as u64));
        // The last page: the text, then the lone byte as base64 (never an endless page).
        let mut out = ToolOutcome::default();
        put_body(&mut out, &body, BODY_LIMIT as u64);
        assert_eq!(out.next_offset, Some(70 * 1024));
        let mut out = ToolOutcome::default();
        put_body(&mut out, &body, 70 * 1024);
        assert_eq!(out.body_base64.as_deref(), Some("ww=="));
        assert_eq!(out.next_offset, None);
    }
}
