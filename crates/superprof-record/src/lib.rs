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
mod collect;
mod perf;
mod ptrace;
pub mod runtime;

use std::time::Duration;

use superprof_profile::Profile;
use superprof_sample::{PerfSampler, SampleError, SamplerConfig, TargetMode};
use superprof_trace::{ExitStatus, PendingChild, TraceOptions, Tracer};

use crate::collect::Collector;

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

/// Where the samples come from, set up and started.
enum Source {
    Perf(Box<PerfSampler>),
    Ptrace(Box<Tracer>),
}

/// A started recording, before its loop runs.
struct Started {
    source: Source,
    /// The process (or thread) whose end ends the recording; None: the machine (`-a` with
    /// no command), until the duration or `stop`.
    pid: Option<u32>,
    /// The whole machine is sampled (`-a`).
    system: bool,
    launched: bool,
    command: Vec<String>,
    clock: Clock,
    /// The launched command's own cgroup, when it is sampled per CPU (removed when dropped,
    /// after the loop).
    cgroup: Option<superprof_sample::Cgroup>,
    /// An attached JVM, asked for its perf map at the end.
    java: bool,
}

/// A cgroup of its own for a launched command to be sampled per CPU (see `cgroup`), where
/// one may be made (root, cgroup v2) and the command is sampled with perf_event_open.
fn command_cgroup(cfg: &RecordConfig) -> Option<superprof_sample::Cgroup> {
    // (Off-CPU time is sampled per task: a thread's switch back in is its own event's.)
    if cfg.sampler_kind == SamplerKind::Ptrace || cfg.sampler.off_cpu {
        return None;
    }
    superprof_sample::Cgroup::create()
}

/// Per-CPU sampling of a launched command's cgroup `cg` (`placed`: the command started in
/// it; else it is moved there now), where perf's cgroup events work; None otherwise (the
/// caller samples per task; the cgroup is dropped, the command back in superprof's).
fn open_cgroup_source(
    cfg: &RecordConfig,
    pid: u32,
    cg: Option<superprof_sample::Cgroup>,
    placed: bool,
) -> Option<(PerfSampler, superprof_sample::Cgroup)> {
    let cg = cg?;
    if !placed {
        cg.add(pid).ok()?;
    }
    let sampler = PerfSampler::open_cgroup(&cg.fd, pid, &cfg.sampler).ok()?;
    if let Some(notice) = sampler.throttle_notice() {
        superprof_unwind::say!("{notice}");
    }
    Some((sampler, cg))
}

/// Whether perf_event_open was refused in a way that ptrace can stand in for.
fn perf_denied(e: &SampleError) -> bool {
    matches!(
        e,
        SampleError::PermissionDenied { .. } | SampleError::Unsupported(_)
    )
}

/// Opens the sampler `cfg` asks for on `pid` (a launched child before exec, or a running
/// process). `auto` falls back to ptrace, with a notice, where perf_event_open is refused.
fn open_source(cfg: &RecordConfig, pid: u32, mode: TargetMode) -> Result<Source> {
    // The ptrace sampler samples CPU time at -F, with stack copies, and nothing else.
    let ptrace_refused = cfg
        .sampler
        .events
        .iter()
        .find(|e| !superprof_sample::is_time_event(e))
        .map(|e| {
            format!(
                "the ptrace sampler samples CPU time only, not {}: sample it with \
                 perf_event_open (--sampler perf)",
                e.name
            )
        })
        .or_else(|| {
            cfg.sampler.period.map(|_| {
                "the ptrace sampler samples at -F HZ, not every -c PERIOD: give -F, or \
                 sample with perf_event_open (--sampler perf)"
                    .to_owned()
            })
        })
        .or_else(|| {
            cfg.sampler.frame_pointers.then(|| {
                "the ptrace sampler copies stacks, it does not take the kernel's \
                 --call-graph fp: leave it out, or sample with perf_event_open"
                    .to_owned()
            })
        });
    let trace = || {
        let opts = TraceOptions {
            follow_forks: true,
            ..TraceOptions::default()
        };
        match mode {
            TargetMode::Launched => Tracer::launch(pid, opts),
            TargetMode::Attached => Tracer::attach(pid, opts),
        }
    };
    if cfg.sampler_kind == SamplerKind::Ptrace {
        if let Some(why) = ptrace_refused {
            return Err(Error::Invalid(why));
        }
        return Ok(Source::Ptrace(Box::new(trace()?)));
    }
    match PerfSampler::open(pid, mode, &cfg.sampler) {
        Ok(s) => {
            if let Some(notice) = s.throttle_notice() {
                superprof_unwind::say!("{notice}");
            }
            // Root without tracefs gets context switches, which do not tell a preempted
            // thread from a waiting one: say how to get the tracepoint.
            if s.off_cpu_event() == Some("context-switches")
                && superprof_sample::euid() == 0
                && !std::path::Path::new("/sys/kernel/tracing/events").exists()
            {
                superprof_unwind::say!(
                    "superprof: tracefs is not mounted, so off-CPU time comes from context \
                     switches (a thread preempted is not told from one waiting); for the \
                     sched:sched_switch tracepoint: mount -t tracefs nodev /sys/kernel/tracing"
                );
            }
            Ok(Source::Perf(Box::new(s)))
        }
        Err(e) if cfg.sampler_kind == SamplerKind::Auto && perf_denied(&e) => {
            if let Some(why) = ptrace_refused {
                return Err(Error::Invalid(format!("{e}; and {why}")));
            }
            fallback_to_ptrace(cfg, e, trace)
        }
        Err(e) => Err(e.into()),
    }
}

/// The ptrace sampler where perf_event_open was refused (`e`), with a notice.
fn fallback_to_ptrace(
    cfg: &RecordConfig,
    e: SampleError,
    trace: impl FnOnce() -> std::result::Result<Tracer, superprof_trace::TraceError>,
) -> Result<Source> {
    match trace() {
        Ok(t) => {
            if cfg.sampler.off_cpu {
                superprof_unwind::say!(
                    "superprof: off-CPU time cannot be sampled with perf_event_open here \
                         ({e}); sampling with ptrace in wall-clock mode instead"
                );
            } else {
                superprof_unwind::say!(
                    "superprof: perf_event_open is not available ({e}); sampling with \
                         ptrace instead"
                );
            }
            Ok(Source::Ptrace(Box::new(t)))
        }
        Err(te) => Err(Error::Invalid(format!(
            "{e}; the ptrace sampler cannot stand in: {te}"
        ))),
    }
}

/// A command, forked and waiting for its release to exec (with the runtime setup `cfg`
/// asks for), in cgroup `cg` where the kernel can start it there: the child, the program's
/// path, and whether it is in `cg`.
fn spawn_command(
    cfg: &RecordConfig,
    cmd: &[std::ffi::OsString],
    cg: Option<&superprof_sample::Cgroup>,
) -> Result<(PendingChild, std::path::PathBuf, bool)> {
    let first = cmd
        .first()
        .ok_or_else(|| Error::Invalid("no command given after --".into()))?;
    let program = first.to_string_lossy();
    let path = superprof_trace::resolve_command(first)
        .ok_or_else(|| superprof_trace::CannotRun::not_found(first))?;
    let setup = if cfg.runtime_setup {
        runtime::setup(&path, cmd, |k| std::env::var_os(k))
    } else {
        runtime::Setup {
            command: cmd.to_vec(),
            ..runtime::Setup::default()
        }
    };
    if let Some(notice) = &setup.notice {
        superprof_unwind::say!("{notice}");
    }
    use std::os::fd::AsFd;
    let (child, placed) =
        PendingChild::spawn_into(&path, &setup.command, &setup.env, cg.map(|c| c.fd.as_fd()))
            .map_err(|e| Error::from(e).while_(format!("cannot start '{program}'")))?;
    Ok((child, path, placed))
}

/// Starts sampling the whole machine (on `cpus`), and `command` if one is given.
fn start_system(
    cfg: &RecordConfig,
    cpus: Option<&[u32]>,
    command: &[std::ffi::OsString],
    collector: &mut Collector,
) -> Result<Started> {
    if cfg.sampler_kind == SamplerKind::Ptrace {
        return Err(Error::Invalid(
            "the ptrace sampler follows processes, not the machine: -a needs perf_event_open"
                .into(),
        ));
    }
    if cfg.sampler.off_cpu {
        return Err(Error::Invalid(
            "--off-cpu follows threads: it cannot go with -a or -C".into(),
        ));
    }
    let sampler = PerfSampler::open_system_on(&cfg.sampler, cpus)?;
    if let Some(notice) = sampler.throttle_notice() {
        superprof_unwind::say!("{notice}");
    }
    let (pid, launched, command) = match command.first() {
        Some(first) => {
            let (mut child, path, _) = spawn_command(cfg, command, None)?;
            let clock = Clock::now();
            if let Err(e) = sampler.enable() {
                child.abort();
                return Err(e.into());
            }
            let pid = child.pid;
            child
                .release()
                .map_err(|e| superprof_trace::CannotRun::exec(first, &path, &e))?;
            return Ok(Started {
                source: Source::Perf(Box::new(sampler)),
                pid: Some(pid),
                launched: true,
                command: lossy(command),
                clock,
                cgroup: None,
                java: false,
                system: true,
            });
        }
        None => (None, false, Vec::new()),
    };
    let clock = Clock::now();
    sampler.enable()?;
    let _ = collector;
    Ok(Started {
        source: Source::Perf(Box::new(sampler)),
        pid,
        launched,
        command,
        clock,
        cgroup: None,
        java: false,
        system: true,
    })
}

/// Starts sampling `cfg`'s target: a launched command is released to exec once its sampler runs.
fn start(cfg: &RecordConfig, collector: &mut Collector) -> Result<Started> {
    match &cfg.target {
        Target::System { cpus, command } => start_system(cfg, cpus.as_deref(), command, collector),
        Target::Command(cmd) => {
            let cg = command_cgroup(cfg);
            let (mut child, path, placed) = spawn_command(cfg, cmd, cg.as_ref())?;
            let first = &cmd[0];
            if let Some((sampler, cg)) = open_cgroup_source(cfg, child.pid, cg, placed) {
                // The kernel's symbols load while the command runs.
                if sampler.kernel_stacks() {
                    collector.expect_kernel_frames();
                }
                let clock = Clock::now();
                // Samples of the child before its exec are superprof's code: not kept.
                collector.await_exec(child.pid);
                if let Err(e) = sampler.enable() {
                    // The command never starts (as when the events cannot be opened).
                    child.abort();
                    return Err(e.into());
                }
                let source = Source::Perf(Box::new(sampler));
                child
                    .release()
                    .map_err(|e| superprof_trace::CannotRun::exec(first, &path, &e))?;
                return Ok(Started {
                    source,
                    pid: Some(child.pid),
                    launched: true,
                    command: lossy(cmd),
                    clock,
                    cgroup: Some(cg),
                    java: false,
                    system: false,
                });
            }
            let source = match open_source(cfg, child.pid, TargetMode::Launched) {
                Ok(s) => s,
                Err(e) => {
                    child.abort();
                    return Err(e);
                }
            };
            let mut source = source;
            if let Source::Perf(s) = &source {
                if s.kernel_stacks() {
                    collector.expect_kernel_frames();
                }
            }
            let clock = Clock::now();
            match &mut source {
                // A traced child may stop on a signal before its exec: the tracer handles it.
                Source::Ptrace(tracer) => child.release_with(|| tracer.pump()),
                Source::Perf(_) => child.release(),
            }
            .map_err(|e| superprof_trace::CannotRun::exec(first, &path, &e))?;
            Ok(Started {
                source,
                pid: Some(child.pid),
                launched: true,
                command: lossy(cmd),
                clock,
                cgroup: None,
                java: false,
                system: false,
            })
        }
        Target::Thread(tid) => start_thread(cfg, *tid, collector),
        Target::Pid(pid) => {
            let pid = *pid;
            let source = open_source(cfg, pid, TargetMode::Attached)?;
            collector.read_proc(pid, superprof_sample::monotonic_ns());
            let clock = Clock::now();
            if let Source::Perf(s) = &source {
                s.enable()?;
                if s.off_cpu_event().is_some() {
                    waits_under_way(collector, pid, None, cfg.sampler.stack_size);
                }
            }
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if cfg.runtime_setup {
                let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                if let Some(hint) = runtime::attach_hint(&exe, &cmdline, &environ) {
                    superprof_unwind::say!("{hint}");
                }
            }
            let command = cmdline
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Ok(Started {
                source,
                pid: Some(pid),
                launched: false,
                command,
                clock,
                cgroup: None,
                java: cfg.runtime_setup
                    && runtime::Runtime::of_program(&exe) == Some(runtime::Runtime::Java),
                system: false,
            })
        }
    }
}

/// Starts sampling thread `tid` (and the threads it starts) of a running process.
fn start_thread(cfg: &RecordConfig, tid: u32, collector: &mut Collector) -> Result<Started> {
    if cfg.sampler_kind == SamplerKind::Ptrace {
        return Err(Error::Invalid(
            "the ptrace sampler follows whole processes: -t needs perf_event_open".into(),
        ));
    }
    let sampler = PerfSampler::open_thread_only(tid, &cfg.sampler)?;
    let pid = superprof_trace::tgid_of(tid).unwrap_or(tid);
    collector.read_proc(pid, superprof_sample::monotonic_ns());
    let clock = Clock::now();
    sampler.enable()?;
    if sampler.off_cpu_event().is_some() {
        waits_under_way(collector, pid, Some(tid), cfg.sampler.stack_size);
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    Ok(Started {
        source: Source::Perf(Box::new(sampler)),
        pid: Some(tid),
        launched: false,
        command: cmdline
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
        clock,
        cgroup: None,
        java: false,
        system: false,
    })
}

/// The threads of an attached process that wait already (no switch out is to come for those
/// waits): their waits open now, where /proc says they are (user frames: pc and stack
/// pointer, with the stack read now).
fn waits_under_way(collector: &mut Collector, pid: u32, only: Option<u32>, stack_size: u32) {
    let mut stack = vec![0u8; stack_size as usize];
    for (tid, b) in superprof_trace::blocked::waiting_threads(pid) {
        // (`-t`: the other threads' waits are not followed, and would never end.)
        if only.is_some_and(|t| t != tid) {
            continue;
        }
        let n = superprof_trace::read_memory(pid, b.sp, &mut stack);
        let record = superprof_sample::SampleRecord {
            id: 0,
            time: superprof_sample::monotonic_ns(),
            pid,
            tid,
            cpu: 0,
            period: 0,
            kernel_ips: Vec::new(),
            user_ips: Vec::new(),
            regs: Some(superprof_unwind::UserRegs::at(b.pc, b.sp)),
            stack: &stack[..n],
            stack_full: n == stack.len(),
        };
        collector.off_cpu_already(&record, b.syscall);
    }
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
    record_with(cfg, None)
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
    record_with(cfg, Some(live))
}

fn record_with(cfg: &RecordConfig, live: Option<Live>) -> Result<Recorded> {
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
    let started = start(cfg, &mut collector)?;
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
