//! Counting a basic block inside the program (x86_64): a 5-byte `jmp` replaces the start of
//! the block (or one long instruction of it) and leads to a trampoline that adds one to the
//! block's counter, runs the displaced instructions, relocated, and jumps back.
//!
//! The trampoline keeps every register and flag of the program: it steps below the red zone
//! (128 bytes the program may use under its stack pointer without moving it), saves rax and
//! the flags in it (`seto`, `lahf`), adds one with `lock inc` (threads may run the block at
//! once), and restores them (`add $0x7f,%al` sets OF back, `sahf` the others). Relocation ([`iced_x86::BlockEncoder`]) rewrites what depends on where an instruction
//! sits: branches and RIP-relative operands. A displaced direct call is run as a push of the
//! original return address and a jump, so that the callee returns into the original code
//! (never into a trampoline, which unwinders and exceptions could not follow); an indirect
//! call cannot be, and refuses the block.
//!
//! What may be displaced is the planner's input: several instructions only where nothing can
//! jump between them (the caller knows the code's branch targets), else one instruction of at
//! least 5 bytes.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, MemoryOperand, Register,
};

/// Bytes of the jump that replaces the displaced instructions.
pub const JUMP_LEN: u32 = 5;

/// Why a block cannot be counted by a patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Shorter than the jump (or no instruction long enough where only one may be displaced).
    TooShort,
    /// Its bytes do not decode.
    Undecodable,
    /// An indirect call would have to be displaced (its return address would be in the
    /// trampoline), or a direct one where calls may not be emulated (shadow stacks).
    Call,
    /// The relocated code cannot reach its targets from the trampoline.
    OutOfReach,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::TooShort => "too short for a jump",
            Refusal::Undecodable => "does not decode",
            Refusal::Call => "a call would be displaced",
            Refusal::OutOfReach => "its relocated code cannot reach its targets",
        })
    }
}

/// A planned patch: the instructions at `at` move to a trampoline; the jump covers `len`
/// bytes (at least [`JUMP_LEN`]: past the instructions, only filler that never runs).
#[derive(Debug, Clone)]
pub struct Patch {
    pub at: u64,
    pub len: u32,
    displaced: Vec<Instruction>,
}

/// Plans the patch that counts the block whose bytes `code` start at `start`.
/// `several`: the block's first instructions may be displaced together (no branch lands
/// between them); else one instruction of at least [`JUMP_LEN`] bytes is. `spare`: bytes
/// after the block that never run and that nothing jumps to (the filler after a block that
/// ends with a return or a jump), which the jump may cover when the block's last instruction
/// never goes on to them. `calls`: a direct call may be displaced (emulated; not with a
/// shadow stack).
pub fn plan(
    code: &[u8],
    start: u64,
    several: bool,
    spare: u32,
    calls: bool,
) -> Result<Patch, Refusal> {
    let mut d = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut insns = Vec::new();
    while d.can_decode() {
        let i = d.decode();
        if i.is_invalid() {
            return Err(Refusal::Undecodable);
        }
        insns.push(i);
    }
    // The room after the last instruction, if it never goes on.
    let room_after = |i: &Instruction| if never_goes_on(i) { spare } else { 0 };
    let chosen: Vec<Instruction> = if several {
        let mut taken = Vec::new();
        let mut len = 0u32;
        for i in &insns {
            if len >= JUMP_LEN {
                break;
            }
            taken.push(*i);
            len += i.len() as u32;
            // A block's last instruction: what follows may be a branch target.
            if i.flow_control() != FlowControl::Next {
                break;
            }
        }
        let last = taken.last().ok_or(Refusal::TooShort)?;
        let end_of_block = last.next_ip() == start + code.len() as u64;
        let extra = if end_of_block { room_after(last) } else { 0 };
        if len.saturating_add(extra) < JUMP_LEN {
            return Err(Refusal::TooShort);
        }
        taken
    } else {
        let long = insns.iter().find(|i| i.len() as u32 >= JUMP_LEN);
        let last = insns
            .last()
            .filter(|i| (i.len() as u32).saturating_add(room_after(i)) >= JUMP_LEN);
        match long.or(last) {
            Some(i) => vec![*i],
            None => return Err(Refusal::TooShort),
        }
    };
    for i in &chosen {
        match i.flow_control() {
            FlowControl::IndirectCall => return Err(Refusal::Call),
            FlowControl::Call if !calls => return Err(Refusal::Call),
            // A call that is not the last displaced instruction would return into the
            // displaced bytes (a block ends at a call: never with a block's instructions).
            FlowControl::Call if i.ip() != chosen.last().map_or(0, Instruction::ip) => {
                return Err(Refusal::Call)
            }
            _ => {}
        }
    }
    let at = chosen[0].ip();
    let len = chosen
        .iter()
        .map(|i| i.len() as u32)
        .sum::<u32>()
        .max(JUMP_LEN);
    Ok(Patch {
        at,
        len,
        displaced: chosen,
    })
}

/// Whether an instruction never goes on to the next one (a return, a jump).
fn never_goes_on(i: &Instruction) -> bool {
    matches!(
        i.flow_control(),
        FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
    )
}

/// The 5-byte `jmp` from `from` to `to`, if `to` is in reach (±2 GiB).
pub fn jump(from: u64, to: u64) -> Option<[u8; 5]> {
    let rel = (to as i64).wrapping_sub(from.wrapping_add(5) as i64);
    let rel = i32::try_from(rel).ok()?;
    let mut b = [0xe9, 0, 0, 0, 0];
    b[1..].copy_from_slice(&rel.to_le_bytes());
    Some(b)
}

/// The trampoline of `patch` placed at `at`, counting into the 8-byte counter at `counter`
/// (within ±2 GiB of it).
pub fn trampoline(patch: &Patch, at: u64, counter: u64) -> Result<Vec<u8>, Refusal> {
    let bad = |_| Refusal::OutOfReach;
    let rsp = |d: i64| MemoryOperand::with_base_displ(Register::RSP, d);
    let mut inc = Instruction::with1(
        Code::Inc_rm64,
        MemoryOperand::with_base_displ(Register::RIP, counter as i64),
    )
    .map_err(bad)?;
    inc.set_has_lock_prefix(true);
    let mut out = vec![
        // Below the red zone; rax saved, the flags in it: OF in al (seto), the others in ah
        // (lahf). Cheaper than pushfq/popfq.
        Instruction::with2(Code::Lea_r64_m, Register::RSP, rsp(-128)).map_err(bad)?,
        Instruction::with1(Code::Push_r64, Register::RAX).map_err(bad)?,
        Instruction::with1(Code::Seto_rm8, Register::AL).map_err(bad)?,
        Instruction::with(Code::Lahf),
        inc,
        // al + 0x7f overflows exactly when OF was set; sahf puts back the rest.
        Instruction::with2(Code::Add_AL_imm8, Register::AL, 0x7f).map_err(bad)?,
        Instruction::with(Code::Sahf),
        Instruction::with1(Code::Pop_r64, Register::RAX).map_err(bad)?,
        Instruction::with2(Code::Lea_r64_m, Register::RSP, rsp(128)).map_err(bad)?,
    ];
    // Where the original code goes on after the displaced instructions.
    let back = patch
        .displaced
        .last()
        .map_or(patch.at + patch.len as u64, Instruction::next_ip);
    let mut goes_on = true;
    for i in &patch.displaced {
        match i.flow_control() {
            FlowControl::Call => {
                // push the original return address; jmp to the callee.
                out.push(Instruction::with2(Code::Lea_r64_m, Register::RSP, rsp(-8)).map_err(bad)?);
                out.push(Instruction::with1(Code::Push_r64, Register::RAX).map_err(bad)?);
                out.push(
                    Instruction::with2(Code::Mov_r64_imm64, Register::RAX, back).map_err(bad)?,
                );
                out.push(
                    Instruction::with2(Code::Mov_rm64_r64, rsp(8), Register::RAX).map_err(bad)?,
                );
                out.push(Instruction::with1(Code::Pop_r64, Register::RAX).map_err(bad)?);
                out.push(
                    Instruction::with_branch(Code::Jmp_rel32_64, i.near_branch_target())
                        .map_err(bad)?,
                );
                goes_on = false;
            }
            _ if never_goes_on(i) => {
                out.push(*i);
                goes_on = false;
            }
            _ => {
                out.push(*i);
                goes_on = true;
            }
        }
    }
    if goes_on {
        out.push(Instruction::with_branch(Code::Jmp_rel32_64, back).map_err(bad)?);
    }
    let block = InstructionBlock::new(&out, at);
    BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
        .map(|r| r.code_buffer)
        .map_err(bad)
}

/// The longest trampoline [`trampoline`] makes for a patch of instructions of at most 15
/// bytes each (a bound to reserve room with): prologue 27, up to 5 relocated instructions of
/// at most 15 bytes, or 6 emulating a call (30), and the jump back.
pub const MAX_TRAMPOLINE: usize = 128;

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(code: &[u8], ip: u64) -> Vec<String> {
        let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
        let mut f = iced_x86::GasFormatter::new();
        let mut out = Vec::new();
        use iced_x86::Formatter;
        while d.can_decode() {
            let i = d.decode();
            let mut s = String::new();
            f.format(&i, &mut s);
            if i.is_ip_rel_memory_operand() {
                s.push_str(" (rip-relative)");
            }
            out.push(s);
        }
        out
    }

    #[test]
    fn several_short_instructions_make_room_for_the_jump() {
        // mov %edi,%eax (2); add $1,%eax (3); ret
        let code = [0x89, 0xf8, 0x83, 0xc0, 0x01, 0xc3];
        let p = plan(&code, 0x1000, true, 0, true).unwrap();
        assert_eq!((p.at, p.len), (0x1000, 5));
        // Only one long instruction allowed: none here.
        assert_eq!(
            plan(&code, 0x1000, false, 0, true).unwrap_err(),
            Refusal::TooShort
        );
        assert_eq!(
            plan(&[0x89, 0xf8, 0xc3], 0x1000, true, 0, true).unwrap_err(),
            Refusal::TooShort
        );
        // The displaced instructions stop at the block's end.
        assert_eq!(
            plan(&[0x85, 0xc0, 0x75, 0x10, 0x90, 0x90], 0x1000, true, 8, true).unwrap_err(),
            Refusal::TooShort
        );
    }

    #[test]
    fn the_trampoline_counts_relocates_and_jumps_back() {
        // cmp $5,%ecx (3); jne +0x10 (2): the whole block.
        let code = [0x83, 0xf9, 0x05, 0x75, 0x10];
        let p = plan(&code, 0x40_1000, true, 0, true).unwrap();
        assert_eq!(p.len, 5);
        let t = trampoline(&p, 0x40_8000, 0x40_9000).unwrap();
        let text = decode(&t, 0x40_8000);
        assert_eq!(
            text,
            [
                "lea -0x80(%rsp),%rsp",
                "push %rax",
                "seto %al",
                "lahf",
                "lock incq 0x409000 (rip-relative)",
                "add $0x7F,%al",
                "sahf",
                "pop %rax",
                "lea 0x80(%rsp),%rsp",
                "cmp $5,%ecx",
                // The branch still goes to 0x401015, from the trampoline.
                "jne 0x0000000000401015",
                "jmp 0x0000000000401005",
            ]
        );
    }

    #[test]
    fn rip_relative_operands_keep_their_target() {
        // mov 0x100(%rip),%rax at 0x401000 (7 bytes): reads 0x401107.
        let code = [0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00];
        let p = plan(&code, 0x40_1000, false, 0, true).unwrap();
        let t = trampoline(&p, 0x50_0000, 0x50_1000).unwrap();
        let text = decode(&t, 0x50_0000);
        assert_eq!(text[9], "mov 0x401107,%rax (rip-relative)");
        assert!(text[10].starts_with("jmp 0x0000000000401007"), "{text:?}");
        // Out of reach: the counter too far from the trampoline.
        assert_eq!(
            trampoline(&p, 0x50_0000, 0x7fff_0000_0000).unwrap_err(),
            Refusal::OutOfReach
        );
    }

    #[test]
    fn a_displaced_call_returns_into_the_original_code() {
        // call 0x402000 at 0x401000
        let rel = (0x402000i64 - 0x401005) as i32;
        let mut code = vec![0xe8];
        code.extend(rel.to_le_bytes());
        let p = plan(&code, 0x40_1000, true, 0, true).unwrap();
        let t = trampoline(&p, 0x50_0000, 0x50_1000).unwrap();
        let text = decode(&t, 0x50_0000);
        assert_eq!(
            &text[9..],
            &[
                "lea -8(%rsp),%rsp",
                "push %rax",
                "movabs $0x401005,%rax",
                "mov %rax,8(%rsp)",
                "pop %rax",
                "jmp 0x0000000000402000",
            ]
        );
        assert_eq!(
            plan(&code, 0x40_1000, true, 0, false).unwrap_err(),
            Refusal::Call
        );
        // call *0x100(%rip): never.
        assert_eq!(
            plan(&[0xff, 0x15, 0, 1, 0, 0], 0x1000, true, 0, true).unwrap_err(),
            Refusal::Call
        );
    }

    #[test]
    fn a_short_block_that_returns_takes_the_filler_after_it() {
        // lea (%rdi,%rdi,2),%eax (3); ret (1); then 4 bytes of nopl padding.
        let code = [0x8d, 0x04, 0x7f, 0xc3];
        assert_eq!(
            plan(&code, 0x1240, true, 0, true).unwrap_err(),
            Refusal::TooShort
        );
        let p = plan(&code, 0x1240, true, 4, true).unwrap();
        assert_eq!((p.at, p.len), (0x1240, 5));
        let t = trampoline(&p, 0x50_0000, 0x50_1000).unwrap();
        // The block's two instructions, and no jump back: the ret never goes on.
        assert_eq!(
            &decode(&t, 0x50_0000)[9..],
            ["lea (%rdi,%rdi,2),%eax", "ret"]
        );
        // Only one instruction may move: the ret, with the filler.
        let p = plan(&code, 0x1240, false, 4, true).unwrap();
        assert_eq!((p.at, p.len), (0x1243, 5));
        // A jcc goes on to what follows: never past it.
        let code = [0x85, 0xc0, 0x75, 0x10];
        assert_eq!(
            plan(&code, 0x1000, true, 8, true).unwrap_err(),
            Refusal::TooShort
        );
    }

    #[test]
    fn jumps_reach_two_gibibytes() {
        assert_eq!(jump(0x1000, 0x1005), Some([0xe9, 0, 0, 0, 0]));
        assert_eq!(jump(0x1000, 0x1000), Some([0xe9, 0xfb, 0xff, 0xff, 0xff]));
        assert!(jump(0x1000, 0x1_0000_1000).is_none());
    }
}
