//! libsuperprof: an in-process sampling profiler for C, C++ and Rust programs.
//!
//! The program calls `perf_start()` and `perf_stop()` (C, `include/superprof.h`) or holds a
//! [`Profiler`] (Rust). Between them each thread has a POSIX timer on its own CPU-time clock
//! that sends it SIGPROF after every 1/hz s of CPU time it used (a watcher thread gives one to
//! threads started later), so every thread gets its own share of samples, and a thread that
//! sleeps gets none. The kernel checks those clocks at its ticks only and sends one signal for
//! every period run out since (`si_overrun` counts the others): each sample weighs that many
//! periods. Nothing of it outlives the program image:
//! exec deletes the timers and resets the handler, fork children get no timer (a preloaded
//! child starts its own), and stop puts SIGPROF's disposition back. The handler reads the
//! interrupted pc, sp and frame pointer from the ucontext, unwinds with framehop over the CFI
//! of the modules mapped at start (or walks the frame-pointer chain), reading memory through
//! `process_vm_readv` (a frame that is not mapped ends the walk instead of faulting), and
//! stores the stack into a buffer mapped at start, at a slot reserved with an atomic counter.
//! It allocates nothing, takes no lock, cannot panic (the ELF files' sections were checked at
//! start), keeps errno, and counts the samples it drops when the buffer is full. At stop the
//! addresses are symbolized with superprof's symbolizer (ELF symbols, DWARF file:line and
//! inlined frames, demangling) into a `superprof_profile::Profile`: the table goes to stderr
//! and the profile to a file in any of superprof's formats.
//!
//! ```no_run
//! let p = superprof::Profiler::start(superprof::Options::default()).unwrap();
//! // ... work ...
//! let profile = p.stop().unwrap();
//! println!("{} samples", profile.samples.len());
//! ```
//!
//! `superprof preload -- CMD` loads this library into an unmodified program with LD_PRELOAD:
//! its constructor starts sampling when `SUPERPROF_PRELOAD_DIR` is set, and each process (and
//! each fork child) writes its profile there at exit, for `superprof` to merge.

#![deny(missing_docs)]

mod clocks;
mod sys;

use std::ffi::CStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use superprof_profile::{OutputFormat, Profile};

/// The deepest stack a sample keeps.
const MAX_DEPTH: usize = 128;
/// Buffer size in words (256 MiB of address space; only the pages written are used).
const BUFFER_WORDS: usize = 32 << 20;
/// Header words of a sample: thread id, depth, weight (the sampling periods it stands for).
const HEADER: usize = 3;

static BUFFER: sys::Buffer = sys::Buffer::new();
static ACTIVE: AtomicBool = AtomicBool::new(false);
static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static PID: AtomicU32 = AtomicU32::new(0);

#[cfg(target_arch = "x86_64")]
type Unwinder = framehop::x86_64::UnwinderX86_64<
    superprof_unwind::SectionBytes,
    framehop::MustNotAllocateDuringUnwind,
>;
#[cfg(target_arch = "x86_64")]
type UnwindCache = framehop::x86_64::CacheX86_64<framehop::MustNotAllocateDuringUnwind>;
#[cfg(target_arch = "aarch64")]
type Unwinder = framehop::aarch64::UnwinderAarch64<
    superprof_unwind::SectionBytes,
    framehop::MustNotAllocateDuringUnwind,
>;
#[cfg(target_arch = "aarch64")]
type UnwindCache = framehop::aarch64::CacheAarch64<framehop::MustNotAllocateDuringUnwind>;

/// framehop over the CFI of every module mapped at start (built before sampling; the handler
/// only reads it), and caches that handlers borrow one at a time.
static UNWINDER: sys::Shared<Unwinder> = sys::Shared::new();
static CACHES: sys::Pool<Scratch, 8> = sys::Pool::new();

/// What one unwind works with: framehop's cache, and room for a copy of the top of the stack
/// (one read for the words the unwinder wants, instead of a read per word).
struct Scratch {
    cache: UnwindCache,
    stack: Vec<u8>,
}

/// Bytes of stack copied per sample (deeper words are read one by one).
const STACK_COPY: usize = 12 << 10;

/// The unwinder for the modules this process maps now.
fn build_unwinder() -> Unwinder {
    use framehop::Unwinder as _;
    let mut u = Unwinder::new();
    for m in superprof_unwind::maps::executable_mappings(sys::getpid()).unwrap_or_default() {
        if !m.path.is_absolute() {
            continue;
        }
        let Some(img) = superprof_unwind::ElfImage::open(&m.path) else {
            continue;
        };
        let bias = img.bias_for_mapping(m.start, m.end - m.start, m.offset);
        u.add_module(img.framehop_module(
            m.path.to_string_lossy().into_owned(),
            m.start..m.end,
            bias,
        ));
    }
    u
}

/// The stack with framehop (CFI, frame pointers where there is none), into `out`; the
/// number of frames, 0 when it could not run.
fn unwind_cfi(pc: u64, sp: u64, fp: u64, lr: u64, out: &mut [u64]) -> usize {
    use framehop::Unwinder as _;
    let Some(u) = UNWINDER.get() else { return 0 };
    CACHES
        .with(|scratch| {
            #[cfg(target_arch = "x86_64")]
            let regs = {
                let _ = lr;
                framehop::x86_64::UnwindRegsX86_64::new(pc, sp, fp)
            };
            #[cfg(target_arch = "aarch64")]
            let regs = framehop::aarch64::UnwindRegsAarch64::new(lr, sp, fp);
            // The stack from sp, as far as it is mapped (the copy stops at its top).
            let copied = sys::read_into(sp, &mut scratch.stack);
            let stack = &scratch.stack[..copied];
            let mut read = |a: u64| {
                let off = a.wrapping_sub(sp) as usize;
                match stack.get(off..off.wrapping_add(8)) {
                    Some(b) if a >= sp => Ok(u64::from_ne_bytes(b.try_into().map_err(|_| ())?)),
                    _ => sys::read_word(a).ok_or(()),
                }
            };
            let mut it = u.iter_frames(pc, regs, &mut scratch.cache, &mut read);
            let mut n = 0;
            while n < out.len() {
                match it.next() {
                    Ok(Some(f)) => {
                        out[n] = f.address();
                        n += 1;
                    }
                    _ => break,
                }
            }
            n
        })
        .unwrap_or(0)
}

/// The session: what start decided, for stop.
struct Session {
    hz: u32,
    output: Option<PathBuf>,
    started: Instant,
    start_unix_ns: u64,
    /// Send SIGPROF while they live (deleted by exec, absent in fork children).
    clocks: Option<clocks::Clocks>,
    /// SIGPROF's disposition before start, put back at stop.
    previous: sys::SavedAction,
    /// The process's CPU time at start.
    cpu_at_start: Duration,
}

static SESSION: Mutex<Option<Session>> = Mutex::new(None);

extern "C" fn on_sigprof(_: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let errno = sys::errno();
    // SeqCst with stop's store of ACTIVE and load of IN_HANDLER: either stop sees this
    // handler running, or this handler sees sampling off.
    IN_HANDLER.fetch_add(1, Ordering::SeqCst);
    if ACTIVE.load(Ordering::SeqCst) {
        let mut words = [0u64; HEADER + MAX_DEPTH];
        let (pc, sp, mut fp) = sys::context_regs(ctx);
        words[0] = sys::gettid() as u64;
        // framehop first (CFI: code without frame pointers too); the frame-pointer chain
        // when it gets no further than the leaf.
        let cfi = unwind_cfi(pc, sp, fp, sys::context_lr(ctx), &mut words[HEADER..]);
        let n = if cfi > 1 {
            cfi
        } else {
            words[HEADER] = pc;
            let mut n = 1;
            // Frame records: [fp] = the caller's fp, [fp + 8] = the return address. A frame
            // pointer must be 8-byte aligned, above the stack pointer and growing.
            while n < MAX_DEPTH && fp >= sp && fp & 7 == 0 && fp - sp < (64 << 20) {
                let Some([next, ret]) = sys::read_pair(fp) else {
                    break;
                };
                if ret == 0 {
                    break;
                }
                words[HEADER + n] = ret;
                n += 1;
                if next <= fp {
                    break;
                }
                fp = next;
            }
            n
        };
        words[1] = n as u64;
        // The kernel checks a thread's CPU timer at its clock ticks only, and sends one signal
        // for all the periods that ran out since (at 999 Hz and 250 ticks a second, four): a
        // sample stands for each of them, or threads checked less often (an emulated CPU, a
        // busy host) would weigh less than their CPU time.
        words[2] = 1 + u64::from(sys::timer_overrun(info));
        if !BUFFER.push(&words[..HEADER + n]) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
    IN_HANDLER.fetch_sub(1, Ordering::SeqCst);
    sys::set_errno(errno);
}

/// Errors of start and stop.
#[derive(Debug)]
pub enum Error {
    /// Sampling is already on.
    AlreadyRunning,
    /// Sampling is not on.
    NotRunning,
    /// The program has its own SIGPROF handler: superprof does not replace it.
    HandlerInstalled,
    /// A system call failed (mapping the sample buffer, installing the handler, creating the
    /// timers), or the output's extension names no known format; the errno is kept for the C
    /// API.
    Io(std::io::Error),
    /// The profile could not be written to `path`: `source` says why (its errno kept for the
    /// C API).
    Write {
        /// The output file.
        path: PathBuf,
        /// The error of creating, filling, syncing or renaming it.
        source: std::io::Error,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::AlreadyRunning => write!(f, "sampling is already on"),
            Error::NotRunning => write!(f, "sampling is not on"),
            Error::HandlerInstalled => write!(
                f,
                "the program has its own SIGPROF handler; superprof samples with SIGPROF and does \
                 not replace it"
            ),
            Error::Io(e) => write!(f, "{e}"),
            Error::Write { path, source } => {
                write!(f, "cannot write '{}': {source}", path.display())
            }
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// The errno value of the C API.
    pub fn errno(&self) -> i32 {
        match self {
            Error::AlreadyRunning => libc::EALREADY,
            Error::NotRunning => libc::EINVAL,
            Error::HandlerInstalled => libc::EBUSY,
            Error::Io(e) | Error::Write { source: e, .. } => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// How to sample.
#[derive(Debug, Clone)]
pub struct Options {
    /// Samples per second of CPU time (0: 999).
    pub frequency: u32,
    /// Where [`Profiler`]'s drop writes the profile (format by extension); None:
    /// `SUPERPROF_OUTPUT` if set.
    pub output: Option<PathBuf>,
    /// Print the table on stderr when the profiler is dropped.
    pub print_table: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            frequency: 999,
            output: None,
            print_table: true,
        }
    }
}

fn start_session(hz: u32, output: Option<PathBuf>) -> Result<(), Error> {
    let mut session = SESSION.lock().unwrap_or_else(|e| e.into_inner());
    if session.is_some() && PID.load(Ordering::Acquire) == sys::getpid() {
        return Err(Error::AlreadyRunning);
    }
    if sys::sigprof_has_other_handler(on_sigprof) {
        return Err(Error::HandlerInstalled);
    }
    // A session inherited from the parent over fork: forget it (only this thread exists in
    // the child, so no handler runs; the parent's timer is not the child's), keeping the
    // disposition to put back.
    let inherited = session.take().map(|s| {
        ACTIVE.store(false, Ordering::SeqCst);
        IN_HANDLER.store(0, Ordering::SeqCst);
        BUFFER.unmap();
        s.previous
    });
    let hz = if hz == 0 { 999 } else { hz };
    BUFFER.map(BUFFER_WORDS).map_err(Error::Io)?;
    UNWINDER.set(Box::new(build_unwinder()));
    CACHES.fill(|| Scratch {
        cache: UnwindCache::new_in(),
        stack: vec![0; STACK_COPY],
    });
    DROPPED.store(0, Ordering::Release);
    PID.store(sys::getpid(), Ordering::Release);
    let previous = sys::install_handler(on_sigprof, inherited).map_err(Error::Io)?;
    ACTIVE.store(true, Ordering::SeqCst);
    let clocks = match clocks::Clocks::start(hz) {
        Ok(t) => t,
        Err(e) => {
            ACTIVE.store(false, Ordering::SeqCst);
            sys::restore_handler(on_sigprof, &previous);
            BUFFER.unmap();
            return Err(Error::Io(e));
        }
    };
    *session = Some(Session {
        clocks: Some(clocks),
        previous,
        hz,
        output: output.or_else(|| std::env::var_os("SUPERPROF_OUTPUT").map(PathBuf::from)),
        started: Instant::now(),
        cpu_at_start: sys::process_cpu_time(),
        start_unix_ns: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    });
    Ok(())
}

/// Stops sampling and builds the profile; also returns where it should be written. The
/// session lock is not held while the profile is built (a fork meanwhile must not leave the
/// child a held lock for long).
fn stop_session() -> Result<(Profile, Option<PathBuf>), Error> {
    let (session, words) = {
        let mut guard = SESSION.lock().unwrap_or_else(|e| e.into_inner());
        let Some(mut session) = guard.take() else {
            return Err(Error::NotRunning);
        };
        let refused = session.clocks.take().map_or(0, clocks::Clocks::stop);
        if refused > 0 {
            superprof_unwind::say!(
                "superprof: {refused} threads were not sampled: the kernel refused them a \
                 timer (RLIMIT_SIGPENDING or the number of timers)"
            );
        }
        ACTIVE.store(false, Ordering::SeqCst);
        if PID.load(Ordering::SeqCst) != sys::getpid() {
            // A fork child stopping its parent's session: it sampled nothing of its own, and
            // it must not write the parent's output.
            IN_HANDLER.store(0, Ordering::SeqCst);
            BUFFER.unmap();
            sys::restore_handler(on_sigprof, &session.previous);
            return Err(Error::NotRunning);
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        while IN_HANDLER.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        put_back_disposition(&session.previous);
        let words = BUFFER.contents();
        if IN_HANDLER.load(Ordering::SeqCst) == 0 {
            BUFFER.unmap();
            drop(UNWINDER.take());
            CACHES.clear();
        } else {
            // A handler that never finished may still use them: leave them to it.
            BUFFER.forget();
            UNWINDER.leak();
            CACHES.leak();
        }
        (session, words)
    };
    let profile = build_profile(&words, &session);
    Ok((profile, session.output))
}

/// SIGPROF's disposition from before start, once no signal of the deleted timer is pending
/// (the kernel drops such a signal since Linux 6.13; an older one delivers it, to our handler,
/// which now does nothing). While one stays pending (every thread blocks SIGPROF), our handler
/// stays: the default action would end the process. exec resets it either way.
fn put_back_disposition(previous: &sys::SavedAction) {
    let deadline = Instant::now() + Duration::from_millis(100);
    while sys::sigprof_pending() {
        if Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sys::restore_handler(on_sigprof, previous);
}

fn build_profile(words: &[u64], session: &Session) -> Profile {
    let pid = sys::getpid();
    let mut p = Profile::default();
    p.meta.command = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default();
    p.meta.event = "cpu-time (SIGPROF, in process)".into();
    p.meta.frequency = session.hz;
    p.meta.start_time_unix_ns = session.start_unix_ns;
    p.meta.duration_ns = session.started.elapsed().as_nanos() as u64;
    superprof_resolve::stamp(&mut p.meta);
    p.meta.lost_samples = DROPPED.load(Ordering::Acquire);
    p.meta.cpu_time_ns = sys::process_cpu_time()
        .saturating_sub(session.cpu_at_start)
        .as_nanos() as u64;
    let mut symbols = Symbols::new(pid);
    let mut frames_of: std::collections::HashMap<(u64, bool), Vec<superprof_profile::FrameId>> =
        Default::default();
    let mut threads: std::collections::HashMap<u32, u32> = Default::default();
    let period = 1_000_000_000 / session.hz.max(1) as u64;
    let mut i = 0;
    let mut k = 0u64;
    while i + HEADER <= words.len() {
        let (tid, n, weight) = (words[i] as u32, words[i + 1] as usize, words[i + 2]);
        if n == 0 || n > MAX_DEPTH || i + HEADER + n > words.len() || weight == 0 {
            break;
        }
        let stack = &words[i + HEADER..i + HEADER + n];
        i += HEADER + n;
        let thread = *threads.entry(tid).or_insert_with(|| {
            let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| format!("thread-{tid}"));
            p.add_thread(pid, tid, &name)
        });
        let mut parent = None;
        for (depth, &addr) in stack.iter().enumerate().rev() {
            let ret = depth > 0;
            let ids = frames_of
                .entry((addr, ret))
                .or_insert_with(|| symbols.frames(&mut p, addr, ret))
                .clone();
            for f in ids {
                parent = Some(p.intern_stack(parent, f));
            }
        }
        p.add_sample(k * period, thread, 0, weight, parent);
        k += weight;
    }
    p
}

/// What symbolizing this process's addresses needs, gathered once per stop.
struct Symbols {
    maps: Vec<superprof_unwind::maps::MapEntry>,
    images: std::collections::HashMap<PathBuf, Option<superprof_unwind::ElfImage>>,
    symbolizer: superprof_symbols::Symbolizer,
    /// Names frames as everywhere in superprof (JIT code from this process's perf map).
    namer: superprof_resolve::Namer,
    pid: u32,
    /// The mapping of superprof's own code when it is a library of its own (linked
    /// statically, it is in the program and symbolized as the program).
    own: Option<std::ops::Range<u64>>,
}

impl Symbols {
    fn new(pid: u32) -> Symbols {
        let maps = superprof_unwind::maps::executable_mappings(pid).unwrap_or_default();
        let here = Symbols::frames as *const () as u64;
        let exe = std::fs::read_link("/proc/self/exe").ok();
        let own = maps
            .iter()
            .find(|m| (m.start..m.end).contains(&here) && exe.as_ref() != Some(&m.path))
            .map(|m| m.start..m.end);
        Symbols {
            maps,
            images: Default::default(),
            symbolizer: superprof_symbols::Symbolizer::default(),
            namer: superprof_resolve::Namer::new(),
            pid,
            own,
        }
    }

    /// The profile frames of one address, outermost first.
    fn frames(&mut self, p: &mut Profile, addr: u64, ret: bool) -> Vec<superprof_profile::FrameId> {
        let Some(m) = self.maps.iter().find(|m| (m.start..m.end).contains(&addr)) else {
            return vec![self.namer.anonymous_frame(p, Some(self.pid), addr)];
        };
        let image = self
            .images
            .entry(m.path.clone())
            .or_insert_with(|| superprof_unwind::ElfImage::open(&m.path));
        let bias = superprof_unwind::ElfImage::mapping_bias(
            image.as_ref(),
            m.start,
            m.end - m.start,
            m.offset,
        );
        let svma = addr.wrapping_sub(bias);
        let module = m.path.to_string_lossy().into_owned();
        // Time in superprof's own code (its start, in preload mode): named so, without
        // loading the library's own large DWARF.
        if self.own.as_ref().is_some_and(|r| r.contains(&addr)) {
            return vec![p.intern_frame_named("[superprof]", &module, None, 0, svma, false)];
        }
        let look = superprof_symbols::lookup_address(svma, ret);
        let found = self.symbolizer.symbolize(&m.path, &m.path, look);
        self.namer.elf_frames(p, &module, svma, found)
    }
}

/// Prints the table on stderr and writes `output` (format by extension).
fn report(profile: &Profile, output: Option<&Path>, table: bool) -> Result<(), Error> {
    if table {
        let stderr = std::io::stderr();
        let mut w = stderr.lock();
        let periods: u64 = profile.samples.iter().map(|s| s.weight).sum();
        let _ = writeln!(
            w,
            "superprof: {} samples standing for {periods} periods ({} dropped)",
            profile.samples.len(),
            profile.meta.lost_samples
        );
        let _ = superprof_profile::top::write(profile, 25, &mut w);
    }
    if let Some(path) = output {
        let format = OutputFormat::for_path(path)
            .map_err(|e| Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
        superprof_resolve::write_output(profile, path, format).map_err(|e| Error::Write {
            path: e.path,
            source: e.source,
        })?;
    }
    Ok(())
}

/// A running profiler: sampling stops when it is stopped or dropped.
pub struct Profiler {
    opts: Options,
    stopped: bool,
}

impl Profiler {
    /// Starts sampling every thread of the process.
    pub fn start(opts: Options) -> Result<Profiler, Error> {
        start_session(opts.frequency, opts.output.clone())?;
        Ok(Profiler {
            opts,
            stopped: false,
        })
    }

    /// Stops sampling and returns the profile (nothing is printed or written).
    pub fn stop(mut self) -> Result<Profile, Error> {
        self.stopped = true;
        stop_session().map(|(p, _)| p)
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        if let Ok((profile, output)) = stop_session() {
            if let Err(e) = report(&profile, output.as_deref(), self.opts.print_table) {
                superprof_unwind::say!("superprof: {e}");
            }
        }
    }
}

/// C: starts sampling at 999 Hz (see include/superprof.h).
#[no_mangle]
pub extern "C" fn perf_start() {
    let r = std::panic::catch_unwind(|| start_session(999, None));
    match r {
        Ok(Ok(())) | Ok(Err(Error::AlreadyRunning)) => {}
        Ok(Err(e)) => superprof_unwind::say!("superprof: perf_start: {e}"),
        Err(_) => superprof_unwind::say!("superprof: perf_start failed"),
    }
}

/// C: stops sampling, prints the table, writes SUPERPROF_OUTPUT.
#[no_mangle]
pub extern "C" fn perf_stop() {
    let r = std::panic::catch_unwind(|| match stop_session() {
        Ok((profile, output)) => report(&profile, output.as_deref(), true),
        Err(Error::NotRunning) => Ok(()),
        Err(e) => Err(e),
    });
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => superprof_unwind::say!("superprof: perf_stop: {e}"),
        Err(_) => superprof_unwind::say!("superprof: perf_stop failed"),
    }
}

/// C: starts sampling at `hz` with `output` for superprof_stop; 0 or an errno value.
///
/// # Safety
/// `output` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn superprof_start(
    output: *const libc::c_char,
    hz: libc::c_uint,
) -> libc::c_int {
    let out = if output.is_null() {
        None
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        Some(PathBuf::from(
            unsafe { CStr::from_ptr(output) }
                .to_string_lossy()
                .into_owned(),
        ))
    };
    match std::panic::catch_unwind(|| start_session(hz, out)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => e.errno(),
        Err(_) => libc::EIO,
    }
}

/// C: stops sampling, prints the table, writes the output; 0 or an errno value.
#[no_mangle]
pub extern "C" fn superprof_stop() -> libc::c_int {
    let r = std::panic::catch_unwind(|| {
        let (profile, output) = stop_session()?;
        report(&profile, output.as_deref(), true)
    });
    match r {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            if !matches!(e, Error::NotRunning) {
                superprof_unwind::say!("superprof: superprof_stop: {e}");
            }
            e.errno()
        }
        Err(_) => libc::EIO,
    }
}

/// Preload mode's settings, read once by the constructor: the folder and the frequency.
static PRELOAD: std::sync::OnceLock<(PathBuf, u32)> = std::sync::OnceLock::new();

/// Preload mode: where this process's profile goes.
fn preload_output() -> Option<PathBuf> {
    let (dir, _) = PRELOAD.get()?;
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Some(Path::new(&dir).join(format!("{}-{n}.parquet", sys::getpid())))
}

fn preload_start() {
    let Some(out) = preload_output() else { return };
    let hz = PRELOAD.get().map_or(999, |(_, hz)| *hz);
    if let Err(e) = start_session(hz, Some(out)) {
        superprof_unwind::say!("superprof: cannot profile pid {}: {e}", sys::getpid());
    }
}

extern "C" fn preload_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Ok((profile, Some(out))) = stop_session() {
            if let Err(e) = report(&profile, Some(&out), false) {
                superprof_unwind::say!("superprof: {e}");
            }
        }
    });
}

extern "C" fn preload_fork_child() {
    // The child of a fork has no timer: it starts its own session and profile file, unless
    // another thread held the session lock at the fork (it would never be released here).
    if SESSION.try_lock().is_err() {
        return;
    }
    let _ = std::panic::catch_unwind(preload_start);
}

extern "C" fn preload_init() {
    let Some(dir) = std::env::var_os("SUPERPROF_PRELOAD_DIR") else {
        return;
    };
    let hz = std::env::var("SUPERPROF_HZ")
        .ok()
        .and_then(|h| h.parse().ok())
        .unwrap_or(999);
    let _ = PRELOAD.set((PathBuf::from(dir), hz));
    let _ = std::panic::catch_unwind(|| {
        preload_start();
        sys::at_exit(preload_exit);
        sys::at_fork_child(preload_fork_child);
    });
}

/// Runs when the library is loaded (LD_PRELOAD): preload mode when SUPERPROF_PRELOAD_DIR is set.
#[used]
#[link_section = ".init_array"]
static PRELOAD_INIT: extern "C" fn() = preload_init;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_that_cannot_be_written_names_its_file() {
        let path = std::env::temp_dir()
            .join(format!("superprof-no-such-dir-{}", std::process::id()))
            .join("out.parquet");
        let e = report(&Profile::default(), Some(&path), false).unwrap_err();
        assert!(
            matches!(&e, Error::Write { path: p, .. } if *p == path),
            "{e:?}"
        );
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert_eq!(e.errno(), libc::ENOENT);
    }
}
