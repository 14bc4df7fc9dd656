//! What an exchange hands back to the front: a response now, a body to deliver or stream,
//! or a switched connection (WebSocket) to relay.

use std::sync::Arc;

use http::Response;
use hyper::upgrade::OnUpgrade;
use tokio::sync::oneshot;

use super::flushed::DeliveryEnd;
use super::stream::StreamPlan;
use crate::config::Route;
use crate::guard::ReflectionGuard;
use crate::http::message::respond::ProxyBody;
use crate::listen::Busy;

/// What the exchange hands back to the front.
pub(in crate::http) enum Outgoing {
    Respond(Response<ProxyBody>),
    /// A streamed response: the head goes out now, the pump feeds the body.
    Stream {
        resp: Response<ProxyBody>,
        done: oneshot::Receiver<DeliveryEnd>,
        plan: Box<StreamPlan>,
    },
    Deliver {
        resp: Response<ProxyBody>,
        done: oneshot::Receiver<DeliveryEnd>,
    },
    /// A committed `101`: the head goes out, then the relay runs.
    Switch {
        resp: Response<ProxyBody>,
        switch: Box<Switch>,
    },
    /// The agent left; the result is committed and fetchable.
    Gone,
}

/// What runs once the agent has its `101`.
pub(in crate::http) struct Switch {
    pub agent: OnUpgrade,
    pub origin: OnUpgrade,
    pub guard: Arc<ReflectionGuard>,
    pub limits: crate::http::relay::pump::Limits,
    /// The agent's place under its busy limit, held until the relay ends.
    _busy: Busy,
}

impl Switch {
    pub fn new((agent, busy): (OnUpgrade, Busy), origin: OnUpgrade, route: &Route) -> Self {
        Self {
            agent,
            origin,
            guard: ReflectionGuard::none(),
            limits: crate::http::relay::pump::Limits::of(route),
            _busy: busy,
        }
    }
}
