//! The binary's kernel interfaces: the stop signals, the vDSO copy, pidfds, limits.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set a flag instead of killing superprof, so the profile is written.
pub fn install_stop_handler() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installing a handler that only stores to an atomic (async-signal-safe);
        // SA_RESTART is left off so blocking calls return EINTR and the loop sees the flag.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// The kernel's vDSO as mapped into superprof itself. Every local process gets the same image
/// from the same kernel, so this copy serves to unwind and symbolize their `[vdso]` frames.
pub fn vdso_image() -> Option<Vec<u8>> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.trim_end().ends_with("[vdso]"))?;
    let (a, b) = line.split_whitespace().next()?.split_once('-')?;
    let (a, b) = (
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    );
    // SAFETY: the range comes from our own maps and the vDSO stays mapped, readable, for the
    // life of the process; we copy it out at once.
    let bytes = unsafe { std::slice::from_raw_parts(a as *const u8, b.checked_sub(a)? as usize) };
    Some(bytes.to_vec())
}

/// A pidfd: readable once the process has exited (Linux 5.3+).
pub fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative return is a fresh descriptor that we now own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Raises the soft limit on open files to the hard limit: attaching opens one perf event per
/// thread and CPU, which passes the usual 1024 soon on a many-threaded process.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// CPU time of the calling thread.
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Writes a command's text result to `-o FILE` (atomically) or to stdout.
pub fn write_text(output: Option<&std::path::Path>, text: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    match output {
        Some(out) => {
            superprof_profile::write_atomic(out, |w| std::io::Write::write_all(w, text.as_bytes()))
                .with_context(|| format!("cannot write '{}'", out.display()))
        }
        None => {
            print!("{text}");
            Ok(())
        }
    }
}
