//! Holding every other thread of an address space while one is worked on (code changed under
//! a thread that runs it is never safe), and the events that come meanwhile.

use super::*;

impl Tracer {
    /// Holds stopped every thread that runs code in the memory of `space` (a child sharing it
    /// too), except `except` and a parent blocked in vfork (it runs none and cannot stop);
    /// gives up after 10 s. [`Tracer::release_held`] lets them go.
    pub(super) fn hold_space(&mut self, space: u32, except: Option<u32>) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let must_hold = |o: u32, x: &Thread| {
            Some(o) != except
                && x.space() == space
                && x.state == State::Running
                && x.in_vfork.is_none()
        };
        while self.threads.iter().any(|(&o, x)| must_hold(o, x))
            && std::time::Instant::now() < deadline
        {
            // Interrupted here: those running now, and any let go meanwhile (a child whose
            // fork event came during the hold is resumed by it).
            let others: Vec<u32> = self
                .threads
                .iter()
                .filter(|(&o, x)| must_hold(o, x) && !x.held)
                .map(|(&o, _)| o)
                .collect();
            for o in others {
                match sys::interrupt(o) {
                    Ok(()) => {
                        if let Some(x) = self.threads.get_mut(&o) {
                            x.held = true;
                        }
                    }
                    // Gone (reaped behind our back): nothing to hold.
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                        self.threads.remove(&o);
                    }
                    Err(_) => {}
                }
            }
            match sys::wait_any_nohang() {
                Ok(Some((t2, st))) => self.handle_while_holding(space, t2, st),
                _ => sys::wait_sigchld(Duration::from_millis(10)),
            }
        }
    }

    /// Lets go every thread held by [`Tracer::hold_space`].
    pub(super) fn release_held(&mut self) {
        let held: Vec<u32> = self
            .threads
            .iter()
            .filter(|(_, x)| x.held)
            .map(|(&o, _)| o)
            .collect();
        for o in held {
            if let Some(x) = self.threads.get_mut(&o) {
                x.held = false;
            }
            self.let_go(o);
        }
    }

    /// Holds every other thread that runs in the memory of stopped thread `tid` stopped, so
    /// that its code can be changed or a syscall run in it safely; [`Tracer::let_others_go`]
    /// ends the hold. Their own stops meanwhile become events, as usual.
    pub fn hold_others(&mut self, tid: u32) {
        let space = self.threads.get(&tid).map_or(tid, |t| t.space());
        self.hold_space(space, Some(tid));
    }

    /// Ends [`Tracer::hold_others`].
    pub fn let_others_go(&mut self) {
        self.release_held();
    }

    /// A wait status that arrives while the threads running in the memory of `space` are
    /// being held.
    ///
    /// (One function of 102 lines: one wait status per call, as in `handle`, each arm setting the
    /// thread's state and hold together and queueing its event or deferring its signal.)
    pub(super) fn handle_while_holding(&mut self, space: u32, tid: u32, stop: Stop) {
        if matches!(stop, Stop::Ended(_) | Stop::Other) {
            return self.handle(tid, stop); // an exit
        }
        let known = self.threads.get(&tid).copied();
        let group = known.map_or_else(|| sys::tgid_of(tid), |t| Some(t.pid));
        let in_space = match known {
            Some(t) => t.space() == space,
            None => group.is_some_and(|g| g != tid && self.space_of(g) == space),
        };
        if !in_space {
            return self.handle(tid, stop);
        }
        let pid = group.unwrap_or(space);
        if known.is_none() {
            // A thread born just before the hold: adopt it held, at its first stop.
            self.threads.insert(
                tid,
                Thread {
                    pid,
                    space: if pid == space { 0 } else { space },
                    state: State::Stopped,
                    held: true,
                    ..Thread::default()
                },
            );
            self.learn_trap_state_of(tid, false);
            self.events.push_back(TraceEvent::NewThread { tid, pid });
            return;
        }
        let t = self.threads.get_mut(&tid).expect("known");
        match stop {
            Stop::Interrupt { stopping: true } if !t.fresh => {
                // Group-stop: it stays stopped anyway; keep it there, not held.
                t.state = State::GroupStopped;
                t.held = false;
                let _ = sys::listen(tid);
            }
            Stop::Interrupt { .. } if t.interrupting => {
                // The owner's interrupt (the sampler's) answered: report it, the owner resumes.
                t.interrupting = false;
                t.state = State::Stopped;
                t.held = false;
                self.events.push_back(TraceEvent::Stopped { tid, pid });
            }
            Stop::Interrupt { .. } => {
                t.fresh = false;
                t.state = State::Stopped;
                t.held = true;
            }
            Stop::Trap => {
                if self.hit_breakpoint(tid).is_some() {
                    let addr = self.threads[&tid].at_breakpoint.unwrap_or(0);
                    self.events.push_back(TraceEvent::Breakpoint {
                        tid,
                        pid: space,
                        addr,
                    });
                } else if self.trapped_on_tombstone(tid) {
                    let t = self.threads.get_mut(&tid).expect("known");
                    t.state = State::Stopped;
                    t.held = true;
                } else {
                    self.defer_signal(tid, libc::SIGTRAP);
                    let t = self.threads.get_mut(&tid).expect("known");
                    t.state = State::Stopped;
                    t.held = true;
                }
            }
            Stop::Syscall => {
                t.state = State::Stopped;
                if self.opts.syscalls {
                    t.held = false;
                    let _ = self.follow_signal_call(tid);
                    self.events.push_back(TraceEvent::Syscall { tid, pid });
                } else {
                    // A stop of the guard's only: held like the others.
                    t.held = true;
                    let _ = self.follow_signal_call(tid);
                }
            }
            Stop::Signal(sig) => {
                t.state = State::Stopped;
                t.held = true;
                self.defer_signal(tid, sig);
            }
            Stop::Ended(_) | Stop::Other => {} // handled above
            Stop::Event(_) => {
                // clone/fork/exec events of a held thread: process them normally; the thread
                // is resumed by that, so hold it again.
                self.handle(tid, stop);
                if let Some(t) = self.threads.get(&tid) {
                    if t.state == State::Running {
                        let _ = sys::interrupt(tid);
                        if let Some(t) = self.threads.get_mut(&tid) {
                            t.held = true;
                        }
                    }
                }
            }
        }
    }
}
