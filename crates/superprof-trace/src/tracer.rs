//! The ptrace engine: seize a process (or a command about to exec) and every thread it starts,
//! translate wait statuses into events, forward signals, and let go cleanly.
//!
//! All ptrace calls must come from one thread; a `Tracer` is used from the thread that made it.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::time::Duration;

use crate::launch::ExitStatus;
use crate::sys;

/// What to follow and how to resume threads.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceOptions {
    /// Follow children over fork/vfork (threads are always followed).
    pub follow_forks: bool,
    /// Stop at every syscall entry and exit ([`TraceEvent::Syscall`]).
    pub syscalls: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    /// Stopped for us: the owner of the tracer resumes it.
    Stopped,
    /// In a group-stop (SIGSTOP and friends), kept there with PTRACE_LISTEN.
    GroupStopped,
}

#[derive(Debug, Clone, Copy)]
struct Thread {
    pid: u32,
    state: State,
    /// A PTRACE_INTERRUPT was sent and its stop not yet seen.
    interrupting: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceEvent {
    /// A thread stopped on [`Tracer::interrupt`]; it stays stopped until [`Tracer::resume`].
    Stopped {
        tid: u32,
        pid: u32,
    },
    /// Syscall entry or exit (with [`TraceOptions::syscalls`]); resume it with
    /// [`Tracer::resume`].
    Syscall {
        tid: u32,
        pid: u32,
    },
    NewThread {
        tid: u32,
        pid: u32,
    },
    NewProcess {
        pid: u32,
        parent: u32,
    },
    Exec {
        pid: u32,
    },
    ThreadExited {
        tid: u32,
        pid: u32,
    },
    /// A traced process ended; `status` is how its main thread ended.
    ProcessExited {
        pid: u32,
        status: ExitStatus,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("no process with pid {0}")]
    NoSuchProcess(u32),
    #[error("permission denied tracing pid {pid}: {why}")]
    PermissionDenied { pid: u32, why: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

fn ptrace_hint() -> String {
    let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| {
            format!(
                ", and kernel.yama.ptrace_scope is {} (lower it in /proc/sys/kernel/yama/ptrace_scope)",
                s.trim()
            )
        })
        .unwrap_or_default();
    format!(
        "ptrace needs the target's own user or CAP_SYS_PTRACE{yama}; run superprof as the \
         process's owner or as root"
    )
}

/// A traced process tree. Dropping it lets every thread go: an attached process runs on, a
/// launched one is killed (as PTRACE_O_EXITKILL would when superprof exits).
pub struct Tracer {
    root: u32,
    launched: bool,
    opts: TraceOptions,
    threads: HashMap<u32, Thread>,
    /// Stops of threads we have not heard of yet (a new thread can report before its parent's
    /// clone event).
    events: VecDeque<TraceEvent>,
    done: bool,
}

impl Tracer {
    fn options(&self) -> usize {
        let mut o = sys::PTRACE_O_TRACECLONE | sys::PTRACE_O_TRACEEXEC | sys::PTRACE_O_TRACESYSGOOD;
        if self.opts.follow_forks {
            o |= sys::PTRACE_O_TRACEFORK | sys::PTRACE_O_TRACEVFORK;
        }
        if self.launched {
            o |= sys::PTRACE_O_EXITKILL;
        }
        o
    }

    fn new(root: u32, launched: bool, opts: TraceOptions) -> Tracer {
        Tracer {
            root,
            launched,
            opts,
            threads: HashMap::new(),
            events: VecDeque::new(),
            done: false,
        }
    }

    /// Traces a child that superprof forked and that waits before exec (see
    /// [`crate::PendingChild`]); release the child afterwards.
    pub fn launch(pid: u32, opts: TraceOptions) -> Result<Tracer, TraceError> {
        let mut t = Tracer::new(pid, true, opts);
        sys::seize(pid, t.options()).map_err(|e| TraceError::Io {
            context: format!("PTRACE_SEIZE of the launched command (pid {pid})"),
            source: e,
        })?;
        t.threads.insert(
            pid,
            Thread {
                pid,
                state: State::Running,
                interrupting: false,
            },
        );
        Ok(t)
    }

    /// Seizes every thread of a running process; it keeps running.
    pub fn attach(pid: u32, opts: TraceOptions) -> Result<Tracer, TraceError> {
        let mut t = Tracer::new(pid, false, opts);
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(TraceError::NoSuchProcess(pid));
        }
        loop {
            let tids = list_tasks(pid).map_err(|_| TraceError::NoSuchProcess(pid))?;
            let new: Vec<u32> = tids
                .into_iter()
                .filter(|t2| !t.threads.contains_key(t2))
                .collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                match sys::seize(tid, t.options()) {
                    Ok(()) => {}
                    // Gone meanwhile, or already ours through PTRACE_O_TRACECLONE.
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) && !t.threads.is_empty() => {}
                    Err(e)
                        if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) =>
                    {
                        return Err(TraceError::PermissionDenied {
                            pid,
                            why: ptrace_hint(),
                        })
                    }
                    Err(e) => {
                        return Err(TraceError::Io {
                            context: format!("PTRACE_SEIZE of thread {tid}"),
                            source: e,
                        })
                    }
                }
                t.threads.insert(
                    tid,
                    Thread {
                        pid,
                        state: State::Running,
                        interrupting: false,
                    },
                );
            }
        }
        if t.threads.is_empty() {
            return Err(TraceError::NoSuchProcess(pid));
        }
        if opts.syscalls {
            // A seized thread runs on freely; syscall stops start once it has been stopped and
            // resumed with PTRACE_SYSCALL. This stop is resumed as a "first stop".
            for &tid in t.threads.keys() {
                let _ = sys::interrupt(tid);
            }
        }
        Ok(t)
    }

    /// The process given to `launch` or `attach`.
    pub fn root(&self) -> u32 {
        self.root
    }

    /// Threads that are running (neither stopped for us nor in a group-stop).
    pub fn running_threads(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.threads
            .iter()
            .filter(|(_, t)| t.state == State::Running)
            .map(|(&tid, t)| (tid, t.pid))
    }

    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    /// Asks a running thread to stop; a [`TraceEvent::Stopped`] follows.
    pub fn interrupt(&mut self, tid: u32) -> bool {
        match self.threads.get_mut(&tid) {
            Some(t) if t.state == State::Running && !t.interrupting => {
                t.interrupting = sys::interrupt(tid).is_ok();
                t.interrupting
            }
            _ => false,
        }
    }

    /// Resumes a thread stopped for us.
    pub fn resume(&mut self, tid: u32) {
        self.resume_with(tid, 0);
    }

    fn resume_with(&mut self, tid: u32, sig: i32) {
        let r = if self.opts.syscalls {
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

    fn add_thread(&mut self, tid: u32, pid: u32) -> bool {
        if self.threads.contains_key(&tid) {
            return false;
        }
        self.threads.insert(
            tid,
            Thread {
                pid,
                state: State::Running,
                interrupting: false,
            },
        );
        true
    }

    /// The next event, waiting at most `timeout`. Signals are forwarded, new threads and
    /// processes resumed, on the way.
    pub fn next_event(&mut self, timeout: Duration) -> io::Result<Option<TraceEvent>> {
        if let Some(e) = self.events.pop_front() {
            return Ok(Some(e));
        }
        self.drain()?;
        if self.events.is_empty() && !timeout.is_zero() && !self.threads.is_empty() {
            sys::wait_sigchld(timeout);
            self.drain()?;
        }
        Ok(self.events.pop_front())
    }

    fn drain(&mut self) -> io::Result<()> {
        while let Some((tid, st)) = sys::wait_any_nohang()? {
            self.handle(tid, st);
        }
        Ok(())
    }

    fn handle(&mut self, tid: u32, st: sys::WaitStatus) {
        if let Some(status) = st
            .exited()
            .map(ExitStatus::Code)
            .or_else(|| st.signaled().map(ExitStatus::Signal))
        {
            let Some(t) = self.threads.remove(&tid) else {
                return;
            };
            if tid == t.pid {
                // The main thread reports last, once the whole group is gone.
                self.threads.retain(|_, x| x.pid != t.pid);
                self.events
                    .push_back(TraceEvent::ProcessExited { pid: t.pid, status });
            } else {
                self.events
                    .push_back(TraceEvent::ThreadExited { tid, pid: t.pid });
            }
            return;
        }
        let Some(sig) = st.stop_sig() else { return };
        if !self.threads.contains_key(&tid) {
            // A thread or child auto-attached through TRACECLONE/TRACEFORK that reports
            // before its parent's event: adopt it; its first stop is just resumed.
            let pid = sys::tgid_of(tid).unwrap_or(tid);
            self.add_thread(tid, pid);
            self.events.push_back(if pid == tid && pid != self.root {
                TraceEvent::NewProcess { pid, parent: 0 }
            } else {
                TraceEvent::NewThread { tid, pid }
            });
            self.resume_with(tid, 0);
            return;
        }
        let pid = self.threads[&tid].pid;
        match st.event() {
            sys::PTRACE_EVENT_CLONE | sys::PTRACE_EVENT_FORK | sys::PTRACE_EVENT_VFORK => {
                if let Ok(new) = sys::event_msg(tid) {
                    let new = new as u32;
                    let is_thread = st.event() == sys::PTRACE_EVENT_CLONE
                        && sys::tgid_of(new).is_none_or(|g| g == pid);
                    let new_pid = if is_thread { pid } else { new };
                    if self.add_thread(new, new_pid) {
                        self.events.push_back(if is_thread {
                            TraceEvent::NewThread { tid: new, pid }
                        } else {
                            TraceEvent::NewProcess {
                                pid: new,
                                parent: pid,
                            }
                        });
                    }
                }
                self.resume_with(tid, 0);
            }
            sys::PTRACE_EVENT_EXEC => {
                // Every other thread of the process is gone; the exec'ing one is now `pid`.
                self.threads.retain(|&t2, x| x.pid != pid || t2 == tid);
                if tid != pid {
                    if let Some(t) = self.threads.remove(&tid) {
                        self.threads.insert(pid, t);
                    }
                }
                self.events.push_back(TraceEvent::Exec { pid });
                self.resume_with(pid, 0);
            }
            sys::PTRACE_EVENT_STOP => {
                if matches!(
                    sig,
                    libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                ) {
                    // Group-stop: stay stopped as the signal wants, without us resuming it.
                    if let Some(t) = self.threads.get_mut(&tid) {
                        t.state = State::GroupStopped;
                        t.interrupting = false;
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
            _ if sig == (libc::SIGTRAP | 0x80) => {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.state = State::Stopped;
                }
                self.events.push_back(TraceEvent::Syscall { tid, pid });
            }
            _ => {
                // A signal on its way to the target: deliver it.
                self.resume_with(tid, sig);
            }
        }
    }

    /// Lets every thread go: detaches an attached process (it runs on), kills a launched one.
    /// Returns how the root process ended, if it did.
    pub fn finish(&mut self) -> Option<ExitStatus> {
        if self.done {
            return None;
        }
        self.done = true;
        if self.launched {
            if !self.threads.contains_key(&self.root) {
                return None; // already reaped: its pid may belong to someone else by now
            }
            sys::kill_thread(self.root, self.root, libc::SIGKILL);
            let mut status = None;
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !self.threads.is_empty() && std::time::Instant::now() < deadline {
                if let Ok(Some(TraceEvent::ProcessExited { pid, status: s })) =
                    self.next_event(Duration::from_millis(50))
                {
                    if pid == self.root {
                        status = Some(s);
                    }
                }
            }
            return status;
        }
        self.detach_all();
        None
    }

    fn detach_all(&mut self) {
        // A thread must be stopped to be detached: interrupt the running ones, and detach
        // each as its stop arrives, handing back any signal it was about to receive.
        let tids: Vec<u32> = self.threads.keys().copied().collect();
        for tid in tids {
            let t = self.threads[&tid];
            match t.state {
                State::Stopped | State::GroupStopped => {
                    let _ = sys::detach(tid, 0);
                    self.threads.remove(&tid);
                }
                State::Running => {
                    if !t.interrupting {
                        let _ = sys::interrupt(tid);
                    }
                }
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
            let Some((tid, st)) = got else { continue };
            if st.exited().is_some() || st.signaled().is_some() {
                self.threads.remove(&tid);
                continue;
            }
            let Some(sig) = st.stop_sig() else { continue };
            let forward = if st.event() == 0 && sig != (libc::SIGTRAP | 0x80) {
                sig
            } else {
                0
            };
            let _ = sys::detach(tid, forward);
            self.threads.remove(&tid);
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.finish();
    }
}

fn list_tasks(pid: u32) -> io::Result<Vec<u32>> {
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}
