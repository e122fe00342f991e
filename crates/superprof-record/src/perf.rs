//! The record loop over the perf_event sampler.

use std::os::fd::AsRawFd;
use std::time::Duration;

use superprof_sample::{parse_record, split_records, PerfSampler, Record};

use superprof_trace::{ExitStatus, TraceEvent, Tracer};

use crate::collect::Collector;
use crate::{Beside, Error, LoopResult, Progress, RecordConfig, Result};

/// How long before a drain a record must be stamped to be taken in that round.
const HORIZON_SLACK_NS: u64 = 20_000_000;

/// Reads a sampler's rings into a collector, in time order across CPUs.
pub(crate) struct Drainer {
    layout: superprof_sample::Layout,
    buf: Vec<u8>,
    /// Records kept for the next round (raw, header and body).
    held: Vec<u8>,
    /// A test's stall after the first sample (SUPERPROF_TEST_STALL_MS): a consumer busy
    /// reading a large debug file.
    stall: Option<Duration>,
}

impl Drainer {
    pub(crate) fn new(sampler: &PerfSampler) -> Drainer {
        Drainer {
            layout: sampler.layout(),
            buf: Vec::with_capacity(1 << 20),
            held: Vec::new(),
            stall: superprof_unwind::test_switch("SUPERPROF_TEST_STALL_MS")
                .and_then(|ms| ms.parse().ok())
                .map(Duration::from_millis),
        }
    }

    /// The usual horizon: every record stamped before this instant is in its ring now (but
    /// for a CPU stalled between a record's stamp and its commit: a vCPU the host did not
    /// run).
    pub(crate) fn horizon() -> u64 {
        superprof_sample::monotonic_ns().saturating_sub(HORIZON_SLACK_NS)
    }

    /// Hands the collector every record stamped up to `horizon`, in time order; later ones
    /// wait for the next round: one stamped later may be in a ring drained already this
    /// round while an earlier one of another CPU is not yet seen, and records must come in
    /// time order across CPUs (a thread's switch out on one CPU before its switch back in
    /// on another). The collector copes with the rare record later still.
    pub(crate) fn drain(
        &mut self,
        sampler: &mut PerfSampler,
        collector: &mut Collector,
        horizon: u64,
    ) {
        let layout = self.layout;
        self.buf.clear();
        self.buf.append(&mut self.held);
        sampler.drain(&mut self.buf);
        let buf = &self.buf;
        let base = buf.as_ptr() as usize;
        let mut records: Vec<(Record, std::ops::Range<usize>)> = split_records(buf)
            .filter_map(|(ty, misc, body)| {
                let start = (body.as_ptr() as usize - base).checked_sub(8)?;
                let raw = start..start + 8 + body.len();
                Some((parse_record(ty, misc, body, layout)?, raw))
            })
            .filter(|(r, _)| match r {
                Record::Sample(s) => sampler.accept(s),
                Record::Switch { tid, cpu, id, .. } => sampler.accept_switch(*tid, *cpu, *id),
                _ => true,
            })
            .collect();
        // Buffers of different CPUs interleave in time; mmap records must precede the
        // samples that need them.
        records.sort_by_key(|(r, _)| r.time());
        for (r, raw) in &records {
            if r.time() > horizon {
                self.held.extend_from_slice(&buf[raw.clone()]);
                continue;
            }
            match r {
                Record::Sample(s) if sampler.is_switch(s) => collector.off_cpu_begin(s),
                r => collector.handle(r),
            }
            if matches!(r, Record::Sample(_)) {
                if let Some(stall) = self.stall.take() {
                    std::thread::sleep(stall);
                }
            }
        }
    }
}

/// The profile's list of events (`Meta::events`): those of `record -e` where there are
/// several or one is counted; empty for one event of CPU time.
fn profile_events(sampler: &PerfSampler) -> Vec<superprof_profile::EventInfo> {
    let events = sampler.events();
    if events.len() < 2 && !events.iter().any(|e| e.1) {
        return Vec::new();
    }
    events
        .iter()
        .map(|(name, counted)| superprof_profile::EventInfo {
            name: name.clone(),
            counted: *counted,
        })
        .collect()
}

/// The coordinator's tracer of a launched command and what handles its events beside the
/// sampling (`record --precise`), with the recording's start (CLOCK_MONOTONIC).
pub(crate) struct Traced<'a> {
    pub(crate) tracer: Box<Tracer>,
    pub(crate) beside: &'a mut dyn Beside,
    pub(crate) start_ns: u64,
}

/// How often a traced recording's beside gets its tick.
const TICK: Duration = Duration::from_millis(50);

impl Traced<'_> {
    /// The tracer's events for one tick (each stop handled at once), then the beside's tick;
    /// the command's exit status once it has exited.
    fn run_tick(&mut self, root: u32, collector: &Collector) -> Result<Option<ExitStatus>> {
        let until = std::time::Instant::now() + TICK;
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            match self.tracer.next_event(left)? {
                None => break,
                Some(TraceEvent::ProcessExited { pid, status }) if pid == root => {
                    return Ok(Some(status))
                }
                Some(ev) => self
                    .beside
                    .event(&mut self.tracer, root, ev)
                    .map_err(Error::Invalid)?,
            }
        }
        let now = superprof_sample::monotonic_ns().saturating_sub(self.start_ns);
        let start = self.start_ns;
        self.beside
            .tick(&mut self.tracer, root, now, &|| collector.snapshot(start));
        Ok(None)
    }
}

/// (One function of 150 lines: the loop's state — the sampler, the drainer, the exit, the live
/// view's interval, the tracer beside — runs through it from the start to the ending.)
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    cfg: &RecordConfig,
    mut sampler: PerfSampler,
    pid: Option<u32>,
    launched: bool,
    collector: &mut Collector,
    progress: &mut Progress,
    mut live: Option<crate::Live>,
    mut traced: Option<Traced>,
) -> Result<LoopResult> {
    if sampler.kernel_stacks() {
        collector.expect_kernel_frames();
    }
    if sampler.off_cpu_event().is_some() {
        collector.expect_switches();
    }
    collector.set_events(
        sampler.event_ids().clone(),
        sampler.events().iter().map(|e| e.1).collect(),
        sampler.fixed_period(),
    );
    let mut drainer = Drainer::new(&sampler);
    let mut drain = |sampler: &mut PerfSampler, collector: &mut Collector, last: bool| {
        let horizon = if last { u64::MAX } else { Drainer::horizon() };
        drainer.drain(sampler, collector, horizon);
    };
    let mut exit = None;
    let mut stopped_early = false;
    // A live view's intervals: each one's start, and the metadata of its profile.
    let mut interval = crate::Clock::now();
    let interval_meta = live.as_ref().map(|_| {
        let mut m = superprof_profile::Meta {
            event: sampler.event_name().to_owned(),
            frequency: sampler.frequency(),
            events: profile_events(&sampler),
            ..Default::default()
        };
        superprof_resolve::stamp(&mut m);
        m
    });
    // Wakes the loop as soon as the target exits, instead of at the next poll timeout.
    let pidfd = pid.and_then(superprof_trace::pidfd_open);
    let extra: Vec<i32> = pidfd.iter().map(|f| f.as_raw_fd()).collect();
    let mut failed = None;
    // A traced process's end (an attached one's status is not superprof's).
    let mut ended = false;
    if let (Some(t), Some(root)) = (traced.as_mut(), pid) {
        t.beside.begin(&mut t.tracer, root, launched);
    }
    loop {
        match (traced.as_mut(), pid) {
            (Some(t), Some(root)) => match t.run_tick(root, collector) {
                Ok(Some(status)) => {
                    ended = true;
                    if launched {
                        exit = Some(status);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    failed = Some(e);
                    stopped_early = true;
                }
            },
            _ => sampler.wait(&extra, 50),
        }
        drain(&mut sampler, collector, false);
        if ended || failed.is_some() {
            break;
        }
        match pid {
            // (A traced command's exit comes from its tracer.)
            Some(_) if traced.is_some() => {}
            Some(pid) if launched => {
                if let Some(status) = superprof_trace::try_wait(pid) {
                    exit = Some(status);
                    break;
                }
            }
            Some(pid) if !superprof_trace::process_alive(pid) => break,
            _ => {}
        }
        if progress.should_stop(cfg) {
            stopped_early = true;
            break;
        }
        if let (Some(l), Some(meta)) = (live.as_mut(), &interval_meta) {
            let now = crate::Clock::now();
            let length = now.monotonic_ns.saturating_sub(interval.monotonic_ns);
            if length >= l.every.as_nanos() as u64 {
                let mut p = superprof_profile::Profile::default();
                p.meta = meta.clone();
                p.meta.duration_ns = length;
                p.meta.start_time_unix_ns = interval.unix_ns;
                p.meta.lost_samples = collector.lost;
                let p = collector.finish_interval(p, interval.monotonic_ns);
                interval = now;
                if !(l.show)(p) {
                    stopped_early = true;
                    break;
                }
            }
            continue;
        }
        progress.update(collector);
    }
    sampler.disable();
    // Threads still off the CPU were so until now (not until the last records are read).
    let stopped = superprof_sample::monotonic_ns();
    drain(&mut sampler, collector, true);
    collector.close_waits(stopped);
    let off_cpu = sampler.off_cpu_event();
    let event = sampler.event_name().to_owned();
    let events = profile_events(&sampler);
    let kernel = sampler.kernel_stacks();
    let frequency = sampler.frequency();
    let cpus = sampler.cpus().len() as u32;
    drop(sampler); // closes every event: an attached process runs on untouched
    let traced_run = traced.is_some();
    if let (Some(mut t), Some(root)) = (traced, pid) {
        // Ended early: a launched command ends as perf record ends it, under its tracer (an
        // attached process runs on, let go below).
        if !ended && launched {
            exit = t.tracer.terminate(Duration::from_secs(5), |_| {})?;
        }
        t.beside.end(&mut t.tracer, root, t.start_ns);
        collector.name_code(t.beside.code_names());
        // Every patch and breakpoint out of a process still there, and it let go (detached,
        // or a launched one's leftovers ended).
        let killed = t.tracer.finish();
        if launched {
            exit = exit.or(killed);
        }
        if let Some(e) = failed {
            return Err(e);
        }
    }
    if let Some(pid) = pid.filter(|_| launched && exit.is_none() && !traced_run) {
        // Stopped by Ctrl-C or --duration: end the command as perf record does.
        if stopped_early {
            superprof_trace::kill(pid, libc::SIGTERM);
            exit = superprof_trace::wait_exit_timeout(pid, Duration::from_secs(5));
            if exit.is_none() {
                superprof_unwind::say!(
                    "superprof: the command ignored SIGTERM for 5 s; sending SIGKILL"
                );
                superprof_trace::kill(pid, libc::SIGKILL);
            }
        }
        if exit.is_none() {
            exit = Some(superprof_trace::wait_exit(pid)?);
        }
    }
    Ok(LoopResult {
        exit,
        event,
        events,
        kernel,
        frequency,
        off_cpu,
        cpus,
    })
}
