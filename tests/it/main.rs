//! Integration tests: the real `postern` binary, real `curl`, loopback only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod admin_api;
mod approvals;
mod audit;
mod cli;
mod crash;
mod crash_http;
mod crash_ssh;
mod credentials;
mod dns;
mod git;
mod hostile_agents;
mod http;
mod https;
mod idempotency;
mod limits;
mod origins;
mod precedence;
mod reflection;
mod retry;
mod retry_origins;
mod serve;
mod ssh;
mod ssh_hostile;
mod ssh_output;
mod ssh_password;
mod ssh_peer;
mod ssh_retry;
mod ssh_session;
mod sshd;
mod streaming;
mod support;
mod tls_origin;
mod tunnel;
mod via;
mod websocket;
