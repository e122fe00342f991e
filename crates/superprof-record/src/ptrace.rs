//! The record loop over the ptrace sampler (where perf_event_open is denied).

use std::time::{Duration, Instant};

use superprof_sample::{Record, SampleRecord};
use superprof_trace::sampler::{self, Control, PtraceSample, PtraceSamplerConfig, SamplerEvent};
use superprof_trace::{ExitStatus, TraceEvent, Tracer};

use crate::collect::{Collector, OffCpu};
use crate::{LoopResult, Progress, RecordConfig, Result};
use superprof_profile::SampleKind;

pub(super) fn run(
    cfg: &RecordConfig,
    mut tracer: Tracer,
    launched: bool,
    collector: &mut Collector,
    progress: &mut Progress,
) -> Result<LoopResult> {
    let root = tracer.root();
    let scfg = PtraceSamplerConfig {
        frequency: cfg.sampler.frequency,
        stack_size: cfg.sampler.stack_size,
        off_cpu: cfg.sampler.off_cpu,
    };
    let mut exit: Option<ExitStatus> = None;
    let mut stopped_early = false;
    let mut names_read = Instant::now();
    // Threads are named at their first sample (short-lived ones may be gone at the next
    // periodic read), and again every 500 ms.
    let mut named: std::collections::HashSet<u32> = Default::default();
    sampler::run(&mut tracer, &scfg, |event| {
        match event {
            SamplerEvent::Sample(s) => {
                if named.insert(s.tid) {
                    collector.read_thread_name(s.pid, s.tid);
                }
                let record = record_of(&s);
                collector.sample_periods(&record, s.periods, s.preempted_ns);
            }
            SamplerEvent::OffCpu(s, wait) => {
                if named.insert(s.tid) {
                    collector.read_thread_name(s.pid, s.tid);
                }
                let record = record_of(&s);
                collector.off_cpu(&record, off_cpu(wait), s.preempted_ns);
            }
            SamplerEvent::OffCpuAgain {
                time, tid, wait, ..
            } => {
                collector.off_cpu_again(tid, time, off_cpu(wait));
            }
            SamplerEvent::Trace(ev) => on_trace_event(collector, &ev, root, &mut exit),
            SamplerEvent::Tick => {
                if progress.should_stop(cfg) {
                    stopped_early = true;
                    return Control::Stop;
                }
                progress.update(collector);
                // Threads name themselves after they start: read the names now and then.
                if names_read.elapsed() >= Duration::from_millis(500) {
                    names_read = Instant::now();
                    collector.read_thread_names(root);
                }
            }
        }
        Control::Continue
    })?;
    collector.read_thread_names(root);
    if launched && exit.is_none() && stopped_early {
        // Ctrl-C or --duration: end the command as perf record does, signals still forwarded.
        let mut seen = None;
        let ended = tracer.terminate(Duration::from_secs(5), |ev| {
            on_trace_event(collector, ev, root, &mut seen)
        })?;
        exit = ended.or(seen);
        if exit.is_none() {
            superprof_unwind::say!(
                "superprof: the command ignored SIGTERM for 5 s; sending SIGKILL"
            );
        }
    }
    // Detaches an attached process (it runs on); kills a launched one still running.
    let killed = tracer.finish();
    Ok(LoopResult {
        exit: exit.or(killed),
        event: "cpu-clock (ptrace)".into(),
        events: Vec::new(),
        cpus: 0,
        off_cpu: cfg.sampler.off_cpu.then_some("ptrace wall-clock"),
        kernel: false,
        frequency: cfg.sampler.frequency,
    })
}

/// A ptrace sample as the collector takes it (its weight is given beside it).
fn record_of<'a>(s: &PtraceSample<'a>) -> SampleRecord<'a> {
    SampleRecord {
        id: 0,
        time: s.time,
        pid: s.pid,
        tid: s.tid,
        cpu: 0,
        period: 0,
        kernel_ips: Vec::new(),
        user_ips: Vec::new(),
        regs: Some(s.regs),
        stack: s.stack,
        stack_full: s.stack_full,
    }
}

fn off_cpu(wait: sampler::Wait) -> OffCpu {
    OffCpu {
        kind: SampleKind::OffCpu,
        syscall: wait.syscall,
        ns: wait.ns,
    }
}

fn on_trace_event(
    collector: &mut Collector,
    ev: &TraceEvent,
    root: u32,
    exit: &mut Option<ExitStatus>,
) {
    let now = superprof_sample::monotonic_ns();
    match *ev {
        TraceEvent::Exec { pid } => {
            collector.handle(&Record::Comm {
                pid,
                tid: pid,
                time: now,
                name: String::new(),
                exec: true,
            });
            collector.read_proc(pid, now);
        }
        TraceEvent::NewProcess { pid, parent } => {
            collector.handle(&Record::Fork {
                pid,
                ppid: parent,
                tid: pid,
                ptid: parent,
                time: now,
            });
        }
        TraceEvent::NewThread { tid, pid } => {
            collector.handle(&Record::Fork {
                pid,
                ppid: pid,
                tid,
                ptid: pid,
                time: now,
            });
        }
        TraceEvent::ProcessExited { pid, status } if pid == root => *exit = Some(status),
        _ => {}
    }
}
