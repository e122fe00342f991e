//! Letting go: every breakpoint taken out, every thread detached with the signal it was to
//! get, SIGTRAP ignored again where the program ignored it; and ending the traced program.

use super::*;

impl Tracer {
    /// Lets an unfollowed child go: restores the code under the breakpoints it inherited, and
    /// detaches it (it is stopped).
    pub(super) fn release_child(&mut self, child: u32) {
        // Only a child with its own copy of the memory is released this way (a sharing one
        // stays traced until it execs or exits).
        let mine: Vec<(u64, Vec<u8>)> = self
            .breakpoints
            .iter()
            .filter(|((p, _), _)| *p == child)
            .map(|((_, a), b)| (*a, b.orig.clone()))
            .collect();
        for (addr, orig) in mine {
            let _ = sys::write_memory(child, addr, &orig);
            self.bp_remove(child, addr);
        }
        if let Some(j) = self.janitor.as_mut() {
            j.forget_process(child);
        }
        let _ = sys::detach(child, 0);
        self.threads.remove(&child);
    }

    /// Ends a launched command (Ctrl-C, --duration): SIGTERM, then its events are pumped, every
    /// stop resumed so that the signal can be delivered, until it exits or `timeout` passes.
    /// `on_event` sees each event first. Returns how the command ended, if it did.
    pub fn terminate(
        &mut self,
        timeout: Duration,
        mut on_event: impl FnMut(&TraceEvent),
    ) -> io::Result<Option<ExitStatus>> {
        let root = self.root;
        crate::launch::kill(root, libc::SIGTERM);
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            let Some(ev) = self.next_event(Duration::from_millis(50))? else {
                continue;
            };
            on_event(&ev);
            match ev {
                TraceEvent::ProcessExited { pid, status } if pid == root => {
                    return Ok(Some(status))
                }
                ev => self.resume_after(&ev),
            }
        }
        Ok(None)
    }

    /// Lets every thread go: detaches an attached process (it runs on), kills a launched one.
    /// Returns how the root process ended, if it did.
    pub fn finish(&mut self) -> Option<ExitStatus> {
        if self.done {
            return None;
        }
        self.done = true;
        if self.launched {
            // Every traced process still here is ours (the command and the children it
            // started): end them all. A reaped pid is no longer in the table.
            let pids: HashSet<u32> = self.threads.values().map(|t| t.pid).collect();
            if pids.is_empty() {
                return None;
            }
            for pid in pids {
                sys::kill_thread(pid, pid, libc::SIGKILL);
            }
            let mut status = None;
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !self.threads.is_empty() && std::time::Instant::now() < deadline {
                match self.next_event(Duration::from_millis(50)) {
                    Ok(Some(TraceEvent::ProcessExited { pid, status: s })) if pid == self.root => {
                        status = Some(s);
                    }
                    Ok(Some(TraceEvent::ProcessExited { .. })) => {}
                    Ok(Some(ev)) => self.resume_after(&ev),
                    _ => {}
                }
            }
            return status;
        }
        self.detach_all();
        None
    }

    /// (One function of 115 lines: the steps of letting go, in an order that matters: patched
    /// spaces held, SIGTRAP ignored again, the code put back, then each thread detached; the
    /// `removed` and `swallow` sets serve both the first detaches and the wait for the rest.)
    pub(super) fn detach_all(&mut self) {
        // A patch spans several bytes: no thread may run while it goes (held here, then
        // detached as any stopped thread).
        let spaces: HashSet<u32> = self
            .breakpoints
            .iter()
            .filter(|(_, s)| s.patch)
            .map(|((p, _), _)| *p)
            .collect();
        for space in spaces {
            self.hold_space(space, None);
        }
        // SIGTRAP ignored again where a trap of ours reset it, through one of its threads,
        // stopped for the purpose: in every process that ignores it, not only those where a
        // reset was seen. A thread running until now may have trapped an instant ago (the
        // kernel reset SIGTRAP as it sent it), its stop not reported yet; once all are held,
        // `ignore_again_held` puts such a thread back onto its breakpoint. (Without this, a
        // trap in the last moments left SIGTRAP at its default after the detach, and the
        // program's own raise(SIGTRAP) then killed it: once in never_harm's runs.)
        let mut reset: Vec<u32> = self.trap_reset.keys().copied().collect();
        reset.extend(
            self.trap_ignored
                .iter()
                .filter(|p| !self.trap_reset.contains_key(p)),
        );
        for pid in reset {
            self.hold_space(self.space_of(pid), None);
            let via = self
                .threads
                .iter()
                .filter(|(_, t)| t.pid == pid && t.state == State::Stopped)
                .map(|(&tid, _)| tid)
                .min();
            // (Held until each is detached below: none may trap again meanwhile.)
            if let Some(tid) = via {
                self.ignore_again_held(pid, tid);
            }
        }
        // The code goes back to what it was before anything else.
        let removed: Vec<(u32, u64)> = self.breakpoints.keys().copied().collect();
        for (pid, addr) in &removed {
            if let Some(saved) = self.breakpoints.get(&(*pid, *addr)).cloned() {
                let _ = sys::write_memory(*pid, *addr, &saved.orig);
                self.bp_remove(*pid, *addr);
            }
        }
        let mut removed: HashSet<(u32, u64)> = removed.into_iter().collect();
        removed.extend(self.tombstones.iter().copied());
        // A thread must be stopped to be detached: interrupt the running ones, and detach
        // each as its stop arrives, handing back any signal it was about to receive.
        let mut swallow: HashSet<u32> = HashSet::new();
        let tids: Vec<u32> = self.threads.keys().copied().collect();
        for tid in tids {
            let t = self.threads[&tid];
            let gone = match t.state {
                State::Stopped => self.detach_one(tid, t.pending_signal, &removed, &mut swallow),
                // PTRACE_DETACH refuses a thread in PTRACE_LISTEN: trap it out first. One
                // already gone (reaped elsewhere) is not waited for.
                State::GroupStopped | State::Running
                    if t.state == State::GroupStopped || !t.interrupting =>
                {
                    sys::interrupt(tid).is_err_and(|e| e.raw_os_error() == Some(libc::ESRCH))
                }
                _ => false,
            };
            if gone {
                self.threads.remove(&tid);
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !self.threads.is_empty() && std::time::Instant::now() < deadline {
            let got = match sys::wait_any_nohang() {
                Ok(Some(x)) => Some(x),
                _ => {
                    sys::wait_sigchld(Duration::from_millis(20));
                    None
                }
            };
            let Some((tid, stop)) = got else { continue };
            let event = match stop {
                Stop::Ended(_) => {
                    self.threads.remove(&tid);
                    continue;
                }
                Stop::Other => continue,
                Stop::Event(e) => e,
                _ => 0,
            };
            if matches!(
                event,
                sys::PTRACE_EVENT_CLONE | sys::PTRACE_EVENT_FORK | sys::PTRACE_EVENT_VFORK
            ) {
                // A thread or child born as we let go: wait for it too.
                if let Ok(new) = sys::event_msg(tid) {
                    let pid = self.threads.get(&tid).map_or(tid, |t| t.pid);
                    let new_pid = if event == sys::PTRACE_EVENT_CLONE {
                        pid
                    } else {
                        new as u32
                    };
                    self.threads.entry(new as u32).or_insert(Thread {
                        pid: new_pid,
                        fresh: true,
                        ..Thread::default()
                    });
                }
            }
            // A signal on its way goes on with the thread (an event, an interrupt or a
            // syscall-stop carries none).
            let forward = stop.signal().unwrap_or(0);
            if self.detach_one(tid, forward, &removed, &mut swallow) {
                self.threads.remove(&tid);
            }
        }
    }

    /// Detaches one stopped thread, unless a breakpoint trap of ours is still to be dealt with
    /// (then it is resumed once more to report it, and `false` is returned). A SIGTRAP from a
    /// breakpoint just removed is not delivered, and the pc is moved back onto the restored
    /// instruction.
    pub(super) fn detach_one(
        &mut self,
        tid: u32,
        mut forward: i32,
        removed: &HashSet<(u32, u64)>,
        swallow: &mut HashSet<u32>,
    ) -> bool {
        let (pid, space) = self
            .threads
            .get(&tid)
            .map_or((tid, tid), |t| (t.pid, t.space()));
        let ours = |pc: u64| {
            let addr = pc.wrapping_sub(sys::PC_AFTER_BREAKPOINT);
            removed.contains(&(space, addr)).then_some(addr)
        };
        let pc = sys::regs(tid).map(|r| r.pc).unwrap_or(0);
        if forward == libc::SIGTRAP && sys::signal_from_kernel(tid) != Some(false) {
            if let Some(addr) = ours(pc) {
                let _ = sys::set_pc(tid, addr);
                forward = 0;
            } else if swallow.remove(&tid) {
                forward = 0;
            }
            if forward == 0 {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.trapped = true;
                }
            }
        } else if let Some(addr) = ours(pc).filter(|_| sigtrap_pending(pid, tid)) {
            // It trapped on a breakpoint, but stopped for us before the SIGTRAP was reported:
            // the SIGTRAP is still pending and would kill it once detached. Move it back onto
            // the instruction and let it report the signal, which is then dropped.
            let _ = sys::set_pc(tid, addr);
            swallow.insert(tid);
            let _ = sys::cont(tid, 0);
            return false;
        }
        if forward == 0 && self.threads.get(&tid).is_some_and(|t| t.trapped) {
            self.restore_trap_state(tid, false);
        }
        let _ = sys::detach(tid, forward);
        true
    }
}

/// Whether a SIGTRAP is pending for one thread (/proc/PID/task/TID/status, SigPnd).
pub(super) fn sigtrap_pending(pid: u32, tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .ok()
        .and_then(|s| {
            let v = s.lines().find_map(|l| l.strip_prefix("SigPnd:"))?;
            u64::from_str_radix(v.trim(), 16).ok()
        })
        .is_some_and(|mask| mask & (1 << (libc::SIGTRAP - 1)) != 0)
}
