//! `postern drill` (failpoints builds only): walks one synthetic invocation through
//! the journal's durable transitions, one append each, so crash tests can stop the
//! process between any two of them. No network is touched.

use std::process::ExitCode;

use super::{CliError, Home};
use crate::contract::{Completion, Outcome, Retry, Stage};
use crate::journal::{
    Accepted, Body, ConnectAttempt, Delivered, Dispatch, Draft, EventKind, HttpResult, Journal,
    JournalOptions, Payload, Preflight, Protocol, RequestSent, ResponseComplete, ResponseStarted,
    ResultCommitted, Source, StoredResult, b64, new_invocation_id, sha256_tagged,
};

#[derive(clap::Args, Debug)]
pub struct DrillArgs {
    /// Stop (leaving the invocation live, as a hang would) after this event kind.
    #[arg(long, default_value = "RESULT_DELIVERED")]
    pub through: String,
    /// The request method (GET is idempotent by default, POST is not).
    #[arg(long, default_value = "POST")]
    pub method: String,
}

pub fn run(home: &Home, args: &DrillArgs) -> Result<ExitCode, CliError> {
    let through = EventKind::parse(&args.through)
        .ok_or_else(|| CliError::Failed(format!("unknown event kind {}", args.through)))?;
    home.create().map_err(|e| CliError::Failed(e.to_string()))?;
    let (journal, _) = Journal::open(&home.journal_dir(), JournalOptions::default())
        .map_err(|e| CliError::Failed(format!("cannot open the journal: {e}")))?;
    let id = new_invocation_id();
    outln!("{id}");
    for (draft, result) in steps(&args.method, &id, journal.result_expiry_ms()) {
        let kind = draft.body.kind();
        let appended = match result {
            Some(r) => journal_commit(&journal, &id, draft, r),
            None => journal.append_blocking(&id, vec![draft]),
        };
        appended.map_err(|e| CliError::Failed(format!("{} refused: {e}", kind.as_str())))?;
        if kind == through {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn journal_commit(
    journal: &Journal,
    id: &str,
    draft: Draft,
    result: StoredResult,
) -> Result<crate::journal::Appended, crate::journal::JournalError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| crate::journal::JournalError::Unavailable)?;
    rt.block_on(journal.commit_result(id, vec![draft], result))
}

fn steps(method: &str, id: &str, expires_at_ms: i64) -> Vec<(Draft, Option<StoredResult>)> {
    let body = b"{\"ok\":true}";
    let digest = sha256_tagged(body);
    let idempotent = matches!(method, "GET" | "HEAD" | "OPTIONS" | "PUT" | "DELETE");
    let result = StoredResult {
        invocation_id: id.to_owned(),
        outcome: Outcome::Committed,
        payload: Payload::Http(HttpResult {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())],
            body_base64: Some(b64(body)),
            body_stored: true,
            digest: digest.clone(),
            bytes: body.len() as u64,
            grpc_status: None,
            trailers: vec![],
        }),
        complete: true,
        expires_at_ms,
    };
    let observed = Draft::observed;
    vec![
        (
            observed(Body::ActionAccepted(Accepted {
                agent: "drill".into(),
                protocol: Protocol::Https,
                method: Some(method.to_owned()),
                target: "https://drill.invalid/v1/things".into(),
                command: None,
            })),
            None,
        ),
        (
            observed(Body::PreflightValidated(Preflight {
                route: "drill".into(),
                fingerprint: sha256_tagged(b"drill"),
                idempotent,
                credential: None,
                idempotency: None,
                safe_until_ms: None,
                retry_budget: None,
                credential_placeholder: false,
                resend: None,
            })),
            None,
        ),
        (
            observed(Body::ConnectAttempt(ConnectAttempt {
                n: 1,
                stage: Stage::TcpConnect,
                ok: true,
                code: None,
                address: Some("127.0.0.1:9".into()),
                diagnostic: None,
                hop: None,
            }))
            .attempt(1),
            None,
        ),
        (
            observed(Body::DispatchStarted(Dispatch::default()))
                .hop("origin")
                .attempt(1),
            None,
        ),
        (
            observed(Body::RequestSent(RequestSent { bytes: 120 }))
                .hop("origin")
                .attempt(1),
            None,
        ),
        (
            observed(Body::RemoteResponseStarted(ResponseStarted {
                status: Some(200),
            }))
            .source(Source::RemoteResponse)
            .hop("origin")
            .attempt(1),
            None,
        ),
        (
            observed(Body::RemoteResponseComplete(ResponseComplete {
                completion: Completion::ContentLength,
                bytes: body.len() as u64,
                digest: digest.clone(),
            }))
            .source(Source::RemoteResponse)
            .hop("origin")
            .attempt(1),
            None,
        ),
        (
            observed(Body::ResultCommitted(ResultCommitted {
                outcome: Outcome::Committed,
                retry: Retry::Never,
                status: Some(200),
                exit_status: None,
                exit_signal: None,
                grpc_status: None,
                digest,
                bytes: body.len() as u64,
                complete: true,
                completion: Some(Completion::ContentLength),
                evidence: serde_json::Map::new(),
            }))
            .source(Source::RemoteResponse)
            .hop("origin")
            .attempt(1),
            Some(result),
        ),
        (
            observed(Body::ResultDelivered(Delivered {
                bytes: body.len() as u64,
                upgrade: None,
                end_of_stream_delivered: None,
            })),
            None,
        ),
    ]
}
