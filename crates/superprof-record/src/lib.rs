//! Sampling into a profile: a launched or attached process ([`record`]), with perf_event or,
//! where perf_event_open is denied, the ptrace sampler; or the whole machine, cut into
//! intervals pushed to a server ([`agent`]). Its collector turns raw
//! samples into a [`Profile`]: modules, unwinding, off-CPU time and symbols.
//!
//! Nothing here parses arguments, installs signal handlers or prints a table: the caller
//! (the `superprof` binary) gives a config with a `stop` check and shows the result.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod agent;
mod beside;
mod collect;
mod perf;
mod ptrace;
pub mod runtime;
mod start;

use std::time::Duration;

use superprof_profile::Profile;
use superprof_sample::{PerfSampler, SampleError, SamplerConfig, TargetMode};
use superprof_trace::{ExitStatus, PendingChild, TraceOptions, Tracer};

pub use crate::beside::{Beside, CodeName};
use crate::collect::Collector;
use crate::start::{start, Source};

/// What went wrong while recording, in one line with its cause.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config asks for something that cannot be done.
    #[error("{0}")]
    Invalid(String),
    /// perf_event_open or its rings failed.
    #[error("{0}")]
    Sample(#[from] SampleError),
    /// The ptrace sampler's tracer failed.
    #[error("{0}")]
    Trace(#[from] superprof_trace::TraceError),
    /// The command could not be run (the shell's 126 or 127).
    #[error("{0}")]
    CannotRun(#[from] superprof_trace::CannotRun),
    /// A push to the agent's server failed.
    #[error("{0}")]
    Push(#[from] superprof_push::Error),
    /// Another system call failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// `source`, with what was being done.
    #[error("{what}: {source}")]
    While {
        /// What was being done.
        what: String,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// This error, said to have happened while doing `what`.
    fn while_(self, what: impl Into<String>) -> Error {
        Error::While {
            what: what.into(),
            source: Box::new(self),
        }
    }
}

/// A result whose error is an [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to sample.
#[derive(Debug, Clone)]
pub enum Target {
    /// A running process, attached to (all its threads).
    Pid(u32),
    /// A command to launch: the program and its arguments.
    Command(Vec<std::ffi::OsString>),
    /// One thread of a process (perf's `-t TID`), and the threads it starts.
    Thread(u32),
    /// Every process of the machine (perf's `-a`; root), kernel frames too: on these CPUs
    /// (perf's `-C`; None: all), while `command` runs (empty: until the duration or `stop`).
    System {
        /// The CPUs sampled (None: every online CPU).
        cpus: Option<Vec<u32>>,
        /// A command launched and waited for (its status is the recording's); empty: none.
        command: Vec<std::ffi::OsString>,
    },
}

/// A recording, as [`record`] takes it.
#[derive(Debug, Clone)]
pub struct RecordConfig {
    /// The rate, the stack bytes copied per sample, off-CPU time.
    pub sampler: SamplerConfig,
    /// perf_event_open, ptrace, or the first that works.
    pub sampler_kind: SamplerKind,
    /// How long to sample (none: until the target ends or `stop`).
    pub duration: Option<Duration>,
    /// A progress line on stderr while recording (when it is a terminal).
    pub progress: bool,
    /// What is sampled.
    pub target: Target,
    /// Whether the caller was asked to stop (Ctrl-C, SIGTERM): checked while sampling.
    pub stop: fn() -> bool,
    /// A launched runtime (node, java, python) is asked to name its JIT code, and an
    /// attached one's missing flag is named (see [`runtime`]).
    pub runtime_setup: bool,
}

impl RecordConfig {
    /// Sampling `target` with `sampler` (perf_event_open, or ptrace where it is refused),
    /// until it ends; no progress line and no stop check.
    pub fn new(target: Target, sampler: SamplerConfig) -> RecordConfig {
        RecordConfig {
            sampler,
            sampler_kind: SamplerKind::Auto,
            duration: None,
            progress: false,
            target,
            stop: || false,
            runtime_setup: true,
        }
    }
}

/// The recording's result, before outputs are written.
pub struct Recorded {
    /// The samples, symbolized, and the run's metadata.
    pub profile: Profile,
    /// Exit status of a launched command.
    pub exit: Option<ExitStatus>,
    /// Whether kernel frames could be recorded.
    pub kernel: bool,
}

impl Recorded {
    /// The line printed on stderr at the end of a recording.
    pub fn summary(&self) -> String {
        let p = &self.profile;
        let threads: std::collections::HashSet<u32> = p.samples.iter().map(|s| s.thread).collect();
        let samples = p.on_cpu_samples();
        let delivered = match p.meta.delivered_frequency(samples as usize) {
            0.0 => String::new(),
            hz => format!(", {hz:.0} Hz delivered"),
        };
        if !p.meta.events.is_empty() {
            return self.summary_of_events(threads.len());
        }
        let off_cpu = if p.meta.off_cpu.is_empty() {
            String::new()
        } else {
            let [_, off, preempted] = p.weight_by_kind();
            format!(
                ", off-CPU time by {}: {:.2} s",
                p.meta.off_cpu,
                (off + preempted) as f64 / f64::from(p.meta.frequency.max(1))
            )
        };
        format!(
            "superprof: {samples} samples ({} at {} Hz{delivered}{}{off_cpu}){}",
            p.meta.event,
            p.meta.frequency,
            if self.kernel { "" } else { ", user space only" },
            self.summary_tail(threads.len())
        )
    }

    /// The end of the summary: threads, length, lost samples, truncated stacks and why.
    fn summary_tail(&self, threads: usize) -> String {
        let p = &self.profile;
        format!(
            " from {threads} thread{} in {:.2} s; {} lost, {} truncated stacks{}",
            if threads == 1 { "" } else { "s" },
            p.meta.duration_ns as f64 / 1e9,
            p.meta.lost_samples,
            p.meta.truncated_stacks,
            match p.meta.truncation_reasons() {
                r if r.is_empty() => String::new(),
                r => format!(" ({r})"),
            }
        )
    }
}

impl Recorded {
    /// [`Recorded::summary`] of a recording of `-e` events: each one's samples, and the
    /// occurrences they stand for where it is counted.
    fn summary_of_events(&self, threads: usize) -> String {
        let p = &self.profile;
        let events = p.meta.event_list();
        let mut samples = vec![0u64; events.len()];
        let mut weight = vec![0u64; events.len()];
        for s in &p.samples {
            if let Some(n) = samples.get_mut(s.event as usize) {
                *n += 1;
                weight[s.event as usize] = weight[s.event as usize].saturating_add(s.weight);
            }
        }
        let each: Vec<String> = events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                if e.counted {
                    format!("{} of {} ({} events)", samples[i], e.name, weight[i])
                } else {
                    format!("{} of {} at {} Hz", samples[i], e.name, p.meta.frequency)
                }
            })
            .collect();
        format!(
            "superprof: samples {}{}{}",
            each.join(", "),
            if self.kernel { "" } else { ", user space only" },
            self.summary_tail(threads)
        )
    }
}

/// Which sampler `record` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplerKind {
    /// perf_event_open (per task, or per CPU in a cgroup of the command's own as root).
    Perf,
    /// The ptrace sampler (where perf_event_open is denied: containers).
    Ptrace,
    /// perf_event_open, or ptrace with a notice when perf_event_open is refused.
    Auto,
}

/// The start of a recording on both clocks: sample times are kernel CLOCK_MONOTONIC stamps,
/// stored relative to this start, which the profile also keeps as Unix time.
#[derive(Debug, Clone, Copy)]
struct Clock {
    monotonic_ns: u64,
    unix_ns: u64,
}

impl Clock {
    fn now() -> Clock {
        Clock {
            monotonic_ns: superprof_sample::monotonic_ns(),
            unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        }
    }
}

/// A command line as text, for a profile's metadata and messages (bytes that are not UTF-8
/// shown as U+FFFD; the command itself is run with its own bytes).
pub fn lossy(command: &[std::ffi::OsString]) -> Vec<String> {
    command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// What a sampler loop reports.
struct LoopResult {
    exit: Option<ExitStatus>,
    event: String,
    /// The events of `record -e` (empty: one event of CPU time, `event`).
    events: Vec<superprof_profile::EventInfo>,
    kernel: bool,
    /// The frequency sampled at (lower than asked when the kernel's maximum was).
    frequency: u32,
    /// How off-CPU time was recorded, if it was.
    off_cpu: Option<&'static str>,
    /// The CPUs sampled.
    cpus: u32,
}

/// Record's progress line: samples, threads and lost records so far.
struct Progress {
    line: superprof_resolve::progress::Progress,
}

impl Progress {
    fn new(cfg: &RecordConfig) -> Progress {
        Progress {
            line: superprof_resolve::progress::Progress::new(cfg.progress),
        }
    }

    fn update(&mut self, collector: &Collector) {
        self.line.update(|| {
            format!(
                "{} samples, {} threads, {} lost",
                collector.sample_count(),
                collector.thread_count(),
                collector.lost
            )
        });
    }

    fn clear(&mut self) {
        self.line.clear();
    }

    /// Ctrl-C, or the end of --duration.
    fn should_stop(&self, cfg: &RecordConfig) -> bool {
        (cfg.stop)() || cfg.duration.is_some_and(|d| self.line.elapsed() >= d)
    }
}

/// Runs the sampler until the target ends, the duration passes or Ctrl-C.
pub fn record(cfg: &RecordConfig) -> Result<Recorded> {
    record_with(cfg, None, None)
}

/// [`record`] of a launched command (or a process, `-p`) under the coordinator (ptrace),
/// with `beside` handling the tracer's events while perf_event_open samples it (`record
/// --precise`). An attached process is let go at the end, its code as it was.
pub fn record_beside(cfg: &RecordConfig, beside: &mut dyn Beside) -> Result<Recorded> {
    if !matches!(cfg.target, Target::Command(_) | Target::Pid(_)) {
        return Err(Error::Invalid(
            "counting beside the samples follows a launched command or a process (-p), not a \
             thread or the machine"
                .into(),
        ));
    }
    if cfg.sampler_kind == SamplerKind::Ptrace {
        return Err(Error::Invalid(
            "counting beside the samples needs perf_event_open's sampling (not --sampler \
             ptrace): ptrace is the counters' already"
                .into(),
        ));
    }
    record_with(cfg, None, Some(beside))
}

/// A live view's share of a recording (`superprof top`): every `every`, the samples of that
/// interval, symbolized, go to `show`; it returns false to stop.
pub struct Live<'a> {
    /// How often `show` is called.
    pub every: Duration,
    /// Gets each interval's profile (its samples only); false stops the recording.
    pub show: &'a mut dyn FnMut(Profile) -> bool,
}

/// [`record`], handing each interval's samples to `live` as they come (perf_event_open only:
/// the ptrace sampler is refused). The profile returned holds what came after the last
/// interval.
pub fn record_live(cfg: &RecordConfig, live: Live) -> Result<Recorded> {
    if cfg.sampler_kind == SamplerKind::Ptrace {
        return Err(Error::Invalid(
            "a live view needs perf_event_open (not --sampler ptrace)".into(),
        ));
    }
    record_with(cfg, Some(live), None)
}

fn record_with(
    cfg: &RecordConfig,
    live: Option<Live>,
    beside: Option<&mut dyn Beside>,
) -> Result<Recorded> {
    // Per-task and cgroup events (not the per-CPU ones of `-a`) first wait out a grace
    // period when none is open on the machine: begin it while the rest gets ready.
    if cfg.sampler_kind != SamplerKind::Ptrace && !matches!(cfg.target, Target::System { .. }) {
        superprof_sample::warm_up_task_events();
    }
    if cfg.sampler.off_cpu {
        if let Some(e) = cfg
            .sampler
            .events
            .iter()
            .find(|e| !superprof_sample::is_time_event(e))
        {
            return Err(Error::Invalid(format!(
                "--off-cpu adds time off the CPU to CPU time: it cannot go with {}, which is \
                 not time (sample cpu-clock, or leave -e out)",
                e.name
            )));
        }
    }
    let mut collector = Collector::default();
    let mut started = start(cfg, &mut collector, beside.as_ref().map(|b| b.options()))?;
    let mut progress = Progress::new(cfg);
    // The CPU time of what is profiled: a launched command's tree through the children's
    // rusage once it is waited for; an attached process through /proc.
    // The whole machine (`-a`): the time of its CPUs sampled, idle or not (the clock samples
    // the idle task too), set below.
    let (pid, launched) = (started.pid, started.launched);
    let system = started.system;
    // One thread (`-t`): its own time.
    let thread = match cfg.target {
        Target::Thread(tid) => Some((superprof_trace::tgid_of(tid).unwrap_or(tid), tid)),
        _ => None,
    };
    let cpu_now = move || match pid {
        _ if system => None,
        _ if launched => Some(superprof_trace::children_cpu_time()),
        Some(_) if thread.is_some() => {
            thread.and_then(|(p, t)| superprof_trace::thread_cpu_time(p, t))
        }
        Some(pid) => superprof_trace::process_tree_cpu_time(pid),
        None => None,
    };
    let cpu_before = cpu_now();
    let result = match started.source {
        Source::Perf(sampler) => perf::run(
            cfg,
            *sampler,
            started.pid,
            started.launched,
            &mut collector,
            &mut progress,
            live,
            match (started.tracer.take(), beside) {
                (Some(tracer), Some(beside)) => Some(perf::Traced {
                    tracer,
                    beside,
                    start_ns: started.clock.monotonic_ns,
                }),
                _ => None,
            },
        )?,
        Source::Ptrace(_) if live.is_some() => {
            return Err(Error::Invalid(
                "perf_event_open is refused here, and a live view needs it".into(),
            ))
        }
        Source::Ptrace(tracer) => {
            if cfg.sampler.frequency == 0 {
                return Err(Error::Invalid("frequency must be at least 1 Hz".into()));
            }
            ptrace::run(
                cfg,
                *tracer,
                started.launched,
                &mut collector,
                &mut progress,
            )?
        }
    };
    progress.clear();
    let ended_ns = superprof_sample::monotonic_ns();
    // The tree has ended (or was ended): its cgroup goes.
    let per_cpu = started.cgroup.is_some();
    drop(started.cgroup);
    let mut profile = Profile::default();
    // The CPU time samples could come from: user time alone where kernel samples are left
    // out (an ordinary user, the ptrace sampler).
    profile.meta.cpu_time_ns = match (cpu_before, cpu_now()) {
        (Some((u0, s0)), Some((u1, s1))) => {
            let user = u1.saturating_sub(u0);
            let system = if result.kernel {
                s1.saturating_sub(s0)
            } else {
                Default::default()
            };
            (user + system).as_nanos() as u64
        }
        _ => 0,
    };
    if started.system {
        profile.meta.cpu_time_ns = ended_ns
            .saturating_sub(started.clock.monotonic_ns)
            .saturating_mul(u64::from(result.cpus));
    }
    profile.meta.command = started.command;
    profile.meta.event = if per_cpu {
        format!("{} (per CPU)", result.event)
    } else {
        result.event.clone()
    };
    profile.meta.frequency = result.frequency;
    profile.meta.events = result.events;
    profile.meta.off_cpu = result.off_cpu.unwrap_or_default().to_owned();
    profile.meta.start_time_unix_ns = started.clock.unix_ns;
    // From the recording's start (before the command's exec: its first samples and waits
    // can come before the loop starts, by as long as the setup took) to its end.
    profile.meta.duration_ns = ended_ns.saturating_sub(started.clock.monotonic_ns);
    superprof_resolve::stamp(&mut profile.meta);
    // An attached JVM's compiled methods, named by the map it writes when asked (a launched
    // one writes it at exit: see `runtime`).
    if let Some(pid) = pid.filter(|&p| started.java && superprof_trace::process_alive(p)) {
        if runtime::java_perf_map(pid) {
            // (Named at the end, below.)
        } else {
            superprof_unwind::say!(
                "superprof: the JVM did not write its perf map (jcmd {pid} Compiler.perfmap): its \
             compiled methods stay unnamed"
            );
        }
    }
    let profile = collector.finish(profile, started.clock.monotonic_ns);
    // Per task, a timer starts again in every new task: a tree of short ones goes partly
    // unseen. Say how much, where the rate tells (perf's cpu-clock keeps its rate per task).
    let cpu_s = profile.meta.cpu_time_ns as f64 / 1e9;
    let seen = profile.on_cpu_samples() as f64 / (cpu_s * f64::from(result.frequency.max(1)));
    if launched
        && !per_cpu
        && !started.system
        && result.event.starts_with("cpu-clock")
        && cpu_s > 0.05
        && seen < 0.8
    {
        superprof_unwind::say!(
            "superprof: the samples cover {:.0}% of the {cpu_s:.2} s of {}CPU time the command's \
             processes used: tasks shorter than a sampling period are not seen when sampling per \
             task (as root, superprof samples the command per CPU, in a cgroup of its own)",
            100.0 * seen.min(1.0),
            if result.kernel { "" } else { "user " }
        );
    }
    Ok(Recorded {
        profile,
        exit: result.exit,
        kernel: result.kernel,
    })
}
