//! `count` and `coverage` on the coordinator's breakpoints: the run loop, regions placed at
//! exec (and again at the entry point and at each change of ld.so's link map, for libraries),
//! and the results. The counting itself is [`super::count`].
//!
//! coverage: a one-shot breakpoint at every statically decoded block of the regions, removed
//! at its first hit.
//!
//! With the in-process engine (the default on x86_64), count and coverage both patch every
//! block with a jump to a counting trampoline ([`crate::inprocess`]); a block that cannot be
//! patched (shorter than the jump, a thread inside it, a call where a shadow stack forbids
//! emulating it) gets a counting breakpoint instead, which stops the program at each run.
//!
//! With the uprobe engine, count and coverage both put a counting uprobe
//! (`superprof_sample::UprobeCounter`: no ring, nothing written per hit) on every statically
//! decoded block: a block runs straight through, so any of its instructions runs as often as
//! the block, and the first one the kernel accepts is probed (it refuses some, such as x86's
//! lock-prefixed ones). The program never stops for a block; the counts are read at the end.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{bail, err, Result};
use superprof_analyze::{Analyzer, Arch, Block, Decode, Learn};
use superprof_trace::{ExitStatus, TraceEvent, TraceOptions, Tracer};

use super::count::Counts;
use super::{place, rows, whole_executable, ElfCode, Placed, Report};
use super::{AnalyzerKind, BlocksConfig, Mode};
use crate::engine::Engine;
use crate::region::{Placement, RegionSpec};
use crate::{EngineKind, Error};
use superprof_record::Target;

/// What a run keeps: the regions as placed, and the count or coverage state.
pub(super) struct Session {
    specs: Vec<RegionSpec>,
    coverage: bool,
    symbols: superprof_symbols::Symbolizer,
    regions: Vec<Option<Placed>>,
    /// Each region's file's code (shared by the regions of one file: opening it and its
    /// whole-file branch sweep are done once).
    codes: Vec<Option<Arc<ElfCode>>>,
    /// The code of each file read so far, by the path it was opened at.
    code_cache: HashMap<std::path::PathBuf, Arc<ElfCode>>,
    counts: Counts,
    /// Coverage: one-shot breakpoints, runtime address -> (region, block index).
    cover: HashMap<u64, (usize, usize)>,
    cover_blocks: Vec<Vec<Block>>,
    hits: HashSet<(usize, usize)>,
    /// When the regions are looked for (exec, the entry point, ld.so's link map changes).
    placement: Placement,
    engine: Engine,
    /// The engine was chosen by superprof (it may go back to ptrace).
    auto_engine: bool,
    /// Uprobe engine: the counting probes of each (region, block of `cover_blocks`): where, and
    /// one per thread (new threads get theirs before their first instruction).
    block_probes: Vec<(
        usize,
        usize,
        superprof_sample::ProbeEvent,
        Vec<superprof_sample::UprobeCounter>,
    )>,
    /// Where the probes' kernel events come from (dropped after `block_probes`).
    probe_source: Option<crate::engine::Probes>,
    /// The threads that have their probes (those there at placement, and new ones).
    probed_threads: HashSet<u32>,
    /// Runtime addresses of the blocks with a probe (a block of two overlapping regions
    /// belongs to the first).
    probed_blocks: HashSet<u64>,
    /// In-process engine: the program's trampolines and counters.
    inproc: Option<crate::inprocess::InProcess>,
    /// The in-process engine's fallback for a block it cannot patch, where uprobes may be
    /// opened (root): a counting uprobe, which never stops the program, before a breakpoint.
    fallback_pmu: Option<superprof_sample::UprobePmu>,
    /// Blocks the in-process engine counted with such a uprobe.
    uprobe_fallbacks: usize,
    /// In-process engine: each patched (region, block of `cover_blocks`) and its counter.
    patched: Vec<(usize, usize, crate::inprocess::Counter)>,
    /// In-process engine: the blocks counted by a breakpoint instead (runtime address ->
    /// (region, block)), and their hits.
    counting_bps: HashMap<u64, (usize, usize)>,
    bp_hits: HashMap<(usize, usize), u64>,
    /// Count only the blocks a function's calls are told from (`record --precise`: see
    /// [`calls_blocks`]), not every block, on the in-process and uprobe engines.
    pub(super) calls_only: bool,
    /// A block the in-process engine cannot patch leaves its region uncounted (why, by
    /// region) rather than going to a uprobe or a breakpoint, which would stop or trap the
    /// program at every call of a hot function (`record --precise`).
    pub(super) no_slow_fallback: bool,
    pub(super) refused: HashMap<usize, String>,
    /// No region spec counts the whole executable (`blocks`), not nothing.
    whole_when_none: bool,
    /// Regions already found (by index), placed without a lookup by name.
    known: HashMap<usize, Placed>,
}

/// The blocks of a function (ELF addresses, its first instruction `entry`) whose counts give
/// its calls: its first block, its blocks that call or jump to `entry`, and the block after
/// each conditional branch to `entry` (its fall-through).
pub(super) fn calls_blocks(entry: u64, blocks: &[Block]) -> HashSet<u64> {
    let mut keep: HashSet<u64> = HashSet::new();
    keep.insert(entry);
    for b in blocks {
        match b.flow {
            superprof_analyze::Flow::Call { target } | superprof_analyze::Flow::Jump { target }
                if target == entry =>
            {
                keep.insert(b.start);
            }
            superprof_analyze::Flow::Conditional { target } if target == entry => {
                keep.insert(b.start);
                keep.insert(b.end);
            }
            _ => {}
        }
    }
    keep
}

impl Session {
    /// A session counting (or covering) `specs`' regions on `engine` (.1: chosen by
    /// superprof, which may go back to ptrace), the ptrace engine with `analyzer`'s analyzer
    /// (.1: branches stepped), a block the in-process engine cannot patch on `fallback_pmu`'s
    /// uprobes where given.
    pub(super) fn new(
        specs: Vec<RegionSpec>,
        coverage: bool,
        engine: (Engine, bool),
        analyzer: (AnalyzerKind, bool),
        fallback_pmu: Option<superprof_sample::UprobePmu>,
    ) -> Session {
        let (analyzer_kind, step_branches) = analyzer;
        let analyzer: Box<dyn Analyzer> = match analyzer_kind {
            AnalyzerKind::Decode => Box::new(Decode::new(Arch::HOST)),
            AnalyzerKind::Learn => Box::new(Learn::new(Arch::HOST, true)),
        };
        let n = specs.len().max(1);
        Session {
            specs,
            coverage,
            symbols: superprof_symbols::Symbolizer::default(),
            regions: vec![None; n],
            codes: (0..n).map(|_| None).collect(),
            counts: Counts::new(
                analyzer,
                analyzer_kind == AnalyzerKind::Decode && !step_branches,
            ),
            cover: HashMap::new(),
            cover_blocks: vec![Vec::new(); n],
            hits: HashSet::new(),
            placement: Placement::default(),
            engine: engine.0,
            auto_engine: engine.1,
            block_probes: Vec::new(),
            probe_source: None,
            probed_threads: HashSet::new(),
            probed_blocks: HashSet::new(),
            inproc: None,
            fallback_pmu,
            uprobe_fallbacks: 0,
            patched: Vec::new(),
            counting_bps: HashMap::new(),
            bp_hits: HashMap::new(),
            calls_only: false,
            no_slow_fallback: false,
            refused: HashMap::new(),
            whole_when_none: true,
            known: HashMap::new(),
            code_cache: HashMap::new(),
        }
    }

    /// The session of `specs`' functions only: no specs is no region (not the whole
    /// executable, as for `blocks` with no region), until [`Session::add_functions`].
    pub(super) fn functions_only(mut self) -> Session {
        let n = self.specs.len();
        self.regions.truncate(n);
        self.codes.truncate(n);
        self.cover_blocks.truncate(n);
        self.whole_when_none = false;
        self
    }

    /// The code of the file at `path`, read once (with its branch sweep, done here: a
    /// caller may read it while the program runs, before its threads are stopped to place).
    pub(super) fn code_of(&mut self, path: &std::path::Path) -> Option<Arc<ElfCode>> {
        if let Some(c) = self.code_cache.get(path) {
            return Some(c.clone());
        }
        let code = Arc::new(ElfCode::open(path)?);
        code.targets_in(0, 0);
        self.code_cache.insert(path.to_owned(), code.clone());
        Some(code)
    }

    /// The symbols and debug info of file `path` (opened at `open_path`) read now (their
    /// names and lines are the results'), rather than when placing, the program stopped.
    pub(super) fn preload(&mut self, path: &std::path::Path, open_path: &std::path::Path) {
        self.symbols.preload(path, open_path);
    }

    /// One more function to count (`record --precise`'s hottest), placed at the next
    /// placement: where it is (`at`) when known, else looked for by `name`.
    pub(super) fn add_function(&mut self, name: &str, at: Option<Placed>) {
        self.specs.push(RegionSpec::Function(name.to_owned()));
        self.regions.push(None);
        self.codes.push(None);
        self.cover_blocks.push(Vec::new());
        if let Some(p) = at {
            self.known.insert(self.regions.len() - 1, p);
        }
    }

    /// One event of the tracer, `root` the traced process: regions placed at the stops that
    /// place them (`place_at_stop`: at the root's next stop, then cleared), breakpoints
    /// counted, new threads probed; whatever stopped resumed. The root's exit status when it
    /// exited.
    pub(super) fn on_event(
        &mut self,
        tracer: &mut Tracer,
        root: u32,
        ev: TraceEvent,
        place_at_stop: &mut bool,
    ) -> Result<Option<ExitStatus>> {
        match ev {
            TraceEvent::Stopped { tid, .. } if tid == root && *place_at_stop => {
                *place_at_stop = false;
                // (`record --precise`: a function not found is said at the end.)
                if !self.place_holding(tracer, tid, root)? && !self.no_slow_fallback {
                    if let Some(e) = self.missing(root) {
                        return Err(e);
                    }
                }
                tracer.resume(tid);
            }
            TraceEvent::Exec { pid } if pid == root => self.on_exec(tracer, pid)?,
            TraceEvent::Breakpoint { tid, pid, addr } if self.placement.is_control(addr) => {
                self.on_control(tracer, tid, pid, addr)?
            }
            TraceEvent::Breakpoint { tid, pid, addr } if pid == root => {
                self.on_breakpoint(tracer, tid, pid, addr)
            }
            TraceEvent::Stepped { tid, pid } if pid == root => {
                self.counts.on_stepped(tracer, tid, pid)
            }
            // A new thread's probes as soon as it is known (a thread born while the
            // coordinator holds every thread has no ThreadReady), and before it runs.
            TraceEvent::NewThread { tid, .. } => self.arm_thread(tid)?,
            TraceEvent::ThreadReady { tid, .. } => {
                self.arm_thread(tid)?;
                tracer.resume(tid);
            }
            TraceEvent::ThreadExited { tid, .. } => self.counts.forget_thread(tid),
            TraceEvent::ProcessExited { pid, status } if pid == root => return Ok(Some(status)),
            other => tracer.resume_after(&other),
        }
        Ok(None)
    }

    /// The progress line's counts: the blocks probed, and the executions counted so far
    /// where they are at hand (the in-process counters, breakpoint stops).
    fn so_far(&self) -> String {
        let probed = self.probed_blocks.len() + self.cover.len();
        let mut counted: u64 = self.bp_hits.values().sum();
        if let Some(inproc) = &self.inproc {
            counted += self
                .patched
                .iter()
                .map(|&(_, _, c)| inproc.count(c))
                .sum::<u64>();
        }
        let stops = self.counts.stops;
        match self.engine {
            Engine::Uprobe(_) => format!("{probed} blocks probed"),
            Engine::InProcess => format!("{probed} blocks probed, {counted} executions"),
            Engine::Ptrace => format!("{stops} breakpoint stops"),
        }
    }

    /// Places what can be placed; true when every region is. `tid`: a stopped thread of
    /// `pid` (the in-process engine runs system calls in it).
    fn place_all(&mut self, tracer: &mut Tracer, tid: u32, pid: u32) -> Result<bool> {
        let mut all = true;
        for i in 0..self.regions.len() {
            if self.regions[i].is_some() || self.refused.contains_key(&i) {
                continue;
            }
            let placed = if let Some(p) = self.known.remove(&i) {
                Some(p)
            } else if self.specs.is_empty() && self.whole_when_none {
                Some(whole_executable(pid)?)
            } else {
                let substrings = self.placement.libraries_mapped();
                match place(pid, &self.specs[i], &mut self.symbols, substrings) {
                    // (`record --precise`: one function that cannot be placed is said, the
                    // others counted.)
                    Err(e) if self.no_slow_fallback => {
                        self.refused.insert(i, superprof_unwind::one_line(&e));
                        continue;
                    }
                    r => r?,
                }
            };
            let Some(p) = placed else {
                all = false;
                continue;
            };
            let code = self.code_of(&p.file.open_path);
            if code.as_ref().is_some_and(|c| !c.is_64) {
                bail!(
                    "{} is a 32-bit program: blocks decodes 64-bit x86_64 and AArch64 code only",
                    p.file.path.display()
                );
            }
            // Every probe address proven an instruction start before any goes in (issue 31).
            let bounds = match self.specs.get(i) {
                Some(RegionSpec::Function(_)) => Bounds::Function,
                Some(_) => Bounds::Range,
                None => Bounds::WholeExecutable,
            };
            if let Err(why) = prove(code.as_deref(), &p, bounds) {
                if self.no_slow_fallback {
                    self.refused.insert(i, why);
                    continue;
                }
                bail!("region '{}': {why}; nothing was probed", p.name);
            }
            self.symbols.preload(&p.file.path, &p.file.open_path);
            self.arm(tracer, tid, pid, i, &p, code.as_deref())?;
            self.codes[i] = code;
            self.regions[i] = Some(p);
        }
        Ok(all)
    }

    /// Puts region `i`'s probes in: patches, uprobes, else breakpoints.
    fn arm(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        pid: u32,
        i: usize,
        p: &Placed,
        code: Option<&ElfCode>,
    ) -> Result<()> {
        if let Engine::InProcess = self.engine {
            match self.arm_in_process(tracer, tid, pid, i, p, code) {
                Ok(()) => return Ok(()),
                Err(why) if self.no_slow_fallback => {
                    self.refused.insert(i, why);
                    return Ok(());
                }
                Err(why) if !self.auto_engine => bail!("{why}: use --engine ptrace"),
                Err(why) => {
                    superprof_unwind::say!(
                        "superprof: probing with ptrace (the program stops at every probe): {why}"
                    );
                    self.fall_back_to_ptrace(tracer, pid);
                }
            }
        }
        if let Engine::Uprobe(pmu) = self.engine {
            match self.arm_uprobes(pmu, pid, i, p, code) {
                Ok(()) => return Ok(()),
                Err(why) if !self.auto_engine => bail!("{why}: use --engine ptrace"),
                Err(why) => {
                    superprof_unwind::say!(
                        "superprof: probing with ptrace (the program stops at every probe): {why}"
                    );
                    self.fall_back_to_ptrace(tracer, pid);
                }
            }
        }
        self.arm_breakpoints(tracer, pid, i, p, code);
        Ok(())
    }

    /// A counting trampoline on every block of region `i` (a counting breakpoint where a block
    /// cannot be patched). `tid` is stopped, the other threads held.
    fn arm_in_process(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        pid: u32,
        i: usize,
        p: &Placed,
        code: Option<&ElfCode>,
    ) -> Result<(), String> {
        let bias = p.file.bias;
        let Some(code) = code else {
            return Err(format!("cannot read the code of region '{}'", p.name));
        };
        if self.inproc.is_none() {
            self.inproc = Some(crate::inprocess::InProcess::new(pid)?);
        }
        let blocks = code.counted_blocks(p.lo.wrapping_sub(bias), p.hi.wrapping_sub(bias));
        // Where the threads are: none may be inside bytes a jump replaces.
        let pcs = crate::inprocess::thread_pcs(tracer, pid);
        let inside = |from: u64, len: u64| pcs.iter().any(|pc| (from..from + len).contains(pc));
        let mut several: HashMap<u64, bool> = HashMap::new();
        let lo = blocks.first().map_or(0, |b| b.start);
        let hi = blocks.last().map_or(0, |b| b.end);
        let boards = crate::inprocess::springboards(code, lo, hi, bias);
        let threads = superprof_sample::list_threads(pid).unwrap_or_else(|_| vec![pid]);
        let only = self
            .calls_only
            .then(|| calls_blocks(p.lo.wrapping_sub(bias), &blocks));
        for (k, b) in blocks.iter().enumerate() {
            // A block of two overlapping regions belongs to the first.
            let at = b.start.wrapping_add(bias);
            if self.probed_blocks.contains(&at)
                || only.as_ref().is_some_and(|o| !o.contains(&b.start))
            {
                continue;
            }
            // Several instructions may move only where no jump table could land between them.
            let f = code.function_at(b.start).map_or(b.start, |f| f.addr);
            let several = *several
                .entry(f)
                .or_insert_with(|| code.without_indirect_jumps(b.start));
            // (The filler after the block, up to the next block, may take the jump too.)
            let next = blocks.get(k + 1).map_or(u64::MAX, |n| n.start);
            let mut site = crate::inprocess::Site::of(code, b, next, bias, several, &boards);
            // A function region's own entry: reached by calls, its flags dead (a `.cold` part
            // of a function is reached by jumps: not so).
            site.entry = matches!(self.specs.get(i), Some(RegionSpec::Function(_)))
                && b.start == p.lo.wrapping_sub(bias)
                && !p.name.contains(".cold");
            let inproc = self.inproc.as_mut().expect("made above");
            match inproc.count_block(tracer, tid, &site, &inside) {
                Ok(c) => self.patched.push((i, k, c)),
                Err(why) if self.no_slow_fallback => {
                    self.refused.entry(i).or_insert_with(|| {
                        format!("its block at {:#x} cannot be patched: {why}", b.start)
                    });
                }
                Err(_) => {
                    let probed = match self.fallback_pmu {
                        Some(pmu) => self
                            .uprobe_block(pmu, pid, &threads, code, b, bias)
                            .unwrap_or(None),
                        None => None,
                    };
                    match probed {
                        Some((spec, counters)) => {
                            self.uprobe_fallbacks += 1;
                            self.probed_threads.extend(&threads);
                            self.block_probes.push((i, k, spec, counters));
                        }
                        None => {
                            tracer.set_breakpoint(pid, at).map_err(|e| {
                                format!("cannot put a counting breakpoint at {at:#x}: {e}")
                            })?;
                            self.counting_bps.insert(at, (i, k));
                        }
                    }
                }
            }
            self.probed_blocks.insert(at);
        }
        self.cover_blocks[i] = blocks;
        Ok(())
    }

    /// A counting uprobe on every block of region `i`, on every thread of `pid`.
    fn arm_uprobes(
        &mut self,
        pmu: superprof_sample::UprobePmu,
        pid: u32,
        i: usize,
        p: &Placed,
        code: Option<&ElfCode>,
    ) -> Result<(), String> {
        let bias = p.file.bias;
        let Some(code) = code else {
            return Err(format!("cannot read the code of region '{}'", p.name));
        };
        let blocks = code.counted_blocks(p.lo.wrapping_sub(bias), p.hi.wrapping_sub(bias));
        let threads = superprof_sample::list_threads(pid).unwrap_or_else(|_| vec![pid]);
        self.probed_threads.extend(&threads);
        let mut probes = Vec::new();
        let only = self
            .calls_only
            .then(|| calls_blocks(p.lo.wrapping_sub(bias), &blocks));
        for (k, b) in blocks.iter().enumerate() {
            // A block of two overlapping regions belongs to the first.
            let at = b.start.wrapping_add(bias);
            if self.probed_blocks.contains(&at)
                || only.as_ref().is_some_and(|o| !o.contains(&b.start))
            {
                continue;
            }
            let Some((spec, counters)) = self.uprobe_block(pmu, pid, &threads, code, b, bias)?
            else {
                return Err(format!(
                    "the kernel cannot put a uprobe on any instruction of the block at {:#x} of \
                     region '{}'",
                    b.start, p.name
                ));
            };
            self.probed_blocks.insert(at);
            probes.push((i, k, spec, counters));
        }
        self.block_probes.extend(probes);
        self.cover_blocks[i] = blocks;
        Ok(())
    }

    /// A counting uprobe on block `b` (ELF addresses; `bias` makes them runtime ones) of
    /// `code`, on each of `threads` of `pid`: at its first instruction the kernel accepts.
    /// None where it accepts none.
    #[allow(clippy::type_complexity)]
    fn uprobe_block(
        &mut self,
        pmu: superprof_sample::UprobePmu,
        pid: u32,
        threads: &[u32],
        code: &ElfCode,
        b: &superprof_analyze::Block,
        bias: u64,
    ) -> Result<
        Option<(
            superprof_sample::ProbeEvent,
            Vec<superprof_sample::UprobeCounter>,
        )>,
        String,
    > {
        let bytes = code.bytes(b.start, b.end - b.start).unwrap_or_default();
        for insn in superprof_analyze::decode_all(bytes, b.start) {
            let addr = insn.addr.wrapping_add(bias);
            let Some(spec) = crate::engine::probe_at(pid, addr) else {
                break;
            };
            let spec = self
                .probe_source
                .get_or_insert_with(|| crate::engine::Probes::new(pmu))
                .event(&spec);
            let mut on_threads = Vec::new();
            let mut refused = false;
            for &tid in threads {
                match superprof_sample::UprobeCounter::open(tid, &spec) {
                    Ok(c) => on_threads.push(c),
                    Err(e) if e.no_thread() => {}
                    Err(e) if e.unsupported_instruction() => {
                        refused = true;
                        break;
                    }
                    Err(e) => return Err(format!("cannot open a uprobe at {addr:#x}: {e}")),
                }
            }
            if !refused {
                return Ok(Some((spec, on_threads)));
            }
        }
        Ok(None)
    }

    /// A new thread (held before its first instruction): every block's probe on it too.
    fn arm_thread(&mut self, tid: u32) -> Result<()> {
        if self.block_probes.is_empty() || !self.probed_threads.insert(tid) {
            return Ok(());
        }
        for (_, _, spec, counters) in &mut self.block_probes {
            match superprof_sample::UprobeCounter::open(tid, spec) {
                Ok(c) => counters.push(c),
                Err(e) if e.no_thread() => return Ok(()),
                Err(e) => bail!("cannot open the uprobes of the blocks on thread {tid}: {e}"),
            }
        }
        Ok(())
    }

    /// Goes on with breakpoints: the uprobes closed, the regions placed so far armed again.
    fn fall_back_to_ptrace(&mut self, tracer: &mut Tracer, pid: u32) {
        self.engine = Engine::Ptrace;
        // (Patches already made stay until the process is let go: they count nothing read.)
        self.patched.clear();
        self.uprobe_fallbacks = 0;
        for at in std::mem::take(&mut self.counting_bps).into_keys() {
            let _ = tracer.remove_breakpoint(pid, at);
        }
        self.block_probes.clear();
        self.probed_blocks.clear();
        self.probed_threads.clear();
        self.probe_source = None;
        for j in 0..self.regions.len() {
            if let Some(p) = self.regions[j].clone() {
                let code = self.codes[j].take();
                self.arm_breakpoints(tracer, pid, j, &p, code.as_deref());
                self.codes[j] = code;
            }
        }
    }

    /// Region `i`'s breakpoints: one-shot ones on every block (coverage), or the count
    /// engine's.
    fn arm_breakpoints(
        &mut self,
        tracer: &mut Tracer,
        pid: u32,
        i: usize,
        p: &Placed,
        code: Option<&ElfCode>,
    ) {
        let bias = p.file.bias;
        if self.coverage {
            let blocks = code
                .map(|c| c.static_blocks(p.lo.wrapping_sub(bias), p.hi.wrapping_sub(bias)))
                .unwrap_or_default();
            for (k, b) in blocks.iter().enumerate() {
                // A block of two overlapping regions belongs to the first.
                let at = b.start.wrapping_add(bias);
                if !self.cover.contains_key(&at) && tracer.set_breakpoint(pid, at).is_ok() {
                    self.cover.insert(at, (i, k));
                }
            }
            self.cover_blocks[i] = blocks;
        } else {
            self.counts.add_region(tracer, pid, p.lo, p.hi);
            // Code outside the region that jumps into it elsewhere than at its start (f.cold
            // parts, another function's jump into its middle), and blocks only something
            // from elsewhere runs (exceptions' landing pads, where the unwinder jumps).
            if let Some(c) = code {
                let (lo, hi) = (p.lo.wrapping_sub(bias), p.hi.wrapping_sub(bias));
                let mut starts = c.entries_from_outside(lo, hi);
                starts.extend(c.unreached_starts(lo, hi));
                starts.sort_unstable();
                starts.dedup();
                for a in starts
                    .into_iter()
                    .filter(|&a| a != lo && c.is_instruction_start(a))
                {
                    self.counts.add_start(tracer, pid, a.wrapping_add(bias));
                }
            }
        }
    }

    /// The in-process counters' pages freed and the probes closed, once read.
    pub(super) fn release(&mut self) {
        if let Some(ip) = &self.inproc {
            ip.release();
        }
        self.block_probes.clear();
        self.probe_source = None;
    }

    /// Each counting trampoline (runtime start and end) and the region whose site it counts.
    pub(super) fn trampolines(&self) -> Vec<(u64, u64, usize)> {
        let Some(ip) = &self.inproc else {
            return Vec::new();
        };
        ip.trampolines()
            .iter()
            .filter_map(|&(lo, hi, site)| {
                let i = self
                    .regions
                    .iter()
                    .position(|r| r.as_ref().is_some_and(|p| (p.lo..p.hi).contains(&site)))?;
                Some((lo, hi, i))
            })
            .collect()
    }

    /// The source (file, line) of each instruction of region `i`'s code in [start, end) (ELF
    /// addresses), where the DWARF says (the innermost, for inlined code).
    pub(super) fn lines_of(&mut self, i: usize, start: u64, end: u64) -> Vec<(String, u32)> {
        let (Some(Some(p)), Some(Some(code))) = (self.regions.get(i), self.codes.get(i)) else {
            return Vec::new();
        };
        let (path, open) = (p.file.path.clone(), p.readable_path().to_owned());
        let bytes = code
            .bytes(start, end.saturating_sub(start))
            .unwrap_or_default()
            .to_vec();
        superprof_analyze::decode_all(&bytes, start)
            .iter()
            .filter_map(|insn| {
                let frames = self.symbols.symbolize(&path, &open, insn.addr);
                let f = frames.last()?;
                Some((f.file.clone()?, f.line?))
            })
            .collect()
    }

    /// Whether region `i` is placed.
    pub(super) fn is_placed(&self, i: usize) -> bool {
        self.regions.get(i).is_some_and(Option::is_some)
    }

    /// Why region `i` was never placed (None: it was).
    pub(super) fn missing_region(&self, i: usize, pid: u32) -> Option<crate::Error> {
        if self.is_placed(i) {
            return None;
        }
        Some(match self.specs.get(i) {
            Some(spec) => super::not_found(pid, spec),
            None => err!("the program ended before its executable could be read"),
        })
    }

    /// Region `i` as placed, its blocks (ELF addresses, as the engines cut them) with their
    /// executions (0: never run), and the rows of those that ran (names and lines); None
    /// where it was never placed or its code cannot be read.
    #[allow(clippy::type_complexity)]
    pub(super) fn counted(
        &mut self,
        i: usize,
    ) -> Option<(Placed, Vec<(Block, u64)>, Vec<super::BlockRow>)> {
        let p = self.regions.get(i)?.clone()?;
        let bias = p.file.bias;
        let blocks = self
            .codes
            .get(i)?
            .as_ref()?
            .counted_blocks(p.lo.wrapping_sub(bias), p.hi.wrapping_sub(bias));
        let regions = self.regions.clone();
        // Every region's rows (a ptrace engine's counts are read once), this one's kept.
        let rows: Vec<super::BlockRow> = self
            .results(&regions)
            .into_iter()
            .filter(|r| (p.lo.wrapping_sub(bias)..p.hi.wrapping_sub(bias)).contains(&r.start))
            .collect();
        let by_start: HashMap<u64, u64> = rows.iter().map(|r| (r.start, r.count)).collect();
        let counted = blocks
            .into_iter()
            .map(|b| {
                let n = by_start.get(&b.start).copied().unwrap_or(0);
                (b, n)
            })
            .collect();
        Some((p, counted, rows))
    }

    /// The error for the first region never placed.
    fn missing(&self, pid: u32) -> Option<crate::Error> {
        let i = self.regions.iter().position(|r| r.is_none())?;
        Some(match self.specs.get(i) {
            Some(spec) => super::not_found(pid, spec),
            None => err!("the program ended before its executable could be read"),
        })
    }

    fn on_exec(&mut self, tracer: &mut Tracer, pid: u32) -> Result<()> {
        if self.placement.exec() {
            // The program ran another (a wrapper such as env): its breakpoints went with its
            // code; start over on the new program.
            self.regions.iter_mut().for_each(|r| *r = None);
            self.codes.iter_mut().for_each(|c| *c = None);
            self.code_cache.clear();
            self.cover_blocks.iter_mut().for_each(Vec::clear);
            self.counts.reset();
            self.cover.clear();
            self.hits.clear();
            self.block_probes.clear();
            self.probed_blocks.clear();
            self.probed_threads.clear();
            self.inproc = None;
            self.uprobe_fallbacks = 0;
            self.patched.clear();
            self.counting_bps.clear();
            self.bp_hits.clear();
        }
        let all = self.place_all(tracer, pid, pid)?;
        // (A region never found is an error at the end.)
        self.placement.after_exec(tracer, pid, all);
        tracer.resume(pid);
        Ok(())
    }

    /// Whether the session has its own breakpoint at `addr` (a count, coverage or counting
    /// one).
    fn probes(&self, addr: u64) -> bool {
        self.counts.has_bp(addr)
            || self.cover.contains_key(&addr)
            || self.counting_bps.contains_key(&addr)
    }

    /// Our own breakpoint at the entry point or in ld.so: place what can be placed now.
    fn on_control(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) -> Result<()> {
        // (Which of the control addresses the session probes too, before and after placing.)
        let probed =
            |s: &Self| -> Vec<u64> { s.placement.controls().filter(|&a| s.probes(a)).collect() };
        let probes = probed(self);
        self.placement
            .lift(tracer, pid, addr, &|a| probes.contains(&a));
        let all = self.place_holding(tracer, tid, pid)?;
        let counted = self.probes(addr);
        let probes = probed(self);
        self.placement
            .after_control(tracer, pid, addr, all, &|a| probes.contains(&a))?;
        if counted {
            self.on_breakpoint(tracer, tid, pid, addr);
        } else {
            tracer.resume(tid);
        }
        Ok(())
    }

    /// [`Session::place_all`] from stopped thread `tid`, with the others held for the
    /// in-process engine (its patches and system calls need every thread stopped).
    fn place_holding(&mut self, tracer: &mut Tracer, tid: u32, pid: u32) -> Result<bool> {
        if !matches!(self.engine, Engine::InProcess) {
            return self.place_all(tracer, tid, pid);
        }
        tracer.hold_others(tid);
        let all = self.place_all(tracer, tid, pid);
        tracer.let_others_go();
        all
    }

    fn on_breakpoint(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) {
        if let Some(&at) = self.counting_bps.get(&addr) {
            self.counts.stops += 1;
            *self.bp_hits.entry(at).or_default() += 1;
            // Coverage: its first hit is all it needs to know.
            if self.coverage {
                let _ = tracer.remove_breakpoint(pid, addr);
            }
            tracer.resume(tid);
        } else if let Some(at) = self.cover.remove(&addr) {
            self.counts.stops += 1;
            self.hits.insert(at);
            let _ = tracer.remove_breakpoint(pid, addr);
            tracer.resume(tid);
        } else if self.counts.has_bp(addr) {
            self.counts.on_breakpoint(tracer, tid, pid, addr);
        } else {
            tracer.resume(tid);
        }
    }

    /// The blocks of each region, in ELF addresses, with their symbols.
    /// (`regions`: the session's, by index, None where not placed.)
    fn results(&mut self, regions: &[Option<Placed>]) -> Vec<super::BlockRow> {
        let codes = &self.codes;
        let read = |addr: u64, len: usize| {
            regions
                .iter()
                .zip(codes)
                .filter_map(|(r, c)| Some((r.as_ref()?, c)))
                .find(|(r, _)| (r.lo..r.hi).contains(&addr))
                .and_then(|(r, c)| {
                    c.as_ref()?
                        .bytes(addr.wrapping_sub(r.file.bias), len as u64)
                })
                .map_or_else(Vec::new, <[u8]>::to_vec)
        };
        // Counted at one place per block (uprobes, in-process).
        let uprobes = matches!(self.engine, Engine::Uprobe(_) | Engine::InProcess);
        // Uprobe engine: each block's hits, summed over the threads it was opened on.
        let mut probed: HashMap<(usize, usize), u64> = HashMap::new();
        for (i, k, _, counters) in &self.block_probes {
            let n = counters.iter().map(|c| c.count().unwrap_or(0)).sum::<u64>();
            *probed.entry((*i, *k)).or_default() += n;
        }
        // In-process engine: the shared counters, and the breakpoints' hits.
        if let Some(inproc) = &self.inproc {
            for &(i, k, c) in &self.patched {
                *probed.entry((i, k)).or_default() += inproc.count(c);
            }
        }
        for (&at, &n) in &self.bp_hits {
            *probed.entry(at).or_default() += n;
        }
        if uprobes && self.coverage {
            self.hits = probed
                .iter()
                .filter(|(_, &n)| n > 0)
                .map(|(&at, _)| at)
                .collect();
        }
        let counted = if self.coverage || uprobes {
            Vec::new()
        } else {
            self.counts.blocks(&read)
        };
        let mut blocks = Vec::new();
        // A block of two overlapping regions is reported once, with the first.
        let mut reported: HashSet<u64> = HashSet::new();
        for (i, region) in regions.iter().enumerate() {
            let Some(region) = region else {
                continue;
            };
            let Some(code) = self.codes.get(i).and_then(|c| c.as_ref()) else {
                continue;
            };
            let bias = region.file.bias;
            if self.coverage {
                let hits = &self.hits;
                let items = self.cover_blocks[i].iter().enumerate().map(|(k, b)| {
                    let hit = hits.contains(&(i, k));
                    (b.start, b.end, b.instructions, hit as u64, Some(hit))
                });
                blocks.extend(rows(region, code, &mut self.symbols, items));
            } else if uprobes {
                let items: Vec<_> = self.cover_blocks[i]
                    .iter()
                    .enumerate()
                    .filter_map(|(k, b)| {
                        let n = probed.get(&(i, k)).copied().unwrap_or(0);
                        (n > 0).then_some((b.start, b.end, b.instructions, n, None))
                    })
                    .collect();
                blocks.extend(rows(region, code, &mut self.symbols, items));
            } else {
                let items: Vec<_> = counted
                    .iter()
                    .copied()
                    .filter(|&(s, _, _)| (region.lo..region.hi).contains(&s) && reported.insert(s))
                    .map(|(s, e, n)| {
                        let (s, e) = (s.wrapping_sub(bias), e.wrapping_sub(bias));
                        (s, e, code.instructions(s, e), n, None)
                    })
                    .collect();
                blocks.extend(rows(region, code, &mut self.symbols, items));
            }
        }
        blocks
    }
}

/// The in-process engine exists on this machine.
const IN_PROCESS_BUILT: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// Runs the target under the breakpoints of `count` or `coverage`.
///
/// (One function of 182 lines: the engine chosen, the Session set out field by field, one event
/// loop whose arms call the Session's methods, then the ending in its order; `tracer`, `launched`,
/// `place_at_stop` and `exit` run through all four.)
pub fn run(args: &BlocksConfig, specs: &[RegionSpec]) -> Result<(Report, Option<ExitStatus>)> {
    // In-process unless another is asked for (x86_64 and AArch64; elsewhere ptrace). Not uprobes: each
    // costs about 75 ms to remove on this VM (the kernel waits a grace period for each), one
    // per block, which outweighs the stops a short run saves (see docs/benchmarks.md).
    // The analyzer's options are the ptrace engine's.
    let ptrace_asked = args.analyzer == AnalyzerKind::Learn || args.step_branches;
    let (engine, auto_engine) = match args.engine {
        None if IN_PROCESS_BUILT && !ptrace_asked => (Engine::InProcess, true),
        None => (Engine::Ptrace, false),
        Some(EngineKind::InProcess) if IN_PROCESS_BUILT => (Engine::InProcess, false),
        Some(EngineKind::InProcess) => {
            bail!("the in-process engine is built for x86_64 and AArch64 only: use --engine ptrace")
        }
        some => (Engine::choose(some)?.0, false),
    };
    // (In-process as root: a block it cannot patch gets a uprobe, which never stops the
    // program, rather than a breakpoint; new threads are then held until theirs are open.
    // Not tried first: closing a uprobe takes the kernel 75 ms. One that cannot be opened
    // then is a breakpoint still.)
    let fallback_pmu = match engine {
        Engine::InProcess if !args.step_branches && superprof_sample::euid() == 0 => {
            superprof_sample::uprobe_pmu().ok()
        }
        _ => None,
    };
    let opts = TraceOptions {
        hold_new_threads: matches!(engine, Engine::Uprobe(_)) || fallback_pmu.is_some(),
        // (The ptrace engine stops the program at every block anyway.)
        guard_sigtrap: matches!(engine, Engine::Ptrace),
        ..TraceOptions::default()
    };
    let (mut tracer, launched) = match &args.target {
        &Target::Pid(pid) => (Tracer::attach(pid, opts)?, false),
        Target::Command(command) => (Tracer::spawn(command, opts)?, true),
        Target::Thread(_) | Target::System { .. } => {
            bail!("blocks follows a command or a process (-p), not a thread or the machine")
        }
    };
    let root = tracer.root();
    let mut s = Session::new(
        specs.to_vec(),
        args.mode == Mode::Coverage,
        (engine, auto_engine),
        (args.analyzer, args.step_branches),
        fallback_pmu,
    );
    // A counting uprobe per block and thread.
    if matches!(engine, Engine::Uprobe(_)) {
        superprof_sample::raise_fd_limit();
    }
    // Attached: the in-process engine places the regions from a stopped thread (the first
    // stop of the interrupted main thread); the others right away.
    let mut place_at_stop = false;
    if !launched {
        if matches!(engine, Engine::InProcess) {
            place_at_stop = tracer.interrupt(root);
            if !place_at_stop {
                bail!("cannot stop pid {root} to place the regions");
            }
        } else if !s.place_all(&mut tracer, root, root)? {
            if let Some(e) = s.missing(root) {
                return Err(e);
            }
        }
    }
    let start = Instant::now();
    let duration = args.duration;
    let mut exit = None;
    let mut progress = superprof_resolve::progress::Progress::new(true);
    loop {
        progress.update(|| s.so_far());
        if (args.stop)() || duration.is_some_and(|d| start.elapsed() >= d) {
            break;
        }
        let Some(ev) = tracer.next_event(Duration::from_millis(50))? else {
            continue;
        };
        if let Some(status) = s.on_event(&mut tracer, root, ev, &mut place_at_stop)? {
            exit = Some(status);
            break;
        }
    }
    progress.clear();
    if launched && exit.is_none() {
        exit = tracer.terminate(Duration::from_secs(5), |_| {})?;
    }
    // Every breakpoint is removed and an attached process let go here.
    let killed = tracer.finish();
    if let Some(e) = s.missing(root) {
        return match exit.or(killed) {
            // A region never found: said, and the command's status is superprof's.
            Some(status) if launched => Err(Error::NothingToShow {
                why: superprof_unwind::one_line(&e),
                status,
            }),
            _ => Err(e),
        };
    }
    // (Every region is placed here: one missing was an error above.)
    let placed = std::mem::take(&mut s.regions);
    let blocks = s.results(&placed);
    let regions: Vec<Placed> = placed.into_iter().flatten().collect();
    // In-process: the counters' pages freed (an attached program keeps only the mappings).
    if let Some(ip) = &s.inproc {
        ip.release();
    }
    // The probes closed (about 75 ms each here: the kernel waits a grace period per probe,
    // one after another, however many threads close them).
    s.block_probes.clear();
    s.probe_source = None;
    Ok((
        Report {
            mode: args.mode,
            analyzer: (!s.coverage && matches!(s.engine, Engine::Ptrace))
                .then(|| s.counts.analyzer_stats()),
            engine: Some(s.engine.name()),
            regions,
            blocks,
            stops: s.counts.stops,
            emulated: s.counts.emulated,
            samples_elsewhere: 0,
            patched: s.patched.len(),
            uprobe_blocks: s.uprobe_fallbacks,
            breakpoint_blocks: s.counting_bps.len(),
        },
        exit.or(killed),
    ))
}

/// What a placed region's bounds are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bounds {
    /// A function symbol's.
    Function,
    /// Given as addresses or lines.
    Range,
    /// From the executable's first function to the end of its last.
    WholeExecutable,
}

/// Proves a placed region's bounds where its probes and block cuts go: its start an
/// instruction's start, its end one or a function's end, a function's symbol one its
/// call-frame information agrees with (ELF addresses: the runtime ones less the file's bias).
fn prove(code: Option<&ElfCode>, p: &Placed, bounds: Bounds) -> Result<(), String> {
    let code = code.ok_or_else(|| {
        format!(
            "cannot read {} to check where its instructions start",
            p.file.path.display()
        )
    })?;
    let (lo, hi) = (
        p.lo.wrapping_sub(p.file.bias),
        p.hi.wrapping_sub(p.file.bias),
    );
    match bounds {
        // (Its end is the function's, which the proof bounds by its call-frame information.)
        Bounds::Function => code.prove_function(lo, hi.saturating_sub(lo), &p.name),
        // (Its end is the end of a function symbol: no cut, no probe there.)
        Bounds::WholeExecutable => code.prove_instruction_start(lo),
        Bounds::Range => {
            code.prove_instruction_start(lo)?;
            code.prove_region_end(hi)
        }
    }
}
