//! `count` and `coverage`: blocks counted with the coordinator's breakpoints.
//!
//! count: a breakpoint at each region's entry, and at the last instruction of every block
//! execution reaches (the analyzer says which instruction that is). A thread stopped at a
//! block's end is single-stepped; the pc it lands on starts the next block, whose end gets a
//! breakpoint in turn. A branch that leaves the region (a call) gets a breakpoint after
//! itself, where the call comes back. Entries counted there ("start" breakpoints) see every
//! execution; landings after a step see only those that arrive by a branch, and a block cut
//! in two by a landing in its middle passes its executions on to the second half (see
//! [`Counts::blocks`]).
//!
//! coverage: a one-shot breakpoint at every statically decoded block, removed at its first
//! hit.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use superprof_analyze::{Analyzer, Arch, BlockEnd, Decode, Learn};
use superprof_trace::{ExitStatus, TraceEvent, TraceOptions, Tracer};

use super::{place, rows, whole_executable, ElfCode, Placed, Report};
use crate::cli::{AnalyzerArg, BlocksArgs, BlocksMode};
use crate::region::RegionSpec;
use crate::sys;

/// Why a thread is being single-stepped.
#[derive(Debug, Clone, Copy)]
struct Step {
    from: u64,
    /// The stack pointer before the step (a call pushes its return address below it).
    sp: u64,
    code: [u8; 16],
    /// Stepping a block's last instruction (else: stepping to learn, inside a block).
    block_end: bool,
}

/// The count engine's state for one process.
struct Counts {
    analyzer: Box<dyn Analyzer>,
    arch: Arch,
    /// Runtime [lo, hi) of the regions.
    ranges: Vec<(u64, u64)>,
    /// Breakpoints that count every execution of their address.
    starts: HashSet<u64>,
    /// Breakpoints on blocks' last instructions.
    ends: HashSet<u64>,
    /// Executions counted per address: every one at a start, the branch arrivals elsewhere.
    arrivals: BTreeMap<u64, u64>,
    /// Where the block run from each start ends (exclusive): the nearest end seen.
    block_end_of: HashMap<u64, u64>,
    /// Learning: straight single steps that landed on each address. A block end learned late
    /// (a conditional branch first seen not taken) had executions pass it this way.
    passes: HashMap<u64, u64>,
    /// The analyzer's answer per block start, once it knows.
    known: HashMap<u64, BlockEnd>,
    /// Per thread: the block it is in.
    current: HashMap<u32, u64>,
    steps: HashMap<u32, Step>,
    stops: u64,
    /// Single steps inside blocks, to learn (the others step blocks' last instructions).
    learn_steps: u64,
    /// Whether block-ending branches are emulated (decode on x86_64) rather than stepped.
    emulate: bool,
    /// Branches emulated.
    emulated: u64,
    /// Per thread: whether it runs with a CET shadow stack (then calls and returns are
    /// stepped, so that the shadow stack stays in step).
    shadow_stack: HashMap<u32, bool>,
}

impl Counts {
    fn in_region(&self, addr: u64) -> Option<(u64, u64)> {
        self.ranges
            .iter()
            .copied()
            .find(|&(lo, hi)| (lo..hi).contains(&addr))
    }

    /// Forgets the program (it called exec); the analyzer keeps what it learned.
    fn reset(&mut self) {
        self.ranges.clear();
        self.starts.clear();
        self.ends.clear();
        self.arrivals.clear();
        self.block_end_of.clear();
        self.known.clear();
        self.current.clear();
        self.steps.clear();
        self.passes.clear();
        self.shadow_stack.clear();
    }

    /// The block run from `start` ended before `end`.
    fn ended(&mut self, start: u64, end: u64) {
        if end <= start {
            return; // not a run from `start` (the thread came another way)
        }
        let e = self.block_end_of.entry(start).or_insert(end);
        *e = (*e).min(end);
    }

    fn is_syscall(&self, tracer: &Tracer, pid: u32, addr: u64) -> bool {
        let mut code = [0u8; 16];
        let n = tracer.read_code(pid, addr, &mut code);
        self.arch
            .classify(&code[..n], addr)
            .is_some_and(|i| i.flow == superprof_analyze::Flow::Syscall)
    }

    fn has_bp(&self, addr: u64) -> bool {
        self.starts.contains(&addr) || self.ends.contains(&addr)
    }

    fn add_start(&mut self, tracer: &mut Tracer, pid: u32, addr: u64) {
        if self.starts.insert(addr) {
            self.insert(tracer, pid, addr);
        }
    }

    fn add_end(&mut self, tracer: &mut Tracer, pid: u32, addr: u64) {
        if self.ends.insert(addr) {
            self.insert(tracer, pid, addr);
        }
    }

    fn insert(&mut self, tracer: &mut Tracer, pid: u32, addr: u64) {
        let _ = tracer.set_breakpoint(pid, addr);
    }

    /// Whether a breakpoint is really in the code at `addr`.
    fn inserted(&self, addr: u64) -> bool {
        self.has_bp(addr)
    }

    fn block_end(&mut self, tracer: &Tracer, pid: u32, pc: u64, limit: u64) -> BlockEnd {
        if let Some(&k) = self.known.get(&pc) {
            return k;
        }
        let mut read = |addr: u64, buf: &mut [u8]| tracer.read_code(pid, addr, buf);
        let k = self.analyzer.block_end(pc, limit, &mut read);
        if self.analyzer.answers_are_final() && !matches!(k, BlockEnd::Unknown { .. }) {
            self.known.insert(pc, k);
        }
        k
    }

    fn start_step(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, pc: u64, block_end: bool) {
        let mut code = [0u8; 16];
        tracer.read_code(pid, pc, &mut code);
        let sp = tracer.regs(tid).map_or(0, |r| r.sp);
        if !block_end {
            self.learn_steps += 1;
        }
        self.steps.insert(
            tid,
            Step {
                from: pc,
                sp,
                code,
                block_end,
            },
        );
        if tracer.single_step(tid).is_err() {
            self.steps.remove(&tid);
        }
    }

    /// A thread stopped at `pc` inside a region (already counted where it must be): put a
    /// breakpoint at the end of its block, or step it, and let it go.
    fn advance(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, pc: u64, on_bp: bool) {
        let Some((_, hi)) = self.in_region(pc) else {
            tracer.resume(tid);
            return;
        };
        let cur = self.current.get(&tid).copied();
        match self.block_end(tracer, pid, pc, hi) {
            BlockEnd::Last { addr, len, .. } => {
                if let Some(c) = cur {
                    self.ended(c, addr + len as u64);
                }
                let next = addr + len as u64;
                if self.is_syscall(tracer, pid, addr) {
                    // The kernel returns right after a syscall: counting there needs no step
                    // (which could block with the other threads held).
                    if self.in_region(next).is_some() {
                        self.add_start(tracer, pid, next);
                    }
                    self.current.remove(&tid);
                    tracer.resume(tid);
                    return;
                }
                self.add_end(tracer, pid, addr);
                if addr == pc && (on_bp || !self.inserted(pc)) {
                    self.start_step(tracer, tid, pid, pc, true);
                } else {
                    // It stops at the breakpoint (at once if it sits on it).
                    tracer.resume(tid);
                }
            }
            BlockEnd::Open { end, .. } => {
                if let Some(c) = cur {
                    self.ended(c, end);
                }
                // It runs off the region's end: where it comes back is not known.
                self.current.remove(&tid);
                tracer.resume(tid);
            }
            BlockEnd::Unknown { .. } => {
                if on_bp || !self.inserted(pc) {
                    self.start_step(tracer, tid, pid, pc, false);
                } else {
                    tracer.resume(tid);
                }
            }
        }
    }

    fn on_breakpoint(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) {
        self.stops += 1;
        self.steps.remove(&tid);
        if self.starts.contains(&addr) {
            *self.arrivals.entry(addr).or_default() += 1;
            self.current.insert(tid, addr);
        }
        if self.ends.contains(&addr) {
            if !(self.emulate && self.emulate_branch(tracer, tid, pid, addr)) {
                self.start_step(tracer, tid, pid, addr, true);
            }
            return;
        }
        self.advance(tracer, tid, pid, addr, true);
    }

    /// Sends a thread stopped on the branch at `addr` where the branch would, without running
    /// it (one stop instead of a stop and a step). False if this branch is for stepping.
    #[cfg(target_arch = "x86_64")]
    fn emulate_branch(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) -> bool {
        let mut code = [0u8; 16];
        let n = tracer.read_code(pid, addr, &mut code);
        let Ok(mut raw) = tracer.raw_regs(tid) else {
            return false;
        };
        let regs = superprof_analyze::X86Regs {
            gpr: [
                raw.rax, raw.rcx, raw.rdx, raw.rbx, raw.rsp, raw.rbp, raw.rsi, raw.rdi, raw.r8,
                raw.r9, raw.r10, raw.r11, raw.r12, raw.r13, raw.r14, raw.r15,
            ],
            rflags: raw.eflags,
            fs_base: raw.fs_base,
            gs_base: raw.gs_base,
        };
        let mut read_u64 = |a: u64| {
            let mut b = [0u8; 8];
            (tracer.read_code(pid, a, &mut b) == 8).then(|| u64::from_ne_bytes(b))
        };
        let Some(t) = superprof_analyze::x86_branch(&code[..n], addr, &regs, &mut read_u64) else {
            return false;
        };
        if (t.push.is_some() || t.pop)
            && *self.shadow_stack.entry(tid).or_insert_with(|| {
                std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).is_ok_and(|s| {
                    s.lines()
                        .any(|l| l.starts_with("x86_Thread_features:") && l.contains("shstk"))
                })
            })
        {
            return false;
        }
        let Some(len) = self.arch.classify(&code[..n], addr).map(|i| i.len as u64) else {
            return false;
        };
        if let Some(ret) = t.push {
            let sp = raw.rsp.wrapping_sub(8);
            if tracer.poke(tid, sp, ret).is_err() {
                return false;
            }
            raw.rsp = sp;
        }
        if t.pop {
            raw.rsp = raw.rsp.wrapping_add(8);
        }
        raw.rip = t.pc;
        if tracer.set_raw_regs(tid, &raw).is_err() {
            return false;
        }
        tracer.leave_breakpoint(tid);
        self.emulated += 1;
        self.arrive(tracer, tid, pid, addr + len, t.pc, t.push.is_some());
        true
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn emulate_branch(&mut self, _: &mut Tracer, _: u32, _: u32, _: u64) -> bool {
        false
    }

    fn on_stepped(&mut self, tracer: &mut Tracer, tid: u32, pid: u32) {
        self.stops += 1;
        let Some(step) = self.steps.remove(&tid) else {
            tracer.resume(tid);
            return;
        };
        let Ok(regs) = tracer.regs(tid) else {
            tracer.resume(tid);
            return;
        };
        let pc = regs.pc;
        self.analyzer.observe(step.from, &step.code, pc);
        let len = self.arch.insn_len(&step.code, step.from).unwrap_or(0) as u64;
        let next = step.from + len;
        if !step.block_end && pc == next {
            // Straight on inside the block.
            if !self.starts.contains(&pc) {
                *self.passes.entry(pc).or_default() += 1;
            } else if !self.inserted(pc) {
                // A start whose breakpoint is not in yet: count it here.
                *self.arrivals.entry(pc).or_default() += 1;
                self.current.insert(tid, pc);
            }
            self.advance(tracer, tid, pid, pc, false);
            return;
        }
        let call = pc != next && is_call(tracer, pid, &regs, &step, next);
        self.arrive(tracer, tid, pid, next, pc, call);
    }

    /// The block of `tid` ended with the instruction before `next`, and its pc is now `pc`,
    /// the start of the next block; `call`: that instruction was a call.
    fn arrive(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, next: u64, pc: u64, call: bool) {
        if let Some(c) = self.current.remove(&tid) {
            self.ended(c, next);
        }
        // A call comes back right after itself, perhaps from code outside the regions (the
        // callee, or a cold part the callee jumped to): count the return there.
        if call && self.in_region(next).is_some() {
            self.add_start(tracer, pid, next);
        }
        if self.in_region(pc).is_none() {
            tracer.resume(tid);
            return;
        }
        if self.starts.contains(&pc) && self.inserted(pc) {
            tracer.resume(tid); // its breakpoint counts it
            return;
        }
        *self.arrivals.entry(pc).or_default() += 1;
        self.current.insert(tid, pc);
        self.advance(tracer, tid, pid, pc, false);
    }

    /// The blocks and their executions, in runtime addresses: (start, end, count). Leaders are
    /// the addresses counted; a block runs from its leader to its end or the next leader, and
    /// one cut by the next leader falls through into it, passing its executions on (unless a
    /// start breakpoint there counted them already). A leader right after a block end that
    /// was learned late also had executions arrive by straight single steps.
    ///
    /// First, each run is cut where the analyzer now knows a block end that it learned after
    /// the run was first seen; the executions that went on past it were single-stepped
    /// (passes). `code` reads the program's code at a runtime address.
    fn blocks(&mut self, code: &dyn Fn(u64, usize) -> Vec<u8>) -> Vec<(u64, u64, u64)> {
        let mut work: Vec<u64> = self.arrivals.keys().copied().collect();
        while let Some(s) = work.pop() {
            let Some(&e) = self.block_end_of.get(&s).filter(|&&e| e > s) else {
                continue;
            };
            let bytes = code(s, (e - s) as usize);
            let mut off = 0usize;
            while off < bytes.len() {
                let at = s + off as u64;
                let Some(insn) = self.arch.classify(&bytes[off..], at) else {
                    break;
                };
                let next = at + insn.len as u64;
                if next < e && self.analyzer.ends_block(&bytes[off..], at) {
                    self.block_end_of.insert(s, next);
                    if let std::collections::btree_map::Entry::Vacant(v) = self.arrivals.entry(next)
                    {
                        v.insert(0);
                        self.block_end_of.insert(next, e);
                        work.push(next);
                    }
                    break;
                }
                off += insn.len as usize;
            }
        }
        let mut out: Vec<(u64, u64, u64)> = Vec::new();
        let leaders: Vec<(u64, u64)> = self.arrivals.iter().map(|(&a, &n)| (a, n)).collect();
        let mut prev: Option<(u64, u64)> = None; // (full end of the previous leader's run, its executions)
        for (i, &(s, arrivals)) in leaders.iter().enumerate() {
            let mut exec = arrivals;
            let passes = self.passes.get(&s).copied().unwrap_or(0);
            match prev {
                // A start breakpoint counts every execution since it was set; passes are
                // from before.
                _ if self.starts.contains(&s) => exec += passes,
                Some((prev_end, prev_exec)) if prev_end > s => exec += prev_exec,
                _ => exec += passes,
            }
            let Some(&full_end) = self.block_end_of.get(&s).filter(|&&e| e > s) else {
                prev = None;
                continue;
            };
            let end = leaders
                .get(i + 1)
                .map_or(full_end, |&(n, _)| n.min(full_end));
            out.push((s, end, exec));
            prev = Some((full_end, exec));
        }
        out
    }
}

/// Whether a step that went from `step.from` to elsewhere was a call: it left the address
/// after itself (`next`) in the link register (AArch64) or pushed it (x86_64).
fn is_call(
    tracer: &Tracer,
    pid: u32,
    regs: &superprof_unwind::UserRegs,
    step: &Step,
    next: u64,
) -> bool {
    if cfg!(target_arch = "aarch64") {
        return regs.lr == next;
    }
    let mut buf = [0u8; 8];
    regs.sp.wrapping_add(8) == step.sp
        && tracer.read_memory(pid, regs.sp, &mut buf) == 8
        && u64::from_ne_bytes(buf) == next
}

/// Runs the target under the breakpoints of `count` or `coverage`.
pub fn run(args: &BlocksArgs, specs: &[RegionSpec]) -> Result<(Report, Option<ExitStatus>)> {
    let opts = TraceOptions::default();
    let (mut tracer, launched) = match args.pid {
        Some(pid) => (Tracer::attach(pid, opts)?, false),
        None => (Tracer::spawn(&args.command, opts)?, true),
    };
    let root = tracer.root();
    let coverage = args.mode == BlocksMode::Coverage;
    let analyzer: Box<dyn Analyzer> = match args.analyzer {
        AnalyzerArg::Decode => Box::new(Decode::new(Arch::HOST)),
        AnalyzerArg::Learn => Box::new(Learn::new(Arch::HOST, true)),
    };
    let mut counts = Counts {
        analyzer,
        arch: Arch::HOST,
        ranges: Vec::new(),
        starts: HashSet::new(),
        ends: HashSet::new(),
        arrivals: BTreeMap::new(),
        block_end_of: HashMap::new(),
        known: HashMap::new(),
        current: HashMap::new(),
        steps: HashMap::new(),
        learn_steps: 0,
        emulate: args.analyzer == AnalyzerArg::Decode && !args.step_branches,
        emulated: 0,
        shadow_stack: HashMap::new(),
        passes: HashMap::new(),
        stops: 0,
    };
    let mut symbols = superprof_symbols::Symbolizer::default();
    let mut regions: Vec<Option<Placed>> = vec![None; specs.len().max(1)];
    // Coverage: one-shot breakpoints, runtime address -> (region, block index).
    let mut cover: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut cover_blocks: Vec<Vec<superprof_analyze::Block>> = Vec::new();
    let mut hits: HashSet<(usize, usize)> = HashSet::new();
    let mut codes: Vec<Option<ElfCode>> = Vec::new();

    // Places what can be placed; true when every region is.
    let mut place_all = |tracer: &mut Tracer,
                         regions: &mut Vec<Option<Placed>>,
                         counts: &mut Counts,
                         cover: &mut HashMap<u64, (usize, usize)>,
                         cover_blocks: &mut Vec<Vec<superprof_analyze::Block>>,
                         codes: &mut Vec<Option<ElfCode>>,
                         pid: u32|
     -> Result<bool> {
        let mut all = true;
        for i in 0..regions.len() {
            if regions[i].is_some() {
                continue;
            }
            let placed = if specs.is_empty() {
                Some(whole_executable(pid)?)
            } else {
                place(pid, &specs[i], &mut symbols)?
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
            symbols.preload(&p.file.path, &p.file.open_path);
            if coverage {
                let bias = p.file.bias;
                let blocks = code
                    .as_ref()
                    .map(|c| c.static_blocks(p.lo.wrapping_sub(bias), p.hi.wrapping_sub(bias)))
                    .unwrap_or_default();
                while cover_blocks.len() <= i {
                    cover_blocks.push(Vec::new());
                }
                for (k, b) in blocks.iter().enumerate() {
                    // A block of two overlapping regions belongs to the first.
                    let at = b.start.wrapping_add(bias);
                    if !cover.contains_key(&at) && tracer.set_breakpoint(pid, at).is_ok() {
                        cover.insert(at, (i, k));
                    }
                }
                cover_blocks[i] = blocks;
            } else {
                counts.ranges.push((p.lo, p.hi));
                counts.add_start(tracer, pid, p.lo);
            }
            while codes.len() <= i {
                codes.push(None);
            }
            codes[i] = code;
            regions[i] = Some(p);
        }
        Ok(all)
    };

    let mut entry_bp: Option<u64> = None;
    let mut dl_bp: Option<u64> = None;
    let mut execs = 0u32;
    let control = |addr: u64, entry_bp: Option<u64>, dl_bp: Option<u64>| {
        Some(addr) == entry_bp || Some(addr) == dl_bp
    };
    if !launched
        && !place_all(
            &mut tracer,
            &mut regions,
            &mut counts,
            &mut cover,
            &mut cover_blocks,
            &mut codes,
            root,
        )?
    {
        let i = regions.iter().position(|r| r.is_none()).unwrap_or(0);
        bail!("{}", super::not_found(root, &specs[i]));
    }
    let start = Instant::now();
    let duration = super::duration(args.duration)?;
    let mut exit = None;
    loop {
        if sys::stop_requested() || duration.is_some_and(|d| start.elapsed() >= d) {
            break;
        }
        let Some(ev) = tracer.next_event(Duration::from_millis(50))? else {
            continue;
        };
        match ev {
            TraceEvent::Exec { pid } if pid == root => {
                if execs > 0 {
                    // The program ran another (a wrapper such as env): its breakpoints went
                    // with its code; start over on the new program.
                    regions.iter_mut().for_each(|r| *r = None);
                    counts.reset();
                    cover.clear();
                    cover_blocks.clear();
                    hits.clear();
                    codes.clear();
                    entry_bp = None;
                    dl_bp = None;
                }
                execs += 1;
                let all = place_all(
                    &mut tracer,
                    &mut regions,
                    &mut counts,
                    &mut cover,
                    &mut cover_blocks,
                    &mut codes,
                    pid,
                )?;
                if !all {
                    // Libraries are mapped by ld.so after exec: look again at the entry point
                    // (a region never found is an error at the end).
                    if let Some(e) = superprof_trace::entry_point(pid) {
                        if tracer.set_breakpoint(pid, e).is_ok() {
                            entry_bp = Some(e);
                        }
                    }
                }
                tracer.resume(pid);
            }
            TraceEvent::Breakpoint { tid, pid, addr } if control(addr, entry_bp, dl_bp) => {
                let all = place_all(
                    &mut tracer,
                    &mut regions,
                    &mut counts,
                    &mut cover,
                    &mut cover_blocks,
                    &mut codes,
                    pid,
                )?;
                let own = counts.has_bp(addr) || cover.contains_key(&addr);
                if Some(addr) == entry_bp {
                    entry_bp = None;
                    if !own {
                        let _ = tracer.remove_breakpoint(pid, addr);
                    }
                    if !all {
                        // Perhaps in a library loaded later (dlopen): look again each time
                        // ld.so reports a change of its link map.
                        if let Some(f) =
                            superprof_trace::find_function(pid, "_dl_debug_state")?.first()
                        {
                            if tracer.set_breakpoint(pid, f.addr).is_ok() {
                                dl_bp = Some(f.addr);
                            }
                        }
                    }
                } else if all {
                    dl_bp = None;
                    if !own {
                        let _ = tracer.remove_breakpoint(pid, addr);
                    }
                }
                if own {
                    handle_bp(
                        &mut tracer,
                        &mut counts,
                        &mut cover,
                        &mut hits,
                        tid,
                        pid,
                        addr,
                    );
                } else {
                    tracer.resume(tid);
                }
            }
            TraceEvent::Breakpoint { tid, pid, addr } if pid == root => {
                handle_bp(
                    &mut tracer,
                    &mut counts,
                    &mut cover,
                    &mut hits,
                    tid,
                    pid,
                    addr,
                );
            }
            TraceEvent::Stepped { tid, pid } if pid == root => {
                counts.on_stepped(&mut tracer, tid, pid)
            }
            TraceEvent::ThreadExited { tid, .. } => {
                counts.steps.remove(&tid);
                counts.current.remove(&tid);
            }
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
    if let Some(i) = regions.iter().position(|r| r.is_none()) {
        if specs.is_empty() {
            bail!("the program ended before its executable could be read");
        }
        bail!("{}", super::not_found(root, &specs[i]));
    }
    let regions: Vec<Placed> = regions.into_iter().flatten().collect();
    let read = |addr: u64, len: usize| {
        regions
            .iter()
            .zip(&codes)
            .find(|(r, _)| (r.lo..r.hi).contains(&addr))
            .and_then(|(r, c)| {
                c.as_ref()?
                    .bytes(addr.wrapping_sub(r.file.bias), len as u64)
            })
            .map_or_else(Vec::new, <[u8]>::to_vec)
    };
    let counted = if coverage {
        Vec::new()
    } else {
        counts.blocks(&read)
    };
    let mut blocks = Vec::new();
    // A block of two overlapping regions is reported once, with the first.
    let mut reported: HashSet<u64> = HashSet::new();
    for (i, region) in regions.iter().enumerate() {
        let Some(code) = codes.get(i).and_then(|c| c.as_ref()) else {
            continue;
        };
        let bias = region.file.bias;
        if coverage {
            let list = cover_blocks.get(i).cloned().unwrap_or_default();
            let items = list.iter().enumerate().map(|(k, b)| {
                let hit = hits.contains(&(i, k));
                (b.start, b.end, b.instructions, hit as u64, Some(hit))
            });
            blocks.extend(rows(region, code, &mut symbols, items));
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
            blocks.extend(rows(region, code, &mut symbols, items));
        }
    }
    let analyzer = (!coverage).then(|| {
        let mut stats = counts.analyzer.stats();
        stats.single_steps = counts.learn_steps;
        (counts.analyzer.name(), stats)
    });
    Ok((
        Report {
            mode: args.mode,
            analyzer,
            regions,
            blocks,
            stops: counts.stops,
            samples_elsewhere: 0,
        },
        exit.or(killed),
    ))
}

fn handle_bp(
    tracer: &mut Tracer,
    counts: &mut Counts,
    cover: &mut HashMap<u64, (usize, usize)>,
    hits: &mut HashSet<(usize, usize)>,
    tid: u32,
    pid: u32,
    addr: u64,
) {
    if let Some(at) = cover.remove(&addr) {
        counts.stops += 1;
        hits.insert(at);
        let _ = tracer.remove_breakpoint(pid, addr);
        tracer.resume(tid);
        return;
    }
    if counts.has_bp(addr) {
        counts.on_breakpoint(tracer, tid, pid, addr);
    } else {
        tracer.resume(tid);
    }
}
