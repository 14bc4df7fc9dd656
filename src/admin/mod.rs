//! The operator API (SPEC §5.2): loopback HTTP/1.1, JSON shapes of SPEC §5.5.

mod agents;
mod api;
pub mod metrics;
pub mod reload;
mod retry;
mod state;

pub use api::{missing_secrets, parse_range, secret_names, serve};
pub use state::AdminState;
