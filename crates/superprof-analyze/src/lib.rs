//! superprof-analyze: the dynamic code analyzer. It answers "where does the block that runs
//! from here end, and where can it go next?", for `superprof blocks`, and writes the patches
//! that count blocks or record probe hits inside the program (the in-process engine of
//! `blocks` and `stat`).
//!
//! - [`Arch::classify`] decodes one instruction (iced-x86 on x86_64, yaxpeax-arm on AArch64)
//!   and says how it moves the pc: straight on, or as a call, return, direct or indirect
//!   jump, conditional branch, syscall, trap, or a repeated string instruction (which loops on
//!   itself). [`blocks_for`] splits a run of code into basic blocks: a block ends after a
//!   control-flow instruction and is split where a branch lands in its middle.
//! - The [`Analyzer`] interface gives a block's end from a pc, reading the code through a
//!   callback: [`Decode`] from the decoder, [`Learn`] from a table it learns by watching
//!   single steps (the design's architecture-independent analyzer).
//! - [`x86_branch`] works out where a branch goes from the registers, so that a tracer can
//!   send a thread there without single-stepping it.
//! - [`patch`]: a [`patch::Patcher`] per architecture ([`patch::x86_64`], [`patch::aarch64`])
//!   plans the jump that replaces one or more
//!   instructions of a block and writes the trampoline behind it, which adds one to a counter or
//!   writes a record into a ring, then runs the displaced instructions, relocated.
//!
//! Code is given as bytes with the address of the first byte, so the caller reads memory
//! however it can (a file, a traced process).
//!
//! ```
//! use superprof_analyze::{blocks_for, Arch, Flow};
//! // test edi,edi; je +2; inc eax; ret  (x86_64)
//! let code = [0x85, 0xff, 0x74, 0x02, 0xff, 0xc0, 0xc3];
//! let b = blocks_for(Arch::X86_64, &code, 0x1000);
//! assert_eq!(b.iter().map(|b| (b.start, b.end)).collect::<Vec<_>>(),
//!            vec![(0x1000, 0x1004), (0x1004, 0x1006), (0x1006, 0x1007)]);
//! assert_eq!(b[0].flow, Flow::Conditional { target: 0x1006 });
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod aarch64;
mod analyzer;
pub mod elf_code;
mod emulate;
mod lab;
mod learn;
pub mod patch;
mod x86;

pub use analyzer::{Analyzer, AnalyzerStats, BlockEnd, Decode, Probed};
pub use elf_code::ElfCode;
pub use emulate::{x86_branch, Taken, X86Regs};
pub use lab::Lab;
pub use learn::Learn;

pub use superprof_unwind::Arch;

/// What the analyzers know of an instruction set ([`Arch`], whose home is superprof-unwind):
/// its instructions' lengths, kinds and text.
pub trait Isa: Copy {
    /// The longest instruction: how many bytes to read to decode one.
    fn max_insn_len(self) -> usize;
    /// Decodes the instruction at the start of `code` (at address `addr`); None if invalid.
    fn classify(self, code: &[u8], addr: u64) -> Option<Insn>;
    /// The instruction at the start of `code` as assembly text, and its length.
    fn disassemble(self, code: &[u8], addr: u64) -> Option<(String, u32)>;
    /// The length of the instruction at the start of `code` (the length decoder on x86_64;
    /// 4 on AArch64, decodable or not).
    fn insn_len(self, code: &[u8], addr: u64) -> Option<u32>;
}

impl Isa for Arch {
    fn max_insn_len(self) -> usize {
        match self {
            Arch::X86_64 => 15,
            Arch::Aarch64 => 4,
        }
    }

    fn classify(self, code: &[u8], addr: u64) -> Option<Insn> {
        match self {
            Arch::X86_64 => x86::classify(code, addr),
            Arch::Aarch64 => aarch64::classify(code, addr),
        }
    }

    fn disassemble(self, code: &[u8], addr: u64) -> Option<(String, u32)> {
        match self {
            Arch::X86_64 => x86::disassemble(code, addr),
            Arch::Aarch64 => aarch64::disassemble(code, addr),
        }
    }

    fn insn_len(self, code: &[u8], addr: u64) -> Option<u32> {
        self.encoding_key(code, addr).map(|(_, len)| len)
    }
}

/// The learning analyzer's view of an instruction set: keys of instructions.
pub(crate) trait Keys {
    /// The learning analyzer's key for an instruction (its opcode bits, prefixes left out),
    /// and the instruction's length.
    fn encoding_key(self, code: &[u8], addr: u64) -> Option<(u32, u32)>;
    /// Where the opcode part of a key starts (the bits above are the "head").
    fn key_head_shift(self) -> u32;
}

impl Keys for Arch {
    fn encoding_key(self, code: &[u8], addr: u64) -> Option<(u32, u32)> {
        match self {
            Arch::X86_64 => x86::encoding_key(code, addr),
            Arch::Aarch64 => aarch64::encoding_key(code),
        }
    }

    fn key_head_shift(self) -> u32 {
        match self {
            Arch::X86_64 => x86::KEY_HEAD_SHIFT,
            Arch::Aarch64 => aarch64::KEY_HEAD_SHIFT,
        }
    }
}

/// Classifies one instruction of the host architecture (see [`Isa::classify`]).
pub fn classify(code: &[u8], addr: u64) -> Option<Insn> {
    Arch::HOST.classify(code, addr)
}

/// How an instruction moves the pc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// On to the next instruction: not a block end.
    Next,
    /// A direct call; execution comes back after it.
    Call {
        /// The callee's address.
        target: u64,
    },
    /// A call through a register or memory.
    IndirectCall,
    /// A return, to the address the call left (on the stack on x86_64, in a register on
    /// AArch64).
    Return,
    /// A direct unconditional jump.
    Jump {
        /// Where it goes.
        target: u64,
    },
    /// A jump through a register or memory (a jump table's dispatch, a tail call through a
    /// pointer).
    IndirectJump,
    /// Taken to `target`, or on to the next instruction.
    Conditional {
        /// Where it goes when taken.
        target: u64,
    },
    /// syscall, sysenter, int 0x80: the kernel returns to the next instruction.
    Syscall,
    /// int3, ud2, hlt, int n: the program stops or takes a signal.
    Trap,
    /// A `rep`-prefixed string instruction: it repeats itself before going on.
    Repeat,
}

impl Flow {
    /// Whether a basic block ends with this instruction.
    pub fn ends_block(self) -> bool {
        self != Flow::Next
    }

    /// A branch target inside the code, if the instruction has a direct one.
    pub fn target(self) -> Option<u64> {
        match self {
            Flow::Call { target } | Flow::Jump { target } | Flow::Conditional { target } => {
                Some(target)
            }
            _ => None,
        }
    }
}

/// One decoded instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// The instruction's address.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u32,
    /// How it moves the pc.
    pub flow: Flow,
    /// A no-op (or int3) of the kind compilers put between functions and before jump targets.
    pub filler: bool,
}

/// A basic block: `start..end`, its instruction count, and how its last instruction leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The address of the first instruction.
    pub start: u64,
    /// The address just past the last instruction (exclusive).
    pub end: u64,
    /// How many instructions the block has.
    pub instructions: u32,
    /// The flow of the last instruction (`Flow::Next` when the block was split because a
    /// branch lands right after it).
    pub flow: Flow,
}

/// Splits `code` (starting at address `base`) into basic blocks: ends after control flow,
/// splits at every direct branch target inside the code. Undecodable bytes end the run.
/// Filler (no-ops, int3) after a return or jump belongs to no block.
pub fn blocks(code: &[u8], base: u64) -> Vec<Block> {
    blocks_for(Arch::HOST, code, base)
}

/// [`blocks`] for a given architecture.
pub fn blocks_for(arch: Arch, code: &[u8], base: u64) -> Vec<Block> {
    let insns = decode_all_for(arch, code, base);
    let end = insns.last().map_or(base, |i| i.addr + i.len as u64);
    let mut leaders: std::collections::BTreeSet<u64> = std::collections::BTreeSet::new();
    let mut targets: std::collections::HashSet<u64> = std::collections::HashSet::new();
    leaders.insert(base);
    for i in &insns {
        if let Some(t) = i.flow.target() {
            // A call's target starts another function's block; a jump's, one of ours.
            if (base..end).contains(&t) {
                leaders.insert(t);
                targets.insert(t);
            }
        }
        if i.flow.ends_block() {
            leaders.insert(i.addr + i.len as u64);
        }
        // A repeated string instruction loops on itself: it is a block of its own.
        if i.flow == Flow::Repeat {
            leaders.insert(i.addr);
        }
    }
    let mut out: Vec<Block> = Vec::new();
    // Filler after an instruction that never goes straight on is never run: it belongs to
    // no block, and the code after it starts one.
    let mut after_end = false;
    for i in &insns {
        let unconditional = matches!(
            i.flow,
            Flow::Return | Flow::Jump { .. } | Flow::IndirectJump | Flow::Trap
        );
        if after_end && i.filler && !targets.contains(&i.addr) && i.addr != base {
            continue;
        }
        let starts_here = leaders.contains(&i.addr) || after_end;
        after_end = unconditional;
        match out.last_mut() {
            Some(b) if !starts_here && !b.flow.ends_block() => {
                b.end = i.addr + i.len as u64;
                b.instructions += 1;
                b.flow = i.flow;
            }
            _ => out.push(Block {
                start: i.addr,
                end: i.addr + i.len as u64,
                instructions: 1,
                flow: i.flow,
            }),
        }
    }
    out
}

/// Decodes a run of instructions.
pub fn decode_all(code: &[u8], base: u64) -> Vec<Insn> {
    decode_all_for(Arch::HOST, code, base)
}

/// The direct branches of the code from the start of `code` (at `base`) to the first
/// undecodable instruction, as (target, branch address) pairs into `out`; returns the bytes
/// decoded.
pub fn branch_pairs_for(arch: Arch, code: &[u8], base: u64, out: &mut Vec<(u64, u64)>) -> usize {
    if arch == Arch::X86_64 {
        return x86::branch_pairs(code, base, out);
    }
    let run = decode_all_for(arch, code, base);
    out.extend(run.iter().filter_map(|i| Some((i.flow.target()?, i.addr))));
    run.last()
        .map_or(0, |i| (i.addr + i.len as u64 - base) as usize)
}

/// [`decode_all`] for a given architecture.
pub fn decode_all_for(arch: Arch, code: &[u8], base: u64) -> Vec<Insn> {
    if arch == Arch::X86_64 {
        return x86::classify_all(code, base);
    }
    let mut out = Vec::new();
    let mut off = 0usize;
    while off < code.len() {
        let Some(insn) = arch.classify(&code[off..], base + off as u64) else {
            break;
        };
        off += insn.len as usize;
        out.push(insn);
    }
    out
}

#[cfg(test)]
mod block_tests {
    use super::*;

    fn block(start: u64, end: u64, instructions: u32, flow: Flow) -> Block {
        Block {
            start,
            end,
            instructions,
            flow,
        }
    }

    #[test]
    fn x86_64_code_splits_after_control_flow_and_at_targets() {
        let code = [
            0x31, 0xc0, // 0x1000 xor eax, eax
            0x85, 0xff, // 0x1002 test edi, edi
            0x74, 0x05, // 0x1004 je 0x100b
            0xb8, 0x01, 0x00, 0x00, 0x00, // 0x1006 mov eax, 1
            0xff, 0xc0, // 0x100b inc eax (the je's target)
            0xc3, // 0x100d ret
            0xcc, // 0x100e int3: filler after a return, in no block
            0x66, 0x90, // 0x100f xchg ax, ax: filler too
            0xe8, 0xea, 0xff, 0xff, 0xff, // 0x1011 call 0x1000
            0xf3, 0xa4, // 0x1016 rep movsb: a block of its own
            0xc3, // 0x1018 ret
        ];
        assert_eq!(
            blocks_for(Arch::X86_64, &code, 0x1000),
            vec![
                block(0x1000, 0x1006, 3, Flow::Conditional { target: 0x100b }),
                block(0x1006, 0x100b, 1, Flow::Next),
                block(0x100b, 0x100e, 2, Flow::Return),
                block(0x1011, 0x1016, 1, Flow::Call { target: 0x1000 }),
                block(0x1016, 0x1018, 1, Flow::Repeat),
                block(0x1018, 0x1019, 1, Flow::Return),
            ]
        );
        // Undecodable bytes end the run.
        assert_eq!(
            blocks_for(Arch::X86_64, &[0x90, 0x0f, 0xff], 0x10),
            vec![block(0x10, 0x11, 1, Flow::Next)]
        );
    }

    #[test]
    fn aarch64_code_splits_after_control_flow_and_at_targets() {
        let words: [u32; 5] = [
            0xb400_0060, // 0x2000 cbz x0, 0x200c
            0x9100_0400, // 0x2004 add x0, x0, #1
            0x1400_0002, // 0x2008 b 0x2010
            0xd100_0400, // 0x200c sub x0, x0, #1 (the cbz's target)
            0xd65f_03c0, // 0x2010 ret (the b's target)
        ];
        let code: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(
            blocks_for(Arch::Aarch64, &code, 0x2000),
            vec![
                block(0x2000, 0x2004, 1, Flow::Conditional { target: 0x200c }),
                block(0x2004, 0x200c, 2, Flow::Jump { target: 0x2010 }),
                block(0x200c, 0x2010, 1, Flow::Next),
                block(0x2010, 0x2014, 1, Flow::Return),
            ]
        );
    }
}
