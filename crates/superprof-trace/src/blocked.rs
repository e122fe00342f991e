//! Where a thread waits, read without stopping it: /proc/PID/task/TID/syscall gives, for a
//! thread blocked in the kernel, the system call it is in (with its arguments) and the user
//! stack pointer and pc it will return to. With the stack read through process_vm_readv, that
//! is enough to unwind the waiting thread's user stack (CFI from the pc and sp), so that an
//! off-CPU sample (issue 16) needs no ptrace stop: interrupting a thread blocked in
//! epoll_wait, say, would make the call fail with EINTR.

/// A thread blocked in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    /// The system call it waits in; None when blocked outside one (a page fault, a stop).
    pub syscall: Option<u64>,
    /// The call's first argument (a file descriptor, for the calls that take one).
    pub arg0: u64,
    /// The user stack pointer it goes on from.
    pub sp: u64,
    /// The user pc it goes on from (in a system call: the instruction after it).
    pub pc: u64,
}

/// Parses the text of a syscall file: `NR ARG0..ARG5 SP PC`, `-1 SP PC` (blocked outside a
/// system call) or `running` (None). Anything else is None: the file comes from /proc, and is
/// read as hostile input.
pub fn parse(text: &str) -> Option<Blocked> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let hex = |w: &str| u64::from_str_radix(w.strip_prefix("0x")?, 16).ok();
    match words.as_slice() {
        ["-1", sp, pc] => Some(Blocked {
            syscall: None,
            arg0: 0,
            sp: hex(sp)?,
            pc: hex(pc)?,
        }),
        [nr, args @ .., sp, pc] if args.len() == 6 => {
            let nr: u64 = nr.parse().ok()?;
            Some(Blocked {
                syscall: Some(nr),
                arg0: hex(args[0])?,
                sp: hex(sp)?,
                pc: hex(pc)?,
            })
        }
        _ => None,
    }
}

/// The state letter of a /proc stat line (`PID (COMM) S ...`; the name may hold spaces and
/// parentheses, so the state follows the last `)`).
pub fn parse_state(stat: &[u8]) -> Option<u8> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    match stat.get(close + 1..close + 3)? {
        [b' ', s] => Some(*s),
        _ => None,
    }
}

/// A thread's syscall and stat files, kept open: each read is one pread (the kernel writes
/// the file again at every read from offset 0).
pub struct BlockedReader {
    syscall: std::fs::File,
    stat: std::fs::File,
}

/// What [`BlockedReader::read`] finds of a thread that is not on a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpuState {
    /// Where it waits: the system call, its first argument, the user sp and pc.
    pub blocked: Blocked,
    /// Its state letter in /proc stat: `S` or `D` for a wait; `R` when it was woken and
    /// waits for a CPU; `t` or `T` when stopped (by a tracer, or a signal).
    pub state: u8,
}

impl OffCpuState {
    /// Waiting for an event of its own (sleeping, blocked): not runnable, not stopped.
    pub fn waiting(&self) -> bool {
        !matches!(self.state, b'R' | b't' | b'T' | b'X' | b'Z')
    }
}

impl BlockedReader {
    /// Opens the syscall and stat files of thread `tid` of process `pid`; None if either
    /// cannot be opened (the thread is gone, or its files are not superprof's to read).
    pub fn open(pid: u32, tid: u32) -> Option<BlockedReader> {
        let open = |f: &str| std::fs::File::open(format!("/proc/{pid}/task/{tid}/{f}")).ok();
        Some(BlockedReader {
            syscall: open("syscall")?,
            stat: open("stat")?,
        })
    }

    /// Where the thread waits now; None when it runs, or has gone.
    pub fn read(&self) -> Option<OffCpuState> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 512];
        let n = self.syscall.read_at(&mut buf, 0).ok()?;
        let blocked = parse(std::str::from_utf8(&buf[..n]).ok()?)?;
        let n = self.stat.read_at(&mut buf, 0).ok()?;
        let state = parse_state(&buf[..n])?;
        Some(OffCpuState { blocked, state })
    }
}

/// The threads of process `pid` that wait for an event now (asleep, blocked), with where.
pub fn waiting_threads(pid: u32) -> Vec<(u32, Blocked)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|tid| {
            let s = BlockedReader::open(pid, tid)?.read()?;
            s.waiting().then_some((tid, s.blocked))
        })
        .collect()
}

/// Whether a thread blocked at `b` in process `pid` may be stopped (ptrace) to read its
/// registers: only in a system call that the kernel restarts unseen after a stop
/// (ERESTARTSYS and its kin, or a restart block), and not in one outside a call (a page fault
/// in `D`: a stop would wait for the disk). Every other call is read without a stop: some
/// fail with EINTR when their thread is stopped and resumed though no handler runs
/// (signal(7): epoll_wait, semtimedop, io_getevents, io_uring_enter...), and a read or write
/// does on a socket with a timeout (SO_RCVTIMEO), which is why those are stopped only on a
/// file descriptor that is not a socket. `name` is the call's name on this machine.
pub fn restarts_after_stop(pid: u32, b: &Blocked, name: &str) -> bool {
    let on_fd = || {
        // The descriptor's target, as /proc shows it: `socket:[INODE]` for a socket.
        std::fs::read_link(format!("/proc/{pid}/fd/{}", b.arg0))
            .is_ok_and(|t| !t.as_os_str().as_encoded_bytes().starts_with(b"socket:"))
    };
    match name {
        "futex" | "nanosleep" | "clock_nanosleep" | "restart_syscall" | "wait4" | "waitid"
        | "poll" | "ppoll" | "select" | "pselect6" | "pause" | "rt_sigsuspend" | "flock" => true,
        "read" | "readv" | "pread64" | "preadv" | "preadv2" | "write" | "writev" | "pwrite64"
        | "pwritev" | "pwritev2" | "fsync" | "fdatasync" => on_fd(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_and_garbage() {
        assert_eq!(
            parse(
                "230 0x0 0x0 0x7fffbaa3b100 0x7fffbaa3b140 0x0 0x0 0x7fffbaa3b0e8 0x7ff3565e9503\n"
            ),
            Some(Blocked {
                syscall: Some(230),
                arg0: 0,
                sp: 0x7fff_baa3_b0e8,
                pc: 0x7ff3_565e_9503
            })
        );
        assert_eq!(
            parse("-1 0x7ffc0185fdd8 0x55d0c0001234"),
            Some(Blocked {
                syscall: None,
                arg0: 0,
                sp: 0x7ffc_0185_fdd8,
                pc: 0x55d0_c000_1234
            })
        );
        assert_eq!(parse("running\n"), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("7 0x1 0x2"), None);
        assert_eq!(parse("x 0 0 0 0 0 0 0x1 0x2"), None);
        assert_eq!(parse("1 0x0 0x0 0x0 0x0 0x0 0x0 0xzz 0x1"), None);
    }

    #[test]
    fn state_after_a_name_with_parentheses() {
        assert_eq!(parse_state(b"12 (a) b) R 1 2 3"), Some(b'R'));
        assert_eq!(parse_state(b"12 (sleeper) S 1"), Some(b'S'));
        assert_eq!(parse_state(b"12 (x)"), None);
        assert_eq!(parse_state(b"garbage"), None);
    }

    /// A sleeping child waits in (clock_)nanosleep, its pc in the C library's code.
    #[test]
    fn a_sleeping_process_is_seen_in_its_sleep() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        let sleeps = if cfg!(target_arch = "x86_64") {
            [35, 230] // nanosleep, clock_nanosleep
        } else {
            [101, 115]
        };
        // Until it sleeps: on its way there (exec, the loader's calls; woken or preempted
        // under load) it may show another call, or state R in one.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut last = None;
        let b = loop {
            let state = BlockedReader::open(pid, pid).and_then(|r| r.read());
            if let Some(s) = state
                .filter(|s| s.waiting() && s.blocked.syscall.is_some_and(|n| sleeps.contains(&n)))
            {
                break s.blocked;
            }
            last = state.or(last);
            assert!(
                std::time::Instant::now() < deadline,
                "never seen in its sleep: {last:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let _ = child.kill();
        let _ = child.wait();
        assert!(b.sp > 0 && b.pc > 0, "{b:?}");
    }
}
