//! Signals to `postern jail` reach CMD (SPEC §5.7): caught (handlers, so CMD starts with
//! default dispositions and nothing blocked) and sent on to the child. A signal the
//! terminal sent to the whole foreground process group (Ctrl-C: the kernel is its sender)
//! already reached CMD and is not sent twice.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH};
use signal_hook::iterator::SignalsInfo;
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::low_level::siginfo::Cause;

const FORWARDED: [i32; 7] = [SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH];

/// The caught signals, queued until `forward_to` knows the child.
pub struct Pending(SignalsInfo<WithOrigin>);

/// Catches the forwarded signals from now on (before the child starts, so none is lost
/// and none ends this process).
pub fn catch() -> Result<Pending, String> {
    SignalsInfo::<WithOrigin>::new(FORWARDED)
        .map(Pending)
        .map_err(|e| format!("cannot catch signals: {e}"))
}

/// Sends every caught signal to `child`, on a thread of its own, until the process exits.
pub fn forward_to(mut pending: Pending, child: u32) {
    let Ok(pid) = i32::try_from(child) else {
        return;
    };
    let pid = Pid::from_raw(pid);
    std::thread::spawn(move || {
        for origin in pending.0.forever() {
            if origin.cause == Cause::Kernel {
                continue;
            }
            if let Ok(signal) = Signal::try_from(origin.signal) {
                let _ = kill(pid, signal);
            }
        }
    });
}
