//! The ptrace sampler: for when perf_event_open is denied.
//!
//! At each tick it reads every running thread's CPU clock; a thread that has used a sampling
//! period's worth of CPU since its last sample is interrupted, its registers and stack are read,
//! and it is resumed. Idle threads are never stopped, and each sample stands for the same CPU
//! time, as with perf's cpu-clock event.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use superprof_unwind::UserRegs;

use crate::sys;
use crate::tracer::{TraceEvent, Tracer};

#[derive(Debug, Clone, Copy)]
pub struct PtraceSamplerConfig {
    pub frequency: u32,
    pub stack_size: u32,
}

/// One sample: registers and a copy of the stack from `regs.sp`.
#[derive(Debug)]
pub struct PtraceSample<'a> {
    /// CLOCK_MONOTONIC nanoseconds.
    pub time: u64,
    pub pid: u32,
    pub tid: u32,
    pub regs: UserRegs,
    pub stack: &'a [u8],
    /// The copy filled the whole buffer (the stack may go on beyond it).
    pub stack_full: bool,
}

/// What the sampler reports to its owner.
#[derive(Debug)]
pub enum SamplerEvent<'a> {
    Sample(PtraceSample<'a>),
    Trace(TraceEvent),
    /// Called about every 50 ms: a chance to stop (return [`Control::Stop`]) or to do
    /// periodic work.
    Tick,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Continue,
    Stop,
}

struct Credit {
    clock: Option<sys::CpuTime>,
    last_cpu: u64,
    credit: u64,
}

/// Samples until the root process exits or `on` returns [`Control::Stop`].
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
                    let last_cpu = clock.as_ref().and_then(|c| c.read()).unwrap_or(0);
                    Credit {
                        clock,
                        last_cpu,
                        credit: 0,
                    }
                });
                let Some(cpu) = c.clock.as_ref().and_then(|c| c.read()) else {
                    continue;
                };
                c.credit += cpu.saturating_sub(c.last_cpu);
                c.last_cpu = cpu;
                if c.credit >= period_ns && !outstanding.contains(&tid) && tracer.interrupt(tid) {
                    // At most two samples of backlog: a thread that ran while we were slow
                    // does not get a burst.
                    c.credit = (c.credit - period_ns).min(period_ns);
                    outstanding.insert(tid);
                }
            }
        }
        let wait = if outstanding.is_empty() {
            next_tick.saturating_duration_since(Instant::now())
        } else {
            Duration::from_millis(5)
        };
        match tracer.next_event(wait)? {
            Some(TraceEvent::Stopped { tid, pid }) => {
                if outstanding.remove(&tid) {
                    if let Ok(regs) = sys::regs(tid) {
                        let n = sys::read_memory(pid, regs.sp, &mut stack);
                        let time = sys::monotonic_ns();
                        on(SamplerEvent::Sample(PtraceSample {
                            time,
                            pid,
                            tid,
                            regs,
                            stack: &stack[..n],
                            stack_full: n == stack.len(),
                        }));
                    }
                }
                tracer.resume(tid);
            }
            Some(TraceEvent::ProcessExited { pid, status }) => {
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
                        credits.remove(&tid);
                        None
                    }
                    TraceEvent::Exec { pid } => {
                        outstanding.remove(&pid);
                        credits.remove(&pid);
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
