//! superprof-trace: the coordinator, a ptrace engine for traced processes, and the launcher of
//! the commands superprof profiles.
//!
//! - [`PendingChild`] launches a command held before exec, so that sampling or tracing can be
//!   set up first; [`ExitStatus`] is how it ended, and [`wait_child`], [`wait_launched`] and
//!   their kin wait for it, with the signal dispositions it would have had alone
//!   ([`note_inherited_signals`]). Its system calls (sigaction, fork then exec, waitpid...)
//!   are wrapped in a private module, `posix`, so that the launcher itself is safe code.
//! - [`Tracer`] seizes a launched command or a running process and every thread it starts
//!   (children too with [`TraceOptions::follow_forks`]), turns wait statuses (each decoded once,
//!   as a `status::Stop`) into [`TraceEvent`]s, and forwards every signal to the target. It sets
//!   breakpoints, patches code and runs system calls in the target; a janitor process puts
//!   the code back if superprof dies without doing it; a program that ignores or blocks
//!   SIGTRAP keeps it so through the tracer's traps (`sigtrap`). [`Tracer::finish`] detaches an attached
//!   process, which runs on, or kills a launched one; dropped unfinished (an error, a panic),
//!   the tracer lets every process go, a launched one too.
//! - [`sampler::run`] is the ptrace sampler: on CPU time, interrupt a thread, read its
//!   registers and stack, resume it; in the wall-clock mode, also off-CPU samples of threads
//!   blocked in the kernel, found through [`blocked`] (/proc's syscall file) and read without
//!   a stop where one would disturb them.
//! - [`syscalls::trace`] is the syscall log: every syscall of the traced threads, with
//!   decoded arguments, result and duration.
//! - [`read_memory`] and [`write_memory`] reach a process's memory, [`CpuTime`] its threads'
//!   CPU time. (Where its functions are is superprof-symbols' `find_function` and kin.)
//!
//! The other parts of superprof never call ptrace themselves.
//!
//! ```no_run
//! use superprof_trace::{Tracer, TraceOptions, sampler};
//! let mut tracer = Tracer::attach(1234, TraceOptions::default())?;
//! let cfg = sampler::PtraceSamplerConfig { frequency: 99, stack_size: 16384, off_cpu: false };
//! sampler::run(&mut tracer, &cfg, |event| {
//!     if let sampler::SamplerEvent::Sample(s) = event {
//!         println!("{} at {:#x}", s.tid, s.regs.pc);
//!     }
//!     sampler::Control::Continue
//! })?;
//! tracer.finish(); // detach: the process runs on
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

pub mod blocked;
mod janitor;
mod launch;
mod names;
mod posix;
pub mod raw;
pub mod sampler;
mod sigtrap;
mod status;
mod sys;
mod syscall_tables;
pub mod syscalls;
mod tracer;

pub use launch::{
    inherited_ignored, kill, launched_a_command, note_inherited_signals, proc_stat_fields,
    process_alive, process_tree_cpu_time, reset_signals_for_exec, resolve_command, thread_cpu_time,
    try_wait, wait_child, wait_exit, wait_exit_timeout, wait_launched, CannotRun, ExitStatus,
    PendingChild,
};
pub use posix::{children_cpu_time, pidfd_open};
pub use sys::{
    block_sigchld, control_stack_enabled, monotonic_ns, read_memory, tgid_of, write_memory,
    CpuTime, RawRegs, STUB as SYSCALL_STUB,
};
pub use tracer::{TraceError, TraceEvent, TraceOptions, Tracer};
