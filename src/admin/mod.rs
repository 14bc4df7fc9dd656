//! The operator API (SPEC §5.2): loopback HTTP/1.1, JSON shapes of SPEC §5.5; and the web
//! console on the same listener (SPEC §5.8, `/ui/`).

mod agents;
mod api;
mod console;
pub mod metrics;
pub mod reload;
mod retry;
mod state;

pub use api::{body_response, missing_secrets, parse_range, secret_names, serve};
pub use console::Sessions;
pub use state::AdminState;
