//! A program's own SIGTRAP, kept as it set it (issue 31).
//!
//! Every trap a tracer takes (a breakpoint's `int3` or `brk`, the end of a single step) is a
//! SIGTRAP the kernel forces on the thread: where the program ignores SIGTRAP or blocks it,
//! the kernel first resets its disposition to the default and unblocks it
//! (`force_sig_info_to_task`), and the tracer only swallows the signal, not the reset. A
//! program that later raises SIGTRAP itself would then die of it (exit 133), and its signal
//! mask would have changed under it.
//!
//! So while the tracer sets breakpoints or steps, it follows the calls that change the state:
//! it resumes threads with PTRACE_SYSCALL and reads the state from /proc after each
//! `rt_sigaction`, `rt_sigprocmask` and `rt_sigreturn` (and when it first needs it, and for
//! each new thread, which inherits its parent's mask); after each trap of its own it puts back
//! what the kernel took: the mask bit with PTRACE_SETSIGMASK, the ignored disposition with an
//! `rt_sigaction` run in the thread (its flags and mask, which the reset keeps, read first).

/// SIGTRAP's bit in a signal mask.
pub const BIT: u64 = 1 << (libc::SIGTRAP - 1);

/// What a thread's status says of SIGTRAP: ignored (process-wide), blocked (this thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrapState {
    pub ignored: bool,
    pub blocked: bool,
}

/// SIGTRAP's state in the text of /proc/PID/task/TID/status (its SigIgn and SigBlk masks).
pub fn parse_status(text: &str) -> Option<TrapState> {
    let mask = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    Some(TrapState {
        ignored: mask("SigIgn:")? & BIT != 0,
        blocked: mask("SigBlk:")? & BIT != 0,
    })
}

/// SIGTRAP's state of thread `tid` of process `pid` now.
pub fn read(pid: u32, tid: u32) -> Option<TrapState> {
    // (A few hundred bytes: the kernel writes it whole.)
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    parse_status(&text)
}

/// AUDIT_ARCH_I386: the ia32 system calls an x86_64 process can make.
const AUDIT_ARCH_I386: u32 = 0x4000_0003;

/// What a system call may change of SIGTRAP's state for longer than the call itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Change {
    #[default]
    Nothing,
    /// The calling thread's mask.
    Mask,
    /// The process's SIGTRAP action.
    Action,
}

/// What system call `nr` of ABI `arch` (an AUDIT_ARCH_* value) with first argument `arg0`
/// may change. (Only a call that names SIGTRAP changes its action: the process-wide state is
/// read after no other call, as another thread's trap may have reset it a moment before.)
pub fn change_of(arch: u32, nr: u64, arg0: u64) -> Change {
    let trap = arg0 == libc::SIGTRAP as u64;
    if cfg!(target_arch = "x86_64") && arch == AUDIT_ARCH_I386 {
        return match nr {
            // sigreturn, sigprocmask, rt_sigreturn, rt_sigprocmask.
            119 | 126 | 173 | 175 => Change::Mask,
            // signal, sigaction, rt_sigaction.
            48 | 67 | 174 if trap => Change::Action,
            _ => Change::Nothing,
        };
    }
    match nr as libc::c_long {
        libc::SYS_rt_sigprocmask | libc::SYS_rt_sigreturn => Change::Mask,
        libc::SYS_rt_sigaction if trap => Change::Action,
        _ => Change::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sigtrap_of_a_status() {
        let status = "Name:\tx\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n\
                      SigBlk:\t0000000000004012\nSigIgn:\t0000000000001000\n\
                      SigCgt:\t0000000000000000\n";
        assert_eq!(
            parse_status(status),
            Some(TrapState {
                ignored: false,
                blocked: true
            })
        );
        let ignored = status.replace("SigIgn:\t0000000000001000", "SigIgn:\t0000000000000010");
        assert_eq!(
            parse_status(&ignored),
            Some(TrapState {
                ignored: true,
                blocked: true
            })
        );
        assert_eq!(parse_status("SigBlk:\tzz\nSigIgn:\t0\n"), None);
        assert_eq!(parse_status("Name:\tx\n"), None);
    }

    #[test]
    fn knows_the_calls_that_change_signal_state() {
        let native = if cfg!(target_arch = "x86_64") {
            0xc000_003e
        } else {
            0xc000_00b7
        };
        let trap = libc::SIGTRAP as u64;
        let of = |nr: libc::c_long, arg0| change_of(native, nr as u64, arg0);
        assert_eq!(of(libc::SYS_rt_sigaction, trap), Change::Action);
        assert_eq!(
            of(libc::SYS_rt_sigaction, libc::SIGUSR1 as u64),
            Change::Nothing
        );
        assert_eq!(of(libc::SYS_rt_sigprocmask, 0), Change::Mask);
        assert_eq!(of(libc::SYS_rt_sigreturn, 0), Change::Mask);
        assert_eq!(of(libc::SYS_write, trap), Change::Nothing);
        assert_eq!(of(libc::SYS_rt_sigsuspend, 0), Change::Nothing);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(change_of(AUDIT_ARCH_I386, 174, trap), Change::Action);
            assert_eq!(change_of(AUDIT_ARCH_I386, 175, 0), Change::Mask);
            assert_eq!(change_of(AUDIT_ARCH_I386, 13, trap), Change::Nothing);
        }
    }
}
