//! `superprof record`: run the perf sampler over a launched or attached process, feed the
//! collector, and write the outputs.

use std::io::{IsTerminal, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use superprof_profile::{OutputFormat, Profile};
use superprof_sample::{
    parse_record, split_records, PerfSampler, Record, SamplerConfig, TargetMode,
};

use crate::cli::RecordArgs;
use crate::collect::Collector;
use crate::sys::{self, ExitStatus, PendingChild};

#[derive(Debug, Clone)]
pub enum Target {
    Pid(u32),
    Command(Vec<String>),
}

#[derive(Debug, Clone)]
pub struct RecordConfig {
    pub sampler: SamplerConfig,
    /// Output files (none: superprof.parquet).
    pub outputs: Vec<PathBuf>,
    pub duration: Option<Duration>,
    pub quiet: bool,
    pub target: Target,
    /// Rows of the top table.
    pub top_rows: usize,
}

impl RecordConfig {
    pub fn from_args(a: RecordArgs) -> RecordConfig {
        RecordConfig {
            sampler: SamplerConfig {
                frequency: a.frequency,
                stack_size: a.stack_size,
            },
            outputs: a.outputs,
            duration: a.duration.map(|d| Duration::from_secs_f64(d.max(0.0))),
            quiet: a.quiet,
            target: match a.pid {
                Some(pid) => Target::Pid(pid),
                None => Target::Command(a.command),
            },
            top_rows: 30,
        }
    }
}

/// The recording's result, before outputs are written.
pub struct Recorded {
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
        format!(
            "superprof: {} samples ({} at {} Hz{}) from {} threads in {:.2} s; {} lost, {} truncated stacks",
            p.samples.len(),
            p.meta.event,
            p.meta.frequency,
            if self.kernel { "" } else { ", user space only" },
            threads.len(),
            p.meta.duration_ns as f64 / 1e9,
            p.meta.lost_samples,
            p.meta.truncated_stacks
        )
    }
}

/// Records, prints the table, writes the output; returns the exit code for superprof.
pub fn run(cfg: &RecordConfig) -> Result<i32> {
    let outputs = check_outputs(cfg)?;
    let recorded = record(cfg)?;
    show(cfg, &recorded, &outputs)?;
    Ok(recorded.exit.map_or(0, |e| e.shell_code()))
}

/// Prints the summary and the table, and writes the output files (from [`check_outputs`]).
pub fn show(
    cfg: &RecordConfig,
    recorded: &Recorded,
    outputs: &[(PathBuf, OutputFormat)],
) -> Result<()> {
    let profile = &recorded.profile;
    if profile.samples.is_empty() {
        bail!("no samples were taken: the target ran too briefly or was idle, so the profile is empty");
    }
    eprintln!("{}", recorded.summary());
    if !cfg.quiet {
        let stdout = std::io::stdout();
        let mut lock = stdout.lock();
        superprof_profile::top::write(profile, cfg.top_rows, &mut lock)?;
        lock.flush()?;
    }
    for (path, format) in outputs {
        write_output(profile, path, *format)?;
        eprintln!("superprof: wrote {}", path.display());
    }
    Ok(())
}

/// The default output of `record`: the native profile file.
pub const DEFAULT_OUTPUT: &str = "superprof.parquet";

/// Validates the output paths before anything runs, so a bad -o costs nothing.
pub fn check_outputs(cfg: &RecordConfig) -> Result<Vec<(PathBuf, OutputFormat)>> {
    let paths = if cfg.outputs.is_empty() {
        vec![PathBuf::from(DEFAULT_OUTPUT)]
    } else {
        cfg.outputs.clone()
    };
    paths
        .into_iter()
        .map(|path| {
            let format = OutputFormat::from_path(&path).ok_or_else(|| {
                anyhow!(
                    "cannot tell the format of output '{}': use one of the extensions {}",
                    path.display(),
                    OutputFormat::extensions()
                )
            })?;
            superprof_profile::output::check_writable(&path)
                .with_context(|| format!("cannot write output '{}'", path.display()))?;
            Ok((path, format))
        })
        .collect()
}

pub fn write_output(profile: &Profile, path: &std::path::Path, format: OutputFormat) -> Result<()> {
    let title = if profile.meta.command.is_empty() {
        "superprof".to_owned()
    } else {
        format!("superprof: {}", profile.meta.command.join(" "))
    };
    superprof_profile::write_atomic(path, |w| {
        superprof_profile::output::write(profile, format, &title, w)
    })
    .with_context(|| format!("cannot write '{}'", path.display()))
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

/// Runs the sampler until the target ends, the duration passes or Ctrl-C.
pub fn record(cfg: &RecordConfig) -> Result<Recorded> {
    sys::install_stop_handler();
    sys::raise_fd_limit();
    let mut collector = Collector::default();
    let (mut sampler, pid, child, command, clock) = match &cfg.target {
        Target::Command(cmd) => {
            let program = cmd
                .first()
                .ok_or_else(|| anyhow!("no command given after --"))?;
            let path = sys::resolve_command(program)
                .ok_or_else(|| anyhow!("cannot run '{program}': command not found"))?;
            let mut child = PendingChild::spawn(&path, cmd)
                .with_context(|| format!("cannot start '{program}'"))?;
            let sampler = match PerfSampler::open(child.pid, TargetMode::Launched, &cfg.sampler) {
                Ok(s) => s,
                Err(e) => {
                    child.abort();
                    return Err(e.into());
                }
            };
            let clock = Clock::now();
            child
                .release()
                .with_context(|| format!("cannot run '{program}'"))?;
            (sampler, child.pid, true, cmd.clone(), clock)
        }
        Target::Pid(pid) => {
            let pid = *pid;
            let sampler = PerfSampler::open(pid, TargetMode::Attached, &cfg.sampler)?;
            collector.read_proc(pid, superprof_sample::monotonic_ns());
            let clock = Clock::now();
            sampler.enable()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let command = cmdline
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            (sampler, pid, false, command, clock)
        }
    };
    if sampler.kernel_stacks() {
        collector.expect_kernel_frames();
    }
    let start = Instant::now();
    let progress = std::io::stderr().is_terminal() && !cfg.quiet;
    let mut last_progress = Instant::now();
    let layout = sampler.layout();
    let mut buf = Vec::with_capacity(1 << 20);
    let mut exit = None;
    let mut stopped_early = false;

    let mut drain = |sampler: &mut PerfSampler, collector: &mut Collector| {
        buf.clear();
        sampler.drain(&mut buf);
        let mut records: Vec<_> = split_records(&buf)
            .filter_map(|(ty, misc, body)| parse_record(ty, misc, body, layout))
            .filter(|r| match r {
                Record::Sample(s) => sampler.accept(s),
                _ => true,
            })
            .collect();
        // Buffers of different CPUs interleave in time; mmap records must precede the
        // samples that need them.
        records.sort_by_key(|r| r.time());
        for r in &records {
            collector.handle(r);
        }
    };

    // Wakes the loop as soon as the target exits, instead of at the next poll timeout.
    let pidfd = sys::pidfd_open(pid);
    let extra: Vec<i32> = pidfd.iter().map(|f| f.as_raw_fd()).collect();
    loop {
        sampler.wait(&extra, 50);
        drain(&mut sampler, &mut collector);
        if child {
            if let Some(status) = sys::try_wait(pid) {
                exit = Some(status);
                break;
            }
        } else if !sys::process_alive(pid) {
            break;
        }
        if sys::stop_requested() || cfg.duration.is_some_and(|d| start.elapsed() >= d) {
            stopped_early = true;
            break;
        }
        if progress && last_progress.elapsed() >= Duration::from_millis(250) {
            last_progress = Instant::now();
            eprint!(
                "\r\x1b[K[superprof] {:.1} s, {} samples, {} threads, {} lost",
                start.elapsed().as_secs_f64(),
                collector.sample_count(),
                collector.thread_count(),
                collector.lost
            );
        }
    }
    sampler.disable();
    drain(&mut sampler, &mut collector);
    let event = sampler.event_name();
    let kernel = sampler.kernel_stacks();
    drop(sampler); // closes every event: an attached process runs on untouched
    if progress {
        eprint!("\r\x1b[K");
    }
    if child && exit.is_none() {
        // Stopped by Ctrl-C or --duration: end the command as perf record does.
        if stopped_early {
            sys::kill(pid, libc::SIGTERM);
            exit = sys::wait_exit_timeout(pid, Duration::from_secs(5));
            if exit.is_none() {
                eprintln!("superprof: the command ignored SIGTERM for 5 s; sending SIGKILL");
                sys::kill(pid, libc::SIGKILL);
            }
        }
        if exit.is_none() {
            exit = Some(sys::wait_exit(pid)?);
        }
    }
    let elapsed = start.elapsed();
    let mut profile = Profile::default();
    profile.meta.command = command;
    profile.meta.event = event.to_owned();
    profile.meta.frequency = cfg.sampler.frequency;
    profile.meta.start_time_unix_ns = clock.unix_ns;
    profile.meta.duration_ns = elapsed.as_nanos() as u64;
    profile.meta.version = env!("CARGO_PKG_VERSION").to_owned();
    profile.meta.host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let profile = collector.finish(profile, clock.monotonic_ns);
    Ok(Recorded {
        profile,
        exit,
        kernel,
    })
}
