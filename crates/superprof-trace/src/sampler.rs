//! The ptrace sampler: for when perf_event_open is denied.
//!
//! At each tick it reads every running thread's CPU clock; a thread that has used a sampling
//! period's worth of CPU since its last sample is interrupted, its registers and stack are read,
//! and it is resumed. Idle threads are never stopped, and each sample stands for the same CPU
//! time, as with perf's cpu-clock event.
//!
//! With `off_cpu` (the wall-clock mode), every thread is also looked at once a period of wall
//! time: one blocked in the kernel then (its /proc syscall file says where) gives an off-CPU
//! sample standing for the time since it was last looked at. Its stack is read by stopping it
//! where the call restarts unseen after a stop ([`crate::blocked::restarts_after_stop`]), and
//! otherwise (a call a stop would make fail with EINTR, an uninterruptible wait) from the pc
//! and stack pointer the kernel shows, without stopping it. A thread still blocked in the
//! same place as at its last off-CPU sample is not read again.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use superprof_unwind::UserRegs;

use crate::sys;
use crate::tracer::{TraceEvent, Tracer};

/// How [`run`] samples.
#[derive(Debug, Clone, Copy)]
pub struct PtraceSamplerConfig {
    /// Samples per second of CPU time: a thread is sampled after each 1/`frequency` s of CPU
    /// it uses (with `off_cpu`, every thread is also looked at as often in wall time); 0
    /// counts as 1.
    pub frequency: u32,
    /// Bytes of stack copied at each sample, from the stack pointer up.
    pub stack_size: u32,
    /// Also sample off-CPU time (the wall-clock mode).
    pub off_cpu: bool,
}

/// Where an off-CPU sample's thread waited, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Wait {
    /// The system call it is blocked in (None: blocked outside one, as in a page fault).
    pub syscall: Option<u64>,
    /// The wall time the sample stands for, nanoseconds.
    pub ns: u64,
}

/// One sample: registers and a copy of the stack from `regs.sp`.
#[derive(Debug)]
pub struct PtraceSample<'a> {
    /// CLOCK_MONOTONIC nanoseconds.
    pub time: u64,
    /// The process of the thread sampled.
    pub pid: u32,
    /// The thread sampled.
    pub tid: u32,
    /// Its registers (an off-CPU sample read without a stop: pc and sp alone, the others 0).
    pub regs: UserRegs,
    /// Its stack from `regs.sp` up: at most `stack_size` bytes, fewer where an unreadable
    /// page ends the copy.
    pub stack: &'a [u8],
    /// The copy filled the whole buffer (the stack may go on beyond it).
    pub stack_full: bool,
    /// Sampling periods of CPU time the sample stands for: 1, or more in the wall-clock mode
    /// when the thread ran longer between two samples (so that its CPU time is all counted).
    pub periods: u64,
    /// Wall-clock mode: nanoseconds the thread waited on a run queue (preempted, or woken and
    /// not yet running) since the last sample that carried them, to count where it is now.
    pub preempted_ns: u64,
}

/// What the sampler reports to its owner.
#[derive(Debug)]
pub enum SamplerEvent<'a> {
    /// An on-CPU sample: the thread was stopped after using a sampling period of CPU time
    /// (or more: see [`PtraceSample::periods`]).
    Sample(PtraceSample<'a>),
    /// An off-CPU sample (wall-clock mode). Without a stop, the registers other than pc and
    /// sp are 0.
    OffCpu(PtraceSample<'a>, Wait),
    /// More off-CPU time of a thread still blocked where its last off-CPU sample was.
    OffCpuAgain {
        /// When it was looked at, CLOCK_MONOTONIC nanoseconds.
        time: u64,
        /// The thread's process.
        pid: u32,
        /// The thread.
        tid: u32,
        /// Its system call, and the wall time since it was last looked at.
        wait: Wait,
    },
    /// Any other event of the tracer, passed on (a new thread or process, an exec, an exit,
    /// a breakpoint...). A thread that an exec, a breakpoint or a step stopped is resumed
    /// once the call returns; an exit of the root process ends [`run`] after it.
    Trace(TraceEvent),
    /// Called about every 50 ms: a chance to stop (return [`Control::Stop`]) or to do
    /// periodic work.
    Tick,
}

/// What the callback of [`run`] (or of [`crate::syscalls::trace`]) answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Go on.
    Continue,
    /// Return now; the tracer is left as it is, for its owner to finish.
    Stop,
}

struct Credit {
    pid: u32,
    clock: Option<sys::CpuTime>,
    last_cpu: u64,
    credit: u64,
    /// Wall-clock mode: the thread's syscall file, when it was last looked at, and where it
    /// waited at its last off-CPU sample.
    syscall_file: Option<crate::blocked::BlockedReader>,
    looked_at: u64,
    last_wait: Option<(crate::blocked::Blocked, Vec<u8>)>,
    /// Run-queue wait (schedstat) at the last reading, and what is not counted yet.
    last_delay: u64,
    delay: u64,
    /// The system call one of our stops interrupted, and the pc it goes on from: once
    /// restarted, /proc shows it as restart_syscall.
    restarting: Option<(u64, u64)>,
}

/// Bytes at the stack pointer compared to tell a thread still blocked in the same place
/// (the innermost frames' return addresses are there).
const SAME_PLACE_BYTES: usize = 512;

/// Whether `b` with `top` (the bytes at its sp) is where `last` waited.
fn same_place(last: &Option<(Blocked, Vec<u8>)>, b: &Blocked, top: &[u8]) -> bool {
    last.as_ref()
        .is_some_and(|(lb, ltop)| lb == b && ltop.as_slice() == top)
}

use crate::blocked::Blocked;

/// Brings a thread's CPU-time credit and run-queue wait up to now (its schedstat); whether
/// they could be read.
fn catch_up(c: &mut Credit) -> bool {
    let Some((cpu, delay)) = c.clock.as_ref().and_then(|c| c.read_with_delay()) else {
        return false;
    };
    c.credit += cpu.saturating_sub(c.last_cpu);
    c.last_cpu = cpu;
    c.delay += delay.saturating_sub(c.last_delay);
    c.last_delay = delay;
    true
}

/// The name of system call `nr` on this machine (no allocation: called at every look).
fn syscall_name(nr: u64) -> Option<&'static str> {
    crate::names::known_name_for(crate::names::Arch::HOST, nr)
}

/// Whether `nr` is restart_syscall, which the kernel runs to go on with a call a stop
/// interrupted (a sleep, a futex wait with a timeout).
fn is_restart(nr: u64) -> bool {
    syscall_name(nr) == Some("restart_syscall")
}

/// Forgets every thread of process `pid` (it exited, or exec ended its threads).
fn forget_process(pid: u32, credits: &mut HashMap<u32, Credit>, sets: &mut [&mut HashSet<u32>]) {
    let gone: Vec<u32> = credits
        .iter()
        .filter(|(&t, c)| c.pid == pid || t == pid)
        .map(|(&t, _)| t)
        .collect();
    for t in gone {
        credits.remove(&t);
        for set in sets.iter_mut() {
            set.remove(&t);
        }
    }
    for set in sets.iter_mut() {
        set.remove(&pid);
    }
}

/// Samples until the root process exits or `on` returns [`Control::Stop`] for a
/// [`SamplerEvent::Tick`] (its answer to the other events is not looked at).
///
/// (One function of 272 lines: one sampling loop, each turn a tick's look at every running thread
/// and then one trace event; both halves change `credits`, `outstanding`, `off_pending` and
/// `on_cpu_periods`, which, split, would travel between the pieces in a struct.)
pub fn run(
    tracer: &mut Tracer,
    cfg: &PtraceSamplerConfig,
    mut on: impl FnMut(SamplerEvent) -> Control,
) -> std::io::Result<()> {
    let period = Duration::from_nanos(1_000_000_000 / cfg.frequency.max(1) as u64);
    let period_ns = period.as_nanos() as u64;
    let mut stack = vec![0u8; cfg.stack_size as usize];
    let mut credits: HashMap<u32, Credit> = HashMap::new();
    let mut outstanding: HashSet<u32> = HashSet::new();
    // Threads stopped for an off-CPU sample: where they were blocked, and the time it stands for.
    // (Where it was blocked, the wait, when it was looked at before.)
    let mut off_pending: HashMap<u32, (Blocked, Wait, u64)> = HashMap::new();
    // Threads stopped for an on-CPU sample of more than one period (wall-clock mode).
    let mut on_cpu_periods: HashMap<u32, u64> = HashMap::new();
    let mut top = vec![0u8; SAME_PLACE_BYTES];
    let mut next_tick = Instant::now() + period;
    let mut next_call = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next_call {
            next_call = now + Duration::from_millis(50);
            if on(SamplerEvent::Tick) == Control::Stop {
                return Ok(());
            }
        }
        if now >= next_tick {
            next_tick += period;
            if next_tick < now {
                next_tick = now + period; // fell behind: skip, rather than burst
            }
            let running: Vec<(u32, u32)> = tracer.running_threads().collect();
            for (tid, pid) in running {
                let c = credits.entry(tid).or_insert_with(|| {
                    let clock = sys::CpuTime::open(pid, tid);
                    let (last_cpu, last_delay) = clock
                        .as_ref()
                        .and_then(|c| c.read_with_delay())
                        .unwrap_or((0, 0));
                    Credit {
                        pid,
                        clock,
                        last_cpu,
                        last_delay,
                        delay: 0,
                        restarting: None,
                        credit: 0,
                        syscall_file: if cfg.off_cpu {
                            crate::blocked::BlockedReader::open(pid, tid)
                        } else {
                            None
                        },
                        looked_at: sys::monotonic_ns(),
                        last_wait: None,
                    }
                });
                if !catch_up(c) {
                    continue;
                }
                if c.credit >= period_ns && !outstanding.contains(&tid) && tracer.interrupt(tid) {
                    if cfg.off_cpu {
                        // Wall-clock mode: all of the CPU time is counted (the profile adds up
                        // to the wall time), the sample weighs what the thread ran.
                        let periods = c.credit / period_ns;
                        c.credit -= periods * period_ns;
                        on_cpu_periods.insert(tid, periods);
                    } else {
                        // At most two samples of backlog: a thread that ran while we were
                        // slow does not get a burst.
                        c.credit = (c.credit - period_ns).min(period_ns);
                    }
                    outstanding.insert(tid);
                }
                // Wall-clock mode: is the thread blocked now? Then the time since it was last
                // looked at is off-CPU time, in the place it waits now (a sampling estimate,
                // as the on-CPU samples are).
                let Some(file) = c.syscall_file.as_ref() else {
                    continue;
                };
                let now = sys::monotonic_ns();
                let elapsed = now.saturating_sub(c.looked_at);
                // (A thread stopped or being stopped for an off-CPU sample is not looked at;
                // one being stopped for an on-CPU sample is: it may be blocked meanwhile,
                // and a stop waits for the end of a wait in D, the disk's.)
                if elapsed < period_ns || off_pending.contains_key(&tid) {
                    continue;
                }
                let looked_before = c.looked_at;
                c.looked_at = now;
                // Blocked, waiting for an event of its own? (Runnable time is the run-queue
                // wait's, counted exactly; a stop is not the program's wait.)
                let Some(state) = file.read().filter(|s| s.waiting()) else {
                    continue;
                };
                let mut b = state.blocked;
                // A call restarted after a stop of ours (a sleep) is restart_syscall now: it
                // is still the call it was.
                if b.syscall.is_some_and(is_restart) {
                    let before = match (&c.restarting, &c.last_wait) {
                        (Some((nr, pc)), _) if *pc == b.pc => Some(*nr),
                        (_, Some((last, _))) if last.sp == b.sp && last.pc == b.pc => last.syscall,
                        _ => None,
                    };
                    if before.is_some() {
                        b.syscall = before;
                    }
                }
                let wait = Wait {
                    syscall: b.syscall,
                    ns: elapsed,
                };
                let n = sys::read_memory(pid, b.sp, &mut top);
                if n > 0 && same_place(&c.last_wait, &b, &top[..n]) {
                    on(SamplerEvent::OffCpuAgain {
                        time: now,
                        pid,
                        tid,
                        wait,
                    });
                    continue;
                }
                let stoppable = state.state == b'S'
                    && !outstanding.contains(&tid)
                    && b.syscall
                        .and_then(syscall_name)
                        .is_some_and(|n| crate::blocked::restarts_after_stop(pid, &b, n));
                if stoppable {
                    // Stopped, for every register: the call restarts unseen. Looked at again
                    // first: still in the same call the moment before the stop (it could
                    // have gone on into another since).
                    let still = file.read().is_some_and(|a| a == state);
                    if still && tracer.interrupt(tid) {
                        outstanding.insert(tid);
                        off_pending.insert(tid, (b, wait, looked_before));
                    } else {
                        c.looked_at = looked_before; // (its time goes to the next look)
                    }
                    continue;
                }
                let n = sys::read_memory(pid, b.sp, &mut stack);
                c.last_wait = Some((b, stack[..n.min(SAME_PLACE_BYTES)].to_vec()));
                let preempted_ns = std::mem::take(&mut c.delay);
                on(SamplerEvent::OffCpu(
                    PtraceSample {
                        time: now,
                        pid,
                        tid,
                        regs: UserRegs::at(b.pc, b.sp),
                        stack: &stack[..n],
                        stack_full: n == stack.len(),
                        periods: 1,
                        preempted_ns,
                    },
                    wait,
                ));
            }
        }
        // Until the next tick, whatever is outstanding: a stop asked of a thread in a wait in
        // D comes only when the wait ends, and the looks must go on meanwhile (waiting 5 ms
        // for it made them five times rarer during such waits, and each wait's end, from the
        // last look to the stop, was lost: 2.5 ms a wait, 12% of an fsync-heavy program).
        let wait_for = next_tick
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(5));
        match tracer.next_event(wait_for)? {
            Some(TraceEvent::Stopped { tid, pid }) => {
                let ours = outstanding.remove(&tid);
                let raw = if ours { sys::raw_regs(tid).ok() } else { None };
                let mut n = 0;
                if let Some(raw) = &raw {
                    n = sys::read_memory(pid, sys::user_regs(raw).sp, &mut stack);
                    // A call that failed with EINTR at our stop (the thread went into one
                    // that does in the moment between our look and the stop) is made to
                    // run again, as the kernel restarts the others.
                    sys::undo_eintr(tid, raw);
                }
                // Registers and stack copied: the thread goes on before the sample is
                // unwound (it is not kept stopped while superprof works).
                tracer.resume(tid);
                if let Some(raw) = raw {
                    let regs = sys::user_regs(&raw);
                    let time = sys::monotonic_ns();
                    let mut preempted_ns = 0;
                    let mut periods = on_cpu_periods.remove(&tid).unwrap_or(1);
                    if let Some(c) = credits.get_mut(&tid).filter(|_| cfg.off_cpu) {
                        // The CPU time it used until the stop counts here too (a stop
                        // can wait for a long system call to end: an fsync's work).
                        if catch_up(c) && !off_pending.contains_key(&tid) {
                            let more = c.credit / period_ns;
                            c.credit -= more * period_ns;
                            periods += more;
                        }
                        preempted_ns = std::mem::take(&mut c.delay);
                        // (A restart_syscall interrupted again is still the call the
                        // first stop found.)
                        match sys::interrupted_syscall(&raw) {
                            Some(nr) if is_restart(nr) => {}
                            found => c.restarting = found.map(|nr| (nr, regs.pc)),
                        }
                    }
                    let sample = PtraceSample {
                        time,
                        pid,
                        tid,
                        regs,
                        stack: &stack[..n],
                        stack_full: n == stack.len(),
                        periods,
                        preempted_ns,
                    };
                    match off_pending.remove(&tid) {
                        Some((b, mut wait, looked_before)) => {
                            if let Some(c) = credits.get_mut(&tid) {
                                c.last_wait = Some((b, stack[..n.min(SAME_PLACE_BYTES)].to_vec()));
                                // It stands for the time up to its stop (which a wait
                                // can delay).
                                wait.ns = time.saturating_sub(looked_before);
                                c.looked_at = time;
                            }
                            on(SamplerEvent::OffCpu(sample, wait));
                        }
                        None => {
                            on(SamplerEvent::Sample(sample));
                        }
                    }
                }
                off_pending.remove(&tid);
                on_cpu_periods.remove(&tid);
            }
            Some(TraceEvent::ProcessExited { pid, status }) => {
                forget_process(pid, &mut credits, &mut [&mut outstanding]);
                off_pending.retain(|t, _| credits.contains_key(t));
                on_cpu_periods.retain(|t, _| credits.contains_key(t));
                let root = pid == tracer.root();
                on(SamplerEvent::Trace(TraceEvent::ProcessExited {
                    pid,
                    status,
                }));
                if root {
                    return Ok(());
                }
            }
            Some(ev) => {
                let resume = match ev {
                    TraceEvent::ThreadExited { tid, .. } => {
                        outstanding.remove(&tid);
                        off_pending.remove(&tid);
                        on_cpu_periods.remove(&tid);
                        credits.remove(&tid);
                        None
                    }
                    TraceEvent::Exec { pid } => {
                        // Its other threads are gone (exec ends them, with no event).
                        forget_process(pid, &mut credits, &mut [&mut outstanding]);
                        off_pending.retain(|t, _| credits.contains_key(t));
                        on_cpu_periods.retain(|t, _| credits.contains_key(t));
                        Some(pid)
                    }
                    TraceEvent::Breakpoint { tid, .. } | TraceEvent::Stepped { tid, .. } => {
                        Some(tid)
                    }
                    _ => None,
                };
                on(SamplerEvent::Trace(ev));
                if let Some(tid) = resume {
                    tracer.resume(tid);
                }
            }
            None => {}
        }
    }
}
