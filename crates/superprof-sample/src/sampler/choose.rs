//! Choosing the events to open: the best CPU-time event these rights allow, the events of
//! `record -e` (each sample's period and weight), the context-switch event of off-CPU time.

use std::io;
use std::os::fd::OwnedFd;

use superprof_unwind::UserRegs;

use super::*;
use crate::sys::{self, PerfEventAttr};

impl PerfSampler {
    /// Finds the best event this machine and these rights allow: hardware cycles, else the
    /// cpu-clock software event; kernel callchains, else user space only.
    pub(super) fn choose_attr(
        &mut self,
        pid: u32,
        mode: TargetMode,
        config: &SamplerConfig,
    ) -> Result<(), SampleError> {
        let probe_tid = probe_tid(pid, mode)?;
        self.choose_attr_with(
            pid,
            mode,
            config,
            &|attr, cpu| sys::perf_event_open(attr, probe_tid as i32, cpu),
            &|_| {},
        )
    }

    /// [`Self::choose_attr`], probing each candidate with `probe`, after `tweak`.
    pub(super) fn choose_attr_with(
        &mut self,
        pid: u32,
        mode: TargetMode,
        config: &SamplerConfig,
        probe: &dyn Fn(&PerfEventAttr, i32) -> io::Result<OwnedFd>,
        tweak: &dyn Fn(&mut PerfEventAttr),
    ) -> Result<(), SampleError> {
        if !config.events.is_empty() {
            return self.choose_events(pid, mode, config, probe, tweak);
        }
        let candidates = [
            (
                "cycles",
                sys::PERF_TYPE_HARDWARE,
                sys::PERF_COUNT_HW_CPU_CYCLES,
                true,
            ),
            (
                "cpu-clock",
                sys::PERF_TYPE_SOFTWARE,
                sys::PERF_COUNT_SW_CPU_CLOCK,
                true,
            ),
            (
                "cycles",
                sys::PERF_TYPE_HARDWARE,
                sys::PERF_COUNT_HW_CPU_CYCLES,
                false,
            ),
            (
                "cpu-clock",
                sys::PERF_TYPE_SOFTWARE,
                sys::PERF_COUNT_SW_CPU_CLOCK,
                false,
            ),
        ];
        let mut last_err = None;
        for (name, ty, cfg, kernel) in candidates {
            let counting = if ty == sys::PERF_TYPE_SOFTWARE {
                Counting::Time
            } else {
                Counting::CyclesAsTime
            };
            let mut attr = make_attr(ty, cfg, kernel, mode, config, counting);
            tweak(&mut attr);
            match probe(&attr, self.cpus[0] as i32) {
                Ok(first) => {
                    // Find the ring size these rights allow for every CPU at once (an
                    // unprivileged user is limited by perf_event_mlock_kb and RLIMIT_MEMLOCK),
                    // and wake up when a quarter of it is filled: a ring smaller than the
                    // others would never reach their watermark, and lose samples.
                    self.size_rings(first, &|cpu| probe(&attr, cpu as i32))?;
                    attr.wakeup_events_or_watermark = super::watermark(self.data_pages);
                    self.attr = attr;
                    self.event_name = name.into();
                    self.events = vec![(name.into(), false)];
                    self.kernel_stacks = kernel;
                    // A period of one's own (-c): the rate it makes, for the profile.
                    if let Some(c) = config.period {
                        let software = ty == sys::PERF_TYPE_SOFTWARE;
                        self.frequency = rate_of_period(software, c).unwrap_or(self.frequency);
                    }
                    return Ok(());
                }
                Err(e) => last_err = Some(fatal_probe_error(pid, e)?),
            }
        }
        let e = last_err.expect("at least one candidate was tried");
        match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => Err(SampleError::PermissionDenied {
                pid,
                why: permission_hint(),
            }),
            _ => Err(SampleError::Io {
                context: "perf_event_open".into(),
                source: e,
            }),
        }
    }

    /// Finds the context-switch event these rights allow: the sched:sched_switch tracepoint
    /// (root: tracefs gives its id), else the context-switches software event. Both sample the
    /// thread as it leaves the CPU, kernel frames included, and need kernel sampling: at
    /// perf_event_paranoid 2 an ordinary user has neither (the ptrace sampler's wall-clock
    /// mode stands in). PERF_RECORD_SWITCH records tell when the thread comes back, and
    /// whether it left preempted (still runnable: the tracepoint's prev_state R) or to wait.
    pub(super) fn choose_switch_attr(
        &mut self,
        pid: u32,
        mode: TargetMode,
    ) -> Result<(), SampleError> {
        let refused = |why: &str| SampleError::PermissionDenied {
            pid,
            why: format!(
                "off-CPU profiles with perf_event_open need kernel sampling ({why}); run as root, \
                 grant CAP_PERFMON, lower /proc/sys/kernel/perf_event_paranoid to 1, or use the \
                 ptrace sampler (--sampler ptrace)"
            ),
        };
        if !self.kernel_stacks {
            return Err(refused("only user space may be sampled here"));
        }
        let probe_tid = probe_tid(pid, mode)?;
        let mut candidates = Vec::new();
        if let Some(id) = sys::tracepoint_id("sched", "sched_switch") {
            candidates.push(("sched:sched_switch", sys::PERF_TYPE_TRACEPOINT, id));
        }
        candidates.push((
            "context-switches",
            sys::PERF_TYPE_SOFTWARE,
            sys::PERF_COUNT_SW_CONTEXT_SWITCHES,
        ));
        let mut last = None;
        for (name, ty, config) in candidates {
            let mut attr = self.attr;
            attr.type_ = ty;
            attr.config = config;
            attr.sample_period_or_freq = 1;
            attr.flags &= !sys::FLAG_FREQ;
            // Its own mmap/comm/task records would repeat the main event's.
            attr.flags &= !(sys::FLAG_MMAP
                | sys::FLAG_MMAP2
                | sys::FLAG_COMM
                | sys::FLAG_COMM_EXEC
                | sys::FLAG_TASK);
            attr.flags |= sys::FLAG_CONTEXT_SWITCH;
            match sys::perf_event_open(&attr, probe_tid as i32, self.cpus[0] as i32) {
                Ok(_) => {
                    self.switch = Some((attr, name));
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    return Err(SampleError::NoSuchProcess(pid))
                }
                Err(e) => last = Some(e),
            }
        }
        Err(refused(&last.map_or_else(String::new, |e| e.to_string())))
    }

    /// The events of `config.events`, each with kernel frames where its modifiers and the
    /// rights allow, probed with `probe` after `tweak`: the first sizes the rings.
    fn choose_events(
        &mut self,
        pid: u32,
        mode: TargetMode,
        config: &SamplerConfig,
        probe: &dyn Fn(&PerfEventAttr, i32) -> io::Result<OwnedFd>,
        tweak: &dyn Fn(&mut PerfEventAttr),
    ) -> Result<(), SampleError> {
        if config.events.len() > 256 {
            return Err(SampleError::Event {
                name: format!("{} events", config.events.len()),
                why: "at most 256 events may be sampled at once".into(),
            });
        }
        let mut attrs = Vec::new();
        for (k, spec) in config.events.iter().enumerate() {
            let modifiers = spec.exclude_user || spec.exclude_kernel || spec.exclude_hv;
            let kernels: &[bool] = if modifiers {
                &[!spec.exclude_kernel]
            } else {
                &[true, false]
            };
            let mut last = None;
            let mut chosen = None;
            for &kernel in kernels {
                let mut attr = make_attr(
                    spec.type_,
                    spec.config,
                    kernel,
                    mode,
                    config,
                    Counting::of(spec),
                );
                if modifiers {
                    // Exactly the privilege levels asked (`:h` alone is the hypervisor's).
                    attr.flags &=
                        !(sys::FLAG_EXCLUDE_USER | sys::FLAG_EXCLUDE_KERNEL | sys::FLAG_EXCLUDE_HV);
                }
                attr.flags |= spec.exclude_flags();
                if spec.exclude_kernel {
                    attr.flags |= sys::FLAG_EXCLUDE_CALLCHAIN_KERNEL;
                }
                if k > 0 {
                    // Its own mmap/comm/task records would repeat the first event's.
                    attr.flags &= !(sys::FLAG_MMAP
                        | sys::FLAG_MMAP2
                        | sys::FLAG_COMM
                        | sys::FLAG_COMM_EXEC
                        | sys::FLAG_TASK);
                }
                tweak(&mut attr);
                match probe(&attr, self.cpus[0] as i32) {
                    Ok(fd) => {
                        chosen = Some((attr, fd, kernel));
                        break;
                    }
                    Err(e) => last = Some(fatal_probe_error(pid, e)?),
                }
            }
            let Some((attr, fd, kernel)) = chosen else {
                let e = last.expect("at least one way was tried");
                let why = match e.raw_os_error() {
                    Some(libc::EACCES) | Some(libc::EPERM) => permission_hint(),
                    Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => format!(
                        "{e}: this machine or kernel does not have it (a virtual machine has no \
                         hardware PMU; `superprof stat --list` shows what can be counted)"
                    ),
                    _ => e.to_string(),
                };
                return Err(SampleError::Event {
                    name: spec.name.clone(),
                    why,
                });
            };
            if k == 0 {
                self.size_rings(fd, &|cpu| probe(&attr, cpu as i32))?;
                self.kernel_stacks = kernel;
            }
            attrs.push(attr);
        }
        let watermark = super::watermark(self.data_pages);
        for a in &mut attrs {
            a.wakeup_events_or_watermark = watermark;
        }
        self.attr = attrs.remove(0);
        self.extra = attrs;
        self.events = config
            .events
            .iter()
            .map(|e| (e.name.clone(), !is_time_event(e)))
            .collect();
        self.event_name = self
            .events
            .iter()
            .map(|e| e.0.as_str())
            .collect::<Vec<_>>()
            .join(",");
        // A first event of CPU time with a period of its own: the frequency it makes.
        if let (Some(c), Some(first)) = (config.period, config.events.first()) {
            if is_time_event(first) {
                self.frequency = rate_of_period(true, c).unwrap_or(self.frequency);
            }
        }
        Ok(())
    }
}

/// What a sample of an event stands for, which decides its period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counting {
    /// CPU time in nanoseconds (cpu-clock, task-clock).
    Time,
    /// The default `cycles`: CPU time, measured in cycles at this CPU's rate.
    CyclesAsTime,
    /// A tracepoint: every occurrence unless `-c` says otherwise.
    Tracepoint,
    /// Any other event of `-e`: occurrences, the kernel's frequency mode without `-c`.
    Counted,
}

impl Counting {
    fn of(spec: &crate::EventSpec) -> Counting {
        if is_time_event(spec) {
            Counting::Time
        } else if spec.type_ == sys::PERF_TYPE_TRACEPOINT {
            Counting::Tracepoint
        } else {
            Counting::Counted
        }
    }
}

/// The samples a second that a period of `c` of CPU time makes: nanoseconds of a clock
/// (`software`), or cycles at this CPU's rate (None where it cannot be measured).
fn rate_of_period(software: bool, c: u64) -> Option<u32> {
    let per_second = if software {
        1_000_000_000
    } else {
        cycles_per_second()?
    };
    Some((per_second / c.max(1)).clamp(1, u64::from(u32::MAX)) as u32)
}

fn make_attr(
    ty: u32,
    config: u64,
    kernel: bool,
    mode: TargetMode,
    cfg: &SamplerConfig,
    counting: Counting,
) -> PerfEventAttr {
    let mut flags = sys::FLAG_DISABLED
        | sys::FLAG_INHERIT
        | sys::FLAG_MMAP
        | sys::FLAG_MMAP2
        | sys::FLAG_COMM
        | sys::FLAG_COMM_EXEC
        | sys::FLAG_TASK
        | sys::FLAG_SAMPLE_ID_ALL
        | sys::FLAG_WATERMARK
        | sys::FLAG_USE_CLOCKID
        | sys::FLAG_EXCLUDE_CALLCHAIN_USER;
    // cpu-clock counts nanoseconds, so a fixed period gives the frequency exactly, with every
    // sample worth the same CPU time; frequency mode would start at a period of 1 ns and
    // take a burst of samples at exec. Cycles get a fixed period too, from this CPU's rate
    // measured once: in frequency mode the kernel gives each new thread's event a period of
    // its own that it adapts at each tick, so samples stood for different numbers of cycles
    // and a short-lived thread's got more than its share (in the arm64 guest, four threads'
    // main thread, 3% of the CPU time, had 10% of the samples; 4.8% with a fixed period).
    // Where the rate cannot be measured, frequency mode.
    // A counted event without -c is in the kernel's frequency mode: each sample weighs the
    // period the kernel gave it (PERF_SAMPLE_PERIOD), tracepoints every occurrence.
    let hz = u64::from(cfg.frequency.max(1));
    let period = match (cfg.period, counting) {
        // perf's -c: every c nanoseconds of a clock, c cycles, c occurrences.
        (Some(c), _) => c,
        (None, Counting::Time) => 1_000_000_000 / hz,
        (None, Counting::CyclesAsTime) if cycles_per_second().is_some() => {
            (cycles_per_second().unwrap_or(1) / hz).max(1)
        }
        (None, Counting::Tracepoint) => 1,
        (None, Counting::CyclesAsTime | Counting::Counted) => {
            flags |= sys::FLAG_FREQ;
            hz
        }
    };
    if mode == TargetMode::Launched {
        flags |= sys::FLAG_ENABLE_ON_EXEC;
    }
    if !kernel {
        flags |=
            sys::FLAG_EXCLUDE_KERNEL | sys::FLAG_EXCLUDE_HV | sys::FLAG_EXCLUDE_CALLCHAIN_KERNEL;
    }
    let mut sample_type = sys::PERF_SAMPLE_IDENTIFIER
        | sys::PERF_SAMPLE_TID
        | sys::PERF_SAMPLE_TIME
        | sys::PERF_SAMPLE_CPU
        | sys::PERF_SAMPLE_PERIOD
        | sys::PERF_SAMPLE_CALLCHAIN
        | sys::PERF_SAMPLE_REGS_USER
        | sys::PERF_SAMPLE_STACK_USER;
    // With a fixed period and PERIOD asked, the kernel samples every occurrence of a software
    // event (its period 1): with -c the field is left out (of every event: the records of
    // one ring share a layout), and a counted sample's weight is c.
    if cfg.period.is_some() {
        sample_type &= !sys::PERF_SAMPLE_PERIOD;
    }
    let mut stack_user = cfg.stack_size;
    if cfg.frame_pointers {
        // The kernel's walk of the user stack: in the callchain, after PERF_CONTEXT_USER.
        flags &= !sys::FLAG_EXCLUDE_CALLCHAIN_USER;
        sample_type &= !sys::PERF_SAMPLE_STACK_USER;
        stack_user = 0;
    }
    PerfEventAttr {
        type_: ty,
        config,
        sample_period_or_freq: period,
        sample_type,
        flags,
        sample_regs_user: UserRegs::PERF_REGS_MASK,
        sample_stack_user: stack_user,
        clockid: libc::CLOCK_MONOTONIC,
        sample_max_stack: 127,
        ..Default::default()
    }
}

/// A probe's error that ends the search (the target gone, no perf_event_open at all) as the
/// error to return; any other back, for the next way to be tried.
fn fatal_probe_error(pid: u32, e: io::Error) -> Result<io::Error, SampleError> {
    match e.raw_os_error() {
        Some(libc::ESRCH) => Err(SampleError::NoSuchProcess(pid)),
        Some(libc::ENOSYS) => Err(SampleError::Unsupported(e)),
        _ => Ok(e),
    }
}
