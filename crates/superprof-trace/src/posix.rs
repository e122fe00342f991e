//! The process-control system calls of the launcher, wrapped: signal dispositions and masks,
//! pipes, fork and exec, waits and kills. Every unsafe block of launching lives here; the
//! launcher (launch.rs) is safe code.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The kernel's `struct sigaction` (x86_64 and AArch64 alike). The C library's sigaction
/// refuses the two signals it keeps for itself (32 and 33), which a process can still inherit
/// ignored: glibc's posix_spawn leaves them so in its children.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// rt_sigaction, straight to the kernel: sets `sig` to `handler` (SIG_DFL or SIG_IGN) if
/// given, and returns the disposition it had. Async-signal-safe.
pub fn kernel_sigaction(sig: i32, handler: Option<usize>) -> Option<usize> {
    let new = handler.map(|h| KernelSigaction {
        handler: h,
        flags: 0,
        restorer: 0,
        mask: 0,
    });
    let mut old = KernelSigaction {
        handler: 0,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    let new_ptr = new
        .as_ref()
        .map_or(std::ptr::null(), |n| n as *const KernelSigaction);
    // SAFETY: both pointers are null or point to a KernelSigaction, the layout the kernel
    // reads and writes for an 8-byte signal set; SIG_DFL and SIG_IGN need no restorer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig as libc::c_long,
            new_ptr,
            &mut old as *mut KernelSigaction,
            8 as libc::c_long,
        )
    };
    (rc == 0).then_some(old.handler)
}

/// Unblocks every signal of the calling thread. Async-signal-safe.
pub fn unblock_all_signals() {
    // SAFETY: installing an empty mask for the calling thread.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
}

/// A pipe: (read end, write end).
pub fn pipe(flags: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two fresh descriptors that we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The pipes of [`fork_held_exec`]: the child waits until `go` (a pipe's read end) reaches
/// end-of-file (`go_w`, the write end, is closed in the child so that only the parent's copy
/// counts); an exec error's errno goes to `status` (4 bytes).
pub struct HeldPipes<'a> {
    /// The read end the child waits on.
    pub go: &'a OwnedFd,
    /// Its write end (the parent's; closed in the child).
    pub go_w: &'a OwnedFd,
    /// Where the child writes an exec error's errno.
    pub status: &'a OwnedFd,
}

/// Forks a child that first calls `before_exec`, then waits on `pipes.go`, then execs `prog`
/// with `argv` (null-terminated) and `envp` (null-terminated; None: this process's
/// environment); if exec fails, its errno goes to `pipes.status` and the child exits 127.
/// Started in `cgroup` where one is given and the kernel can. Returns the child's pid and
/// whether it is in `cgroup`. `before_exec` runs in the child of a possibly multi-threaded
/// process: it must call only async-signal-safe functions.
pub fn fork_held_exec(
    prog: &CStr,
    argv: &[*const libc::c_char],
    envp: Option<&[*const libc::c_char]>,
    pipes: HeldPipes,
    before_exec: fn(),
    cgroup: Option<std::os::fd::BorrowedFd>,
) -> io::Result<(u32, bool)> {
    let HeldPipes { go, go_w, status } = pipes;
    assert!(
        argv.last().is_some_and(|p| p.is_null()),
        "argv ends in null"
    );
    assert!(
        envp.is_none_or(|e| e.last().is_some_and(|p| p.is_null())),
        "envp ends in null"
    );
    // Straight into the cgroup where one is given and the kernel can (clone3's
    // CLONE_INTO_CGROUP, Linux 5.7): no write to cgroup.procs afterwards, which waits for the
    // kernel's RCU (about 10 ms).
    let mut placed = false;
    let mut pid: libc::c_long = -1;
    if let Some(cg) = cgroup {
        pid = clone_into_cgroup(cg);
        placed = pid >= 0;
    }
    if pid < 0 {
        // SAFETY: the child only calls async-signal-safe functions (close, before_exec, read,
        // execve, write, _exit) on memory prepared before the fork.
        pid = libc::c_long::from(unsafe { libc::fork() });
    }
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; `environ` is the process environment, unchanged since fork;
        // `argv` and `envp` are null-terminated and their strings outlive the exec.
        unsafe {
            libc::close(go_w.as_raw_fd());
            before_exec();
            let mut b = 0u8;
            while libc::read(go.as_raw_fd(), &mut b as *mut u8 as *mut libc::c_void, 1) < 0 {}
            extern "C" {
                static environ: *const *const libc::c_char;
            }
            let env = envp.map_or(environ, |e| e.as_ptr());
            libc::execve(prog.as_ptr(), argv.as_ptr(), env);
            let err = *libc::__errno_location();
            let bytes = err.to_ne_bytes();
            libc::write(status.as_raw_fd(), bytes.as_ptr() as *const libc::c_void, 4);
            libc::_exit(127);
        }
    }
    Ok((pid as u32, placed))
}

/// clone3's arguments (`struct clone_args`, CLONE_ARGS_SIZE_VER2: 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// A fork (a copy of the calling thread, SIGCHLD at its end) whose child starts in cgroup
/// `cg`: 0 in the child, its pid in the parent, -1 where the kernel cannot (the caller forks
/// and moves it).
fn clone_into_cgroup(cg: std::os::fd::BorrowedFd) -> libc::c_long {
    use std::os::fd::AsRawFd;
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cg.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 reads `args` (its size given); without CLONE_VM the child gets a copy of
    // this thread's memory, as after fork, and runs only async-signal-safe calls (see
    // fork_held_exec) until its exec.
    unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    }
}

/// Forks a child that leaves superprof's session and process group (so that no signal of
/// the terminal reaches it), asks to be killed when its parent thread ends, asks to be traced
/// by it (PTRACE_TRACEME) and stops itself with SIGSTOP: a process superprof drives through
/// ptrace alone. Returns its pid; the caller waits for the stop.
pub fn fork_stopped_tracee() -> io::Result<u32> {
    // SAFETY: the child only makes system calls (async-signal-safe) before it stops; it never
    // runs on by itself afterwards (its tracer sets its registers).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: plain system calls in the child, see above.
        unsafe {
            libc::setsid();
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == 0 {
                libc::syscall(libc::SYS_kill, libc::getpid(), libc::SIGSTOP);
            }
            libc::_exit(127);
        }
    }
    Ok(pid as u32)
}

/// waitpid on child `pid`: its raw status once it has ended, `None` if it still runs (with
/// `nohang`). EINTR comes back as an error of kind `Interrupted`.
pub fn waitpid(pid: u32, nohang: bool) -> io::Result<Option<libc::c_int>> {
    let mut status = 0;
    let flags = if nohang { libc::WNOHANG } else { 0 };
    // SAFETY: waitpid with a valid out-pointer.
    match unsafe { libc::waitpid(pid as i32, &mut status, flags) } {
        0 => Ok(None),
        r if r == pid as i32 => Ok(Some(status)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Sends `sig` to process `pid`; errors (no such process) are ignored.
pub fn kill(pid: u32, sig: libc::c_int) {
    // SAFETY: sending a signal has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Waits at most `ms` milliseconds for `fd` to be readable (or at its end).
pub fn poll_readable(fd: &OwnedFd, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

/// One read(2) into `buf`.
pub fn read(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: reading at most buf.len() bytes into `buf`, which we own.
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Runs the calling thread and process `other` on the CPU the thread is on now, until the
/// guard is dropped (then the thread may run anywhere it could before): two processes that
/// hand the CPU to each other at every step, with no wakeup across CPUs.
pub fn pin_with(other: u32) -> Option<Pinned> {
    // SAFETY: sched_getcpu has no preconditions; the cpu sets are plain data filled by the
    // kernel or by CPU_SET within their size.
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu < 0 {
            return None;
        }
        let mut before: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut before) != 0 {
            return None;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut one);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one);
        libc::sched_setaffinity(other as i32, std::mem::size_of::<libc::cpu_set_t>(), &one);
        Some(Pinned(before))
    }
}

/// The calling thread's CPUs before [`pin_with`], put back when dropped.
pub struct Pinned(libc::cpu_set_t);

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: restoring the calling thread's own affinity from a set the kernel filled.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0);
        }
    }
}

/// A pidfd: readable once the process has exited (Linux 5.3+).
pub fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative return is a fresh descriptor that we now own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// CPU time (user, system) of this process's children that ended and were waited for, and of
/// their own waited-for descendants.
pub fn children_cpu_time() -> (std::time::Duration, std::time::Duration) {
    // SAFETY: getrusage writes into a local rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| {
        std::time::Duration::new(
            t.tv_sec.max(0) as u64,
            (t.tv_usec.clamp(0, 999_999) * 1000) as u32,
        )
    };
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// The kernel's clock ticks per second, the unit of /proc/PID/stat's times.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no side effects.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64
}
