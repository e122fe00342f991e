//! `superprof stat`: event counts inside individual functions and address ranges, after
//! Perforator, on a probe engine (`crate::engine`): kernel uprobes, or the coordinator's
//! breakpoints.
//!
//! With uprobes, a probe at each region's entry (and at a range's end, and a return probe on a
//! function), all with the counters in one perf group: each hit writes the thread, time, stack
//! pointer and every counter's value into a ring buffer, which superprof reads while the
//! program runs on. The calls are the same frames as below, opened and closed from the hits.
//!
//! With ptrace, a breakpoint at a region's entry; when a thread hits it (and is not already inside the
//! region: recursion counts once per outermost call), its counters are read, its return address
//! is read from the stack (x86_64) or the link register (AArch64), and a breakpoint is put
//! there. When that thread comes back to the return address with its stack popped, the counters
//! are read again: the differences are the call's counts. Counters stay enabled on every
//! thread; reading differences is what Perforator's enable/disable achieves, without extra
//! ioctls, and multiplexing is scaled by the enabled/running times of the same differences.

mod breakpoints;
mod calls;
mod exits;
mod in_process;
mod output;
mod place;
mod trace;
mod uprobes;

use std::collections::HashMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use superprof_record::Target;
use superprof_sample::{Counter, EventKind, EventSpec, Reading};
use superprof_trace::{ExitStatus, TraceEvent, TraceOptions, Tracer};

use crate::engine::{Engine, EntryKind};
use crate::region::{not_found, Placement, RegionSpec};
use crate::{bail, err, Context, EngineKind, Error, Result};
use exits::*;

pub use output::{render, uncertain_why};

/// A `stat` run: what to count, where, on which engine.
#[derive(Debug, Clone)]
pub struct StatConfig {
    /// Regions as the user writes them (see [`RegionSpec::parse`]).
    pub regions: Vec<String>,
    /// Events counted each in a group of its own (perf's names; none and no `groups`: a
    /// default set).
    pub events: Vec<String>,
    /// Groups of events counted together, each `EVENT,EVENT,...`.
    pub groups: Vec<String>,
    /// The engine asked for (none: the fastest that reads every event).
    pub engine: Option<EngineKind>,
    /// The process attached to, or the command launched.
    pub target: Target,
    /// How long to count (none: until the target ends or `stop`).
    pub duration: Option<Duration>,
    /// Whether the caller was asked to stop (Ctrl-C, SIGTERM): checked while tracing.
    pub stop: fn() -> bool,
}

/// What a `stat` run measured.
pub struct Measured {
    /// The regions' figures.
    pub results: Results,
    /// Exit status of a launched command.
    pub exit: Option<ExitStatus>,
    /// The command died of a signal inside a region.
    pub signal_in_region: bool,
}

/// Totals of one event over a region's calls.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// The sum over the calls, the engine's cost taken off (see [`Stats::total()`]).
    pub total: f64,
    /// The least of one call.
    pub min: f64,
    /// The most of one call.
    pub max: f64,
    /// Some call's count was scaled for multiplexing.
    pub scaled: bool,
    /// The standard error of the mean per call: the calls' own spread and the error of the
    /// engine's cost taken off them.
    pub error: f64,
    /// The engine's cost was taken off and what is left of the mean is within two standard
    /// errors of zero: the call's own figure is below what this run can resolve (under
    /// `mean + 2 × error`), not a measured zero.
    pub below_resolution: bool,
}

impl Stats {
    /// Adds the `n`th call's value `v`, which may be below zero once the engine's mean cost
    /// is taken off: the total takes it as it is (so totals and means are the measured ones
    /// less the mean cost, unbiased), the call's own figures (min, max) no less than zero.
    fn add(&mut self, v: f64, n: u64, scaled: bool) {
        let shown = v.max(0.0);
        if n == 0 {
            self.min = shown;
            self.max = shown;
        } else {
            self.min = self.min.min(shown);
            self.max = self.max.max(shown);
        }
        self.total += v;
        self.scaled |= scaled;
    }

    /// The total, never below zero (a few-nanosecond function can come out just below it
    /// once the engine's cost is taken off).
    pub fn total(&self) -> f64 {
        self.total.max(0.0)
    }
}

/// One invocation (for --per-call).
#[derive(Debug, Clone)]
pub struct Call {
    /// The region's index.
    pub region: usize,
    /// The thread that made the call.
    pub tid: u32,
    /// The engine that measured it, and how the kernel ran its first instruction (the
    /// engine's cost for such calls is taken off when the run ends).
    pub engine: &'static str,
    /// (See `engine`.)
    pub kind: EntryKind,
    /// Which events were scaled for multiplexing (bit per event).
    pub scaled: u64,
    /// Each event's count in the call, `time-elapsed-ns` last.
    pub values: Vec<f64>,
}

/// The results of a run.
pub struct Results {
    /// The probe engine that measured (uprobe, ptrace): the last one, where a run had to
    /// change (see [`Results::engines`]).
    pub engine: &'static str,
    /// Each engine that measured calls (and the kind of first instruction its cost was
    /// measured for: see [`EntryKind`]): what it adds to a call, per event and last elapsed
    /// ns, measured on an empty region and taken off every call.
    pub engines: Vec<EngineCost>,
    /// The regions' names (a function's own name where a substring found it).
    pub regions: Vec<String>,
    /// Event names, `time-elapsed-ns` last.
    pub events: Vec<String>,
    /// Each region's outermost calls.
    pub calls: Vec<u64>,
    /// Each region's figures, one per event (`stats[region][event]`).
    pub stats: Vec<Vec<Stats>>,
    /// Every call, in the order they ended.
    pub per_call: Vec<Call>,
    /// Probe hits lost (a ring overwritten before superprof read it): the counts are then
    /// not exact.
    pub lost_hits: u64,
    /// Per region: calls taken for inner (recursive) calls of an open call that was later
    /// found left without a return (an exception, a longjmp, the thread's end), which may
    /// have begun after it was left and then were outermost calls: the region's count may be
    /// low by up to this many. (The ptrace engine on x86_64 checks the open call's return
    /// address on the stack at each such entry, and knows.)
    pub uncertain: Vec<u64>,
}

/// An engine's own cost per call, per event and last elapsed ns.
#[derive(Debug, Clone)]
pub struct EngineCost {
    /// The engine's name.
    pub engine: &'static str,
    /// The kind of first instruction it was measured on.
    pub kind: EntryKind,
    /// Its mean cost per call, per event and last elapsed ns.
    pub cost: Vec<f64>,
    /// The standard error of each event's cost (a trimmed mean's, engine.rs's `trimmed_mean_and_error`).
    pub error: Vec<f64>,
}

/// A counter's count between two readings, scaled as perf stat scales a multiplexed counter:
/// counted for `running` of the `enabled` time, it stands for value × enabled / running
/// (`true`: scaled). A counter that never ran in between counts what it counted (nothing).
fn scaled_delta(start: &Reading, end: &Reading) -> (f64, bool) {
    let dv = end.value.saturating_sub(start.value) as f64;
    let de = end.enabled.saturating_sub(start.enabled);
    let dr = end.running.saturating_sub(start.running);
    if dr > 0 && dr < de {
        (dv * de as f64 / dr as f64, true)
    } else {
        (dv, false)
    }
}

/// A region placed in the process (`entry` 0: not found yet).
struct Region {
    name: String,
    entry: u64,
    /// Where it starts and how it ends: a function has its entry; an inlined copy of it, or a
    /// range, its code's start.
    sites: Vec<(u64, Site)>,
}

/// How a frame opened at a site ends.
#[derive(Debug, Clone, Copy)]
struct Site {
    /// Reaching this address (a range's end, an inlined copy's end).
    end: Option<u64>,
    /// Returning from the function the site starts (a function region, a range that starts at
    /// a function's entry).
    ends_at_return: bool,
}

/// A thread inside a region.
struct Frame {
    region: usize,
    /// Where it leaves: the range's end, and the return address when the region starts at a
    /// function's entry (`true`: a return, valid only with the stack popped).
    exits: Vec<(u64, bool)>,
    /// Stack pointer at entry (a return pops the stack above it).
    sp: u64,
    start: Vec<Reading>,
    started: Instant,
    /// The entry hit's time (uprobe engine; CLOCK_MONOTONIC ns).
    start_ns: u64,
    /// Entries of its region taken for recursive calls inside it, unchecked (see
    /// [`Results::uncertain`]).
    nested: u64,
    /// ptrace engine: the function's tail calls, where the call ends when the thread reaches
    /// one with the stack as at the entry (breakpoints, counted in `returns`).
    tails: Vec<u64>,
}

/// What a hit of one uprobe means.
#[derive(Debug, Clone, Copy)]
enum Role {
    /// A region starts there.
    Entry(usize, Site),
    /// A range (or an inlined copy) ends there.
    End(u64),
    /// A function region leaves there (a `ret`, or a jump out of it: a tail call), when its
    /// stack pointer is back where it was at the entry.
    Exit(usize),
}

/// The probes of the sites placed at one time, and what each means (uprobe engine).
struct Batch {
    /// The sites it probes: (region, address, site).
    sites: Vec<(usize, u64, Site)>,
    probes: Vec<superprof_sample::ProbeEvent>,
    roles: Vec<Role>,
}

/// One batch's uprobe group on one thread.
struct Armed {
    batch: usize,
    tid: u32,
    group: superprof_sample::ProbeGroup,
}

struct ThreadCounters {
    counters: Vec<Counter>,
}

fn default_events() -> (Vec<EventSpec>, Option<String>) {
    let hw: Vec<EventSpec> = ["instructions", "cycles", "branches", "branch-misses"]
        .iter()
        .filter_map(|n| EventSpec::parse(n).ok())
        .collect();
    match superprof_sample::probe(&hw[1]) {
        Ok(()) => (hw, None),
        Err(e) => {
            let sw = [
                "task-clock",
                "page-faults",
                "context-switches",
                "cpu-migrations",
            ]
            .iter()
            .filter_map(|n| EventSpec::parse(n).ok())
            .collect();
            (
                sw,
                Some(format!(
                    "superprof: hardware counters are not available here (this CPU or VM exposes no \
                     PMU: {e}); counting software events"
                )),
            )
        }
    }
}

fn unsupported(spec: &EventSpec, e: &std::io::Error) -> Error {
    let why = match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) | Some(libc::EINVAL) => {
            "not supported by this CPU or VM (no hardware PMU?)".to_owned()
        }
        Some(libc::EACCES) | Some(libc::EPERM) => {
            "permission denied (perf_event_paranoid)".to_owned()
        }
        _ => e.to_string(),
    };
    err!("event '{}' cannot be counted: {why}", spec.name)
}

/// The events of `kind` (all, hardware, software, cache, tracepoint), each with whether it can
/// be counted here, one per line.
pub fn list_events(kind: &str) -> Result<String> {
    let kinds: Vec<EventKind> = match kind {
        "all" => vec![
            EventKind::Hardware,
            EventKind::Software,
            EventKind::Cache,
            EventKind::Tracepoint,
        ],
        "hardware" => vec![EventKind::Hardware],
        "software" => vec![EventKind::Software],
        "cache" => vec![EventKind::Cache],
        "tracepoint" => vec![EventKind::Tracepoint],
        other => bail!("unknown event kind '{other}': use hardware, software, cache or tracepoint"),
    };
    let mut out = String::new();
    for k in kinds {
        writeln!(out, "{k:?} events:").expect("a String");
        for spec in EventSpec::all(k) {
            let status = match superprof_sample::probe(&spec) {
                Ok(()) => "supported".to_owned(),
                Err(e) => format!("not supported here ({e})"),
            };
            writeln!(out, "  {:<28} {status}", spec.name).expect("a String");
        }
    }
    writeln!(out, "Raw events: rNNNN (hex event code, e.g. r01c2)").expect("a String");
    Ok(out)
}

/// Counts `args`' events in its regions while the target runs, with each engine's own cost
/// measured and taken off the calls.
///
/// (One function of 110 lines: the command's steps in order, each run once and feeding the
/// next: regions and events parsed and checked, the session traced, each engine's cost
/// measured, the figures tallied.)
pub fn measure(args: &StatConfig) -> Result<Measured> {
    if args.regions.is_empty() {
        bail!("give at least one region with -r FUNCTION or -r 0xSTART-0xEND");
    }
    let specs: Vec<RegionSpec> = args
        .regions
        .iter()
        .map(|r| RegionSpec::parse(r))
        .collect::<Result<_>>()?;
    // Events: -e, then each -g group; default set when none.
    let mut events: Vec<EventSpec> = Vec::new();
    let mut groups: Vec<(usize, usize)> = Vec::new(); // [start, end) of each group in `events`
    for e in &args.events {
        events.push(EventSpec::parse(e).map_err(crate::Error::Message)?);
        groups.push((events.len() - 1, events.len()));
    }
    for g in &args.groups {
        let start = events.len();
        for e in g.split(',').filter(|e| !e.is_empty()) {
            events.push(EventSpec::parse(e).map_err(crate::Error::Message)?);
        }
        groups.push((start, events.len()));
    }
    if events.is_empty() {
        let (def, notice) = default_events();
        if let Some(n) = notice {
            superprof_unwind::say!("{n}");
        }
        for e in def {
            events.push(e);
            groups.push((events.len() - 1, events.len()));
        }
    }
    // Each event must be countable here; kernel counts where allowed, else user space only.
    let mut user_only = false;
    for spec in &events {
        if let Err(e) = Counter::open(spec, 0, false, None) {
            match Counter::open(spec, 0, true, None) {
                Ok(_) => user_only = true,
                Err(_) => return Err(unsupported(spec, &e)),
            }
        }
    }
    let (engine, notice) = choose_engine(args.engine, &events)?;
    if let Some(n) = notice {
        superprof_unwind::say!("{n}");
    }
    let mut session = Session::new(engine, events, groups, user_only, specs);
    session.auto_engine = args.engine.is_none();
    session.stop = args.stop;
    let (pid, command) = match &args.target {
        Target::Pid(pid) => (Some(*pid), &[][..]),
        Target::Command(command) => (None, &command[..]),
        Target::Thread(_) | Target::System { .. } => {
            bail!("stat follows a command or a process (-p), not a thread or the machine")
        }
    };
    let (exit, signal_in_region) = session.trace(pid, command, args.duration)?;
    // Each engine's own cost per call (measured now that the program's tracer is gone), taken
    // off each call it measured. Where it cannot be measured, the figures stay as measured.
    let mut costs = Vec::new();
    let results = session.results.as_ref().expect("results");
    let kinds = [EntryKind::Stepped, EntryKind::Emulated];
    for (&e, kind) in session
        .engines_used
        .iter()
        .flat_map(|e| kinds.map(|k| (e, k)))
    {
        if !results
            .per_call
            .iter()
            .any(|c| c.engine == e.name() && c.kind == kind)
        {
            continue;
        }
        match engine_cost(e, kind, &session.events, &session.groups, session.user_only) {
            Ok((cost, error)) => costs.push(EngineCost {
                engine: e.name(),
                kind,
                cost,
                error,
            }),
            Err(why) => superprof_unwind::say!(
                "superprof: {why:#}; the figures include what the {} engine itself costs",
                e.name()
            ),
        }
    }
    if session.lost_hits > 0 {
        superprof_unwind::say!(
            "superprof: {} probe hits were lost (a ring was overwritten before superprof read \
             it): the counts are not exact (a call whose entry or exit was lost is left out, \
             and an inner call of a recursive function may count as an outermost one)",
            session.lost_hits
        );
    }
    let mut results = session.results.take().expect("results");
    for (i, &n) in results.uncertain.iter().enumerate() {
        if n > 0 {
            let name = results.regions.get(i).map_or("?", |s| s.as_str());
            superprof_unwind::say!("superprof: region {name}: {}", output::uncertain_why(n));
        }
    }
    results.engine = session.engine.name();
    results.lost_hits = session.lost_hits;
    tally(&mut results, &costs);
    Ok(Measured {
        results,
        exit,
        signal_in_region,
    })
}

/// What the in-process engine reads for an event (with system calls in the program): the
/// thread's CPU time, or a count of its rusage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InProcessReading {
    CpuTime,
    Faults,
    MinorFaults,
    MajorFaults,
    ContextSwitches,
}

impl InProcessReading {
    /// How the in-process engine reads `e` (perf's software events it has an equal of).
    fn of(e: &EventSpec) -> Option<InProcessReading> {
        const PERF_TYPE_SOFTWARE: u32 = 1;
        if e.type_ != PERF_TYPE_SOFTWARE {
            return None;
        }
        Some(match e.config {
            0 | 1 => InProcessReading::CpuTime, // cpu-clock, task-clock
            2 => InProcessReading::Faults,
            3 => InProcessReading::ContextSwitches,
            5 => InProcessReading::MinorFaults,
            6 => InProcessReading::MajorFaults,
            _ => return None,
        })
    }

    /// What the recording probes must read for `events`: the thread's CPU time, its rusage.
    fn needs(events: &[EventSpec]) -> (bool, bool) {
        let reads: Vec<InProcessReading> = events.iter().filter_map(Self::of).collect();
        (
            reads.contains(&InProcessReading::CpuTime),
            reads.iter().any(|r| *r != InProcessReading::CpuTime),
        )
    }

    fn value(self, r: &crate::inprocess::Record) -> u64 {
        match self {
            InProcessReading::CpuTime => r.cputime,
            InProcessReading::Faults => r.minflt.wrapping_add(r.majflt),
            InProcessReading::MinorFaults => r.minflt,
            InProcessReading::MajorFaults => r.majflt,
            InProcessReading::ContextSwitches => r.nvcsw.wrapping_add(r.nivcsw),
        }
    }
}

/// The engine of a run: in-process where asked, or by default where it reads every event
/// (x86_64 and AArch64); else a kernel engine ([`Engine::choose`]).
fn choose_engine(
    arg: Option<EngineKind>,
    events: &[EventSpec],
) -> Result<(Engine, Option<String>)> {
    let unreadable = events.iter().find(|e| InProcessReading::of(e).is_none());
    let built = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
    match arg {
        Some(EngineKind::InProcess) if !built => bail!(
            "the in-process engine is built for x86_64 and AArch64 only: use --engine uprobe or \
             --engine ptrace"
        ),
        Some(EngineKind::InProcess) => match unreadable {
            Some(e) => bail!(
                "the in-process engine reads task-clock, cpu-clock, page-faults, minor-faults, \
                 major-faults and context-switches, not '{}': use --engine uprobe or --engine ptrace",
                e.name
            ),
            None => Ok((Engine::InProcess, None)),
        },
        None if built && unreadable.is_none() => Ok((Engine::InProcess, None)),
        other => Engine::choose(other),
    }
}

/// Takes each engine's cost (`costs`, by engine name) off every call it measured, and sums the
/// calls into the regions' figures, each mean with its standard error.
fn tally(res: &mut Results, costs: &[EngineCost]) {
    let events = res.events.len();
    let regions = res.regions.len().max(res.calls.len());
    res.stats = vec![vec![Stats::default(); events]; regions];
    let mut seen = vec![0u64; regions];
    // Per region and event: the sum of the squares of the calls' values (their spread), and
    // for each engine cost (by index in `costs`) how many calls it was taken off.
    let mut squares = vec![vec![0.0f64; events]; regions];
    let mut charged = vec![vec![0u64; costs.len()]; regions];
    for c in &mut res.per_call {
        let k = costs
            .iter()
            .position(|k| k.engine == c.engine && k.kind == c.kind);
        if let Some(k) = k {
            charged[c.region][k] += 1;
        }
        let n = seen[c.region];
        for (i, v) in c.values.iter_mut().enumerate() {
            *v -= k.and_then(|k| costs[k].cost.get(i)).copied().unwrap_or(0.0);
            let scaled = i < 64 && c.scaled & (1 << i) != 0;
            res.stats[c.region][i].add(*v, n, scaled);
            squares[c.region][i] += *v * *v;
            // A call's own figures are never below zero.
            *v = v.max(0.0);
        }
        seen[c.region] += 1;
    }
    let cpu = res
        .events
        .iter()
        .position(|e| e == "task-clock" || e == "cpu-clock");
    let elapsed = res.events.iter().position(|e| e == "time-elapsed-ns");
    for (r, stats) in res.stats.iter_mut().enumerate() {
        let n = seen[r];
        for (i, s) in stats.iter_mut().enumerate() {
            // The spread of the calls (sample variance over n), and each engine cost's own
            // error, the same for every call it was taken off: those add up, not average out.
            let spread = if n > 1 {
                let mean = s.total / n as f64;
                ((squares[r][i] - n as f64 * mean * mean).max(0.0) / (n - 1) as f64) / n as f64
            } else {
                0.0
            };
            let cost_error: f64 = costs
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let e = c.error.get(i).copied().unwrap_or(0.0) * charged[r][k] as f64;
                    e * e
                })
                .sum::<f64>()
                .sqrt()
                / n.max(1) as f64;
            s.error = (spread + cost_error * cost_error).sqrt();
        }
        // A call's elapsed time holds its CPU time: where the two costs taken off leave the
        // elapsed mean below the CPU mean (the engine's elapsed cost varies more from run to
        // run), the elapsed figure is the CPU one.
        if let (Some(c), Some(e)) = (cpu, elapsed) {
            if stats[e].total < stats[c].total {
                stats[e].total = stats[c].total;
            }
        }
        for (i, s) in stats.iter_mut().enumerate() {
            let taken_off = costs
                .iter()
                .enumerate()
                .any(|(k, c)| charged[r][k] > 0 && c.cost.get(i).is_some_and(|&v| v >= 0.5));
            s.below_resolution = n > 0 && taken_off && s.total / n as f64 <= 2.0 * s.error;
        }
    }
    res.engines = costs.to_vec();
}

/// The calls of the empty region the engine's cost is measured on (its cost per call is the
/// mean of these, less their highest 0.1%), and the microseconds spun before each: ptrace's
/// cost includes superprof waking up to each stop, which takes longer from idle (about 60 µs
/// more on this VM) than in a run of back-to-back calls.
fn calibration_calls(engine: Engine) -> (usize, u64) {
    match engine {
        Engine::Uprobe(_) | Engine::InProcess => (5000, 0),
        Engine::Ptrace => (300, 500),
    }
}

/// What `engine` itself adds to each call of a region, per event and last in elapsed
/// nanoseconds: measured by this very code on an empty function (superprof's own
/// `superprof_calibration_emulated` or `_stepped`, whose first instruction is of kind `kind`,
/// called by `superprof __stat-calibration N KIND`), probed as a
/// function region is, with the same counters.
fn engine_cost(
    engine: Engine,
    kind: EntryKind,
    events: &[EventSpec],
    groups: &[(usize, usize)],
    user_only: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let exe = std::fs::read_link("/proc/self/exe").context("cannot find superprof's own file")?;
    let (calls, gap_us) = calibration_calls(engine);
    let (region, kind_arg) = match engine {
        Engine::InProcess => (crate::engine::IN_PROCESS_CALIBRATION, "in-process"),
        _ => (kind.calibration_region(), kind.name()),
    };
    let spec = RegionSpec::Function(region.to_owned());
    let mut s = Session::new(
        engine,
        events.to_vec(),
        groups.to_vec(),
        user_only,
        vec![spec],
    );
    let command: [std::ffi::OsString; 5] = [
        exe.clone().into(),
        "__stat-calibration".into(),
        calls.to_string().into(),
        kind_arg.into(),
        gap_us.to_string().into(),
    ];
    s.calibrating = true;
    // Superprof's own file, reduced to its calibration functions: nothing else of it is probed.
    if let Some(code) =
        superprof_analyze::ElfCode::open_only(&exe, &crate::engine::CALIBRATION_REGIONS)
    {
        s.codes.insert(exe.clone(), Some(code));
    }
    let (exit, _) = s
        .trace(None, &command, Some(Duration::from_secs(60)))
        .context("cannot measure the probe engine's own cost")?;
    let res = s.results.take().expect("results");
    if exit != Some(ExitStatus::Code(0)) || (res.calls[0] as usize) < calls / 2 {
        bail!(
            "cannot measure the probe engine's own cost: {} of {calls} calls seen",
            res.calls[0]
        );
    }
    Ok((0..res.events.len())
        .map(|e| {
            crate::engine::trimmed_mean_and_error(
                res.per_call.iter().map(|c| c.values[e]).collect(),
            )
        })
        .unzip())
}

struct Session {
    engine: Engine,
    /// The engine was chosen by superprof, which may change it (to ptrace, where uprobes
    /// cannot probe a region's instruction).
    auto_engine: bool,
    /// The engines that measured, in order.
    engines_used: Vec<Engine>,
    /// Regions counted with ptrace's breakpoints in a run on uprobes (uprobes cannot probe
    /// them).
    on_ptrace: std::collections::HashSet<usize>,
    /// In-process engine: threads that exited, with the count of records taken in the ring
    /// then: their open calls go once superprof has read that far.
    exited: Vec<(u32, u64)>,
    /// In-process engine: regions it could not probe, handed to uprobes.
    on_uprobe: std::collections::HashSet<usize>,
    /// In-process engine as root: the uprobe PMU those regions go to (else to ptrace).
    uprobe_fallback: Option<superprof_sample::UprobePmu>,
    /// Function regions whose calls end where they are probed to start (a function that is a
    /// tail jump, or whose entry probe displaced its exit): each entry is a whole call.
    instant: std::collections::HashSet<usize>,
    /// This is the run that measures the engine's own cost.
    calibrating: bool,
    /// Whether the caller was asked to stop (see [`StatConfig::stop`]).
    stop: fn() -> bool,
    /// How the kernel runs each region's first instruction (uprobe engine).
    kinds: HashMap<usize, EntryKind>,
    /// The probes placed (uprobe engine), and their groups on each thread.
    batches: Vec<Batch>,
    armed: Vec<Armed>,
    /// Where the probes' kernel events come from (dropped after `armed`).
    probe_source: Option<crate::engine::Probes>,
    /// Sites placed and not armed yet (uprobe engine): (region, address, site).
    new_sites: Vec<(usize, u64, Site)>,
    hits: Vec<superprof_sample::ProbeHit>,
    lost_hits: u64,
    events: Vec<EventSpec>,
    groups: Vec<(usize, usize)>,
    user_only: bool,
    counters: HashMap<u32, ThreadCounters>,
    regions: Vec<Region>,
    /// entry address -> region
    entries: HashMap<u64, Vec<(usize, Site)>>,
    /// exit address -> how many frames wait there
    returns: HashMap<u64, usize>,
    /// tid -> frames (outermost calls only)
    frames: HashMap<u32, Vec<Frame>>,
    /// tid -> the figures and time of its latest probe hit (in-process and uprobe engines).
    last_hit: HashMap<u32, (Vec<Reading>, u64)>,
    /// ptrace engine: function entry -> its tail calls.
    tails: HashMap<u64, Vec<u64>>,
    results: Option<Results>,
    specs: Vec<RegionSpec>,
    /// Regions not found yet, with the error to give if they never are.
    missing: HashMap<usize, String>,
    /// DWARF of the process's files, parsed once for every region that needs it.
    symbols: superprof_symbols::Symbolizer,
    /// In-process engine: the program's trampolines and record ring, what each recording
    /// probe means, the records read, a stopped thread to run system calls in (the others
    /// held) while regions are placed, and the code of the files probed.
    inproc: Option<crate::inprocess::InProcess>,
    ip_roles: Vec<Role>,
    /// The ends probed (one probe per address, whatever regions end there).
    ip_ends: std::collections::HashSet<u64>,
    /// In-process points with no room for a jump (a short `ret` in a cold part), probed with a
    /// breakpoint instead: address -> role and region. Rare paths: one stop each time.
    ip_bp: HashMap<u64, (Role, usize)>,
    records: Vec<crate::inprocess::Record>,
    stopped: Option<u32>,
    codes: HashMap<std::path::PathBuf, Option<superprof_analyze::ElfCode>>,
    /// The program's libraries are mapped (a region name may match a substring): not between
    /// an exec and the entry point.
    libraries_mapped: bool,
}

impl Session {
    fn new(
        engine: Engine,
        events: Vec<EventSpec>,
        groups: Vec<(usize, usize)>,
        user_only: bool,
        specs: Vec<RegionSpec>,
    ) -> Session {
        Session {
            engine,
            calibrating: false,
            stop: || false,
            kinds: HashMap::new(),
            auto_engine: false,
            engines_used: vec![engine],
            on_ptrace: Default::default(),
            on_uprobe: Default::default(),
            exited: Vec::new(),
            // (Not tried first: closing a uprobe takes the kernel 75 ms.)
            uprobe_fallback: match engine {
                Engine::InProcess if superprof_sample::euid() == 0 => {
                    superprof_sample::uprobe_pmu().ok()
                }
                _ => None,
            },
            instant: Default::default(),
            batches: Vec::new(),
            armed: Vec::new(),
            probe_source: None,
            new_sites: Vec::new(),
            hits: Vec::new(),
            lost_hits: 0,
            events,
            groups,
            user_only,
            counters: HashMap::new(),
            regions: Vec::new(),
            entries: HashMap::new(),
            returns: HashMap::new(),
            frames: HashMap::new(),
            last_hit: HashMap::new(),
            tails: HashMap::new(),
            results: None,
            specs,
            missing: HashMap::new(),
            symbols: superprof_symbols::Symbolizer::default(),
            inproc: None,
            ip_roles: Vec::new(),
            ip_ends: Default::default(),
            ip_bp: HashMap::new(),
            records: Vec::new(),
            stopped: None,
            codes: HashMap::new(),
            libraries_mapped: true,
        }
    }

    fn open_counters(&mut self, tid: u32) {
        if self.counters.contains_key(&tid) {
            return;
        }
        let mut counters = Vec::with_capacity(self.events.len());
        for &(start, end) in &self.groups {
            let mut leader: Option<usize> = None;
            for i in start..end {
                let group = leader.map(|l| &counters[l]);
                match Counter::open(&self.events[i], tid, self.user_only, group) {
                    Ok(c) => {
                        counters.push(c);
                        if leader.is_none() {
                            leader = Some(counters.len() - 1);
                        }
                    }
                    Err(_) => return, // the thread is gone
                }
            }
        }
        self.counters.insert(tid, ThreadCounters { counters });
    }

    fn read(&self, tid: u32) -> Vec<Reading> {
        self.counters.get(&tid).map_or_else(
            || vec![Reading::default(); self.events.len()],
            |t| {
                t.counters
                    .iter()
                    .map(|c| c.read().unwrap_or_default())
                    .collect()
            },
        )
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {:#x}", self.name, self.entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(value: u64, enabled: u64, running: u64) -> Reading {
        Reading {
            value,
            enabled,
            running,
        }
    }

    #[test]
    fn multiplexed_counts_are_scaled_as_perf_stat_does() {
        // On the PMU the whole time: as counted.
        let (v, s) = scaled_delta(&reading(100, 1000, 1000), &reading(600, 3000, 3000));
        assert_eq!((v, s), (500.0, false));
        // On it a quarter of the call's time: four times what it counted.
        let (v, s) = scaled_delta(&reading(100, 1000, 1000), &reading(200, 5000, 2000));
        assert_eq!((v, s), (400.0, true));
        // Never on it during the call: nothing counted, nothing to scale.
        let (v, s) = scaled_delta(&reading(100, 1000, 500), &reading(100, 2000, 500));
        assert_eq!((v, s), (0.0, false));
        // Readings that go backwards (a counter reset) count nothing, never wrap.
        let (v, _) = scaled_delta(&reading(500, 10, 10), &reading(100, 20, 20));
        assert_eq!(v, 0.0);
    }
}
