//! The ptrace and process primitives beneath the [`Tracer`](crate::Tracer), one system call
//! each and no bookkeeping of threads, for code that drives a process of its own: the learning
//! analyzer's lab (superprof-analyze), a fork of superprof stopped under its ptrace.

pub use crate::posix::{fork_stopped_tracee, kill, pin_with, waitpid, Pinned};
pub use crate::sys::{
    pc_of, raw_regs, read_memory, rseq_configuration, set_options, set_regs_outside_syscall,
    single_step, syscall_result, sysemu_step, RawRegs, PTRACE_O_EXITKILL, PTRACE_O_TRACESYSGOOD,
    SYSCALL_INSN,
};
