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

    /// Adds a breakpoint to the table, and to the janitor's.
    fn bp_insert(&mut self, space: u32, addr: u64, saved: Saved) {
        if let Some(j) = self.janitor.as_mut() {
            j.add(space, addr, &saved.orig);
        }
        self.breakpoints.insert((space, addr), saved);
    }

    /// Takes a breakpoint out of the table, and out of the janitor's (call it once the code
    /// is back, or gone).
    fn bp_remove(&mut self, space: u32, addr: u64) -> Option<Saved> {
        if let Some(j) = self.janitor.as_mut() {
            j.remove(space, addr);
        }
        self.breakpoints.remove(&(space, addr))
    }

    /// Forgets every breakpoint of `space`, whose code is gone (it exited or exec'd).
    fn bp_forget_space(&mut self, space: u32) {
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
    fn space_of(&self, pid: u32) -> u32 {
        self.threads.get(&pid).map_or(pid, |t| t.space())
    }

    /// Whether superprof's breakpoint (not a patch) is at `addr` of `space`.
    fn is_breakpoint(&self, space: u32, addr: u64) -> bool {
        self.breakpoints
            .get(&(space, addr))
            .is_some_and(|s| !s.patch)
    }

    /// Whether anything superprof wrote into the code of `space` covers [addr, addr + len).
    fn changed(&self, space: u32, addr: u64, len: u64) -> bool {
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
    fn write_saved(
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
    fn stopped_thread(&self, tid: u32) -> io::Result<(u32, u32)> {
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
    fn syscall_at(
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
    fn syscall_stop(&mut self, tid: u32) -> io::Result<()> {
        let space = self.threads.get(&tid).map_or(tid, |t| t.space());
        sys::cont_syscall(tid, 0)?;
        let deadline = std::time::Instant::now() + INJECTED_CALL_DEADLINE;
        while std::time::Instant::now() < deadline {
            match sys::wait_any_nohang() {
                Ok(Some((t2, st))) if t2 == tid => {
                    if st.exited().is_some() || st.signaled().is_some() {
                        self.handle(t2, st);
                        return Err(io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    match st.stop_sig() {
                        Some(sig) if sig == (libc::SIGTRAP | 0x80) => return Ok(()),
                        Some(sig) => {
                            if st.event() == 0 {
                                self.defer_signal(tid, sig);
                            }
                            sys::cont_syscall(tid, 0)?;
                        }
                        None => {}
                    }
                }
                Ok(Some((t2, st))) => self.handle_while_holding(space, t2, st),
                _ => sys::wait_sigchld(Duration::from_millis(10)),
            }
        }
        Err(io::Error::other("no system call stop"))
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
    fn hit_breakpoint(&mut self, tid: u32) -> Option<u64> {
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
    fn trapped_on_tombstone(&mut self, tid: u32) -> bool {
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
    fn step_past_breakpoint(&mut self, tid: u32) -> bool {
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
    fn step_alone(&mut self, tid: u32, lift: Option<u64>) -> bool {
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
    fn step_wait(&mut self, tid: u32, space: u32, timeout: Duration) -> StepEnd {
        let deadline = std::time::Instant::now() + timeout;
        if sys::single_step(tid, 0).is_err() {
            return StepEnd::Failed;
        }
        while std::time::Instant::now() < deadline {
            match sys::wait_any_nohang() {
                Ok(Some((t2, st))) if t2 == tid => {
                    let stop = st.stop();
                    let again = match stop {
                        Stop::Ended(_) => {
                            self.handle(t2, st);
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

    /// Holds stopped every thread that runs code in the memory of `space` (a child sharing it
    /// too), except `except` and a parent blocked in vfork (it runs none and cannot stop);
    /// gives up after 10 s. [`Tracer::release_held`] lets them go.
    fn hold_space(&mut self, space: u32, except: Option<u32>) {
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
    fn release_held(&mut self) {
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
    fn handle_while_holding(&mut self, space: u32, tid: u32, st: sys::WaitStatus) {
        let stop = st.stop();
        if matches!(stop, Stop::Ended(_) | Stop::Other) {
            return self.handle(tid, st); // an exit
        }
        let known = self.threads.get(&tid).copied();
        let group = known.map_or_else(|| sys::tgid_of(tid), |t| Some(t.pid));
        let in_space = match known {
            Some(t) => t.space() == space,
            None => group.is_some_and(|g| g != tid && self.space_of(g) == space),
        };
        if !in_space {
            return self.handle(tid, st);
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
                self.handle(tid, st);
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

    fn resume_with(&mut self, tid: u32, mut sig: i32) {
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
    fn add_thread(&mut self, tid: u32, pid: u32) -> bool {
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
    fn new_process(&mut self, child: u32, parent_tid: u32, shares: bool) -> bool {
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
    fn leave_memory(&mut self, pid: u32) {
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

    /// Starts following the program's SIGTRAP state ([`crate::sigtrap`]), before the first
    /// trap of ours: each thread's as it is now.
    fn start_guard(&mut self) {
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
    fn learn_trap_state(&mut self, tid: u32) {
        self.learn_trap_state_of(tid, true);
    }

    /// As [`Tracer::learn_trap_state`]; the process's action too only where `action`.
    fn learn_trap_state_of(&mut self, tid: u32, action: bool) {
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
    fn follow_signal_call(&mut self, tid: u32) -> bool {
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
    fn restore_trap_state(&mut self, tid: u32, ignored_too: bool) {
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
    fn ignore_again(&mut self, pid: u32, tid: u32) {
        self.hold_space(self.space_of(pid), Some(tid));
        self.ignore_again_held(pid, tid);
        self.release_held();
    }

    /// [`Tracer::ignore_again`], the other threads of the process held by the caller.
    fn ignore_again_held(&mut self, pid: u32, tid: u32) {
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
    fn ignore_sigtrap_again(&mut self, tid: u32) -> io::Result<()> {
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

    /// Runs system call `nr` with `args` in stopped thread `tid` (registers `saved`) at the
    /// system call instruction at `at`, and puts its registers back (a call it was stopped in
    /// goes again, as the kernel would have restarted it). If superprof died in between, the
    /// thread would go on with changed registers.
    fn run_syscall_at(
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

    /// Lets an unfollowed child go: restores the code under the breakpoints it inherited, and
    /// detaches it (it is stopped).
    fn release_child(&mut self, child: u32) {
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

    fn drain(&mut self) -> io::Result<()> {
        while let Some((tid, st)) = sys::wait_any_nohang()? {
            self.handle(tid, st);
        }
        Ok(())
    }

    fn handle(&mut self, tid: u32, st: sys::WaitStatus) {
        let stop = st.stop();
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
    fn on_fork_event(&mut self, tid: u32, pid: u32, new: u32, event: i32) {
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

    fn detach_all(&mut self) {
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
            let Some((tid, st)) = got else { continue };
            if st.exited().is_some() || st.signaled().is_some() {
                self.threads.remove(&tid);
                continue;
            }
            let Some(sig) = st.stop_sig() else { continue };
            if matches!(
                st.event(),
                sys::PTRACE_EVENT_CLONE | sys::PTRACE_EVENT_FORK | sys::PTRACE_EVENT_VFORK
            ) {
                // A thread or child born as we let go: wait for it too.
                if let Ok(new) = sys::event_msg(tid) {
                    let pid = self.threads.get(&tid).map_or(tid, |t| t.pid);
                    let new_pid = if st.event() == sys::PTRACE_EVENT_CLONE {
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
            let forward = if st.event() == 0 && sig != (libc::SIGTRAP | 0x80) {
                sig
            } else {
                0
            };
            if self.detach_one(tid, forward, &removed, &mut swallow) {
                self.threads.remove(&tid);
            }
        }
    }

    /// Detaches one stopped thread, unless a breakpoint trap of ours is still to be dealt with
    /// (then it is resumed once more to report it, and `false` is returned). A SIGTRAP from a
    /// breakpoint just removed is not delivered, and the pc is moved back onto the restored
    /// instruction.
    fn detach_one(
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

/// Fault injection for the tests of what superprof leaves behind when it dies: with
/// SUPERPROF_TEST_DIE_IN_STUB=N in its environment, superprof kills itself (SIGKILL) at point
/// N of running a system call in the program (0: before resuming the thread, 1: at the entry
/// stop, 2: at the exit stop).
fn die_here_for_a_test(step: usize) {
    if !cfg!(feature = "test-switches") {
        return;
    }
    static AT: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        std::env::var("SUPERPROF_TEST_DIE_IN_STUB")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    if *at == Some(step) {
        let me = std::process::id();
        sys::kill_thread(me, me, libc::SIGKILL);
    }
}

/// A system call instruction in the vDSO of process `pid` (any bytes that decode as one:
/// the CPU runs them from there), where a call can be run in the program without writing
/// into its code.
fn syscall_site(pid: u32) -> Option<u64> {
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

/// Whether a SIGTRAP is pending for one thread (/proc/PID/task/TID/status, SigPnd).
fn sigtrap_pending(pid: u32, tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .ok()
        .and_then(|s| {
            let v = s.lines().find_map(|l| l.strip_prefix("SigPnd:"))?;
            u64::from_str_radix(v.trim(), 16).ok()
        })
        .is_some_and(|mask| mask & (1 << (libc::SIGTRAP - 1)) != 0)
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
