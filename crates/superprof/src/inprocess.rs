//! The in-process engine (x86_64): counting code mapped into the program, so that a counted
//! block costs a few nanoseconds and the program never stops for it.
//!
//! For each process superprof makes a stopped thread run a few system calls
//! ([`Tracer::inject_syscall`]): an `mmap` of an area near the code (a `jmp rel32` reaches
//! ±2 GiB), read and execute only, for the trampolines; a `memfd_create` whose pages, mapped
//! shared right after the trampolines, hold the counters, and which superprof maps too
//! (through /proc/PID/fd) before the program closes its descriptor: the counts stay readable
//! after the program ends. Trampolines are written through /proc/PID/mem (the pages are
//! never writable in the program). Each counted block then gets a 5-byte jump to its
//! trampoline ([`superprof_analyze::patch`]), through [`Tracer::patch_code`], so that the
//! original bytes come back when the process is let go, in a fork child's copy, and by the
//! janitor if superprof dies.
//!
//! The area stays mapped when superprof lets go: a thread may be inside a trampoline (or a
//! signal handler may have interrupted one), and a trampoline ends by jumping back to the
//! original code, which is whole again. It is anonymous memory of a few pages, gone at exec.
//!
//! Refused where it could harm the program: a seccomp filter (the injected calls could kill
//! it), other architectures. A shadow stack (x86 user CET) forbids emulating calls, so blocks
//! whose patch would displace a call are left to the caller's fallback.

use std::path::PathBuf;

use superprof_analyze::patch;
use superprof_trace::Tracer;

use crate::sys::SharedCounters;

/// Trampoline bytes per area.
const TRAMPOLINES: u64 = 1 << 20;
/// Counters per area.
const SLOTS: usize = 1 << 14;
const COUNTERS: u64 = SLOTS as u64 * 8;
/// How far an area may start from the code it serves: a rel32 jump's reach, less the area.
const REACH: u64 = (1 << 31) - (TRAMPOLINES + COUNTERS) - (1 << 16);
/// A free page kept on each side of an area.
const GUARD: u64 = 1 << 12;
/// The lowest address an area may take (the usual vm.mmap_min_addr).
const LOWEST: u64 = 1 << 16;
/// The end of the lower half of the address space (48-bit user addresses).
const HIGHEST: u64 = 0x7fff_ffff_0000;

/// x86_64 system call numbers and flags.
const SYS_CLOSE: i64 = 3;
const SYS_MMAP: i64 = 9;
const SYS_MUNMAP: i64 = 11;
const SYS_FTRUNCATE: i64 = 77;
const SYS_MEMFD_CREATE: i64 = 319;
const MAP_FIXED_NOREPLACE: u64 = 0x10_0000;
const MFD_CLOEXEC: u64 = 1;

/// A block to count: its bytes `code` at runtime address `start`; `several`: its first
/// instructions may be displaced together (nothing jumps between them); `spare`: filler bytes
/// after it the jump may cover (see [`patch::plan`]).
pub struct Site<'a> {
    pub code: &'a [u8],
    pub start: u64,
    pub several: bool,
    pub spare: u32,
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
    shared: SharedCounters,
}

pub struct InProcess {
    pid: u32,
    areas: Vec<Area>,
    /// Direct calls may be displaced (emulated with a push and a jump): no shadow stack.
    calls: bool,
}

impl InProcess {
    /// The engine for process `pid`, or why it cannot run there.
    pub fn new(pid: u32) -> Result<InProcess, String> {
        if !cfg!(target_arch = "x86_64") {
            return Err("the in-process engine is built for x86_64 only".to_owned());
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
            calls: !shadow_stack,
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
        let mut plan = patch::plan(b.code, b.start, b.several, b.spare, self.calls);
        if b.several
            && plan
                .as_ref()
                .is_ok_and(|p| inside(p.at + 1, p.len as u64 - 1))
        {
            plan = patch::plan(b.code, b.start, false, b.spare, self.calls);
        }
        let p = plan.map_err(|e| e.to_string())?;
        if inside(p.at + 1, p.len as u64 - 1) {
            return Err("a thread is inside it".to_owned());
        }
        let a = self.area_near(tracer, tid, p.at)?;
        let area = &mut self.areas[a];
        let slot = area.used;
        let counter = area.counters + slot as u64 * 8;
        let tramp = area.next;
        let bytes = patch::trampoline(&p, tramp, counter).map_err(|e| e.to_string())?;
        if bytes.len() > patch::MAX_TRAMPOLINE {
            return Err("its trampoline is too long".to_owned());
        }
        let jump = patch::jump(p.at, tramp).ok_or("its trampoline is out of reach")?;
        tracer
            .write_memory(self.pid, tramp, &bytes)
            .map_err(|e| format!("cannot write a trampoline: {e}"))?;
        tracer
            .patch_code(self.pid, p.at, &jump)
            .map_err(|e| format!("cannot patch the code at {:#x}: {e}", p.at))?;
        // 16-byte aligned trampolines.
        area.next = (tramp + bytes.len() as u64 + 15) & !15;
        area.used += 1;
        Ok(Counter { area: a, slot })
    }

    /// How many times a counted block ran so far.
    pub fn count(&self, c: Counter) -> u64 {
        self.areas.get(c.area).map_or(0, |a| a.shared.get(c.slot))
    }

    /// An area with room that code at `addr` reaches, made if none.
    fn area_near(&mut self, tracer: &mut Tracer, tid: u32, addr: u64) -> Result<usize, String> {
        let fits = |a: &Area| {
            a.tramp.abs_diff(addr) < REACH
                && a.used < SLOTS
                && a.next + patch::MAX_TRAMPOLINE as u64 <= a.tramp + TRAMPOLINES
        };
        if let Some(i) = self.areas.iter().position(fits) {
            return Ok(i);
        }
        let maps = mappings(self.pid).map_err(|e| format!("cannot read the memory map: {e}"))?;
        let at = place_area(&maps, addr, TRAMPOLINES + COUNTERS)
            .ok_or("no free address range near the code")?;
        let area = self.map_area(tracer, tid, at)?;
        self.areas.push(area);
        Ok(self.areas.len() - 1)
    }

    /// Makes the program map an area at `at`: trampolines (read, execute), then counters
    /// (shared with superprof through a memfd).
    fn map_area(&mut self, tracer: &mut Tracer, tid: u32, at: u64) -> Result<Area, String> {
        let pid = self.pid;
        let call = |tracer: &mut Tracer, nr: i64, args: [u64; 6], what: &str| match tracer
            .inject_syscall(tid, nr, args)
        {
            Ok(r) if r < 0 => Err(format!(
                "{what} in the program failed: {}",
                std::io::Error::from_raw_os_error(-r as i32)
            )),
            Ok(r) => Ok(r as u64),
            Err(e) => Err(format!("cannot make the program run {what}: {e}")),
        };
        let size = TRAMPOLINES + COUNTERS;
        let prot_rx = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        let private = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64 | MAP_FIXED_NOREPLACE;
        let got = call(
            tracer,
            SYS_MMAP,
            [at, size, prot_rx, private, u64::MAX, 0],
            "mmap",
        )?;
        if got != at {
            // A kernel without MAP_FIXED_NOREPLACE took it for a hint.
            let _ = call(tracer, SYS_MUNMAP, [got, size, 0, 0, 0, 0], "munmap");
            return Err(format!("the program's mmap gave {got:#x}, not {at:#x}"));
        }
        let name = b"superprof-counters\0";
        let result = (|| {
            tracer
                .write_memory(pid, at, name)
                .map_err(|e| format!("cannot write into the program: {e}"))?;
            let fd = call(
                tracer,
                SYS_MEMFD_CREATE,
                [at, MFD_CLOEXEC, 0, 0, 0, 0],
                "memfd_create",
            )?;
            let shared = (|| {
                call(
                    tracer,
                    SYS_FTRUNCATE,
                    [fd, COUNTERS, 0, 0, 0, 0],
                    "ftruncate",
                )?;
                let prot_rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
                let flags = (libc::MAP_SHARED | libc::MAP_FIXED) as u64;
                let c = at + TRAMPOLINES;
                let got = call(
                    tracer,
                    SYS_MMAP,
                    [c, COUNTERS, prot_rw, flags, fd, 0],
                    "mmap",
                )?;
                if got != c {
                    return Err(format!("the counters were mapped at {got:#x}, not {c:#x}"));
                }
                let path = PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
                SharedCounters::open(&path, SLOTS)
                    .map_err(|e| format!("cannot map the program's counters: {e}"))
            })();
            let _ = call(tracer, SYS_CLOSE, [fd, 0, 0, 0, 0, 0], "close");
            let _ = tracer.write_memory(pid, at, &[0u8; 19]);
            shared
        })();
        match result {
            Ok(shared) => Ok(Area {
                tramp: at,
                next: at,
                counters: at + TRAMPOLINES,
                used: 0,
                shared,
            }),
            Err(e) => {
                let _ = tracer.inject_syscall(tid, SYS_MUNMAP, [at, size, 0, 0, 0, 0]);
                Err(e)
            }
        }
    }
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
