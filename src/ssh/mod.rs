//! SSH egress.
//!
//! Lifecycle of an SSH invocation: `postern ssh-connect` (the agent's ProxyCommand) sends the
//! `preamble` → `front` identifies the agent and matches an `[[ssh_targets]]` entry (refusals
//! are journaled and answered `ERR <envelope>`) → `OK`, then postern terminates SSH with its
//! own `hostkey` (`session`) → each `exec` is checked against the target's `commands` and
//! handed to `ExecDispatch` (`dispatch`); `exec` drives it through `crate::lifecycle`
//! (preflight → credential → approval → `upstream` connection stages → `DISPATCH_STARTED`
//! durable → exec → result → delivery). Anything but `exec` is `UNSUPPORTED_ACTION`.
//!
//! Invariants: postern never fabricates an `exit-status` (its own errors are one stderr line
//! `postern: <envelope JSON>` and a close); no upstream byte before a target matched; the
//! vault's key or password never leaves `upstream`; what the remote prints passes the
//! reflection guard (`screen`) before the agent or the stored result sees it.

pub mod dispatch;
mod exec;
pub mod front;
pub mod hostkey;
mod output;
pub mod preamble;
mod refuse;
pub mod retry;
mod screen;
mod session;
pub mod upstream;

pub use dispatch::{AgentChannel, AgentInput, ExecCall, ExecDispatch, InputEvent, NotBuilt};
pub use exec::{Exec, Sessions};
pub use front::{SshFront, serve};
