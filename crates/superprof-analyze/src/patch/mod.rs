//! Counting a basic block inside the program: one instruction (or a few) replaced by a jump
//! to a trampoline that counts, or records, runs what it displaced, relocated, and jumps back.
//! One [`Patcher`] per architecture ([`x86_64`], [`aarch64`]; [`Host`] is this machine's),
//! sharing what the program and superprof agree on: why a block is refused ([`Refusal`]), the
//! ring of records a recording probe writes ([`Ring`], [`Recording`], the record's layout).

pub mod aarch64;
pub mod x86_64;

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
    /// Between a load-exclusive and its store-exclusive (AArch64), where the trampoline's own
    /// memory accesses would make the store fail every time.
    Exclusive,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::TooShort => "too short for a jump",
            Refusal::Undecodable => "does not decode",
            Refusal::Call => "a call would be displaced",
            Refusal::OutOfReach => "its relocated code cannot reach its targets",
            Refusal::Exclusive => "it is inside a load-exclusive/store-exclusive sequence",
        })
    }
}

/// Where a recording probe finds the stack pointer to record: the probe point's own plus a
/// delta, or rbp plus a delta (a probe before a `leave`), so that it is the one the probed
/// instruction will have (a function's return, a few pops after the probe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpAt {
    /// rsp at the probe point plus this many bytes.
    Rsp(i32),
    /// rbp at the probe point plus this many bytes (the instruction runs after a `leave`).
    Rbp(i32),
}

/// A ring of records in the program's memory, written by recording probes
/// ([`Patcher::record_trampoline`]) and read by superprof.
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    /// The 8-byte count of records ever taken (the next record's index).
    pub head: u64,
    /// The first record; `records` of them (a power of two), [`RECORD`] bytes each.
    pub base: u64,
    /// How many records the ring holds: a power of two, at most 2^24.
    pub records: u64,
}

/// What one recording probe writes: its number, the stack pointer, and what it reads.
#[derive(Debug, Clone, Copy)]
pub struct Recording {
    /// The probe's number, written into each record (`REC_PROBE`).
    pub probe: u32,
    /// Where the stack pointer that the record keeps (`REC_SP`) is found.
    pub sp: SpAt,
    /// CLOCK_THREAD_CPUTIME_ID (task-clock).
    pub cputime: bool,
    /// getrusage(RUSAGE_THREAD) (page faults, context switches).
    pub rusage: bool,
}

/// One record's size and layout: `commit` (its index + 1, written last), probe (u32), tid
/// (u32), sp, CLOCK_MONOTONIC (timespec), CLOCK_THREAD_CPUTIME_ID (timespec), a struct rusage.
pub const RECORD: u64 = 256;
/// Offset in a record of `commit` (u64): the record's index plus one, written last; any other
/// value means the record is still being written or a later lap overwrote it.
pub const REC_COMMIT: usize = 0;
/// Offset in a record of the probe's number (u32).
pub const REC_PROBE: usize = 8;
/// Offset in a record of the thread's id (u32, from gettid).
pub const REC_TID: usize = 12;
/// Offset in a record of the stack pointer (u64) given by [`Recording::sp`].
pub const REC_SP: usize = 16;
/// Offset in a record of the CLOCK_MONOTONIC time (a `struct timespec`, 16 bytes).
pub const REC_TIME: usize = 24;
/// Offset in a record of the thread's CPU time (CLOCK_THREAD_CPUTIME_ID, a `struct timespec`),
/// where [`Recording::cputime`] asks for it.
pub const REC_CPUTIME: usize = 40;
/// Offset in a record of the thread's `struct rusage` (RUSAGE_THREAD), where
/// [`Recording::rusage`] asks for it.
pub const REC_RUSAGE: usize = 56;

/// Offset from [`Ring::head`] of the count of records superprof has read (it writes it), and
/// of the word a probe sets when it gave up waiting for that count to move (superprof clears
/// it): a probe whose record would overwrite one not yet read waits, in sleeps of
/// [`RING_WAIT_NS`], for up to [`RING_WAITS`] sleeps without progress; then it and every probe
/// after it write on (the records overwritten are counted lost by superprof, which then says
/// its counts are not exact) until superprof reads again. A superprof that is stopped or gone
/// so costs the program one wait, not one per call.
pub const RING_TAIL: usize = 8;
/// See [`RING_TAIL`].
pub const RING_GAVE_UP: usize = 16;
/// The sleep of a probe waiting for room in the ring (nanoseconds).
pub const RING_WAIT_NS: u32 = 100_000;
/// Sleeps without progress after which a waiting probe gives up (50 ms).
pub const RING_WAITS: u32 = 500;

/// One architecture's patches: how a block is planned, the jumps that reach its trampoline,
/// the trampolines that count or record, and what the recording probes need to know of the
/// code around them. Every function is the architecture's own (see [`x86_64`] and
/// [`aarch64`] for the designs).
pub trait Patcher {
    /// A planned patch.
    type Patch: PatchSite;
    /// Bytes of the jump that replaces the displaced instructions.
    const JUMP_LEN: u32;
    /// Bytes of the short jump to a springboard (as long as [`Patcher::JUMP_LEN`] where there
    /// is none).
    const SHORT_JUMP_LEN: u32;
    /// The longest trampoline [`Patcher::trampoline`] makes (a bound to reserve room with).
    const MAX_TRAMPOLINE: usize;
    /// The longest trampoline [`Patcher::record_trampoline`] makes.
    const MAX_RECORD_TRAMPOLINE: usize;

    /// Plans the patch that counts the block whose bytes `code` start at `start` (`several`:
    /// its first instructions may be displaced together; `spare`: filler after it the jump may
    /// cover; `calls`: a direct call may be displaced).
    fn plan(
        code: &[u8],
        start: u64,
        several: bool,
        spare: u32,
        calls: bool,
    ) -> Result<Self::Patch, Refusal>;
    /// [`Patcher::plan`] for a jump of `need` bytes.
    fn plan_for(
        code: &[u8],
        start: u64,
        several: bool,
        spare: u32,
        calls: bool,
        need: u32,
    ) -> Result<Self::Patch, Refusal>;
    /// The short jump from `from` to a springboard at `to`, if in reach (never where there is
    /// none).
    fn short_jump(from: u64, to: u64) -> Option<Vec<u8>>;
    /// The jump from `from` to `to`, if in reach.
    fn jump(from: u64, to: u64) -> Option<Vec<u8>>;
    /// The counting trampoline of `patch` placed at `at`, counting into the 8-byte counter at
    /// `counter`.
    fn trampoline(patch: &Self::Patch, at: u64, counter: u64) -> Result<Vec<u8>, Refusal>;
    /// [`Patcher::trampoline`] for a patch at the very entry of a function that calls (and
    /// tail calls) reach: the ABI leaves the flags undefined there, so the counter's increment
    /// need not keep them (x86_64: the increment and the displaced instructions, nothing
    /// else; elsewhere the same as `trampoline`).
    fn entry_trampoline(patch: &Self::Patch, at: u64, counter: u64) -> Result<Vec<u8>, Refusal>;
    /// The recording trampoline of `patch` placed at `at`: one record into `ring` a hit.
    fn record_trampoline(
        patch: &Self::Patch,
        at: u64,
        ring: &Ring,
        r: &Recording,
    ) -> Result<Vec<u8>, Refusal>;
    /// The stack pointer the instruction at `to` will run with, from a probe at `from`.
    fn sp_at(code: &[u8], from: u64, to: u64) -> Option<SpAt>;
    /// Where a probe may stand before the instruction at `to` (a function's return) and still
    /// see the call as it ends: instruction starts of `code` (straight code from `from`) after
    /// which nothing can fault up to `to`, latest first, `to` itself first of all.
    fn quiet_tail(code: &[u8], from: u64, to: u64) -> Vec<u64>;
    /// Whether the instruction at the start of `code` (at `addr`) is an indirect jump through
    /// a slot in memory (through the GOT: a call's tail to another function).
    fn jumps_through_slot(code: &[u8], addr: u64) -> bool;
}

/// The [`Patcher`] (and its patch's [`PatchSite`]) of an architecture's module, whose own
/// `Patch`, constants and free functions (`plan`, `plan_for`, `short_jump`, `jump`,
/// `trampoline`, `record_trampoline`, `sp_at`, `quiet_tail`, `jumps_through_slot`) are the
/// design: the delegation written once, for `x86_64` and `aarch64` alike.
macro_rules! patcher_of_module {
    ($arch:ident) => {
        impl super::PatchSite for Patch {
            fn at(&self) -> u64 {
                self.at
            }
            fn covers(&self) -> u32 {
                self.len
            }
            fn at_entry_of(&self, start: u64) -> bool {
                Patch::at_entry_of(self, start)
            }
        }

        impl super::Patcher for $arch {
            type Patch = Patch;
            const JUMP_LEN: u32 = JUMP_LEN;
            const SHORT_JUMP_LEN: u32 = SHORT_JUMP_LEN;
            const MAX_TRAMPOLINE: usize = MAX_TRAMPOLINE;
            const MAX_RECORD_TRAMPOLINE: usize = MAX_RECORD_TRAMPOLINE;
            fn plan(
                code: &[u8],
                start: u64,
                several: bool,
                spare: u32,
                calls: bool,
            ) -> Result<Patch, Refusal> {
                plan(code, start, several, spare, calls)
            }
            fn plan_for(
                code: &[u8],
                start: u64,
                several: bool,
                spare: u32,
                calls: bool,
                need: u32,
            ) -> Result<Patch, Refusal> {
                plan_for(code, start, several, spare, calls, need)
            }
            fn short_jump(from: u64, to: u64) -> Option<Vec<u8>> {
                short_jump(from, to).map(|b| b.to_vec())
            }
            fn jump(from: u64, to: u64) -> Option<Vec<u8>> {
                jump(from, to).map(|b| b.to_vec())
            }
            fn trampoline(patch: &Patch, at: u64, counter: u64) -> Result<Vec<u8>, Refusal> {
                trampoline(patch, at, counter)
            }
            fn entry_trampoline(patch: &Patch, at: u64, counter: u64) -> Result<Vec<u8>, Refusal> {
                entry_trampoline(patch, at, counter)
            }
            fn record_trampoline(
                patch: &Patch,
                at: u64,
                ring: &Ring,
                r: &Recording,
            ) -> Result<Vec<u8>, Refusal> {
                record_trampoline(patch, at, ring, r)
            }
            fn sp_at(code: &[u8], from: u64, to: u64) -> Option<SpAt> {
                sp_at(code, from, to)
            }
            fn quiet_tail(code: &[u8], from: u64, to: u64) -> Vec<u64> {
                quiet_tail(code, from, to)
            }
            fn jumps_through_slot(code: &[u8], addr: u64) -> bool {
                jumps_through_slot(code, addr)
            }
        }
    };
}
use patcher_of_module;

/// What the placement of a planned patch needs to know of it.
pub trait PatchSite {
    /// The address of the first displaced instruction, where the jump is written.
    fn at(&self) -> u64;
    /// Bytes the jump covers.
    fn covers(&self) -> u32;
    /// Whether the patch fires at every entry of a function starting at `start`.
    fn at_entry_of(&self, start: u64) -> bool;
}

/// The patcher of the machine superprof runs on.
#[cfg(not(target_arch = "aarch64"))]
pub type Host = x86_64::X86_64;
/// The patcher of the machine superprof runs on.
#[cfg(target_arch = "aarch64")]
pub type Host = aarch64::Aarch64;
