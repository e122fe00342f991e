//! Starting a recording: the target launched (in a cgroup of its own, per CPU, where it may
//! be), attached to, one of its threads, or the whole machine; the sampler chosen
//! (perf_event_open, or ptrace where that is refused), opened and enabled.

use super::*;
use superprof_sample::RingsAhead;

/// Where the samples come from, set up and started.
pub(crate) enum Source {
    Perf(Box<PerfSampler>),
    Ptrace(Box<Tracer>),
}

/// A started recording, before its loop runs.
pub(crate) struct Started {
    pub(crate) source: Source,
    /// The process (or thread) whose end ends the recording; None: the machine (`-a` with
    /// no command), until the duration or `stop`.
    pub(crate) pid: Option<u32>,
    /// The whole machine is sampled (`-a`).
    pub(crate) system: bool,
    pub(crate) launched: bool,
    pub(crate) command: Vec<String>,
    pub(crate) clock: Clock,
    /// The launched command's own cgroup, when it is sampled per CPU (removed when dropped,
    /// after the loop).
    pub(crate) cgroup: Option<superprof_sample::Cgroup>,
    /// An attached JVM, asked for its perf map at the end.
    pub(crate) java: bool,
    /// The launched command's tracer, where something counts beside the samples.
    pub(crate) tracer: Option<Box<Tracer>>,
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
    ahead: Option<RingsAhead>,
) -> Option<(PerfSampler, superprof_sample::Cgroup)> {
    let cg = cg?;
    if !placed {
        cg.add(pid).ok()?;
    }
    let sampler = PerfSampler::open_cgroup(&cg.fd, pid, &cfg.sampler, ahead).ok()?;
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
                tracer: None,
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
        tracer: None,
    })
}

/// Starts sampling `cfg`'s target: a launched command is released to exec once its sampler
/// runs. `traced`: the command is launched under the coordinator with these options
/// (something counts beside the samples; launched commands only).
pub(crate) fn start(
    cfg: &RecordConfig,
    collector: &mut Collector,
    traced: Option<TraceOptions>,
) -> Result<Started> {
    if traced.is_some() && !matches!(cfg.target, Target::Command(_) | Target::Pid(_)) {
        return Err(Error::Invalid(
            "counting beside the samples follows a launched command or a process (-p)".into(),
        ));
    }
    match &cfg.target {
        Target::System { cpus, command } => start_system(cfg, cpus.as_deref(), command, collector),
        Target::Command(cmd) => {
            let cg = command_cgroup(cfg);
            // Its rings are mapped while the command is forked (see RingsAhead).
            let ahead = cg.as_ref().and_then(|_| RingsAhead::start(&cfg.sampler));
            let (mut child, path, placed) = spawn_command(cfg, cmd, cg.as_ref())?;
            let first = &cmd[0];
            // Under the coordinator from before its exec, where something counts beside.
            let mut tracer = match traced.map(|opts| Tracer::launch(child.pid, opts)) {
                Some(Ok(t)) => Some(Box::new(t)),
                Some(Err(e)) => {
                    child.abort();
                    return Err(e.into());
                }
                None => None,
            };
            // A traced child may stop on a signal before its exec: the tracer handles it.
            let release = |child: &mut PendingChild, tracer: &mut Option<Box<Tracer>>| {
                match tracer {
                    Some(t) => child.release_with(|| t.pump()),
                    None => child.release(),
                }
                .map_err(|e| superprof_trace::CannotRun::exec(first, &path, &e))
            };
            if let Some((sampler, cg)) = open_cgroup_source(cfg, child.pid, cg, placed, ahead) {
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
                release(&mut child, &mut tracer)?;
                return Ok(Started {
                    source,
                    pid: Some(child.pid),
                    launched: true,
                    command: lossy(cmd),
                    clock,
                    cgroup: Some(cg),
                    java: false,
                    system: false,
                    tracer,
                });
            }
            let source = match open_source(cfg, child.pid, TargetMode::Launched) {
                // (The ptrace sampler is a tracer of its own: nothing counts beside it.)
                Ok(Source::Ptrace(_)) if tracer.is_some() => {
                    child.abort();
                    return Err(Error::Invalid(
                        "perf_event_open is refused here, and counting beside the samples \
                         needs it"
                            .into(),
                    ));
                }
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
                Source::Ptrace(t) => child
                    .release_with(|| t.pump())
                    .map_err(|e| superprof_trace::CannotRun::exec(first, &path, &e))?,
                Source::Perf(_) => release(&mut child, &mut tracer)?,
            }
            Ok(Started {
                source,
                pid: Some(child.pid),
                launched: true,
                command: lossy(cmd),
                clock,
                cgroup: None,
                java: false,
                system: false,
                tracer,
            })
        }
        Target::Thread(tid) => start_thread(cfg, *tid, collector),
        Target::Pid(pid) => {
            let pid = *pid;
            // Seized first, where something counts beside (the sampler follows its threads
            // either way).
            let tracer = traced
                .map(|opts| Tracer::attach(pid, opts).map(Box::new))
                .transpose()?;
            let source = open_source(cfg, pid, TargetMode::Attached)?;
            if tracer.is_some() && matches!(source, Source::Ptrace(_)) {
                return Err(Error::Invalid(
                    "perf_event_open is refused here, and counting beside the samples needs it"
                        .into(),
                ));
            }
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
                tracer,
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
        tracer: None,
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
