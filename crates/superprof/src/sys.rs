//! The binary's kernel interfaces: the stop signals, signal state for launched commands,
//! the terminal's width, the guard against SIGBUS from files cut while mapped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

/// Stop signals received and not passed on yet (bit `sig`): two arriving between two looks
/// are both kept.
static PENDING_STOP_SIGNALS: AtomicU64 = AtomicU64::new(0);

/// A SIGPIPE was received (see [`STOP_SIGNALS`]).
static PIPE: AtomicBool = AtomicBool::new(false);

/// A command was launched with [`start_clean`] (qemu, preload).
static LAUNCHED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    if sig == libc::SIGPIPE {
        // Whether it stops the run is decided by stop_requested (not async-signal work).
        PIPE.store(true, Ordering::SeqCst);
        return;
    }
    STOP.store(true, Ordering::SeqCst);
    if (0..64).contains(&sig) {
        PENDING_STOP_SIGNALS.fetch_or(1 << sig, Ordering::SeqCst);
    }
}

/// While superprof only waits for a command (preload, or after an error): each SIGTERM or
/// SIGHUP sent to superprof since the last call is passed on to the command, which ends as it
/// would have alone. (Ctrl-C reaches the command from the terminal itself.)
pub fn pass_stop_signal_on(pid: u32) {
    let pending = PENDING_STOP_SIGNALS.swap(0, Ordering::SeqCst);
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        if pending & (1 << sig) != 0 {
            superprof_trace::kill(pid, sig);
        }
    }
}

/// The signals that end superprof as Ctrl-C does: a closed terminal or ssh session (SIGHUP),
/// `kill` (SIGTERM), Ctrl-\ (SIGQUIT), and a reader gone (SIGPIPE) where superprof launched
/// nothing (attached: the process runs on). Where it launched a command, SIGPIPE ends nothing:
/// a reader of superprof's stderr gone (`2>&1 | head -1`) costs the diagnostics nobody reads,
/// never the run, the profile or the command's status (issue 31).
pub const STOP_SIGNALS: [libc::c_int; 5] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGPIPE,
];

/// Makes the stop signals set a flag instead of killing superprof, so that breakpoints are
/// removed, threads detached, a guest resumed and the profile written. A signal superprof was
/// started with ignored (nohup) stays ignored.
pub fn install_stop_handler() {
    // A wait for an output FIFO's reader ends at a stop signal too.
    superprof_profile::output::set_stop_check(stop_requested);
    for sig in STOP_SIGNALS {
        if superprof_trace::inherited_ignored(sig) {
            continue;
        }
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

/// The width of the terminal `console` is, if it is one (`COLUMNS` first, as ls reads it).
pub fn console_width(console: superprof_resolve::Console) -> Option<usize> {
    use std::io::IsTerminal;
    use std::os::fd::AsFd;
    let (stdout, stderr) = (std::io::stdout(), std::io::stderr());
    let fd = match console {
        superprof_resolve::Console::Stdout => stdout.as_fd(),
        superprof_resolve::Console::Stderr => stderr.as_fd(),
    };
    if !fd.is_terminal() {
        return None;
    }
    let columns = std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok());
    if let Some(c) = columns.filter(|&c: &usize| c > 0) {
        return Some(c);
    }
    superprof_unwind::terminal_size(fd).map(|(_, cols)| cols)
}

/// How a table of `rows` rows is laid out on `console`.
pub fn table_style(
    console: superprof_resolve::Console,
    rows: usize,
    verbose: bool,
) -> superprof_profile::top::TableStyle {
    superprof_profile::top::TableStyle {
        rows,
        verbose,
        width: console_width(console),
    }
}

/// Stops the run as a stop signal would (a key pressed in `top`).
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// The terminal on stdin set to give keys as they are typed (no line editing, no echo;
/// Ctrl-C still a signal) until dropped, when its settings come back.
pub struct KeyMode {
    saved: libc::termios,
}

impl KeyMode {
    /// None where stdin is not a terminal.
    pub fn new() -> Option<KeyMode> {
        // SAFETY: isatty only asks the kernel about the descriptor.
        if unsafe { libc::isatty(libc::STDIN_FILENO) } != 1 {
            return None;
        }
        // SAFETY: a termios is plain integers; all zero is a valid value to be overwritten.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes one termios into `saved`, which outlives the call.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        // SAFETY: tcsetattr reads the termios it is given.
        if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) } != 0 {
            return None;
        }
        Some(KeyMode { saved })
    }
}

impl Drop for KeyMode {
    fn drop(&mut self) {
        // SAFETY: tcsetattr reads the termios it is given (the settings found at the start).
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &self.saved) };
    }
}

/// The height of the terminal on stdout, in lines, if it is one (`LINES` first).
pub fn console_height() -> Option<usize> {
    let stdout = std::io::stdout();
    if !std::io::IsTerminal::is_terminal(&stdout) {
        return None;
    }
    if let Some(l) = std::env::var("LINES").ok().and_then(|l| l.parse().ok()) {
        return Some(l).filter(|&l: &usize| l > 0);
    }
    use std::os::fd::AsFd;
    superprof_unwind::terminal_size(stdout.as_fd()).map(|(rows, _)| rows)
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
        || (PIPE.load(Ordering::SeqCst)
            && !LAUNCHED.load(Ordering::SeqCst)
            && !superprof_trace::launched_a_command())
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

/// The command gets SIGKILL when superprof dies, whatever kills superprof.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl,
    // which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// Makes `cmd` start with the signal dispositions and mask it would have alone (see
/// `superprof_trace::reset_signals_for_exec`), not superprof's.
pub fn start_clean(cmd: &mut std::process::Command) {
    LAUNCHED.store(true, Ordering::SeqCst);
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only calls sigaction and
    // pthread_sigmask, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            superprof_trace::reset_signals_for_exec();
            Ok(())
        });
    }
}

/// Ignores SIGINT and SIGQUIT in superprof while a command it waits for runs (the terminal
/// sends them to the command too, as for system()); the previous dispositions come back on
/// drop.
pub struct IgnoreInterrupts(libc::sighandler_t, libc::sighandler_t);

impl IgnoreInterrupts {
    pub fn new() -> IgnoreInterrupts {
        // SAFETY: setting SIGINT and SIGQUIT to SIG_IGN; the old dispositions are kept.
        unsafe {
            IgnoreInterrupts(
                libc::signal(libc::SIGINT, libc::SIG_IGN),
                libc::signal(libc::SIGQUIT, libc::SIG_IGN),
            )
        }
    }
}

impl Drop for IgnoreInterrupts {
    fn drop(&mut self) {
        // SAFETY: putting back the dispositions `new` replaced.
        unsafe {
            libc::signal(libc::SIGINT, self.0);
            libc::signal(libc::SIGQUIT, self.1);
        }
    }
}

/// Linux's si_code of a SIGBUS for an address no backing store has: a read past the end of a
/// mapped file that was cut (the libc crate does not name it for Linux).
const BUS_ADRERR: libc::c_int = 2;

/// Pages read as zeros so far (see [`guard_mapped_reads`]), and the most that may be.
static ZEROED_PAGES: AtomicU64 = AtomicU64::new(0);
const MAX_ZEROED_PAGES: u64 = 1 << 20;
static PAGE_SIZE: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler; si_addr is set for
    // SIGBUS.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as u64) };
    let page = PAGE_SIZE.load(Ordering::Relaxed);
    if code == BUS_ADRERR
        && addr != 0
        && page != 0
        && ZEROED_PAGES.fetch_add(1, Ordering::Relaxed) < MAX_ZEROED_PAGES
    {
        let start = addr & !(page - 1);
        // SAFETY: the page lies in a file mapping of superprof's that faulted because its file
        // was cut; replacing it with a private zero page (mmap is async-signal-safe) makes the
        // faulting read see zeros, which every reader of files treats as hostile input.
        let r = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                page as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r != libc::MAP_FAILED {
            return;
        }
    }
    // Not a cut file: the default action, at once (the fault repeats on return).
    // SAFETY: signal() with SIG_DFL is async-signal-safe.
    unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
}

/// Makes a read past the end of a file that another process cut while superprof had it mapped
/// (a library a program truncates after dlopen) read zeros instead of killing superprof with
/// SIGBUS: the files superprof maps (libraries, debug files, through its own maps and
/// addr2line's) are input like any other. superprof's binary only: libsuperprof never changes
/// the disposition of its host program's signals.
pub fn guard_mapped_reads() {
    PAGE_SIZE.store(superprof_unwind::page_size() as u64, Ordering::Relaxed);
    // SAFETY: installing an SA_SIGINFO handler that makes one system call and touches atomics.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

/// How many pages of cut files were read as zeros (see [`guard_mapped_reads`]).
pub fn zeroed_pages() -> u64 {
    ZEROED_PAGES.load(Ordering::Relaxed).min(MAX_ZEROED_PAGES)
}
