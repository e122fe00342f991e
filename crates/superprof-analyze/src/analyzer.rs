//! The analyzers' common interface, and the `decode` analyzer.

use crate::{Arch, Flow, Isa};

/// Where a block that runs from some pc ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockEnd {
    /// The block's last instruction is at `addr`: it may send the pc elsewhere.
    Last {
        /// The address of the block's last instruction.
        addr: u64,
        /// Its length in bytes.
        len: u32,
        /// Instructions from the pc asked about to this one, both counted.
        instructions: u32,
    },
    /// No block end before `end` (the limit, or code that cannot be read or decoded).
    Open {
        /// Where the look stopped: the limit, or the first instruction that could not be read
        /// or decoded.
        end: u64,
        /// Instructions from the pc asked about to `end`.
        instructions: u32,
    },
    /// The analyzer cannot tell whether the instruction at `addr` ends the block yet:
    /// single-step it and tell the analyzer where the pc went ([`Analyzer::observe`]).
    Unknown {
        /// The instruction to single-step.
        addr: u64,
    },
}

/// What one instruction did when run in the lab (superprof's own process, where an
/// instruction of the program is executed alone under every condition a branch could depend
/// on: each combination of the condition flags, with the general registers all zeros and all
/// ones, the stack pointer on a scratch stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Probed {
    /// It sent the pc elsewhere under some condition: it ends a block.
    Branch,
    /// A system call (its stop came before it ran).
    Syscall,
    /// It went straight on under every condition: it never ends a block.
    Straight,
    /// It touched memory that the lab does not have under every condition tried, so it never
    /// ran there: no verdict. (An instruction that reads or writes memory is never a
    /// conditional branch; a single execution in the program tells whether it is an
    /// unconditional one, through memory.)
    TouchesMemory,
}

/// What an analyzer did, for the report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnalyzerStats {
    /// Instructions single-stepped to learn from, inside blocks (filled in by the caller,
    /// which does the stepping).
    pub single_steps: u64,
    /// Blocks whose end was predicted from the table.
    pub predictions: u64,
    /// Of those, how many the decoder agrees with (when checked).
    pub predictions_right: Option<u64>,
    /// Entries of the learned table (exact encodings, generalized patterns, opcode rows,
    /// opcodes seen going straight on, addresses seen branching).
    pub table_entries: usize,
    /// Single steps on code outside the regions, taken to learn while the table still
    /// changed (filled in by the caller).
    pub training_steps: u64,
    /// Block runs that did not reach the end their prediction gave (their next stop was
    /// elsewhere: an instruction predicted straight on branched); filled in by the caller.
    pub mispredicted: u64,
    /// Whether the table had stopped changing (see [`Analyzer::wants_training`]); always, for
    /// a learner with a lab (it never trains).
    pub settled: bool,
    /// Instructions run in the lab ([`Probed`]), and the runs (one per condition) that took.
    pub probed: u64,
    /// Runs in the lab, one instruction under one condition each.
    pub lab_runs: u64,
}

/// Reads the traced program's code: fills `buf` from `addr`, returns how many bytes it read.
pub type ReadCode<'a> = dyn FnMut(u64, &mut [u8]) -> usize + 'a;

/// The dynamic code analyzer: where does the block that runs from `pc` end?
pub trait Analyzer {
    /// The analyzer's name in the report: "decode" or "learn".
    fn name(&self) -> &'static str;
    /// Where the block that runs from `pc` ends, looking no further than `limit`.
    fn block_end(&mut self, pc: u64, limit: u64, read: &mut ReadCode) -> BlockEnd;
    /// The instruction at `addr` (whose bytes start `code`) ran and the pc went to `next`.
    fn observe(&mut self, addr: u64, code: &[u8], next: u64);
    /// What the analyzer did so far (its predictions, its table's size).
    fn stats(&self) -> AnalyzerStats;
    /// Whether the instruction at `addr` (whose bytes start `code`) ends a block, as far as
    /// the analyzer knows now.
    fn ends_block(&self, code: &[u8], addr: u64) -> bool;
    /// Whether an answer for a pc stays true (a decoder's does; a learner's can change).
    fn answers_are_final(&self) -> bool {
        true
    }
    /// Whether single steps on code outside the regions would still teach it something (a
    /// learner whose table still changes); the caller steps a thread that leaves a region a
    /// while when so.
    fn wants_training(&self) -> bool {
        false
    }
    /// Whether the instruction at `addr` (whose bytes start `code`) should be run in the lab
    /// before the analyzer answers for it (see [`Probed`]): the caller then makes a lab, if it
    /// has none yet, and says so ([`Analyzer::use_lab`]).
    fn wants_probe(&self, _code: &[u8], _addr: u64) -> bool {
        false
    }
    /// The caller has a lab: instructions the analyzer asks for ([`Analyzer::wants_probe`])
    /// are run there before it answers.
    fn use_lab(&mut self) {}
    /// What the instruction at `addr` (whose bytes start `code`) did in the lab.
    fn probed(&mut self, _code: &[u8], _addr: u64, _verdict: Probed) {}
    /// Whether the instruction at `addr` is a system call, if the analyzer knows (None: ask
    /// the decoder).
    fn is_syscall(&self, _code: &[u8], _addr: u64) -> Option<bool> {
        None
    }
}

/// Code read in chunks, for walking instruction by instruction.
pub(crate) struct CodeWindow {
    start: u64,
    bytes: Vec<u8>,
}

impl CodeWindow {
    pub(crate) fn new() -> CodeWindow {
        CodeWindow {
            start: 0,
            bytes: Vec::new(),
        }
    }

    /// The bytes from `addr` (at least `want` of them where readable, never past `limit`).
    pub(crate) fn at(&mut self, addr: u64, want: usize, limit: u64, read: &mut ReadCode) -> &[u8] {
        let have = addr >= self.start && addr + want as u64 <= self.start + self.bytes.len() as u64;
        if !have {
            let n = (limit.saturating_sub(addr)).min(512) as usize;
            self.bytes.resize(n, 0);
            let got = read(addr, &mut self.bytes);
            self.bytes.truncate(got);
            self.start = addr;
        }
        let off = (addr - self.start) as usize;
        let end = self.bytes.len().min((limit - self.start) as usize);
        &self.bytes[off.min(end)..end]
    }
}

/// The decoder: classifies each instruction's control flow (iced-x86 on x86_64, yaxpeax-arm on
/// AArch64).
pub struct Decode {
    arch: Arch,
    window: CodeWindow,
}

impl Decode {
    /// A decoder of `arch`'s instructions.
    pub fn new(arch: Arch) -> Decode {
        Decode {
            arch,
            window: CodeWindow::new(),
        }
    }
}

impl Analyzer for Decode {
    fn name(&self) -> &'static str {
        "decode"
    }

    fn block_end(&mut self, pc: u64, limit: u64, read: &mut ReadCode) -> BlockEnd {
        let mut at = pc;
        let mut n = 0u32;
        let max = self.arch.max_insn_len();
        while at < limit {
            let code = self.window.at(at, max, limit, read);
            let Some(insn) = self.arch.classify(code, at) else {
                break;
            };
            n += 1;
            if insn.flow != Flow::Next {
                return BlockEnd::Last {
                    addr: at,
                    len: insn.len,
                    instructions: n,
                };
            }
            at += insn.len as u64;
        }
        BlockEnd::Open {
            end: at,
            instructions: n,
        }
    }

    fn observe(&mut self, _addr: u64, _code: &[u8], _next: u64) {}

    fn ends_block(&self, code: &[u8], addr: u64) -> bool {
        self.arch
            .classify(code, addr)
            .is_some_and(|i| i.flow != Flow::Next)
    }

    fn stats(&self) -> AnalyzerStats {
        AnalyzerStats::default()
    }
}
