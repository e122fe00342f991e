//! `count` and `coverage` on the coordinator's breakpoints: the run loop, regions placed at
//! exec (and again at the entry point and at each change of ld.so's link map, for libraries),
//! and the results. The counting itself is [`super::count`].
//!
//! coverage: a one-shot breakpoint at every statically decoded block of the regions, removed
//! at its first hit.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use superprof_analyze::{Analyzer, Arch, Block, Decode, Learn};
use superprof_trace::{ExitStatus, TraceEvent, TraceOptions, Tracer};

use super::count::Counts;
use super::{place, rows, whole_executable, ElfCode, Placed, Report};
use crate::cli::{AnalyzerArg, BlocksArgs, BlocksMode};
use crate::region::RegionSpec;
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
    /// Breakpoints of our own, to place regions later: the entry point, ld.so's
    /// _dl_debug_state.
    entry_bp: Option<u64>,
    dl_bp: Option<u64>,
    execs: u32,
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
            if self.coverage {
                let bias = p.file.bias;
                let blocks = code
                    .as_ref()
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
                if let Some(c) = &code {
                    let bias = p.file.bias;
                    for at in c.reentries(p.lo.wrapping_sub(bias), p.hi.wrapping_sub(bias)) {
                        self.counts.add_start(tracer, pid, at.wrapping_add(bias));
                    }
                }
            }
            self.codes[i] = code;
            self.regions[i] = Some(p);
        }
        Ok(all)
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
        if self.execs > 0 {
            // The program ran another (a wrapper such as env): its breakpoints went with its
            // code; start over on the new program.
            self.regions.iter_mut().for_each(|r| *r = None);
            self.codes.iter_mut().for_each(|c| *c = None);
            self.cover_blocks.iter_mut().for_each(Vec::clear);
            self.counts.reset();
            self.cover.clear();
            self.hits.clear();
            self.entry_bp = None;
            self.dl_bp = None;
        }
        self.execs += 1;
        if !self.place_all(tracer, pid)? {
            // Libraries are mapped by ld.so after exec: look again at the entry point (a
            // region never found is an error at the end).
            if let Some(e) = superprof_trace::entry_point(pid) {
                if tracer.set_breakpoint(pid, e).is_ok() {
                    self.entry_bp = Some(e);
                }
            }
        }
        tracer.resume(pid);
        Ok(())
    }

    fn is_control(&self, addr: u64) -> bool {
        Some(addr) == self.entry_bp || Some(addr) == self.dl_bp
    }

    /// Our own breakpoint at the entry point or in ld.so: place what can be placed now.
    fn on_control(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) -> Result<()> {
        let all = self.place_all(tracer, pid)?;
        let counted = self.counts.has_bp(addr) || self.cover.contains_key(&addr);
        if Some(addr) == self.entry_bp {
            self.entry_bp = None;
            if !counted {
                let _ = tracer.remove_breakpoint(pid, addr);
            }
            if !all {
                // Perhaps in a library loaded later (dlopen): look again each time ld.so
                // reports a change of its link map.
                if let Some(f) = superprof_trace::find_function(pid, "_dl_debug_state")?.first() {
                    if tracer.set_breakpoint(pid, f.addr).is_ok() {
                        self.dl_bp = Some(f.addr);
                    }
                }
            }
        } else if all {
            self.dl_bp = None;
            if !counted {
                let _ = tracer.remove_breakpoint(pid, addr);
            }
        }
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
        let counted = if self.coverage {
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
    let opts = TraceOptions::default();
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
        entry_bp: None,
        dl_bp: None,
        execs: 0,
    };
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
            TraceEvent::Breakpoint { tid, pid, addr } if s.is_control(addr) => {
                s.on_control(&mut tracer, tid, pid, addr)?
            }
            TraceEvent::Breakpoint { tid, pid, addr } if pid == root => {
                s.on_breakpoint(&mut tracer, tid, pid, addr)
            }
            TraceEvent::Stepped { tid, pid } if pid == root => {
                s.counts.on_stepped(&mut tracer, tid, pid)
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
    Ok((
        Report {
            mode: args.mode,
            analyzer: (!s.coverage).then(|| s.counts.analyzer_stats()),
            regions,
            blocks,
            stops: s.counts.stops,
            emulated: s.counts.emulated,
            samples_elsewhere: 0,
        },
        exit.or(killed),
    ))
}
