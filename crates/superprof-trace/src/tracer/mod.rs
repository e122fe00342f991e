//! The ptrace engine: seize a process (or a command about to exec) and every thread it starts,
//! translate wait statuses into events, forward signals, and let go cleanly.
//!
//! All ptrace calls must come from one thread; a `Tracer` is used from the thread that made it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::time::Duration;

use crate::launch::ExitStatus;
use crate::status::Stop;
use crate::sys;

mod code;
mod detach;
mod events;
mod hold;
mod inject;
mod trap_state;

/// What to follow and how to resume threads.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceOptions {
    /// Follow children over fork/vfork (threads are always followed).
    pub follow_forks: bool,
    /// Stop at every syscall entry and exit ([`TraceEvent::Syscall`]).
    pub syscalls: bool,
    /// Keep each new thread stopped at its first stop, before it runs any instruction, and
    /// report it ([`TraceEvent::ThreadReady`]); resume it with [`Tracer::resume`].
    pub hold_new_threads: bool,
    /// Keep the program's own SIGTRAP state (ignored, blocked) through the tracer's traps
    /// (the crate's `sigtrap` module): from the first breakpoint or step, threads also stop at each
    /// system call. For owners whose program stops at every probe anyway: the stops would
    /// distort per-call figures.
    pub guard_sigtrap: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Running,
    /// Stopped for us: the owner of the tracer resumes it.
    Stopped,
    /// In a group-stop (SIGSTOP and friends), kept there with PTRACE_LISTEN.
    GroupStopped,
}

#[derive(Debug, Clone, Copy, Default)]
struct Thread {
    pid: u32,
    state: State,
    /// A PTRACE_INTERRUPT was sent and its stop not yet seen.
    interrupting: bool,
    /// Stopped on the breakpoint at this address (pc already moved back onto it).
    at_breakpoint: Option<u64>,
    /// Held stopped while another thread steps over a breakpoint.
    held: bool,
    /// A signal that arrived while held, delivered when it is let go.
    pending_signal: i32,
    /// A fork child that is not followed: clean its copy of the breakpoints and detach it at
    /// its first stop.
    release_at_first_stop: bool,
    /// Auto-attached and its first stop (PTRACE_EVENT_STOP) not seen yet.
    fresh: bool,
    /// A child that shares its parent's memory (vfork, posix_spawn, clone(CLONE_VM)) until it
    /// execs or exits.
    shares_memory: bool,
    /// The process whose breakpoint table covers this thread's memory; 0: its own. A child
    /// sharing its parent's memory uses the parent's: a breakpoint there is in both.
    space: u32,
    /// Blocked in vfork until this child execs or exits: it runs no code meanwhile and cannot
    /// stop for us, so it is not held during steps.
    in_vfork: Option<u32>,
    /// A child that is not followed but shares the memory of a traced process: kept traced
    /// (its traps are ours too) until it execs or exits, then let go.
    borrowed: bool,
    /// A new process whose first stop came before its parent's fork event: kept stopped
    /// until that event says whether it shares the parent's memory.
    awaiting_origin: bool,
    /// The program blocks SIGTRAP in this thread (as last read; see [`crate::sigtrap`]).
    trap_blocked: bool,
    /// A SIGTRAP of the tracer's own (a breakpoint, a step's end) was taken since the thread
    /// last ran: the kernel may have reset the program's SIGTRAP state.
    trapped: bool,
    /// In a system call that may change its SIGTRAP state: read it again at the exit.
    in_signal_call: crate::sigtrap::Change,
    /// Resumed without system call stops even while guarding ([`Tracer::set_quiet`]).
    quiet: bool,
}

impl Thread {
    /// Whether it is a borrowed child (see `borrowed`), and the process whose memory it shares.
    fn borrowed_in(&self) -> (bool, u32) {
        (self.borrowed, self.space())
    }

    /// The process whose breakpoints are in this thread's memory.
    fn space(&self) -> u32 {
        if self.space == 0 {
            self.pid
        } else {
            self.space
        }
    }
}

/// How long a process that ignores SIGTRAP may have it reset by traps of ours before the
/// next trap sets it ignored again (each time costs two system calls run in the program,
/// its other threads held): the window in which superprof's death would leave it reset.
const TRAP_RESET_GRACE: Duration = Duration::from_millis(10);

/// How long a thread resumed into an injected system call may take to reach its stops. It
/// only has to be scheduled (the call is its next instruction, or the stub's), but a loaded or
/// emulated machine may not run it for seconds (in the arm64 guest under TCG, with a second
/// guest beside it, a thread once took more than 5 s). What never runs (a frozen cgroup) is
/// given up after this, the program left as it was.
const INJECTED_CALL_DEADLINE: Duration = Duration::from_secs(20);

/// The longest patch [`Tracer::patch_code`] takes (what the janitor's table holds).
pub const MAX_PATCH: usize = 8;

/// How a single step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepEnd {
    Done,
    /// The thread ended.
    Ended,
    /// Still in the instruction when the wait ran out (a syscall that blocks).
    Pending,
    /// ptrace refused the step (the thread is gone or not stopped).
    Failed,
}

/// The original bytes under a breakpoint or a patch.
#[derive(Debug, Clone)]
struct Saved {
    orig: Vec<u8>,
    /// A patch (a jump to code mapped into the program), not a breakpoint: it never traps.
    patch: bool,
}

/// What the traced threads did, as [`Tracer::next_event`] reports it. A thread stopped by an
/// event stays stopped until [`Tracer::resume`] (or [`Tracer::resume_after`]), as each
/// variant says; `pid` is the thread's process unless a variant says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceEvent {
    /// A thread stopped on [`Tracer::interrupt`]; it stays stopped until [`Tracer::resume`].
    Stopped {
        /// The thread.
        tid: u32,
        /// Its process.
        pid: u32,
    },
    /// A thread reached a breakpoint set with [`Tracer::set_breakpoint`]; it stays stopped on
    /// it until [`Tracer::resume`], which steps over the breakpoint. `pid` is the process whose
    /// memory holds the breakpoint: for a child that shares its parent's memory (vfork,
    /// posix_spawn) until it execs, the parent.
    Breakpoint {
        /// The thread, its pc on the breakpoint.
        tid: u32,
        /// The process whose memory holds the breakpoint.
        pid: u32,
        /// The breakpoint's address.
        addr: u64,
    },
    /// A [`Tracer::single_step`] finished (`pid` as for `Breakpoint`).
    Stepped {
        /// The thread, stopped after the instruction.
        tid: u32,
        /// The process whose memory it runs in.
        pid: u32,
    },
    /// Syscall entry or exit (with [`TraceOptions::syscalls`]); resume it with
    /// [`Tracer::resume`].
    Syscall {
        /// The thread, stopped at the entry or the exit.
        tid: u32,
        /// Its process.
        pid: u32,
    },
    /// A new thread of a traced process, traced from its start. It runs on by itself, unless
    /// [`TraceOptions::hold_new_threads`] holds it: a [`TraceEvent::ThreadReady`] follows then.
    NewThread {
        /// The new thread.
        tid: u32,
        /// Its process.
        pid: u32,
    },
    /// A new thread at its first stop, held there (with [`TraceOptions::hold_new_threads`]):
    /// it has run nothing yet. Resume it with [`Tracer::resume`].
    ThreadReady {
        /// The new thread.
        tid: u32,
        /// Its process.
        pid: u32,
    },
    /// A child process followed (with [`TraceOptions::follow_forks`]): it and every thread
    /// it starts are traced from now on. It runs on by itself.
    NewProcess {
        /// The child.
        pid: u32,
        /// The process that forked it.
        parent: u32,
    },
    /// A process called exec. Its (only remaining) thread `pid` is stopped at the start of
    /// the new program until [`Tracer::resume`].
    Exec {
        /// The process; its one thread has this id now, whichever thread called exec.
        pid: u32,
    },
    /// A thread ended, or left the memory of `pid`: a child that shared it (vfork,
    /// posix_spawn) and is not followed called exec or exited.
    ThreadExited {
        /// The thread.
        tid: u32,
        /// Its process, or the process whose memory it shared.
        pid: u32,
    },
    /// A traced process ended; `status` is how its main thread ended.
    ProcessExited {
        /// The process, gone: its pid may be reused.
        pid: u32,
        /// Its exit code, or the signal that killed it.
        status: ExitStatus,
    },
}

/// Why a command could not be started traced, or a process attached.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// [`Tracer::spawn`] was given an empty command.
    #[error("no command given after --")]
    NoCommand,
    /// The command could not be run: not found, or its exec failed (with the status a shell
    /// would give).
    #[error(transparent)]
    CannotRun(#[from] crate::CannotRun),
    /// No process has this pid, or it ended before a thread of it was seized.
    #[error("no process with pid {0}")]
    NoSuchProcess(u32),
    /// ptrace refused to attach (EPERM, EACCES).
    #[error("permission denied tracing pid {pid}: {why}")]
    PermissionDenied {
        /// The process.
        pid: u32,
        /// For the user: what ptrace needs (with the Yama ptrace_scope, where there is one) and
        /// how to get it.
        why: String,
    },
    /// Anything else that failed (a system call, an exec): `context` says what.
    #[error("{context}: {source}")]
    Io {
        /// What superprof was doing (`PTRACE_SEIZE of thread 1234`, `cannot start 'ls'`).
        context: String,
        /// The system's error.
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

/// A traced process tree. [`Tracer::finish`] lets every thread go: an attached process runs
/// on, a launched one is killed (what is left of it after `terminate`). Dropping
/// it unfinished (an error, a panic) lets every process go, a launched one too.
pub struct Tracer {
    root: u32,
    launched: bool,
    opts: TraceOptions,
    threads: HashMap<u32, Thread>,
    /// Stops of threads we have not heard of yet (a new thread can report before its parent's
    /// clone event).
    events: VecDeque<TraceEvent>,
    /// What superprof wrote into code: (pid, address) -> the original bytes under it, for a
    /// software breakpoint or a patch ([`Tracer::patch_code`]).
    breakpoints: HashMap<(u32, u64), Saved>,
    /// Threads whose single step outlived its wait (a blocking syscall): their next SIGTRAP
    /// ends the step.
    late_steps: HashSet<u32>,
    /// Breakpoints removed while the process runs: a thread may have trapped on one just
    /// before, and its SIGTRAP must not reach the program.
    tombstones: HashSet<(u32, u64)>,
    /// Puts the code back under our breakpoints if superprof dies without doing it; started
    /// with the first breakpoint.
    janitor: Option<crate::janitor::Janitor>,
    /// Signals beyond a thread's `pending_signal` that arrived while it was held or stepping;
    /// sent to it again (tgkill) when it is let go, so none is lost.
    deferred: HashMap<u32, Vec<i32>>,
    /// Following the program's SIGTRAP state ([`crate::sigtrap`]): on from the first
    /// breakpoint or single step; threads then run under PTRACE_SYSCALL.
    guard: bool,
    /// Processes that ignore SIGTRAP (as last read).
    trap_ignored: HashSet<u32>,
    /// Processes of `trap_ignored` whose SIGTRAP a trap of ours reset, since when: ignored
    /// again at the next exit of a system call, or at the next trap after
    /// [`TRAP_RESET_GRACE`] (meanwhile the tracer drops the SIGTRAPs sent to them).
    trap_reset: HashMap<u32, std::time::Instant>,
    done: bool,
}

impl Tracer {
    fn options(&self) -> usize {
        // Forks are always traced: a child's copy of the code carries our breakpoints, which
        // must be removed (and the child let go) when children are not followed. No
        // PTRACE_O_EXITKILL: if superprof is killed, a launched command runs on, as an
        // attached one does (the janitor puts its code back).
        sys::PTRACE_O_TRACECLONE
            | sys::PTRACE_O_TRACEEXEC
            | sys::PTRACE_O_TRACESYSGOOD
            | sys::PTRACE_O_TRACEFORK
            | sys::PTRACE_O_TRACEVFORK
    }

    fn new(root: u32, launched: bool, opts: TraceOptions) -> Tracer {
        Tracer {
            root,
            launched,
            opts,
            threads: HashMap::new(),
            events: VecDeque::new(),
            breakpoints: HashMap::new(),
            late_steps: HashSet::new(),
            tombstones: HashSet::new(),
            deferred: HashMap::new(),
            janitor: None,
            guard: false,
            trap_ignored: HashSet::new(),
            trap_reset: HashMap::new(),
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
                ..Thread::default()
            },
        );
        Ok(t)
    }

    /// Starts `cmd` (argv; the program is looked up on PATH), traced from its exec on.
    pub fn spawn(cmd: &[std::ffi::OsString], opts: TraceOptions) -> Result<Tracer, TraceError> {
        let program = cmd.first().ok_or(TraceError::NoCommand)?;
        let path = crate::launch::resolve_command(program)
            .ok_or_else(|| crate::CannotRun::not_found(program))?;
        let argv0 = program;
        let program = program.to_string_lossy();
        let io = |what: &str| {
            let context = format!("cannot {what} '{program}'");
            move |source| TraceError::Io { context, source }
        };
        let mut child = crate::PendingChild::spawn(&path, cmd).map_err(io("start"))?;
        let mut tracer = match Tracer::launch(child.pid, opts) {
            Ok(t) => t,
            Err(e) => {
                child.abort();
                return Err(e);
            }
        };
        if let Err(e) = child.release_with(|| tracer.pump()) {
            // The child never ran the command and has been reaped: nothing to let go.
            tracer.threads.clear();
            tracer.done = true;
            return Err(crate::CannotRun::exec(argv0, &path, &e).into());
        }
        Ok(tracer)
    }

    /// Seizes every thread of a running process; it keeps running.
    pub fn attach(pid: u32, opts: TraceOptions) -> Result<Tracer, TraceError> {
        let mut t = Tracer::new(pid, false, opts);
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(TraceError::NoSuchProcess(pid));
        }
        loop {
            let tids = superprof_unwind::maps::list_threads(pid)
                .map_err(|_| TraceError::NoSuchProcess(pid))?;
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
                        ..Thread::default()
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

    /// Threads that are running (neither stopped for us nor in a group-stop), as (tid, pid).
    pub fn running_threads(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.threads
            .iter()
            .filter(|(_, t)| t.state == State::Running)
            .map(|(&tid, t)| (tid, t.pid))
    }

    /// How many threads are traced now, of every traced process, stopped or not.
    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    /// Asks a running thread to stop; a [`TraceEvent::Stopped`] follows. Returns whether it
    /// was asked (false: not a running thread of the tracer, or asked already).
    pub fn interrupt(&mut self, tid: u32) -> bool {
        match self.threads.get_mut(&tid) {
            Some(t) if t.state == State::Running && !t.interrupting => {
                t.interrupting = sys::interrupt(tid).is_ok();
                t.interrupting
            }
            _ => false,
        }
    }

    /// Resumes a thread stopped for us. A thread on a breakpoint first steps over it, with
    /// every other thread of its process held stopped, so that none runs past the lifted
    /// breakpoint.
    pub fn resume(&mut self, tid: u32) {
        if self
            .threads
            .get(&tid)
            .and_then(|t| t.at_breakpoint)
            .is_some()
            && !self.step_past_breakpoint(tid)
        {
            return; // it ended during the step
        }
        self.let_go(tid);
    }

    /// Keeps a signal that arrived while `tid` could not take it, to deliver on resume.
    fn defer_signal(&mut self, tid: u32, sig: i32) {
        if let Some(t) = self.threads.get_mut(&tid) {
            if t.pending_signal == 0 {
                t.pending_signal = sig;
            } else {
                self.deferred.entry(tid).or_default().push(sig);
            }
        }
    }

    /// Resumes a thread with its kept signal; further kept signals are sent to it again.
    fn let_go(&mut self, tid: u32) {
        let Some(t) = self.threads.get_mut(&tid) else {
            return;
        };
        let sig = std::mem::take(&mut t.pending_signal);
        let pid = t.pid;
        self.restore_trap_state(tid, true);
        self.resume_with(tid, sig);
        for s in self.deferred.remove(&tid).unwrap_or_default() {
            sys::kill_thread(pid, tid, s);
        }
    }

    /// Executes one instruction of a stopped thread, with the other threads of its process held
    /// stopped meanwhile (so that nothing else can stop it mid-step); a
    /// [`TraceEvent::Stepped`] follows.
    pub fn single_step(&mut self, tid: u32) -> io::Result<()> {
        let Some(t) = self.threads.get(&tid).copied() else {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        };
        self.start_guard();
        let done = if t.at_breakpoint.is_some() {
            self.step_past_breakpoint(tid)
        } else {
            self.step_alone(tid, None)
        };
        if done && !self.late_steps.contains(&tid) {
            self.events.push_back(TraceEvent::Stepped {
                tid,
                pid: t.space(),
            });
        }
        Ok(())
    }

    /// The registers of a stopped thread.
    pub fn regs(&self, tid: u32) -> io::Result<superprof_unwind::UserRegs> {
        sys::regs(tid)
    }

    /// Every user register of a stopped thread.
    pub fn raw_regs(&self, tid: u32) -> io::Result<sys::RawRegs> {
        sys::raw_regs(tid)
    }

    /// Writes every user register of a stopped thread.
    pub fn set_raw_regs(&mut self, tid: u32, regs: &sys::RawRegs) -> io::Result<()> {
        sys::set_raw_regs(tid, regs)
    }

    /// Reads memory of a traced process; returns the bytes read (fewer at an unmapped page).
    pub fn read_memory(&self, pid: u32, addr: u64, buf: &mut [u8]) -> usize {
        sys::read_memory(pid, addr, buf)
    }

    /// Writes one 8-byte word into the memory of stopped thread `tid` (a stack slot, say).
    pub fn poke(&mut self, tid: u32, addr: u64, word: u64) -> io::Result<()> {
        sys::poke(tid, addr, word)
    }

    /// Lets thread `tid` run without the guard's system call stops (`quiet`), or with them
    /// again, from its next resumption: for an owner that measures the thread between two of
    /// its stops (stat's ptrace engine, inside a region), whose figures those stops would
    /// distort. A change of SIGTRAP's state that the thread itself makes meanwhile is not
    /// seen (others' are).
    pub fn set_quiet(&mut self, tid: u32, quiet: bool) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.quiet = quiet;
        }
    }

    /// Handles whatever the traced threads reported, without waiting (events are queued).
    pub fn pump(&mut self) {
        let _ = self.drain();
    }

    /// Resumes the thread of a stop event (a stop the owner does not care about); other
    /// events need no resume.
    pub fn resume_after(&mut self, ev: &TraceEvent) {
        match *ev {
            TraceEvent::Stopped { tid, .. }
            | TraceEvent::Syscall { tid, .. }
            | TraceEvent::Breakpoint { tid, .. }
            | TraceEvent::Stepped { tid, .. }
            | TraceEvent::ThreadReady { tid, .. } => self.resume(tid),
            TraceEvent::Exec { pid } => self.resume(pid),
            _ => {}
        }
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
}

impl Drop for Tracer {
    /// An error or a panic in superprof drops the tracer without `finish`: every process is
    /// let go, a launched command too, with its code as it was. superprof's trouble must not
    /// end the program.
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            self.detach_all();
        }
    }
}
