//! Counting a basic block inside the program, AArch64: the x86_64 design of [`super::x86_64`]
//! with fixed 4-byte instructions. One instruction of the block is replaced by a `b` to a
//! trampoline (±128 MiB), which counts or records, runs the displaced instruction, relocated,
//! and branches back. Every instruction is as long as the branch, so there are no short blocks,
//! springboards or covered filler here.
//!
//! The trampoline keeps every register and the flags: Linux's AArch64 ABI has no red zone, so
//! it moves the stack pointer down before it saves its scratch registers there, and it uses no
//! instruction that sets the flags. It adds one to the counter with a load-exclusive /
//! store-exclusive loop (ARMv8.0 has no atomic add to memory).
//!
//! Relocation: `adr`/`adrp` become a load of their value from a literal, a literal load a load
//! of its address then of the data, a literal prefetch nothing, `b` a `b` from the trampoline,
//! `b.cond`/`cbz`/`cbnz`/`tbz`/`tbnz` the same condition over two branches (taken: to the
//! target; not: back), and `bl` a load of the original return address into x30 and a `b`, so
//! that the callee returns into the original code (never into a trampoline, which unwinders
//! could not follow). Refused: `blr` (its return address would be the trampoline's), a literal
//! load into a SIMD register, and an instruction between a load-exclusive and its
//! store-exclusive (the trampoline's own memory accesses would make the store fail forever).
//!
//! Landing pads stay where they are: a function's first `bti` or `paciasp` is never replaced
//! (an indirect call must land on it where the program runs with BTI); the instruction after
//! it is.

use super::{
    Recording, Refusal, Ring, SpAt, RECORD, REC_COMMIT, REC_CPUTIME, REC_PROBE, REC_RUSAGE, REC_SP,
    REC_TID, REC_TIME, RING_GAVE_UP, RING_TAIL, RING_WAITS, RING_WAIT_NS,
};

/// Bytes of the branch that replaces the displaced instruction.
pub const JUMP_LEN: u32 = 4;
/// No short jumps here: every instruction holds a branch.
pub const SHORT_JUMP_LEN: u32 = 4;

/// A planned patch: the instruction `insn` at `at` moves to a trampoline.
#[derive(Debug, Clone)]
pub struct Patch {
    /// The address of the displaced instruction, where the branch is written.
    pub at: u64,
    /// Bytes the branch covers: always 4.
    pub len: u32,
    insn: u32,
}

impl Patch {
    /// Whether the patch fires at every entry of a function starting at `start`: at its first
    /// instruction, or right after a landing pad there.
    pub fn at_entry_of(&self, start: u64) -> bool {
        self.at == start || self.at == start + 4
    }
}

fn word(code: &[u8], i: usize) -> Option<u32> {
    let b = code.get(i * 4..i * 4 + 4)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

/// `bti` (any) and `paciasp`/`pacibsp`: hints an indirect branch may land on.
fn landing_pad(insn: u32) -> bool {
    insn & 0xffff_ff3f == 0xd503_241f // bti, bti c, bti j, bti jc
        || insn == 0xd503_233f // paciasp
        || insn == 0xd503_237f // pacibsp
}

/// A store-exclusive (stxr, stlxr, stxp, stlxp) and a load-exclusive (ldxr, ldaxr, ldxp,
/// ldaxp).
fn store_exclusive(insn: u32) -> bool {
    insn & 0x3f80_0000 == 0x0800_0000 && insn & (1 << 22) == 0
}
fn load_exclusive(insn: u32) -> bool {
    insn & 0x3f80_0000 == 0x0800_0000 && insn & (1 << 22) != 0
}

/// Plans the patch that counts the block whose bytes `code` start at `start` (the same
/// arguments as [`super::x86_64::plan`]; `several` and `spare` do not matter here). `calls`: a
/// `bl` may be displaced (emulated; not with a guarded control stack).
pub fn plan(
    code: &[u8],
    start: u64,
    several: bool,
    spare: u32,
    calls: bool,
) -> Result<Patch, Refusal> {
    plan_for(code, start, several, spare, calls, JUMP_LEN)
}

/// [`plan`]; `need` is always one instruction here.
pub fn plan_for(
    code: &[u8],
    start: u64,
    _several: bool,
    _spare: u32,
    calls: bool,
    _need: u32,
) -> Result<Patch, Refusal> {
    if !start.is_multiple_of(4) {
        return Err(Refusal::Undecodable);
    }
    let first = word(code, 0).ok_or(Refusal::TooShort)?;
    let k = usize::from(landing_pad(first));
    let insn = word(code, k).ok_or(Refusal::TooShort)?;
    // Inside a load-exclusive / store-exclusive pair: a store-exclusive before any load one.
    for i in k.. {
        let Some(w) = word(code, i) else { break };
        if load_exclusive(w) {
            break;
        }
        if store_exclusive(w) {
            return Err(Refusal::Exclusive);
        }
    }
    // blr, blraa, blraaz, blrab, blrabz.
    if insn & 0xfe00_0000 == 0xd600_0000 && (insn >> 21) & 0xf == 1 {
        return Err(Refusal::Call);
    }
    if insn & 0xfc00_0000 == 0x9400_0000 && !calls {
        return Err(Refusal::Call);
    }
    // A literal load into a SIMD register.
    if insn & 0x3f00_0000 == 0x1c00_0000 {
        return Err(Refusal::Undecodable);
    }
    Ok(Patch {
        at: start + 4 * k as u64,
        len: JUMP_LEN,
        insn,
    })
}

/// Never: there are no short jumps on AArch64.
pub fn short_jump(_from: u64, _to: u64) -> Option<[u8; 4]> {
    None
}

/// The `b` from `from` to `to`, if `to` is in reach (±128 MiB).
pub fn jump(from: u64, to: u64) -> Option<[u8; 4]> {
    b(from, to).map(u32::to_le_bytes)
}

fn rel(from: u64, to: u64, bits: u32) -> Option<u32> {
    let off = (to as i64).wrapping_sub(from as i64);
    if off % 4 != 0 {
        return None;
    }
    let units = off >> 2;
    let lim = 1i64 << (bits - 1);
    (-lim..lim)
        .contains(&units)
        .then_some((units as u32) & ((1u32 << bits) - 1))
}

fn b(from: u64, to: u64) -> Option<u32> {
    Some(0x1400_0000 | rel(from, to, 26)?)
}

/// Encodings the trampolines use (64-bit forms; `n` 31 is sp where a base).
mod enc {
    pub fn stp_pre(t: u32, t2: u32, n: u32, imm: i32) -> u32 {
        0xa980_0000 | ((((imm / 8) as u32) & 0x7f) << 15) | (t2 << 10) | (n << 5) | t
    }
    pub fn stp(t: u32, t2: u32, n: u32, imm: i32) -> u32 {
        0xa900_0000 | ((((imm / 8) as u32) & 0x7f) << 15) | (t2 << 10) | (n << 5) | t
    }
    pub fn ldp(t: u32, t2: u32, n: u32, imm: i32) -> u32 {
        0xa940_0000 | ((((imm / 8) as u32) & 0x7f) << 15) | (t2 << 10) | (n << 5) | t
    }
    pub fn ldp_post(t: u32, t2: u32, n: u32, imm: i32) -> u32 {
        0xa8c0_0000 | ((((imm / 8) as u32) & 0x7f) << 15) | (t2 << 10) | (n << 5) | t
    }
    pub fn str(t: u32, n: u32, imm: u32) -> u32 {
        0xf900_0000 | ((imm / 8) << 10) | (n << 5) | t
    }
    pub fn ldr(t: u32, n: u32, imm: u32) -> u32 {
        0xf940_0000 | ((imm / 8) << 10) | (n << 5) | t
    }
    pub fn str_w(t: u32, n: u32, imm: u32) -> u32 {
        0xb900_0000 | ((imm / 4) << 10) | (n << 5) | t
    }
    pub fn ldr_w(t: u32, n: u32) -> u32 {
        0xb940_0000 | (n << 5) | t
    }
    pub fn ldrsw(t: u32, n: u32) -> u32 {
        0xb980_0000 | (n << 5) | t
    }
    pub fn ldxr(t: u32, n: u32) -> u32 {
        0xc85f_7c00 | (n << 5) | t
    }
    pub fn stxr(s: u32, t: u32, n: u32) -> u32 {
        0xc800_7c00 | (s << 16) | (n << 5) | t
    }
    pub fn stlr(t: u32, n: u32) -> u32 {
        0xc89f_fc00 | (n << 5) | t
    }
    pub fn add_imm(d: u32, n: u32, imm: u32) -> u32 {
        0x9100_0000 | (imm << 10) | (n << 5) | d
    }
    /// add xd, xn, xm, lsl #shift
    pub fn add_lsl(d: u32, n: u32, m: u32, shift: u32) -> u32 {
        0x8b00_0000 | (m << 16) | (shift << 10) | (n << 5) | d
    }
    /// and xd, xn, #(2^ones - 1)
    pub fn and_ones(d: u32, n: u32, ones: u32) -> u32 {
        0x9240_0000 | ((ones - 1) << 10) | (n << 5) | d
    }
    pub fn movz(d: u32, imm: u32, hw: u32) -> u32 {
        0xd280_0000 | (hw << 21) | ((imm & 0xffff) << 5) | d
    }
    pub fn movk(d: u32, imm: u32, hw: u32) -> u32 {
        0xf280_0000 | (hw << 21) | ((imm & 0xffff) << 5) | d
    }
    pub const SVC: u32 = 0xd400_0001;
    /// sub xd, xn, #imm (`n`, `d` 31: sp)
    pub fn sub_imm(d: u32, n: u32, imm: u32) -> u32 {
        0xd100_0000 | (imm << 10) | (n << 5) | d
    }
    /// sub xd, xn, xm
    pub fn sub_reg(d: u32, n: u32, m: u32) -> u32 {
        0xcb00_0000 | (m << 16) | (n << 5) | d
    }
    /// lsr xd, xn, #shift (ubfm xd, xn, #shift, #63)
    pub fn lsr(d: u32, n: u32, shift: u32) -> u32 {
        0xd340_fc00 | (shift << 16) | (n << 5) | d
    }
    /// cmp xn, #imm (subs xzr, xn, #imm)
    pub fn cmp_imm(n: u32, imm: u32) -> u32 {
        0xf100_001f | (imm << 10) | (n << 5)
    }
    /// cbz xt / cbnz xt, to an offset of `units` instructions
    pub fn cbz(t: u32, units: u32, nonzero: bool) -> u32 {
        (if nonzero { 0xb500_0000 } else { 0xb400_0000 }) | (units << 5) | t
    }
    /// b.lo (unsigned lower), to an offset of `units` instructions
    pub fn b_lo(units: u32) -> u32 {
        0x5400_0003 | (units << 5)
    }
}

/// A trampoline being written: instructions, then 8-byte literals after them.
struct Tramp {
    at: u64,
    insns: Vec<u32>,
    /// (instruction index, literal index): a `ldr` literal whose offset is set at the end.
    fixups: Vec<(usize, usize, u32)>,
    literals: Vec<u64>,
}

impl Tramp {
    fn new(at: u64) -> Tramp {
        Tramp {
            at,
            insns: Vec::new(),
            fixups: Vec::new(),
            literals: Vec::new(),
        }
    }
    fn here(&self) -> u64 {
        self.at + 4 * self.insns.len() as u64
    }
    fn push(&mut self, w: u32) {
        self.insns.push(w);
    }
    /// `ldr xt, =value` (64-bit literal load).
    fn load(&mut self, t: u32, value: u64) {
        self.fixups
            .push((self.insns.len(), self.literals.len(), 0x5800_0000 | t));
        self.literals.push(value);
        self.insns.push(0);
    }
    fn branch(&mut self, to: u64) -> Result<(), Refusal> {
        let w = b(self.here(), to).ok_or(Refusal::OutOfReach)?;
        self.push(w);
        Ok(())
    }
    /// The bytes: instructions, the literals 8-byte aligned after them.
    fn finish(mut self) -> Result<Vec<u8>, Refusal> {
        let mut lit_at = self.here();
        if !lit_at.is_multiple_of(8) {
            self.push(0xd503_201f); // nop
            lit_at += 4;
        }
        for &(i, l, base) in &self.fixups {
            let from = self.at + 4 * i as u64;
            let to = lit_at + 8 * l as u64;
            self.insns[i] = base | (rel(from, to, 19).ok_or(Refusal::OutOfReach)? << 5);
        }
        let mut out: Vec<u8> = self.insns.iter().flat_map(|w| w.to_le_bytes()).collect();
        for l in &self.literals {
            out.extend_from_slice(&l.to_le_bytes());
        }
        Ok(out)
    }
}

fn sext(v: u32, bits: u32) -> i64 {
    ((v as i64) << (64 - bits)) >> (64 - bits)
}

/// Appends the displaced instruction of `p`, relocated, and the branch back.
fn displaced(t: &mut Tramp, p: &Patch) -> Result<(), Refusal> {
    let (w, pc) = (p.insn, p.at);
    let back = pc + 4;
    let target = |off: i64| pc.wrapping_add((off * 4) as u64);
    if w & 0x7c00_0000 == 0x1400_0000 {
        // b, bl
        let to = target(sext(w & 0x03ff_ffff, 26));
        if w & 0x8000_0000 != 0 {
            t.load(30, back);
        }
        return t.branch(to);
    }
    let cond_like = w & 0xff00_0000 == 0x5400_0000 // b.cond, bc.cond
        || w & 0x7e00_0000 == 0x3400_0000 // cbz, cbnz
        || w & 0x7e00_0000 == 0x3600_0000; // tbz, tbnz
    if cond_like {
        let (to, rewritten) = if w & 0x7e00_0000 == 0x3600_0000 {
            // tbz/tbnz: imm14 at bits 5..19.
            let to = target(sext((w >> 5) & 0x3fff, 14));
            (to, (w & !(0x3fff << 5)) | (2 << 5))
        } else {
            let to = target(sext((w >> 5) & 0x7_ffff, 19));
            (to, (w & !(0x7_ffff << 5)) | (2 << 5))
        };
        // cond: +8 (taken); b back; b target
        t.push(rewritten);
        t.branch(back)?;
        return t.branch(to);
    }
    if w & 0x1f00_0000 == 0x1000_0000 {
        // adr, adrp
        let d = w & 31;
        let imm = sext(((w >> 5) & 0x7_ffff) << 2 | ((w >> 29) & 3), 21);
        let value = if w & 0x8000_0000 != 0 {
            (pc & !0xfff).wrapping_add((imm << 12) as u64)
        } else {
            pc.wrapping_add(imm as u64)
        };
        if d != 31 {
            t.load(d, value);
        }
        return t.branch(back);
    }
    if w & 0x3b00_0000 == 0x1800_0000 {
        // ldr wt/xt literal, ldrsw literal, prfm literal (bit 26: SIMD, refused in plan).
        let rt = w & 31;
        let addr = target(sext((w >> 5) & 0x7_ffff, 19));
        match w >> 30 {
            3 => {} // prfm: a hint, dropped
            _ if rt == 31 => return Err(Refusal::Undecodable),
            0 => {
                t.load(rt, addr);
                t.push(enc::ldr_w(rt, rt));
            }
            1 => {
                t.load(rt, addr);
                t.push(enc::ldr(rt, rt, 0));
            }
            _ => {
                t.load(rt, addr);
                t.push(enc::ldrsw(rt, rt));
            }
        }
        return t.branch(back);
    }
    t.push(w);
    t.branch(back)
}

/// [`trampoline`], at a function's entry too (x16 and x17, the registers it saves, are free
/// there by the AAPCS64, but a `bti c` first instruction stays before the patch: the same
/// trampoline).
pub fn entry_trampoline(patch: &Patch, at: u64, counter: u64) -> Result<Vec<u8>, Refusal> {
    trampoline(patch, at, counter)
}

/// The trampoline of `patch` placed at `at`, counting into the 8-byte counter at `counter`.
pub fn trampoline(patch: &Patch, at: u64, counter: u64) -> Result<Vec<u8>, Refusal> {
    use enc::*;
    let mut t = Tramp::new(at);
    t.push(stp_pre(16, 17, 31, -32));
    t.push(str(15, 31, 16));
    t.load(16, counter);
    let lp = t.here();
    t.push(ldxr(17, 16));
    t.push(add_imm(17, 17, 1));
    t.push(stxr(15, 17, 16));
    let cbnz = 0x3500_0000 | (rel(t.here(), lp, 19).ok_or(Refusal::OutOfReach)? << 5) | 15;
    t.push(cbnz);
    t.push(ldr(15, 31, 16));
    t.push(ldp_post(16, 17, 31, 32));
    displaced(&mut t, patch)?;
    t.finish()
}

/// The trampoline of `patch` placed at `at` that writes one record into `ring` each time the
/// probe point runs (as [`super::x86_64::record_trampoline`]: a record taken by an exclusive
/// add to the ring's head, filled through gettid, clock_gettime and getrusage, committed last
/// with a store-release), then runs the displaced instruction. The stack pointer recorded is
/// the probe point's (AArch64's calls push nothing: a function's entry and its `ret` see the
/// same one).
pub fn record_trampoline(
    patch: &Patch,
    at: u64,
    ring: &Ring,
    r: &Recording,
) -> Result<Vec<u8>, Refusal> {
    use enc::*;
    if !ring.records.is_power_of_two() || ring.records > 1 << 24 || ring.records < 2 {
        return Err(Refusal::OutOfReach);
    }
    let SpAt::Rsp(sp_delta) = r.sp else {
        return Err(Refusal::OutOfReach);
    };
    let frame: i64 = 96;
    let sp_off = u32::try_from(frame + sp_delta as i64).map_err(|_| Refusal::OutOfReach)?;
    if sp_off >= 4096 {
        return Err(Refusal::OutOfReach);
    }
    let mut t = Tramp::new(at);
    t.push(stp_pre(0, 1, 31, -(frame as i32)));
    t.push(stp(2, 3, 31, 16));
    t.push(stp(4, 5, 31, 32));
    t.push(stp(8, 9, 31, 48));
    t.push(stp(10, 11, 31, 64));
    // x11 = head++ (exclusive loop), x9 = base + (x11 % records) * RECORD.
    t.load(10, ring.head);
    let lp = t.here();
    t.push(ldxr(11, 10));
    t.push(add_imm(9, 11, 1));
    t.push(stxr(0, 9, 10));
    let cbnz = 0x3500_0000 | (rel(t.here(), lp, 19).ok_or(Refusal::OutOfReach)? << 5);
    t.push(cbnz);
    ring_wait(&mut t, ring)?;
    t.push(and_ones(9, 11, ring.records.trailing_zeros()));
    t.load(10, ring.base);
    t.push(add_lsl(9, 10, 9, RECORD.trailing_zeros()));
    t.push(movz(10, r.probe, 0));
    t.push(movk(10, r.probe >> 16, 1));
    t.push(str_w(10, 9, REC_PROBE as u32));
    t.push(add_imm(10, 31, sp_off));
    t.push(str(10, 9, REC_SP as u32));
    const SYS_GETTID: u32 = 178;
    const SYS_CLOCK_GETTIME: u32 = 113;
    const SYS_GETRUSAGE: u32 = 165;
    t.push(movz(8, SYS_GETTID, 0));
    t.push(SVC);
    t.push(str_w(0, 9, REC_TID as u32));
    let call = |t: &mut Tramp, nr: u32, a0: u32, off: usize| {
        t.push(movz(8, nr, 0));
        t.push(movz(0, a0, 0));
        t.push(add_imm(1, 9, off as u32));
        t.push(SVC);
    };
    // CLOCK_MONOTONIC (1), CLOCK_THREAD_CPUTIME_ID (3), RUSAGE_THREAD (1).
    call(&mut t, SYS_CLOCK_GETTIME, 1, REC_TIME);
    if r.cputime {
        call(&mut t, SYS_CLOCK_GETTIME, 3, REC_CPUTIME);
    }
    if r.rusage {
        call(&mut t, SYS_GETRUSAGE, 1, REC_RUSAGE);
    }
    // Committed: index + 1, stored with release (after everything the record holds).
    t.push(add_imm(10, 11, 1));
    t.push(add_imm(11, 9, REC_COMMIT as u32));
    t.push(stlr(10, 11));
    t.push(ldp(10, 11, 31, 64));
    t.push(ldp(8, 9, 31, 48));
    t.push(ldp(4, 5, 31, 32));
    t.push(ldp(2, 3, 31, 16));
    t.push(ldp_post(0, 1, 31, frame as i32));
    displaced(&mut t, patch)?;
    t.finish()
}

/// The wait of a recording probe for room in the ring (see [`RING_TAIL`]): x10 the head's
/// address, x11 the record's index; changes x0, x1, x3, x4, x5 and x8 (which the trampoline
/// saved).
fn ring_wait(t: &mut Tramp, ring: &Ring) -> Result<(), Refusal> {
    use enc::*;
    const SYS_NANOSLEEP: u32 = 101;
    let units = |t: &Tramp, from: usize, to: u64| {
        rel(t.at + 4 * from as u64, to, 19).ok_or(Refusal::OutOfReach)
    };
    // x3 = sleeps without progress, x4 = the count read as last seen.
    t.push(movz(3, 0, 0));
    t.push(ldr(4, 10, RING_TAIL as u32));
    let wait = t.here();
    // Room if superprof gave up being waited for, or (index - read) >> log2(records) is 0.
    t.push(ldr(5, 10, RING_GAVE_UP as u32));
    let gave_up = t.insns.len();
    t.push(0);
    t.push(sub_reg(5, 11, 4));
    t.push(lsr(5, 5, ring.records.trailing_zeros()));
    let has_room = t.insns.len();
    t.push(0);
    // nanosleep(&{0, RING_WAIT_NS}, NULL), the timespec on the stack.
    t.push(sub_imm(31, 31, 16));
    t.push(movz(1, RING_WAIT_NS & 0xffff, 0));
    t.push(movk(1, RING_WAIT_NS >> 16, 1));
    t.push(stp(31, 1, 31, 0));
    t.push(add_imm(0, 31, 0));
    t.push(movz(1, 0, 0));
    t.push(movz(8, SYS_NANOSLEEP, 0));
    t.push(SVC);
    t.push(add_imm(31, 31, 16));
    // Progress: start counting again.
    t.push(ldr(5, 10, RING_TAIL as u32));
    t.push(sub_reg(0, 5, 4));
    let stalled = t.insns.len();
    t.push(0);
    t.push(add_imm(4, 5, 0));
    t.push(movz(3, 0, 0));
    t.branch(wait)?;
    let no_progress = t.here();
    t.push(add_imm(3, 3, 1));
    t.push(cmp_imm(3, RING_WAITS));
    let back = units(t, t.insns.len(), wait)?;
    t.push(b_lo(back));
    t.push(movz(5, 1, 0));
    t.push(str(5, 10, RING_GAVE_UP as u32));
    let room = t.here();
    t.insns[gave_up] = cbz(5, units(t, gave_up, room)?, true);
    t.insns[has_room] = cbz(5, units(t, has_room, room)?, false);
    t.insns[stalled] = cbz(0, units(t, stalled, no_progress)?, false);
    Ok(())
}

/// Where a recording probe finds the stack pointer the instruction at `to` runs with, from a
/// probe at `from`: only at `to` itself here (every instruction holds the branch).
pub fn sp_at(_code: &[u8], from: u64, to: u64) -> Option<SpAt> {
    (from == to).then_some(SpAt::Rsp(0))
}

/// Where a probe may stand before the instruction at `to`: at it (see [`sp_at`]).
pub fn quiet_tail(_code: &[u8], _from: u64, to: u64) -> Vec<u64> {
    vec![to]
}

/// Whether the indirect branch at the start of `code` leaves the function (x86_64's `jmp
/// *disp(%rip)`): on AArch64 a `br` (or `braa`, `braaz`...) through x16 or x17, which compilers
/// keep for indirect tail calls (those are the registers a BTI `bti c` landing pad accepts a
/// `br` from); a jump table's dispatch uses another register and lands on `bti j`.
pub fn jumps_through_slot(code: &[u8], _addr: u64) -> bool {
    let Some(insn) = word(code, 0) else {
        return false;
    };
    let br = insn & 0xffff_fc1f == 0xd61f_0000 // br
        || insn & 0xfeff_f800 == 0xd61f_0800; // braa, brab, braaz, brabz
    br && matches!((insn >> 5) & 31, 16 | 17)
}

/// The longest trampoline [`trampoline`] makes: 10 instructions, 4 of relocation, a nop,
/// 3 literals.
pub const MAX_TRAMPOLINE: usize = 96;

/// The longest trampoline [`record_trampoline`] makes.
pub const MAX_RECORD_TRAMPOLINE: usize = 384;

/// AArch64's patches (this module's functions).
pub struct Aarch64;

super::patcher_of_module!(Aarch64);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arch, Isa};

    /// The instructions of `bytes` at `at`, disassembled (literals after them too).
    fn asm(bytes: &[u8], at: u64) -> Vec<String> {
        bytes
            .chunks(4)
            .enumerate()
            .map(|(i, c)| {
                Arch::Aarch64
                    .disassemble(c, at + 4 * i as u64)
                    .map(|(s, _)| s)
                    .unwrap_or_else(|| "?".to_owned())
            })
            .collect()
    }

    fn plan1(insn: u32, at: u64) -> Patch {
        plan(&insn.to_le_bytes(), at, true, 0, true).unwrap()
    }

    #[test]
    fn the_branch_reaches_128_mib() {
        assert_eq!(jump(0x1000, 0x2000), Some(0x1400_0400u32.to_le_bytes()));
        assert_eq!(jump(0x2000, 0x1000), Some(0x17ff_fc00u32.to_le_bytes()));
        assert!(jump(0x1000_0000, 0x1000_0000 + (128 << 20)).is_none());
        assert!(jump(0x1000_0000, 0x1000_0000 + (128 << 20) - 4).is_some());
    }

    #[test]
    fn counting_trampoline_keeps_registers_and_flags() {
        // add x0, x0, #1 at 0x40_0000; trampoline at 0x50_0000.
        let p = plan1(0x9100_0400, 0x40_0000);
        let t = trampoline(&p, 0x50_0000, 0x60_0000).unwrap();
        let text = asm(&t, 0x50_0000).join("; ");
        for want in [
            "stp x16, x17, [sp, #-0x20]!",
            "str x15, [sp, #0x10]",
            "ldxr x17, [x16]",
            "add x17, x17, #0x1",
            "stxr w15, x17, [x16]",
            "ldr x15, [sp, #0x10]",
            "ldp x16, x17, [sp], #0x20",
            "add x0, x0, #0x1",
        ] {
            assert!(text.contains(want), "{want} not in {text}");
        }
        assert!(text.contains("cbnz w15, $-0xc"), "{text}");
        // The branch back, and the counter's address as a literal.
        assert!(text.contains("b $-0x100024"), "{text}");
        assert_eq!(&t[t.len() - 8..], &0x60_0000u64.to_le_bytes());
        assert!(t.len() <= MAX_TRAMPOLINE);
    }

    #[test]
    #[allow(clippy::identity_op)] // `0 << 29`: the adrp's immlo field, spelled out
    fn pc_relative_instructions_are_relocated() {
        let pc = 0x40_1004;
        let at = 0x80_0000;
        // adrp x1, +1 page -> ldr x1, =0x402000
        let t = trampoline(&plan1(0xb000_0001 | (0 << 29), pc), at, 0x90_0000).unwrap();
        let lits: Vec<u64> = t
            .chunks(8)
            .rev()
            .take(2)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(lits.contains(&0x40_2000), "{lits:x?}");
        // bl +0x100: x30 = pc + 4, then b pc + 0x100.
        let t = trampoline(&plan1(0x9400_0040, pc), at, 0x90_0000).unwrap();
        let text = asm(&t, at).join("; ");
        assert!(text.contains("ldr x30"), "{text}");
        let lits: Vec<u64> = t[t.len() - 16..]
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(lits.contains(&(pc + 4)), "{lits:x?}");
        // cbz x3, +0x20: cbz to +8, b back, b target.
        let t = trampoline(&plan1(0xb400_0103, pc), at, 0x90_0000).unwrap();
        let words: Vec<u32> = t
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let k = words
            .iter()
            .position(|&w| w == 0xb400_0043)
            .expect("cbz x3, +8");
        let here = at + 4 * k as u64;
        assert_eq!(words[k + 1], b(here + 4, pc + 4).unwrap());
        assert_eq!(words[k + 2], b(here + 8, pc + 0x20).unwrap());
        // ldr x2, literal at pc + 0x40: ldr x2, =addr; ldr x2, [x2].
        let t = trampoline(&plan1(0x5800_0202, pc), at, 0x90_0000).unwrap();
        let text = asm(&t, at).join("; ");
        assert!(text.contains("ldr x2, [x2]"), "{text}");
    }

    #[test]
    fn refusals() {
        let one = |w: u32| plan(&w.to_le_bytes(), 0x1000, true, 0, true).map(|_| ());
        assert_eq!(one(0xd63f_0020), Err(Refusal::Call)); // blr x1
        assert_eq!(one(0x1c00_0040), Err(Refusal::Undecodable)); // ldr s0, literal
        assert_eq!(
            plan(&0x9400_0040u32.to_le_bytes(), 0x1000, true, 0, false).map(|_| ()),
            Err(Refusal::Call)
        );
        // stlxr w3, w1, [x0]; cbnz w3, back: inside a pair.
        let code: Vec<u8> = [0x8803_fc01u32, 0x35ff_ffe3]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(
            plan(&code, 0x1000, true, 0, true).map(|_| ()),
            Err(Refusal::Exclusive)
        );
        // ldaxr w1, [x0] ... stlxr: the block starts the pair: fine.
        let code: Vec<u8> = [0x885f_fc01u32, 0x8803_fc01]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert!(plan(&code, 0x1000, true, 0, true).is_ok());
    }

    #[test]
    fn indirect_tail_calls_go_through_x16_or_x17() {
        let one = |w: u32| jumps_through_slot(&w.to_le_bytes(), 0);
        assert!(one(0xd61f_0200)); // br x16
        assert!(one(0xd61f_0220)); // br x17
        assert!(one(0xd61f_0a1f)); // braaz x16
        assert!(!one(0xd61f_0020)); // br x1: a jump table's
        assert!(!one(0xd65f_03c0)); // ret
    }

    #[test]
    fn a_landing_pad_stays() {
        // bti c; add x0, x0, #1
        let code: Vec<u8> = [0xd503_245fu32, 0x9100_0400]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let p = plan(&code, 0x1000, true, 0, true).unwrap();
        assert_eq!(p.at, 0x1004);
        assert!(p.at_entry_of(0x1000));
        // paciasp alone: nothing after it in the block.
        assert_eq!(
            plan(&0xd503_233fu32.to_le_bytes(), 0x1000, true, 0, true).map(|_| ()),
            Err(Refusal::TooShort)
        );
    }

    #[test]
    fn recording_trampoline_commits_last_with_release() {
        let p = plan1(0xd65f_03c0, 0x40_0000); // ret
        let ring = Ring {
            head: 0x7000_0000,
            base: 0x7000_1000,
            records: 1 << 16,
        };
        let rec = Recording {
            probe: 0x12345,
            sp: SpAt::Rsp(0),
            cputime: true,
            rusage: true,
        };
        let t = record_trampoline(&p, 0x50_0000, &ring, &rec).unwrap();
        assert!(t.len() <= MAX_RECORD_TRAMPOLINE, "{}", t.len());
        let text = asm(&t, 0x50_0000);
        let joined = text.join("; ");
        for want in [
            "stp x0, x1, [sp, #-0x60]!",
            "and x9, x11, #0xffff",
            "add x9, x10, x9, lsl #8",
            "mov x10, #0x2345",
            "movk x10, #0x1, lsl #16",
            "add x10, sp, #0x60",
            "mov x8, #0xb2",
            "mov x8, #0x71",
            "mov x8, #0xa5",
            "stlr x10, [x11]",
            "ldp x0, x1, [sp], #0x60",
            "ret",
        ] {
            assert!(joined.contains(want), "{want} not in {joined}");
        }
        // gettid, 2 clock_gettime, getrusage, and the wait's nanosleep.
        assert_eq!(
            text.iter().filter(|s| s.starts_with("svc")).count(),
            5,
            "{joined}"
        );
        let stlr = text.iter().position(|s| s.starts_with("stlr")).unwrap();
        let last_svc = text.iter().rposition(|s| s.starts_with("svc")).unwrap();
        assert!(stlr > last_svc);
    }
}
