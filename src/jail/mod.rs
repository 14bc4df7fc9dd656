//! `postern jail`: run one command whose only way out is postern (SPEC §5.7).
//!
//! Two processes, because a namespace is entered by a single-threaded process:
//! - the **outer** one (`outer`) stays in the host's network namespace. It checks the
//!   agent's token, makes a private directory (the relay socket, the CA files, the
//!   generated `resolv.conf` and `known_hosts`), listens on that unix socket and bridges
//!   each connection to the daemon's proxy or SSH front; it re-executes this binary as
//!   `postern __jail-inside`, forwards signals to it, passes its exit status on and
//!   removes the directory.
//! - the **inner** one (`inside`) unshares user, network and mount namespaces first thing,
//!   brings `lo` up, binds its listeners, hides the state directory and the config, and
//!   relays what CMD opens (`127.0.0.1:3128`, `:2222`, the transparent `:443`/`:80` and the
//!   DNS stub on `:53`) to the unix socket. It starts CMD through
//! - the jail's **init** (`init`), PID 1 of a new PID namespace: it mounts that namespace's
//!   /proc, locks every mount behind a second user namespace, runs CMD, reaps, and takes every
//!   process left with it when CMD ends.
//!
//! Invariant: CMD never runs before the namespaces, the hiding mounts and the token check
//! are in place; any failure before it is exit status 125.

mod dns;
mod inner;
mod namespace;
mod outer;
mod plan;
mod relay;
mod signals;
mod sniff;

pub use inner::{init, inside};
pub use namespace::Ids;
pub use outer::{Outer, PrivateDir, run};
pub use plan::Plan;
pub use relay::dialable;

/// The exit status for a jail that could not be set up (CMD did not run), as `env`/`chroot`
/// use 125 for their own failures.
pub const EXIT_SETUP: u8 = 125;

/// The file names inside the jail's private directory.
pub mod files {
    pub const SOCKET: &str = "relay.sock";
    pub const CA: &str = "ca.pem";
    pub const BUNDLE: &str = "bundle.pem";
    pub const KNOWN_HOSTS: &str = "known_hosts";
    pub const RESOLV: &str = "resolv.conf";
    /// An empty file bound over the config file.
    pub const EMPTY: &str = "empty";
    /// The system ssh_config with postern's ProxyCommand first.
    pub const SSH_CONFIG: &str = "ssh_config";
}

/// The addresses CMD sees inside the jail.
pub mod inside_addr {
    pub const PROXY: &str = "127.0.0.1:3128";
    pub const SSH: &str = "127.0.0.1:2222";
}

/// The environment variable that carries the plan from the outer to the inner process
/// (removed before CMD runs).
pub const PLAN_VAR: &str = "POSTERN_JAIL_PLAN";

/// One `postern jail: …` line on stderr (shared with CMD, so one line per event).
fn note(message: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "postern jail: {message}");
}

/// `status` as a shell reports it: the exit code, or 128 + the signal that ended it.
pub fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from((128 + sig) & 0xff).unwrap_or(1),
        (None, None) => 1,
    }
}
