//! A command secret source (SPEC §3.8): the argv runs directly, no shell; its stdout is the
//! secret. Its stderr goes nowhere and its stdout only into the returned value, so neither
//! can reach a log, the journal or an envelope: a failure says only how the command ended.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest a command may run; then it is killed (with its process group).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// More output than this is no secret postern injects.
const MAX_OUTPUT: u64 = 64 * 1024;

/// How a command failed to give a secret: never its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandFailure {
    CouldNotStart(std::io::ErrorKind),
    Exit(i32),
    Signal(i32),
    TimedOut,
    EmptyOutput,
    TooLarge,
    NotText,
    OutputUnreadable,
}

impl CommandFailure {
    /// The evidence's `failure` word.
    pub fn word(self) -> &'static str {
        match self {
            Self::CouldNotStart(_) => "could_not_start",
            Self::Exit(_) => "exit_status",
            Self::Signal(_) => "signal",
            Self::TimedOut => "timed_out",
            Self::EmptyOutput => "empty_output",
            Self::TooLarge => "too_large",
            Self::NotText => "not_text",
            Self::OutputUnreadable => "output_unreadable",
        }
    }
}

impl std::fmt::Display for CommandFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::CouldNotStart(kind) => write!(f, "could not start ({kind})"),
            Self::Exit(n) => write!(f, "exited with status {n}"),
            Self::Signal(n) => write!(f, "was killed by signal {n}"),
            Self::TimedOut => write!(f, "timed out after {}s and was killed", TIMEOUT.as_secs()),
            Self::EmptyOutput => write!(f, "printed nothing"),
            Self::TooLarge => write!(f, "printed more than {MAX_OUTPUT} bytes"),
            Self::NotText => write!(f, "printed bytes that are not UTF-8 text"),
            Self::OutputUnreadable => write!(f, "gave output that could not be read"),
        }
    }
}

/// Runs `argv` for at most `timeout`; its stdout, one trailing newline taken off.
pub fn run(argv: &[String], timeout: Duration) -> Result<String, CommandFailure> {
    let Some((program, args)) = argv.split_first() else {
        return Err(CommandFailure::CouldNotStart(
            std::io::ErrorKind::InvalidInput,
        ));
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // The vault's passphrase is postern's alone.
        .env_remove("POSTERN_VAULT_KEY")
        // Its own group: a timeout kills what it started too.
        .process_group(0)
        .spawn()
        .map_err(|e| CommandFailure::CouldNotStart(e.kind()))?;
    let deadline = Instant::now() + timeout;
    let output = read_in_background(&mut child);
    let Some(status) = wait_until(&mut child, deadline) else {
        stop(&mut child);
        return Err(CommandFailure::TimedOut);
    };
    // The command may have left a child holding stdout open: the deadline still holds.
    let left = deadline.saturating_duration_since(Instant::now());
    let Ok(bytes) = output.recv_timeout(left) else {
        stop(&mut child);
        return Err(CommandFailure::TimedOut);
    };
    secret_of(status, bytes)
}

fn secret_of(
    status: ExitStatus,
    bytes: Result<Vec<u8>, CommandFailure>,
) -> Result<String, CommandFailure> {
    match (status.code(), status.signal()) {
        (Some(0), _) => {}
        (Some(n), _) => return Err(CommandFailure::Exit(n)),
        (None, Some(n)) => return Err(CommandFailure::Signal(n)),
        (None, None) => return Err(CommandFailure::Exit(-1)),
    }
    let text = String::from_utf8(bytes?).map_err(|_| CommandFailure::NotText)?;
    let value = without_final_newline(text);
    if value.is_empty() {
        return Err(CommandFailure::EmptyOutput);
    }
    Ok(value)
}

/// Stdout read on its own thread, so a full pipe never stalls the command.
fn read_in_background(child: &mut Child) -> mpsc::Receiver<Result<Vec<u8>, CommandFailure>> {
    let (tx, rx) = mpsc::channel();
    let Some(stdout) = child.stdout.take() else {
        let _ = tx.send(Err(CommandFailure::OutputUnreadable));
        return rx;
    };
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let read = stdout.take(MAX_OUTPUT + 1).read_to_end(&mut bytes);
        let result = match read {
            Err(_) => Err(CommandFailure::OutputUnreadable),
            Ok(_) if bytes.len() as u64 > MAX_OUTPUT => Err(CommandFailure::TooLarge),
            Ok(_) => Ok(bytes),
        };
        let _ = tx.send(result);
    });
    rx
}

/// The exit status, or `None` when the deadline passed first.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(25));
    }
}

/// Kills the command's process group and reaps the command.
fn stop(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Drops one trailing `\n` or `\r\n`.
pub(super) fn without_final_newline(mut text: String) -> String {
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        ["sh", "-c", script].map(String::from).to_vec()
    }

    #[test]
    fn stdout_is_the_secret_without_its_last_newline() {
        let out = run(&sh("printf 'abc\\n\\n'"), TIMEOUT);
        assert_eq!(out, Ok("abc\n".to_owned()));
        assert_eq!(run(&sh("printf 'x\\r\\n'"), TIMEOUT), Ok("x".to_owned()));
    }

    #[test]
    fn a_failure_says_how_it_ended_and_nothing_it_printed() {
        let exit = run(&sh("echo leaked; echo leaked >&2; exit 3"), TIMEOUT);
        assert_eq!(exit, Err(CommandFailure::Exit(3)));
        assert_eq!(run(&sh("true"), TIMEOUT), Err(CommandFailure::EmptyOutput));
        let gone = run(&["/nonexistent/postern-test".to_owned()], TIMEOUT);
        assert!(matches!(gone, Err(CommandFailure::CouldNotStart(_))));
        assert_eq!(
            run(&sh("kill -9 $$"), TIMEOUT),
            Err(CommandFailure::Signal(9))
        );
    }

    #[test]
    fn a_slow_command_and_what_it_started_are_killed_at_the_deadline() {
        let started = Instant::now();
        // The background sleep keeps stdout open after the shell exits.
        let out = run(&sh("sleep 30 & echo partial"), Duration::from_millis(300));
        assert_eq!(out, Err(CommandFailure::TimedOut));
        let out = run(&sh("sleep 30"), Duration::from_millis(300));
        assert_eq!(out, Err(CommandFailure::TimedOut));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
