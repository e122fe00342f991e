//! How a process ended ([`ExitStatus`]), what a wait status of a traced thread says ([`Stop`],
//! decoded once for every handler of the tracer), and the names of signals: shared by the
//! launcher, the tracer, the syscall log and the samplers (a module of their own, so that none
//! of those depends on another for them).

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this status (0 to 255: the low 8 bits of what it passed to exit).
    Code(i32),
    /// This signal killed it.
    Signal(i32),
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            ExitStatus::Code(c) => write!(f, "exited with status {c}"),
            ExitStatus::Signal(s) => match signal_name(s) {
                Some(name) => write!(f, "was killed by {name}"),
                None => write!(f, "was killed by signal {s}"),
            },
        }
    }
}

impl ExitStatus {
    /// The status the shell would report: the code, or 128 + signal.
    pub fn shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }
}

pub(crate) fn decode(status: libc::c_int) -> ExitStatus {
    if libc::WIFSIGNALED(status) {
        ExitStatus::Signal(libc::WTERMSIG(status))
    } else {
        ExitStatus::Code(libc::WEXITSTATUS(status))
    }
}

/// What one wait status of a traced thread says (ptrace(2)), decoded once for every handler
/// of the tracer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The thread is gone: it exited with a code, or a signal killed it.
    Ended(ExitStatus),
    /// A PTRACE_EVENT_CLONE, _FORK, _VFORK or _EXEC stop (or another event): its number.
    Event(i32),
    /// A PTRACE_EVENT_STOP: an interrupt answered, the first stop of a seized or
    /// auto-attached thread, the end of a group-stop, or, when `stopping` (SIGSTOP, SIGTSTP,
    /// SIGTTIN, SIGTTOU) and the thread is not at its first stop, a group-stop.
    Interrupt {
        /// Its signal is one that stops the group.
        stopping: bool,
    },
    /// A syscall-stop (SIGTRAP | 0x80, PTRACE_O_TRACESYSGOOD).
    Syscall,
    /// A SIGTRAP signal-delivery-stop: a breakpoint, the end of a single step, or a SIGTRAP
    /// someone sent (the tracer tells them apart by the siginfo and the code).
    Trap,
    /// Another signal on its way to the thread.
    Signal(i32),
    /// Anything else (a continued status, which the tracer never asks for).
    Other,
}

impl Stop {
    /// Decodes a status from waitpid.
    pub fn of(status: libc::c_int) -> Stop {
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Stop::Ended(decode(status));
        }
        if !libc::WIFSTOPPED(status) {
            return Stop::Other;
        }
        let sig = libc::WSTOPSIG(status);
        match (status >> 16) & 0xffff {
            0 if sig == libc::SIGTRAP | 0x80 => Stop::Syscall,
            0 if sig == libc::SIGTRAP => Stop::Trap,
            0 => Stop::Signal(sig),
            libc::PTRACE_EVENT_STOP => Stop::Interrupt {
                stopping: matches!(
                    sig,
                    libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                ),
            },
            event => Stop::Event(event),
        }
    }

    /// The signal a signal-delivery-stop carries (SIGTRAP for a trap), to deliver or keep.
    pub fn signal(self) -> Option<i32> {
        match self {
            Stop::Trap => Some(libc::SIGTRAP),
            Stop::Signal(sig) => Some(sig),
            _ => None,
        }
    }
}

/// The name of a signal (SIGSEGV...).
pub fn signal_name(sig: i32) -> Option<&'static str> {
    const NAMES: [&str; 32] = [
        "0",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    NAMES.get(sig as usize).copied().filter(|_| sig > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STOPPED: i32 = 0x7f;

    #[test]
    fn wait_statuses_decode_once() {
        assert_eq!(Stop::of(3 << 8), Stop::Ended(ExitStatus::Code(3)));
        // Killed, with a core dump.
        assert_eq!(
            Stop::of(libc::SIGSEGV | 0x80),
            Stop::Ended(ExitStatus::Signal(libc::SIGSEGV))
        );
        assert_eq!(Stop::of(STOPPED | (libc::SIGTRAP << 8)), Stop::Trap);
        assert_eq!(
            Stop::of(STOPPED | ((libc::SIGTRAP | 0x80) << 8)),
            Stop::Syscall
        );
        assert_eq!(
            Stop::of(STOPPED | (libc::SIGUSR1 << 8)),
            Stop::Signal(libc::SIGUSR1)
        );
        // A SIGSTOP sent (signal-delivery-stop) is a signal, not a group-stop.
        assert_eq!(
            Stop::of(STOPPED | (libc::SIGSTOP << 8)),
            Stop::Signal(libc::SIGSTOP)
        );
        for (sig, stopping) in [
            (libc::SIGSTOP, true),
            (libc::SIGTSTP, true),
            (libc::SIGTTIN, true),
            (libc::SIGTTOU, true),
            (libc::SIGTRAP, false),
        ] {
            assert_eq!(
                Stop::of(STOPPED | (sig << 8) | (libc::PTRACE_EVENT_STOP << 16)),
                Stop::Interrupt { stopping },
                "{sig}"
            );
        }
        for event in [
            libc::PTRACE_EVENT_CLONE,
            libc::PTRACE_EVENT_FORK,
            libc::PTRACE_EVENT_VFORK,
            libc::PTRACE_EVENT_EXEC,
        ] {
            assert_eq!(
                Stop::of(STOPPED | (libc::SIGTRAP << 8) | (event << 16)),
                Stop::Event(event)
            );
        }
        assert_eq!(Stop::of(0xffff), Stop::Other); // WIFCONTINUED
    }
}
