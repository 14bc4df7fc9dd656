//! Bytes both ways once a connection is handed over — a `CONNECT` tunnel or a switched
//! WebSocket: the `pump`, with WebSocket frames read for the guard (`wsframe`). It
//! decides no outcome: it reports how each direction ended, and the caller journals it.

pub(crate) mod pump;
pub(crate) mod wsframe;
