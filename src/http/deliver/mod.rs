//! The way back to the agent: what an exchange hands the front (`outgoing`), bodies
//! buffered under the `budget` or `stream`ed as they arrive (`body`), and the agent's
//! connection whose flush makes a response delivered (`flushed`, `wire`). It reports
//! when bytes left; it never opens a connection to an origin.

pub(crate) mod body;
pub mod budget;
pub(crate) mod flushed;
pub(crate) mod outgoing;
pub(crate) mod stream;
pub(crate) mod wire;
