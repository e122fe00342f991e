//! The kernel interfaces of the in-process sampler: SIGPROF's handler and disposition, the
//! CPU-time timer, the sample buffer (an anonymous mapping), reads of memory that may not be
//! mapped, and the interrupted registers. Everything the signal handler calls is here, and
//! is async-signal-safe: syscalls, atomics, stores into the preallocated buffer.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// The handler's entry point: gets the interrupted context.
pub type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// SIGPROF's current disposition.
fn sigprof_action() -> Option<libc::sigaction> {
    // SAFETY: sigaction with a null new action only reads the current one into `old`.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::sigaction(libc::SIGPROF, std::ptr::null(), &mut old) };
    (r == 0).then_some(old)
}

/// True when SIGPROF has a handler other than `ours`: the program's own.
pub fn sigprof_has_other_handler(ours: Handler) -> bool {
    sigprof_action().is_some_and(|a| {
        a.sa_sigaction != libc::SIG_DFL
            && a.sa_sigaction != libc::SIG_IGN
            && a.sa_sigaction != ours as usize
    })
}

/// A disposition of SIGPROF, kept to be put back.
#[derive(Clone, Copy)]
pub struct SavedAction(libc::sigaction);

impl SavedAction {
    /// The default action (what a process starts with).
    pub fn default_action() -> SavedAction {
        // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask and no flags.
        let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
        a.sa_sigaction = libc::SIG_DFL;
        SavedAction(a)
    }

    fn is(&self, h: Handler) -> bool {
        self.0.sa_sigaction == h as usize
    }
}

/// Installs `h` for SIGPROF (restarting interrupted syscalls); returns the disposition it
/// replaced, or `inherited` when that was `h` itself (a fork child of a sampled process).
pub fn install_handler(h: Handler, inherited: Option<SavedAction>) -> std::io::Result<SavedAction> {
    // SAFETY: a zeroed sigaction with a valid handler, SA_SIGINFO and an empty mask.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = h as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: installing a handler for SIGPROF; the old action is written to `old`.
    if unsafe { libc::sigaction(libc::SIGPROF, &sa, &mut old) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let old = SavedAction(old);
    Ok(if old.is(h) {
        inherited.unwrap_or_else(SavedAction::default_action)
    } else {
        old
    })
}

/// Puts `saved` back as SIGPROF's disposition, unless the handler is no longer `ours` (the
/// program installed its own meanwhile: it stays).
pub fn restore_handler(ours: Handler, saved: &SavedAction) {
    if sigprof_action().is_some_and(|a| a.sa_sigaction == ours as usize) {
        // SAFETY: setting SIGPROF's disposition to one it had before.
        unsafe { libc::sigaction(libc::SIGPROF, &saved.0, std::ptr::null_mut()) };
    }
}

/// Whether a SIGPROF is pending for the process or any of its threads: each thread's timer
/// signals that thread, and a thread that blocks SIGPROF keeps it pending (the kernel drops
/// the signal of a deleted timer only since 6.13). Read from /proc/self/task/*/status
/// (SigPnd, ShdPnd), not sigpending(), which sees the calling thread's alone.
pub fn sigprof_pending() -> bool {
    let bit = 1u64 << (libc::SIGPROF - 1);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("status")).is_ok_and(|s| {
            s.lines().any(|l| {
                let mask = l
                    .strip_prefix("SigPnd:")
                    .or_else(|| l.strip_prefix("ShdPnd:"));
                mask.and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
                    .is_some_and(|m| m & bit != 0)
            })
        })
    })
}

/// The sampling clocks: a POSIX timer on each thread's own CPU-time clock, sending SIGPROF to
/// that thread (SIGEV_THREAD_ID) after every 1/hz s of CPU time it used. A thread's clock
/// advances only while it runs and its timer is checked at its own tick, so each thread gets
/// its own share of samples: a timer on the process's clock is checked by one thread at a time,
/// fires at most once a tick for the whole process, and its signal may go to any thread, even
/// one asleep (measured: 0 of 150 samples in a thread that had a third of the CPU time). Unlike
/// ITIMER_PROF, exec deletes the timers and fork does not copy them, so they cannot outlive the
/// handler they signal (the handler does not survive exec either).
pub struct ThreadTimers {
    /// Thread id to the kernel's timer id.
    timers: std::collections::HashMap<u32, libc::c_int>,
    period_ns: i64,
    /// The process that created the timers: ids are per process.
    owner: u32,
    /// Threads found that could not be given a timer (the kernel refused: a limit).
    pub refused: u64,
}

/// The CPU-time clock of thread `tid` (the kernel's MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)).
fn thread_cpu_clock(tid: u32) -> libc::clockid_t {
    (!(tid as libc::clockid_t) << 3) | 6
}

impl ThreadTimers {
    pub fn new(hz: u32) -> ThreadTimers {
        ThreadTimers {
            timers: Default::default(),
            period_ns: (1_000_000_000 / i64::from(hz.max(1))).max(1),
            owner: getpid(),
            refused: 0,
        }
    }

    /// Threads with a timer now.
    pub fn len(&self) -> usize {
        self.timers.len()
    }

    /// Gives every thread of the process a timer, but `skip`; deletes the timers of threads
    /// that are gone. Errors only when the thread list cannot be read.
    pub fn sync(&mut self, skip: Option<u32>) -> std::io::Result<()> {
        let mut now = Vec::with_capacity(self.timers.len() + 4);
        for e in std::fs::read_dir("/proc/self/task")? {
            if let Some(tid) = e?.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                if Some(tid) != skip {
                    now.push(tid);
                }
            }
        }
        now.sort_unstable();
        self.timers.retain(|tid, id| {
            let live = now.binary_search(tid).is_ok();
            if !live {
                delete_timer(*id);
            }
            live
        });
        for tid in now {
            if self.timers.contains_key(&tid) {
                continue;
            }
            match arm_timer(thread_cpu_clock(tid), tid, self.period_ns) {
                Ok(id) => {
                    self.timers.insert(tid, id);
                }
                // The thread ended meanwhile.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ESRCH | libc::EINVAL)) => {}
                Err(_) => self.refused += 1,
            }
        }
        Ok(())
    }
}

/// A POSIX timer on `clock` that sends SIGPROF to thread `tid` of this process every
/// `period_ns`, armed; the kernel's timer id.
fn arm_timer(clock: libc::clockid_t, tid: u32, period_ns: i64) -> std::io::Result<libc::c_int> {
    // SAFETY: a zeroed sigevent asking for SIGPROF to thread `tid`.
    let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
    sev.sigev_notify = libc::SIGEV_THREAD_ID;
    sev.sigev_signo = libc::SIGPROF;
    sev.sigev_notify_thread_id = tid as libc::c_int;
    let mut id: libc::c_int = 0;
    // SAFETY: the raw timer_create with a valid sigevent; the kernel writes its timer id (an
    // int) into `id`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_timer_create,
            clock,
            &mut sev as *mut libc::sigevent,
            &mut id as *mut libc::c_int,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let period = libc::timespec {
        tv_sec: period_ns / 1_000_000_000,
        tv_nsec: period_ns % 1_000_000_000,
    };
    let it = libc::itimerspec {
        it_interval: period,
        it_value: period,
    };
    // SAFETY: arming the timer just created with a valid itimerspec.
    let r = unsafe {
        libc::syscall(
            libc::SYS_timer_settime,
            id,
            0,
            &it as *const libc::itimerspec,
            std::ptr::null_mut::<libc::itimerspec>(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        delete_timer(id);
        return Err(e);
    }
    Ok(id)
}

/// A timer on the process's CPU clock that sends SIGPROF to one thread (which blocks it and
/// waits for it with [`wait_sigprof`]) after every `period` of CPU time used by any thread.
pub struct ProcessCpuAlarm {
    id: libc::c_int,
    owner: u32,
}

impl ProcessCpuAlarm {
    pub fn start(tid: u32, period: std::time::Duration) -> std::io::Result<ProcessCpuAlarm> {
        let ns = i64::try_from(period.as_nanos()).unwrap_or(i64::MAX).max(1);
        Ok(ProcessCpuAlarm {
            id: arm_timer(libc::CLOCK_PROCESS_CPUTIME_ID, tid, ns)?,
            owner: getpid(),
        })
    }
}

impl Drop for ProcessCpuAlarm {
    fn drop(&mut self) {
        if self.owner == getpid() {
            delete_timer(self.id);
        }
    }
}

/// Waits up to `timeout` for a SIGPROF sent to this thread (which blocks it), taking it.
pub fn wait_sigprof(timeout: std::time::Duration) {
    // SAFETY: a local set holding SIGPROF, a valid timeout; no siginfo is asked for.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPROF);
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: as above.
    unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
}

/// Sends SIGPROF to thread `tid` of this process.
pub fn sigprof_thread(tid: u32) {
    // SAFETY: tgkill to a thread of our own process.
    unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            getpid() as libc::pid_t,
            tid as libc::pid_t,
            libc::SIGPROF,
        )
    };
}

fn delete_timer(id: libc::c_int) {
    // SAFETY: deleting a timer this process created and has not deleted.
    unsafe { libc::syscall(libc::SYS_timer_delete, id) };
}

impl Drop for ThreadTimers {
    /// Deletes the timers, in the process that created them only: a fork child has no copy,
    /// and the same ids may name the child's own timers there.
    fn drop(&mut self) {
        if self.owner == getpid() {
            for (_, id) in self.timers.drain() {
                delete_timer(id);
            }
        }
    }
}

/// Runs `f` with every signal blocked in this thread (a thread it spawns inherits the mask).
pub fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigfillset and pthread_sigmask on local sets; the old mask is put back below.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
    }
    let r = f();
    // SAFETY: putting back the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

/// CPU time this process has used, all threads.
pub fn process_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

pub fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

pub fn getpid() -> u32 {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { libc::getpid() as u32 }
}

pub fn errno() -> i32 {
    // SAFETY: errno's location is valid for the calling thread.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: i32) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
}

/// Reads two 8-byte words at `addr` of this process, or None where it is not mapped (the
/// kernel checks: no fault).
pub fn read_pair(addr: u64) -> Option<[u64; 2]> {
    let mut out = [0u64; 2];
    let local = libc::iovec {
        iov_base: out.as_mut_ptr() as *mut libc::c_void,
        iov_len: 16,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 16,
    };
    // SAFETY: process_vm_readv on ourselves into a local 16-byte buffer; the kernel validates
    // the remote range and returns an error instead of faulting.
    let n = unsafe { libc::process_vm_readv(getpid() as libc::pid_t, &local, 1, &remote, 1, 0) };
    (n == 16).then_some(out)
}

/// The periods of a POSIX timer that ran out without a signal of their own before the one
/// `info` describes (`si_overrun`; 0 for a signal of another origin, such as a `tgkill`).
pub fn timer_overrun(info: *const libc::siginfo_t) -> u32 {
    if info.is_null() {
        return 0;
    }
    // SAFETY: the kernel passes a valid siginfo_t to a SA_SIGINFO handler; for a timer's
    // signal (si_code SI_TIMER) the union after the three ints and their padding starts with
    // the timer's si_tid and si_overrun (Linux's layout on 64-bit targets: offset 20).
    unsafe {
        if (*info).si_code != libc::SI_TIMER {
            return 0;
        }
        let overrun = std::ptr::read_unaligned((info as *const u8).add(20) as *const i32);
        // (A bound: one signal never stands for more than a million periods.)
        overrun.clamp(0, 1_000_000) as u32
    }
}

/// pc, sp and frame pointer of the interrupted context of a SA_SIGINFO handler.
pub fn context_regs(ctx: *mut libc::c_void) -> (u64, u64, u64) {
    if ctx.is_null() {
        return (0, 0, 0);
    }
    let uc = ctx as *const libc::ucontext_t;
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the kernel passes a valid ucontext_t to a SA_SIGINFO handler.
        let g = unsafe { &(*uc).uc_mcontext.gregs };
        (
            g[libc::REG_RIP as usize] as u64,
            g[libc::REG_RSP as usize] as u64,
            g[libc::REG_RBP as usize] as u64,
        )
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: as above.
        let m = unsafe { &(*uc).uc_mcontext };
        (m.pc, m.sp, m.regs[29])
    }
}

/// The sample buffer: `len` words of an anonymous mapping, written by the signal handler at
/// slots it reserved with an atomic counter.
pub struct Buffer {
    ptr: AtomicPtr<u64>,
    len: AtomicUsize,
    next: AtomicUsize,
}

impl Buffer {
    pub const fn new() -> Buffer {
        Buffer {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            len: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
        }
    }

    /// Maps a fresh, zeroed buffer of `words` words (pages are touched only when written).
    pub fn map(&self, words: usize) -> std::io::Result<()> {
        // SAFETY: an anonymous private mapping; the pointer is kept until `unmap`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                words * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        self.next.store(0, Ordering::SeqCst);
        self.len.store(words, Ordering::SeqCst);
        self.ptr.store(p as *mut u64, Ordering::SeqCst);
        Ok(())
    }

    /// Reserves `n` words and writes `words` there; false when the buffer is full.
    pub fn push(&self, words: &[u64]) -> bool {
        let p = self.ptr.load(Ordering::Acquire);
        let len = self.len.load(Ordering::Acquire);
        if p.is_null() {
            return false;
        }
        let at = self.next.fetch_add(words.len(), Ordering::AcqRel);
        if at + words.len() > len {
            return false;
        }
        // SAFETY: [at, at + n) is inside the mapping and reserved for this call alone.
        unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), p.add(at), words.len()) };
        true
    }

    /// The words written so far (call only when no handler can write any more).
    pub fn contents(&self) -> Vec<u64> {
        let p = self.ptr.load(Ordering::Acquire);
        let len = self
            .len
            .load(Ordering::Acquire)
            .min(self.next.load(Ordering::Acquire));
        if p.is_null() {
            return Vec::new();
        }
        // SAFETY: the first `len` words of the mapping, no longer written.
        unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
    }

    /// Drops the buffer without unmapping it (a handler may still be writing there).
    pub fn forget(&self) {
        self.ptr.store(std::ptr::null_mut(), Ordering::SeqCst);
        self.len.store(0, Ordering::SeqCst);
    }

    /// Unmaps the buffer (call only when no handler can write any more).
    pub fn unmap(&self) {
        let p = self.ptr.swap(std::ptr::null_mut(), Ordering::AcqRel);
        let len = self.len.swap(0, Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: the mapping made by `map`, of `len` words, no longer used.
            unsafe { libc::munmap(p as *mut libc::c_void, len * 8) };
        }
    }
}

/// Runs `f` at process exit (atexit), for the preload mode.
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: registering a function with no arguments that lives for the whole program.
    unsafe { libc::atexit(f) };
}

/// Runs `f` in the child after fork (pthread_atfork), for the preload mode.
pub fn at_fork_child(f: extern "C" fn()) {
    // SAFETY: registering a child handler that lives for the whole program.
    unsafe { libc::pthread_atfork(None, None, Some(f)) };
}

/// Copies memory of this process from `addr` into `buf` (at most 16 KiB), as far as it is
/// mapped: returns how many bytes. One syscall, split at page boundaries, so that a read
/// running off the end of a mapping keeps the pages before it.
pub fn read_into(addr: u64, buf: &mut [u8]) -> usize {
    const PAGES: usize = 5;
    let len = buf.len().min(16 << 10);
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut local = [empty; PAGES];
    let mut remote = [empty; PAGES];
    let (mut done, mut k) = (0usize, 0usize);
    while done < len && k < PAGES {
        let a = addr.wrapping_add(done as u64);
        let chunk = ((4096 - a % 4096) as usize).min(len - done);
        local[k] = libc::iovec {
            iov_base: buf[done..].as_mut_ptr() as *mut libc::c_void,
            iov_len: chunk,
        };
        remote[k] = libc::iovec {
            iov_base: a as *mut libc::c_void,
            iov_len: chunk,
        };
        done += chunk;
        k += 1;
    }
    // SAFETY: process_vm_readv on ourselves into `buf` (the local iovecs cover disjoint parts
    // of it); the kernel validates the remote ranges and stops at the first unmapped one.
    let n = unsafe {
        libc::process_vm_readv(
            getpid() as libc::pid_t,
            local.as_ptr(),
            k as libc::c_ulong,
            remote.as_ptr(),
            k as libc::c_ulong,
            0,
        )
    };
    n.max(0) as usize
}

/// Reads one 8-byte word of this process, or None where it is not mapped.
pub fn read_word(addr: u64) -> Option<u64> {
    let mut out = 0u64;
    let local = libc::iovec {
        iov_base: &mut out as *mut u64 as *mut libc::c_void,
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: as in read_pair, into a local 8-byte word.
    let n = unsafe { libc::process_vm_readv(getpid() as libc::pid_t, &local, 1, &remote, 1, 0) };
    (n == 8).then_some(out)
}

/// The link register of the interrupted context (AArch64; 0 on x86_64).
pub fn context_lr(ctx: *mut libc::c_void) -> u64 {
    #[cfg(target_arch = "aarch64")]
    {
        if ctx.is_null() {
            return 0;
        }
        let uc = ctx as *const libc::ucontext_t;
        // SAFETY: the kernel passes a valid ucontext_t to a SA_SIGINFO handler.
        return unsafe { (*uc).uc_mcontext.regs[30] };
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        let _ = ctx;
        0
    }
}

/// A value built before sampling and read by the signal handler: set and taken outside
/// handlers, read inside them (stop waits for running handlers before taking it).
pub struct Shared<T>(AtomicPtr<T>);

impl<T> Shared<T> {
    pub const fn new() -> Shared<T> {
        Shared(AtomicPtr::new(std::ptr::null_mut()))
    }

    pub fn set(&self, v: Box<T>) {
        drop(self.take());
        self.0.store(Box::into_raw(v), Ordering::SeqCst);
    }

    /// The value, for a handler.
    pub fn get(&self) -> Option<&T> {
        let p = self.0.load(Ordering::SeqCst);
        // SAFETY: a pointer from Box::into_raw, freed only by `take`, which stop calls once
        // no handler runs.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Takes the value back (no handler may be running).
    pub fn take(&self) -> Option<Box<T>> {
        let p = self.0.swap(std::ptr::null_mut(), Ordering::SeqCst);
        // SAFETY: the pointer came from Box::into_raw and is handed out once.
        (!p.is_null()).then(|| unsafe { Box::from_raw(p) })
    }

    /// Forgets the value without freeing it (a handler may still read it).
    pub fn leak(&self) {
        self.0.store(std::ptr::null_mut(), Ordering::SeqCst);
    }
}

/// A fixed set of values that concurrent handlers borrow one at a time, without locks.
pub struct Pool<T, const N: usize> {
    items: [Shared<T>; N],
    busy: [std::sync::atomic::AtomicBool; N],
}

impl<T, const N: usize> Pool<T, N> {
    pub const fn new() -> Pool<T, N> {
        Pool {
            items: [const { Shared::new() }; N],
            busy: [const { std::sync::atomic::AtomicBool::new(false) }; N],
        }
    }

    pub fn fill(&self, mut make: impl FnMut() -> T) {
        for it in &self.items {
            it.set(Box::new(make()));
        }
    }

    pub fn clear(&self) {
        for it in &self.items {
            drop(it.take());
        }
    }

    pub fn leak(&self) {
        for it in &self.items {
            it.leak();
        }
    }

    /// Runs `f` with a free item, if one is free.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        for (i, b) in self.busy.iter().enumerate() {
            if b.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                let p = self.items[i].0.load(Ordering::SeqCst);
                let r = (!p.is_null()).then(|| {
                    // SAFETY: the busy flag gives this caller the item alone until released.
                    f(unsafe { &mut *p })
                });
                b.store(false, Ordering::SeqCst);
                return r;
            }
        }
        None
    }
}
