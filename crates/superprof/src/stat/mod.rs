//! `superprof stat`: event counts inside individual functions and address ranges, after
//! Perforator, on the coordinator's breakpoints.
//!
//! A breakpoint at a region's entry; when a thread hits it (and is not already inside the
//! region: recursion counts once per outermost call), its counters are read, its return address
//! is read from the stack (x86_64) or the link register (AArch64), and a breakpoint is put
//! there. When that thread comes back to the return address with its stack popped, the counters
//! are read again: the differences are the call's counts. Counters stay enabled on every
//! thread; reading differences is what Perforator's enable/disable achieves, without extra
//! ioctls, and multiplexing is scaled by the enabled/running times of the same differences.

mod output;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use superprof_sample::{Counter, EventKind, EventSpec, Reading};
use superprof_trace::{ExitStatus, TraceEvent, TraceOptions, Tracer};

use crate::cli::StatArgs;
use crate::region::{exe_bias, line_range, not_found, unique_function, RegionSpec};
use crate::sys;
use crate::NothingToShow;

/// Totals of one event over a region's calls.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub total: f64,
    pub min: f64,
    pub max: f64,
    pub scaled: bool,
}

impl Stats {
    fn add(&mut self, v: f64, n: u64, scaled: bool) {
        if n == 0 {
            self.min = v;
            self.max = v;
        } else {
            self.min = self.min.min(v);
            self.max = self.max.max(v);
        }
        self.total += v;
        self.scaled |= scaled;
    }
}

/// One invocation (for --per-call).
#[derive(Debug, Clone)]
pub struct Call {
    pub region: usize,
    pub tid: u32,
    pub values: Vec<f64>,
}

/// The results of a run.
pub struct Results {
    pub regions: Vec<String>,
    /// Event names, `time-elapsed-ns` last.
    pub events: Vec<String>,
    pub calls: Vec<u64>,
    /// [region][event]
    pub stats: Vec<Vec<Stats>>,
    pub per_call: Vec<Call>,
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
    for k in kinds {
        println!("{k:?} events:");
        for spec in EventSpec::all(k) {
            let status = match superprof_sample::probe(&spec) {
                Ok(()) => "supported".to_owned(),
                Err(e) => format!("not supported here ({e})"),
            };
            println!("  {:<28} {status}", spec.name);
        }
    }
    println!("Raw events: rNNNN (hex event code, e.g. r01c2)");
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
            eprintln!("{n}");
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
    let mut session = Session {
        events,
        groups,
        user_only,
        counters: HashMap::new(),
        regions: Vec::new(),
        entries: HashMap::new(),
        returns: HashMap::new(),
        frames: HashMap::new(),
        results: None,
        specs,
        missing: HashMap::new(),
        symbols: superprof_symbols::Symbolizer::default(),
    };
    let (exit, signal_in_region) = session.trace(args)?;
    let results = session.results.take().expect("results");
    let text = output::render(&results, args.format, args.per_call)?;
    superprof_resolve::write_text(args.output.as_deref(), &text)?;
    if let Some(status @ ExitStatus::Signal(_)) = exit {
        eprintln!(
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

struct Session {
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
    results: Option<Results>,
    specs: Vec<RegionSpec>,
    /// Regions not found yet, with the error to give if they never are.
    missing: HashMap<usize, String>,
    /// DWARF of the process's files, parsed once for every region that needs it.
    symbols: superprof_symbols::Symbolizer,
}

impl Session {
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
    fn place(&mut self, tracer: &mut Tracer, pid: u32, explain: bool) -> Result<bool> {
        let mut all = true;
        for (i, spec) in self.specs.clone().iter().enumerate() {
            if self.regions.len() > i && self.regions[i].entry != 0 {
                continue;
            }
            let region = match spec {
                RegionSpec::Function(name) => {
                    let found = unique_function(pid, name)?;
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
                    // Its inlined copies are sites of the same region.
                    let target = found.as_ref().map_or(name.as_str(), |f| f.name.as_str());
                    for (start, end) in inlined_sites(
                        &mut self.symbols,
                        pid,
                        target,
                        found.as_ref().map(|f| &f.module),
                    ) {
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
                self.missing.remove(&i);
                for &(at, site) in &region.sites {
                    tracer.set_breakpoint(pid, at).with_context(|| {
                        format!("cannot place a breakpoint for region '{}'", region.name)
                    })?;
                    self.entries.entry(at).or_default().push((i, site));
                }
            }
            if self.regions.len() > i {
                self.regions[i] = region;
            } else {
                self.regions.push(region);
            }
        }
        Ok(all)
    }

    fn on_breakpoint(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) {
        // A return (or range end) first: a thread leaving one region may enter another at once.
        if self.returns.contains_key(&addr) {
            let sp = tracer.regs(tid).map(|r| r.sp).unwrap_or(0);
            let frames = self.frames.entry(tid).or_default();
            if let Some(pos) = frames.iter().rposition(|f| {
                f.exits
                    .iter()
                    .any(|&(a, is_return)| a == addr && (!is_return || sp > f.sp))
            }) {
                let frame = frames.remove(pos);
                let end = self.read(tid);
                let elapsed = frame.started.elapsed().as_nanos() as f64;
                self.record(tid, &frame, &end, elapsed);
                for &(exit, _) in &frame.exits {
                    self.release_exit(tracer, pid, exit);
                }
            }
        }
        let sites = self.entries.get(&addr).cloned().unwrap_or_default();
        for (region, site) in sites {
            let inside = self
                .frames
                .get(&tid)
                .is_some_and(|f| f.iter().any(|f| f.region == region));
            if inside {
                continue;
            }
            let Ok(regs) = tracer.regs(tid) else { return };
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
            if !placed.is_empty() {
                self.frames.entry(tid).or_default().push(Frame {
                    region,
                    exits: placed,
                    sp: regs.sp,
                    start,
                    started: Instant::now(),
                });
            }
        }
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

    fn record(&mut self, tid: u32, frame: &Frame, end: &[Reading], elapsed: f64) {
        let res = self.results.as_mut().expect("results");
        let r = frame.region;
        let n = res.calls[r];
        let mut values = Vec::with_capacity(end.len() + 1);
        for (i, (a, b)) in frame.start.iter().zip(end).enumerate() {
            let dv = b.value.saturating_sub(a.value) as f64;
            let de = b.enabled.saturating_sub(a.enabled);
            let dr = b.running.saturating_sub(a.running);
            let (v, scaled) = if dr > 0 && dr < de {
                (dv * de as f64 / dr as f64, true)
            } else {
                (dv, false)
            };
            res.stats[r][i].add(v, n, scaled);
            values.push(v);
        }
        let last = res.stats[r].len() - 1;
        res.stats[r][last].add(elapsed, n, false);
        values.push(elapsed);
        res.calls[r] += 1;
        res.per_call.push(Call {
            region: r,
            tid,
            values,
        });
    }

    /// Runs the target to its end (or --duration / Ctrl-C). Returns its exit status and
    /// whether it died inside a region.
    fn trace(&mut self, args: &StatArgs) -> Result<(Option<ExitStatus>, bool)> {
        let opts = TraceOptions::default();
        let (mut tracer, launched) = match args.pid {
            Some(pid) => (Tracer::attach(pid, opts)?, false),
            None => (Tracer::spawn(&args.command, opts)?, true),
        };
        let root = tracer.root();
        let mut names: Vec<String> = self.events.iter().map(|e| e.name.clone()).collect();
        names.push("time-elapsed-ns".into());
        self.results = Some(Results {
            regions: Vec::new(),
            events: names.clone(),
            calls: vec![0; self.specs.len()],
            stats: vec![vec![Stats::default(); names.len()]; self.specs.len()],
            per_call: Vec::new(),
        });
        let mut entry_bp: Option<u64> = None;
        let mut dl_bp: Option<u64> = None;
        if !launched {
            for tid in superprof_sample::list_threads(root).unwrap_or_default() {
                self.open_counters(tid);
            }
            // Stop everything while the breakpoints go in? Writing int3 is atomic per byte;
            // threads run on.
            if !self.place(&mut tracer, root, true)? {
                bail!("{}", self.first_missing());
            }
        }
        let start = Instant::now();
        let duration = args.duration;
        let mut exit = None;
        let mut died_inside = false;
        loop {
            if sys::stop_requested() || duration.is_some_and(|d| start.elapsed() >= d) {
                break;
            }
            let Some(ev) = tracer.next_event(Duration::from_millis(50))? else {
                continue;
            };
            match ev {
                TraceEvent::Exec { pid } if pid == root => {
                    self.open_counters(pid);
                    match self.place(&mut tracer, pid, false) {
                        Ok(true) => {}
                        Ok(false) => {
                            // Libraries are loaded by ld.so after exec: look again at the
                            // program's entry point, when they are all mapped.
                            if let Some(e) = superprof_trace::entry_point(pid) {
                                tracer.set_breakpoint(pid, e)?;
                                entry_bp = Some(e);
                            } else {
                                // Not found (said at the end); the command runs on.
                                self.place(&mut tracer, pid, true)?;
                            }
                        }
                        Err(e) => return Err(e),
                    }
                    tracer.resume(pid);
                }
                TraceEvent::Breakpoint { tid, pid, addr } => {
                    if Some(addr) == entry_bp && !self.entries.contains_key(&addr) {
                        // At the entry point every library ld.so maps at start is there.
                        entry_bp = None;
                        let _ = tracer.remove_breakpoint(pid, addr);
                        if !self.place(&mut tracer, pid, true)? {
                            // Perhaps in a library loaded later (dlopen): look again each
                            // time ld.so reports a change of its link map.
                            // (Without ld.so, never: said at the end; the command runs on.)
                            if let Some(f) =
                                superprof_trace::find_function(pid, "_dl_debug_state")?.first()
                            {
                                tracer.set_breakpoint(pid, f.addr)?;
                                dl_bp = Some(f.addr);
                            }
                        }
                    } else if Some(addr) == dl_bp && !self.entries.contains_key(&addr) {
                        if self.place(&mut tracer, pid, false)? {
                            dl_bp = None;
                            let _ = tracer.remove_breakpoint(pid, addr);
                        }
                    } else {
                        self.on_breakpoint(&mut tracer, tid, pid, addr);
                    }
                    tracer.resume(tid);
                }
                TraceEvent::NewThread { tid, .. } => self.open_counters(tid),
                TraceEvent::ThreadExited { tid, .. } => {
                    self.counters.remove(&tid);
                    if let Some(frames) = self.frames.remove(&tid) {
                        for f in frames {
                            for (exit, _) in f.exits {
                                if let Some(n) = self.returns.get_mut(&exit) {
                                    *n = n.saturating_sub(1);
                                }
                            }
                        }
                    }
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
        if launched && exit.is_none() {
            exit = tracer.terminate(Duration::from_secs(5), |_| {})?;
        }
        // Every breakpoint is removed and an attached process let go here.
        let killed = tracer.finish();
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
