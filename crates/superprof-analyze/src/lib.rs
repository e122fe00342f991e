//! superprof-analyze: the dynamic code analyzer's decoder. It answers "where does the block
//! that starts here end, and where can it go next?", for `superprof blocks`, and nothing more.
//!
//! [`classify`] decodes one instruction and says how it moves the pc: straight on, or as a
//! call, return, direct or indirect jump, conditional branch, syscall, trap, or a repeated
//! string instruction (which loops on itself). [`blocks`] splits a run of code into basic
//! blocks: a block ends after a control-flow instruction, and a block is split where a branch
//! lands in its middle. Code is given as bytes with the address of the first byte, so the
//! caller reads memory however it can (a file, a traced process).
//!
//! ```
//! use superprof_analyze::{blocks, Flow};
//! // test edi,edi; je +2; inc eax; ret  (x86_64)
//! let code = [0x85, 0xff, 0x74, 0x02, 0xff, 0xc0, 0xc3];
//! let b = blocks(&code, 0x1000);
//! assert_eq!(b.iter().map(|b| (b.start, b.end)).collect::<Vec<_>>(),
//!            vec![(0x1000, 0x1004), (0x1004, 0x1006), (0x1006, 0x1007)]);
//! assert_eq!(b[0].flow, Flow::Conditional { target: 0x1006 });
//! ```

mod x86;

pub use x86::classify;

/// How an instruction moves the pc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// On to the next instruction: not a block end.
    Next,
    /// A direct call; execution comes back after it.
    Call {
        target: u64,
    },
    /// A call through a register or memory.
    IndirectCall,
    Return,
    Jump {
        target: u64,
    },
    IndirectJump,
    /// Taken to `target`, or on to the next instruction.
    Conditional {
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
    pub addr: u64,
    pub len: u32,
    pub flow: Flow,
}

/// A basic block: `start..end`, its instruction count, and how its last instruction leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub start: u64,
    pub end: u64,
    pub instructions: u32,
    /// The flow of the last instruction (`Flow::Next` when the block was split because a
    /// branch lands right after it).
    pub flow: Flow,
}

/// Splits `code` (starting at address `base`) into basic blocks: ends after control flow,
/// splits at every direct branch target inside the code. Undecodable bytes end the run.
pub fn blocks(code: &[u8], base: u64) -> Vec<Block> {
    let insns = decode_all(code, base);
    let end = insns.last().map_or(base, |i| i.addr + i.len as u64);
    let mut leaders: std::collections::BTreeSet<u64> = std::collections::BTreeSet::new();
    leaders.insert(base);
    for i in &insns {
        if let Some(t) = i.flow.target() {
            // A call's target starts another function's block; a jump's, one of ours.
            if (base..end).contains(&t) {
                leaders.insert(t);
            }
        }
        if i.flow.ends_block() {
            leaders.insert(i.addr + i.len as u64);
        }
    }
    let mut out: Vec<Block> = Vec::new();
    for i in &insns {
        let starts_here = leaders.contains(&i.addr);
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
    let mut out = Vec::new();
    let mut off = 0usize;
    while off < code.len() {
        let Some(insn) = classify(&code[off..], base + off as u64) else {
            break;
        };
        off += insn.len as usize;
        out.push(insn);
    }
    out
}
