//! System calls run in the traced program by the tracer (an instruction of the program's own
//! `syscall` stub, the thread's registers saved and put back).

use super::*;

impl Tracer {
    /// Runs system call `nr` with `args` in stopped thread `tid`, the other threads of its
    /// memory held stopped by the caller ([`Tracer::hold_others`]); returns what it returned (a
    /// negative errno on failure). A system call instruction is written at the thread's pc for
    /// the call, which runs between two system call stops; the code and the registers are put
    /// back afterwards. If superprof died in between, the thread would go on with changed
    /// registers: the caller uses it once, to map the memory of a stub
    /// ([`Tracer::inject_syscall_via`]) that runs the rest safely. For calls that do not block.
    pub fn inject_syscall(&mut self, tid: u32, nr: i64, args: [u64; 6]) -> io::Result<i64> {
        let (pid, _) = self.stopped_thread(tid)?;
        let saved = sys::raw_regs(tid)?;
        let pc = sys::pc_of(&saved);
        let mut code = vec![0u8; sys::SYSCALL_INSN.len()];
        if sys::read_memory(pid, pc, &mut code) != code.len() {
            return Err(io::Error::other(format!("cannot read the code at {pc:#x}")));
        }
        sys::write_memory(pid, pc, sys::SYSCALL_INSN)?;
        let result = self.run_syscall_at(tid, &saved, pc, nr, args);
        let _ = sys::write_memory(pid, pc, &code);
        result
    }

    /// Runs system call `nr` with `args` in stopped thread `tid` through a stub (bytes
    /// [`sys::STUB`], written by the caller at `stub`, in memory the program may execute), the
    /// other threads of its memory held: the only register superprof changes before the stub
    /// has saved them all is the pc, and the thread only ever stops at system calls (no single
    /// step), so that if superprof dies at any moment the thread finishes the stub by itself
    /// and goes on where it was. Returns what the call returned. The thread's registers are
    /// as they were afterwards (a system call it was stopped in is restarted, as the kernel
    /// would have).
    pub fn inject_syscall_via(
        &mut self,
        tid: u32,
        stub: u64,
        nr: i64,
        args: [u64; 6],
    ) -> io::Result<i64> {
        let (pid, _) = self.stopped_thread(tid)?;
        let saved = sys::raw_regs(tid)?;
        let (resume, ret) = sys::resume_point(&saved);
        let (off, tail) = sys::stub_tail(stub, resume, sys::control_stack_enabled(tid));
        sys::write_memory(pid, stub + off, &tail)?;
        sys::set_regs_outside_syscall(tid, &sys::regs_at(&saved, stub, ret, false))?;
        let point = stub + sys::STUB_POINT;
        let result = self.syscall_at(tid, point, nr, args, true);
        if !matches!(result, Err(ref e) if e.raw_os_error() == Some(libc::ESRCH)) {
            // Back where it was; a call it was stopped in goes again, as the kernel would
            // have restarted it.
            let _ = sys::set_regs_outside_syscall(tid, &sys::regs_at(&saved, resume, ret, false));
        }
        result
    }

    /// The process and memory of `tid`, if it is stopped for us.
    pub(super) fn stopped_thread(&self, tid: u32) -> io::Result<(u32, u32)> {
        self.threads
            .get(&tid)
            .filter(|t| t.state == State::Stopped)
            .map(|t| (t.pid, t.space()))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "thread not stopped"))
    }

    /// Lets `tid` run (PTRACE_SYSCALL) to the entry of the system call whose instruction is at
    /// `at`, makes that call `nr` with `args`, and returns its result at the exit stop. Other
    /// system call stops on the way (the end of the one it was stopped in) are passed.
    /// (`stubbed`: through a stub: where the tests may make superprof die.)
    pub(super) fn syscall_at(
        &mut self,
        tid: u32,
        at: u64,
        nr: i64,
        args: [u64; 6],
        stubbed: bool,
    ) -> io::Result<i64> {
        let after = at + sys::SYSCALL_INSN.len() as u64;
        let deadline = std::time::Instant::now() + INJECTED_CALL_DEADLINE;
        let mut entered = false;
        loop {
            if std::time::Instant::now() > deadline {
                return Err(io::Error::other("the injected system call did not run"));
            }
            if stubbed {
                die_here_for_a_test(0);
            }
            self.syscall_stop(tid)?;
            let r = sys::raw_regs(tid)?;
            match sys::syscall_info(tid)? {
                sys::SyscallInfo::Entry { .. } if !entered && sys::pc_of(&r) == after => {
                    if stubbed {
                        die_here_for_a_test(1);
                    }
                    sys::set_syscall_entry(tid, &r, nr as u64, args)?;
                    entered = true;
                }
                sys::SyscallInfo::Exit { .. } if entered && sys::pc_of(&r) == after => {
                    if stubbed {
                        die_here_for_a_test(2);
                    }
                    return Ok(sys::syscall_result(&r));
                }
                // Another call's stop (the exec it was stopped in ends first): on.
                _ => {}
            }
        }
    }

    /// Resumes stopped thread `tid` with PTRACE_SYSCALL and waits for its next system call
    /// stop. Signals from elsewhere meanwhile are kept for later; the other threads' events
    /// are handled as during a hold.
    pub(super) fn syscall_stop(&mut self, tid: u32) -> io::Result<()> {
        let space = self.threads.get(&tid).map_or(tid, |t| t.space());
        sys::cont_syscall(tid, 0)?;
        let deadline = std::time::Instant::now() + INJECTED_CALL_DEADLINE;
        while std::time::Instant::now() < deadline {
            match sys::wait_any_nohang() {
                Ok(Some((t2, stop))) if t2 == tid => match stop {
                    Stop::Ended(_) => {
                        self.handle(t2, stop);
                        return Err(io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    Stop::Syscall => return Ok(()),
                    Stop::Other => {}
                    // A signal from elsewhere is kept for later; an event stop goes on.
                    _ => {
                        if let Some(sig) = stop.signal() {
                            self.defer_signal(tid, sig);
                        }
                        sys::cont_syscall(tid, 0)?;
                    }
                },
                Ok(Some((t2, st))) => self.handle_while_holding(space, t2, st),
                _ => sys::wait_sigchld(Duration::from_millis(10)),
            }
        }
        Err(io::Error::other("no system call stop"))
    }

    /// Runs system call `nr` with `args` in stopped thread `tid` (registers `saved`) at the
    /// system call instruction at `at`, and puts its registers back (a call it was stopped in
    /// goes again, as the kernel would have restarted it). If superprof died in between, the
    /// thread would go on with changed registers.
    pub(super) fn run_syscall_at(
        &mut self,
        tid: u32,
        saved: &sys::RawRegs,
        at: u64,
        nr: i64,
        args: [u64; 6],
    ) -> io::Result<i64> {
        let entry = sys::regs_at(saved, at, 0, true);
        let result = sys::set_regs_outside_syscall(tid, &entry)
            .and_then(|()| self.syscall_at(tid, at, nr, args, false));
        if !matches!(result, Err(ref e) if e.raw_os_error() == Some(libc::ESRCH)) {
            let (resume, ret) = sys::resume_point(saved);
            let _ = sys::set_regs_outside_syscall(tid, &sys::regs_at(saved, resume, ret, false));
        }
        result
    }
}

/// A system call instruction in the vDSO of process `pid` (any bytes that decode as one:
/// the CPU runs them from there), where a call can be run in the program without writing
/// into its code.
pub(super) fn syscall_site(pid: u32) -> Option<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
    let (lo, hi) = line.split_whitespace().next()?.split_once('-')?;
    let lo = u64::from_str_radix(lo, 16).ok()?;
    let hi = u64::from_str_radix(hi, 16).ok()?;
    // (A vDSO is two pages or so; a larger one is not believed.)
    let len = usize::try_from(hi.checked_sub(lo)?).ok()?.min(1 << 16);
    let mut code = vec![0u8; len];
    let n = sys::read_memory(pid, lo, &mut code);
    let insn = sys::SYSCALL_INSN;
    // (AArch64's instructions are 4-byte aligned.)
    let step = if cfg!(target_arch = "aarch64") { 4 } else { 1 };
    (0..n.saturating_sub(insn.len() - 1))
        .step_by(step)
        .find(|&i| code[i..].starts_with(insn))
        .map(|i| lo + i as u64)
}

/// Fault injection for the tests of what superprof leaves behind when it dies: with
/// SUPERPROF_TEST_DIE_IN_STUB=N in its environment, superprof kills itself (SIGKILL) at point
/// N of running a system call in the program (0: before resuming the thread, 1: at the entry
/// stop, 2: at the exit stop).
fn die_here_for_a_test(step: usize) {
    static AT: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        superprof_unwind::test_switch("SUPERPROF_TEST_DIE_IN_STUB").and_then(|v| v.parse().ok())
    });
    if *at == Some(step) {
        let me = std::process::id();
        sys::kill_thread(me, me, libc::SIGKILL);
    }
}
