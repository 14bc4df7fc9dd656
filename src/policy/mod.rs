//! Policy before secrets: who the agent is, which route allows the request, and the
//! request's fingerprint. Pure functions over the validated config.

mod agents;
mod fingerprint;
mod routes;

pub use agents::{AgentAuth, authenticate};
pub use fingerprint::fingerprint;
pub use routes::{Target, TargetError, match_route, route_exists_for_connect};
