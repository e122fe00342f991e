//! The program's own SIGTRAP disposition, learnt and kept: a breakpoint's trap is the
//! tracer's, a SIGTRAP the program ignores or handles stays its own.

use super::detach::sigtrap_pending;
use super::inject::syscall_site;
use super::*;

impl Tracer {
    /// Starts following the program's SIGTRAP state ([`crate::sigtrap`]), before the first
    /// trap of ours: each thread's as it is now.
    pub(super) fn start_guard(&mut self) {
        if self.guard || !self.opts.guard_sigtrap {
            return;
        }
        self.guard = true;
        let tids: Vec<u32> = self.threads.keys().copied().collect();
        for tid in tids {
            self.learn_trap_state(tid);
        }
    }

    /// Reads SIGTRAP's state of `tid` (and of its process) as the program set it: at a moment
    /// when no trap of ours has reset it since it last ran.
    pub(super) fn learn_trap_state(&mut self, tid: u32) {
        self.learn_trap_state_of(tid, true);
    }

    /// As [`Tracer::learn_trap_state`]; the process's action too only where `action`.
    pub(super) fn learn_trap_state_of(&mut self, tid: u32, action: bool) {
        if !self.guard {
            return;
        }
        let Some(pid) = self.threads.get(&tid).map(|t| t.pid) else {
            return;
        };
        let Some(state) = crate::sigtrap::read(pid, tid) else {
            return;
        };
        if let Some(t) = self.threads.get_mut(&tid) {
            t.trap_blocked = state.blocked;
        }
        if !action {
            return;
        }
        if state.ignored {
            self.trap_ignored.insert(pid);
        } else {
            self.trap_ignored.remove(&pid);
        }
    }

    /// At a system call stop of `tid`: notes the entry of a call that may change its SIGTRAP
    /// state, and reads that state at the call's exit. Returns whether it is an exit stop.
    pub(super) fn follow_signal_call(&mut self, tid: u32) -> bool {
        if !self.guard {
            return false;
        }
        match sys::syscall_info(tid) {
            Ok(sys::SyscallInfo::Entry { arch, nr, args }) => {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.in_signal_call = crate::sigtrap::change_of(arch, nr, args[0]);
                }
            }
            Ok(sys::SyscallInfo::Exit { .. }) => {
                let change = self
                    .threads
                    .get_mut(&tid)
                    .map(|t| std::mem::take(&mut t.in_signal_call))
                    .unwrap_or_default();
                match change {
                    crate::sigtrap::Change::Nothing => {}
                    crate::sigtrap::Change::Mask => self.learn_trap_state_of(tid, false),
                    crate::sigtrap::Change::Action => {
                        // The program set SIGTRAP's action itself: nothing of ours to undo.
                        if let Some(t) = self.threads.get(&tid) {
                            self.trap_reset.remove(&t.pid);
                        }
                        self.learn_trap_state_of(tid, true);
                    }
                }
                return true;
            }
            _ => {}
        }
        false
    }

    /// After a trap of ours, before `tid` runs again: puts back the SIGTRAP state the kernel
    /// reset (the program blocked it in this thread, or its process ignores it).
    /// (While letting go, `ignored_too` false: the mask only, as no call can be run then.)
    pub(super) fn restore_trap_state(&mut self, tid: u32, ignored_too: bool) {
        let Some(t) = self.threads.get_mut(&tid) else {
            return;
        };
        if !std::mem::take(&mut t.trapped) || !self.guard {
            return;
        }
        let (pid, blocked) = (t.pid, t.trap_blocked);
        if blocked {
            if let Ok(mask) = sys::sigmask(tid) {
                if mask & crate::sigtrap::BIT == 0 {
                    let _ = sys::set_sigmask(tid, mask | crate::sigtrap::BIT);
                }
            }
        }
        if self.trap_ignored.contains(&pid) {
            // (Ignored, SIGTRAP was reset by the trap: the kernel's rule.)
            let since = *self
                .trap_reset
                .entry(pid)
                .or_insert_with(std::time::Instant::now);
            if ignored_too && since.elapsed() >= TRAP_RESET_GRACE {
                self.ignore_again(pid, tid);
            }
        }
    }

    /// Sets SIGTRAP of process `pid` ignored again, through its stopped thread `tid`, the
    /// others held meanwhile (their stops wait, as for a step).
    pub(super) fn ignore_again(&mut self, pid: u32, tid: u32) {
        self.hold_space(self.space_of(pid), Some(tid));
        self.ignore_again_held(pid, tid);
        self.release_held();
    }

    /// [`Tracer::ignore_again`], the other threads of the process held by the caller.
    pub(super) fn ignore_again_held(&mut self, pid: u32, tid: u32) {
        self.trap_reset.remove(&pid);
        if crate::sigtrap::read(pid, tid).is_none_or(|now| now.ignored) {
            return;
        }
        let space = self.space_of(pid);
        // Setting SIGTRAP ignored discards the SIGTRAPs pending in the process: those of
        // threads held just after a trap of ours, not yet reported. Each goes back onto its
        // breakpoint, to trap again.
        let trapped_unseen: Vec<(u32, u64)> = self
            .threads
            .iter()
            .filter(|(&o, x)| o != tid && x.pid == pid && x.at_breakpoint.is_none())
            .filter(|(&o, _)| sigtrap_pending(pid, o))
            .filter_map(|(&o, _)| {
                let at = sys::regs(o).ok()?.pc.wrapping_sub(sys::PC_AFTER_BREAKPOINT);
                self.is_breakpoint(space, at).then_some((o, at))
            })
            .collect();
        if self.ignore_sigtrap_again(tid).is_ok() {
            for (o, at) in trapped_unseen {
                let _ = sys::set_pc(o, at);
            }
        }
    }

    /// Sets SIGTRAP of stopped thread `tid`'s process back to ignored, with the flags and mask
    /// its action had (the kernel's reset keeps them): `rt_sigaction` run twice in the thread
    /// (read, then write), at a system call instruction of its vDSO (nothing written into
    /// code), with 32 bytes of its stack below the red zone lent and given back.
    pub(super) fn ignore_sigtrap_again(&mut self, tid: u32) -> io::Result<()> {
        let (pid, _) = self.stopped_thread(tid)?;
        let at = syscall_site(pid).ok_or_else(|| io::Error::other("no system call in the vDSO"))?;
        let saved = sys::raw_regs(tid)?;
        let sp = sys::user_regs(&saved).sp;
        // Below x86_64's 128-byte red zone, 16-byte aligned.
        let scratch = (sp.wrapping_sub(256)) & !15;
        let mut kept = [0u8; 32];
        if sys::read_memory(pid, scratch, &mut kept) != kept.len() {
            return Err(io::Error::other("cannot read the thread's stack"));
        }
        let sig = libc::SIGTRAP as u64;
        let nr = libc::SYS_rt_sigaction;
        let result = self
            .run_syscall_at(tid, &saved, at, nr, [sig, 0, scratch, 8, 0, 0])
            .and_then(|r| {
                if r != 0 {
                    return Err(io::Error::from_raw_os_error(-r as i32));
                }
                let mut action = [0u8; 32];
                if sys::read_memory(pid, scratch, &mut action) != action.len() {
                    return Err(io::Error::other("cannot read the action"));
                }
                action[..8].copy_from_slice(&(libc::SIG_IGN as u64).to_ne_bytes());
                sys::write_memory(pid, scratch, &action)?;
                self.run_syscall_at(tid, &saved, at, nr, [sig, scratch, 0, 8, 0, 0])
            });
        let _ = sys::write_memory(pid, scratch, &kept);
        result.map(drop)
    }
}
