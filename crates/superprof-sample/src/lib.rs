//! superprof-sample: the perf_event sampler.
//!
//! It opens a sampling event (hardware `cycles` where the PMU has it, else the `cpu-clock`
//! software event) for every thread of a process, reads the kernel's ring buffers and parses
//! their records: samples with user registers and a copy of the user stack, plus the
//! mmap / comm / fork / exit records that let the caller track modules and threads.
//! It does no unwinding or symbolization: callers turn [`SampleRecord`]s into stacks.
//!
//! - [`PerfSampler`] opens the sampling events and drains their rings; [`split_records`] and
//!   [`parse_record`] turn the bytes into [`Record`]s.
//! - [`Counter`] counts one event ([`EventSpec`]: hardware, software, cache, tracepoint or
//!   raw) on one thread, as `perf stat` does.
//! - [`ProbeGroup`] and [`UprobeCounter`] put uprobes on instructions of a file and report
//!   each hit with a snapshot of counters, or only count hits, without stopping the program;
//!   [`ProbeDefinitions`] keeps their tracefs definitions.
//!
//! ```no_run
//! use superprof_sample::{PerfSampler, SamplerConfig, TargetMode, parse_record, split_records};
//! let mut sampler = PerfSampler::open(1234, TargetMode::Attached, &SamplerConfig::default())?;
//! sampler.enable()?;
//! let mut buf = Vec::new();
//! sampler.wait(&[], 100);
//! sampler.drain(&mut buf);
//! for (ty, misc, body) in split_records(&buf) {
//!     let _record = parse_record(ty, misc, body, sampler.layout());
//! }
//! # Ok::<(), superprof_sample::SampleError>(())
//! ```

#![deny(missing_docs)]

mod cgroup;
mod counter;
mod pump;
mod record;
mod sampler;
mod sys;
mod uprobe;

pub use cgroup::Cgroup;
pub use counter::{probe, Counter, EventKind, EventSpec, Reading};
pub use record::{cut_size, parse_record, split_records, stack_cut, Layout, Record, SampleRecord};
pub use sampler::{
    is_time_event, list_threads, max_sample_rate, online_cpus, parse_cpu_list, PerfSampler,
    RingsAhead, SampleError, SamplerConfig, TargetMode,
};
pub use sys::{euid, monotonic_ns, raise_fd_limit, vdso_image, warm_up_task_events};

/// Whether a superprof runs as process `pid` (its command name): what a sweep of the
/// leftovers of killed superprofs (tracefs probe definitions, cgroups) asks of the pid in
/// their names, a pid reused since by another program counting as gone.
pub fn superprof_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "superprof")
}
pub use uprobe::{
    uprobe_pmu, ProbeDefinitions, ProbeError, ProbeEvent, ProbeGroup, ProbeHit, ProbeSpec,
    UprobeCounter, UprobePmu,
};
