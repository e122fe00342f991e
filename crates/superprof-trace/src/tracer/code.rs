//! The tracer's breakpoints and code patches: written over the program's code (saved first,
//! one copy per address space), stepped past, and taken out again.

use super::*;

impl Tracer {
    /// Adds a breakpoint to the table, and to the janitor's.
    pub(super) fn bp_insert(&mut self, space: u32, addr: u64, saved: Saved) {
        if let Some(j) = self.janitor.as_mut() {
            j.add(space, addr, &saved.orig);
        }
        self.breakpoints.insert((space, addr), saved);
    }

    /// Takes a breakpoint out of the table, and out of the janitor's (call it once the code
    /// is back, or gone).
    pub(super) fn bp_remove(&mut self, space: u32, addr: u64) -> Option<Saved> {
        if let Some(j) = self.janitor.as_mut() {
            j.remove(space, addr);
        }
        self.breakpoints.remove(&(space, addr))
    }

    /// Forgets every breakpoint of `space`, whose code is gone (it exited or exec'd).
    pub(super) fn bp_forget_space(&mut self, space: u32) {
        let addrs: Vec<u64> = self
            .breakpoints
            .keys()
            .filter(|(p, _)| *p == space)
            .map(|(_, a)| *a)
            .collect();
        for a in addrs {
            self.bp_remove(space, a);
        }
        if let Some(j) = self.janitor.as_mut() {
            j.forget_process(space);
        }
    }

    /// The process whose breakpoint table covers the memory of process `pid`.
    pub(super) fn space_of(&self, pid: u32) -> u32 {
        self.threads.get(&pid).map_or(pid, |t| t.space())
    }

    /// Whether superprof's breakpoint (not a patch) is at `addr` of `space`.
    pub(super) fn is_breakpoint(&self, space: u32, addr: u64) -> bool {
        self.breakpoints
            .get(&(space, addr))
            .is_some_and(|s| !s.patch)
    }

    /// Whether anything superprof wrote into the code of `space` covers [addr, addr + len).
    pub(super) fn changed(&self, space: u32, addr: u64, len: u64) -> bool {
        let from = addr.saturating_sub(MAX_PATCH as u64 - 1);
        (from..addr.saturating_add(len)).any(|a| {
            self.breakpoints
                .get(&(space, a))
                .is_some_and(|s| a + s.orig.len() as u64 > addr)
        })
    }

    /// Replaces the code at `addr` of process `pid` by `bytes` (at most 8, `MAX_PATCH`): a jump
    /// to code mapped into the program, say. The original goes back when the process is let
    /// go (and from a fork child's copy, and by the janitor if superprof dies), like a
    /// breakpoint's. Every thread that runs this code must be stopped (see
    /// [`Tracer::hold_others`]) and none may be inside the bytes replaced: the caller checks.
    pub fn patch_code(&mut self, pid: u32, addr: u64, bytes: &[u8]) -> io::Result<()> {
        let space = self.space_of(pid);
        if bytes.is_empty() || bytes.len() > MAX_PATCH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a patch of {} bytes", bytes.len()),
            ));
        }
        if self.changed(space, addr, bytes.len() as u64) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("the code at {addr:#x} is already changed"),
            ));
        }
        self.write_saved(pid, space, addr, bytes, true)
    }

    /// Writes `bytes` over the code at `addr` (a breakpoint, or a patch), the original bytes
    /// kept in the table, and in the janitor's before the code changes: superprof may die at
    /// any moment.
    pub(super) fn write_saved(
        &mut self,
        pid: u32,
        space: u32,
        addr: u64,
        bytes: &[u8],
        patch: bool,
    ) -> io::Result<()> {
        let mut orig = vec![0u8; bytes.len()];
        if sys::read_memory(pid, addr, &mut orig) != orig.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot read the code at {addr:#x} of pid {pid}"),
            ));
        }
        if self.janitor.is_none() {
            self.janitor = crate::janitor::Janitor::start();
        }
        if let Some(j) = self.janitor.as_mut() {
            j.add(space, addr, &orig);
        }
        if let Err(e) = sys::write_memory(pid, addr, bytes) {
            if let Some(j) = self.janitor.as_mut() {
                j.remove(space, addr);
            }
            return Err(e);
        }
        self.bp_insert(space, addr, Saved { orig, patch });
        Ok(())
    }

    /// Takes a patch made with [`Tracer::patch_code`] out again: the original bytes back (the
    /// same conditions hold: every thread that runs this code stopped, none inside it).
    pub fn unpatch(&mut self, pid: u32, addr: u64) -> io::Result<()> {
        let space = self.space_of(pid);
        match self.breakpoints.get(&(space, addr)).cloned() {
            Some(saved) if saved.patch => {
                let r = sys::write_memory(pid, addr, &saved.orig);
                if r.is_ok() {
                    self.bp_remove(space, addr);
                }
                r
            }
            _ => Ok(()),
        }
    }

    /// The owner moved a thread stopped on a breakpoint somewhere else (it did the
    /// instruction's work itself, or chose not to run it): resuming it must not step over the
    /// breakpoint any more.
    pub fn leave_breakpoint(&mut self, tid: u32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.at_breakpoint = None;
        }
    }

    /// Reads code of a traced process as the program sees it: the original bytes where
    /// breakpoints are set. Returns the bytes read.
    pub fn read_code(&self, pid: u32, addr: u64, buf: &mut [u8]) -> usize {
        let n = sys::read_memory(pid, addr, buf);
        let pid = self.space_of(pid);
        let end = addr + n as u64;
        // The longest change: a patch's jump.
        let bp_len = MAX_PATCH as u64;
        let mut restore = |at: u64, orig: &[u8]| {
            for (k, &b) in orig.iter().enumerate() {
                let a = at + k as u64;
                if (addr..end).contains(&a) {
                    buf[(a - addr) as usize] = b;
                }
            }
        };
        if (n as u64 + bp_len) < self.breakpoints.len() as u64 {
            // A short read among many breakpoints: look up each address it covers.
            for at in addr.saturating_sub(bp_len - 1)..end {
                if let Some(saved) = self.breakpoints.get(&(pid, at)) {
                    restore(at, &saved.orig);
                }
            }
        } else {
            for ((p, at), saved) in &self.breakpoints {
                if *p == pid && *at + bp_len > addr && *at < end {
                    restore(*at, &saved.orig);
                }
            }
        }
        n
    }

    /// Writes memory of a traced process, code pages included (/proc/PID/mem).
    pub fn write_memory(&mut self, pid: u32, addr: u64, data: &[u8]) -> io::Result<()> {
        sys::write_memory(pid, addr, data)
    }

    /// Puts a software breakpoint at `addr` in process `pid`.
    pub fn set_breakpoint(&mut self, pid: u32, addr: u64) -> io::Result<()> {
        let space = self.space_of(pid);
        if self.is_breakpoint(space, addr) {
            return Ok(());
        }
        if self.changed(space, addr, sys::BREAKPOINT.len() as u64) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("the code at {addr:#x} is patched"),
            ));
        }
        self.start_guard();
        self.write_saved(pid, space, addr, sys::BREAKPOINT, false)?;
        self.tombstones.remove(&(space, addr));
        Ok(())
    }

    /// Removes a breakpoint, putting the original code back.
    pub fn remove_breakpoint(&mut self, pid: u32, addr: u64) -> io::Result<()> {
        let space = self.space_of(pid);
        match self.breakpoints.get(&(space, addr)).cloned() {
            Some(saved) if !saved.patch => {
                self.tombstones.insert((space, addr));
                let r = sys::write_memory(pid, addr, &saved.orig);
                self.bp_remove(space, addr);
                r
            }
            _ => Ok(()),
        }
    }

    /// Whether a breakpoint of ours is at `addr` in process `pid`.
    pub fn has_breakpoint(&self, pid: u32, addr: u64) -> bool {
        self.is_breakpoint(self.space_of(pid), addr)
    }

    /// Addresses of the breakpoints set in `pid`.
    pub fn breakpoints(&self, pid: u32) -> impl Iterator<Item = u64> + '_ {
        let space = self.space_of(pid);
        self.breakpoints
            .iter()
            .filter(move |((p, _), s)| *p == space && !s.patch)
            .map(|((_, a), _)| *a)
    }

    /// If a SIGTRAP stop of `tid` comes from one of our breakpoints: moves the pc back onto
    /// it, marks the thread stopped there, and returns the address. A SIGTRAP that a process
    /// sent (kill -TRAP) is never ours, wherever the pc is.
    pub(super) fn hit_breakpoint(&mut self, tid: u32) -> Option<u64> {
        let space = self.threads.get(&tid)?.space();
        if sys::signal_from_kernel(tid) != Some(true) {
            return None;
        }
        let pc = sys::regs(tid).ok()?.pc;
        let addr = pc.wrapping_sub(sys::PC_AFTER_BREAKPOINT);
        if !self.is_breakpoint(space, addr) {
            return None;
        }
        sys::set_pc(tid, addr).ok()?;
        let t = self.threads.get_mut(&tid)?;
        t.trapped = true;
        t.at_breakpoint = Some(addr);
        t.state = State::Stopped;
        t.held = false;
        Some(addr)
    }

    /// Whether a SIGTRAP of `tid` comes from a breakpoint removed since; if so the pc is moved
    /// back onto the restored instruction.
    pub(super) fn trapped_on_tombstone(&mut self, tid: u32) -> bool {
        let Some(space) = self.threads.get(&tid).map(|t| t.space()) else {
            return false;
        };
        if sys::signal_from_kernel(tid) != Some(true) {
            return false;
        }
        let Ok(r) = sys::regs(tid) else { return false };
        let addr = r.pc.wrapping_sub(sys::PC_AFTER_BREAKPOINT);
        let ours = self.tombstones.contains(&(space, addr)) && sys::set_pc(tid, addr).is_ok();
        if ours {
            if let Some(t) = self.threads.get_mut(&tid) {
                t.trapped = true;
            }
        }
        ours
    }

    /// Steps `tid` over the breakpoint it is stopped on: holds every other thread of its
    /// process stopped, puts the original code back, single-steps, re-inserts the breakpoint,
    /// and lets the held threads go. `tid` stays stopped. Returns false if `tid` ended.
    pub(super) fn step_past_breakpoint(&mut self, tid: u32) -> bool {
        let Some(t) = self.threads.get(&tid).copied() else {
            return false;
        };
        let Some(addr) = t.at_breakpoint else {
            return true;
        };
        if !self.is_breakpoint(t.space(), addr) {
            // Removed while the thread sat on it: the original code is back, nothing to step.
            if let Some(t) = self.threads.get_mut(&tid) {
                t.at_breakpoint = None;
            }
            return true;
        }
        self.step_alone(tid, Some(addr))
    }

    /// Single-steps `tid` with every other thread of its process held stopped (so that no
    /// other thread's stop can get in the way of the step), with the breakpoint at `lift`
    /// lifted for the step. `tid` stays stopped. Returns false if `tid` ended. A step that
    /// does not end within a second (a syscall that blocks) lets the others go; its
    /// `Stepped` comes when it ends (`late_steps`).
    pub(super) fn step_alone(&mut self, tid: u32, lift: Option<u64>) -> bool {
        let Some((pid, space)) = self.threads.get(&tid).map(|t| (t.pid, t.space())) else {
            return false;
        };
        // 1. Hold the others.
        self.hold_space(space, Some(tid));
        // 2. Lift, step, put back.
        let orig =
            lift.and_then(|addr| Some((addr, self.breakpoints.get(&(space, addr))?.orig.clone())));
        if let Some((addr, o)) = &orig {
            let _ = sys::write_memory(pid, *addr, o);
        }
        // One instruction: it finishes at once unless it is a syscall that blocks.
        let end = self.step_wait(tid, space, Duration::from_secs(1));
        if let Some((addr, _)) = orig {
            if self.is_breakpoint(space, addr) {
                let _ = sys::write_memory(pid, addr, sys::BREAKPOINT);
            }
        }
        if let Some(t) = self.threads.get_mut(&tid) {
            t.at_breakpoint = None;
            match end {
                StepEnd::Done | StepEnd::Failed => t.state = State::Stopped,
                StepEnd::Pending => {
                    // Still in the instruction (a blocking syscall): the others go on, and its
                    // step is reported when it ends.
                    t.state = State::Running;
                    self.late_steps.insert(tid);
                }
                StepEnd::Ended => {}
            }
        }
        // 3. Let the held threads go.
        self.release_held();
        end != StepEnd::Ended
    }

    /// Single-steps stopped thread `tid` (the other threads of `space` held) and waits at most
    /// `timeout` for the step to end. Signals from elsewhere meanwhile are kept for later; a
    /// fault of the instruction goes with the step.
    pub(super) fn step_wait(&mut self, tid: u32, space: u32, timeout: Duration) -> StepEnd {
        let deadline = std::time::Instant::now() + timeout;
        if sys::single_step(tid, 0).is_err() {
            return StepEnd::Failed;
        }
        while std::time::Instant::now() < deadline {
            match sys::wait_any_nohang() {
                Ok(Some((t2, stop))) if t2 == tid => {
                    let again = match stop {
                        Stop::Ended(_) => {
                            self.handle(t2, stop);
                            return StepEnd::Ended;
                        }
                        Stop::Trap if sys::step_trap(tid) != Some(false) => {
                            if let Some(t) = self.threads.get_mut(&tid) {
                                t.trapped = true;
                            }
                            return StepEnd::Done;
                        }
                        Stop::Signal(
                            sig @ (libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE),
                        ) => {
                            // The instruction faulted: the signal goes with the step (to the
                            // handler, or it ends the process).
                            sys::single_step(tid, sig)
                        }
                        Stop::Trap | Stop::Signal(_) => {
                            // A signal from elsewhere before the step: keep it for later and
                            // step again.
                            if let Some(sig) = stop.signal() {
                                self.defer_signal(tid, sig);
                            }
                            sys::single_step(tid, 0)
                        }
                        // A stale interrupt, a syscall-stop or an event before the step: step
                        // again.
                        Stop::Interrupt { .. } | Stop::Syscall | Stop::Event(_) => {
                            sys::single_step(tid, 0)
                        }
                        Stop::Other => Ok(()),
                    };
                    if again.is_err() {
                        return StepEnd::Failed;
                    }
                }
                Ok(Some((t2, st))) => self.handle_while_holding(space, t2, st),
                _ => sys::wait_sigchld(Duration::from_millis(10)),
            }
        }
        StepEnd::Pending
    }
}
