//! postern: a credential-injecting forward proxy for AI agents.
//!
//! A request meets the modules in this order: `http`/`ssh` fronts → `policy`
//! (agent, route, fingerprint) → `vault` (credential) → `lifecycle`, which makes
//! `DISPATCH_STARTED` durable in the `journal` before the first byte → upstream.
//! Transports only report observations; the journal's projection asks `contract` what
//! they mean (phase, outcome, retry, evidence). Operators read the journal through
//! `admin` and the `cli`. Shared by every transport: `dns` (name resolution, `[dns]`)
//! and `guard` (the reflection guard over what a remote sends back). Beside the request's
//! path, `audit` exports the journal's events to an OTLP receiver from a task of its own.

pub mod admin;
pub mod audit;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod contract;
pub mod dns;
pub mod guard;
pub mod http;
pub mod jail;
pub mod journal;
pub mod lifecycle;
pub mod listen;
pub mod mcp;
pub mod policy;
pub mod ssh;
pub mod vault;
