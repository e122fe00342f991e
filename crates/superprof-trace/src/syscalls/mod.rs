//! The syscall log: every syscall of every traced thread, with decoded arguments, result and
//! duration, through PTRACE_O_TRACESYSGOOD stops and PTRACE_GET_SYSCALL_INFO.

mod decode;

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub use crate::names::{known_name_for, name, name_for, name_for_audit_arch, Arch};
pub use crate::status::signal_name;
pub use decode::errno_name;

use crate::sampler::Control;
use crate::status::ExitStatus;
use crate::sys::{self, SyscallInfo};
use crate::tracer::{TraceEvent, Tracer};

/// One finished (or never finished) syscall.
#[derive(Debug, Clone)]
pub struct SyscallEvent {
    /// When it was entered, CLOCK_MONOTONIC nanoseconds.
    pub time_ns: u64,
    /// The process of the thread that made it.
    pub pid: u32,
    /// The thread that made it.
    pub tid: u32,
    /// Its name (`syscall_NR` for a number with no name, `ia32:syscall_NR` for a 32-bit call).
    pub name: String,
    /// Its arguments as strace prints them: descriptors, paths, sizes and common flags
    /// decoded, the others in hex (for a call not known here, the six registers without
    /// the trailing zeros).
    pub args: Vec<String>,
    /// The result (-1 when it failed, with `errno`); None when the syscall never returned
    /// (exit, exit_group, a killed thread).
    pub ret: Option<i64>,
    /// The errno name when it failed.
    pub errno: Option<String>,
    /// Nanoseconds from its entry stop to its exit stop as superprof handled them (tracing
    /// included); for one that never returned, until its thread's end was seen.
    pub duration_ns: u64,
    /// The result is an address (mmap, brk): print it in hex.
    pub returns_address: bool,
}

struct Pending {
    start: Instant,
    time_ns: u64,
    pid: u32,
    name: String,
    args: Vec<String>,
}

/// Traces syscalls until the root process exits or `on` asks to stop. `on` gets each syscall
/// once it returns (or its thread ended in it), and `None` about every 50 ms (a chance to
/// stop). The tracer must stop at syscalls ([`crate::TraceOptions::syscalls`]). With a
/// launched root, only syscalls from its exec on are reported (what superprof does before exec
/// is not the command's). Returns how the root ended, if it did.
///
/// (One function of 108 lines: one event loop whose arms share `pending` (the calls by thread) and
/// `armed` (true from the command's exec on); split, they would travel in a struct.)
pub fn trace(
    tracer: &mut Tracer,
    launched: bool,
    mut on: impl FnMut(Option<SyscallEvent>) -> Control,
) -> std::io::Result<Option<ExitStatus>> {
    let root = tracer.root();
    let mut armed = !launched;
    let mut pending: HashMap<u32, Pending> = HashMap::new();
    let mut next_tick = Instant::now();
    loop {
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + Duration::from_millis(50);
            if on(None) == Control::Stop {
                return Ok(None);
            }
        }
        let Some(ev) = tracer.next_event(Duration::from_millis(50))? else {
            continue;
        };
        match ev {
            TraceEvent::Syscall { tid, pid } => {
                match sys::syscall_info(tid) {
                    Ok(SyscallInfo::Entry { arch, nr, args }) => {
                        let name = name_for_audit_arch(arch, nr);
                        let args = decode::args(&name, pid, &args);
                        pending.insert(
                            tid,
                            Pending {
                                start: Instant::now(),
                                time_ns: sys::monotonic_ns(),
                                pid,
                                name,
                                args,
                            },
                        );
                    }
                    Ok(SyscallInfo::Exit { rval, is_error }) => {
                        if let Some(p) = pending.remove(&tid) {
                            if armed || p.name == "execve" && pid == root {
                                armed = true;
                                let ret_addr = decode::returns_address(&p.name);
                                let ev = SyscallEvent {
                                    time_ns: p.time_ns,
                                    pid: p.pid,
                                    tid,
                                    duration_ns: p.start.elapsed().as_nanos() as u64,
                                    ret: Some(if is_error { -1 } else { rval }),
                                    errno: is_error.then(|| errno_name(-rval)),
                                    name: p.name,
                                    args: p.args,
                                    returns_address: ret_addr,
                                };
                                if on(Some(ev)) == Control::Stop {
                                    tracer.resume(tid);
                                    return Ok(None);
                                }
                            }
                        }
                    }
                    _ => {}
                }
                tracer.resume(tid);
            }
            TraceEvent::Exec { pid } => {
                if pid == root && !armed {
                    armed = true;
                    // The launched command's execve began before tracing reached syscall
                    // stops; its exit stop comes next. Report it like strace does.
                    if !pending.values().any(|p| p.pid == pid && p.name == "execve") {
                        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
                            .map(|p| format!("{:?}", p.to_string_lossy()))
                            .unwrap_or_default();
                        pending.insert(
                            pid,
                            Pending {
                                start: Instant::now(),
                                time_ns: sys::monotonic_ns(),
                                pid,
                                name: "execve".into(),
                                args: vec![exe],
                            },
                        );
                    }
                }
                tracer.resume(pid);
                // A non-leader thread's exec reports under the leader's tid.
                if let Some((&old, _)) = pending
                    .iter()
                    .find(|(_, p)| p.pid == pid && p.name == "execve")
                {
                    if let Some(p) = pending.remove(&old) {
                        pending.insert(pid, p);
                    }
                }
            }
            TraceEvent::ThreadExited { tid, .. } => {
                flush_unfinished(&mut pending, tid, armed, &mut on)
            }
            TraceEvent::ProcessExited { pid, status } => {
                flush_unfinished(&mut pending, pid, armed, &mut on);
                if pid == root {
                    return Ok(Some(status));
                }
            }
            _ => {}
        }
    }
}

/// A thread that ended inside a syscall (exit, exit_group, SIGKILL): report it unfinished.
fn flush_unfinished(
    pending: &mut HashMap<u32, Pending>,
    tid: u32,
    armed: bool,
    on: &mut impl FnMut(Option<SyscallEvent>) -> Control,
) {
    if let Some(p) = pending.remove(&tid) {
        if armed {
            on(Some(SyscallEvent {
                time_ns: p.time_ns,
                pid: p.pid,
                tid,
                duration_ns: p.start.elapsed().as_nanos() as u64,
                ret: None,
                errno: None,
                returns_address: false,
                name: p.name,
                args: p.args,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{name_for, Arch};

    #[test]
    fn names_per_architecture() {
        for (nr, n) in [
            (0, "read"),
            (1, "write"),
            (257, "openat"),
            (59, "execve"),
            (231, "exit_group"),
            (262, "newfstatat"),
        ] {
            assert_eq!(name_for(Arch::X86_64, nr), n);
        }
        for (nr, n) in [
            (63, "read"),
            (64, "write"),
            (56, "openat"),
            (221, "execve"),
            (94, "exit_group"),
            (79, "newfstatat"),
            (222, "mmap"),
            (62, "lseek"),
        ] {
            assert_eq!(name_for(Arch::Aarch64, nr), n);
        }
        assert_eq!(name_for(Arch::X86_64, 100_000), "syscall_100000");
    }

    #[test]
    fn names_follow_the_abi_of_the_call() {
        assert_eq!(super::name_for_audit_arch(0xc000_003e, 39), "getpid");
        assert_eq!(super::name_for_audit_arch(0xc000_00b7, 172), "getpid");
        assert_eq!(
            super::name_for_audit_arch(0x4000_0003, 20),
            "ia32:syscall_20"
        );
    }
}
