//! Opening the sampling events for a process and reading their ring buffers.
//!
//! One event per (thread, CPU) with `inherit`, so threads created later are sampled too; all the
//! events of one CPU write into one ring buffer (`SET_OUTPUT`). The kernel refuses to mmap an
//! inherited per-task event with cpu = -1, which is why events are per CPU.

mod ahead;
mod choose;

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use crate::pump::{Pump, Rings};
use crate::record::Layout;
use crate::sys::{self, PerfEventAttr, RingMap};

pub use ahead::RingsAhead;

/// How the target is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetMode {
    /// A child that superprof forked and that has not called exec yet: counting starts at exec.
    Launched,
    /// A running process: every existing thread is followed, and the threads they start.
    Attached,
}

/// What to sample, and how often.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Samples per second of each thread's CPU time (lowered to the kernel's maximum): a
    /// fixed period of 1e9 / frequency ns with `cpu-clock`, a period the kernel adapts with
    /// `cycles`. At least 1.
    pub frequency: u32,
    /// Bytes of user stack copied with each sample, from the stack pointer up: a multiple of
    /// 8, from 8 to 65528.
    pub stack_size: u32,
    /// Also sample every context switch out of the target's threads, with stacks, and
    /// record PERF_RECORD_SWITCH records: off-CPU time (needs kernel sampling: root, or
    /// perf_event_paranoid at most 1).
    pub off_cpu: bool,
    /// The events to sample (perf's `-e`), each into the same rings; empty: CPU time, by
    /// `cycles` where the PMU counts them, else `cpu-clock`. An event without perf's
    /// `:u`/`:k` modifiers samples the kernel too where the rights allow it.
    pub events: Vec<crate::EventSpec>,
    /// A fixed period for `events` (perf's `-c`): a sample every this many occurrences
    /// (nanoseconds for cpu-clock and task-clock). None: `frequency` (tracepoints: every
    /// occurrence).
    pub period: Option<u64>,
    /// perf's `--call-graph fp`: the kernel walks the user stack by frame pointers, and no
    /// stack is copied (code built without frame pointers loses its callers).
    pub frame_pointers: bool,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            frequency: 999,
            stack_size: 32 * 1024,
            off_cpu: false,
            events: Vec::new(),
            period: None,
            frame_pointers: false,
        }
    }
}

/// Whether an event's samples are CPU time (cpu-clock, task-clock: each sample a period of
/// 1 s / frequency), not occurrences of the event counted by their periods.
pub fn is_time_event(spec: &crate::EventSpec) -> bool {
    spec.type_ == sys::PERF_TYPE_SOFTWARE
        && (spec.config == sys::PERF_COUNT_SW_CPU_CLOCK
            || spec.config == sys::PERF_COUNT_SW_TASK_CLOCK)
}

/// Why the events could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// The process or thread with this id (a pid, or the tid of one of its threads) does not
    /// exist, or ended meanwhile.
    #[error("no process or thread {0}")]
    NoSuchProcess(u32),
    /// The kernel refused the events (EACCES, EPERM), or allows user space only where kernel
    /// sampling was needed (off-CPU time).
    #[error("permission denied sampling pid {pid}: {why}")]
    PermissionDenied {
        /// The process (or thread) refused.
        pid: u32,
        /// The kernel's error and what to change (perf_event_paranoid, capabilities).
        why: String,
    },
    /// [`SamplerConfig::frequency`] was 0.
    #[error("frequency must be at least 1 Hz")]
    ZeroFrequency,
    /// [`SamplerConfig::period`] was 0.
    #[error("the period must be at least 1")]
    ZeroPeriod,
    /// An event of [`SamplerConfig::events`] cannot be sampled here.
    #[error("cannot sample {name}: {why}")]
    Event {
        /// The event, as given.
        name: String,
        /// The kernel's refusal, and what to do.
        why: String,
    },
    /// [`SamplerConfig::stack_size`] was 0, not a multiple of 8, or over 65528.
    #[error("stack size {0} is out of range: give a multiple of 8 between 8 and 65528 bytes")]
    BadStackSize(u32),
    /// perf_event_open does not exist here (ENOSYS).
    #[error("perf_event_open is not available on this kernel ({0})")]
    Unsupported(io::Error),
    /// Another system error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> SampleError {
    let context = context.into();
    move |source| SampleError::Io { context, source }
}

/// The open events of one recording. Dropping it closes every event: the target runs on as if
/// it had never been sampled.
pub struct PerfSampler {
    attr: PerfEventAttr,
    cpus: Vec<u32>,
    /// The fds that own the ring buffers, one per CPU (their maps are in `buffers`, in the
    /// same order).
    rings: Vec<OwnedFd>,
    /// The ring buffers' maps, shared with the pump that empties them.
    buffers: Arc<Mutex<Rings>>,
    /// Started at the first wait or drain.
    pump: Option<Pump>,
    /// Every other event, redirected into the ring of its CPU.
    others: Vec<OwnedFd>,
    threads: BTreeSet<u32>,
    data_pages: usize,
    /// Ring fds whose owning task exited: left out of poll, which would report them forever.
    hung_up: Vec<bool>,
    /// The event id accepted for each (tid, cpu); see [`PerfSampler::accept`].
    owner: std::collections::HashMap<(u32, u32, u16), u64>,
    event_name: String,
    /// The events after the first one of `record -e A,B` (opened beside it, into its ring).
    extra: Vec<PerfEventAttr>,
    /// Each event's name, and whether its samples count occurrences (not CPU time).
    events: Vec<(String, bool)>,
    /// The event index of each event id, where several events are sampled.
    event_ids: std::collections::HashMap<u64, u8>,
    kernel_stacks: bool,
    /// The frequency asked for, when the kernel's maximum was lower (see [`throttle`]).
    asked_frequency: Option<u32>,
    frequency: u32,
    /// The context-switch event (off-CPU time), when asked for: its attributes and name.
    switch: Option<(PerfEventAttr, &'static str)>,
    /// Every ring was mapped ahead (see [`RingsAhead`]).
    rings_ahead: bool,
    /// The ids of the context-switch events (an inherited event reports its parent's).
    switch_ids: std::collections::HashSet<u64>,
}

/// [`PerfSampler::accept`]'s tag of the context-switch event (others: their index).
const SWITCH_TAG: u16 = 256;

/// The frequency to sample at: the one asked for, or the kernel's maximum
/// (perf_event_max_sample_rate) when that is lower. The kernel lowers its maximum by itself on
/// a busy machine ("perf interrupt took too long"), so a default that worked yesterday can be
/// over it today; perf record throttles the same way.
pub fn throttle(asked: u32, max: Option<u32>) -> u32 {
    match max {
        Some(max) if max > 0 && asked > max => max,
        _ => asked,
    }
}

impl PerfSampler {
    /// Opens the events for `pid`. Launched targets are enabled by the kernel at exec; attached
    /// ones by [`PerfSampler::enable`].
    pub fn open(pid: u32, mode: TargetMode, config: &SamplerConfig) -> Result<Self, SampleError> {
        let (mut sampler, config) = PerfSampler::empty(config)?;
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(SampleError::NoSuchProcess(pid));
        }
        sampler.choose_attr(pid, mode, &config)?;
        if config.off_cpu {
            sampler.choose_switch_attr(pid, mode)?;
        }
        match mode {
            TargetMode::Launched => sampler.open_thread(pid)?,
            TargetMode::Attached => sampler.follow_threads(pid)?,
        }
        Ok(sampler)
    }

    /// Opens the events for one thread of a process (perf's `-t TID`), and the threads it
    /// starts later; the process's other threads are not sampled. Enable them with
    /// [`PerfSampler::enable`].
    pub fn open_thread_only(tid: u32, config: &SamplerConfig) -> Result<Self, SampleError> {
        let (mut sampler, config) = PerfSampler::empty(config)?;
        if !std::path::Path::new(&format!("/proc/{tid}")).exists() {
            return Err(SampleError::NoSuchProcess(tid));
        }
        sampler.choose_attr_with(
            tid,
            TargetMode::Attached,
            &config,
            &|attr, cpu| sys::perf_event_open(attr, tid as i32, cpu),
            &|_| {},
        )?;
        if config.off_cpu {
            sampler.choose_switch_attr(tid, TargetMode::Attached)?;
        }
        sampler.open_thread(tid)?;
        Ok(sampler)
    }

    /// A sampler with no event open yet, for `config` checked (and its frequency throttled to
    /// the kernel's maximum); the config to open its events with.
    fn empty(config: &SamplerConfig) -> Result<(Self, SamplerConfig), SampleError> {
        if config.frequency == 0 {
            return Err(SampleError::ZeroFrequency);
        }
        if config.period == Some(0) {
            return Err(SampleError::ZeroPeriod);
        }
        if config.stack_size == 0
            || !config.stack_size.is_multiple_of(8)
            || config.stack_size > 65528
        {
            return Err(SampleError::BadStackSize(config.stack_size));
        }
        let frequency = throttle(config.frequency, max_sample_rate());
        let cpus = online_cpus().map_err(io_err("reading the list of online CPUs"))?;
        let ncpus = cpus.len().max(1);
        let sampler = PerfSampler {
            attr: PerfEventAttr::default(),
            cpus,
            rings: Vec::new(),
            buffers: Arc::new(Mutex::new(Rings::new())),
            pump: None,
            others: Vec::new(),
            threads: BTreeSet::new(),
            data_pages: data_pages(config, ncpus),
            hung_up: Vec::new(),
            owner: Default::default(),
            event_name: "cycles".into(),
            extra: Vec::new(),
            events: Vec::new(),
            event_ids: Default::default(),
            kernel_stacks: true,
            asked_frequency: (frequency != config.frequency).then_some(config.frequency),
            frequency,
            switch: None,
            switch_ids: Default::default(),
            rings_ahead: false,
        };
        Ok((
            sampler,
            SamplerConfig {
                frequency,
                ..config.clone()
            },
        ))
    }

    /// Opens per-CPU events for every task of a cgroup v2 (`cgroup`: its directory), that a
    /// launched command was put in before its exec: the sampling timer runs on across task
    /// switches inside the cgroup, so tasks shorter than one period are sampled too (a
    /// per-task timer starts again in each new task). The events start disabled: enable them
    /// when the command is released. `pid` is the command's, for messages.
    ///
    /// `ahead`: rings mapped ahead for this config (see [`RingsAhead`]), that the cgroup's
    /// events are redirected into; where they cannot be, each CPU's first event maps its own.
    pub fn open_cgroup(
        cgroup: &OwnedFd,
        pid: u32,
        config: &SamplerConfig,
        ahead: Option<RingsAhead>,
    ) -> Result<Self, SampleError> {
        let (mut sampler, config) = PerfSampler::empty(config)?;
        let config = &config;
        sampler.choose_attr_with(
            pid,
            TargetMode::Attached,
            config,
            &|attr, cpu| sys::perf_event_open_cgroup(attr, cgroup, cpu),
            &|attr| attr.flags &= !(sys::FLAG_INHERIT | sys::FLAG_ENABLE_ON_EXEC),
        )?;
        let mut ahead = ahead
            .and_then(|a| a.take(&sampler.cpus, sampler.data_pages))
            .map(Vec::into_iter);
        for &cpu in &sampler.cpus.clone() {
            let fd = sys::perf_event_open_cgroup(&sampler.attr, cgroup, cpu as i32).map_err(
                io_err(format!("perf_event_open for the cgroup on CPU {cpu}")),
            )?;
            sampler.note_event(&fd, 0)?;
            match ahead.as_mut().and_then(Iterator::next) {
                Some((owner, ring)) if sys::set_output(&fd, &owner).is_ok() => {
                    sampler.add_ring(owner, ring);
                    sampler.others.push(fd);
                }
                _ => {
                    ahead = None;
                    let ring = sampler.map_ring(&fd)?;
                    sampler.add_ring(fd, ring);
                }
            }
            let ring = sampler.rings.len() - 1;
            sampler.open_extra(ring, &|attr| {
                sys::perf_event_open_cgroup(attr, cgroup, cpu as i32)
            })?;
        }
        sampler.rings_ahead = ahead.is_some();
        sampler.threads.insert(pid);
        Ok(sampler)
    }

    /// Whether every ring is one mapped ahead ([`PerfSampler::open_cgroup`]'s `ahead`).
    pub fn rings_mapped_ahead(&self) -> bool {
        self.rings_ahead
    }

    /// Opens per-CPU events for every task of the machine (perf's `-a`): what `superprof
    /// agent` samples. Needs CAP_PERFMON (root) or perf_event_paranoid at most 0. The events
    /// start disabled: [`PerfSampler::enable`] them. Samples need no [`PerfSampler::accept`]
    /// (one event per CPU, none inherited).
    pub fn open_system(config: &SamplerConfig) -> Result<Self, SampleError> {
        PerfSampler::open_system_on(config, None)
    }

    /// [`PerfSampler::open_system`] on these CPUs only (perf's `-C`; None: every online
    /// CPU). A CPU that is not online is refused.
    pub fn open_system_on(
        config: &SamplerConfig,
        cpus: Option<&[u32]>,
    ) -> Result<Self, SampleError> {
        let (mut sampler, config) = PerfSampler::empty(config)?;
        if let Some(wanted) = cpus {
            if let Some(off) = wanted.iter().find(|c| !sampler.cpus.contains(c)) {
                return Err(SampleError::Event {
                    name: format!("CPU {off}"),
                    why: format!(
                        "it is not online (online: {})",
                        sampler
                            .cpus
                            .iter()
                            .map(|c| c.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                });
            }
            sampler.cpus.retain(|c| wanted.contains(c));
        }
        let config = &config;
        let untargeted = |attr: &mut PerfEventAttr| {
            attr.flags &= !(sys::FLAG_INHERIT | sys::FLAG_ENABLE_ON_EXEC);
            attr.flags |= sys::FLAG_DISABLED;
        };
        let denied = |e: SampleError| match e {
            SampleError::PermissionDenied { .. } => SampleError::PermissionDenied {
                pid: 0,
                why: "sampling the whole machine needs root (or CAP_PERFMON), or \
                      /proc/sys/kernel/perf_event_paranoid at most 0; or give --pid"
                    .into(),
            },
            e => e,
        };
        sampler
            .choose_attr_with(
                0,
                TargetMode::Attached,
                config,
                &|attr, cpu| sys::perf_event_open(attr, -1, cpu),
                &untargeted,
            )
            .map_err(denied)?;
        for &cpu in &sampler.cpus.clone() {
            let fd = sys::perf_event_open(&sampler.attr, -1, cpu as i32)
                .map_err(io_err(format!("perf_event_open on CPU {cpu}")))?;
            sampler.note_event(&fd, 0)?;
            let ring = sampler.map_ring(&fd)?;
            sampler.add_ring(fd, ring);
            let ring = sampler.rings.len() - 1;
            sampler.open_extra(ring, &|attr| sys::perf_event_open(attr, -1, cpu as i32))?;
        }
        Ok(sampler)
    }

    /// Opens events for every thread of `pid`, repeating until no new thread shows up (threads
    /// created while we open are caught by the next round or by inheritance).
    fn follow_threads(&mut self, pid: u32) -> Result<(), SampleError> {
        loop {
            let tids = list_threads(pid).map_err(|_| SampleError::NoSuchProcess(pid))?;
            let new: Vec<u32> = tids
                .into_iter()
                .filter(|t| !self.threads.contains(t))
                .collect();
            if new.is_empty() {
                break;
            }
            for tid in new {
                match self.open_thread(tid) {
                    Ok(()) => {}
                    // The thread ended between listing and opening.
                    Err(SampleError::NoSuchProcess(_)) => {
                        self.threads.insert(tid);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if self.rings.is_empty() {
            return Err(SampleError::NoSuchProcess(pid));
        }
        Ok(())
    }

    fn open_thread(&mut self, tid: u32) -> Result<(), SampleError> {
        for (i, &cpu) in self.cpus.clone().iter().enumerate() {
            let fd =
                sys::perf_event_open(&self.attr, tid as i32, cpu as i32).map_err(|e| {
                    match e.raw_os_error() {
                        Some(libc::ESRCH) => SampleError::NoSuchProcess(tid),
                        Some(libc::EACCES) | Some(libc::EPERM) => SampleError::PermissionDenied {
                            pid: tid,
                            why: permission_hint(),
                        },
                        _ => SampleError::Io {
                            context: format!("perf_event_open for thread {tid} on CPU {cpu}"),
                            source: e,
                        },
                    }
                })?;
            self.note_event(&fd, 0)?;
            if let Some(leader) = self.rings.get(i) {
                sys::set_output(&fd, leader).map_err(io_err("redirecting a perf event"))?;
                self.others.push(fd);
            } else {
                let ring = self.map_ring(&fd)?;
                self.add_ring(fd, ring);
            }
            self.open_extra(i, &|attr| {
                sys::perf_event_open(attr, tid as i32, cpu as i32)
            })
            .map_err(|e| match e {
                SampleError::Io { source, .. } if source.raw_os_error() == Some(libc::ESRCH) => {
                    SampleError::NoSuchProcess(tid)
                }
                e => e,
            })?;
            if let Some((attr, _)) = &self.switch {
                let fd = sys::perf_event_open(attr, tid as i32, cpu as i32).map_err(|e| match e
                    .raw_os_error()
                {
                    Some(libc::ESRCH) => SampleError::NoSuchProcess(tid),
                    _ => SampleError::Io {
                        context: format!(
                            "perf_event_open of the context-switch event for thread {tid}"
                        ),
                        source: e,
                    },
                })?;
                let id = sys::event_id(&fd).map_err(io_err("reading a perf event's id"))?;
                self.switch_ids.insert(id);
                sys::set_output(&fd, &self.rings[i]).map_err(io_err("redirecting a perf event"))?;
                self.others.push(fd);
            }
        }
        self.threads.insert(tid);
        Ok(())
    }

    /// Opens the events after the first (`record -e A,B`) with `open`, into ring `ring`.
    fn open_extra(
        &mut self,
        ring: usize,
        open: &dyn Fn(&PerfEventAttr) -> io::Result<OwnedFd>,
    ) -> Result<(), SampleError> {
        for k in 0..self.extra.len() {
            let fd = open(&self.extra[k]).map_err(io_err(format!(
                "perf_event_open of {}",
                self.events.get(k + 1).map_or("an event", |e| e.0.as_str())
            )))?;
            self.note_event(&fd, k + 1)?;
            sys::set_output(&fd, &self.rings[ring]).map_err(io_err("redirecting a perf event"))?;
            self.others.push(fd);
        }
        Ok(())
    }

    /// Remembers which event `fd` is (where several are sampled: samples name their event's
    /// id, an inherited event its parent's).
    fn note_event(&mut self, fd: &OwnedFd, index: usize) -> Result<(), SampleError> {
        if self.events.len() > 1 {
            let id = sys::event_id(fd).map_err(io_err("reading a perf event's id"))?;
            self.event_ids.insert(id, index.min(255) as u8);
        }
        Ok(())
    }

    /// Lowers `data_pages` until one ring per CPU can be mapped at once (`first`: an event on
    /// the first CPU; `open` opens one on another).
    fn size_rings(
        &mut self,
        first: OwnedFd,
        open: &dyn Fn(u32) -> io::Result<OwnedFd>,
    ) -> Result<(), SampleError> {
        // With CAP_IPC_LOCK (root's) no limit holds the rings (perf_event_mlock_kb): no trial
        // mapping, which costs a few milliseconds of zeroed pages per CPU.
        if sys::has_ipc_lock() {
            return Ok(());
        }
        let mut fds = vec![first];
        for &cpu in &self.cpus[1..] {
            match open(cpu) {
                Ok(fd) => fds.push(fd),
                Err(_) => break, // (sized by the CPUs that could be probed)
            }
        }
        'size: loop {
            let mut maps = Vec::new();
            for fd in &fds {
                match RingMap::new(fd, self.data_pages) {
                    Ok(r) => maps.push(r),
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) && self.data_pages > 16 => {
                        self.data_pages /= 2;
                        continue 'size;
                    }
                    Err(e) => return Err(io_err("mapping the perf ring buffer")(e)),
                }
            }
            return Ok(());
        }
    }

    fn map_ring(&mut self, fd: &OwnedFd) -> Result<RingMap, SampleError> {
        loop {
            match RingMap::new(fd, self.data_pages) {
                Ok(r) => return Ok(r),
                // Unprivileged users are limited by perf_event_mlock_kb: try smaller buffers.
                Err(e) if e.raw_os_error() == Some(libc::EPERM) && self.data_pages > 16 => {
                    self.data_pages /= 2;
                }
                Err(e) => return Err(io_err("mapping the perf ring buffer")(e)),
            }
        }
    }

    /// Starts sampling (attached targets; launched ones start at exec by themselves).
    pub fn enable(&self) -> Result<(), SampleError> {
        for fd in self.rings.iter().chain(&self.others) {
            sys::enable(fd).map_err(io_err("enabling a perf event"))?;
        }
        Ok(())
    }

    /// Stops sampling; records already in the buffers can still be drained.
    pub fn disable(&self) {
        for fd in self.rings.iter().chain(&self.others) {
            let _ = sys::disable(fd);
        }
    }

    /// Waits up to `timeout_ms` for data, or for one of `extra` (e.g. a pidfd) to become
    /// readable.
    pub fn wait(&mut self, extra: &[RawFd], timeout_ms: i32) {
        self.start_pump();
        let polled: Vec<usize> = (0..self.rings.len())
            .filter(|&i| !self.hung_up[i])
            .collect();
        let mut fds: Vec<RawFd> = polled.iter().map(|&i| self.rings[i].as_raw_fd()).collect();
        fds.extend_from_slice(extra);
        // A ring whose owner exited may still receive other threads' records; the poll
        // timeout drains it from then on.
        for i in sys::poll_fds(&fds, timeout_ms).unwrap_or_default() {
            if let Some(&ring) = polled.get(i) {
                self.hung_up[ring] = true;
            }
        }
    }

    /// Whether to keep a sample. In attach mode a thread started while the events were being
    /// opened can carry both an inherited event and one of its own; counting both would double
    /// its samples, so only the first event seen per (thread, CPU) counts.
    pub fn accept(&mut self, sample: &crate::SampleRecord) -> bool {
        let tag = if self.is_switch(sample) {
            SWITCH_TAG
        } else {
            u16::from(self.event_of(sample.id))
        };
        *self
            .owner
            .entry((sample.tid, sample.cpu, tag))
            .or_insert(sample.id)
            == sample.id
    }

    /// The index in [`PerfSampler::events`] of the event with id `id` (0 where one event
    /// is sampled).
    pub fn event_of(&self, id: u64) -> u8 {
        self.event_ids.get(&id).copied().unwrap_or(0)
    }

    /// The events sampled, in the order of [`PerfSampler::event_of`]: each one's name, and
    /// whether its samples count occurrences of it (by their periods) rather than CPU time.
    pub fn events(&self) -> &[(String, bool)] {
        &self.events
    }

    /// The occurrences a sample of a counted event stands for where its record does not say
    /// (a fixed period, `record -c`); None where records carry their period.
    pub fn fixed_period(&self) -> Option<u64> {
        (self.attr.sample_type & sys::PERF_SAMPLE_PERIOD == 0)
            .then_some(self.attr.sample_period_or_freq)
    }

    /// Each event id's index in [`PerfSampler::events`] (empty where one event is sampled).
    pub fn event_ids(&self) -> &std::collections::HashMap<u64, u8> {
        &self.event_ids
    }

    /// Whether to keep a switch record: as [`PerfSampler::accept`], the first event seen per
    /// (thread, CPU) only (a thread started while attaching may carry two).
    pub fn accept_switch(&mut self, tid: u32, cpu: u32, id: u64) -> bool {
        *self.owner.entry((tid, cpu, SWITCH_TAG)).or_insert(id) == id
    }

    /// Whether a sample is of the context-switch event (the thread leaving the CPU).
    pub fn is_switch(&self, sample: &crate::SampleRecord) -> bool {
        self.switch_ids.contains(&sample.id)
    }

    /// The context-switch event sampled for off-CPU time: `sched:sched_switch` or
    /// `context-switches` (None without `off_cpu`).
    pub fn off_cpu_event(&self) -> Option<&'static str> {
        self.switch.map(|(_, name)| name)
    }

    /// Appends the records of every ring buffer to `buf`, one buffer after the other, each
    /// sample's stack copy cut to the bytes the thread used ([`crate::stack_cut`]).
    ///
    /// A thread of the sampler's own empties the rings into memory every few milliseconds
    /// from the first wait or drain on, so that records keep coming while the caller is busy
    /// (see the `pump` module); this takes those first. Returns the bytes appended.
    pub fn drain(&mut self, buf: &mut Vec<u8>) -> usize {
        self.start_pump();
        let layout = self.layout();
        match self.buffers.lock() {
            Ok(mut rings) => rings.take(buf, layout),
            Err(_) => 0, // (the pump panicked: nothing to read)
        }
    }

    /// A ring buffer and the fd that owns it.
    fn add_ring(&mut self, fd: OwnedFd, ring: RingMap) {
        if let Ok(mut rings) = self.buffers.lock() {
            rings.maps.push(ring);
            self.rings.push(fd);
            self.hung_up.push(false);
        }
    }

    fn start_pump(&mut self) {
        if self.pump.is_some() || self.rings.is_empty() {
            return;
        }
        let ring_bytes = self.data_pages * sys::page_size();
        let sample_bytes = self.attr.sample_stack_user as usize + 1024;
        let every = Pump::period(ring_bytes, sample_bytes, self.frequency);
        self.pump = Pump::start(self.buffers.clone(), self.layout(), every);
    }

    /// How this sampler's records are laid out, for [`crate::parse_record`].
    pub fn layout(&self) -> Layout {
        Layout {
            user_regs: self.attr.sample_regs_user.count_ones() as usize,
            stack_user: self.attr.sample_type & sys::PERF_SAMPLE_STACK_USER != 0,
            period: self.attr.sample_type & sys::PERF_SAMPLE_PERIOD != 0,
        }
    }

    /// The frequency sampled at (the one asked for, or the kernel's lower maximum).
    pub fn frequency(&self) -> u32 {
        self.frequency
    }

    /// A notice, when the frequency asked for was over the kernel's maximum and was lowered
    /// to it.
    pub fn throttle_notice(&self) -> Option<String> {
        let asked = self.asked_frequency?;
        Some(format!(
            "superprof: {asked} Hz is above the kernel's maximum sample rate of {max} Hz now \
             (kernel.perf_event_max_sample_rate, which the kernel lowers by itself when sampling \
             interrupts take too long); sampling at {max} Hz",
            max = self.frequency
        ))
    }

    /// The event being sampled: `cycles` or `cpu-clock`, or those of `record -e`,
    /// comma-separated.
    pub fn event_name(&self) -> &str {
        &self.event_name
    }

    /// Whether kernel frames are recorded (false when only user space may be sampled).
    pub fn kernel_stacks(&self) -> bool {
        self.kernel_stacks
    }

    /// The CPUs sampled.
    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    /// Threads that had events opened directly (attach mode lists them all).
    pub fn threads(&self) -> impl Iterator<Item = u32> + '_ {
        self.threads.iter().copied()
    }
}

/// This CPU's user-space cycles per second of CPU time, measured once: a counting `cycles`
/// event on the calling thread over 20 ms of its CPU time. `None` where cycles cannot be
/// counted (no PMU, or not allowed).
pub fn cycles_per_second() -> Option<u64> {
    static RATE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *RATE.get_or_init(|| {
        let attr = PerfEventAttr {
            type_: sys::PERF_TYPE_HARDWARE,
            config: sys::PERF_COUNT_HW_CPU_CYCLES,
            flags: sys::FLAG_EXCLUDE_KERNEL | sys::FLAG_EXCLUDE_HV,
            ..Default::default()
        };
        let fd = sys::perf_event_open(&attr, 0, -1).ok()?;
        let mut count = [0u64; 1];
        sys::read_u64s(&fd, &mut count).ok()?;
        let (c0, t0) = (count[0], sys::thread_cpu_ns());
        let mut x = 1u64;
        while sys::thread_cpu_ns().saturating_sub(t0) < 20_000_000 {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
        }
        sys::read_u64s(&fd, &mut count).ok()?;
        let elapsed = sys::thread_cpu_ns().saturating_sub(t0);
        let cycles = count[0].checked_sub(c0)?;
        (cycles > 0 && elapsed > 0)
            .then(|| (cycles as u128 * 1_000_000_000 / elapsed as u128) as u64)
            .filter(|&r| r > 0)
    })
}

/// The thread to try events on: a launched child itself, an attached process's first thread.
fn probe_tid(pid: u32, mode: TargetMode) -> Result<u32, SampleError> {
    match mode {
        TargetMode::Launched => Ok(pid),
        TargetMode::Attached => list_threads(pid)
            .map_err(|_| SampleError::NoSuchProcess(pid))?
            .first()
            .copied()
            .ok_or(SampleError::NoSuchProcess(pid)),
    }
}

/// Data pages per ring of `config`'s sampling on `ncpus` CPUs (lowered later where the rights
/// do not allow that many).
fn data_pages(config: &SamplerConfig, ncpus: usize) -> usize {
    if config.off_cpu {
        // A sample at every context switch comes far faster than the clock's: four times the
        // room (where the rights allow it), within 256 MiB (65,536 pages) for all the CPUs.
        let cap = 1 << (65536 / ncpus.max(1)).max(1).ilog2();
        (ring_pages(config.stack_size) * 4)
            .min(cap)
            .max(ring_pages(config.stack_size))
    } else if config.frame_pointers {
        // (No stack copies: a callchain of at most 127 frames.)
        ring_pages(1024)
    } else {
        ring_pages(config.stack_size)
    }
}

/// The bytes in a ring of `data_pages` at which its reader is woken: a quarter.
fn watermark(data_pages: usize) -> u32 {
    (data_pages * sys::page_size() / 4) as u32
}

/// Data pages per ring: room for about 128 samples with their stacks, a power of two.
fn ring_pages(stack_size: u32) -> usize {
    let bytes = (stack_size as usize + 1024) * 128;
    (bytes / sys::page_size())
        .next_power_of_two()
        .clamp(16, 2048)
}

fn permission_hint() -> String {
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    let level = paranoid.map_or("unknown".to_string(), |p| p.to_string());
    format!(
        "kernel.perf_event_paranoid is {level} and this user may not trace that process; \
         run superprof as the process's owner or as root, grant it CAP_PERFMON and \
         CAP_SYS_PTRACE, or lower /proc/sys/kernel/perf_event_paranoid"
    )
}

/// The kernel's maximum sample rate now (/proc/sys/kernel/perf_event_max_sample_rate).
pub fn max_sample_rate() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Online CPU numbers from sysfs ("0-3,5,7-8").
pub fn online_cpus() -> io::Result<Vec<u32>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    let mut cpus = parse_cpu_list(&text).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unreadable CPU list: {e}"),
        )
    })?;
    if cpus.is_empty() {
        cpus.push(0);
    }
    Ok(cpus)
}

/// A CPU list as sysfs writes it and perf's `-C` takes it: `0-3,5,7-8`, in increasing order
/// with no repeat (at most 65,536 CPUs).
pub fn parse_cpu_list(text: &str) -> Result<Vec<u32>, String> {
    let mut cpus = std::collections::BTreeSet::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let num = |s: &str| -> Result<u32, String> {
            s.trim()
                .parse::<u32>()
                .ok()
                .filter(|&n| n < 65536)
                .ok_or_else(|| format!("'{s}' is not a CPU number"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("'{part}' is not a range"));
                }
                cpus.extend(a..=b);
            }
            None => {
                cpus.insert(num(part)?);
            }
        }
    }
    Ok(cpus.into_iter().collect())
}

// Thread ids of a process, from /proc (one lister for the samplers and the tracer).
pub use superprof_unwind::maps::list_threads;

#[cfg(test)]
mod tests {
    use super::throttle;

    #[test]
    fn cpu_lists_read_as_perf_writes_them() {
        use super::parse_cpu_list;
        assert_eq!(
            parse_cpu_list("0-3,5,7-8\n").unwrap(),
            [0, 1, 2, 3, 5, 7, 8]
        );
        assert_eq!(parse_cpu_list("1,0,1").unwrap(), [0, 1]);
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<u32>::new());
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("0-4294967295").is_err());
    }

    #[test]
    fn no_such_process_names_a_process_or_a_thread() {
        let e = super::SampleError::NoSuchProcess(4321);
        assert_eq!(e.to_string(), "no process or thread 4321");
    }

    #[test]
    fn throttle_lowers_to_the_kernels_maximum_only() {
        assert_eq!(throttle(999, Some(100_000)), 999);
        assert_eq!(throttle(999, Some(500)), 500);
        assert_eq!(throttle(999, Some(999)), 999);
        assert_eq!(throttle(999, None), 999);
        // A maximum of 0 (sampling disabled by the admin) is the kernel's to refuse.
        assert_eq!(throttle(999, Some(0)), 999);
    }
}
