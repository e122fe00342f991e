//! `record --precise`: functions' calls counted exactly beside the samples.
//!
//! The command runs under the coordinator while perf_event_open samples it
//! ([`superprof_record::record_beside`]); this counts every block of each function asked for,
//! as `blocks` does (the in-process engine's counting trampolines: a `lock inc` per block, no
//! timestamps), placed at exec, at each change of ld.so's link map and at the entry point.
//! A function's calls are the entries of its first block less the entries from inside it:
//! its own direct recursive calls and its jumps back to its start, which its blocks' counts
//! give exactly.
//!
//! With no names, the hottest functions are chosen from the samples once the command has run
//! for [`WARM_UP_NS`], and again each [`REPICK_NS`] as the profile changes: the root thread is
//! interrupted, the others held, and the counters go in while they stand still. Calls before
//! that are not counted; the time per call takes the samples from then on.

use std::collections::{HashMap, HashSet};

use superprof_analyze::{Block, Flow};
use superprof_profile::calls::{BlockCount, FunctionCalls};
use superprof_record::Beside;
use superprof_trace::{TraceEvent, TraceOptions, Tracer};

use super::trace::Session;
use super::{AnalyzerKind, Placed};
use crate::engine::Engine;
use crate::region::RegionSpec;
use crate::Result;

/// How long the command is sampled before its hottest functions are chosen.
pub const WARM_UP_NS: u64 = 200_000_000;
/// How often the choice is looked at again.
pub const REPICK_NS: u64 = 1_000_000_000;
/// Samples the first choice waits for, at least.
const WARM_UP_SAMPLES: u64 = 50;

/// Counts the calls of named functions beside a recording (see the module's note).
pub struct Precise {
    session: Session,
    names: Vec<String>,
    /// No names: this many of the hottest functions, chosen while the command runs.
    top: Option<usize>,
    /// How many functions were named (those after them in `names` were chosen).
    named: usize,
    /// When the hottest are looked for next (ns since the recording's start).
    next_pick_ns: u64,
    hold_new_threads: bool,
    /// When each function's counters went in (CLOCK_MONOTONIC).
    placed_at: Vec<Option<u64>>,
    /// Counting begins at the root's next stop (an interrupt asked for it).
    place_at_stop: bool,
    /// The traced command (for naming its trampolines).
    root: u32,
    /// Each trampoline's runtime start and end, and the function it counts (by index).
    trampolines: Vec<(u64, u64, usize)>,
    /// Every block of each function counted, and its lines' executions
    /// (`--precise-lines`).
    lines: bool,
    /// The counts, once the recording ended.
    result: Vec<FunctionCalls>,
}

impl Precise {
    /// Counts the calls of `functions` (names, as `stat` and `blocks` take them: exact, else a
    /// unique substring), on the in-process engine where it is built (else ptrace's
    /// breakpoints); with none, of the `top` hottest (see the module's note). `lines`: every
    /// block of each, for its source lines' executions (a counter in each loop's body too).
    pub fn new(functions: &[String], top: usize, lines: bool) -> Result<Precise> {
        let specs: Vec<RegionSpec> = functions
            .iter()
            .map(|f| RegionSpec::Function(f.clone()))
            .collect();
        let in_process = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
        let engine = if in_process {
            Engine::InProcess
        } else {
            Engine::Ptrace
        };
        // As root, a block the in-process engine cannot patch gets a counting uprobe (never a
        // stop); new threads are then held until theirs are open.
        let fallback_pmu = (in_process && superprof_sample::euid() == 0)
            .then(|| superprof_sample::uprobe_pmu().ok())
            .flatten();
        let mut session = Session::new(
            specs,
            false,
            (engine, in_process),
            (AnalyzerKind::Decode, false),
            fallback_pmu,
        )
        .functions_only();
        // A counter on the blocks the calls are told from only: one at the entry, for most
        // (every block for its lines).
        session.calls_only = !lines;
        // Never a breakpoint or a uprobe on a hot function's every call.
        session.no_slow_fallback = in_process;
        Ok(Precise {
            session,
            names: functions.to_vec(),
            top: functions.is_empty().then_some(top.max(1)),
            named: functions.len(),
            next_pick_ns: WARM_UP_NS,
            hold_new_threads: fallback_pmu.is_some(),
            placed_at: vec![None; functions.len()],
            place_at_stop: false,
            root: 0,
            trampolines: Vec::new(),
            lines,
            result: Vec::new(),
        })
    }

    /// Each function's calls (in the order asked), once the recording has ended; times from
    /// `start_ns` (the recording's start, CLOCK_MONOTONIC).
    pub fn calls(&self) -> &[FunctionCalls] {
        &self.result
    }

    fn note_placements(&mut self) {
        let now = superprof_sample::monotonic_ns();
        for (i, at) in self.placed_at.iter_mut().enumerate() {
            if at.is_none() && self.session.is_placed(i) {
                *at = Some(now);
            }
        }
    }
}

impl Beside for Precise {
    fn options(&self) -> TraceOptions {
        TraceOptions {
            hold_new_threads: self.hold_new_threads,
            ..TraceOptions::default()
        }
    }

    fn event(
        &mut self,
        tracer: &mut Tracer,
        root: u32,
        ev: TraceEvent,
    ) -> std::result::Result<(), String> {
        // (Placed at exec, at a control breakpoint, or at the stop an interrupt asked for.)
        let placing = matches!(
            ev,
            TraceEvent::Exec { .. } | TraceEvent::Breakpoint { .. } | TraceEvent::Stopped { .. }
        );
        self.session
            .on_event(tracer, root, ev, &mut self.place_at_stop)
            .map_err(|e| superprof_unwind::one_line(&e))?;
        if placing {
            self.note_placements();
        }
        Ok(())
    }

    fn begin(&mut self, tracer: &mut Tracer, root: u32, launched: bool) {
        // An attached process: the functions named are placed at the first stop of its
        // interrupted main thread, the others held.
        if !launched && !self.names.is_empty() {
            self.place_at_stop = tracer.interrupt(root);
        }
    }

    fn code_names(&self) -> Vec<superprof_record::CodeName> {
        self.trampolines
            .iter()
            .filter_map(|&(lo, hi, i)| {
                let f = self.result.get(i).filter(|f| f.counted)?;
                Some(superprof_record::CodeName {
                    pid: self.root,
                    lo,
                    hi,
                    function: f.function.clone(),
                    module: f.module.clone(),
                })
            })
            .collect()
    }

    fn tick(
        &mut self,
        tracer: &mut Tracer,
        root: u32,
        now_ns: u64,
        profile: &dyn Fn() -> superprof_profile::Profile,
    ) {
        let Some(top) = self.top else {
            return;
        };
        if now_ns < self.next_pick_ns || self.place_at_stop {
            return;
        }
        let p = profile();
        if p.on_cpu_samples() < WARM_UP_SAMPLES {
            return;
        }
        self.next_pick_ns = now_ns.saturating_add(REPICK_NS);
        let rows = superprof_profile::top::rows(&p);
        let new = hottest(&rows, &own_samples(&p), &roots(&p), top, &self.names);
        if new.is_empty() {
            return;
        }
        // Each where its symbol is, from an address of it in its file (no lookup by name: its
        // symbol's own name may be longer, `float_repr.lto_priv.0` for `float_repr`, and
        // looking names up in every file took 40 ms each, the program stopped).
        let files = superprof_symbols::mapped_files(root).unwrap_or_default();
        for name in &new {
            let at = placed_at_symbol(&p, name, &files);
            // Its file's code and symbols read now, while the program runs, not once it is
            // stopped.
            if let Some(at) = &at {
                self.session.code_of(&at.file.open_path);
                self.session.preload(&at.file.path, &at.file.open_path);
            }
            self.session.add_function(name, at);
        }
        self.placed_at.extend(new.iter().map(|_| None));
        self.names.extend(new);
        // Placed at the root's next stop, the other threads held.
        self.place_at_stop = tracer.interrupt(root);
    }

    fn end(&mut self, _tracer: &mut Tracer, root: u32, start_ns: u64) {
        self.root = root;
        self.trampolines = self.session.trampolines();
        let mut out = Vec::new();
        for (i, name) in self.names.clone().iter().enumerate() {
            if let Some(why) = self.session.refused.get(&i) {
                out.push(FunctionCalls {
                    function: name.clone(),
                    note: format!("not counted: {why}"),
                    ..FunctionCalls::default()
                });
                continue;
            }
            // Chosen from the samples, found, but never placed: the stop that places them
            // (the root interrupted) never came. Not "no function": that was not looked for.
            if i >= self.named && self.session.counted(i).is_none() {
                out.push(FunctionCalls {
                    function: name.clone(),
                    note: "chosen as one of the hottest, but not counted: the command's main \
                           thread never stopped for its counters to go in"
                        .into(),
                    ..FunctionCalls::default()
                });
                continue;
            }
            let Some((placed, blocks, rows)) = self.session.counted(i) else {
                // (Counted in the command's own process only: a shell's pipeline runs the
                // program in a child, which the counters do not follow.)
                let comm = std::fs::read_to_string(format!("/proc/{root}/comm"))
                    .map(|c| format!(" ({})", c.trim()))
                    .unwrap_or_default();
                let note = self
                    .session
                    .missing_region(i, root)
                    .map(|e| superprof_unwind::one_line(&e))
                    .unwrap_or_else(|| "it was never placed".into());
                let note = format!(
                    "{note}; --precise counts in the command's own process (pid {root}{comm}), \
                     not in the processes it starts"
                );
                out.push(FunctionCalls {
                    function: name.clone(),
                    note,
                    ..FunctionCalls::default()
                });
                continue;
            };
            let mut calls = function_calls(
                &placed,
                &blocks,
                rows,
                self.placed_at[i].map_or(0, |t| t.saturating_sub(start_ns)),
                self.lines,
            );
            if self.lines {
                let session = &mut self.session;
                calls.lines = superprof_profile::calls::line_counts(&calls.blocks, &mut |s, e| {
                    session.lines_of(i, s, e)
                });
            }
            out.push(calls);
        }
        self.result = out;
        self.session.release();
    }
}

/// Where function `name` of profile `p` is in the process that maps `files`: its symbol (in
/// its file's table or its debug file's) around the address of one of its frames; None where
/// none says.
fn placed_at_symbol(
    p: &superprof_profile::Profile,
    name: &str,
    files: &[superprof_symbols::MappedFile],
) -> Option<Placed> {
    p.frames()
        .iter()
        .filter(|f| !f.inlined && p.str(f.function) == name)
        .find_map(|f| {
            let file = files
                .iter()
                .find(|m| m.path.as_os_str() == p.str(f.module))?;
            let (raw, addr, size) =
                superprof_symbols::symbol_containing(&file.open_path, f.address)?;
            Some(Placed {
                name: superprof_symbols::demangle(&raw),
                lo: addr.wrapping_add(file.bias),
                hi: addr.wrapping_add(size).wrapping_add(file.bias),
                file: file.clone(),
            })
        })
}

/// A process's or a thread's start, below the functions a program runs.
const PLUMBING: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
];

/// The functions at the root of the profile's stacks, above a process's or a thread's start
/// (`main`, a thread's function): each runs once, for as long as its thread.
fn roots(profile: &superprof_profile::Profile) -> HashSet<String> {
    let mut out = HashSet::new();
    for (i, &w) in profile.weight_per_stack().iter().enumerate() {
        if w == 0 {
            continue;
        }
        let frames: Vec<_> = profile
            .stack_frames(Some(superprof_profile::StackId(i as u32)))
            .collect();
        if let Some(root) = frames
            .iter()
            .rev()
            .map(|&f| profile.str(profile.frame(f).function))
            .find(|name| !PLUMBING.contains(name))
        {
            out.insert(root.to_owned());
        }
    }
    out
}

/// Each function's own samples: those whose leaf is its code, its inlined callees' included
/// (the first frame of the stack, from the leaf, that is not inlined into the next).
fn own_samples(profile: &superprof_profile::Profile) -> HashMap<String, u64> {
    let mut out: HashMap<String, u64> = HashMap::new();
    for (i, &w) in profile.weight_per_stack().iter().enumerate() {
        if w == 0 {
            continue;
        }
        let leaf = Some(superprof_profile::StackId(i as u32));
        if let Some(f) = profile
            .stack_frames(leaf)
            .map(|f| profile.frame(f))
            .find(|f| !f.inlined)
        {
            *out.entry(profile.str(f.function).to_owned()).or_default() += w;
        }
    }
    out
}

/// Of a profile's `rows`, the `top` hottest functions (by own and total samples together) of
/// the program's own files that are not in `counted` yet, by name: code superprof can patch
/// (not the kernel's, the vDSO's, JIT code, unnamed addresses), whose own code ran (`own`,
/// see [`own_samples`]: not an ancestor that only waits for its callees, such as an
/// interpreter's start-up chain, which is called once), not the start-up functions every
/// stack passes through, and not `roots` (`main`, a thread's function: called once).
fn hottest(
    rows: &[superprof_profile::top::TopRow],
    own: &HashMap<String, u64>,
    roots: &HashSet<String>,
    top: usize,
    counted: &[String],
) -> Vec<String> {
    let own_of = |r: &superprof_profile::top::TopRow| own.get(&r.function).copied().unwrap_or(0);
    let mut ranked: Vec<&superprof_profile::top::TopRow> = rows
        .iter()
        .filter(|r| r.module.starts_with('/') && !r.inlined && own_of(r) > 0)
        // (Nor a PLT stub, `memcmp@plt`: a jump to the function, which has its own row.)
        .filter(|r| !r.function.contains("+0x") && !r.function.ends_with("@plt"))
        .filter(|r| !PLUMBING.contains(&r.function.as_str()))
        .filter(|r| !roots.contains(&r.function))
        .collect();
    ranked.sort_by_key(|r| std::cmp::Reverse(own_of(r).saturating_add(r.total_weight)));
    // The top now; those counted already stay counted.
    let mut out: Vec<String> = Vec::new();
    for r in ranked.into_iter().take(top) {
        if !counted.contains(&r.function) && !out.contains(&r.function) {
            out.push(r.function.clone());
        }
    }
    out
}

/// One function's [`FunctionCalls`]: `blocks` its blocks (ELF addresses) with their
/// executions, `rows` their names and lines, `since_ns` when counting began.
fn function_calls(
    placed: &Placed,
    blocks: &[(Block, u64)],
    rows: Vec<super::BlockRow>,
    since_ns: u64,
    all_blocks: bool,
) -> FunctionCalls {
    let entry = placed.lo.wrapping_sub(placed.file.bias);
    // (Every block's flow tells what enters which; the counted ones are those the calls are
    // told from, the others at 0.)
    let counted = calls_from_blocks(entry, blocks);
    let all: Vec<Block> = blocks.iter().map(|(b, _)| b.clone()).collect();
    let keep = super::trace::calls_blocks(entry, &all);
    let blocks: Vec<(Block, u64)> = blocks
        .iter()
        .filter(|(b, _)| all_blocks || keep.contains(&b.start))
        .cloned()
        .collect();
    let lines: HashMap<u64, &super::BlockRow> = rows.iter().map(|r| (r.start, r)).collect();
    FunctionCalls {
        function: rows
            .iter()
            .find_map(|r| r.function.clone())
            .unwrap_or_else(|| placed.name.clone()),
        module: placed.file.path.to_string_lossy().into_owned(),
        address: entry,
        counted: true,
        calls: counted.calls,
        entries: counted.entries,
        since_ns,
        exact: counted.exact,
        note: counted.note,
        blocks: blocks
            .into_iter()
            .map(|(b, n)| {
                let row = lines.get(&b.start);
                BlockCount {
                    start: b.start,
                    end: b.end,
                    count: n,
                    file: row.and_then(|r| r.file.clone()).unwrap_or_default(),
                    line: row.and_then(|r| r.line).unwrap_or(0),
                }
            })
            .collect(),
        lines: Vec::new(),
    }
}

/// What a function's blocks' counts say of its calls.
#[derive(Debug, PartialEq, Eq)]
struct Counted {
    entries: u64,
    calls: u64,
    exact: bool,
    note: String,
}

/// A function's calls from its blocks (ELF addresses, each with its executions; `entry` its
/// first instruction): the executions of the block at `entry`, less those that came from
/// inside the function — its direct calls to itself (each a block ending in that call, run
/// as often as the call), its jumps to its start, and its conditional branches taken to its
/// start (a branch's executions less its fall-through block's, where nothing else enters
/// that block). A conditional branch whose taken count cannot be told leaves the count
/// inexact, and says so.
fn calls_from_blocks(entry: u64, blocks: &[(Block, u64)]) -> Counted {
    let entries = blocks
        .iter()
        .find(|(b, _)| b.start == entry)
        .map_or(0, |(_, n)| *n);
    let count_at: HashMap<u64, u64> = blocks.iter().map(|(b, n)| (b.start, *n)).collect();
    // Blocks something inside jumps or branches to (a fall-through block entered only from
    // the branch before it is not one).
    let targets: HashSet<u64> = blocks
        .iter()
        .filter_map(|(b, _)| match b.flow {
            Flow::Jump { target } | Flow::Conditional { target } => Some(target),
            _ => None,
        })
        .collect();
    let mut inside = 0u64;
    let mut recursive = 0u64;
    let mut unknown = 0usize;
    for (b, n) in blocks {
        match b.flow {
            Flow::Call { target } if target == entry => {
                recursive = recursive.saturating_add(*n);
            }
            Flow::Jump { target } if target == entry => inside = inside.saturating_add(*n),
            Flow::Conditional { target } if target == entry => {
                match count_at.get(&b.end).filter(|_| !targets.contains(&b.end)) {
                    Some(fall) => inside = inside.saturating_add(n.saturating_sub(*fall)),
                    None => unknown += 1,
                }
            }
            _ => {}
        }
    }
    let calls = entries.saturating_sub(inside).saturating_sub(recursive);
    let mut notes = Vec::new();
    if recursive > 0 {
        notes.push(format!(
            "{recursive} of its {entries} entries were its own recursive calls"
        ));
    }
    if unknown > 0 {
        notes.push(format!(
            "{unknown} conditional branch{} inside it back to its start could not be told \
             apart from calls: those entries are counted as calls",
            if unknown == 1 { "" } else { "es" }
        ));
    }
    Counted {
        entries,
        calls,
        exact: unknown == 0,
        note: notes.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(start: u64, end: u64, flow: Flow) -> Block {
        Block {
            start,
            end,
            instructions: 1,
            flow,
        }
    }

    fn row(
        function: &str,
        module: &str,
        self_weight: u64,
        total_weight: u64,
    ) -> superprof_profile::top::TopRow {
        superprof_profile::top::TopRow {
            function: function.into(),
            module: module.into(),
            self_weight,
            total_weight,
            total_off_cpu: 0,
            hottest_line: None,
            inlined: false,
        }
    }

    #[test]
    fn the_hottest_are_the_programs_own_named_functions() {
        let rows = [
            row("parse", "/usr/bin/prog", 300, 320),
            row("main", "/usr/bin/prog", 5, 1000),
            row("run", "/usr/bin/prog", 0, 990),
            row("_start", "/usr/bin/prog", 0, 1000),
            row("clear_page_erms", "[kernel.kallsyms]", 200, 200),
            row("prog+0x1234", "/usr/bin/prog", 150, 150),
            row("memcmp@plt", "/usr/bin/prog", 140, 140),
            row("hash", "/usr/lib/libc.so.6", 100, 400),
            row("tiny", "/usr/bin/prog", 10, 10),
            // Its self time is an inlined callee's: its own all the same.
            row("big", "/usr/bin/prog", 0, 50),
        ];
        let own: HashMap<String, u64> = [
            ("parse", 300),
            ("main", 5),
            ("clear_page_erms", 200),
            ("prog+0x1234", 150),
            ("memcmp@plt", 140),
            ("hash", 100),
            ("tiny", 10),
            ("big", 50),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let none = HashSet::new();
        // run only waits for its callees: never chosen.
        assert_eq!(
            hottest(&rows, &own, &none, 3, &[]),
            ["main", "parse", "hash"]
        );
        // Counted already: not again; the top is still three.
        let parse = ["parse".to_owned()];
        assert_eq!(hottest(&rows, &own, &none, 3, &parse), ["main", "hash"]);
        assert_eq!(
            hottest(&rows, &own, &none, 4, &parse),
            ["main", "hash", "big"]
        );
        // main at the root of the stacks: called once, not counted.
        let roots: HashSet<String> = ["main".to_owned()].into();
        assert_eq!(
            hottest(&rows, &own, &roots, 3, &[]),
            ["parse", "hash", "big"]
        );
    }

    #[test]
    fn calls_are_the_entries_of_the_first_block() {
        let blocks = [
            (
                block(0x100, 0x108, Flow::Conditional { target: 0x110 }),
                1000,
            ),
            (block(0x108, 0x110, Flow::Next), 400),
            (block(0x110, 0x118, Flow::Return), 1000),
        ];
        let c = calls_from_blocks(0x100, &blocks);
        assert_eq!((c.entries, c.calls, c.exact), (1000, 1000, true));
        assert_eq!(c.note, "");
    }

    #[test]
    fn direct_recursion_leaves_the_outermost_calls() {
        // fib-like: 1 outermost call entering 177 times, 176 of them from its two calls.
        let blocks = [
            (
                block(0x100, 0x108, Flow::Conditional { target: 0x120 }),
                177,
            ),
            (block(0x108, 0x110, Flow::Call { target: 0x100 }), 88),
            (block(0x110, 0x118, Flow::Call { target: 0x100 }), 88),
            (block(0x118, 0x120, Flow::Return), 88),
            (block(0x120, 0x128, Flow::Return), 89),
        ];
        let c = calls_from_blocks(0x100, &blocks);
        assert_eq!((c.entries, c.calls, c.exact), (177, 1, true));
        assert!(c.note.contains("176 of its 177 entries"), "{}", c.note);
    }

    #[test]
    fn jumps_back_to_the_start_are_not_calls() {
        // A tail call to itself made a loop: 10 calls, 90 turns back.
        let blocks = [
            (
                block(0x200, 0x208, Flow::Conditional { target: 0x210 }),
                100,
            ),
            (block(0x208, 0x210, Flow::Jump { target: 0x200 }), 90),
            (block(0x210, 0x218, Flow::Return), 10),
        ];
        let c = calls_from_blocks(0x200, &blocks);
        assert_eq!((c.entries, c.calls, c.exact), (100, 10, true));
    }

    #[test]
    fn a_conditional_branch_back_counts_its_taken_share() {
        // 50 runs of the branch, 20 fall through: 30 turns back to the start.
        let blocks = [
            (block(0x300, 0x308, Flow::Next), 40),
            (block(0x308, 0x310, Flow::Conditional { target: 0x300 }), 40),
            (block(0x310, 0x318, Flow::Return), 10),
        ];
        let c = calls_from_blocks(0x300, &blocks);
        assert_eq!((c.entries, c.calls, c.exact), (40, 10, true));
    }

    #[test]
    fn a_branch_whose_fall_through_is_entered_elsewhere_is_said_inexact() {
        let blocks = [
            (block(0x300, 0x308, Flow::Conditional { target: 0x310 }), 40),
            (block(0x308, 0x310, Flow::Conditional { target: 0x300 }), 35),
            (block(0x310, 0x318, Flow::Return), 10),
        ];
        let c = calls_from_blocks(0x300, &blocks);
        assert!(!c.exact);
        assert_eq!(c.calls, 40);
        assert!(c.note.contains("could not be told apart"), "{}", c.note);
    }
}
