//! Processes superprof starts and waits for: a command held before exec (so that sampling or
//! tracing can be set up first), exit statuses, signals.

use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::posix::{self, kernel_sigaction};
use crate::status::decode;
pub use crate::status::ExitStatus;

/// Signals superprof was started with ignored (bit `sig - 1`): nohup's SIGHUP, the SIGINT and
/// SIGQUIT a shell ignores for a background job. See [`note_inherited_signals`].
static INHERITED_IGNORED: AtomicU64 = AtomicU64::new(0);

/// The highest signal number the kernel has (SIGRTMAX).
const MAX_SIGNAL: i32 = 64;

/// The C library's own signals (SIGCANCEL, SIGSETXID), never passed on ignored.
fn libc_internal(sig: i32) -> bool {
    sig == 32 || sig == 33
}

/// Notes which signals superprof was started with ignored, before it changes any disposition
/// (call it first in `main`). A command superprof launches gets these ignored, as it would
/// have run alone, and every other signal at its default; SIGPIPE, which the Rust runtime
/// ignores before `main`, and the C library's own signals are always at their default.
pub fn note_inherited_signals() {
    let mut mask = 0u64;
    for sig in 1..=MAX_SIGNAL {
        if sig == libc::SIGPIPE
            || sig == libc::SIGKILL
            || sig == libc::SIGSTOP
            || libc_internal(sig)
        {
            continue;
        }
        if kernel_sigaction(sig, None) == Some(libc::SIG_IGN) {
            mask |= 1 << (sig - 1);
        }
    }
    INHERITED_IGNORED.store(mask, Ordering::SeqCst);
}

/// Whether superprof was started with `sig` ignored (see [`note_inherited_signals`]).
pub fn inherited_ignored(sig: i32) -> bool {
    (1..=MAX_SIGNAL).contains(&sig)
        && INHERITED_IGNORED.load(Ordering::SeqCst) & (1 << (sig - 1)) != 0
}

/// Puts every signal of the calling process back as a command started directly would have
/// it: the disposition superprof inherited (ignored, or the default), none blocked. Only
/// async-signal-safe calls: meant for a forked child about to exec.
pub fn reset_signals_for_exec() {
    let inherited = INHERITED_IGNORED.load(Ordering::SeqCst);
    for sig in 1..=MAX_SIGNAL {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let action = if inherited & (1 << (sig - 1)) != 0 {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        };
        kernel_sigaction(sig, Some(action));
    }
    posix::unblock_all_signals();
}

/// The command superprof launched (0: none), for [`wait_launched`].
static LAUNCHED: AtomicU32 = AtomicU32::new(0);

/// Whether superprof launched a command at all (it stays so once it did).
static EVER_LAUNCHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this superprof launched a command ([`PendingChild::spawn`]), which then owns
/// stdout: a reader of superprof's own output gone is then no reason to end the run.
pub fn launched_a_command() -> bool {
    EVER_LAUNCHED.load(Ordering::SeqCst)
}

/// Waits for the command superprof launched, if it is still superprof's to reap: after an
/// error or a panic in superprof, which let it go, so that it ends as it would have alone
/// (its output before the shell's prompt) and its status is known. `idle` is called with its
/// pid every 10 ms meanwhile (to pass signals on). `None` if there is none.
pub fn wait_launched(idle: impl FnMut(u32)) -> Option<ExitStatus> {
    match LAUNCHED.swap(0, Ordering::SeqCst) {
        0 => None,
        pid => wait_child(pid, idle),
    }
}

/// Waits for child `pid` to end, calling `idle` with its pid every 10 ms meanwhile (to pass
/// signals on). `None` if it is not ours to reap (reaped already).
pub fn wait_child(pid: u32, mut idle: impl FnMut(u32)) -> Option<ExitStatus> {
    loop {
        match posix::waitpid(pid, true) {
            Ok(None) => {
                idle(pid);
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Ok(Some(status)) => return Some(decode(status)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None, // reaped already, or not ours
        }
    }
}

/// A forked child that waits before calling exec until [`PendingChild::release`].
pub struct PendingChild {
    /// The child's process id, which the command keeps after its exec.
    pub pid: u32,
    go: Option<OwnedFd>,
    exec_status: OwnedFd,
}

/// Finds `cmd` on PATH the way execvp would.
pub fn resolve_command(cmd: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if cmd.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| is_executable(p))
}

/// A command that could not be run, with the status a shell gives for it: 127 when it is not
/// found, 126 when it is found but cannot be executed (no permission, not an executable, a
/// missing interpreter).
#[derive(Debug, thiserror::Error)]
#[error("cannot run '{program}': {why}")]
pub struct CannotRun {
    /// The command as given.
    pub program: String,
    /// Why, for the user.
    pub why: String,
    /// 127 or 126.
    pub status: u8,
}

impl CannotRun {
    /// `program` is not on PATH (or, given as a path, does not exist).
    pub fn not_found(program: &std::ffi::OsStr) -> CannotRun {
        CannotRun {
            program: program.to_string_lossy().into_owned(),
            why: "command not found".into(),
            status: 127,
        }
    }

    /// The exec of `path` (found for `program`) failed with `e`: 127 if there is no such
    /// file, else 126 (an ENOENT of a file that exists is its missing interpreter).
    pub fn exec(program: &std::ffi::OsStr, path: &Path, e: &io::Error) -> CannotRun {
        let missing = e.raw_os_error() == Some(libc::ENOENT) && path.symlink_metadata().is_err();
        CannotRun {
            program: program.to_string_lossy().into_owned(),
            why: if missing {
                "command not found".into()
            } else {
                e.to_string()
            },
            status: if missing { 127 } else { 126 },
        }
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

impl PendingChild {
    /// Forks; the child blocks until released, then execs `program` with `args` (`args[0]`
    /// included) and the current environment.
    pub fn spawn(program: &Path, args: &[std::ffi::OsString]) -> io::Result<PendingChild> {
        PendingChild::spawn_with_env(program, args, &[])
    }

    /// As [`PendingChild::spawn`], with the variables of `env` set (added to the current
    /// environment, or replacing a variable of the same name).
    pub fn spawn_with_env(
        program: &Path,
        args: &[std::ffi::OsString],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
    ) -> io::Result<PendingChild> {
        Ok(PendingChild::spawn_into(program, args, env, None)?.0)
    }

    /// As [`PendingChild::spawn_with_env`], the child started in cgroup `cgroup` (an open
    /// cgroup v2 folder) where the kernel can (clone3's CLONE_INTO_CGROUP); whether it was
    /// (where not, the caller moves it there itself).
    pub fn spawn_into(
        program: &Path,
        args: &[std::ffi::OsString],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        cgroup: Option<std::os::fd::BorrowedFd>,
    ) -> io::Result<(PendingChild, bool)> {
        use std::os::unix::ffi::OsStrExt;
        let prog = CString::new(program.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in command"))?;
        let cargs: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in argument"))?;
        let mut argv: Vec<*const libc::c_char> = cargs.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        // The whole environment, made before the fork (the child may not allocate).
        let cenv: Option<Vec<CString>> = if env.is_empty() {
            None
        } else {
            let mut vars: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os()
                .filter(|(k, _)| !env.iter().any(|(e, _)| e == k))
                .collect();
            vars.extend(env.iter().cloned());
            Some(
                vars.iter()
                    .map(|(k, v)| {
                        let mut kv = k.as_bytes().to_vec();
                        kv.push(b'=');
                        kv.extend_from_slice(v.as_bytes());
                        CString::new(kv)
                    })
                    .collect::<Result<_, _>>()
                    .map_err(|_| {
                        io::Error::new(io::ErrorKind::InvalidInput, "NUL in environment")
                    })?,
            )
        };
        let envp: Option<Vec<*const libc::c_char>> = cenv.as_ref().map(|c| {
            c.iter()
                .map(|v| v.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        });
        let (go_r, go_w) = posix::pipe(libc::O_CLOEXEC)?;
        let (st_r, st_w) = posix::pipe(libc::O_CLOEXEC)?;
        // The command starts with no signal blocked (superprof blocks SIGCHLD) and the
        // dispositions it would have alone (superprof ignores SIGPIPE, handles SIGINT).
        let (pid, placed) = posix::fork_held_exec(
            &prog,
            &argv,
            envp.as_deref(),
            posix::HeldPipes {
                go: &go_r,
                go_w: &go_w,
                status: &st_w,
            },
            reset_signals_for_exec,
            cgroup,
        )?;
        drop(go_r);
        drop(st_w);
        LAUNCHED.store(pid, Ordering::SeqCst);
        EVER_LAUNCHED.store(true, Ordering::SeqCst);
        Ok((
            PendingChild {
                pid,
                go: Some(go_w),
                exec_status: st_r,
            },
            placed,
        ))
    }

    /// Lets the child exec. Returns the exec error, if exec failed.
    pub fn release(&mut self) -> io::Result<()> {
        self.release_with(|| {})
    }

    /// Lets the child exec, calling `idle` while waiting for the exec to happen. A traced
    /// child may stop before its exec (a signal arrives); `idle` is where the tracer handles
    /// that, or the wait would never end.
    pub fn release_with(&mut self, mut idle: impl FnMut()) -> io::Result<()> {
        drop(self.go.take());
        while !posix::poll_readable(&self.exec_status, 10) {
            idle();
        }
        let mut buf = [0u8; 4];
        let n = loop {
            // The write end closes on exec: 0 bytes, or the exec's errno.
            match posix::read(&self.exec_status, &mut buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => break r.unwrap_or(0),
            }
        };
        if n == 4 {
            let _ = wait_exit(self.pid);
            return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(buf)));
        }
        Ok(())
    }

    /// Ends a child that will never be released.
    pub fn abort(mut self) {
        kill(self.pid, libc::SIGKILL);
        drop(self.go.take());
        let _ = wait_exit(self.pid);
    }
}

/// Reaps the child if it has exited.
pub fn try_wait(pid: u32) -> Option<ExitStatus> {
    posix::waitpid(pid, true).ok().flatten().map(decode)
}

/// Waits for child `pid` to end, and reaps it.
pub fn wait_exit(pid: u32) -> io::Result<ExitStatus> {
    loop {
        match posix::waitpid(pid, false) {
            Ok(Some(status)) => return Ok(decode(status)),
            Err(e) if e.kind() != io::ErrorKind::Interrupted => return Err(e),
            _ => {}
        }
    }
}

/// Reaps the child if it exits within `limit`.
pub fn wait_exit_timeout(pid: u32, limit: std::time::Duration) -> Option<ExitStatus> {
    let end = std::time::Instant::now() + limit;
    loop {
        if let Some(s) = try_wait(pid) {
            return Some(s);
        }
        if std::time::Instant::now() >= end {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Sends `sig` to process `pid`.
pub fn kill(pid: u32, sig: libc::c_int) {
    posix::kill(pid, sig);
}

/// The fields of /proc/PID/stat after the command name (which may hold spaces and
/// parentheses): the state (field 3) first.
pub fn proc_stat_fields(pid: u32) -> Option<Vec<String>> {
    stat_fields(&format!("/proc/{pid}/stat"))
}

/// The fields after the command name of a /proc stat file.
fn stat_fields(path: &str) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(path).ok()?;
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// CPU time (user, system) of thread `tid` of process `pid` alone (/proc/PID/task/TID/stat;
/// /proc/TID/stat gives the whole process's).
pub fn thread_cpu_time(pid: u32, tid: u32) -> Option<(std::time::Duration, std::time::Duration)> {
    let f = stat_fields(&format!("/proc/{pid}/task/{tid}/stat"))?;
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let hz = posix::clock_ticks_per_second();
    let time =
        |ticks: u64| std::time::Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / hz);
    Some((time(field(11)), time(field(12))))
}

/// CPU time (user, system) of process `pid` and of the children it waited for (/proc/PID/stat:
/// utime, stime, cutime, cstime, in clock ticks); None when it cannot be read.
pub fn process_tree_cpu_time(pid: u32) -> Option<(std::time::Duration, std::time::Duration)> {
    let f = proc_stat_fields(pid)?;
    // utime, stime, cutime, cstime: fields 14 to 17, 11 to 14 after the state.
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let hz = posix::clock_ticks_per_second();
    let time =
        |ticks: u64| std::time::Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / hz);
    Some((time(field(11) + field(13)), time(field(12) + field(14))))
}

/// Whether a process exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    proc_stat_fields(pid)
        .and_then(|f| f.first().cloned())
        .is_some_and(|state| state != "Z" && state != "X")
}
