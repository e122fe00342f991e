//! ptrace, waitpid and remote memory: the kernel interfaces of the coordinator.

use std::io;

use superprof_unwind::UserRegs;

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn ptrace(req: libc::c_uint, tid: u32, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: every caller passes a request whose `addr`/`data` are either integers or point
    // to memory of the size that request writes (checked at each call site below).
    check(unsafe { libc::ptrace(req, tid as libc::pid_t, addr, data) })
}

/// PTRACE_O_TRACESYSGOOD: system-call stops report SIGTRAP | 0x80.
pub const PTRACE_O_TRACESYSGOOD: usize = 1;
pub const PTRACE_O_TRACEFORK: usize = 1 << 1;
pub const PTRACE_O_TRACEVFORK: usize = 1 << 2;
pub const PTRACE_O_TRACECLONE: usize = 1 << 3;
pub const PTRACE_O_TRACEEXEC: usize = 1 << 4;

pub const PTRACE_EVENT_FORK: i32 = 1;
pub const PTRACE_EVENT_VFORK: i32 = 2;
pub const PTRACE_EVENT_CLONE: i32 = 3;
pub const PTRACE_EVENT_EXEC: i32 = 4;

pub fn seize(tid: u32, options: usize) -> io::Result<()> {
    ptrace(libc::PTRACE_SEIZE, tid, 0, options).map(drop)
}

pub fn interrupt(tid: u32) -> io::Result<()> {
    ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0).map(drop)
}

pub fn cont(tid: u32, sig: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_CONT, tid, 0, sig as usize).map(drop)
}

pub fn cont_syscall(tid: u32, sig: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_SYSCALL, tid, 0, sig as usize).map(drop)
}

/// A stopped thread's signal mask (PTRACE_GETSIGMASK).
pub fn sigmask(tid: u32) -> io::Result<u64> {
    const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
    let mut mask = 0u64;
    // `addr` is the size of the mask (8 bytes), `data` points to those 8 bytes.
    ptrace(PTRACE_GETSIGMASK, tid, 8, &mut mask as *mut u64 as usize)?;
    Ok(mask)
}

/// Sets a stopped thread's signal mask (PTRACE_SETSIGMASK).
pub fn set_sigmask(tid: u32, mask: u64) -> io::Result<()> {
    const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;
    // `addr` is the size of the mask (8 bytes), `data` points to those 8 bytes.
    ptrace(PTRACE_SETSIGMASK, tid, 8, &mask as *const u64 as usize).map(drop)
}

/// Options of a tracee that stopped itself (PTRACE_TRACEME): EXITKILL and the like.
pub fn set_options(tid: u32, options: usize) -> io::Result<()> {
    ptrace(libc::PTRACE_SETOPTIONS, tid, 0, options).map(drop)
}

/// The restartable-sequences area a thread registered (PTRACE_GET_RSEQ_CONFIGURATION):
/// (address, size, signature), or None where it has none or the kernel cannot tell.
pub fn rseq_configuration(tid: u32) -> Option<(u64, u32, u32)> {
    // struct ptrace_rseq_configuration: rseq_abi_pointer u64, rseq_abi_size u32, signature
    // u32, flags u32, pad u32.
    let mut conf = [0u64; 3];
    // `data` points to 24 bytes, the size of the struct the request writes (passed as `addr`).
    let n = ptrace(0x420f, tid, 24, conf.as_mut_ptr() as usize).ok()?;
    let size = conf[1] as u32;
    (n > 0 && conf[0] != 0 && size != 0).then_some((conf[0], size, (conf[1] >> 32) as u32))
}

/// PTRACE_O_EXITKILL: the tracee is killed when its tracer exits.
pub const PTRACE_O_EXITKILL: usize = 1 << 20;

/// One instruction, and if it is a system call, a stop at its entry without running it
/// (PTRACE_SYSEMU_SINGLESTEP, the same number on x86_64 and AArch64).
pub fn sysemu_step(tid: u32) -> io::Result<()> {
    ptrace(32, tid, 0, 0).map(drop)
}

pub fn listen(tid: u32) -> io::Result<()> {
    ptrace(libc::PTRACE_LISTEN, tid, 0, 0).map(drop)
}

pub fn detach(tid: u32, sig: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_DETACH, tid, 0, sig as usize).map(drop)
}

pub fn event_msg(tid: u32) -> io::Result<u64> {
    let mut msg: libc::c_ulong = 0;
    // `data` points to a c_ulong that PTRACE_GETEVENTMSG fills.
    ptrace(
        libc::PTRACE_GETEVENTMSG,
        tid,
        0,
        &mut msg as *mut _ as usize,
    )?;
    Ok(msg as u64)
}

/// Whether the signal of a thread's signal-delivery stop was raised by the kernel (a trap, a
/// fault) rather than sent by a process (kill, tgkill, sigqueue: si_code <= 0, the kernel's own
/// SI_FROMUSER rule). `None` if the siginfo cannot be read.
pub fn signal_from_kernel(tid: u32) -> Option<bool> {
    signal_code(tid).map(|code| code > 0)
}

/// The si_code of a thread's signal-delivery stop (PTRACE_GETSIGINFO).
fn signal_code(tid: u32) -> Option<i32> {
    signal_info(tid).map(|info| info[2])
}

/// A thread's siginfo at a signal-delivery stop, as ints (PTRACE_GETSIGINFO).
fn signal_info(tid: u32) -> Option<[i32; 32]> {
    // siginfo_t is 128 bytes: si_signo, si_errno, si_code, then (64-bit) a padding int and
    // the union, whose first field for SI_USER is si_pid.
    let mut info = [0i32; 32];
    // `data` points to a 128-byte buffer, the size of the siginfo_t PTRACE_GETSIGINFO writes.
    ptrace(libc::PTRACE_GETSIGINFO, tid, 0, info.as_mut_ptr() as usize).ok()?;
    Some(info)
}

/// Whether a SIGTRAP stop of a thread being single-stepped is the end of its step: a trap of
/// the kernel's (si_code > 0), or, after a stepped system call on AArch64, the kernel's
/// generic step report, which says SI_USER with no sender (si_pid 0: no process can be pid
/// 0). None where the siginfo cannot be read.
pub fn step_trap(tid: u32) -> Option<bool> {
    signal_info(tid).map(|info| info[2] > 0 || (info[2] == 0 && info[4] == 0))
}

/// Whether a SIGTRAP stop is the trap of a breakpoint instruction: SI_KERNEL for `int3` on
/// x86_64, TRAP_BRKPT for `brk` on AArch64 (a single step gives TRAP_TRACE, or TRAP_BRKPT
/// after a stepped syscall on x86_64).
pub fn breakpoint_trap(tid: u32) -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    const CODE: i32 = 0x80; // SI_KERNEL
    #[cfg(target_arch = "aarch64")]
    const CODE: i32 = 1; // TRAP_BRKPT
    signal_code(tid).map(|code| code == CODE)
}

/// Whether two processes share one address space (kcmp KCMP_VM): a vfork child, or a child of
/// clone(CLONE_VM). `None` where kcmp is unavailable.
pub fn same_memory(a: u32, b: u32) -> Option<bool> {
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp takes integers only and writes nothing.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            a as libc::c_long,
            b as libc::c_long,
            KCMP_VM,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    (rc >= 0).then_some(rc == 0)
}

const CLONE_VM: u64 = 0x100;
#[cfg(target_arch = "x86_64")]
const CLONE_VFORK: u64 = 0x4000;

/// Whether the clone, clone3, fork or vfork that thread `tid` is stopped in (at its ptrace
/// fork event) shares the memory with the child (CLONE_VM), from the syscall's own
/// arguments. For kernels or sandboxes without kcmp. `None` if it cannot be told.
pub fn clone_shares_memory(tid: u32) -> Option<bool> {
    let r = raw_regs(tid).ok()?;
    #[cfg(target_arch = "x86_64")]
    let (nr, arg0, clone, clone3) = (r.orig_rax, r.rdi, 56, 435);
    #[cfg(target_arch = "aarch64")]
    let (nr, arg0, clone, clone3) = (r.regs[8], r.regs[0], 220, 435);
    let flags = match nr {
        n if n == clone => arg0,
        n if n == clone3 => {
            // struct clone_args starts with the flags.
            let mut b = [0u8; 8];
            if read_memory(tid, arg0, &mut b) != 8 {
                return None;
            }
            u64::from_ne_bytes(b)
        }
        #[cfg(target_arch = "x86_64")]
        57 => 0, // fork
        #[cfg(target_arch = "x86_64")]
        58 => CLONE_VM | CLONE_VFORK, // vfork
        _ => return None,
    };
    Some(flags & CLONE_VM != 0)
}

/// The registers unwinding needs.
pub fn regs(tid: u32) -> io::Result<UserRegs> {
    Ok(user_regs(&raw_regs(tid)?))
}

/// The registers unwinding needs, of a stopped thread's register set.
pub fn user_regs(r: &RawRegs) -> UserRegs {
    #[cfg(target_arch = "x86_64")]
    return UserRegs {
        pc: r.rip,
        sp: r.rsp,
        fp: r.rbp,
        lr: 0,
    };
    #[cfg(target_arch = "aarch64")]
    return UserRegs {
        pc: r.pc,
        sp: r.sp,
        fp: r.regs[29],
        lr: r.regs[30],
    };
}

/// Makes a thread stopped at `r`, whose system call just failed with EINTR because of the
/// stop (no signal is pending for it), run the call again when it goes on: pc back on the
/// `syscall` instruction, the call's number in rax, as the kernel's own restart does. x86_64
/// only (nothing elsewhere).
pub fn undo_eintr(tid: u32, r: &RawRegs) {
    #[cfg(target_arch = "x86_64")]
    {
        if r.rax as i64 != -(libc::EINTR as i64) || (r.orig_rax as i64) < 0 || signal_pending(tid) {
            return;
        }
        let mut n = *r;
        n.rip = r.rip.wrapping_sub(2);
        n.rax = r.orig_rax;
        let _ = set_raw_regs(tid, &n);
    }
    #[cfg(target_arch = "aarch64")]
    let _ = (tid, r);
}

/// Whether a signal is pending for thread `tid` (its own, or its process's), from /proc.
#[cfg(target_arch = "x86_64")]
fn signal_pending(tid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return true; // (unknown: leave it be)
    };
    status.lines().any(|l| {
        matches!(l.split_once(':'), Some(("SigPnd" | "ShdPnd", v)) if !v.trim().trim_start_matches('0').is_empty())
    })
}

/// The system call a thread stopped at `r` was blocked in when the stop interrupted it, where
/// the kernel restarts it as `restart_syscall` when the thread goes on (a sleep's restart
/// block: -ERESTART_RESTARTBLOCK). x86_64 only (None on AArch64, whose stop does not tell).
pub fn interrupted_syscall(r: &RawRegs) -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    return (r.rax as i64 == -516 && (r.orig_rax as i64) >= 0).then_some(r.orig_rax);
    #[cfg(target_arch = "aarch64")]
    {
        let _ = r;
        None
    }
}

/// Collects one pending wait status from any thread this thread traces, without blocking,
/// decoded.
pub fn wait_any_nohang() -> io::Result<Option<(u32, crate::status::Stop)>> {
    let mut status = 0;
    // SAFETY: waitpid with a valid out-pointer.
    // __WNOTHREAD: only this thread's tracees and children; a tracer belongs to one thread,
    // and another thread of superprof may be tracing other processes.
    let rc = unsafe {
        libc::waitpid(
            -1,
            &mut status,
            libc::WNOHANG | libc::__WALL | libc::__WNOTHREAD,
        )
    };
    match rc {
        0 => Ok(None),
        r if r > 0 => Ok(Some((r as u32, crate::status::Stop::of(status)))),
        _ => {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ECHILD) => Ok(None),
                Some(libc::EINTR) => Ok(None),
                _ => Err(e),
            }
        }
    }
}

/// Blocks SIGCHLD in the calling thread (and the threads it creates later), so that
/// `wait_sigchld` can wait for it. Call it before any thread is started.
pub fn block_sigchld() {
    // SAFETY: building and installing a signal mask for this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Waits up to `timeout` for a SIGCHLD (a traced thread changed state).
pub fn wait_sigchld(timeout: std::time::Duration) {
    // SAFETY: sigtimedwait with a valid set and timespec; the siginfo is not needed.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        libc::sigtimedwait(&set, std::ptr::null_mut(), &ts);
    }
}

/// Reads `buf.len()` bytes at `addr` of process `pid`, page by page, stopping at the first
/// unreadable page. Returns the number of bytes read.
pub fn read_memory(pid: u32, addr: u64, buf: &mut [u8]) -> usize {
    if buf.is_empty() {
        return 0;
    }
    const PAGE: u64 = 4096;
    let mut local = Vec::new();
    let mut remote = Vec::new();
    let mut off = 0usize;
    while off < buf.len() {
        let a = addr + off as u64;
        let chunk = ((PAGE - a % PAGE) as usize).min(buf.len() - off);
        local.push(libc::iovec {
            iov_base: buf[off..].as_mut_ptr() as *mut libc::c_void,
            iov_len: chunk,
        });
        remote.push(libc::iovec {
            iov_base: a as *mut libc::c_void,
            iov_len: chunk,
        });
        off += chunk;
    }
    let mut done = 0usize;
    // The kernel takes at most IOV_MAX (1024) elements per call.
    for (l, r) in local.chunks(1024).zip(remote.chunks(1024)) {
        // SAFETY: the local iovecs cover disjoint parts of `buf`, which outlives the call;
        // the remote ones are only addresses in the other process.
        let n = unsafe {
            libc::process_vm_readv(
                pid as libc::pid_t,
                l.as_ptr(),
                l.len() as libc::c_ulong,
                r.as_ptr(),
                r.len() as libc::c_ulong,
                0,
            )
        };
        if n <= 0 {
            break;
        }
        done += n as usize;
        if (n as usize) < l.iter().map(|v| v.iov_len).sum::<usize>() {
            break;
        }
    }
    done
}

/// Writes `data` at `addr` of process `pid` through /proc/PID/mem, which may write to
/// read-only (code) pages of a traced process.
pub fn write_memory(pid: u32, addr: u64, data: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/mem"))?;
    f.write_all_at(data, addr)
}

/// A thread's CPU-time counter: the kernel's sum_exec_runtime from
/// /proc/PID/task/TID/schedstat (a thread CPU clock of another process cannot be read with
/// clock_gettime). It advances at scheduler ticks and switches.
pub struct CpuTime(std::fs::File);

impl CpuTime {
    /// Opens the schedstat file of thread `tid` of process `pid`; None if it cannot be opened
    /// (the thread is gone, or the kernel keeps no scheduler statistics).
    pub fn open(pid: u32, tid: u32) -> Option<CpuTime> {
        std::fs::File::open(format!("/proc/{pid}/task/{tid}/schedstat"))
            .ok()
            .map(CpuTime)
    }

    /// Nanoseconds of CPU time so far.
    pub fn read(&self) -> Option<u64> {
        self.read_with_delay().map(|(cpu, _)| cpu)
    }

    /// Nanoseconds of CPU time so far, and of waiting on a run queue (runnable, not running:
    /// preempted, or woken and not yet on a CPU).
    pub fn read_with_delay(&self) -> Option<(u64, u64)> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        let n = self.0.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let mut w = text.split_whitespace();
        let cpu = w.next()?.parse().ok()?;
        let delay = w.next().and_then(|d| d.parse().ok()).unwrap_or(0);
        Some((cpu, delay))
    }
}

pub fn kill_thread(pid: u32, tid: u32, sig: i32) {
    // SAFETY: tgkill has no memory-safety preconditions.
    unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            pid as libc::c_long,
            tid as libc::c_long,
            sig as libc::c_long,
        );
    }
}

/// The thread-group id of a thread, from /proc.
pub fn tgid_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// What PTRACE_GET_SYSCALL_INFO says about a syscall stop.
#[derive(Debug, Clone, Copy)]
pub enum SyscallInfo {
    /// `arch` is the AUDIT_ARCH_* of the syscall's ABI (an x86_64 process can make ia32 calls).
    Entry {
        arch: u32,
        nr: u64,
        args: [u64; 6],
    },
    Exit {
        rval: i64,
        is_error: bool,
    },
    Other,
}

/// PTRACE_GET_SYSCALL_INFO (Linux 5.3): the syscall number and arguments at entry, the result
/// at exit, the same on every architecture.
pub fn syscall_info(tid: u32) -> io::Result<SyscallInfo> {
    const PTRACE_GET_SYSCALL_INFO: libc::c_uint = 0x420e;
    let mut buf = [0u64; 12]; // struct ptrace_syscall_info is 88 bytes
                              // `data` points to a 96-byte buffer and `addr` gives its size: the kernel writes at most it.
    ptrace(
        PTRACE_GET_SYSCALL_INFO,
        tid,
        std::mem::size_of_val(&buf),
        buf.as_mut_ptr() as usize,
    )?;
    let op = (buf[0] & 0xff) as u8;
    Ok(match op {
        1 => SyscallInfo::Entry {
            arch: (buf[0] >> 32) as u32,
            nr: buf[3],
            args: [buf[4], buf[5], buf[6], buf[7], buf[8], buf[9]],
        },
        2 => SyscallInfo::Exit {
            rval: buf[3] as i64,
            is_error: buf[4] & 0xff != 0,
        },
        _ => SyscallInfo::Other,
    })
}

/// Writes one 8-byte word into a stopped thread's memory (PTRACE_POKEDATA: one syscall, for
/// small writes such as a pushed return address).
pub fn poke(tid: u32, addr: u64, word: u64) -> io::Result<()> {
    // SAFETY: PTRACE_POKEDATA takes the address and the word by value; the kernel checks both.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_POKEDATA,
            tid as libc::pid_t,
            addr as *mut libc::c_void,
            word as *mut libc::c_void,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets the instruction pointer of a stopped thread.
pub fn set_pc(tid: u32, pc: u64) -> io::Result<()> {
    let mut r = raw_regs(tid)?;
    #[cfg(target_arch = "x86_64")]
    {
        r.rip = pc;
    }
    #[cfg(target_arch = "aarch64")]
    {
        r.pc = pc;
    }
    set_raw_regs(tid, &r)
}

/// Resumes stopped thread `tid` for one instruction, delivering `sig` (0: none).
pub fn single_step(tid: u32, sig: i32) -> io::Result<()> {
    ptrace(libc::PTRACE_SINGLESTEP, tid, 0, sig as usize).map(drop)
}

/// The breakpoint instruction and where the pc is after it traps.
#[cfg(target_arch = "x86_64")]
pub const BREAKPOINT: &[u8] = &[0xcc]; // int3; the pc stops after it
#[cfg(target_arch = "x86_64")]
pub const PC_AFTER_BREAKPOINT: u64 = 1;
/// The breakpoint instruction (AArch64: `brk #0`; the pc stays on it).
#[cfg(target_arch = "aarch64")]
pub const BREAKPOINT: &[u8] = &[0x00, 0x00, 0x20, 0xd4]; // brk #0; the pc stays on it
/// How far past the breakpoint the pc is when it traps (AArch64: not at all).
#[cfg(target_arch = "aarch64")]
pub const PC_AFTER_BREAKPOINT: u64 = 0;

/// The system call instruction (x86_64: `syscall`; AArch64: `svc #0`).
#[cfg(target_arch = "x86_64")]
pub const SYSCALL_INSN: &[u8] = &[0x0f, 0x05];
/// The system call instruction (AArch64: `svc #0`).
#[cfg(target_arch = "aarch64")]
pub const SYSCALL_INSN: &[u8] = &[0x01, 0x00, 0x00, 0xd4];

/// A stub in the program's memory that runs system calls for superprof without ever leaving
/// the thread in a state it could not go on from if superprof died: the thread enters it with
/// only its pc changed; the stub saves every register the call changes (x86_64: below the red
/// zone, with the flags; AArch64, which has no red zone: x0-x5 and x8 below the stack
/// pointer), and makes a system call at `point`: getpid, unless superprof, stopped at its
/// entry (PTRACE_SYSCALL, never a single step: a step's trap flag would outlive a dead tracer
/// and kill the thread with SIGTRAP), makes it another; then it puts everything back and goes
/// to where the thread was (its tail, which superprof writes before each use). Superprof may
/// send the thread back to `point` for more calls, and sets its registers back itself at the
/// end; if superprof dies at any moment, the thread finishes the stub by itself and goes on.
#[cfg(target_arch = "x86_64")]
pub const STUB: &[u8] = &[
    0x48, 0x8d, 0x64, 0x24, 0x80, // lea -0x80(%rsp),%rsp
    0x9c, // pushfq
    0x50, 0x51, 0x52, 0x56, 0x57, // push rax, rcx, rdx, rsi, rdi
    0x41, 0x50, 0x41, 0x51, 0x41, 0x52, 0x41, 0x53, // push r8, r9, r10, r11
    0xb8, 0x27, 0x00, 0x00, 0x00, // mov $39,%eax (getpid)
    0x0f, 0x05, // point: syscall
    0x41, 0x5b, 0x41, 0x5a, 0x41, 0x59, 0x41, 0x58, // pop r11, r10, r9, r8
    0x5f, 0x5e, 0x5a, 0x59, 0x58, // pop rdi, rsi, rdx, rcx, rax
    0x9d, // popfq
    0x48, 0x8d, 0xa4, 0x24, 0x80, 0x00, 0x00, 0x00, // lea 0x80(%rsp),%rsp
    0xff, 0x25, 0x00, 0x00, 0x00, 0x00, // jmp *0(%rip): the 8 bytes that follow
    0, 0, 0, 0, 0, 0, 0, 0, // where to go on
];
/// The system call stub described above, for AArch64 (it ends in a `b` or `ldr x16; br x16`
/// written by `stub_tail`).
#[cfg(target_arch = "aarch64")]
pub const STUB: &[u8] = &[
    0xe0, 0x07, 0xbc, 0xa9, // stp x0, x1, [sp, #-64]!
    0xe2, 0x0f, 0x01, 0xa9, // stp x2, x3, [sp, #16]
    0xe4, 0x17, 0x02, 0xa9, // stp x4, x5, [sp, #32]
    0xe8, 0x1b, 0x00, 0xf9, // str x8, [sp, #48]
    0x88, 0x15, 0x80, 0xd2, // mov x8, #172 (getpid)
    0x01, 0x00, 0x00, 0xd4, // point: svc #0
    0xe2, 0x0f, 0x41, 0xa9, // ldp x2, x3, [sp, #16]
    0xe4, 0x17, 0x42, 0xa9, // ldp x4, x5, [sp, #32]
    0xe8, 0x1b, 0x40, 0xf9, // ldr x8, [sp, #48]
    0xe0, 0x07, 0xc4, 0xa8, // ldp x0, x1, [sp], #64
    // The tail (stub_tail): `b` where the thread was, or `ldr x16, 8; ret x16` and the address.
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];
/// Where the stub's system call instruction is.
#[cfg(target_arch = "x86_64")]
pub const STUB_POINT: u64 = 24;
/// The offset of the stub's system call instruction (AArch64).
#[cfg(target_arch = "aarch64")]
pub const STUB_POINT: u64 = 20;

/// The stub's tail for a thread that goes on at `resume` when it leaves the stub at `stub`:
/// (offset in the stub, bytes). x86_64: the address an indirect jump reads. AArch64: a `b`
/// where it reaches (±128 MiB), else a load of the address into x16 and `ret x16` (not `br`,
/// which BTI checks: `resume` is no landing pad), or `br x16` under a guarded control stack
/// (`gcs`, where `ret` checks the stack's top): x16 (IP0, which linkers' veneers use freely)
/// is then the one register a thread left in the stub by a superprof that died does not get
/// back.
pub fn stub_tail(stub: u64, resume: u64, gcs: bool) -> (u64, Vec<u8>) {
    #[cfg(target_arch = "x86_64")]
    {
        let _ = (stub, gcs);
        (STUB.len() as u64 - 8, resume.to_le_bytes().to_vec())
    }
    #[cfg(target_arch = "aarch64")]
    {
        (40, a64_stub_tail(stub + 40, resume, gcs))
    }
}

/// AArch64's stub tail at `at` (see [`stub_tail`]); on every host, for its unit test.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
fn a64_stub_tail(at: u64, resume: u64, gcs: bool) -> Vec<u8> {
    let off = (resume as i64).wrapping_sub(at as i64);
    if off % 4 == 0 && (-(1i64 << 27)..(1i64 << 27)).contains(&off) {
        let b = 0x1400_0000u32 | ((off >> 2) as u32 & 0x03ff_ffff);
        return b.to_le_bytes().to_vec();
    }
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&0x5800_0050u32.to_le_bytes()); // ldr x16, 8
    let jump: u32 = if gcs { 0xd61f_0200 } else { 0xd65f_0200 }; // br x16, ret x16
    v.extend_from_slice(&jump.to_le_bytes());
    v.extend_from_slice(&resume.to_le_bytes());
    v
}

/// A harmless system call, what an injected system call instruction runs when superprof is
/// not there to choose (getpid).
#[cfg(target_arch = "x86_64")]
pub const HARMLESS_SYSCALL: u64 = 39;
/// A system call without effect, for the stub (AArch64: getpid, 172).
#[cfg(target_arch = "aarch64")]
pub const HARMLESS_SYSCALL: u64 = 172;

/// The pc of registers `r`.
pub fn pc_of(r: &RawRegs) -> u64 {
    #[cfg(target_arch = "x86_64")]
    return r.rip;
    #[cfg(target_arch = "aarch64")]
    return r.pc;
}

/// Registers `r` with the pc at `pc`, the return value register `ret` and, for the injected
/// system call instruction, the harmless call's number (x86_64: in rax; AArch64: x8), not in
/// a system call (x86_64: orig_rax -1, so that the kernel restarts nothing).
pub fn regs_at(r: &RawRegs, pc: u64, ret: u64, harmless: bool) -> RawRegs {
    let mut n = *r;
    #[cfg(target_arch = "x86_64")]
    {
        n.rip = pc;
        n.rax = if harmless { HARMLESS_SYSCALL } else { ret };
        n.orig_rax = u64::MAX;
    }
    #[cfg(target_arch = "aarch64")]
    {
        n.pc = pc;
        n.regs[0] = ret;
        if harmless {
            n.regs[8] = HARMLESS_SYSCALL;
        }
    }
    n
}

/// Sets registers `r` of a stopped thread, leaving it outside any system call (AArch64: its
/// system call number -1 through NT_ARM_SYSTEM_CALL, so that the kernel restarts nothing).
pub fn set_regs_outside_syscall(tid: u32, r: &RawRegs) -> io::Result<()> {
    set_raw_regs(tid, r)?;
    #[cfg(target_arch = "aarch64")]
    set_syscall_number(tid, -1)?;
    Ok(())
}

/// The system call number the kernel runs, at a syscall-entry stop (AArch64: not x8, which
/// the kernel read already, but NT_ARM_SYSTEM_CALL).
#[cfg(target_arch = "aarch64")]
fn set_syscall_number(tid: u32, nr: i32) -> io::Result<()> {
    const NT_ARM_SYSTEM_CALL: usize = 0x404;
    let mut n = nr;
    let mut iov = libc::iovec {
        iov_base: &mut n as *mut i32 as *mut libc::c_void,
        iov_len: 4,
    };
    // `data` is an iovec over the int that NT_ARM_SYSTEM_CALL reads.
    ptrace(
        libc::PTRACE_SETREGSET,
        tid,
        NT_ARM_SYSTEM_CALL,
        &mut iov as *mut _ as usize,
    )
    .map(drop)
}

/// Makes thread `tid`, at a syscall-entry stop with registers `r`, run call `nr` with `args`.
pub fn set_syscall_entry(tid: u32, r: &RawRegs, nr: u64, args: [u64; 6]) -> io::Result<()> {
    let mut n = *r;
    #[cfg(target_arch = "x86_64")]
    {
        n.orig_rax = nr;
        n.rdi = args[0];
        n.rsi = args[1];
        n.rdx = args[2];
        n.r10 = args[3];
        n.r8 = args[4];
        n.r9 = args[5];
        set_raw_regs(tid, &n)
    }
    #[cfg(target_arch = "aarch64")]
    {
        n.regs[..6].copy_from_slice(&args);
        n.regs[8] = nr;
        set_raw_regs(tid, &n)?;
        set_syscall_number(tid, nr as i32)
    }
}

/// Where a thread stopped at `r` goes on when it leaves the stub by itself, and with what in
/// the return value register. x86_64: right where it was, or, stopped in a system call the
/// kernel would restart (orig_rax a call, rax -ERESTARTSYS, -ERESTARTNOINTR, -ERESTARTNOHAND
/// or -ERESTART_RESTARTBLOCK), at that call's `syscall` again, as the kernel's restart does.
/// AArch64: where it was: the kernel rewinds a call to restart (pc on the `svc`, x0 its first
/// argument) before the stops superprof injects calls at.
pub fn resume_point(r: &RawRegs) -> (u64, u64) {
    #[cfg(target_arch = "x86_64")]
    {
        const RESTART_SYSCALL: u64 = 219;
        match r.rax as i64 {
            -514..=-512 if (r.orig_rax as i64) >= 0 => (r.rip.wrapping_sub(2), r.orig_rax),
            -516 if (r.orig_rax as i64) >= 0 => (r.rip.wrapping_sub(2), RESTART_SYSCALL),
            _ => (r.rip, r.rax),
        }
    }
    #[cfg(target_arch = "aarch64")]
    (r.pc, r.regs[0])
}

/// Whether stopped thread `tid` runs with a guarded control stack (AArch64's GCS: the
/// NT_ARM_GCS register set says it is enabled), under which a call emulated by a branch would
/// leave the control stack without the entry its `ret` checks. False where the kernel has no
/// GCS, and on x86_64 (whose shadow stack /proc/PID/status shows).
pub fn control_stack_enabled(tid: u32) -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        const NT_ARM_GCS: usize = 0x410;
        const PR_SHADOW_STACK_ENABLE: u64 = 1;
        // struct user_gcs: features_enabled, features_locked, gcspr_el0.
        let mut gcs = [0u64; 3];
        let mut iov = libc::iovec {
            iov_base: gcs.as_mut_ptr() as *mut libc::c_void,
            iov_len: std::mem::size_of_val(&gcs),
        };
        // `data` is an iovec over a struct user_gcs that NT_ARM_GCS fills.
        ptrace(
            libc::PTRACE_GETREGSET,
            tid,
            NT_ARM_GCS,
            &mut iov as *mut _ as usize,
        )
        .is_ok()
            && gcs[0] & PR_SHADOW_STACK_ENABLE != 0
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        let _ = tid;
        false
    }
}

/// The return value of a system call, at its exit stop (a negative errno on failure).
pub fn syscall_result(r: &RawRegs) -> i64 {
    #[cfg(target_arch = "x86_64")]
    return r.rax as i64;
    #[cfg(target_arch = "aarch64")]
    return r.regs[0] as i64;
}

/// The full user register set of a stopped thread (`user_regs_struct` of this architecture).
pub type RawRegs = libc::user_regs_struct;

/// The general registers of stopped thread `tid` (x86_64: PTRACE_GETREGS).
#[cfg(target_arch = "x86_64")]
pub fn raw_regs(tid: u32) -> io::Result<RawRegs> {
    // SAFETY: user_regs_struct is plain old data; zero is a valid value.
    let mut r: RawRegs = unsafe { std::mem::zeroed() };
    // `data` points to a user_regs_struct, which PTRACE_GETREGS fills.
    ptrace(libc::PTRACE_GETREGS, tid, 0, &mut r as *mut _ as usize)?;
    Ok(r)
}

#[cfg(target_arch = "x86_64")]
pub fn set_raw_regs(tid: u32, r: &RawRegs) -> io::Result<()> {
    let mut r = *r;
    // `data` points to a user_regs_struct, which PTRACE_SETREGS reads.
    ptrace(libc::PTRACE_SETREGS, tid, 0, &mut r as *mut _ as usize).map(drop)
}

/// The general registers of stopped thread `tid` (AArch64: `user_pt_regs`, NT_PRSTATUS).
#[cfg(target_arch = "aarch64")]
pub fn raw_regs(tid: u32) -> io::Result<RawRegs> {
    // SAFETY: user_regs_struct is plain old data; zero is a valid value.
    let mut r: RawRegs = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: &mut r as *mut _ as *mut libc::c_void,
        iov_len: std::mem::size_of::<RawRegs>(),
    };
    // `data` is an iovec over a user_regs_struct that NT_PRSTATUS fills.
    ptrace(
        libc::PTRACE_GETREGSET,
        tid,
        libc::NT_PRSTATUS as usize,
        &mut iov as *mut _ as usize,
    )?;
    Ok(r)
}

/// Sets the general registers of stopped thread `tid` (AArch64).
#[cfg(target_arch = "aarch64")]
pub fn set_raw_regs(tid: u32, r: &RawRegs) -> io::Result<()> {
    let mut r = *r;
    let mut iov = libc::iovec {
        iov_base: &mut r as *mut _ as *mut libc::c_void,
        iov_len: std::mem::size_of::<RawRegs>(),
    };
    // `data` is an iovec over a user_regs_struct that NT_PRSTATUS reads.
    ptrace(
        libc::PTRACE_SETREGSET,
        tid,
        libc::NT_PRSTATUS as usize,
        &mut iov as *mut _ as usize,
    )
    .map(drop)
}

pub use superprof_unwind::monotonic_ns;

#[cfg(test)]
mod stub_tail_tests {
    #[test]
    fn the_aarch64_stub_branches_back_or_returns_through_x16() {
        // b +0x100 (0x14000040), and b -8 (0x17fffffe).
        assert_eq!(
            super::a64_stub_tail(0x1000, 0x1100, false),
            0x1400_0040u32.to_le_bytes()
        );
        assert_eq!(
            super::a64_stub_tail(0x1000, 0xff8, true),
            0x17ff_fffeu32.to_le_bytes()
        );
        // Out of reach: ldr x16, 8; ret x16 (br x16 under a guarded control stack); the address.
        let far = 0xffff_0000_1234;
        let t = super::a64_stub_tail(0x1000, far, false);
        assert_eq!(&t[..8], &[0x50, 0, 0, 0x58, 0x00, 0x02, 0x5f, 0xd6]);
        assert_eq!(&t[8..], &far.to_le_bytes());
        let t = super::a64_stub_tail(0x1000, far, true);
        assert_eq!(&t[4..8], &[0x00, 0x02, 0x1f, 0xd6]);
    }
}
