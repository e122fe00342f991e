//! What a wait status means for the tracer: threads and processes born, ended and gone,
//! signals forwarded or kept, stops answered; the events the caller gets.

use super::*;

impl Tracer {
    pub(super) fn resume_with(&mut self, tid: u32, mut sig: i32) {
        if sig == libc::SIGTRAP && self.guard {
            // A SIGTRAP sent to a program that ignores it (and whose disposition a trap of
            // ours may have reset since): dropped, as the kernel would have.
            if self
                .threads
                .get(&tid)
                .is_some_and(|t| self.trap_ignored.contains(&t.pid))
            {
                sig = 0;
            }
        }
        let r = if self.late_steps.contains(&tid) {
            // Stopped (held, interrupted) in the middle of a step that is still to end: it
            // goes on stepping, or its end would never be reported.
            sys::single_step(tid, sig)
        } else if self.opts.syscalls
            || (self.guard && !self.threads.get(&tid).is_some_and(|t| t.quiet))
        {
            sys::cont_syscall(tid, sig)
        } else {
            sys::cont(tid, sig)
        };
        if let Some(t) = self.threads.get_mut(&tid) {
            if r.is_ok() {
                t.state = State::Running;
            }
        }
    }

    /// Records an auto-attached thread or process whose first stop is still to come.
    pub(super) fn add_thread(&mut self, tid: u32, pid: u32) -> bool {
        if self.threads.contains_key(&tid) {
            return false;
        }
        self.threads.insert(
            tid,
            Thread {
                pid,
                fresh: true,
                ..Thread::default()
            },
        );
        // (It has run nothing yet: its mask is the one its parent gave it; a new process's
        // action too.)
        self.learn_trap_state_of(tid, tid == pid);
        true
    }

    /// A new process `child` forked by thread `parent_tid`, sharing its memory (vfork,
    /// posix_spawn, clone(CLONE_VM)) or with a copy of it. A sharing child uses the parent's
    /// breakpoints: followed or not, it stays traced until it execs or exits, its traps
    /// handled as the parent's. A copy is followed with the breakpoints its memory holds, or
    /// has them removed at its first stop and is let go. Returns whether it is followed.
    pub(super) fn new_process(&mut self, child: u32, parent_tid: u32, shares: bool) -> bool {
        let follow = self.opts.follow_forks;
        let parent_space = self
            .threads
            .get(&parent_tid)
            .map_or(parent_tid, |t| t.space());
        let Some(t) = self.threads.get_mut(&child) else {
            return false;
        };
        if shares {
            t.shares_memory = true;
            t.space = parent_space;
            t.borrowed = !follow;
            return follow;
        }
        // Followed: its memory holds the breakpoints. Not: what to clean at its first stop.
        t.release_at_first_stop = !follow;
        let copies: Vec<((u32, u64), Saved)> = self
            .breakpoints
            .iter()
            .filter(|((p, _), _)| *p == parent_space)
            .map(|((_, a), b)| ((child, *a), b.clone()))
            .collect();
        for ((p, a), b) in copies {
            self.bp_insert(p, a, b);
        }
        follow
    }

    /// Process `pid` no longer runs in its memory (it exited or called exec). Its breakpoint
    /// table goes to a process still sharing that memory, if any, or is dropped; a parent
    /// blocked in vfork on it goes on.
    pub(super) fn leave_memory(&mut self, pid: u32) {
        for t in self.threads.values_mut() {
            if t.in_vfork == Some(pid) {
                t.in_vfork = None;
            }
        }
        if self.space_of(pid) != pid {
            return; // it used another process's table
        }
        let heir = self
            .threads
            .values()
            .find(|t| t.pid != pid && t.space() == pid)
            .map(|t| t.pid);
        match heir {
            Some(heir) => {
                let moved: Vec<((u32, u64), Saved)> = self
                    .breakpoints
                    .iter()
                    .filter(|((p, _), _)| *p == pid)
                    .map(|((_, a), b)| ((heir, *a), b.clone()))
                    .collect();
                // The heir's entries first: the code must stay covered all along.
                for ((p, a), b) in moved {
                    self.bp_insert(p, a, b);
                }
                self.bp_forget_space(pid);
                let tombs: Vec<(u32, u64)> = self
                    .tombstones
                    .iter()
                    .filter(|(p, _)| *p == pid)
                    .map(|(_, a)| (heir, *a))
                    .collect();
                self.tombstones.retain(|(p, _)| *p != pid);
                self.tombstones.extend(tombs);
                for t in self.threads.values_mut() {
                    if t.pid != pid && t.space() == pid {
                        t.space = if t.pid == heir { 0 } else { heir };
                    }
                }
            }
            None => {
                self.bp_forget_space(pid);
                self.tombstones.retain(|(p, _)| *p != pid);
            }
        }
    }

    pub(super) fn drain(&mut self) -> io::Result<()> {
        while let Some((tid, st)) = sys::wait_any_nohang()? {
            self.handle(tid, st);
        }
        Ok(())
    }

    /// (One function of 210 lines: one wait status handled per call, each arm changing the thread
    /// table, the pending events and the breakpoints together; split, every arm would take the
    /// tracer whole anyway.)
    pub(super) fn handle(&mut self, tid: u32, stop: Stop) {
        if let Stop::Ended(status) = stop {
            let Some(t) = self.threads.remove(&tid) else {
                return;
            };
            self.late_steps.remove(&tid);
            if tid == t.pid {
                // The main thread reports last, once the whole group is gone; its pid may be
                // reused, so nothing of it is kept.
                self.threads.retain(|_, x| x.pid != t.pid);
                self.leave_memory(t.pid);
                if t.borrowed {
                    self.events.push_back(TraceEvent::ThreadExited {
                        tid,
                        pid: t.space(),
                    });
                } else {
                    self.events
                        .push_back(TraceEvent::ProcessExited { pid: t.pid, status });
                }
            } else {
                self.events
                    .push_back(TraceEvent::ThreadExited { tid, pid: t.pid });
            }
            return;
        }
        if stop == Stop::Other {
            return;
        }
        if !self.threads.contains_key(&tid) {
            // A thread or child auto-attached through TRACECLONE/TRACEFORK that reports
            // before its parent's event: adopt it; this is its first stop.
            let pid = sys::tgid_of(tid).unwrap_or(tid);
            if !self.add_thread(tid, pid) {
                self.resume_with(tid, 0);
                return;
            }
            if let Some(sig) = stop.signal() {
                // Not a first stop: a signal on its way to a task we did not know. It keeps
                // its signal (a pid reused since we last saw it, say).
                let space = self.space_of(pid);
                let t = self.threads.get_mut(&tid).expect("just added");
                t.fresh = false;
                t.space = if space == pid { 0 } else { space };
                self.resume_with(tid, sig);
                return;
            }
            let is_process = pid == tid && pid != self.root;
            let space = self.space_of(pid);
            let t = self.threads.get_mut(&tid).expect("just added");
            t.fresh = false;
            if is_process {
                // Whether it shares its parent's memory comes with the parent's fork event:
                // it waits, stopped, until then.
                t.awaiting_origin = true;
                t.state = State::Stopped;
                return;
            }
            t.space = if space == pid { 0 } else { space };
            self.events.push_back(TraceEvent::NewThread { tid, pid });
            if self.opts.hold_new_threads {
                t.state = State::Stopped;
                self.events.push_back(TraceEvent::ThreadReady { tid, pid });
            } else {
                self.resume_with(tid, 0);
            }
            return;
        }
        let pid = self.threads[&tid].pid;
        match stop {
            Stop::Event(
                event
                @ (sys::PTRACE_EVENT_CLONE | sys::PTRACE_EVENT_FORK | sys::PTRACE_EVENT_VFORK),
            ) => {
                if let Ok(new) = sys::event_msg(tid) {
                    self.on_fork_event(tid, pid, new as u32, event);
                }
                self.resume_with(tid, 0);
            }
            Stop::Event(sys::PTRACE_EVENT_EXEC) => {
                // Every other thread of the process is gone; the exec'ing one is now `pid`.
                // The old code, and the breakpoints in it, are gone too (or stay with a
                // process that still shares that memory).
                let (borrowed, old_space) = self.threads[&tid].borrowed_in();
                self.threads.retain(|&t2, x| x.pid != pid || t2 == tid);
                self.leave_memory(pid);
                if borrowed {
                    // A child that shared a traced process's memory, not followed: from now
                    // on it is a program of its own; let it go.
                    self.threads.remove(&tid);
                    let _ = sys::detach(tid, 0);
                    self.events.push_back(TraceEvent::ThreadExited {
                        tid,
                        pid: old_space,
                    });
                    return;
                }
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.space = 0;
                    t.shares_memory = false;
                }
                if tid != pid {
                    self.threads.remove(&tid);
                    self.threads.insert(
                        pid,
                        Thread {
                            pid,
                            ..Thread::default()
                        },
                    );
                }
                // It stays stopped: the owner can read the new image, set breakpoints, and
                // then resume it.
                if let Some(t) = self.threads.get_mut(&pid) {
                    t.state = State::Stopped;
                }
                self.learn_trap_state(pid);
                self.events.push_back(TraceEvent::Exec { pid });
            }
            // An event the options never ask for: let it run.
            Stop::Event(_) => self.resume_with(tid, 0),
            Stop::Interrupt { stopping } => {
                let t = self.threads.get_mut(&tid).expect("known thread");
                if t.fresh {
                    // The first stop of an auto-attached thread or process.
                    t.fresh = false;
                    if t.release_at_first_stop {
                        self.release_child(tid);
                    } else if self.opts.hold_new_threads && t.pid != tid {
                        t.state = State::Stopped;
                        let pid = t.pid;
                        self.events.push_back(TraceEvent::ThreadReady { tid, pid });
                    } else {
                        self.resume_with(tid, 0);
                    }
                    return;
                }
                if stopping {
                    // Group-stop: stay stopped as the signal wants, without us resuming it.
                    // A pending interrupt stays pending: it is answered when the group-stop
                    // ends (SIGCONT re-traps with an event stop).
                    if let Some(t) = self.threads.get_mut(&tid) {
                        t.state = State::GroupStopped;
                    }
                    let _ = sys::listen(tid);
                    return;
                }
                let t = self.threads.get_mut(&tid).expect("known thread");
                if t.interrupting {
                    t.interrupting = false;
                    t.state = State::Stopped;
                    self.events.push_back(TraceEvent::Stopped { tid, pid });
                } else {
                    // The first stop of a thread we seized or adopted, or the end of a
                    // group-stop (SIGCONT): let it run.
                    self.resume_with(tid, 0);
                }
            }
            Stop::Syscall => {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.state = State::Stopped;
                }
                if self.follow_signal_call(tid) && self.trap_reset.contains_key(&pid) {
                    // Before the program goes on from a system call (it may raise or read
                    // SIGTRAP next): ignored again.
                    self.ignore_again(pid, tid);
                }
                if !self.opts.syscalls {
                    // A stop of the guard's only: on.
                    self.resume_with(tid, 0);
                    return;
                }
                self.events.push_back(TraceEvent::Syscall { tid, pid });
            }
            // The end of a step that outlived its wait: a trap of the kernel's, and not of a
            // breakpoint instruction (the thread may have reached one since, if something
            // resumed it without the step).
            Stop::Trap
                if self.late_steps.contains(&tid)
                    && sys::step_trap(tid) != Some(false)
                    && sys::breakpoint_trap(tid) != Some(true) =>
            {
                self.late_steps.remove(&tid);
                let space = self.space_of(pid);
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.state = State::Stopped;
                    t.trapped = true;
                }
                self.events
                    .push_back(TraceEvent::Stepped { tid, pid: space });
            }
            Stop::Trap if self.hit_breakpoint(tid).is_some() => {
                let addr = self.threads[&tid].at_breakpoint.unwrap_or(0);
                let space = self.space_of(pid);
                self.events.push_back(TraceEvent::Breakpoint {
                    tid,
                    pid: space,
                    addr,
                });
            }
            Stop::Trap if self.trapped_on_tombstone(tid) => {
                // It trapped on a breakpoint removed since: back onto the restored code.
                self.resume_with(tid, 0);
            }
            // A signal on its way to the target: deliver it.
            Stop::Trap => self.resume_with(tid, libc::SIGTRAP),
            Stop::Signal(sig) => self.resume_with(tid, sig),
            Stop::Ended(_) | Stop::Other => {} // handled above
        }
    }

    /// A fork, vfork or clone event of thread `tid` (of process `pid`) that made `new`.
    pub(super) fn on_fork_event(&mut self, tid: u32, pid: u32, new: u32, event: i32) {
        let is_thread =
            event == sys::PTRACE_EVENT_CLONE && sys::tgid_of(new).is_none_or(|g| g == pid);
        if is_thread {
            let space = self.threads.get(&tid).map_or(0, |t| t.space);
            if self.add_thread(new, pid) {
                if let Some(t) = self.threads.get_mut(&new) {
                    t.space = space;
                }
                self.events
                    .push_back(TraceEvent::NewThread { tid: new, pid });
            }
            return;
        }
        let awaiting = self.threads.get(&new).is_some_and(|t| t.awaiting_origin);
        if !self.add_thread(new, new) && !awaiting {
            return;
        }
        // kcmp says; where it is not allowed (a container's seccomp profile), the clone's own
        // flags, read at this stop; else what the event suggests.
        let shares = sys::same_memory(pid, new)
            .or_else(|| sys::clone_shares_memory(tid))
            .unwrap_or(event == sys::PTRACE_EVENT_VFORK);
        let followed = self.new_process(new, tid, shares);
        if event == sys::PTRACE_EVENT_VFORK {
            if let Some(t) = self.threads.get_mut(&tid) {
                t.in_vfork = Some(new);
            }
        }
        if followed {
            self.events.push_back(TraceEvent::NewProcess {
                pid: new,
                parent: pid,
            });
        }
        if awaiting {
            // Its first stop came first and is still held: go on from it now.
            let release = match self.threads.get_mut(&new) {
                Some(t) => {
                    t.awaiting_origin = false;
                    t.release_at_first_stop
                }
                None => false,
            };
            if release {
                self.release_child(new);
            } else {
                self.resume_with(new, 0);
            }
        }
    }
}
