//! The token request as postern's own invocation (SPEC §3.8, agent `postern`): accepted on
//! the token route, `DISPATCH_STARTED` durable before a byte leaves, then its answer
//! committed without its body (the body holds the token), or its failure. Like any
//! invocation it is `unknown` when postern cannot tell whether the endpoint acted (a refresh
//! token rotated by a request whose answer was lost is one an operator must look at).

use http::StatusCode;
use sha2::{Digest, Sha256};

use super::MintFailure;
use crate::config::Route;
use crate::contract::{Code, Completion, ResponseFacts, classify_status};
use crate::http::origin::receive::{Whole, origin_committed};
use crate::journal::{
    Accepted, Body, Dispatch, Draft, Failure, HttpResult, Journal, Payload, Preflight, Protocol,
    ResponseComplete, ResponseStarted, Source, StoredResult, TlsIdentity, sha256_tagged_digest,
};
use crate::lifecycle::Invocation;

/// The agent a token request is journaled as.
pub const AGENT: &str = "postern";

pub struct TokenInvocation {
    inv: Invocation,
    preflight: Option<Draft>,
}

impl TokenInvocation {
    /// A new invocation for a token request of `credential` to `token_url` on `route`. Its
    /// fingerprint covers the method, the URL and the credential id, never the form (which
    /// carries the client's secret).
    pub fn accept(journal: &Journal, route: &Route, token_url: &str, credential: &str) -> Self {
        let accepted = Accepted {
            agent: AGENT.into(),
            command: None,
            method: Some("POST".into()),
            protocol: Protocol::Https,
            target: token_url.into(),
        };
        let preflight = Preflight {
            credential: None,
            credential_placeholder: false,
            fingerprint: crate::policy::fingerprint("POST", token_url, &[], credential.as_bytes()),
            idempotency: None,
            idempotent: false,
            resend: None,
            retry_budget: Some(0),
            route: route.id.clone(),
            safe_until_ms: None,
        };
        Self {
            inv: Invocation::accept(journal.clone(), accepted),
            preflight: Some(Draft::observed(Body::PreflightValidated(preflight))),
        }
    }

    pub fn id(&self) -> String {
        self.inv.id().to_owned()
    }

    /// Connection setup failed: nothing was sent (`not_attempted`).
    pub async fn not_sent(&mut self, code: Code) {
        let drafts = self.preflight.take().into_iter().collect();
        self.inv.fail(drafts, Failure::of(code)).await;
    }

    /// `DISPATCH_STARTED`, durable; `Err`: the request must not be sent.
    pub async fn dispatch(
        &mut self,
        address: std::net::SocketAddr,
        tls: Option<TlsIdentity>,
    ) -> Result<(), MintFailure> {
        let drafts = self.preflight.take().into_iter().collect();
        let dispatch = Dispatch {
            address: Some(address.to_string()),
            connection_id: None,
            reused_connection: false,
            tls,
        };
        self.inv
            .dispatch_boundary(drafts, dispatch, "origin")
            .await
            .map_err(|_| MintFailure::new("journal", "the journal did not take the token request"))
    }

    /// The endpoint answered in full: committed (or rejected, by its status) with the head's
    /// status and the body's digest and size, never the body; read by postern, so delivered.
    pub async fn answered(&mut self, status: u16, body: &[u8]) {
        let facts = ResponseFacts {
            status,
            ..Default::default()
        };
        let (Some(resolution), Ok(code)) = (
            classify_status(facts, &Default::default()),
            StatusCode::from_u16(status),
        ) else {
            return self.unanswered(Code::RemoteResultIncomplete).await;
        };
        let digest = sha256_tagged_digest(&Sha256::digest(body));
        let bytes = body.len() as u64;
        let remote = |body| {
            Draft::observed(body)
                .source(Source::RemoteResponse)
                .hop("origin")
        };
        let started = remote(Body::RemoteResponseStarted(ResponseStarted {
            status: Some(status),
        }));
        let complete = remote(Body::RemoteResponseComplete(ResponseComplete {
            bytes,
            completion: Completion::ContentLength,
            digest: digest.clone(),
        }));
        let whole = Whole {
            digest: digest.clone(),
            bytes,
            completion: Completion::ContentLength,
            grpc_status: None,
        };
        let committed = origin_committed(resolution, code, whole, Default::default());
        let stored = StoredResult {
            invocation_id: self.id(),
            outcome: resolution.outcome,
            payload: Payload::Http(HttpResult {
                status,
                headers: Vec::new(),
                body_base64: None,
                body_stored: false,
                digest,
                bytes,
                grpc_status: None,
                trailers: Vec::new(),
            }),
            complete: true,
            expires_at_ms: self.inv.journal().result_expiry_ms(),
        };
        let drafts = vec![started, complete, committed];
        if self.inv.commit_result(drafts, stored).await.is_ok() {
            self.inv.delivered(bytes).await;
        }
    }

    /// Sent, and no complete answer came back: the endpoint may have acted (`unknown`).
    pub async fn unanswered(&mut self, code: Code) {
        self.inv.fail(Vec::new(), Failure::of(code)).await;
    }
}
