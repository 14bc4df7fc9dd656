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

/// Where caught signals go, once the child is known.
pub struct Forwarder(std::sync::mpsc::Sender<u32>);

impl Forwarder {
    pub fn to(self, child: u32) {
        let _ = self.0.send(child);
    }
}

/// Starts the thread that sends every caught signal to the child named later with
/// `Forwarder::to`. Started before the child: after `unshare(CLONE_NEWPID)` this process
/// can start no more threads.
pub fn forwarder(mut pending: Pending) -> Forwarder {
    let (tx, rx) = std::sync::mpsc::channel::<u32>();
    std::thread::spawn(move || {
        let Some(pid) = rx.recv().ok().and_then(|c| i32::try_from(c).ok()) else {
            return;
        };
        let pid = Pid::from_raw(pid);
        for origin in pending.0.forever() {
            if origin.cause == Cause::Kernel {
                continue;
            }
            if let Ok(signal) = Signal::try_from(origin.signal) {
                let _ = kill(pid, signal);
            }
        }
    });
    Forwarder(tx)
}
