//! Counting a basic block inside the program (x86_64): a 5-byte `jmp` replaces the start of
//! the block (or one long instruction of it) and leads to a trampoline that adds one to the
//! block's counter, runs the displaced instructions, relocated, and jumps back.
//!
//! The trampoline keeps every register and flag of the program: it steps below the red zone
//! (128 bytes the program may use under its stack pointer without moving it), saves rax and
//! the flags in it (`seto`, `lahf`), adds one with `lock inc` (threads may run the block at
//! once), and restores them (`add $0x7f,%al` sets OF back, `sahf` the others). Relocation
//! ([`iced_x86::BlockEncoder`]) rewrites what depends on where an instruction sits: branches
//! and RIP-relative operands. A displaced direct call is run as a push of the original return
//! address and a jump, so that the callee returns into the original code (never into a
//! trampoline, which unwinders and exceptions could not follow); an indirect call cannot be,
//! and refuses the block.
//!
//! What may be displaced is the planner's input: several instructions only where nothing can
//! jump between them (the caller knows the code's branch targets), else one instruction of at
//! least 5 bytes.

use super::{
    Recording, Refusal, Ring, SpAt, RECORD, REC_COMMIT, REC_CPUTIME, REC_PROBE, REC_RUSAGE, REC_SP,
    REC_TID, REC_TIME, RING_GAVE_UP, RING_TAIL, RING_WAITS, RING_WAIT_NS,
};
use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, MemoryOperand, Register,
};

/// Bytes of the jump that replaces the displaced instructions.
pub const JUMP_LEN: u32 = 5;

/// A planned patch: the instructions at `at` move to a trampoline; the jump covers `len`
/// bytes: at least the jump's own length ([`JUMP_LEN`] from [`plan`]; the `need` given to
/// [`plan_for`], so as few as [`SHORT_JUMP_LEN`] for a short jump). Past the instructions, only
/// filler that never runs.
#[derive(Debug, Clone)]
pub struct Patch {
    /// The address of the first displaced instruction, where the jump is written.
    pub at: u64,
    /// Bytes the jump covers: the displaced instructions, and filler after them where the
    /// jump needs more.
    pub len: u32,
    displaced: Vec<Instruction>,
}

impl Patch {
    /// Whether the patch fires at every entry of a function starting at `start`: at its very
    /// first instruction.
    pub fn at_entry_of(&self, start: u64) -> bool {
        self.at == start
    }
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
    plan_for(code, start, several, spare, calls, JUMP_LEN)
}

/// [`plan`] for a jump of `need` bytes: [`SHORT_JUMP_LEN`] for a short jump to a springboard
/// (a 5-byte jump in filler nearby, see [`short_jump`]).
pub fn plan_for(
    code: &[u8],
    start: u64,
    several: bool,
    spare: u32,
    calls: bool,
    need: u32,
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
            if len >= need {
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
        if len.saturating_add(extra) < need {
            return Err(Refusal::TooShort);
        }
        taken
    } else {
        let long = insns.iter().find(|i| i.len() as u32 >= need);
        let last = insns
            .last()
            .filter(|i| (i.len() as u32).saturating_add(room_after(i)) >= need);
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
    let len = chosen.iter().map(|i| i.len() as u32).sum::<u32>().max(need);
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

/// Bytes of the short jump to a springboard.
pub const SHORT_JUMP_LEN: u32 = 2;

/// The 2-byte `jmp` from `from` to `to`, if `to` is in reach (-128..127 after it): to a
/// springboard, a 5-byte jump to the trampoline written in filler that never runs, for a
/// block too short for a 5-byte jump of its own.
pub fn short_jump(from: u64, to: u64) -> Option<[u8; 2]> {
    let rel = (to as i64).wrapping_sub(from.wrapping_add(2) as i64);
    let rel = i8::try_from(rel).ok()?;
    Some([0xeb, rel as u8])
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
    let out = vec![
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
    finish(out, patch, at)
}

/// [`trampoline`] at a function's entry, where the flags are dead (the SysV ABI leaves them
/// undefined across a call, and no code at a function's start reads them before writing
/// them): the locked increment, the displaced instructions, the jump back; nothing saved, no
/// stack touched.
pub fn entry_trampoline(patch: &Patch, at: u64, counter: u64) -> Result<Vec<u8>, Refusal> {
    let mut inc = Instruction::with1(
        Code::Inc_rm64,
        MemoryOperand::with_base_displ(Register::RIP, counter as i64),
    )
    .map_err(|_| Refusal::OutOfReach)?;
    inc.set_has_lock_prefix(true);
    finish(vec![inc], patch, at)
}

/// The stack pointer that the instruction at `to` will run with, from a probe at `from`
/// (`code`: the bytes from `from` on; straight code between): pushes, pops, `add`/`sub`/`lea`
/// of rsp with a constant, and `leave` (after which it is rbp's value at the probe, plus 8).
/// None where anything else changes rsp, or rbp before a `leave`.
pub fn sp_at(code: &[u8], from: u64, to: u64) -> Option<SpAt> {
    use iced_x86::{InstructionInfoFactory, OpAccess};
    let mut d = Decoder::with_ip(64, code, from, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut at = SpAt::Rsp(0);
    let add = |at: SpAt, n: i64| -> Option<SpAt> {
        Some(match at {
            SpAt::Rsp(d) => SpAt::Rsp(i32::try_from(d as i64 + n).ok()?),
            SpAt::Rbp(d) => SpAt::Rbp(i32::try_from(d as i64 + n).ok()?),
        })
    };
    while d.can_decode() && d.ip() < to {
        let i = d.decode();
        if i.is_invalid() {
            return None;
        }
        let writes = |reg: Register, info: &mut InstructionInfoFactory| {
            info.info(&i).used_registers().iter().any(|u| {
                u.register().full_register() == reg
                    && matches!(
                        u.access(),
                        OpAccess::Write | OpAccess::ReadWrite | OpAccess::CondWrite
                    )
            })
        };
        at = match i.code() {
            Code::Push_r64 | Code::Pushq_imm32 | Code::Pushq_imm8 => add(at, -8)?,
            Code::Pop_r64 if i.op0_register() == Register::RSP => return None,
            Code::Pop_r64 if i.op0_register() == Register::RBP => add(at, 8)?,
            Code::Pop_r64 => add(at, 8)?,
            Code::Leaveq => match at {
                SpAt::Rsp(_) => SpAt::Rbp(8),
                SpAt::Rbp(_) => return None,
            },
            Code::Add_rm64_imm8 | Code::Add_rm64_imm32 if i.op0_register() == Register::RSP => {
                add(at, i.immediate(1) as i64)?
            }
            Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32 if i.op0_register() == Register::RSP => {
                add(at, -(i.immediate(1) as i64))?
            }
            Code::Lea_r64_m
                if i.op0_register() == Register::RSP
                    && i.memory_base() == Register::RSP
                    && i.memory_index() == Register::None =>
            {
                add(at, i.memory_displacement64() as i64)?
            }
            _ if writes(Register::RSP, &mut info) => return None,
            // rbp as read at the probe would no longer be the one `leave` uses.
            _ if writes(Register::RBP, &mut info) && matches!(at, SpAt::Rsp(_)) => {
                let rest = &code[(d.ip() - from) as usize..];
                let leave_later = Decoder::with_ip(64, rest, d.ip(), DecoderOptions::NONE)
                    .into_iter()
                    .take_while(|n| n.ip() < to)
                    .any(|n| n.code() == Code::Leaveq);
                if leave_later {
                    return None;
                }
                at
            }
            _ => at,
        };
    }
    (d.ip() == to).then_some(at)
}

/// Whether instruction `i`'s memory operand is one that a running thread always has mapped:
/// its module's own data (RIP-relative) or its thread-local storage (`%fs:`/`%gs:` with no
/// base or index register: `decl %fs:-8`, a counter of the thread's own).
fn module_or_thread_memory(i: &Instruction) -> bool {
    i.memory_base() == Register::RIP
        || (matches!(i.segment_prefix(), Register::FS | Register::GS)
            && i.memory_base() == Register::None
            && i.memory_index() == Register::None)
}

/// Where a probe may stand before the instruction at `to` (a function's return) and still see
/// the call as it ends: the starts of the instructions of `code` (the bytes from `from` on,
/// straight code) after which nothing can fault up to `to` (no memory access but the stack's
/// pushes and pops, the module's data and the thread's own storage; no division), latest
/// first; `to` itself first of all. A probe there does not record a call as ended that a
/// fault in its last instructions would end otherwise.
pub fn quiet_tail(code: &[u8], from: u64, to: u64) -> Vec<u64> {
    use iced_x86::{Mnemonic, OpKind};
    let mut insns = Vec::new();
    let mut d = Decoder::with_ip(64, code, from, DecoderOptions::NONE);
    while d.can_decode() && d.ip() < to {
        let i = d.decode();
        if i.is_invalid() {
            return vec![to];
        }
        insns.push(i);
    }
    if d.ip() != to {
        return Vec::new();
    }
    let quiet = |i: &Instruction| {
        let stack = matches!(
            i.mnemonic(),
            Mnemonic::Push | Mnemonic::Pop | Mnemonic::Leave
        ) && (0..i.op_count()).all(|k| i.op_kind(k) != OpKind::Memory);
        let touches = (0..i.op_count()).any(|k| i.op_kind(k) == OpKind::Memory)
            && i.mnemonic() != Mnemonic::Lea
            && i.mnemonic() != Mnemonic::Nop
            && !module_or_thread_memory(i);
        let divides = matches!(i.mnemonic(), Mnemonic::Div | Mnemonic::Idiv);
        stack || (!touches && !divides && i.flow_control() == FlowControl::Next)
    };
    let mut out = vec![to];
    for i in insns.iter().rev() {
        if !quiet(i) {
            break;
        }
        out.push(i.ip());
    }
    out
}

/// Where a probe may stand after the instruction at `from` (a function's entry) and still see
/// every call as it starts, with the same stack pointer: `from`, then the starts of the
/// instructions of `code` (the bytes from `from` on) after which none before can fault (no
/// memory access but a RIP-relative one, to the module's own data, locked or not: a
/// function's count of its own calls; no division), change rsp or branch, up to `most`
/// instructions. The caller checks that nothing jumps in between.
pub fn quiet_head(code: &[u8], from: u64, most: usize) -> Vec<u64> {
    use iced_x86::{InstructionInfoFactory, Mnemonic, OpAccess, OpKind};
    let mut out = vec![from];
    let mut d = Decoder::with_ip(64, code, from, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    while d.can_decode() && out.len() <= most {
        let i = d.decode();
        if i.is_invalid() || i.flow_control() != FlowControl::Next {
            break;
        }
        let memory = (0..i.op_count()).any(|k| i.op_kind(k) == OpKind::Memory);
        let harmless_memory = !memory
            || module_or_thread_memory(&i)
            || matches!(i.mnemonic(), Mnemonic::Lea | Mnemonic::Nop);
        let divides = matches!(i.mnemonic(), Mnemonic::Div | Mnemonic::Idiv);
        let moves_rsp = info.info(&i).used_registers().iter().any(|u| {
            u.register().full_register() == Register::RSP
                && matches!(
                    u.access(),
                    OpAccess::Write | OpAccess::ReadWrite | OpAccess::CondWrite
                )
        });
        if !harmless_memory || divides || moves_rsp {
            break;
        }
        out.push(i.next_ip());
    }
    out
}

/// Whether the instruction at the start of `code` (at `addr`) has a lock prefix.
pub fn has_lock_prefix(code: &[u8], addr: u64) -> bool {
    let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    d.can_decode() && {
        let i = d.decode();
        !i.is_invalid() && i.has_lock_prefix()
    }
}

/// Whether the instruction at the start of `code` is an indirect jump through a RIP-relative
/// slot (`jmp *disp(%rip)`: through the GOT, a call's tail to another function, never a jump
/// table's dispatch, which indexes its table with a register).
pub fn jumps_through_slot(code: &[u8], addr: u64) -> bool {
    use iced_x86::OpKind;
    let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    if !d.can_decode() {
        return false;
    }
    let i = d.decode();
    i.flow_control() == FlowControl::IndirectBranch
        && i.op_count() == 1
        && i.op_kind(0) == OpKind::Memory
        && i.memory_base() == Register::RIP
}

/// The trampoline of `patch` placed at `at` that writes one record into `ring` each time the
/// probe point runs, then runs the displaced instructions. It takes a record with `lock xadd`
/// on the ring's head, and fills it through system calls (gettid, clock_gettime, getrusage);
/// every register and flag is kept (rcx and r11, which `syscall` changes, too).
pub fn record_trampoline(
    patch: &Patch,
    at: u64,
    ring: &Ring,
    r: &Recording,
) -> Result<Vec<u8>, Refusal> {
    use Register::{EAX, EDI, R10, R11, R8, R9, RAX, RBP, RCX, RDI, RDX, RSI, RSP};
    let bad = |_| Refusal::OutOfReach;
    let mem = |base: Register, d: i64| MemoryOperand::with_base_displ(base, d);
    if !ring.records.is_power_of_two() || ring.records > 1 << 24 {
        return Err(Refusal::OutOfReach);
    }
    let saved = [RAX, RCX, RDX, RSI, RDI, R8, R9, R10, R11];
    let mut out = vec![
        Instruction::with2(Code::Lea_r64_m, RSP, mem(RSP, -128)).map_err(bad)?,
        Instruction::with(Code::Pushfq),
    ];
    for reg in saved {
        out.push(Instruction::with1(Code::Push_r64, reg).map_err(bad)?);
    }
    // The record: index = head++; r9 = base + (index % records) * RECORD.
    // (Absolute addresses: the ring may be anywhere.)
    out.push(Instruction::with2(Code::Mov_r64_imm64, R9, ring.head).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_r32_imm32, EAX, 1u32).map_err(bad)?);
    let mut xadd = Instruction::with2(Code::Xadd_rm64_r64, mem(R9, 0), RAX).map_err(bad)?;
    xadd.set_has_lock_prefix(true);
    out.push(xadd);
    out.push(Instruction::with1(Code::Push_r64, RAX).map_err(bad)?);
    ring_wait(&mut out, ring)?;
    // The probe point's rsp: 128 + pushfq and 9 registers + the index.
    let frame = 128 + 8 * (saved.len() as i64 + 2);
    out.push(Instruction::with2(Code::Mov_r64_rm64, RDX, RAX).map_err(bad)?);
    out.push(
        Instruction::with2(Code::And_rm64_imm32, RDX, (ring.records - 1) as i32).map_err(bad)?,
    );
    out.push(Instruction::with2(Code::Shl_rm64_imm8, RDX, RECORD.trailing_zeros()).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_r64_imm64, R9, ring.base).map_err(bad)?);
    out.push(Instruction::with2(Code::Add_r64_rm64, R9, RDX).map_err(bad)?);
    out.push(
        Instruction::with2(Code::Mov_rm32_imm32, mem(R9, REC_PROBE as i64), r.probe)
            .map_err(bad)?,
    );
    let sp = match r.sp {
        SpAt::Rsp(d) => mem(RSP, frame + d as i64),
        SpAt::Rbp(d) => mem(RBP, d as i64),
    };
    out.push(Instruction::with2(Code::Lea_r64_m, RAX, sp).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_rm64_r64, mem(R9, REC_SP as i64), RAX).map_err(bad)?);
    let syscall = |out: &mut Vec<Instruction>, nr: u32, a0: Option<u32>, a1: Option<usize>| {
        out.push(Instruction::with2(Code::Mov_r32_imm32, EAX, nr).map_err(bad)?);
        if let Some(a0) = a0 {
            out.push(Instruction::with2(Code::Mov_r32_imm32, EDI, a0).map_err(bad)?);
        }
        if let Some(off) = a1 {
            out.push(Instruction::with2(Code::Lea_r64_m, RSI, mem(R9, off as i64)).map_err(bad)?);
        }
        out.push(Instruction::with(Code::Syscall));
        Ok::<(), Refusal>(())
    };
    const SYS_GETTID: u32 = 186;
    const SYS_CLOCK_GETTIME: u32 = 228;
    const SYS_GETRUSAGE: u32 = 98;
    syscall(&mut out, SYS_GETTID, None, None)?;
    out.push(Instruction::with2(Code::Mov_rm32_r32, mem(R9, REC_TID as i64), EAX).map_err(bad)?);
    // CLOCK_MONOTONIC (1), CLOCK_THREAD_CPUTIME_ID (3), RUSAGE_THREAD (1).
    syscall(&mut out, SYS_CLOCK_GETTIME, Some(1), Some(REC_TIME))?;
    if r.cputime {
        syscall(&mut out, SYS_CLOCK_GETTIME, Some(3), Some(REC_CPUTIME))?;
    }
    if r.rusage {
        syscall(&mut out, SYS_GETRUSAGE, Some(1), Some(REC_RUSAGE))?;
    }
    // Committed: index + 1, written last (x86 keeps stores in order).
    out.push(Instruction::with1(Code::Pop_r64, RAX).map_err(bad)?);
    out.push(Instruction::with2(Code::Lea_r64_m, RAX, mem(RAX, 1)).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_rm64_r64, mem(R9, REC_COMMIT as i64), RAX).map_err(bad)?);
    for reg in saved.iter().rev() {
        out.push(Instruction::with1(Code::Pop_r64, *reg).map_err(bad)?);
    }
    out.push(Instruction::with(Code::Popfq));
    out.push(Instruction::with2(Code::Lea_r64_m, RSP, mem(RSP, 128)).map_err(bad)?);
    finish(out, patch, at)
}

/// The wait of a recording probe for room in the ring ([`RING_TAIL`]): with r9 the head's
/// address and rax (also on the stack's top) the record's index; changes r8, r10, rdx, rdi,
/// rsi, rcx, r11 and rax (put back). Its labels are the instruction pointers 1 to 3, which no
/// displaced instruction has (they come from code at its own address).
fn ring_wait(out: &mut Vec<Instruction>, ring: &Ring) -> Result<(), Refusal> {
    use Register::{EAX, EDX, ESI, R10, R10D, R8, R9, RAX, RDI, RDX, RSP};
    let bad = |_| Refusal::OutOfReach;
    let mem = |base: Register, d: i64| MemoryOperand::with_base_displ(base, d);
    const WAIT: u64 = 1;
    const NO_PROGRESS: u64 = 2;
    const ROOM: u64 = 3;
    const SYS_NANOSLEEP: u32 = 35;
    let labeled = |mut i: Instruction, ip: u64| {
        i.set_ip(ip);
        i
    };
    let shift = ring.records.trailing_zeros();
    let gave_up = mem(R9, RING_GAVE_UP as i64);
    // r10 = sleeps without progress, r8 = the count read as last seen.
    out.push(Instruction::with2(Code::Xor_r32_rm32, R10D, R10D).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_r64_rm64, R8, mem(R9, RING_TAIL as i64)).map_err(bad)?);
    // wait: room if superprof gave up being waited for, or (index - read) >> log2(records)
    // is 0.
    out.push(labeled(
        Instruction::with2(Code::Cmp_rm64_imm8, gave_up, 0).map_err(bad)?,
        WAIT,
    ));
    out.push(Instruction::with_branch(Code::Jne_rel32_64, ROOM).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_r64_rm64, RDX, RAX).map_err(bad)?);
    out.push(Instruction::with2(Code::Sub_r64_rm64, RDX, R8).map_err(bad)?);
    out.push(Instruction::with2(Code::Shr_rm64_imm8, RDX, shift).map_err(bad)?);
    out.push(Instruction::with_branch(Code::Je_rel32_64, ROOM).map_err(bad)?);
    // nanosleep(&{0, RING_WAIT_NS}, NULL), the timespec on the stack.
    out.push(Instruction::with1(Code::Pushq_imm32, RING_WAIT_NS as i32).map_err(bad)?);
    out.push(Instruction::with1(Code::Pushq_imm32, 0).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_r32_imm32, EAX, SYS_NANOSLEEP).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_r64_rm64, RDI, RSP).map_err(bad)?);
    out.push(Instruction::with2(Code::Xor_r32_rm32, ESI, ESI).map_err(bad)?);
    out.push(Instruction::with(Code::Syscall));
    out.push(Instruction::with2(Code::Lea_r64_m, RSP, mem(RSP, 16)).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_r64_rm64, RAX, mem(RSP, 0)).map_err(bad)?);
    // Progress: start counting again.
    out.push(Instruction::with2(Code::Mov_r64_rm64, RDX, mem(R9, RING_TAIL as i64)).map_err(bad)?);
    out.push(Instruction::with2(Code::Cmp_r64_rm64, RDX, R8).map_err(bad)?);
    out.push(Instruction::with_branch(Code::Je_rel32_64, NO_PROGRESS).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_r64_rm64, R8, RDX).map_err(bad)?);
    out.push(Instruction::with2(Code::Xor_r32_rm32, R10D, R10D).map_err(bad)?);
    out.push(Instruction::with_branch(Code::Jmp_rel32_64, WAIT).map_err(bad)?);
    out.push(labeled(
        Instruction::with2(Code::Add_rm64_imm8, R10, 1).map_err(bad)?,
        NO_PROGRESS,
    ));
    out.push(Instruction::with2(Code::Cmp_rm64_imm32, R10, RING_WAITS as i32).map_err(bad)?);
    out.push(Instruction::with_branch(Code::Jb_rel32_64, WAIT).map_err(bad)?);
    out.push(Instruction::with2(Code::Mov_rm64_imm32, gave_up, 1).map_err(bad)?);
    // room: (a nop to carry the label; EDX is free here)
    out.push(labeled(
        Instruction::with2(Code::Xor_r32_rm32, EDX, EDX).map_err(bad)?,
        ROOM,
    ));
    Ok(())
}

/// Appends the displaced instructions of `patch` to the trampoline's own `out` (a direct call
/// as a push of its return address and a jump), and the jump back; encodes it all at `at`.
fn finish(mut out: Vec<Instruction>, patch: &Patch, at: u64) -> Result<Vec<u8>, Refusal> {
    let bad = |_| Refusal::OutOfReach;
    let rsp = |d: i64| MemoryOperand::with_base_displ(Register::RSP, d);
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

/// The longest trampoline [`record_trampoline`] makes (a bound to reserve room with).
pub const MAX_RECORD_TRAMPOLINE: usize = 384;

/// x86_64's patches (this module's functions).
pub struct X86_64;

super::patcher_of_module!(X86_64);

#[cfg(test)]
mod quiet_head_tests {
    use super::quiet_head;

    #[test]
    fn a_probe_may_move_past_register_moves_not_past_the_stack_or_memory() {
        // mov %rdi,%rax; mov 0x10(%rip),%rcx; push %rbx; ...
        let code = [
            0x48, 0x89, 0xf8, 0x48, 0x8b, 0x0d, 0x10, 0, 0, 0, 0x53, 0x48, 0x8b, 0x07,
        ];
        assert_eq!(quiet_head(&code, 0x1000, 8), vec![0x1000, 0x1003, 0x100a]);
        // xor %eax,%eax; mov (%rdi),%rax: stops before the load.
        let code = [0x31, 0xc0, 0x48, 0x8b, 0x07, 0x53];
        assert_eq!(quiet_head(&code, 0x1000, 8), vec![0x1000, 0x1002]);
        // sub $0x18,%rsp first: only the entry.
        let code = [0x48, 0x83, 0xec, 0x18, 0x53];
        assert_eq!(quiet_head(&code, 0x1000, 8), vec![0x1000]);
        // test %rdi,%rdi; je: the jcc may be the probe point, nothing after it.
        let code = [0x48, 0x85, 0xff, 0x74, 0x05, 0x53];
        assert_eq!(quiet_head(&code, 0x1000, 8), vec![0x1000, 0x1003]);
        // lock addq $1,0x2bf3(%rip) (a function counting its own calls); lock incl (%rdi).
        let code = [
            0xf0, 0x48, 0x83, 0x05, 0xf3, 0x2b, 0, 0, 0x01, 0xf0, 0xff, 0x07, 0x53,
        ];
        assert_eq!(quiet_head(&code, 0x1000, 8), vec![0x1000, 0x1009]);
    }
}

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
    fn an_entry_trampoline_only_counts_relocates_and_jumps_back() {
        // movabs $imm,%rax (10): a function's first instruction, flags dead there.
        let code = [0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8, 0x48, 0x0f, 0xaf, 0xc7];
        let p = plan(&code, 0x40_1000, false, 0, true).unwrap();
        let t = entry_trampoline(&p, 0x40_8000, 0x40_9000).unwrap();
        let text = decode(&t, 0x40_8000);
        assert_eq!(text[0], "lock incq 0x409000 (rip-relative)");
        assert_eq!(text[1], "movabs $0x807060504030201,%rax");
        assert_eq!(text[2], "jmp 0x000000000040100A");
        assert_eq!(text.len(), 3, "nothing saved, no stack touched: {text:?}");
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
    fn a_recording_trampoline_keeps_every_register() {
        // mov 0x100(%rip),%rax at 0x401000 (7 bytes), probed.
        let code = [0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00];
        let p = plan(&code, 0x40_1000, true, 0, true).unwrap();
        let ring = Ring {
            head: 0x7f00_0000_0000,
            base: 0x7f00_0000_1000,
            records: 1024,
        };
        let r = Recording {
            probe: 7,
            sp: SpAt::Rsp(8),
            cputime: true,
            rusage: true,
        };
        let t = record_trampoline(&p, 0x50_0000, &ring, &r).unwrap();
        assert!(t.len() <= MAX_RECORD_TRAMPOLINE, "{}", t.len());
        let text = decode(&t, 0x50_0000);
        // Pushed, then popped in the reverse order, around four system calls.
        let pushes: Vec<&String> = text.iter().filter(|l| l.starts_with("push")).collect();
        let pops: Vec<&String> = text.iter().filter(|l| l.starts_with("pop")).collect();
        // flags, 9 registers, the index; the wait's timespec (taken off with a lea).
        assert_eq!(pushes.len(), 13, "{text:?}");
        assert_eq!(pops.len(), 11, "{text:?}");
        // gettid, two clock_gettime, getrusage, and the wait's nanosleep.
        assert_eq!(text.iter().filter(|l| *l == "syscall").count(), 5);
        // The wait: the ring's 1024 records are 2^10; superprof's count at head + 8, the
        // give-up word at head + 16; 500 sleeps of 100 µs.
        for want in [
            "mov 8(%r9),%r8",
            "cmpq $0,0x10(%r9)",
            "shr $0xA,%rdx",
            "push $0x186A0",
            "mov $0x23,%eax",
            "cmp $0x1F4,%r10",
            "movq $1,0x10(%r9)",
        ] {
            assert!(text.iter().any(|l| l == want), "{want} not in {text:?}");
        }
        assert!(text.iter().any(|l| l == "lock xadd %rax,(%r9)"), "{text:?}");
        assert!(text.iter().any(|l| l == "and $0x3FF,%rdx"), "{text:?}");
        assert!(text.iter().any(|l| l == "movl $7,8(%r9)"), "{text:?}");
        // The probe point's rsp + 8: 128 + 11 words + 8 above the trampoline's.
        assert!(text.iter().any(|l| l == "lea 0xE0(%rsp),%rax"), "{text:?}");
        let n = text.len();
        assert_eq!(text[n - 2], "mov 0x401107,%rax (rip-relative)");
        assert!(
            text[n - 1].starts_with("jmp 0x0000000000401007"),
            "{text:?}"
        );
        // Only what the events need.
        let r = Recording {
            cputime: false,
            rusage: false,
            ..r
        };
        let t = record_trampoline(&p, 0x50_0000, &ring, &r).unwrap();
        assert_eq!(
            decode(&t, 0x50_0000)
                .iter()
                .filter(|l| *l == "syscall")
                .count(),
            3 // gettid, clock_gettime, the wait's nanosleep
        );
    }

    #[test]
    fn the_stack_pointer_at_a_return_from_a_probe_before_it() {
        // add $0x18,%rsp; pop %rbx; pop %rbp; ret
        let code = [0x48, 0x83, 0xc4, 0x18, 0x5b, 0x5d, 0xc3];
        assert_eq!(sp_at(&code, 0x1000, 0x1006), Some(SpAt::Rsp(0x28)));
        assert_eq!(sp_at(&code, 0x1000, 0x1000), Some(SpAt::Rsp(0)));
        // Not on an instruction boundary.
        assert_eq!(sp_at(&code, 0x1000, 0x1005 - 2), None);
        // mov %rbx,%rax; leave; ret: rbp at the probe + 8.
        let code = [0x48, 0x89, 0xd8, 0xc9, 0xc3];
        assert_eq!(sp_at(&code, 0x1000, 0x1004), Some(SpAt::Rbp(8)));
        // lea 0x10(%rsp),%rsp; push %rax; pop %rcx
        let code = [0x48, 0x8d, 0x64, 0x24, 0x10, 0x50, 0x59, 0xc3];
        assert_eq!(sp_at(&code, 0x1000, 0x1007), Some(SpAt::Rsp(0x10)));
        // mov %rax,%rsp: unknown.
        let code = [0x48, 0x89, 0xc4, 0xc3];
        assert_eq!(sp_at(&code, 0x1000, 0x1003), None);
        // mov %rax,%rbp; leave: rbp changed before the leave.
        let code = [0x48, 0x89, 0xc5, 0xc9, 0xc3];
        assert_eq!(sp_at(&code, 0x1000, 0x1004), None);
    }

    #[test]
    fn a_block_too_short_for_a_jump_takes_a_short_one() {
        // mov %r8,%rax (3); ret (1): right before a branch target.
        let code = [0x4c, 0x89, 0xc0, 0xc3];
        assert_eq!(
            plan(&code, 0x120c, true, 0, true).unwrap_err(),
            Refusal::TooShort
        );
        let p = plan_for(&code, 0x120c, true, 0, true, SHORT_JUMP_LEN).unwrap();
        assert_eq!((p.at, p.len), (0x120c, 3));
        assert_eq!(short_jump(0x120c, 0x1217), Some([0xeb, 0x09]));
        assert_eq!(short_jump(0x1200, 0x1100), None);
        assert_eq!(short_jump(0x1200, 0x1182), Some([0xeb, 0x80]));
        // A lone ret (1 byte): not even that.
        assert_eq!(
            plan_for(&[0xc3], 0x1000, true, 0, true, SHORT_JUMP_LEN).unwrap_err(),
            Refusal::TooShort
        );
    }

    #[test]
    fn a_return_may_be_probed_before_instructions_that_cannot_fault() {
        // mov 0x2e99(%rip),%rax; add %rdi,%rax; mov %rax,0x2e8f(%rip); lea 0x1(%rdi),%rax;
        // pop %rbx; ret
        let code = [
            0x48, 0x8b, 0x05, 0x99, 0x2e, 0x00, 0x00, 0x48, 0x01, 0xf8, 0x48, 0x89, 0x05, 0x8f,
            0x2e, 0x00, 0x00, 0x48, 0x8d, 0x47, 0x01, 0x5b, 0xc3,
        ];
        // The ret, the pop, the lea, the store to the module's data, the add, the load.
        assert_eq!(
            quiet_tail(&code, 0x1180, 0x1196),
            [0x1196, 0x1195, 0x1191, 0x118a, 0x1187, 0x1180]
        );
        // decl %fs:-8 (a thread-local counter); ret: before it too. mov (%rdi),%rax: not.
        let code = [0x64, 0xff, 0x0c, 0x25, 0xf8, 0xff, 0xff, 0xff, 0xc3];
        assert_eq!(quiet_tail(&code, 0x1330, 0x1338), [0x1338, 0x1330]);
        let code = [0x48, 0x8b, 0x07, 0xc3];
        assert_eq!(quiet_tail(&code, 0x1000, 0x1003), [0x1003]);
        // A division may fault.
        let code = [0x48, 0xf7, 0xf1, 0xc3]; // div %rcx; ret
        assert_eq!(quiet_tail(&code, 0x1000, 0x1003), [0x1003]);
        // Not on an instruction boundary: nowhere.
        assert!(quiet_tail(&code, 0x1000, 0x1002).is_empty());
    }

    #[test]
    fn a_tail_jump_through_the_got() {
        // jmp *0x2e33(%rip); jmp *(%rdx,%rax,8); jmp *%rax
        assert!(jumps_through_slot(&[0xff, 0x25, 0x33, 0x2e, 0, 0], 0x1000));
        assert!(!jumps_through_slot(&[0xff, 0x24, 0xc2], 0x1000));
        assert!(!jumps_through_slot(&[0xff, 0xe0], 0x1000));
    }

    #[test]
    fn jumps_reach_two_gibibytes() {
        assert_eq!(jump(0x1000, 0x1005), Some([0xe9, 0, 0, 0, 0]));
        assert_eq!(jump(0x1000, 0x1000), Some([0xe9, 0xfb, 0xff, 0xff, 0xff]));
        assert!(jump(0x1000, 0x1_0000_1000).is_none());
    }
}
