//! The agent's side, where every request enters: the listener, proxy auth and identity,
//! `CONNECT` and TLS interception with postern's CA (`mitm`, `sniff`), and the
//! `postern.internal` host (with the GCE metadata server's token path, `metadata`). It hands each request to `exchange` and writes what comes
//! back; it dials no origin and journals no outcome of its own.

pub(crate) mod front;
pub(crate) mod internal;
pub(crate) mod metadata;
pub mod mitm;
pub(crate) mod sniff;
