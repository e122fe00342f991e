//! The in-process engine (x86_64 and AArch64): counting code mapped into the program, so that
//! a counted block costs a few nanoseconds and the program never stops for it.
//!
//! For each process superprof makes a stopped thread run a few system calls
//! ([`Tracer::inject_syscall`]): an `mmap` of an area near the code (a `jmp rel32` reaches
//! ±2 GiB, AArch64's `b` ±128 MiB), read and execute only, for the trampolines; a `memfd_create` whose pages, mapped
//! shared right after the trampolines, hold the counters, and which superprof maps too
//! (through /proc/PID/fd) before the program closes its descriptor: the counts stay readable
//! after the program ends. Trampolines are written through /proc/PID/mem (the pages are
//! never writable in the program). Each counted block then gets a 5-byte jump to its
//! trampoline ([`superprof_analyze::patch`]: its [`patch::Host`]), through [`Tracer::patch_code`], so that the
//! original bytes come back when the process is let go, in a fork child's copy, and by the
//! janitor if superprof dies.
//!
//! The area stays mapped when superprof lets go: a thread may be inside a trampoline (or a
//! signal handler may have interrupted one), and a trampoline ends by jumping back to the
//! original code, which is whole again. It is anonymous memory of a few pages, gone at exec.
//!
//! `stat` uses it with recording probes ([`Patcher::record_trampoline`]): each hit of a region's
//! entry or exit takes a record of a ring in another shared memfd (probe, thread, stack
//! pointer, CLOCK_MONOTONIC, and the thread's CPU time and rusage as the events need) through
//! system calls made in the trampoline; superprof reads the ring as the uprobe engine reads
//! its kernel rings ([`InProcess::drain`]).
//!
//! Refused where it could harm the program: a seccomp filter (the injected calls could kill
//! it), architectures other than these two. A shadow stack (x86 user CET) forbids emulating calls, so blocks
//! whose patch would displace a call are left to the caller's fallback.

use std::path::PathBuf;

pub use superprof_analyze::patch;
use superprof_analyze::patch::{Host, Patcher};
use superprof_trace::Tracer;

use crate::shm::SharedMemory;

/// Trampoline bytes per area.
const TRAMPOLINES: u64 = 1 << 20;
/// Counters per area.
const SLOTS: usize = 1 << 14;
const COUNTERS: u64 = SLOTS as u64 * 8;
/// How far an area may start from the code it serves: a jump's reach (x86_64's rel32, AArch64's
/// `b`), less the area.
#[cfg(not(target_arch = "aarch64"))]
const REACH: u64 = (1 << 31) - (TRAMPOLINES + COUNTERS) - (1 << 16);
#[cfg(target_arch = "aarch64")]
const REACH: u64 = (1 << 27) - (TRAMPOLINES + COUNTERS) - (1 << 16);
/// A free page kept on each side of an area.
const GUARD: u64 = 1 << 12;
/// The lowest address an area may take (the usual vm.mmap_min_addr).
const LOWEST: u64 = 1 << 16;
/// The end of user addresses (48 bits: the lower half of the address space on x86_64, all of
/// TTBR0's on AArch64).
#[cfg(not(target_arch = "aarch64"))]
const HIGHEST: u64 = 0x7fff_ffff_0000;
#[cfg(target_arch = "aarch64")]
const HIGHEST: u64 = 0xffff_ffff_0000;

/// System call numbers (this machine's) and flags.
const SYS_CLOSE: i64 = libc::SYS_close;
const SYS_MMAP: i64 = libc::SYS_mmap;
const SYS_MUNMAP: i64 = libc::SYS_munmap;
const SYS_FTRUNCATE: i64 = libc::SYS_ftruncate;
const SYS_MEMFD_CREATE: i64 = libc::SYS_memfd_create;
const MAP_FIXED_NOREPLACE: u64 = 0x10_0000;
const MFD_CLOEXEC: u64 = 1;

/// A block to count: its bytes `code` at runtime address `start`; `several`: its first
/// instructions may be displaced together (nothing jumps between them); `spare`: filler bytes
/// after it the jump may cover (see [`Patcher::plan`]); `springboards`: filler that never runs
/// (runtime address, length) where a block too short for a jump may put one, reached by a
/// 2-byte jump.
pub struct Site<'a> {
    pub code: &'a [u8],
    pub start: u64,
    pub several: bool,
    pub spare: u32,
    pub springboards: &'a [(u64, u32)],
    /// The site is the entry of a function that calls reach (not a `.cold` part, which
    /// jumps reach): its flags are dead, and a patch at its first instruction counts with
    /// [`superprof_analyze::patch::Patcher::entry_trampoline`].
    pub entry: bool,
}

impl<'a> Site<'a> {
    /// The site of block `b` of `code` (ELF addresses; `bias` makes them runtime ones), whose
    /// next block starts at `next` (the filler between may be covered), displacing several
    /// instructions where `several`.
    pub fn of(
        code: &'a superprof_analyze::ElfCode,
        b: &superprof_analyze::Block,
        next: u64,
        bias: u64,
        several: bool,
        springboards: &'a [(u64, u32)],
    ) -> Site<'a> {
        Site {
            code: code.bytes(b.start, b.end - b.start).unwrap_or_default(),
            start: b.start.wrapping_add(bias),
            several,
            spare: code.filler_at(b.end, next),
            springboards,
            entry: false,
        }
    }
}

/// Where the threads of `pid` are (every one stopped): no jump may replace bytes a thread is
/// inside of.
pub fn thread_pcs(tracer: &Tracer, pid: u32) -> Vec<u64> {
    superprof_sample::list_threads(pid)
        .unwrap_or_else(|_| vec![pid])
        .into_iter()
        .filter_map(|t| tracer.regs(t).ok().map(|r| r.pc))
        .collect()
}

/// The filler that never runs in the functions of `code` within a short jump of [lo, hi)
/// (ELF addresses): the gaps between their blocks that hold only no-ops or int3, and the
/// padding after each function's last one, as runtime addresses (`bias` added), 5 bytes or
/// more: springboards for blocks too short for a jump of their own.
pub fn springboards(
    code: &superprof_analyze::ElfCode,
    lo: u64,
    hi: u64,
    bias: u64,
) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    for f in code.functions_in(lo.saturating_sub(128), hi.saturating_add(128)) {
        let blocks = code.static_blocks(f.addr, f.addr + f.size);
        for (k, b) in blocks.iter().enumerate() {
            let next = blocks.get(k + 1).map_or(u64::MAX, |n| n.start);
            let n = code.filler_at(b.end, next);
            let whole = next == u64::MAX || b.end + n as u64 == next;
            if n >= Host::JUMP_LEN && whole {
                out.push((b.end.wrapping_add(bias), n));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// One block's counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    area: usize,
    slot: usize,
}

struct Area {
    /// Where the trampolines start in the program, and the next free byte.
    tramp: u64,
    next: u64,
    /// Where the counters start in the program, and how many are taken.
    counters: u64,
    used: usize,
    shared: SharedMemory,
}

/// Records of the recording probes' ring (a power of two): 16 MiB, mapped with every page
/// present; about 50 ms of one thread's fastest calls, read every 10 ms. A probe that finds it
/// full waits for superprof (patch::RING_TAIL): before that wait, 32 Ki records lost hits in 3
/// runs of 7 of a million calls on two busy cores, and four threads in a recursive function
/// lost 36,000, which made inner calls look outermost.
const RECORDS: u64 = 1 << 16;

/// The ring of recording probes, and how far superprof has read it.
struct RecordRing {
    ring: patch::Ring,
    /// The head word, then the records.
    shared: SharedMemory,
    tail: u64,
}

/// One hit of a recording probe, as read from the ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Record {
    pub probe: u32,
    pub tid: u32,
    pub sp: u64,
    /// CLOCK_MONOTONIC, ns.
    pub time: u64,
    /// The thread's CPU time, ns.
    pub cputime: u64,
    pub minflt: u64,
    pub majflt: u64,
    pub nvcsw: u64,
    pub nivcsw: u64,
}

pub struct InProcess {
    pid: u32,
    areas: Vec<Area>,
    ring: Option<RecordRing>,
    /// The system call stub ([`superprof_trace::SYSCALL_STUB`]) at the start of the first
    /// area: every system call after the first area's goes through it (those go through a
    /// temporary one: [`InProcess::temporary_stub`]).
    stub: Option<u64>,
    /// Every range of the program's code a patch or springboard took: no other may overlap it
    /// (a block's spare filler, a springboard, another probe's bytes).
    taken: Vec<(u64, u64)>,
    /// Direct calls may be displaced (emulated with a push and a jump, or AArch64's x30 and a
    /// `b`): no shadow stack (x86_64: from /proc/PID/status; AArch64: GCS, from the first
    /// stopped thread, `control_stack_checked`).
    calls: bool,
    control_stack_checked: bool,
    /// Each counting trampoline: its runtime addresses (start, end) and the site it counts.
    trampolines: Vec<(u64, u64, u64)>,
}

impl InProcess {
    /// Each counting trampoline written: (its start, its end, the runtime address of the
    /// site it counts), for naming samples taken inside one.
    pub fn trampolines(&self) -> &[(u64, u64, u64)] {
        &self.trampolines
    }

    /// The engine for process `pid`, or why it cannot run there.
    pub fn new(pid: u32) -> Result<InProcess, String> {
        if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            return Err("the in-process engine is built for x86_64 and AArch64 only".to_owned());
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|e| format!("cannot read /proc/{pid}/status: {e}"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        if field("Seccomp:").is_some_and(|v| v != "0") {
            return Err(
                "the program runs under a seccomp filter, which could kill it for the system \
                 calls the in-process engine makes it run"
                    .to_owned(),
            );
        }
        let shadow_stack = field("x86_Thread_features:").is_some_and(|v| v.contains("shstk"));
        Ok(InProcess {
            pid,
            areas: Vec::new(),
            ring: None,
            stub: None,
            taken: Vec::new(),
            trampolines: Vec::new(),
            calls: !shadow_stack,
            control_stack_checked: false,
        })
    }

    /// Counts a block with a trampoline and the jump to it. `inside(at, len)` says whether a
    /// thread is somewhere inside bytes that would be displaced (then a single long
    /// instruction is tried). Thread `tid` is stopped and every other thread of the process
    /// held. Err: why not (the caller counts the block some other way).
    pub fn count_block(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        b: &Site,
        inside: &dyn Fn(u64, u64) -> bool,
    ) -> Result<Counter, String> {
        self.check_control_stack(tid);
        let (p, springboard) = self.plan(b, inside)?;
        let a = self.area_near(tracer, tid, p.at, Host::MAX_TRAMPOLINE)?;
        let area = &self.areas[a];
        let (slot, counter) = (area.used, area.counters + area.used as u64 * 8);
        let at = area.next;
        // (At a function's first instruction only: a later one may see live flags.)
        let bytes = if b.entry && p.at_entry_of(b.start) {
            Host::entry_trampoline(&p, at, counter)
        } else {
            Host::trampoline(&p, at, counter)
        }
        .map_err(|e| e.to_string())?;
        self.install(tracer, a, &p, springboard, &bytes, Host::MAX_TRAMPOLINE)?;
        self.areas[a].used += 1;
        self.trampolines
            .push((at, at + bytes.len() as u64, b.start));
        Ok(Counter { area: a, slot })
    }

    /// Puts a recording probe (number `probe`) on a site: each time the site runs, a record
    /// with the stack pointer `sp` says (see [`patch::SpAt`]), the time, and the CPU time
    /// and rusage where `cputime` and `rusage` ask. `at_start`: the probe must fire at the
    /// site's very first instruction (a function's entry), not on a later long one.
    /// Returns where the patch is (to take it out again: [`Tracer::unpatch`]) and the end of
    /// the bytes it displaced.
    pub fn probe(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        b: &Site,
        inside: &dyn Fn(u64, u64) -> bool,
        recording: &patch::Recording,
        at_start: bool,
    ) -> Result<(u64, u64), String> {
        self.check_control_stack(tid);
        let (p, springboard) = self.plan(b, inside)?;
        if at_start && !p.at_entry_of(b.start) {
            return Err("its first instructions cannot be displaced".to_owned());
        }
        // (The area first: the ring is mapped through the stub at the start of the first one.)
        let a = self.area_near(tracer, tid, p.at, Host::MAX_RECORD_TRAMPOLINE)?;
        let ring = self.ring(tracer, tid)?;
        let bytes = Host::record_trampoline(&p, self.areas[a].next, &ring, recording)
            .map_err(|e| e.to_string())?;
        self.install(
            tracer,
            a,
            &p,
            springboard,
            &bytes,
            Host::MAX_RECORD_TRAMPOLINE,
        )?;
        Ok((p.at, p.at + p.len as u64))
    }

    /// Calls may not be emulated where the process runs with a guarded control stack
    /// (AArch64 GCS, told by its stopped thread `tid`; checked once).
    fn check_control_stack(&mut self, tid: u32) {
        if !self.control_stack_checked {
            self.control_stack_checked = true;
            if superprof_trace::control_stack_enabled(tid) {
                self.calls = false;
            }
        }
    }

    /// The patch for site `b`: its first instructions where allowed, else one long one; and,
    /// for a site too short for a jump, the springboard its short jump goes to.
    fn plan(
        &self,
        b: &Site,
        inside: &dyn Fn(u64, u64) -> bool,
    ) -> Result<(<Host as Patcher>::Patch, Option<u64>), String> {
        // The filler after the block only up to bytes another patch took.
        let end = b.start + b.code.len() as u64;
        let spare = self
            .taken
            .iter()
            .filter(|&&(a, _)| a >= end)
            .map(|&(a, _)| (a - end).min(u32::MAX as u64) as u32)
            .fold(b.spare, u32::min);
        let mut plan = Host::plan(b.code, b.start, b.several, spare, self.calls);
        if b.several
            && plan
                .as_ref()
                .is_ok_and(|p| inside(p.at + 1, p.len as u64 - 1))
        {
            plan = Host::plan(b.code, b.start, false, spare, self.calls);
        }
        let mut springboard = None;
        if plan.as_ref().is_err_and(|e| *e == patch::Refusal::TooShort) {
            // A short jump to a 5-byte one in filler nearby.
            let short = Host::plan_for(
                b.code,
                b.start,
                b.several,
                spare,
                self.calls,
                Host::SHORT_JUMP_LEN,
            );
            if let Ok(p) = short {
                // (Sorted: only those within a short jump.)
                let from = b
                    .springboards
                    .partition_point(|&(at, len)| at + (len as u64) < p.at.saturating_sub(128));
                springboard = b.springboards[from..]
                    .iter()
                    .take_while(|&&(at, _)| at <= p.at + 130)
                    .find_map(|&(at, len)| {
                        (at..=at + (len - Host::JUMP_LEN) as u64).find(|&s| {
                            Host::short_jump(p.at, s).is_some()
                                && !self.overlaps(s, s + Host::JUMP_LEN as u64)
                        })
                    });
                if springboard.is_some() {
                    plan = Ok(p);
                }
            }
        }
        let p = plan.map_err(|e| e.to_string())?;
        if inside(p.at + 1, p.len as u64 - 1) {
            return Err("a thread is inside it".to_owned());
        }
        if self.overlaps(p.at, p.at + p.len as u64) {
            return Err("its bytes are another probe's already".to_owned());
        }
        Ok((p, springboard))
    }

    /// Whether [a, b) overlaps code a patch or springboard took.
    fn overlaps(&self, a: u64, b: u64) -> bool {
        self.taken.iter().any(|&(x, y)| x < b && a < y)
    }

    /// Writes trampoline `bytes` at area `a`'s next free byte and the jump to it over the
    /// patch's bytes (through `springboard`, a 5-byte jump in filler, for a short one).
    fn install(
        &mut self,
        tracer: &mut Tracer,
        a: usize,
        p: &<Host as Patcher>::Patch,
        springboard: Option<u64>,
        bytes: &[u8],
        most: usize,
    ) -> Result<(), String> {
        let area = &mut self.areas[a];
        let tramp = area.next;
        if bytes.len() > most {
            return Err("its trampoline is too long".to_owned());
        }
        let far = springboard.unwrap_or(p.at);
        let jump = Host::jump(far, tramp).ok_or("its trampoline is out of reach")?;
        tracer
            .write_memory(self.pid, tramp, bytes)
            .map_err(|e| format!("cannot write a trampoline: {e}"))?;
        tracer
            .patch_code(self.pid, far, &jump)
            .map_err(|e| format!("cannot patch the code at {far:#x}: {e}"))?;
        self.taken.push((p.at, p.at + p.len as u64));
        if let Some(s) = springboard {
            self.taken.push((s, s + Host::JUMP_LEN as u64));
            let short = Host::short_jump(p.at, s).ok_or("its springboard is out of reach")?;
            if let Err(e) = tracer.patch_code(self.pid, p.at, &short) {
                let _ = tracer.unpatch(self.pid, s);
                return Err(format!("cannot patch the code at {:#x}: {e}", p.at));
            }
        }
        // 16-byte aligned trampolines.
        area.next = (tramp + bytes.len() as u64 + 15) & !15;
        Ok(())
    }

    /// The recording probes' ring, mapped in the program (and here) at its first use.
    fn ring(&mut self, tracer: &mut Tracer, tid: u32) -> Result<patch::Ring, String> {
        if let Some(r) = &self.ring {
            return Ok(r.ring);
        }
        // The head in the first page, then the records.
        let len = 4096 + RECORDS * patch::RECORD;
        let (at, shared) = self.map(tracer, tid, None, 0, len)?;
        let ring = patch::Ring {
            head: at,
            base: at + 4096,
            records: RECORDS,
        };
        self.ring = Some(RecordRing {
            ring,
            shared,
            tail: 0,
        });
        Ok(ring)
    }

    /// The records written since the last call, in the order they were taken; returns how
    /// many were lost (overwritten before they were read). A record still being written
    /// ends the batch: it is read next time.
    pub fn drain(&mut self, out: &mut Vec<Record>) -> u64 {
        let Some(r) = &mut self.ring else {
            return 0;
        };
        let word = |i: u64| r.shared.word(i as usize);
        let head = word(0);
        let mut lost = 0;
        // Probes wait for room (patch::RING_TAIL): the head may be a lap ahead with nothing
        // overwritten, its records still to come. Only once they gave up waiting are the
        // records a lap behind the head gone for sure (and each one met is checked anyway).
        let gave_up = word(patch::RING_GAVE_UP as u64 / 8) != 0;
        if gave_up && head.saturating_sub(r.tail) > RECORDS {
            lost = head - RECORDS - r.tail;
            r.tail = head - RECORDS;
        }
        let per = patch::RECORD / 8;
        while r.tail < head {
            let base = 4096 / 8 + (r.tail % RECORDS) * per;
            let at = |off: usize| word(base + off as u64 / 8);
            let commit = at(patch::REC_COMMIT);
            if commit != r.tail + 1 {
                if commit > r.tail + 1 {
                    // Overwritten by a later lap.
                    lost += 1;
                    r.tail += 1;
                    continue;
                }
                break; // still being written
            }
            let ts = |off: usize| {
                at(off)
                    .wrapping_mul(1_000_000_000)
                    .wrapping_add(at(off + 8))
            };
            let probe_tid = at(patch::REC_PROBE);
            let ru = patch::REC_RUSAGE;
            let rec = Record {
                probe: probe_tid as u32,
                tid: (probe_tid >> 32) as u32,
                sp: at(patch::REC_SP),
                time: ts(patch::REC_TIME),
                cputime: ts(patch::REC_CPUTIME),
                // struct rusage: ru_minflt at 64, ru_majflt 72, ru_nvcsw 128, ru_nivcsw 136.
                minflt: at(ru + 64),
                majflt: at(ru + 72),
                nvcsw: at(ru + 128),
                nivcsw: at(ru + 136),
            };
            // Still the same record (not overwritten while it was read)? Else it is lost: the
            // ring is the program's memory, and a record that keeps changing must not hold the
            // reader here.
            if at(patch::REC_COMMIT) == r.tail + 1 {
                out.push(rec);
            } else {
                lost += 1;
            }
            r.tail += 1;
        }
        // Read so far: a probe that finds the ring full waits for this to move
        // (patch::RING_TAIL), and waits again from now on if it had given up.
        r.shared.set_word(patch::RING_TAIL / 8, r.tail);
        r.shared.set_word(patch::RING_GAVE_UP / 8, 0);
        lost
    }

    /// Records taken in the ring so far (its head): each has an index below this.
    pub fn taken(&self) -> u64 {
        self.ring.as_ref().map_or(0, |r| r.shared.word(0))
    }

    /// Records read from the ring so far (by [`InProcess::drain`]).
    pub fn read(&self) -> u64 {
        self.ring.as_ref().map_or(0, |r| r.tail)
    }

    /// Frees the pages of the counters and of the ring (read them first): the program keeps
    /// the mappings (a thread may still be inside a trampoline), not the memory.
    pub fn release(&self) {
        for a in &self.areas {
            a.shared.release();
        }
        if let Some(r) = &self.ring {
            r.shared.release();
        }
    }

    /// How many times a counted block ran so far.
    pub fn count(&self, c: Counter) -> u64 {
        self.areas.get(c.area).map_or(0, |a| a.shared.word(c.slot))
    }

    /// An area with room for a trampoline of `room` bytes (and a counter) that code at
    /// `addr` reaches, made if none.
    fn area_near(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        addr: u64,
        room: usize,
    ) -> Result<usize, String> {
        let fits = |a: &Area| {
            a.tramp.abs_diff(addr) < REACH
                && a.used < SLOTS
                && a.next + room as u64 <= a.tramp + TRAMPOLINES
        };
        if let Some(i) = self.areas.iter().position(fits) {
            return Ok(i);
        }
        let maps = mappings(self.pid).map_err(|e| format!("cannot read the memory map: {e}"))?;
        let at = place_area(&maps, addr, TRAMPOLINES + COUNTERS)
            .ok_or("no free address range near the code")?;
        let (at, shared) = self.map(tracer, tid, Some(at), TRAMPOLINES, COUNTERS)?;
        // The first area starts with the system call stub.
        let next = if self.stub == Some(at) { at + 128 } else { at };
        self.areas.push(Area {
            tramp: at,
            next,
            counters: at + TRAMPOLINES,
            used: 0,
            shared,
        });
        Ok(self.areas.len() - 1)
    }

    /// Makes the program map `exec` bytes for trampolines (read, execute) then `len` bytes
    /// shared with superprof through a memfd (read, write), at `at` (None: where the kernel
    /// likes). Returns where, and superprof's view of the shared part.
    ///
    /// (One function of 124 lines: a series of system calls injected through one `call` closure and
    /// `stub` cell (mmap, stub, memfd_create, ftruncate, the shared mmap, close), with the undo on
    /// failure (munmap, the temporary stub restored) in one place.)
    fn map(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        at: Option<u64>,
        exec: u64,
        len: u64,
    ) -> Result<(u64, SharedMemory), String> {
        let pid = self.pid;
        // Through the stub once there is one. Before the first area holds it, a stub written
        // for the while in the spare bytes after some file's code (the tail of the page where
        // an executable segment ends, which never runs), so that the first calls are as safe
        // as the others; only where there is none is the very first mmap run at the thread's
        // pc, its registers changed for one step.
        let (temporary, replaced) = match self.stub {
            Some(_) => (None, Vec::new()),
            None => self
                .temporary_stub(tracer, tid)
                .map_or((None, Vec::new()), |(at, orig)| (Some(at), orig)),
        };
        let stub = std::cell::Cell::new(self.stub.or(temporary));
        let call = |tracer: &mut Tracer, nr: i64, args: [u64; 6], what: &str| {
            let r = match stub.get() {
                Some(s) => tracer.inject_syscall_via(tid, s, nr, args),
                None => tracer.inject_syscall(tid, nr, args),
            };
            match r {
                Ok(r) if r < 0 => Err(format!(
                    "{what} in the program failed: {}",
                    std::io::Error::from_raw_os_error(-r as i32)
                )),
                Ok(r) => Ok(r as u64),
                Err(e) => Err(format!("cannot make the program run {what}: {e}")),
            }
        };
        let size = exec + len;
        let prot = if exec > 0 {
            libc::PROT_READ | libc::PROT_EXEC
        } else {
            libc::PROT_READ
        } as u64;
        let mut flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        if at.is_some() {
            flags |= MAP_FIXED_NOREPLACE;
        }
        let hint = at.unwrap_or(0);
        let got = call(
            tracer,
            SYS_MMAP,
            [hint, size, prot, flags, u64::MAX, 0],
            "mmap",
        )?;
        if at.is_some_and(|at| at != got) {
            // A kernel without MAP_FIXED_NOREPLACE took it for a hint.
            let _ = call(tracer, SYS_MUNMAP, [got, size, 0, 0, 0, 0], "munmap");
            return Err(format!("the program's mmap gave {got:#x}, not {hint:#x}"));
        }
        let at = got;
        let name = b"superprof-counters\0";
        let result = (|| {
            if self.stub.is_none() && exec > 0 {
                tracer
                    .write_memory(pid, at, superprof_trace::SYSCALL_STUB)
                    .map_err(|e| format!("cannot write into the program: {e}"))?;
                stub.set(Some(at));
            }
            // (The name after the stub, in the part that holds trampolines later.)
            let name_at = if exec > 0 { at + 64 + 8 } else { at };
            tracer
                .write_memory(pid, name_at, name)
                .map_err(|e| format!("cannot write into the program: {e}"))?;
            let fd = call(
                tracer,
                SYS_MEMFD_CREATE,
                [name_at, MFD_CLOEXEC, 0, 0, 0, 0],
                "memfd_create",
            )?;
            let shared = (|| {
                call(tracer, SYS_FTRUNCATE, [fd, len, 0, 0, 0, 0], "ftruncate")?;
                let prot_rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
                // Populated: the program takes no page fault on it (a recording probe's
                // first write to a page would count in the call's page-faults).
                let flags = (libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE) as u64;
                let c = at + exec;
                let got = call(tracer, SYS_MMAP, [c, len, prot_rw, flags, fd, 0], "mmap")?;
                if got != c {
                    return Err(format!(
                        "the shared part was mapped at {got:#x}, not {c:#x}"
                    ));
                }
                let path = PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
                SharedMemory::open(&path, len as usize)
                    .map_err(|e| format!("cannot map the program's counters: {e}"))
            })();
            let _ = call(tracer, SYS_CLOSE, [fd, 0, 0, 0, 0, 0], "close");
            if exec > 0 {
                let _ = tracer.write_memory(pid, name_at, &[0u8; 19]);
            }
            shared
        })();
        let result = match result {
            Ok(shared) => {
                if stub.get() != temporary {
                    self.stub = stub.get();
                }
                Ok((at, shared))
            }
            Err(e) => {
                // (Not through a stub in the area being unmapped.)
                let _ = match temporary {
                    Some(t) => {
                        tracer.inject_syscall_via(tid, t, SYS_MUNMAP, [at, size, 0, 0, 0, 0])
                    }
                    None => tracer.inject_syscall(tid, SYS_MUNMAP, [at, size, 0, 0, 0, 0]),
                };
                Err(e)
            }
        };
        if let Some(t) = temporary {
            // (The thread is out of it: every call has returned.)
            let _ = tracer.write_memory(pid, t, &replaced);
        }
        result
    }
}

impl InProcess {
    /// Writes the system call stub, for the while, into spare bytes after the code of a file
    /// the process maps (nearest the thread's pc first: AArch64's stub branches back there);
    /// returns where and the bytes it replaced. Not through [`Tracer::patch_code`]: the
    /// janitor must not put the bytes back under a thread a dead superprof left inside the
    /// stub, which finishes it by itself; bytes that never run, they may stay. None where no
    /// file has room.
    fn temporary_stub(&self, tracer: &mut Tracer, tid: u32) -> Option<(u64, Vec<u8>)> {
        let pc = tracer.regs(tid).ok()?.pc;
        let mut maps = superprof_unwind::maps::executable_mappings(self.pid).ok()?;
        maps.retain(|m| m.path.is_absolute());
        // Nearest first, and each file parsed only if the nearer ones had no room (a process
        // maps dozens; node's executable alone is 90 MB).
        let distance = |m: &superprof_unwind::maps::MapEntry| {
            if (m.start..m.end).contains(&pc) {
                0
            } else {
                m.start.abs_diff(pc).min(m.end.abs_diff(pc))
            }
        };
        maps.sort_by_key(distance);
        let len = superprof_trace::SYSCALL_STUB.len();
        maps.iter().find_map(|m| {
            let image = superprof_unwind::ElfImage::open(&m.path)?;
            let file_len = std::fs::metadata(&m.path).ok()?.len();
            let bias = image.bias_for_mapping(m.start, m.end - m.start, m.offset);
            let code: Vec<(u64, u64)> = image
                .executable_ranges()
                .iter()
                .map(|r| (r.start.wrapping_add(bias), r.end.wrapping_add(bias)))
                .collect();
            let file_end = file_len
                .checked_sub(m.offset)
                .and_then(|n| m.start.checked_add(n))
                .unwrap_or(0);
            let at = spare_after_code(&code, (m.start, m.end), file_end, len as u64)?;
            let mut orig = vec![0u8; len];
            (tracer.read_code(self.pid, at, &mut orig) == len
                && tracer
                    .write_memory(self.pid, at, superprof_trace::SYSCALL_STUB)
                    .is_ok())
            .then_some((at, orig))
        })
    }
}

/// Where `len` bytes fit, 16-byte aligned, after the end of a file's executable segment in
/// the page it ends in (runtime addresses; `code`: the file's executable segments as mapped,
/// `map`: the mapping, `file_end`: where the file's bytes end in it): bytes the mapping holds
/// that are no code and that nothing runs.
fn spare_after_code(code: &[(u64, u64)], map: (u64, u64), file_end: u64, len: u64) -> Option<u64> {
    code.iter().find_map(|&(_, end)| {
        let at = end.checked_add(15)? & !15;
        let stop = at.checked_add(len)?;
        let page_end = end.checked_add(4095)? & !4095;
        let clear = !code.iter().any(|&(s, e)| s < stop && at < e);
        (end > map.0 && stop <= page_end && stop <= map.1 && stop <= file_end && clear)
            .then_some(at)
    })
}

/// The address ranges mapped in `pid`, sorted.
fn mappings(pid: u32) -> std::io::Result<Vec<(u64, u64)>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mut out: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            let (a, b) = (
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            );
            (a < b).then_some((a, b))
        })
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Where an area of `size` bytes may go so that code at `addr` reaches all of it: in a free
/// range of the address space (`maps`: the mapped ranges, sorted), a guard page from its
/// neighbours, preferably below `addr` (above an executable is where its heap grows).
fn place_area(maps: &[(u64, u64)], addr: u64, size: u64) -> Option<u64> {
    let mut gaps = Vec::new();
    let mut prev = LOWEST;
    for &(a, b) in maps {
        if a > prev {
            gaps.push((prev, a));
        }
        prev = prev.max(b);
    }
    if prev < HIGHEST {
        gaps.push((prev, HIGHEST));
    }
    let reach = |at: u64| at.abs_diff(addr) < REACH && (at + size).abs_diff(addr) < REACH;
    let below = gaps
        .iter()
        .filter(|&&(_, end)| end <= addr)
        .filter_map(|&(start, end)| {
            let at = end.checked_sub(GUARD + size)? & !(GUARD - 1);
            (at >= start.checked_add(GUARD)? && reach(at)).then_some(at)
        })
        .max();
    below.or_else(|| {
        gaps.iter()
            .filter(|&&(start, _)| start >= addr)
            .filter_map(|&(start, end)| {
                let at = start.checked_add(GUARD)?;
                (at.checked_add(size + GUARD)? <= end && reach(at)).then_some(at)
            })
            .min()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_stub_goes_after_the_code_in_its_last_page() {
        let code = [(0x1000, 0x1f03)];
        assert_eq!(
            spare_after_code(&code, (0x1000, 0x2000), 0x3000, 64),
            Some(0x1f10)
        );
        // Not past the page, the mapping or the file's bytes; not over other code.
        assert_eq!(spare_after_code(&code, (0x1000, 0x2000), 0x3000, 241), None);
        assert_eq!(spare_after_code(&code, (0x1000, 0x1f40), 0x3000, 64), None);
        assert_eq!(spare_after_code(&code, (0x1000, 0x2000), 0x1f20, 64), None);
        // Not over the next segment's code: after that one's end instead.
        let two = [(0x1000, 0x1f03), (0x1f20, 0x2800)];
        assert_eq!(
            spare_after_code(&two, (0x1000, 0x3000), 0x4000, 64),
            Some(0x2800)
        );
        // A segment that ends on a page boundary has no tail.
        assert_eq!(
            spare_after_code(&[(0x1000, 0x2000)], (0x1000, 0x3000), 0x4000, 64),
            None
        );
    }

    #[test]
    fn areas_go_just_below_the_code_or_above_it() {
        let size = TRAMPOLINES + COUNTERS;
        // A PIE executable at 0x5555_5555_4000 with room below.
        let maps = [
            (0x5555_5555_4000, 0x5555_5556_0000),
            (0x7fff_f7dd_0000, 0x7fff_f7ff_0000),
        ];
        let at = place_area(&maps, 0x5555_5555_5000, size).unwrap();
        assert_eq!(at + size + GUARD, 0x5555_5555_4000);
        // No room below (mapped from the lowest address up): above, a page after.
        let maps = [(LOWEST, 0x40_0000), (0x40_0000, 0x40_8000)];
        let at = place_area(&maps, 0x40_1000, size).unwrap();
        assert_eq!(at, 0x40_8000 + GUARD);
        // Nothing within reach.
        let maps = [(LOWEST, HIGHEST)];
        assert_eq!(place_area(&maps, 0x40_1000, size), None);
        let maps = [(LOWEST, 0x1_0000_0000), (0x2_0000_0000, HIGHEST)];
        assert_eq!(place_area(&maps, 0x8000_0000, size), None);
    }
}
