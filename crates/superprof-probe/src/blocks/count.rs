//! The `count` engine: exact executions of basic blocks, on the coordinator's breakpoints.
//!
//! A breakpoint at each region's entry, and at the last instruction of every block execution
//! reaches (the analyzer says which instruction that is). A thread stopped at a block's end
//! has its branch emulated or is single-stepped; the pc it lands on starts the next block,
//! whose end gets a breakpoint in turn. A call gets a breakpoint after itself, where it comes
//! back. Entries counted there ("start" breakpoints) see every execution; landings after a
//! branch see only those that arrive by a branch, and a block cut in two by a landing in its
//! middle passes its executions on to the second half (see [`Counts::blocks`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use superprof_analyze::{Analyzer, Arch, BlockEnd, Isa, Lab};
use superprof_trace::Tracer;

/// Why a thread is being single-stepped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepKind {
    /// A block's last instruction.
    BlockEnd,
    /// An instruction inside a block, to learn from (or that the learner cannot vouch for).
    Learn,
    /// Code outside the regions, to learn from while the learner's table still changes; the
    /// number of steps this excursion so far.
    Train(u32),
}

/// A single step under way.
#[derive(Debug, Clone, Copy)]
struct Step {
    from: u64,
    /// The stack pointer before the step (a call pushes its return address below it).
    sp: u64,
    code: [u8; 16],
    kind: StepKind,
}

/// A thread let run on a prediction: straight on from `from` to the block's last instruction
/// `last`. Its next stop must be on that path; anywhere else, an instruction predicted
/// straight on branched.
#[derive(Debug, Clone, Copy)]
struct Run {
    from: u64,
    last: u64,
}

/// Single steps of one excursion outside the regions, at most (a thread that leaves for a
/// long loop elsewhere is let go after these).
const TRAIN_PER_EXCURSION: u32 = 512;

/// The count engine's state for one process.
pub struct Counts {
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
    pub stops: u64,
    /// Original code bytes at the addresses stepped or emulated from.
    code: HashMap<u64, ([u8; 16], usize)>,
    /// Single steps inside blocks, to learn (the others step blocks' last instructions).
    learn_steps: u64,
    /// Single steps outside the regions, to train the learner.
    train_steps: u64,
    /// Whether a learner without a lab trains at all (with a lab it never asks to): the tests
    /// of the learner's checks turn it off with SUPERPROF_TEST_NO_TRAINING, so that a wrong
    /// prediction can be made to happen.
    train: bool,
    /// Per thread: the run it was let go on, checked at its next stop.
    runs: HashMap<u32, Run>,
    /// Runs whose next stop was off their path.
    mispredicted: u64,
    /// Runs that stopped on their path, per (where they were let go, where they stopped):
    /// every instruction from the one to the other ran. A learner that predicted an
    /// instruction straight on and learned later that it ends a block (a branch seen taken
    /// elsewhere) had those runs go through the block after it uncounted there; see
    /// [`Counts::blocks`].
    segments: HashMap<(u64, u64), u64>,
    /// Ranges [from, last) of runs that left their path: one of their instructions predicted
    /// straight on branched. Whatever the learner predicts, a thread is single-stepped
    /// through them until it sees one of their instructions branch (then the learner knows
    /// that address, and the range is cleared).
    suspect: Vec<(u64, u64)>,
    /// Whether block-ending branches are emulated (decode on x86_64) rather than stepped.
    emulate: bool,
    /// Branches worked out from the registers (no single step).
    pub emulated: u64,
    /// Where the learner runs instructions alone under every condition (see [`Lab`]); made at
    /// its first question. `lab_failed`: it could not be made (or SUPERPROF_TEST_NO_LAB):
    /// the learner learns from single steps alone.
    lab: Option<Lab>,
    lab_failed: bool,
    /// Instructions the lab could not run (their address is the lab's own page).
    lab_refused: HashSet<u64>,
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
    pub fn reset(&mut self) {
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
        self.code.clear();
        self.runs.clear();
        self.suspect.clear();
        self.segments.clear();
    }

    /// The block run from `start` ended before `end`.
    fn ended(&mut self, start: u64, end: u64) {
        if end <= start {
            return; // not a run from `start` (the thread came another way)
        }
        let e = self.block_end_of.entry(start).or_insert(end);
        *e = (*e).min(end);
    }

    /// The original code at `addr`, up to 16 bytes, and how many could be read (read once
    /// per address: block ends are hit again and again, and the code does not change under
    /// us). A copy: the caller may hand it to the analyzer, which `self` holds.
    fn code_at(&mut self, tracer: &Tracer, pid: u32, addr: u64) -> ([u8; 16], usize) {
        *self.code.entry(addr).or_insert_with(|| {
            let mut code = [0u8; 16];
            let n = tracer.read_code(pid, addr, &mut code);
            (code, n)
        })
    }

    /// Whether the instruction at `addr` is a system call: the analyzer's answer (the
    /// learner's lab saw it stop at a system call's entry), or else the decoder's.
    fn is_syscall(&mut self, tracer: &Tracer, pid: u32, addr: u64) -> bool {
        let arch = self.arch;
        let (code, n) = self.code_at(tracer, pid, addr);
        self.analyzer
            .is_syscall(&code[..n], addr)
            .unwrap_or_else(|| {
                arch.classify(&code[..n], addr)
                    .is_some_and(|i| i.flow == superprof_analyze::Flow::Syscall)
            })
    }

    pub fn has_bp(&self, addr: u64) -> bool {
        self.starts.contains(&addr) || self.ends.contains(&addr)
    }

    /// A breakpoint that counts every execution of `addr` (a region's entry, where a call
    /// returns, where code from outside jumps in).
    pub fn add_start(&mut self, tracer: &mut Tracer, pid: u32, addr: u64) {
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

    fn block_end(&mut self, tracer: &Tracer, pid: u32, pc: u64, limit: u64) -> BlockEnd {
        if let Some(&k) = self.known.get(&pc) {
            return k;
        }
        loop {
            let mut read = |addr: u64, buf: &mut [u8]| tracer.read_code(pid, addr, buf);
            let k = self.analyzer.block_end(pc, limit, &mut read);
            if let BlockEnd::Unknown { addr } = k {
                if self.probe(tracer, pid, addr) {
                    continue; // the analyzer knows that instruction now
                }
            }
            if self.analyzer.answers_are_final() && !matches!(k, BlockEnd::Unknown { .. }) {
                self.known.insert(pc, k);
            }
            return k;
        }
    }

    /// Runs the instruction at `addr` in the lab, if the analyzer wants it run there (and a
    /// lab can be had); whether it was.
    fn probe(&mut self, tracer: &Tracer, pid: u32, addr: u64) -> bool {
        if self.lab_failed {
            return false;
        }
        let (code, n) = self.code_at(tracer, pid, addr);
        let code = &code[..n];
        let Some(len) = self.arch.insn_len(code, addr) else {
            return false;
        };
        if !self.analyzer.wants_probe(code, addr) {
            return false;
        }
        if self.lab.is_none() {
            if superprof_unwind::test_switch("SUPERPROF_TEST_NO_LAB").is_some() {
                self.lab_failed = true;
                return false;
            }
            match Lab::new() {
                Ok(lab) => {
                    self.lab = Some(lab);
                    self.analyzer.use_lab();
                }
                Err(e) => {
                    superprof_unwind::say!(
                        "superprof: no lab to run instructions in ({e}): the learner learns \
                         from single steps alone"
                    );
                    self.lab_failed = true;
                    return false;
                }
            }
        }
        if self.lab_refused.contains(&addr) {
            return false;
        }
        let Some(lab) = self.lab.as_mut() else {
            return false;
        };
        match lab.probe(addr, code, len as u64) {
            Ok(verdict) => {
                self.analyzer.probed(code, addr, verdict);
                true
            }
            Err(_) if lab.alive() => {
                // Code the lab cannot hold at its address: stepped instead, each time.
                self.lab_refused.insert(addr);
                false
            }
            Err(e) => {
                superprof_unwind::say!(
                    "superprof: the lab failed ({e}): what it did not run is stepped"
                );
                self.lab = None;
                self.lab_failed = true;
                false
            }
        }
    }

    fn start_step(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, pc: u64, kind: StepKind) {
        let code = if let StepKind::Train(_) = kind {
            // (Code outside the regions is read fresh: it is not cached per address.)
            let mut code = [0u8; 16];
            tracer.read_code(pid, pc, &mut code);
            self.train_steps += 1;
            code
        } else {
            self.code_at(tracer, pid, pc).0
        };
        let sp = tracer.regs(tid).map_or(0, |r| r.sp);
        if kind == StepKind::Learn {
            self.learn_steps += 1;
        }
        self.steps.insert(
            tid,
            Step {
                from: pc,
                sp,
                code,
                kind,
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
        let mut end = self.block_end(tracer, pid, pc, hi);
        if let BlockEnd::Last { addr, .. } = end {
            // A run through a range where a prediction failed before: stepped.
            if self.suspect.iter().any(|&(f, l)| pc < l && f < addr) {
                end = BlockEnd::Unknown { addr: pc };
            }
        }
        match end {
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
                if addr == pc && on_bp {
                    self.start_step(tracer, tid, pid, pc, StepKind::BlockEnd);
                } else {
                    // It stops at the breakpoint (at once if it sits on it); a learner's
                    // prediction is checked at that stop.
                    if !self.analyzer.answers_are_final() {
                        self.runs.insert(
                            tid,
                            Run {
                                from: pc,
                                last: addr,
                            },
                        );
                    }
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
                if on_bp || !self.has_bp(pc) {
                    self.start_step(tracer, tid, pid, pc, StepKind::Learn);
                } else {
                    tracer.resume(tid);
                }
            }
        }
    }

    /// A thread stopped at breakpoint `addr`: if it ran on a prediction, was this stop on
    /// its path? If not, an instruction predicted straight on branched: the run's range is
    /// stepped from now on until that branch is seen (see [`Counts::suspect`]).
    fn check_run(&mut self, tid: u32, addr: u64) {
        let Some(run) = self.runs.remove(&tid) else {
            return;
        };
        // (A one-instruction block is a run with from == last.)
        let on_path = addr == run.last || (run.from < addr && addr < run.last);
        if on_path {
            *self.segments.entry((run.from, addr)).or_default() += 1;
        } else {
            self.mispredicted += 1;
            if !self.suspect.contains(&(run.from, run.last)) {
                self.suspect.push((run.from, run.last));
            }
        }
    }

    pub fn on_breakpoint(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) {
        self.stops += 1;
        self.steps.remove(&tid);
        self.check_run(tid, addr);
        if self.starts.contains(&addr) {
            *self.arrivals.entry(addr).or_default() += 1;
            self.current.insert(tid, addr);
        }
        if self.ends.contains(&addr) {
            if !(self.emulate && self.emulate_branch(tracer, tid, pid, addr)) {
                self.start_step(tracer, tid, pid, addr, StepKind::BlockEnd);
            }
            return;
        }
        self.advance(tracer, tid, pid, addr, true);
    }

    /// Sends a thread stopped on the branch at `addr` where the branch would, without running
    /// it (one stop instead of a stop and a step). False if this branch is for stepping.
    #[cfg(target_arch = "x86_64")]
    fn emulate_branch(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) -> bool {
        let (code, n) = self.code_at(tracer, pid, addr);
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

    pub fn on_stepped(&mut self, tracer: &mut Tracer, tid: u32, pid: u32) {
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
        if pc != next {
            // A branch seen inside a range where a prediction failed: that was it.
            self.suspect
                .retain(|&(f, l)| !(f <= step.from && step.from < l));
        }
        if let StepKind::Train(n) = step.kind {
            self.trained(tracer, tid, pid, pc, n);
            return;
        }
        if step.kind == StepKind::Learn && pc == next {
            // Straight on inside the block.
            if !self.starts.contains(&pc) {
                *self.passes.entry(pc).or_default() += 1;
            }
            self.advance(tracer, tid, pid, pc, false);
            return;
        }
        let call = pc != next && is_call(tracer, pid, &regs, &step, next);
        self.arrive(tracer, tid, pid, next, pc, call);
    }

    /// A training step of an excursion outside the regions (its `n`th) ended at `pc`.
    fn trained(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, pc: u64, n: u32) {
        if self.in_region(pc).is_none() {
            self.leave(tracer, tid, pid, pc, n + 1);
        } else if self.starts.contains(&pc) {
            tracer.resume(tid); // its start breakpoint counts it
        } else {
            // Back in a region where no start breakpoint waits (a jump into its middle, or
            // onto a block's last instruction, whose breakpoint counts nothing): counted here,
            // as a branch's landing.
            *self.arrivals.entry(pc).or_default() += 1;
            self.current.insert(tid, pc);
            self.advance(tracer, tid, pid, pc, false);
        }
    }

    /// Thread `tid` is at `pc`, outside the regions: it runs on, single-stepped a while
    /// first (`n` steps so far this excursion) while the learner still learns.
    fn leave(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, pc: u64, n: u32) {
        if n < TRAIN_PER_EXCURSION
            && self.train
            && self.analyzer.wants_training()
            && !tracer.has_breakpoint(pid, pc)
        {
            self.start_step(tracer, tid, pid, pc, StepKind::Train(n));
        } else {
            tracer.resume(tid);
        }
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
            self.leave(tracer, tid, pid, pc, 0);
            return;
        }
        if self.starts.contains(&pc) {
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
    pub fn blocks(&mut self, code: &dyn Fn(u64, usize) -> Vec<u8>) -> Vec<(u64, u64, u64)> {
        let mut work: Vec<u64> = self.arrivals.keys().copied().collect();
        while let Some(s) = work.pop() {
            let Some(&e) = self.block_end_of.get(&s).filter(|&&e| e > s) else {
                continue;
            };
            let bytes = code(s, (e - s) as usize);
            let mut off = 0usize;
            while off < bytes.len() {
                let at = s + off as u64;
                // (Lengths only: what ends a block is the analyzer's to say.)
                let Some(len) = self.arch.insn_len(&bytes[off..], at) else {
                    break;
                };
                let next = at + len as u64;
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
                off += len as usize;
            }
        }
        let mut out: Vec<(u64, u64, u64)> = Vec::new();
        let leaders: Vec<(u64, u64)> = self.arrivals.iter().map(|(&a, &n)| (a, n)).collect();
        let mut prev: Option<(u64, u64)> = None; // (full end of the previous leader's run, its executions)
        for (i, &(s, arrivals)) in leaders.iter().enumerate() {
            let mut exec = arrivals;
            let passes = self.passes.get(&s).copied().unwrap_or(0);
            match prev {
                // A start breakpoint counts every execution since it was set; passes (and
                // runs that went by it) are from before.
                _ if self.starts.contains(&s) => exec += passes + self.ran_through(s, false),
                Some((prev_end, prev_exec)) if prev_end > s => exec += prev_exec,
                // A leader after a block end learned late: besides its arrivals, the
                // executions that came to it by single steps while the analyzer could not
                // tell, and by runs it predicted straight on through it before it knew.
                _ => exec += passes + self.ran_through(s, true),
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

impl Counts {
    /// Runs that went through `addr` from before it (and, `stopped`, those that stopped on
    /// it: an end breakpoint, which counts nothing).
    fn ran_through(&self, addr: u64, stopped: bool) -> u64 {
        self.segments
            .iter()
            .filter(|(&(from, to), _)| from < addr && (addr < to || (stopped && addr == to)))
            .map(|(_, &n)| n)
            .sum()
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

impl Counts {
    /// An engine with `analyzer`; `emulate`: work branches out from the registers instead of
    /// stepping them (x86_64 with the decoder).
    pub fn new(analyzer: Box<dyn Analyzer>, emulate: bool) -> Counts {
        Counts {
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
            train_steps: 0,
            train: superprof_unwind::test_switch("SUPERPROF_TEST_NO_TRAINING").is_none(),
            runs: HashMap::new(),
            mispredicted: 0,
            segments: HashMap::new(),
            suspect: Vec::new(),
            emulate,
            emulated: 0,
            lab: None,
            lab_failed: false,
            lab_refused: HashSet::new(),
            shadow_stack: HashMap::new(),
            passes: HashMap::new(),
            stops: 0,
            code: HashMap::new(),
        }
    }

    /// Counts a region from its entry at runtime address `lo`, up to `hi`.
    pub fn add_region(&mut self, tracer: &mut Tracer, pid: u32, lo: u64, hi: u64) {
        self.ranges.push((lo, hi));
        self.add_start(tracer, pid, lo);
    }

    /// A thread ended.
    pub fn forget_thread(&mut self, tid: u32) {
        self.steps.remove(&tid);
        self.current.remove(&tid);
        self.runs.remove(&tid);
    }

    /// The analyzer's name and what it did.
    pub fn analyzer_stats(&self) -> (&'static str, superprof_analyze::AnalyzerStats) {
        let mut stats = self.analyzer.stats();
        stats.single_steps = self.learn_steps;
        stats.training_steps = self.train_steps;
        stats.mispredicted = self.mispredicted;
        stats.lab_runs = self.lab.as_ref().map_or(0, |l| l.runs);
        (self.analyzer.name(), stats)
    }
}
