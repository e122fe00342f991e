//! `count` and `coverage` on the coordinator's breakpoints: the run loop, regions placed at
//! exec (and again at the entry point and at each change of ld.so's link map, for libraries),
//! and the results. The counting itself is [`super::count`].
//!
//! coverage: a one-shot breakpoint at every statically decoded block of the regions, removed
//! at its first hit.
//!
//! With the uprobe engine, count and coverage both put a counting uprobe
//! (`superprof_sample::UprobeCounter`: no ring, nothing written per hit) on every statically
//! decoded block: a block runs straight through, so any of its instructions runs as often as
//! the block, and the first one the kernel accepts is probed (it refuses some, such as x86's
//! lock-prefixed ones). The program never stops for a block; the counts are read at the end.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use superprof_analyze::{Analyzer, Arch, Block, Decode, Learn};
use superprof_trace::{ExitStatus, TraceEvent, TraceOptions, Tracer};

use super::count::Counts;
use super::{place, rows, whole_executable, ElfCode, Placed, Report};
use crate::cli::{AnalyzerArg, BlocksArgs, BlocksMode};
use crate::engine::Engine;
use crate::region::{Placement, RegionSpec};
use crate::sys;

/// What a run keeps: the regions as placed, and the count or coverage state.
struct Session<'a> {
    specs: &'a [RegionSpec],
    coverage: bool,
    symbols: superprof_symbols::Symbolizer,
    regions: Vec<Option<Placed>>,
    codes: Vec<Option<ElfCode>>,
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
}

impl Session<'_> {
    /// Places what can be placed; true when every region is.
    fn place_all(&mut self, tracer: &mut Tracer, pid: u32) -> Result<bool> {
        let mut all = true;
        for i in 0..self.regions.len() {
            if self.regions[i].is_some() {
                continue;
            }
            let placed = if self.specs.is_empty() {
                Some(whole_executable(pid)?)
            } else {
                place(pid, &self.specs[i], &mut self.symbols)?
            };
            let Some(p) = placed else {
                all = false;
                continue;
            };
            let code = ElfCode::open(&p.file.open_path);
            if code.as_ref().is_some_and(|c| !c.is_64) {
                bail!(
                    "{} is a 32-bit program: blocks decodes 64-bit x86_64 and AArch64 code only",
                    p.file.path.display()
                );
            }
            self.symbols.preload(&p.file.path, &p.file.open_path);
            self.arm(tracer, pid, i, &p, code.as_ref())?;
            self.codes[i] = code;
            self.regions[i] = Some(p);
        }
        Ok(all)
    }

    /// Puts region `i`'s probes in: uprobes, else breakpoints.
    fn arm(
        &mut self,
        tracer: &mut Tracer,
        pid: u32,
        i: usize,
        p: &Placed,
        code: Option<&ElfCode>,
    ) -> Result<()> {
        if let Engine::Uprobe(pmu) = self.engine {
            match self.arm_uprobes(pmu, pid, i, p, code) {
                Ok(()) => return Ok(()),
                Err(why) if !self.auto_engine => bail!("{why}: use --engine ptrace"),
                Err(why) => {
                    eprintln!(
                        "superprof: probing with ptrace (the program stops at every probe): {why}"
                    );
                    self.fall_back_to_ptrace(tracer, pid);
                }
            }
        }
        self.arm_breakpoints(tracer, pid, i, p, code);
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
        let blocks = code.static_blocks(p.lo.wrapping_sub(bias), p.hi.wrapping_sub(bias));
        let threads = superprof_sample::list_threads(pid).unwrap_or_else(|_| vec![pid]);
        self.probed_threads.extend(&threads);
        let mut probes = Vec::new();
        for (k, b) in blocks.iter().enumerate() {
            // A block of two overlapping regions belongs to the first.
            let at = b.start.wrapping_add(bias);
            if self.probed_blocks.contains(&at) {
                continue;
            }
            let bytes = code.bytes(b.start, b.end - b.start).unwrap_or_default();
            let mut probed = None;
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
                for &tid in &threads {
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
                    probed = Some((spec, on_threads));
                    break;
                }
            }
            let Some((spec, counters)) = probed else {
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

    /// A new thread (held before its first instruction): every block's probe on it too.
    fn arm_thread(&mut self, tid: u32) -> Result<()> {
        if !matches!(self.engine, Engine::Uprobe(_)) || !self.probed_threads.insert(tid) {
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
        self.block_probes.clear();
        self.probed_blocks.clear();
        self.probed_threads.clear();
        self.probe_source = None;
        for j in 0..self.regions.len() {
            if let Some(p) = self.regions[j].clone() {
                let code = self.codes[j].take();
                self.arm_breakpoints(tracer, pid, j, &p, code.as_ref());
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
            // Code outside the region that jumps back into it (f.cold parts).
            if let Some(c) = code {
                for at in c.reentries(p.lo.wrapping_sub(bias), p.hi.wrapping_sub(bias)) {
                    self.counts.add_start(tracer, pid, at.wrapping_add(bias));
                }
            }
        }
    }

    /// The error for the first region never placed.
    fn missing(&self, pid: u32) -> Option<anyhow::Error> {
        let i = self.regions.iter().position(|r| r.is_none())?;
        Some(match self.specs.get(i) {
            Some(spec) => super::not_found(pid, spec),
            None => anyhow::anyhow!("the program ended before its executable could be read"),
        })
    }

    fn on_exec(&mut self, tracer: &mut Tracer, pid: u32) -> Result<()> {
        if self.placement.exec() {
            // The program ran another (a wrapper such as env): its breakpoints went with its
            // code; start over on the new program.
            self.regions.iter_mut().for_each(|r| *r = None);
            self.codes.iter_mut().for_each(|c| *c = None);
            self.cover_blocks.iter_mut().for_each(Vec::clear);
            self.counts.reset();
            self.cover.clear();
            self.hits.clear();
            self.block_probes.clear();
            self.probed_blocks.clear();
            self.probed_threads.clear();
        }
        let all = self.place_all(tracer, pid)?;
        // (A region never found is an error at the end.)
        self.placement.after_exec(tracer, pid, all);
        tracer.resume(pid);
        Ok(())
    }

    /// Our own breakpoint at the entry point or in ld.so: place what can be placed now.
    fn on_control(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) -> Result<()> {
        let all = self.place_all(tracer, pid)?;
        let counted = self.counts.has_bp(addr) || self.cover.contains_key(&addr);
        self.placement
            .after_control(tracer, pid, addr, all, counted)?;
        if counted {
            self.on_breakpoint(tracer, tid, pid, addr);
        } else {
            tracer.resume(tid);
        }
        Ok(())
    }

    fn on_breakpoint(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) {
        if let Some(at) = self.cover.remove(&addr) {
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
    fn results(&mut self, regions: &[Placed]) -> Vec<super::BlockRow> {
        let codes = &self.codes;
        let read = |addr: u64, len: usize| {
            regions
                .iter()
                .zip(codes)
                .find(|(r, _)| (r.lo..r.hi).contains(&addr))
                .and_then(|(r, c)| {
                    c.as_ref()?
                        .bytes(addr.wrapping_sub(r.file.bias), len as u64)
                })
                .map_or_else(Vec::new, <[u8]>::to_vec)
        };
        let uprobes = matches!(self.engine, Engine::Uprobe(_));
        // Uprobe engine: each block's hits, summed over the threads it was opened on.
        let mut probed: HashMap<(usize, usize), u64> = HashMap::new();
        for (i, k, _, counters) in &self.block_probes {
            let n = counters.iter().map(|c| c.count().unwrap_or(0)).sum::<u64>();
            *probed.entry((*i, *k)).or_default() += n;
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

/// Runs the target under the breakpoints of `count` or `coverage`.
pub fn run(args: &BlocksArgs, specs: &[RegionSpec]) -> Result<(Report, Option<ExitStatus>)> {
    // ptrace unless uprobes are asked for: each uprobe costs about 75 ms to remove on this VM
    // (the kernel waits a grace period for each), one per block, which outweighs the stops a
    // short run saves (see docs/benchmarks.md).
    let engine = match args.engine {
        None => Engine::Ptrace,
        some => Engine::choose(some)?.0,
    };
    let opts = TraceOptions {
        hold_new_threads: matches!(engine, Engine::Uprobe(_)),
        ..TraceOptions::default()
    };
    let (mut tracer, launched) = match args.target.pid {
        Some(pid) => (Tracer::attach(pid, opts)?, false),
        None => (Tracer::spawn(&args.target.command, opts)?, true),
    };
    let root = tracer.root();
    let analyzer: Box<dyn Analyzer> = match args.analyzer {
        AnalyzerArg::Decode => Box::new(Decode::new(Arch::HOST)),
        AnalyzerArg::Learn => Box::new(Learn::new(Arch::HOST, true)),
    };
    let n = specs.len().max(1);
    let mut s = Session {
        specs,
        coverage: args.mode == BlocksMode::Coverage,
        symbols: superprof_symbols::Symbolizer::default(),
        regions: vec![None; n],
        codes: (0..n).map(|_| None).collect(),
        counts: Counts::new(
            analyzer,
            args.analyzer == AnalyzerArg::Decode && !args.step_branches,
        ),
        cover: HashMap::new(),
        cover_blocks: vec![Vec::new(); n],
        hits: HashSet::new(),
        placement: Placement::default(),
        engine,
        auto_engine: false,
        block_probes: Vec::new(),
        probe_source: None,
        probed_threads: HashSet::new(),
        probed_blocks: HashSet::new(),
    };
    // A counting uprobe per block and thread.
    if matches!(engine, Engine::Uprobe(_)) {
        sys::raise_fd_limit();
    }
    if !launched && !s.place_all(&mut tracer, root)? {
        if let Some(e) = s.missing(root) {
            return Err(e);
        }
    }
    let start = Instant::now();
    let duration = args.duration;
    let mut exit = None;
    loop {
        if sys::stop_requested() || duration.is_some_and(|d| start.elapsed() >= d) {
            break;
        }
        let Some(ev) = tracer.next_event(Duration::from_millis(50))? else {
            continue;
        };
        match ev {
            TraceEvent::Exec { pid } if pid == root => s.on_exec(&mut tracer, pid)?,
            TraceEvent::Breakpoint { tid, pid, addr } if s.placement.is_control(addr) => {
                s.on_control(&mut tracer, tid, pid, addr)?
            }
            TraceEvent::Breakpoint { tid, pid, addr } if pid == root => {
                s.on_breakpoint(&mut tracer, tid, pid, addr)
            }
            TraceEvent::Stepped { tid, pid } if pid == root => {
                s.counts.on_stepped(&mut tracer, tid, pid)
            }
            // A new thread's probes as soon as it is known (a thread born while the
            // coordinator holds every thread has no ThreadReady), and before it runs.
            TraceEvent::NewThread { tid, .. } => s.arm_thread(tid)?,
            TraceEvent::ThreadReady { tid, .. } => {
                s.arm_thread(tid)?;
                tracer.resume(tid);
            }
            TraceEvent::ThreadExited { tid, .. } => s.counts.forget_thread(tid),
            TraceEvent::ProcessExited { pid, status } if pid == root => {
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
    if let Some(e) = s.missing(root) {
        return match exit.or(killed) {
            // A region never found: said, and the command's status is superprof's.
            Some(status) if launched => Err(crate::NothingToShow {
                why: crate::one_line(&e),
                status,
            }
            .into()),
            _ => Err(e),
        };
    }
    let regions: Vec<Placed> = std::mem::take(&mut s.regions)
        .into_iter()
        .flatten()
        .collect();
    let blocks = s.results(&regions);
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
        },
        exit.or(killed),
    ))
}
