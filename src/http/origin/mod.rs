//! The origin's side: connecting (`upstream`, through a `via` hop), the credential put on
//! the egress hop (`inject`), idle connections (`pool`), then the boundary and the send
//! (`dispatch`, observed by `tap`) and the response (`receive`). No request byte leaves
//! before `DISPATCH_STARTED` is durable; it never writes to the agent's connection.

pub(crate) mod dispatch;
pub(crate) mod inject;
pub(crate) mod mint;
pub(crate) mod pool;
pub(crate) mod receive;
pub(crate) mod sigv4;
pub(crate) mod tap;
pub mod upstream;
