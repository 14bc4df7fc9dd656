//! Policy before secrets: who the agent is, which route allows the request, and the
//! request's fingerprint (pure functions over the validated config); and the requests a
//! route holds for an operator's approval.

mod agents;
pub mod approvals;
mod fingerprint;
mod path;
pub mod placeholder;
mod routes;
pub mod sigv4;

pub use agents::{AgentAuth, acts_now, authenticate, authenticate_pair};
pub use fingerprint::{covered_headers, fingerprint};
pub use routes::{
    Specificity, Target, TargetError, admits, connect_denial_field, credentials_at_host,
    denial_field, match_connect, match_connect_plain, match_route, match_token_route,
    route_is_built, route_problems, specificity, still_routes, token_target,
};
