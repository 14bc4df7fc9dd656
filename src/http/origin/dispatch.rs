//! The dispatch boundary and sending: `DISPATCH_STARTED` durable before the first
//! request byte, the request written on a new or pooled connection, and a request
//! hyper hands back unwritten sent once more on a fresh one.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, header};
use hyper::body::Incoming;

use tokio::sync::oneshot;

use super::pool::{Conn, SendFailure, Sender};
use super::sigv4;
use super::tap::Tap;
use super::upstream::{Dialed, Hop, dial};
use crate::config::{Route, Scheme};
use crate::contract::Code;
use crate::http::Exchange;
use crate::http::deliver::body::{UpBody, attach_body};
use crate::http::deliver::budget::Reservation;
use crate::http::deliver::flushed::DeliveryEnd;
use crate::http::deliver::outgoing::Outgoing;
use crate::http::message::decode;
use crate::http::message::headers::strip_hop_by_hop;
use crate::http::message::respond::{self, ProxyBody};
use crate::journal::{Body, Dispatch, Draft, RequestSent};

impl Exchange {
    /// The request toward the origin: hop-by-hop headers gone, Host set.
    pub(in crate::http) fn upstream_request(
        &self,
        parts: &http::request::Parts,
        body: &Bytes,
        h2: bool,
    ) -> Option<Request<UpBody>> {
        let mut headers = parts.headers.clone();
        strip_hop_by_hop(&mut headers);
        headers.remove(header::HOST);
        let mut path_and_query = self.target.path_and_query.clone();
        if let Some(injection) = &self.injection {
            injection.apply(&mut headers, &mut path_and_query)?;
        }
        if self.guarded() {
            decode::offer(&mut headers);
            // A range of an echo is a piece of the secret too short for the guard to know:
            // the whole representation comes back, and is guarded whole.
            headers.remove(header::RANGE);
            headers.remove(header::IF_RANGE);
            // The pre-standard name some servers (Apache httpd) still honour.
            headers.remove("request-range");
        }
        if let Some((name, value)) = &self.added_key {
            headers.insert(name.clone(), value.clone());
        }
        if self.grpc && h2 {
            crate::http::message::grpc::prepare_request(&mut headers, self.guarded());
        }
        let authority = self.target.authority();
        if !h2 {
            headers.insert(header::HOST, HeaderValue::from_str(&authority).ok()?);
        }
        if body.is_empty() && matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
        if let Some(injection) = &self.injection {
            let leaving = sigv4::Outgoing {
                method: parts.method.as_str(),
                scheme: match self.target.scheme {
                    Scheme::Https => "https",
                    Scheme::Http => "http",
                },
                authority: &authority,
                body,
            };
            injection.sign(&leaving, &mut path_and_query, &mut headers)?;
        }
        let uri = if h2 {
            format!("{}://{authority}{path_and_query}", "https")
        } else if let Some(hop) = self.plain_hop() {
            // An http origin behind a hop: absolute form, and the hop's credential.
            hop.authorize(&mut headers);
            format!("http://{authority}{path_and_query}")
        } else {
            path_and_query
        };
        let mut builder = Request::builder().method(parts.method.clone()).uri(uri);
        if let Some(h) = builder.headers_mut() {
            *h = headers;
        }
        builder.body(UpBody::Empty).ok()
    }

    /// `DISPATCH_STARTED` is durable before the first request byte enters the socket.
    pub(in crate::http) async fn dispatch(
        &mut self,
        route: &Route,
        key: String,
        dialed: Dialed,
        mut req: Request<UpBody>,
        body: Bytes,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        let drafts = self.inv.attempt_drafts(&dialed.attempts);
        let dispatch = Dispatch {
            connection_id: None,
            reused_connection: false,
            address: Some(dialed.address.to_string()),
            tls: dialed.tls.clone(),
        };
        if let Err(out) = self.dispatch_boundary(drafts, dispatch).await {
            return out;
        }
        self.request_bytes = body.len() as u64;
        let (tap, first_write) = Tap::new(dialed.stream);
        // A bodiless request is written when its head is: the tap sees that.
        let sent_rx = attach_body(&mut req, body).unwrap_or(first_write);
        let sender = match Sender::handshake(tap, dialed.h2).await {
            Ok(s) => s,
            Err(diag) => {
                return Outgoing::Respond(
                    self.remote_failure(Code::RemoteOutcomeUnknown, diag).await,
                );
            }
        };
        let conn = Conn {
            sender,
            address: dialed.address.to_string(),
            tls: dialed.tls,
        };
        self.exchange_over(route, key, conn, req, sent_rx, reply)
            .await
    }

    /// Dispatch on a pooled connection: no setup stages, `reused_connection` as evidence.
    pub(in crate::http) async fn dispatch_reused(
        &mut self,
        route: &Route,
        key: String,
        conn: Conn,
        mut req: Request<UpBody>,
        body: Bytes,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        let dispatch = Dispatch {
            connection_id: None,
            reused_connection: true,
            address: Some(conn.address.clone()),
            tls: conn.tls.clone(),
        };
        let crossed = match self.twin.is_some() {
            // The preflight and the twin slot ride with DISPATCH_STARTED: one write.
            true => self.claimed_boundary(route, dispatch).await,
            false => self.dispatch_boundary(vec![], dispatch).await,
        };
        if let Err(out) = crossed {
            return out;
        }
        crate::journal::pause_before_send().await;
        self.request_bytes = body.len() as u64;
        let sent_rx = attach_body(&mut req, body).unwrap_or_else(|| {
            // hyper writes a bodiless request as soon as it is sent on a ready connection.
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(DeliveryEnd::Delivered);
            rx
        });
        self.exchange_over(route, key, conn, req, sent_rx, reply)
            .await
    }

    /// The `via` hop an http request is written to (an https one goes through its tunnel).
    pub(in crate::http) fn plain_hop(&self) -> Option<&Hop> {
        self.hop
            .as_ref()
            .filter(|_| self.target.scheme == Scheme::Http)
    }

    /// Who the request's bytes go to: the hop for an http origin behind one, else the
    /// origin (an https origin's TLS runs end to end through the hop's tunnel).
    pub(in crate::http) fn written_to(&self) -> String {
        self.plain_hop()
            .map_or_else(|| "origin".to_owned(), |h| h.evidence_name(None))
    }

    /// `DISPATCH_STARTED` made durable: from here on nothing is ever `not_attempted`.
    pub(in crate::http) async fn dispatch_boundary(
        &mut self,
        drafts: Vec<Draft>,
        dispatch: Dispatch,
    ) -> Result<(), Outgoing> {
        let hop = self.written_to();
        self.inv
            .dispatch_boundary(drafts, dispatch, &hop)
            .await
            .map_err(|env| Outgoing::Respond(respond::envelope(&env)))
    }

    /// Sends, receives, and hands a still-usable connection back to the pool.
    pub(in crate::http) async fn exchange_over(
        &mut self,
        route: &Route,
        key: String,
        mut conn: Conn,
        req: Request<UpBody>,
        sent_rx: oneshot::Receiver<DeliveryEnd>,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Outgoing {
        let timeout = route.response_timeout;
        let waited = self
            .await_head(&mut conn.sender, req, sent_rx, timeout, reply)
            .await;
        let (resp, conn) = match waited {
            Ok(r) => (r, conn),
            Err(HeadError::Failed(code, diag)) => {
                return Outgoing::Respond(self.remote_failure(code, diag).await);
            }
            Err(HeadError::Unwritten(req, diag)) => {
                match self.resend_unwritten(route, *req, diag, reply).await {
                    Ok(sent) => sent,
                    Err(out) => return out,
                }
            }
        };
        // The request body was handed over: its bytes are no longer held.
        self.held = Reservation::default();
        let out = self.receive(route, resp, reply).await;
        // h2 multiplexes: a gRPC call still streaming leaves the connection free for the next.
        let streaming_grpc = self.grpc && conn.sender.is_h2();
        match out {
            Outgoing::Deliver { .. } => self.proxy.pool.give(key, conn),
            Outgoing::Stream { .. } if streaming_grpc => self.proxy.pool.give(key, conn),
            _ => {}
        }
        out
    }

    /// hyper handed the request back unwritten, which proves nothing was sent: it goes out
    /// once more, in the same generation, on a fresh connection whose stages are recorded.
    pub(in crate::http) async fn resend_unwritten(
        &mut self,
        route: &Route,
        req: Request<UpBody>,
        why: String,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Result<(Response<Incoming>, Conn), Outgoing> {
        let unknown = |diag: String| (Code::RemoteOutcomeUnknown, diag);
        let (tls, dns) = (&self.proxy.tls, &self.proxy.dns);
        let dialed = dial(route, &self.target, tls, dns, self.hop.as_ref()).await;
        let mut attempts = match &dialed {
            Ok(d) => d.attempts.clone(),
            Err(f) => f.attempts.clone(),
        };
        if let Some(first) = attempts.first_mut() {
            let prior = first
                .diagnostic
                .take()
                .map(|d| format!("; {d}"))
                .unwrap_or_default();
            first.diagnostic = Some(format!(
                "sent again: the request came back unwritten ({why}){prior}"
            ));
        }
        let drafts = self.inv.attempt_drafts(&attempts);
        let _ = self.inv.record(drafts).await;
        let failed = match dialed {
            Err(f) => unknown(format!("{why}; a fresh connection failed: {}", f.code)),
            Ok(d) if d.h2 != is_h2_request(&req) => {
                unknown(format!("{why}; the origin changed protocol"))
            }
            Ok(d) => return self.send_fresh(route, d, req, reply).await,
        };
        Err(Outgoing::Respond(
            self.remote_failure(failed.0, failed.1).await,
        ))
    }

    pub(in crate::http) async fn send_fresh(
        &mut self,
        route: &Route,
        dialed: Dialed,
        req: Request<UpBody>,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Result<(Response<Incoming>, Conn), Outgoing> {
        let (tap, first_write) = Tap::new(dialed.stream);
        let (parts, body) = req.into_parts();
        let (body, sent_rx) = match body {
            UpBody::Full(b) => {
                let (b, rx) = b.reissue();
                (UpBody::Full(b), rx)
            }
            UpBody::Empty => (UpBody::Empty, first_write),
        };
        let mut conn = match Sender::handshake(tap, dialed.h2).await {
            Ok(sender) => Conn {
                sender,
                address: dialed.address.to_string(),
                tls: dialed.tls,
            },
            Err(diag) => {
                let resp = self.remote_failure(Code::RemoteOutcomeUnknown, diag).await;
                return Err(Outgoing::Respond(resp));
            }
        };
        let req = Request::from_parts(parts, body);
        let timeout = route.response_timeout;
        let waited = self
            .await_head(&mut conn.sender, req, sent_rx, timeout, reply)
            .await;
        match waited {
            Ok(resp) => Ok((resp, conn)),
            Err(HeadError::Failed(code, diag)) => {
                Err(Outgoing::Respond(self.remote_failure(code, diag).await))
            }
            // Handed back a second time: give up, without a third connection.
            Err(HeadError::Unwritten(_, diag)) => Err(Outgoing::Respond(
                self.remote_failure(Code::RemoteOutcomeUnknown, diag).await,
            )),
        }
    }

    pub(in crate::http) async fn remote_failure(
        &mut self,
        code: Code,
        diagnostic: String,
    ) -> Response<ProxyBody> {
        respond::envelope(&self.inv.fail_with(code, diagnostic).await)
    }

    /// How long writing the request body may take beyond `response_timeout`: its size at
    /// `min_upload_rate` (none when the rate is off).
    fn write_allowance(&self) -> Duration {
        match self.config.proxy.min_upload_rate {
            0 => Duration::from_secs(86_400 * 365),
            rate => Duration::from_secs_f64(self.request_bytes as f64 / rate as f64),
        }
    }

    /// Waits for the response head; `response_timeout` runs from the request fully written,
    /// and before that the write itself is bounded (`write_allowance`).
    pub(in crate::http) async fn await_head(
        &mut self,
        sender: &mut Sender,
        req: Request<UpBody>,
        mut sent_rx: oneshot::Receiver<DeliveryEnd>,
        response_timeout: Duration,
        reply: &mut oneshot::Sender<Response<ProxyBody>>,
    ) -> Result<Response<Incoming>, HeadError> {
        let send = sender.send(req);
        tokio::pin!(send);
        let mut written = false;
        let mut cancelled = false;
        // Until the request is written, the origin must take it at least as fast as an
        // agent must send a body (`min_upload_rate`): one that never reads it would hold the
        // exchange, its budget and the agent's busy place for ever.
        let writing = response_timeout + self.write_allowance();
        let deadline = tokio::time::sleep_until(tokio::time::Instant::now() + writing);
        tokio::pin!(deadline);
        loop {
            // Biased: a request written and answered in one poll still records REQUEST_SENT
            // before the answer ends the wait.
            tokio::select! {
                biased;
                s = &mut sent_rx, if !written => {
                    written = true;
                    if matches!(s, Ok(DeliveryEnd::Delivered)) {
                        let sent = RequestSent { bytes: self.request_bytes };
                        let sent = Draft::observed(Body::RequestSent(sent)).hop(&self.written_to());
                        self.inv.observe(vec![sent]).await;
                    }
                    deadline.as_mut().reset(tokio::time::Instant::now() + response_timeout);
                }
                r = &mut send => {
                    return r.map_err(|e| match e {
                        SendFailure::Unwritten(req, diag) => HeadError::Unwritten(req, diag),
                        SendFailure::Failed(diag) => HeadError::Failed(Code::RemoteOutcomeUnknown, diag),
                    });
                }
                () = &mut deadline => {
                    let why = match written {
                        true => format!("no response head within {response_timeout:?}"),
                        false => format!("the origin did not take the whole request within {writing:?}"),
                    };
                    return Err(HeadError::Failed(Code::RemoteTimeout, why));
                }
                () = reply.closed(), if !cancelled => {
                    cancelled = true;
                    let proxy = self.proxy.clone();
                    let _departing = proxy.departures.mark(self.inv.id());
                    self.inv.caller_cancelled().await;
                }
            }
        }
    }
}

/// Why no response head arrived.
pub(in crate::http) enum HeadError {
    /// hyper handed the request back unwritten.
    Unwritten(Box<Request<UpBody>>, String),
    /// It may have been written: the contract code and the transport's words.
    Failed(Code, String),
}

/// An h2 request carries an absolute URI; an HTTP/1.1 one is origin-form.
pub(in crate::http) fn is_h2_request(req: &Request<UpBody>) -> bool {
    req.uri().scheme().is_some()
}
