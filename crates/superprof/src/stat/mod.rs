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

mod output;

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use superprof_sample::{Counter, EventKind, EventSpec, Reading};
use superprof_trace::{ExitStatus, TraceEvent, TraceOptions, Tracer};

use crate::cli::StatArgs;
use crate::engine::{Engine, EntryKind};
use crate::region::{exe_bias, line_range, not_found, unique_function, Placement, RegionSpec};
use crate::sys;
use crate::NothingToShow;

/// Totals of one event over a region's calls.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub total: f64,
    pub min: f64,
    pub max: f64,
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
    pub region: usize,
    pub tid: u32,
    /// The engine that measured it, and how the kernel ran its first instruction (the
    /// engine's cost for such calls is taken off when the run ends).
    pub engine: &'static str,
    pub kind: EntryKind,
    /// Which events were scaled for multiplexing (bit per event).
    pub scaled: u64,
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
    pub regions: Vec<String>,
    /// Event names, `time-elapsed-ns` last.
    pub events: Vec<String>,
    pub calls: Vec<u64>,
    /// [region][event]
    pub stats: Vec<Vec<Stats>>,
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
    pub engine: &'static str,
    pub kind: EntryKind,
    pub cost: Vec<f64>,
    /// The standard error of each event's cost (see [`crate::engine::trimmed_mean_and_error`]).
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

fn unsupported(spec: &EventSpec, e: &std::io::Error) -> anyhow::Error {
    let why = match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) | Some(libc::EINVAL) => {
            "not supported by this CPU or VM (no hardware PMU?)".to_owned()
        }
        Some(libc::EACCES) | Some(libc::EPERM) => {
            "permission denied (perf_event_paranoid)".to_owned()
        }
        _ => e.to_string(),
    };
    anyhow!("event '{}' cannot be counted: {why}", spec.name)
}

fn list(kind: &str) -> Result<i32> {
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
    // Written with `?`: a closed stdout (`--list | head`) is a broken pipe, not a panic.
    let mut out = std::io::stdout();
    for k in kinds {
        writeln!(out, "{k:?} events:")?;
        for spec in EventSpec::all(k) {
            let status = match superprof_sample::probe(&spec) {
                Ok(()) => "supported".to_owned(),
                Err(e) => format!("not supported here ({e})"),
            };
            writeln!(out, "  {:<28} {status}", spec.name)?;
        }
    }
    writeln!(out, "Raw events: rNNNN (hex event code, e.g. r01c2)")?;
    Ok(0)
}

pub fn run(args: &StatArgs) -> Result<i32> {
    if let Some(kind) = &args.list {
        return list(kind);
    }
    sys::install_stop_handler();
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
        events.push(EventSpec::parse(e).map_err(|m| anyhow!(m))?);
        groups.push((events.len() - 1, events.len()));
    }
    for g in &args.groups {
        let start = events.len();
        for e in g.split(',').filter(|e| !e.is_empty()) {
            events.push(EventSpec::parse(e).map_err(|m| anyhow!(m))?);
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
    if let Some(out) = &args.output {
        superprof_resolve::check_text_output(out)?;
    }
    let (engine, notice) = choose_engine(args.engine, &events)?;
    if let Some(n) = notice {
        superprof_unwind::say!("{n}");
    }
    let mut session = Session::new(engine, events, groups, user_only, specs);
    session.auto_engine = args.engine.is_none();
    let (exit, signal_in_region) = session.trace(args.pid, &args.command, args.duration)?;
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
    let text = output::render(&results, args.format, args.per_call)?;
    let written = superprof_resolve::write_text(
        args.output.as_deref(),
        superprof_resolve::Console::of_run(args.pid.is_none()),
        &text,
    );
    crate::FailedAfter::wrap(written.map_err(anyhow::Error::from), exit)?;
    if let Some(status @ ExitStatus::Signal(_)) = exit {
        superprof_unwind::say!(
            "superprof: the command {status}{}",
            if signal_in_region {
                " inside a region; the counts above are those of the calls that returned"
            } else {
                ""
            }
        );
    }
    Ok(exit.map_or(0, |e| e.shell_code()))
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
    arg: Option<crate::cli::EngineArg>,
    events: &[EventSpec],
) -> Result<(Engine, Option<String>)> {
    use crate::cli::EngineArg;
    let unreadable = events.iter().find(|e| InProcessReading::of(e).is_none());
    let built = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
    match arg {
        Some(EngineArg::InProcess) if !built => bail!(
            "the in-process engine is built for x86_64 and AArch64 only: use --engine uprobe or \
             --engine ptrace"
        ),
        Some(EngineArg::InProcess) => match unreadable {
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
    if let Some(code) = crate::blocks::ElfCode::open_only(&exe, &crate::engine::CALIBRATION_REGIONS)
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
    codes: HashMap<std::path::PathBuf, Option<crate::blocks::ElfCode>>,
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
            kinds: HashMap::new(),
            auto_engine: false,
            engines_used: vec![engine],
            on_ptrace: Default::default(),
            on_uprobe: Default::default(),
            exited: Vec::new(),
            // (Not tried first: closing a uprobe takes the kernel 75 ms.)
            uprobe_fallback: match engine {
                Engine::InProcess if sys::euid() == 0 => superprof_sample::uprobe_pmu().ok(),
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

    fn first_missing(&self) -> String {
        let mut keys: Vec<&usize> = self.missing.keys().collect();
        keys.sort();
        keys.first().map_or_else(
            || "a region was not found".to_owned(),
            |k| self.missing[k].clone(),
        )
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

    /// Places the regions in process `pid`. Functions not found yet (in a library ld.so has not
    /// loaded) stay pending: Ok(false).
    /// With `explain`, a region not found gets its error message (with near names) kept in
    /// `missing`, for when it is still not found at the end.
    /// Proves every address where `region` would get a probe (its sites' starts and ends, and
    /// a function's symbol against its call-frame information) before any probe goes in: a
    /// probe inside an instruction or in data corrupts the program (issue 31).
    fn prove(
        &mut self,
        pid: u32,
        region: &Region,
        function: Option<&superprof_trace::FunctionAddress>,
    ) -> Result<()> {
        if crate::engine::is_calibration_region(&region.name) {
            return Ok(()); // superprof's own code, which it wrote
        }
        let refuse = |why: String| anyhow!("region '{}': {why}; nothing was probed", region.name);
        for &(at, site) in &region.sites {
            let (code, bias) =
                code_at(&mut self.codes, pid, at).map_err(|e| refuse(format!("{at:#x}: {e}")))?;
            code.prove_instruction_start(at.wrapping_sub(bias))
                .map_err(refuse)?;
            if let Some(end) = site.end {
                code.prove_region_end(end.wrapping_sub(bias))
                    .map_err(refuse)?;
            }
        }
        if let Some(f) = function.filter(|f| f.size > 0) {
            let (code, bias) = code_at(&mut self.codes, pid, f.addr)
                .map_err(|e| refuse(format!("{:#x}: {e}", f.addr)))?;
            code.prove_function(f.addr.wrapping_sub(bias), f.size, &f.name)
                .map_err(refuse)?;
        }
        Ok(())
    }

    fn place(&mut self, tracer: &mut Tracer, pid: u32, explain: bool) -> Result<bool> {
        let mut all = true;
        for (i, spec) in self.specs.clone().iter().enumerate() {
            if self.regions.len() > i && self.regions[i].entry != 0 {
                continue;
            }
            let mut function = None;
            let region = match spec {
                RegionSpec::Function(name) => {
                    let found = unique_function(pid, name, self.libraries_mapped)?;
                    function.clone_from(&found);
                    let mut sites: Vec<(u64, Site)> = found
                        .as_ref()
                        .map(|f| {
                            let site = Site {
                                end: None,
                                ends_at_return: true,
                            };
                            vec![(f.addr, site)]
                        })
                        .unwrap_or_default();
                    // Its inlined copies are sites of the same region (the calibration
                    // region has none: superprof's own DWARF is not searched for them).
                    let target = found.as_ref().map_or(name.as_str(), |f| f.name.as_str());
                    let inlined = if crate::engine::is_calibration_region(target) {
                        Vec::new()
                    } else {
                        inlined_sites(
                            &mut self.symbols,
                            pid,
                            target,
                            found.as_ref().map(|f| &f.module),
                        )
                    };
                    for (start, end) in inlined {
                        let site = Site {
                            end: Some(end),
                            ends_at_return: false,
                        };
                        sites.push((start, site));
                    }
                    match sites.first() {
                        Some(&(entry, _)) => Region {
                            name: target.to_owned(),
                            entry,
                            sites,
                        },
                        None => {
                            all = false;
                            if explain {
                                self.missing.insert(i, not_found(pid, name));
                            }
                            Region {
                                name: name.clone(),
                                entry: 0,
                                sites: Vec::new(),
                            }
                        }
                    }
                }
                RegionSpec::Lines(f1, l1, f2, l2) => match line_range(&mut self.symbols, pid, (f1, *l1), (f2, *l2)) {
                    Some((start, end)) => {
                        let site = Site {
                            end: Some(end),
                            ends_at_return: superprof_trace::function_at(pid, start)?.is_some(),
                        };
                        Region {
                            name: spec.label(),
                            entry: start,
                            sites: vec![(start, site)],
                        }
                    }
                    None if explain => bail!(
                        "no code for {} (is the program built with -g, and is the file name right?)",
                        spec.label()
                    ),
                    None => {
                        all = false;
                        Region {
                            name: spec.label(),
                            entry: 0,
                            sites: Vec::new(),
                        }
                    }
                },
                RegionSpec::Range(a, b) => {
                    let bias =
                        exe_bias(pid).context("cannot find the executable's load address")?;
                    let site = Site {
                        end: Some(b + bias),
                        ends_at_return: superprof_trace::function_at(pid, a + bias)?.is_some(),
                    };
                    Region {
                        name: spec.label(),
                        entry: a + bias,
                        sites: vec![(a + bias, site)],
                    }
                }
            };
            if region.entry != 0 {
                self.prove(pid, &region, function.as_ref())?;
                self.missing.remove(&i);
                let mut code = [0u8; 16];
                let n = tracer.read_code(pid, region.entry, &mut code);
                self.kinds.insert(i, EntryKind::of(&code[..n]));
                for &(at, site) in &region.sites {
                    match self.engine {
                        _ if self.on_ptrace.contains(&i) => {
                            tracer.set_breakpoint(pid, at).with_context(|| {
                                format!("cannot place a breakpoint for region '{}'", region.name)
                            })?;
                        }
                        Engine::Ptrace => {
                            tracer.set_breakpoint(pid, at).with_context(|| {
                                format!("cannot place a breakpoint for region '{}'", region.name)
                            })?;
                        }
                        Engine::Uprobe(_) | Engine::InProcess => self.new_sites.push((i, at, site)),
                    }
                    self.entries.entry(at).or_default().push((i, site));
                }
            }
            if self.regions.len() > i {
                self.regions[i] = region;
            } else {
                self.regions.push(region);
            }
        }
        self.arm(tracer, pid)?;
        Ok(all)
    }

    /// Where the uprobe of the function entered at `at` may stand (x86_64): the first
    /// instruction the kernel emulates among those [`superprof_analyze::patch::quiet_head`]
    /// allows (only register moves before it: every call passes it with the entry's stack
    /// pointer), where no direct branch of the file lands between; else `at`.
    /// Never onto one of its `exits` (a function that is a register move and a tail jump).
    /// A function whose first instruction is lock-prefixed (which uprobes refuse: a function
    /// counting its own calls in a global) has its probe on the first allowed instruction
    /// after it, whatever its kind.
    fn emulated_entry(&mut self, tracer: &Tracer, pid: u32, at: u64, exits: &[u64]) -> u64 {
        let mut code = [0u8; 96];
        let n = tracer.read_code(pid, at, &mut code);
        let Ok((elf, bias)) = code_at(&mut self.codes, pid, at) else {
            return at;
        };
        let locked = superprof_analyze::patch::has_lock_prefix(&code[..n], at);
        let mut past_lock = None;
        for q in superprof_analyze::patch::quiet_head(&code[..n], at, 8) {
            let off = (q - at) as usize;
            if off + 15 > n {
                break;
            }
            if q > at
                && (exits.contains(&q)
                    || elf.targeted(at.wrapping_sub(bias) + 1, q.wrapping_sub(bias) + 1))
            {
                break;
            }
            if EntryKind::of(&code[off..n]) == EntryKind::Emulated {
                return q;
            }
            if locked && q > at && past_lock.is_none() {
                past_lock = Some(q);
            }
        }
        past_lock.unwrap_or(at)
    }

    /// Forgets every region placed in an image that exec replaced (the calls counted stay).
    fn forget_placements(&mut self) {
        self.regions.clear();
        self.entries.clear();
        self.returns.clear();
        self.frames.clear();
        self.tails.clear();
        self.new_sites.clear();
        self.kinds.clear();
        self.missing.clear();
        self.on_ptrace.clear();
        self.on_uprobe.clear();
        self.exited.clear();
        self.instant.clear();
        self.armed.clear();
        self.batches.clear();
        self.inproc = None;
        self.ip_roles.clear();
        self.ip_ends.clear();
        self.ip_bp.clear();
    }

    /// Opens the uprobes of the sites placed since the last call, in one group per thread of
    /// process `pid` (threads made later get theirs at their first stop).
    fn arm(&mut self, tracer: &mut Tracer, pid: u32) -> Result<()> {
        if matches!(self.engine, Engine::InProcess) {
            return self.arm_in_process(tracer, pid);
        }
        let Engine::Uprobe(pmu) = self.engine else {
            return Ok(());
        };
        let sites = std::mem::take(&mut self.new_sites);
        self.arm_uprobes(tracer, pid, sites, pmu)
    }

    /// Opens uprobes for `sites` (the uprobe engine's, or regions the in-process engine
    /// handed over), in one group per thread of process `pid`.
    fn arm_uprobes(
        &mut self,
        tracer: &mut Tracer,
        pid: u32,
        sites: Vec<(usize, u64, Site)>,
        pmu: superprof_sample::UprobePmu,
    ) -> Result<()> {
        let mut specs = Vec::new();
        let mut roles = Vec::new();
        let mut kept = Vec::new();
        let mut ends: HashMap<u64, ()> = HashMap::new();
        for (region, at, site) in sites {
            if self.on_ptrace.contains(&region) {
                continue;
            }
            let name = self
                .regions
                .get(region)
                .map_or("", |r| r.name.as_str())
                .to_owned();
            let spec = crate::engine::probe_at(pid, at)
                .ok_or_else(|| anyhow!("region '{name}' is in no file: it cannot be probed"))?;
            // Its returns and tail calls, not a return probe: a uretprobe replaces the return
            // address on the stack, and a C++ exception unwinding through that frame then
            // finds no caller and terminates the program.
            let exits: Vec<u64> = if site.ends_at_return {
                match function_exits(tracer, pid, at, &mut self.codes) {
                    Some(exits) => exits.into_iter().map(|(x, _, _)| x).collect(),
                    None => {
                        let why = format!(
                            "cannot find where region '{name}' returns (no size in its symbol, \
                             or code that does not decode)"
                        );
                        self.region_to_ptrace(tracer, pid, region, &why)?;
                        continue;
                    }
                }
            } else {
                Vec::new()
            };
            // A function's entry probe on the first instruction of its entry block that the
            // kernel emulates, where only register moves come before it: a stepped hit costs
            // about 10 µs more here (docs/benchmarks.md).
            let entry_probe = if site.ends_at_return && cfg!(target_arch = "x86_64") {
                self.emulated_entry(tracer, pid, at, &exits)
            } else {
                at
            };
            let spec = if entry_probe != at {
                let mut code = [0u8; 16];
                let n = tracer.read_code(pid, entry_probe, &mut code);
                self.kinds.insert(region, EntryKind::of(&code[..n]));
                crate::engine::probe_at(pid, entry_probe).unwrap_or(spec)
            } else {
                spec
            };
            specs.push(spec);
            roles.push(Role::Entry(region, site));
            if exits.contains(&entry_probe) {
                // A function that starts with its exit (a tail jump): each entry is a call.
                self.instant.insert(region);
            }
            for x in exits.into_iter().filter(|&x| x != entry_probe) {
                let spec = crate::engine::probe_at(pid, x).ok_or_else(|| {
                    anyhow!("the returns of region '{name}' are in no file: they cannot be probed")
                })?;
                specs.push(spec);
                roles.push(Role::Exit(region));
            }
            if let Some(end) = site.end.filter(|e| ends.insert(*e, ()).is_none()) {
                let spec = crate::engine::probe_at(pid, end).ok_or_else(|| {
                    anyhow!("the end of region '{name}' is in no file: it cannot be probed")
                })?;
                specs.push(spec);
                roles.push(Role::End(end));
            }
            kept.push((region, at, site));
        }
        if specs.is_empty() {
            return Ok(());
        }
        let source = self
            .probe_source
            .get_or_insert_with(|| crate::engine::Probes::new(pmu));
        let probes = specs.iter().map(|s| source.event(s)).collect();
        self.batches.push(Batch {
            sites: kept,
            probes,
            roles,
        });
        let batch = self.batches.len() - 1;
        for tid in superprof_sample::list_threads(pid).unwrap_or_else(|_| vec![pid]) {
            if let Err(e) = self.arm_thread(batch, tid) {
                let refused = e.probe.filter(|_| e.unsupported_instruction());
                let Some(probe) = refused else {
                    bail!("cannot open the uprobes of the regions on thread {tid}: {e}");
                };
                // That region goes on with ptrace; the others of the batch are armed again
                // without it.
                let what = self.probe_label(batch, probe);
                let regions = self.regions_of_probe(batch, probe);
                self.drain_hits(pid);
                self.armed.retain(|a| a.batch != batch);
                let b = &mut self.batches[batch];
                b.probes.clear();
                b.roles.clear();
                let sites = std::mem::take(&mut b.sites);
                let why = format!(
                    "the kernel cannot put a uprobe on {what} (on x86, an instruction with a \
                     lock prefix, say)"
                );
                for r in regions {
                    self.on_uprobe.remove(&r);
                    self.region_to_ptrace(tracer, pid, r, &why)?;
                }
                return self.arm_uprobes(tracer, pid, sites, pmu);
            }
        }
        Ok(())
    }

    /// Puts recording probes on the sites placed since the last call (in-process engine), from
    /// the stopped thread `self.stopped` (none: they wait). A region the engine cannot probe
    /// goes to ptrace (see `region_to_ptrace`).
    fn arm_in_process(&mut self, tracer: &mut Tracer, pid: u32) -> Result<()> {
        let Some(tid) = self.stopped else {
            return Ok(());
        };
        let sites = std::mem::take(&mut self.new_sites);
        let mut regions: Vec<usize> = sites.iter().map(|s| s.0).collect();
        regions.dedup();
        // Regions the engine cannot probe, for uprobes (as root) or else ptrace.
        let mut handed: Vec<(usize, String)> = Vec::new();
        if self.inproc.is_none() && !regions.is_empty() {
            match crate::inprocess::InProcess::new(pid) {
                Ok(ip) => self.inproc = Some(ip),
                Err(why) => {
                    let handed = regions.into_iter().map(|r| (r, why.clone())).collect();
                    return self.hand_over(tracer, pid, &sites, handed);
                }
            }
        }
        for r in regions {
            if self.on_ptrace.contains(&r) {
                continue;
            }
            let mine: Vec<(u64, Site)> = sites
                .iter()
                .filter(|s| s.0 == r)
                .map(|s| (s.1, s.2))
                .collect();
            let mut patched = Vec::new();
            let result = mine.iter().try_for_each(|&(at, site)| {
                self.probe_site(tracer, tid, pid, r, at, site, &mut patched)
            });
            if let Err(why) = result {
                // The region goes to ptrace: its probes come out.
                for at in patched {
                    let _ = tracer.unpatch(pid, at);
                }
                let mine: Vec<u64> = self
                    .ip_bp
                    .iter()
                    .filter(|(_, &(_, g))| g == r)
                    .map(|(&a, _)| a)
                    .collect();
                for a in mine {
                    self.ip_bp.remove(&a);
                    let _ = tracer.remove_breakpoint(pid, a);
                }
                self.instant.remove(&r);
                handed.push((r, why));
            }
        }
        self.hand_over(tracer, pid, &sites, handed)
    }

    /// Regions the in-process engine cannot probe (with why): to uprobes, which never stop
    /// the program, where this process may open them (root; new threads are then held until
    /// theirs are open), else to ptrace's breakpoints.
    fn hand_over(
        &mut self,
        tracer: &mut Tracer,
        pid: u32,
        sites: &[(usize, u64, Site)],
        handed: Vec<(usize, String)>,
    ) -> Result<()> {
        let Some(pmu) = self.uprobe_fallback.filter(|_| self.auto_engine) else {
            for (r, why) in handed {
                self.region_to_ptrace(tracer, pid, r, &why)?;
            }
            return Ok(());
        };
        let mut mine = Vec::new();
        for (r, why) in handed {
            let name = self
                .regions
                .get(r)
                .map_or_else(|| "?".to_owned(), |g| g.name.clone());
            superprof_unwind::say!(
                "superprof: region '{name}' is probed with uprobes (the in-process engine \
                 cannot: {why})"
            );
            self.on_uprobe.insert(r);
            mine.extend(sites.iter().filter(|s| s.0 == r).copied());
        }
        if mine.is_empty() {
            return Ok(());
        }
        if !self
            .engines_used
            .iter()
            .any(|e| matches!(e, Engine::Uprobe(_)))
        {
            self.engines_used.push(Engine::Uprobe(pmu));
        }
        self.arm_uprobes(tracer, pid, mine, pmu)
    }

    /// Recording probes for one site of region `region` (in-process engine): a function's
    /// entry and exits, or a start (a range, an inlined copy), and its end. Every patch made is
    /// added to `patched` (taken out by the caller if the region cannot be probed in the end).
    #[allow(clippy::too_many_arguments)]
    fn probe_site(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        pid: u32,
        region: usize,
        at: u64,
        site: Site,
        patched: &mut Vec<u64>,
    ) -> Result<(), String> {
        if site.ends_at_return {
            self.probe_function(tracer, tid, pid, region, at, site, patched)?;
        } else {
            self.probe_point(tracer, tid, pid, at, Role::Entry(region, site), patched)
                .map_err(|e| format!("its start: {e}"))?;
        }
        if let Some(end) = site.end {
            // (One probe per end, whatever regions end there.)
            if self.ip_ends.insert(end) {
                let placed = self.probe_point(tracer, tid, pid, end, Role::End(end), patched);
                if let Err(e) = placed {
                    self.ip_ends.remove(&end);
                    return Err(format!("its end: {e}"));
                }
            }
        }
        Ok(())
    }

    /// A recording probe with role `role` at `addr`, an instruction anywhere in a function:
    /// the instructions from there to the end of its block move (where no jump table could
    /// land between them), else one long one must start there.
    fn probe_point(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        pid: u32,
        addr: u64,
        role: Role,
        patched: &mut Vec<u64>,
    ) -> Result<(), String> {
        use crate::inprocess::patch::{Recording, SpAt};
        let (code, bias) = code_at(&mut self.codes, pid, addr)?;
        let at = addr.wrapping_sub(bias);
        let f = code.function_at(at).ok_or("no function symbol holds it")?;
        if !code.is_instruction_start(at) {
            return Err(format!("{addr:#x} is not the start of an instruction"));
        }
        let blocks = code.counted_blocks(f.addr, f.addr + f.size);
        let (k, b) = blocks
            .iter()
            .enumerate()
            .find(|(_, b)| b.start <= at && at < b.end)
            .ok_or("its code does not decode")?;
        let several = at == f.addr || code.without_indirect_jumps(at);
        let from = superprof_analyze::Block {
            start: at,
            end: b.end,
            instructions: 1,
            flow: b.flow,
        };
        let next = blocks.get(k + 1).map_or(u64::MAX, |n| n.start);
        let boards = crate::inprocess::springboards(code, f.addr, f.addr + f.size, bias);
        let site = crate::inprocess::Site::of(code, &from, next, bias, several, &boards);
        let pcs = crate::inprocess::thread_pcs(tracer, pid);
        let inside = |from: u64, len: u64| pcs.iter().any(|pc| (from..from + len).contains(pc));
        let (cputime, rusage) = InProcessReading::needs(&self.events);
        let recording = Recording {
            probe: self.ip_roles.len() as u32,
            sp: SpAt::Rsp(0),
            cputime,
            rusage,
        };
        let inproc = self.inproc.as_mut().ok_or("no in-process engine")?;
        let (at, _) = inproc.probe(tracer, tid, &site, &inside, &recording, true)?;
        patched.push(at);
        self.ip_roles.push(role);
        Ok(())
    }

    /// Recording probes at the entry of the function at `at` and at each of its exits (a
    /// `ret` or a jump out, with the filler after it; else before it, recording the stack
    /// pointer the exit will have).
    #[allow(clippy::too_many_arguments)]
    fn probe_function(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        pid: u32,
        region: usize,
        at: u64,
        site: Site,
        patched: &mut Vec<u64>,
    ) -> Result<(), String> {
        use crate::inprocess::patch::{self, Recording, SpAt};
        use crate::inprocess::Site as Patched;
        let exits = function_exits(tracer, pid, at, &mut self.codes)
            .ok_or("cannot find where it returns")?;
        let (code, bias) = code_at(&mut self.codes, pid, at)?;
        let start = at.wrapping_sub(bias);
        let f = code
            .function_at(start)
            .filter(|f| f.addr == start)
            .ok_or("no function symbol starts there")?;
        let blocks = code.counted_blocks(f.addr, f.addr + f.size);
        let several = code.without_indirect_jumps(start);
        let pcs = crate::inprocess::thread_pcs(tracer, pid);
        let inside = |from: u64, len: u64| pcs.iter().any(|pc| (from..from + len).contains(pc));
        let (cputime, rusage) = InProcessReading::needs(&self.events);
        let rec = |probe: usize, sp: SpAt| Recording {
            probe: probe as u32,
            sp,
            cputime,
            rusage,
        };
        let inproc = self.inproc.as_mut().ok_or("no in-process engine")?;
        let next_of = |k: usize| blocks.get(k + 1).map_or(u64::MAX, |n| n.start);
        // The entry: its first instructions (nothing jumps into a function's first bytes).
        let b0 = blocks
            .first()
            .filter(|b| b.start == start)
            .ok_or("its code does not decode")?;
        let boards = crate::inprocess::springboards(code, f.addr, f.addr + f.size, bias);
        let entry = Patched::of(code, b0, next_of(0), bias, true, &boards);
        let b0_end = b0.end.wrapping_add(bias);
        // Whether nothing from the entry up to exit `x` (runtime address) in the entry block can
        // fault: a call that ends there may be taken as ending where it starts.
        let b0_bytes = code.bytes(b0.start, b0.end - b0.start).unwrap_or_default();
        let quiet_to = |x: u64| {
            x < b0_end
                && patch::quiet_tail(b0_bytes, b0.start, x.wrapping_sub(bias)).contains(&b0.start)
        };
        let probe = self.ip_roles.len();
        let (first, first_end) = inproc
            .probe(
                tracer,
                tid,
                &entry,
                &inside,
                &rec(probe, SpAt::Rsp(0)),
                true,
            )
            .map_err(|e| format!("its entry: {e}"))?;
        self.ip_roles.push(Role::Entry(region, site));
        patched.push(first);
        // The blocks of the function's parts placed elsewhere (f.cold), as they come.
        let mut parts: HashMap<(u64, u64), Vec<superprof_analyze::Block>> = HashMap::new();
        for (x, (plo, phi), _) in exits {
            if (first..first_end).contains(&x) {
                // The exit moved with the entry's instructions: the entry block ends in it, so
                // every call ends as it starts (where nothing between can fault: a call that
                // faults there has not ended).
                if !quiet_to(x) {
                    return Err(format!(
                        "a return at {x:#x} moved with the entry's instructions, after some that \
                         may fault"
                    ));
                }
                self.instant.insert(region);
                continue;
            }
            let ex = x.wrapping_sub(bias);
            let part = if plo == at {
                &blocks
            } else {
                parts.entry((plo, phi)).or_insert_with(|| {
                    code.counted_blocks(plo.wrapping_sub(bias), phi.wrapping_sub(bias))
                })
            };
            let next_of = |k: usize| part.get(k + 1).map_or(u64::MAX, |n| n.start);
            let (k, b) = part
                .iter()
                .enumerate()
                .find(|(_, b)| b.start <= ex && ex < b.end)
                .ok_or_else(|| format!("a return at {x:#x} is in no block"))?;
            // A part elsewhere: several instructions may move where it has no indirect jump.
            let (several, part_boards) = if plo == at {
                (several, None)
            } else {
                let (lo, hi) = (plo.wrapping_sub(bias), phi.wrapping_sub(bias));
                let direct_only = code.bytes(lo, hi - lo).is_some_and(|c| {
                    !superprof_analyze::decode_all_for(code.arch, c, lo)
                        .iter()
                        .any(|i| i.flow == superprof_analyze::Flow::IndirectJump)
                });
                (
                    direct_only,
                    Some(crate::inprocess::springboards(code, lo, hi, bias)),
                )
            };
            let boards = part_boards.as_deref().unwrap_or(&boards);
            let probe = self.ip_roles.len();
            // At the exit itself (and the filler after it), else before it where nothing in
            // between can fault (a call that faults there must not be counted as ended),
            // recording the stack pointer the exit will have. Several instructions move only
            // where no jump table could land between them.
            let bytes = code.bytes(b.start, b.end - b.start).unwrap_or_default();
            let mut placed = Err("no room for a jump".to_owned());
            for q in patch::quiet_tail(bytes, b.start, ex) {
                let Some(sp) = patch::sp_at(&bytes[(q - b.start) as usize..], q, ex) else {
                    continue;
                };
                let from = superprof_analyze::Block {
                    start: q,
                    end: b.end,
                    instructions: 1,
                    flow: b.flow,
                };
                let site = Patched::of(code, &from, next_of(k), bias, several || q == ex, boards);
                placed = inproc.probe(tracer, tid, &site, &inside, &rec(probe, sp), true);
                if placed.is_ok() {
                    break;
                }
            }
            match placed {
                Ok((at, _)) => {
                    patched.push(at);
                    self.ip_roles.push(Role::Exit(region));
                }
                // An exit that ends the entry block (straight code from the entry: no call, no
                // system call, nothing that can fault) with no room of its own (its bytes, or
                // the filler after them, taken by other probes): every call ends there as it
                // starts.
                Err(_) if plo == at && quiet_to(x) => {
                    self.instant.insert(region);
                }
                Err(e) if plo == at => return Err(format!("a return at {x:#x}: {e}")),
                // No room for a jump in a part placed elsewhere (a cold path, which the
                // compiler expects rare): a breakpoint there, which reads the thread's counters
                // from /proc when a call leaves that way (its stop is in that call's figures).
                // As root, the whole region goes to uprobes instead (no int3 where a uprobe
                // works).
                Err(e) if self.uprobe_fallback.is_some() && self.auto_engine => {
                    return Err(format!(
                        "a return at {x:#x} in a part placed elsewhere: {e}"
                    ))
                }
                Err(e) => {
                    tracer
                        .set_breakpoint(pid, x)
                        .map_err(|b| format!("a return at {x:#x}: {e}, and no breakpoint: {b}"))?;
                    self.ip_bp.insert(x, (Role::Exit(region), region));
                }
            }
        }
        Ok(())
    }

    /// The regions probe `probe` of batch `batch` serves.
    fn regions_of_probe(&self, batch: usize, probe: usize) -> Vec<usize> {
        let b = &self.batches[batch];
        match b.roles.get(probe) {
            Some(Role::Entry(r, _)) | Some(Role::Exit(r)) => vec![*r],
            Some(Role::End(addr)) => b
                .sites
                .iter()
                .filter(|(_, _, site)| site.end == Some(*addr))
                .map(|(r, _, _)| *r)
                .collect(),
            None => Vec::new(),
        }
    }

    /// Region `region` is counted with ptrace's breakpoints from now on, the others staying
    /// on uprobes (`why`: what uprobes cannot do there). With `--engine uprobe`, an error.
    fn region_to_ptrace(
        &mut self,
        tracer: &mut Tracer,
        pid: u32,
        region: usize,
        why: &str,
    ) -> Result<()> {
        if !self.auto_engine {
            bail!("{why}: use --engine ptrace");
        }
        let name = self
            .regions
            .get(region)
            .map_or_else(|| "?".to_owned(), |r| r.name.clone());
        superprof_unwind::say!(
            "superprof: region '{name}' is probed with ptrace (the program stops at each of its \
             probes): {why}"
        );
        self.on_ptrace.insert(region);
        if !self
            .engines_used
            .iter()
            .any(|e| matches!(e, Engine::Ptrace))
        {
            self.engines_used.push(Engine::Ptrace);
        }
        for tid in superprof_sample::list_threads(pid).unwrap_or_else(|_| vec![pid]) {
            self.open_counters(tid);
        }
        let entries: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, sites)| sites.iter().any(|(r, _)| *r == region))
            .map(|(&at, _)| at)
            .collect();
        for at in entries {
            tracer
                .set_breakpoint(pid, at)
                .with_context(|| format!("cannot place a breakpoint for region '{name}'"))?;
        }
        Ok(())
    }

    /// Whether region `region`'s calls are counted with ptrace's breakpoints.
    fn by_ptrace(&self, region: usize) -> bool {
        matches!(self.engine, Engine::Ptrace) || self.on_ptrace.contains(&region)
    }

    /// What probe `probe` of batch `batch` is on, for a message.
    fn probe_label(&self, batch: usize, probe: usize) -> String {
        let region = |r: usize| self.regions.get(r).map_or("?", |r| r.name.as_str());
        match self.batches[batch].roles.get(probe) {
            Some(Role::Entry(r, _)) => format!("the first instruction of region '{}'", region(*r)),
            Some(Role::Exit(r)) => format!("a return of region '{}'", region(*r)),
            Some(Role::End(addr)) => format!("the end of a region, at {addr:#x}"),
            None => "a region".to_owned(),
        }
    }

    /// Opens batch `batch`'s group on thread `tid` (a thread already gone is passed over).
    fn arm_thread(&mut self, batch: usize, tid: u32) -> Result<(), superprof_sample::ProbeError> {
        if self.batches[batch].probes.is_empty() {
            return Ok(());
        }
        // 4 MiB of ring for each of the first 16 threads (about 40,000 hits, read every
        // 10 ms), less past them.
        let pages = match self.armed.len() {
            0..16 => 1024,
            16..256 => 128,
            _ => 16,
        };
        let events = self.all_events();
        match superprof_sample::ProbeGroup::open(
            tid,
            &self.batches[batch].probes,
            &events,
            self.user_only,
            pages,
        ) {
            Ok(group) => self.armed.push(Armed { batch, tid, group }),
            Err(e) if e.no_thread() => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// A new thread: every batch's probes on it too, before it runs.
    fn arm_new_thread(&mut self, tid: u32) -> Result<()> {
        for batch in 0..self.batches.len() {
            if self.armed.iter().any(|a| a.batch == batch && a.tid == tid) {
                continue; // armed at its NewThread already
            }
            self.arm_thread(batch, tid).with_context(|| {
                format!("cannot open the uprobes of the regions on thread {tid}")
            })?;
        }
        Ok(())
    }

    /// A thread ended: its last hits read, its groups closed.
    fn disarm_thread(&mut self, root: u32, tid: u32) {
        self.drain_hits(root);
        self.armed.retain(|a| a.tid != tid);
    }

    /// Every event, in order (the uprobe engine counts them all in one group).
    fn all_events(&self) -> Vec<EventSpec> {
        self.events.clone()
    }

    /// A thread that ended (or the process): its calls still open were left by its end and
    /// count, with the figures of its last hit (the return breakpoints they held are
    /// released).
    fn forget_thread(&mut self, tid: u32) {
        let last = self.last_hit.remove(&tid);
        if let Some(frames) = self.frames.remove(&tid) {
            // Calls left by the thread's end (pthread_exit, the process's exit or death): still
            // calls, with the thread's figures at its last hit (ptrace: its counters now).
            let (end, end_ns) = match last {
                Some((values, time)) => (values, Some(time)),
                None => (self.read(tid), None),
            };
            for f in frames {
                self.results.as_mut().expect("results").uncertain[f.region] += f.nested;
                let elapsed = match end_ns {
                    Some(t) if f.start_ns > 0 => t.saturating_sub(f.start_ns) as f64,
                    _ => f.started.elapsed().as_nanos() as f64,
                };
                self.record(tid, &f, &end, elapsed);
                for exit in f.exits.iter().map(|e| e.0).chain(f.tails.iter().copied()) {
                    if let Some(n) = self.returns.get_mut(&exit) {
                        *n = n.saturating_sub(1);
                    }
                }
            }
        }
    }

    /// Reads the uprobe rings, or the in-process ring, and turns their hits into calls.
    fn drain_hits(&mut self, root: u32) {
        if let Some(ip) = self.inproc.as_mut() {
            let mut records = std::mem::take(&mut self.records);
            records.clear();
            self.lost_hits += ip.drain(&mut records);
            let reads: Vec<Option<InProcessReading>> =
                self.events.iter().map(InProcessReading::of).collect();
            for r in &records {
                let Some(&role) = self.ip_roles.get(r.probe as usize) else {
                    continue;
                };
                // A region moved to ptrace after its probes went in: theirs are ignored (an
                // end shared with one on ptrace too: its breakpoint closes those frames).
                match role {
                    Role::Entry(region, _) | Role::Exit(region) => {
                        if self.on_ptrace.contains(&region) {
                            continue;
                        }
                    }
                    Role::End(addr) => {
                        let on_ptrace = self.on_ptrace.iter().any(|&r| {
                            self.regions
                                .get(r)
                                .is_some_and(|g| g.sites.iter().any(|(_, s)| s.end == Some(addr)))
                        });
                        if on_ptrace {
                            continue;
                        }
                    }
                }
                let hit = superprof_sample::ProbeHit {
                    probe: r.probe as usize,
                    pid: root,
                    tid: r.tid,
                    time: r.time,
                    sp: r.sp,
                    values: reads
                        .iter()
                        .map(|x| Reading {
                            value: x.map_or(0, |x| x.value(r)),
                            ..Reading::default()
                        })
                        .collect(),
                };
                self.on_hit(role, &hit);
            }
            self.records = records;
            // Threads that exited whose every record is read now.
            let read = self.inproc.as_ref().map_or(u64::MAX, |ip| ip.read());
            let done: Vec<u32> = self
                .exited
                .iter()
                .filter(|&&(_, taken)| taken <= read)
                .map(|&(tid, _)| tid)
                .collect();
            self.exited.retain(|&(_, taken)| taken > read);
            for tid in done {
                self.forget_thread(tid);
            }
        }
        for a in 0..self.armed.len() {
            let mut hits = std::mem::take(&mut self.hits);
            hits.clear();
            self.lost_hits += self.armed[a].group.drain(&mut hits);
            let batch = self.armed[a].batch;
            for h in &hits {
                if h.pid != root {
                    continue;
                }
                if let Some(&role) = self.batches[batch].roles.get(h.probe) {
                    self.on_hit(role, h);
                }
            }
            self.hits = hits;
        }
    }

    fn on_hit(&mut self, role: Role, h: &superprof_sample::ProbeHit) {
        // The thread's latest figures: those of a call it leaves by ending.
        match self.last_hit.get_mut(&h.tid) {
            Some((values, time)) => {
                values.clone_from(&h.values);
                *time = h.time;
            }
            None => {
                self.last_hit.insert(h.tid, (h.values.clone(), h.time));
            }
        }
        let frames = self.frames.entry(h.tid).or_default();
        // A call found left without a return (an exception, a longjmp): still a call, with
        // its events up to this hit, the first to show it was left.
        let mut left = None;
        let closed = match role {
            Role::Entry(region, site) if site.ends_at_return && self.instant.contains(&region) => {
                let frame = Frame {
                    region,
                    exits: Vec::new(),
                    sp: h.sp,
                    start: h.values.clone(),
                    started: Instant::now(),
                    start_ns: h.time,
                    nested: 0,
                    tails: Vec::new(),
                };
                self.record(h.tid, &frame, &h.values, 0.0);
                return;
            }
            Role::Entry(region, site) => {
                if let Some(p) = frames.iter().position(|f| f.region == region) {
                    if !site.ends_at_return || h.sp < frames[p].sp {
                        // Recursion: the outermost call counts. (Or the open call was left
                        // and this one begins deeper: told only if it turns out left.)
                        if site.ends_at_return {
                            frames[p].nested += 1;
                        }
                        return;
                    }
                    // Entered again at the same depth or above: the open call was left without
                    // a return (an exception, a longjmp).
                    left = Some(frames.remove(p));
                }
                let mut exits = Vec::new();
                if let Some(end) = site.end {
                    exits.push((end, false));
                }
                if site.ends_at_return {
                    exits.push((0, true));
                }
                if !exits.is_empty() {
                    frames.push(Frame {
                        region,
                        exits,
                        sp: h.sp,
                        start: h.values.clone(),
                        started: Instant::now(),
                        start_ns: h.time,
                        nested: 0,
                        tails: Vec::new(),
                    });
                }
                None
            }
            Role::End(addr) => frames
                .iter()
                .rposition(|f| f.exits.iter().any(|&(a, r)| !r && a == addr)),
            Role::Exit(region) => {
                let open = frames
                    .iter()
                    .rposition(|f| f.region == region && f.exits.iter().any(|&(_, r)| r));
                match open {
                    // The outermost call leaving (a recursive one leaves with its stack lower).
                    Some(p) if h.sp == frames[p].sp => Some(p),
                    // Leaving a call above it: it was left without a return.
                    Some(p) if h.sp > frames[p].sp => {
                        left = Some(frames.remove(p));
                        None
                    }
                    _ => None,
                }
            }
        };
        let closed = closed.map(|pos| frames.remove(pos));
        if let Some(f) = &left {
            self.results.as_mut().expect("results").uncertain[f.region] += f.nested;
        }
        for frame in left.iter().chain(closed.iter()) {
            let elapsed = h.time.saturating_sub(frame.start_ns) as f64;
            self.record(h.tid, frame, &h.values, elapsed);
        }
    }

    /// What an in-process record would say, for thread `tid` stopped at a breakpoint: the time,
    /// its stack pointer, and its counters read from /proc (CPU time from schedstat, faults
    /// from stat, context switches from status).
    fn hit_from_proc(
        &self,
        tracer: &Tracer,
        tid: u32,
        pid: u32,
    ) -> Option<superprof_sample::ProbeHit> {
        let sp = tracer.regs(tid).ok()?.sp;
        let time = superprof_trace::monotonic_ns();
        let cputime = superprof_trace::CpuTime::open(pid, tid)
            .and_then(|c| c.read())
            .unwrap_or(0);
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
        // After the command's closing parenthesis: state is field 3; minflt 10, majflt 12.
        let rest = stat.rsplit_once(')')?.1;
        let field = |n: usize| -> u64 {
            rest.split_whitespace()
                .nth(n - 3)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
        let count = |key: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let r = crate::inprocess::Record {
            probe: 0,
            tid,
            sp,
            time,
            cputime,
            minflt: field(10),
            majflt: field(12),
            nvcsw: count("voluntary_ctxt_switches:"),
            nivcsw: count("nonvoluntary_ctxt_switches:"),
        };
        Some(superprof_sample::ProbeHit {
            probe: 0,
            pid,
            tid,
            time,
            sp,
            values: self
                .events
                .iter()
                .map(|e| Reading {
                    value: InProcessReading::of(e).map_or(0, |x| x.value(&r)),
                    ..Reading::default()
                })
                .collect(),
        })
    }

    fn on_breakpoint(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) {
        if let Some(&(role, region)) = self.ip_bp.get(&addr) {
            if !self.on_ptrace.contains(&region) {
                // The ring's records first: this thread's entry is among them.
                self.drain_hits(pid);
                if let Some(hit) = self.hit_from_proc(tracer, tid, pid) {
                    self.on_hit(role, &hit);
                }
            }
        }
        // A return (or range end) first: a thread leaving one region may enter another at once.
        // Every frame that ends here ends (a function that tail-jumps into another region
        // returns with it, to the same address).
        if self.returns.contains_key(&addr) {
            let sp = tracer.regs(tid).map(|r| r.sp).unwrap_or(0);
            let end = self.read(tid);
            loop {
                let frames = self.frames.entry(tid).or_default();
                let Some(pos) = frames.iter().rposition(|f| {
                    f.exits
                        .iter()
                        .any(|&(a, is_return)| a == addr && (!is_return || popped(sp, f.sp)))
                        || (sp == f.sp && f.tails.contains(&addr))
                }) else {
                    break;
                };
                let frame = frames.remove(pos);
                let elapsed = frame.started.elapsed().as_nanos() as f64;
                self.record(tid, &frame, &end, elapsed);
                for &(exit, _) in &frame.exits {
                    self.release_exit(tracer, pid, exit);
                }
                for &tail in &frame.tails {
                    self.release_exit(tracer, pid, tail);
                }
            }
        }
        let mut sites = self.entries.get(&addr).cloned().unwrap_or_default();
        sites.retain(|(r, _)| self.by_ptrace(*r));
        for (region, site) in sites {
            let Ok(regs) = tracer.regs(tid) else { return };
            // Inside already: recursion (the outermost call counts), unless it is entered
            // again at the same depth or above, which means the open call was left without a
            // return (an exception, a longjmp, an inlined copy left by a path that skips its
            // end): that one still counts, with its events up to now, as on the other engines.
            let open = self
                .frames
                .get(&tid)
                .and_then(|f| f.iter().position(|f| f.region == region));
            if let Some(p) = open {
                let frame = &self.frames[&tid][p];
                if !site.ends_at_return {
                    continue;
                }
                if regs.sp < frame.sp {
                    // Deeper: a recursive call, if the open one is still on the stack. On
                    // x86_64 its return address is at its entry's stack pointer for as long
                    // as it runs; gone or overwritten, it was left (an exception, a longjmp)
                    // and this call is an outermost one. (AArch64 keeps it in a register.)
                    // (Still there, it may also be a later call's from the same call site,
                    // one whose callee tail-jumped here: then uncertain, as on the others.)
                    let ret = frame.exits.iter().find(|e| e.1).map(|e| e.0);
                    let gone = match ret {
                        Some(ret) if cfg!(target_arch = "x86_64") => {
                            let mut buf = [0u8; 8];
                            tracer.read_memory(pid, frame.sp, &mut buf) == 8
                                && u64::from_ne_bytes(buf) != ret
                        }
                        _ => false,
                    };
                    if !gone {
                        self.frames.get_mut(&tid).expect("open")[p].nested += 1;
                        continue;
                    }
                }
                let frame = self.frames.get_mut(&tid).expect("open").remove(p);
                self.results.as_mut().expect("results").uncertain[frame.region] += frame.nested;
                for &(exit, _) in &frame.exits {
                    self.release_exit(tracer, pid, exit);
                }
                for &tail in &frame.tails {
                    self.release_exit(tracer, pid, tail);
                }
                let now = self.read(tid);
                let elapsed = frame.started.elapsed().as_nanos() as f64;
                self.record(tid, &frame, &now, elapsed);
            }
            let mut exits = Vec::new();
            if let Some(end) = site.end {
                exits.push((end, false));
            }
            if site.ends_at_return {
                let ret = return_address(tracer, pid, &regs);
                if ret != 0 {
                    exits.push((ret, true));
                }
            }
            if exits.is_empty() {
                continue;
            }
            self.open_counters(tid);
            let start = self.read(tid);
            let mut placed = Vec::new();
            for (exit, is_return) in exits {
                if tracer.set_breakpoint(pid, exit).is_ok() {
                    *self.returns.entry(exit).or_default() += 1;
                    placed.push((exit, is_return));
                }
            }
            // A function's tail calls end its calls too, as on the other engines.
            let mut tails = Vec::new();
            if site.ends_at_return && placed.iter().any(|p| p.1) {
                for t in self.tail_calls(tracer, pid, addr) {
                    if tracer.set_breakpoint(pid, t).is_ok() {
                        *self.returns.entry(t).or_default() += 1;
                        tails.push(t);
                    }
                }
            }
            if !placed.is_empty() {
                self.frames.entry(tid).or_default().push(Frame {
                    region,
                    exits: placed,
                    sp: regs.sp,
                    start,
                    started: Instant::now(),
                    start_ns: 0,
                    nested: 0,
                    tails,
                });
            }
        }
    }

    /// The tail calls of the function that starts at `at` (ptrace engine; found once).
    fn tail_calls(&mut self, tracer: &Tracer, pid: u32, at: u64) -> Vec<u64> {
        if let Some(t) = self.tails.get(&at) {
            return t.clone();
        }
        let t: Vec<u64> = function_exits(tracer, pid, at, &mut self.codes)
            .unwrap_or_default()
            .into_iter()
            .filter(|&(_, _, is_return)| !is_return)
            .map(|(x, _, _)| x)
            .collect();
        self.tails.insert(at, t.clone());
        t
    }

    /// One frame less waits at `exit`; the last one out removes the breakpoint (unless a region
    /// starts there).
    fn release_exit(&mut self, tracer: &mut Tracer, pid: u32, exit: u64) {
        let Some(n) = self.returns.get_mut(&exit) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.returns.remove(&exit);
            if !self.entries.contains_key(&exit) {
                let _ = tracer.remove_breakpoint(pid, exit);
            }
        }
    }

    /// Keeps one call's counts as measured (the engine's cost comes off in [`tally`]).
    fn record(&mut self, tid: u32, frame: &Frame, end: &[Reading], elapsed: f64) {
        let res = self.results.as_mut().expect("results");
        let r = frame.region;
        let mut values = Vec::with_capacity(end.len() + 1);
        let mut scaled_mask = 0u64;
        for (i, (a, b)) in frame.start.iter().zip(end).enumerate() {
            let (v, scaled) = scaled_delta(a, b);
            if scaled && i < 64 {
                scaled_mask |= 1 << i;
            }
            values.push(v);
        }
        values.push(elapsed);
        res.calls[r] += 1;
        let engine = if matches!(self.engine, Engine::Ptrace) || self.on_ptrace.contains(&r) {
            Engine::Ptrace
        } else if let Some(pmu) = self.uprobe_fallback.filter(|_| self.on_uprobe.contains(&r)) {
            Engine::Uprobe(pmu)
        } else {
            self.engine
        };
        let kind = match engine {
            Engine::Uprobe(_) => self.kinds.get(&r).copied().unwrap_or(EntryKind::Stepped),
            // ptrace steps every breakpoint's instruction
            Engine::Ptrace | Engine::InProcess => EntryKind::Stepped,
        };
        res.per_call.push(Call {
            region: r,
            tid,
            engine: engine.name(),
            kind,
            scaled: scaled_mask,
            values,
        });
    }

    /// Runs the target to its end (or --duration / Ctrl-C). Returns its exit status and
    /// whether it died inside a region.
    fn trace(
        &mut self,
        pid: Option<u32>,
        command: &[std::ffi::OsString],
        duration: Option<Duration>,
    ) -> Result<(Option<ExitStatus>, bool)> {
        let opts = TraceOptions {
            hold_new_threads: matches!(self.engine, Engine::Uprobe(_))
                || self.uprobe_fallback.is_some(),
            // (A thread inside a region runs without the guard's stops: set_quiet.)
            guard_sigtrap: matches!(self.engine, Engine::Ptrace),
            ..TraceOptions::default()
        };
        let (mut tracer, launched) = match pid {
            Some(pid) => (Tracer::attach(pid, opts)?, false),
            None => (Tracer::spawn(command, opts)?, true),
        };
        let root = tracer.root();
        let mut names: Vec<String> = self.events.iter().map(|e| e.name.clone()).collect();
        names.push("time-elapsed-ns".into());
        self.results = Some(Results {
            engine: self.engine.name(),
            engines: Vec::new(),
            regions: Vec::new(),
            events: names.clone(),
            calls: vec![0; self.specs.len()],
            stats: vec![vec![Stats::default(); names.len()]; self.specs.len()],
            per_call: Vec::new(),
            lost_hits: 0,
            uncertain: vec![0; self.specs.len()],
        });
        let mut placement = Placement::default();
        let in_process = matches!(self.engine, Engine::InProcess);
        // Attached in-process: the regions are placed at the first stop of the interrupted
        // main thread (system calls run in it, every other thread held).
        let mut place_at_stop = false;
        if !launched {
            for tid in superprof_sample::list_threads(root).unwrap_or_default() {
                self.open_counters(tid);
            }
            if in_process {
                place_at_stop = tracer.interrupt(root);
                if !place_at_stop {
                    bail!("cannot stop pid {root} to place the regions");
                }
            // Stop everything while the breakpoints go in? Writing int3 is atomic per byte;
            // threads run on.
            } else if !self.place(&mut tracer, root, true)? {
                bail!("{}", self.first_missing());
            }
        }
        let start = Instant::now();
        let mut exit = None;
        let mut died_inside = false;
        // The uprobe rings are read every 10 ms (16 MiB hold about 100 ms of hits at the
        // fastest rate a uprobe allows).
        let wait = match self.engine {
            Engine::Uprobe(_) | Engine::InProcess => Duration::from_millis(10),
            Engine::Ptrace => Duration::from_millis(50),
        };
        let mut progress = crate::progress::Progress::new(!self.calibrating);
        loop {
            self.drain_hits(root);
            progress.update(|| {
                let calls: u64 = self.results.as_ref().map_or(0, |r| r.calls.iter().sum());
                format!("{calls} calls")
            });
            // (The calibration run ends by itself, even after a stop signal: within its
            // deadline.)
            let stop = sys::stop_requested() && !self.calibrating;
            if stop || duration.is_some_and(|d| start.elapsed() >= d) {
                break;
            }
            let Some(ev) = tracer.next_event(wait)? else {
                continue;
            };
            match ev {
                TraceEvent::Stopped { tid, .. } if tid == root && place_at_stop => {
                    place_at_stop = false;
                    tracer.hold_others(tid);
                    self.stopped = Some(tid);
                    let all = self.place(&mut tracer, root, true);
                    self.stopped = None;
                    tracer.let_others_go();
                    if !all? {
                        bail!("{}", self.first_missing());
                    }
                    tracer.resume(tid);
                }
                TraceEvent::Exec { pid } if pid == root => {
                    if placement.exec() {
                        // The program ran another (a wrapper such as env): what was placed
                        // went with its code; start over on the new program (its last
                        // records read first).
                        self.drain_hits(root);
                        self.forget_placements();
                    }
                    self.open_counters(pid);
                    // (Its only thread is stopped: the in-process engine runs its system
                    // calls there.)
                    self.stopped = Some(pid);
                    self.libraries_mapped = placement.libraries_mapped();
                    let all = self.place(&mut tracer, pid, false)?;
                    // Libraries are loaded by ld.so after exec: look again at the program's
                    // entry point, when they are all mapped; with no entry point to wait
                    // for, what is missing is said at the end (the command runs on).
                    if !placement.after_exec(&mut tracer, pid, all) && !all {
                        self.libraries_mapped = placement.libraries_mapped();
                        self.place(&mut tracer, pid, true)?;
                    }
                    self.stopped = None;
                    tracer.resume(pid);
                }
                TraceEvent::Breakpoint { tid, pid, addr } if placement.is_control(addr) => {
                    // At the entry point every library ld.so maps at start is there: a region
                    // missing then gets its error (said at the end if dlopen never brings it).
                    let probes: std::collections::HashSet<u64> = self
                        .entries
                        .keys()
                        .chain(self.returns.keys())
                        .copied()
                        .collect();
                    placement.lift(&mut tracer, pid, addr, &|a| probes.contains(&a));
                    self.libraries_mapped = placement.libraries_mapped();
                    if in_process {
                        tracer.hold_others(tid);
                        self.stopped = Some(tid);
                    }
                    let all = self.place(&mut tracer, pid, placement.is_entry(addr));
                    if in_process {
                        self.stopped = None;
                        tracer.let_others_go();
                    }
                    let all = all?;
                    let probed =
                        self.entries.contains_key(&addr) || self.returns.contains_key(&addr);
                    let (entries, returns) = (&self.entries, &self.returns);
                    placement.after_control(&mut tracer, pid, addr, all, &|a| {
                        entries.contains_key(&a) || returns.contains_key(&a)
                    })?;
                    if probed {
                        self.on_breakpoint(&mut tracer, tid, pid, addr);
                    }
                    tracer.resume(tid);
                }
                TraceEvent::Breakpoint { tid, pid, addr } => {
                    self.on_breakpoint(&mut tracer, tid, pid, addr);
                    // Inside a region, no system call stops of the SIGTRAP guard: they would
                    // be in the call's figures.
                    let inside = self.frames.get(&tid).is_some_and(|f| !f.is_empty());
                    tracer.set_quiet(tid, inside);
                    tracer.resume(tid);
                }
                TraceEvent::NewThread { tid, .. } => {
                    if matches!(self.engine, Engine::Ptrace) || !self.on_ptrace.is_empty() {
                        self.open_counters(tid);
                    }
                    // Its probes as soon as it is known (a thread born while the coordinator
                    // holds every thread to step a breakpoint has no ThreadReady).
                    if !self.batches.is_empty() {
                        self.arm_new_thread(tid)?;
                    }
                }
                // (uprobe engine) A new thread, held before its first instruction: its
                // probes first (if its NewThread has not opened them).
                TraceEvent::ThreadReady { tid, .. } => {
                    if !self.batches.is_empty() {
                        self.arm_new_thread(tid)?;
                    }
                    tracer.resume(tid);
                }
                TraceEvent::ThreadExited { tid, .. } => {
                    self.disarm_thread(root, tid);
                    // Its records may still wait in the in-process ring behind another
                    // thread's record being written: its open calls go once those are read
                    // (dropped now, the rest of its records would open calls of their own).
                    match self.inproc.as_ref().map(|ip| ip.taken()) {
                        Some(taken) if taken > self.inproc.as_ref().map_or(0, |ip| ip.read()) => {
                            self.exited.push((tid, taken))
                        }
                        _ => self.forget_thread(tid),
                    }
                    self.counters.remove(&tid);
                }
                TraceEvent::ProcessExited { pid, status } if pid == root => {
                    died_inside = matches!(status, ExitStatus::Signal(_))
                        && self.frames.values().any(|f| !f.is_empty());
                    exit = Some(status);
                    break;
                }
                other => tracer.resume_after(&other),
            }
        }
        progress.clear();
        // The last hits, then the probes closed (the kernel removes them), then their
        // definitions.
        self.drain_hits(root);
        self.armed.clear();
        self.probe_source = None;
        if launched && exit.is_none() {
            exit = tracer.terminate(Duration::from_secs(5), |_| {})?;
        }
        // Every breakpoint is removed and an attached process let go here.
        let killed = tracer.finish();
        // In-process: the records that came in meanwhile, then the shared memory's pages freed
        // (an attached program keeps only the mappings).
        self.drain_hits(root);
        if let Some(ip) = &self.inproc {
            ip.release();
        }
        // Calls left by the process's end (exit inside a region, a crash): still calls.
        let open: Vec<u32> = self.frames.keys().copied().collect();
        for tid in open {
            self.forget_thread(tid);
        }
        if !self.missing.is_empty() {
            match exit.or(killed) {
                // A region never found: said, and the command's status is superprof's.
                Some(status) if launched => {
                    return Err(NothingToShow {
                        why: self.first_missing(),
                        status,
                    }
                    .into())
                }
                _ => bail!("{}", self.first_missing()),
            }
        }
        let res = self.results.as_mut().expect("results");
        res.regions = self
            .specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                self.regions
                    .get(i)
                    .filter(|r| r.entry != 0)
                    .map_or_else(|| s.label(), |r| r.name.clone())
            })
            .collect();
        Ok((exit.or(killed), died_inside))
    }
}

/// An exit of a function: its address, the code range it lies in (the function or one of its
/// parts), and whether it is a return (else a tail call).
type FunctionExit = (u64, (u64, u64), bool);

/// Where the function that starts at `at` in process `pid` leaves: its returns, its jumps out
/// of itself to other functions (tail calls) and through memory (`jmp *slot(%rip)`), from its
/// code (its size from the symbol table); and those of its parts placed elsewhere (gcc's
/// `f.cold`, with a symbol of that name or none), which it jumps to. Each exit with the code
/// range it lies in, and whether it is a return (else a tail call). None when that cannot be
/// told.
fn function_exits(
    tracer: &Tracer,
    pid: u32,
    at: u64,
    codes: &mut HashMap<std::path::PathBuf, Option<crate::blocks::ElfCode>>,
) -> Option<Vec<FunctionExit>> {
    use superprof_analyze::Flow;
    let f = superprof_trace::function_at(pid, at).ok()??;
    let end = at.checked_add(f.size)?;
    let read = |lo: u64, hi: u64| -> Option<Vec<u8>> {
        let size = usize::try_from(hi.checked_sub(lo)?)
            .ok()
            .filter(|&s| s > 0 && s <= 1 << 20)?;
        let mut code = vec![0u8; size];
        (tracer.read_code(pid, lo, &mut code) == size).then_some(code)
    };
    // A jump out of the function: to another function's start (a tail call), or to a part of
    // this one (a symbol named after it, or code no symbol starts).
    // (A PLT stub is another function's: a jump there is a tail call.)
    let in_plt = |codes: &mut HashMap<std::path::PathBuf, Option<crate::blocks::ElfCode>>,
                  target: u64| {
        code_at(codes, pid, target).is_ok_and(|(c, bias)| c.in_plt(target.wrapping_sub(bias)))
    };
    let part_of_it = |target: u64| match superprof_trace::function_at(pid, target).ok().flatten() {
        Some(g) => {
            g.name.starts_with(&format!("{}.", f.name))
                || g.name.starts_with(&format!("{} [clone .", f.name))
                || g.name.contains("[clone .cold")
        }
        None => true,
    };
    let mut exits = Vec::new();
    // (part start, part end): the function, then its parts as found.
    let mut parts: Vec<(u64, u64)> = vec![(at, end)];
    let mut k = 0;
    while k < parts.len() && k < 16 {
        let (lo, hi) = parts[k];
        k += 1;
        let Some(code) = read(lo, hi) else {
            continue;
        };
        for i in superprof_analyze::decode_all(&code, lo) {
            let inside = |t: u64| parts.iter().any(|&(a, b)| (a..b).contains(&t));
            match i.flow {
                Flow::Return => exits.push((i.addr, (lo, hi), true)),
                Flow::IndirectJump => {
                    let off = (i.addr - lo) as usize;
                    if crate::inprocess::patch::jumps_through_slot(&code[off..], i.addr) {
                        exits.push((i.addr, (lo, hi), false));
                    }
                }
                Flow::Jump { target } | Flow::Conditional { target } if !inside(target) => {
                    if !in_plt(codes, target) && part_of_it(target) {
                        // Its range: the symbol's, else up to the next function's start.
                        let part_end =
                            match superprof_trace::function_at(pid, target).ok().flatten() {
                                Some(g) if g.size > 0 => target.checked_add(g.size)?,
                                _ => next_function_start(codes, pid, target)
                                    .unwrap_or(target + 4096)
                                    .min(target + (1 << 16)),
                            };
                        if !parts.iter().any(|&(a, _)| a == target) {
                            parts.push((target, part_end));
                        }
                    } else if matches!(i.flow, Flow::Jump { .. }) {
                        exits.push((i.addr, (lo, hi), false));
                    }
                }
                _ => {}
            }
        }
    }
    // One exit once, whatever part found it: parts found from different jumps may overlap
    // (a cold part without a symbol runs to the next function, and a jump into its middle
    // starts another; Debian's python3.11 PyFloat_FromDouble), and a second probe there would
    // find the first's bytes.
    exits.sort_unstable();
    exits.dedup_by_key(|(x, _, _)| *x);
    (!exits.is_empty()).then_some(exits)
}

/// The code of the file that holds runtime address `addr` of `pid` (opened once per file and
/// kept in `codes`), and its load bias.
fn code_at(
    codes: &mut HashMap<std::path::PathBuf, Option<crate::blocks::ElfCode>>,
    pid: u32,
    addr: u64,
) -> Result<(&crate::blocks::ElfCode, u64), String> {
    let file = crate::blocks::file_at(pid, addr).ok_or(
        "it is not in the executable code of any file the program maps (data, or no code)",
    )?;
    let code = codes
        .entry(file.path.clone())
        .or_insert_with(|| crate::blocks::ElfCode::open(&file.open_path))
        .as_ref()
        .ok_or("cannot read its file")?;
    Ok((code, file.bias))
}

/// The start of the first function after `addr` in the file that holds it (runtime address).
fn next_function_start(
    codes: &mut HashMap<std::path::PathBuf, Option<crate::blocks::ElfCode>>,
    pid: u32,
    addr: u64,
) -> Option<u64> {
    let (code, bias) = code_at(codes, pid, addr).ok()?;
    let a = addr.wrapping_sub(bias);
    let i = code.functions.partition_point(|f| f.addr <= a);
    Some(code.functions.get(i)?.addr.wrapping_add(bias))
}

/// Whether a thread whose stack pointer is `sp` has returned from the call entered with `entry`
/// (the callee's stack popped: above it on x86_64, where the call pushed the return address;
/// at or above it on AArch64, where the return address is in a register).
fn popped(sp: u64, entry: u64) -> bool {
    if cfg!(target_arch = "aarch64") {
        sp >= entry
    } else {
        sp > entry
    }
}

/// The return address of a thread stopped at a function's first instruction.
fn return_address(tracer: &Tracer, pid: u32, regs: &superprof_unwind::UserRegs) -> u64 {
    if cfg!(target_arch = "aarch64") {
        return regs.lr;
    }
    let mut buf = [0u8; 8];
    if tracer.read_memory(pid, regs.sp, &mut buf) == 8 {
        u64::from_ne_bytes(buf)
    } else {
        0
    }
}

/// Runtime [start, end) ranges of the copies of function `name` inlined in the main executable
/// and in `module` (where the function itself is).
fn inlined_sites(
    symbolizer: &mut superprof_symbols::Symbolizer,
    pid: u32,
    name: &str,
    module: Option<&std::path::PathBuf>,
) -> Vec<(u64, u64)> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let mut out = Vec::new();
    for file in superprof_trace::mapped_files(pid).unwrap_or_default() {
        if Some(&file.path) != exe.as_ref() && Some(&file.path) != module {
            continue;
        }
        for (a, b) in symbolizer.inlined_sites(&file.path, &file.open_path, name) {
            out.push((a + file.bias, b + file.bias));
        }
    }
    out
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
