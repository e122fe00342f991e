//! The lab: a process of superprof's own, emptied of everything, in which single instructions
//! of a traced program are run under chosen conditions to see whether they can send the pc
//! elsewhere ([`Probed`]). Nothing of the traced program is touched: its instruction's bytes
//! are copied to the same address in the lab, and run there.
//!
//! The lab is a fork of superprof that stops itself under superprof's ptrace in a session of
//! its own (no signal of the terminal reaches it). Superprof then maps three pages of its own
//! in it (a system call instruction, read-only; scratch data; a scratch stack), closes every
//! file it inherited and unmaps everything else, so that an instruction run there can reach
//! no memory but those pages and the page of code it is copied to. Each run single-steps with PTRACE_SYSEMU_SINGLESTEP:
//! a system call stops at its entry and never runs. The lab is killed when it is dropped, and
//! by the kernel if superprof dies (PTRACE_O_EXITKILL, and the death signal of its parent).

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::FileExt;

use superprof_trace::raw::{self, RawRegs};

use crate::Probed;

/// Pages of code the lab holds at most before it unmaps them all and starts again.
const MAX_PAGES: usize = 4096;

/// How one run in the lab ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trial {
    /// It stopped at the entry of a system call.
    Syscall,
    /// It ran, and the pc went here.
    Went(u64),
    /// A fault at the instruction itself: it touched memory the lab does not have (or the
    /// lab's CPU refused it).
    Fault,
}

/// The general registers of a run in the lab.
#[derive(Debug, Clone, Copy)]
enum Fill {
    /// All of them this value.
    Same(u64),
    /// All different, increasing (x86_64: in the order of their encoding numbers).
    Increasing,
    /// All different, decreasing.
    Decreasing,
}

/// The lab (see the module's notes).
pub struct Lab {
    pid: u32,
    mem: std::fs::File,
    /// Its registers when it stopped itself (the segment registers and the like of every run).
    base: RawRegs,
    /// A system call instruction, at the start of the lab's own page.
    gadget: u64,
    /// The scratch stack pointer of every run (in the lab's third page).
    stack: u64,
    /// The middle of the scratch data page (the lab's second page).
    scratch: u64,
    /// The lab's own three pages, and the pages of code mapped in it.
    home: u64,
    pages: HashSet<u64>,
    page: u64,
    /// Runs so far.
    pub runs: u64,
}

#[cfg(target_arch = "x86_64")]
mod nr {
    pub const MMAP: u64 = 9;
    pub const MUNMAP: u64 = 11;
    pub const RSEQ: u64 = 334;
    pub const MPROTECT: u64 = 10;
}
#[cfg(target_arch = "aarch64")]
mod nr {
    pub const MMAP: u64 = 222;
    pub const MUNMAP: u64 = 215;
    pub const RSEQ: u64 = 293;
    pub const MPROTECT: u64 = 226;
}
const CLOSE_RANGE: u64 = 436;
const PROT_RWX: u64 = 7;
const MAP_PRIVATE_ANONYMOUS: u64 = 0x22;
const MAP_FIXED_NOREPLACE: u64 = 0x10_0000;

/// The condition flags a branch can read, as bits of the flags register (x86_64: CF, PF, ZF,
/// SF, OF; AArch64: N, Z, C, V).
#[cfg(target_arch = "x86_64")]
const CONDITION_BITS: &[u32] = &[0, 2, 6, 7, 11];
#[cfg(target_arch = "aarch64")]
const CONDITION_BITS: &[u32] = &[28, 29, 30, 31];

impl Lab {
    /// Makes the lab. Fails where superprof cannot fork or trace its own child.
    pub fn new() -> io::Result<Lab> {
        let pid = raw::fork_stopped_tracee()?;
        let mut lab = match Lab::adopt(pid) {
            Ok(lab) => lab,
            Err(e) => {
                raw::kill(pid, libc::SIGKILL);
                let _ = raw::waitpid(pid, false);
                return Err(e);
            }
        };
        lab.empty()?; // (on failure, dropped: killed)
        Ok(lab)
    }

    /// Takes the stopped child `pid` in hand.
    fn adopt(pid: u32) -> io::Result<Lab> {
        let status = wait_stop(pid)?;
        if status != libc::SIGSTOP {
            return Err(io::Error::other(format!(
                "the lab stopped with signal {status}"
            )));
        }
        raw::set_options(pid, raw::PTRACE_O_EXITKILL | raw::PTRACE_O_TRACESYSGOOD)?;
        let base = raw::raw_regs(pid)?;
        // It stopped right after its own kill system call: the instruction before its pc.
        let insn = raw::SYSCALL_INSN;
        let gadget = raw::pc_of(&base).wrapping_sub(insn.len() as u64);
        let mut code = vec![0u8; insn.len()];
        if raw::read_memory(pid, gadget, &mut code) != insn.len() || code != insn {
            return Err(io::Error::other(
                "the lab's stop is not after a system call",
            ));
        }
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))?;
        Ok(Lab {
            pid,
            mem,
            base,
            gadget,
            stack: 0,
            scratch: 0,
            home: 0,
            pages: HashSet::new(),
            page: superprof_unwind::page_size() as u64,
            runs: 0,
        })
    }

    /// Maps the lab's own pages, closes its files and unmaps everything else.
    fn empty(&mut self) -> io::Result<()> {
        let home = self.syscall(
            nr::MMAP,
            [
                0,
                3 * self.page,
                PROT_RWX,
                MAP_PRIVATE_ANONYMOUS,
                u64::MAX,
                0,
            ],
        )?;
        if home < 0 {
            return Err(io::Error::from_raw_os_error(-home as i32));
        }
        let home = home as u64;
        self.mem.write_all_at(raw::SYSCALL_INSN, home)?;
        self.gadget = home;
        self.home = home;
        // The system call instruction out of the runs' reach.
        const PROT_RX: u64 = 5;
        let r = self.syscall(nr::MPROTECT, [home, self.page, PROT_RX, 0, 0, 0])?;
        if r < 0 {
            return Err(io::Error::from_raw_os_error(-r as i32));
        }
        self.scratch = home + self.page + self.page / 2;
        // The stack near the third page's end, 16-aligned, room above for what a run reads.
        self.stack = home + 3 * self.page - 256;
        self.syscall(CLOSE_RANGE, [0, u32::MAX as u64, 0, 0, 0, 0])?;
        // The kernel writes to a registered restartable-sequences area when the lab returns
        // to user space; unmapped, that write would kill it: unregister it first.
        if let Some((area, size, signature)) = raw::rseq_configuration(self.pid) {
            const RSEQ_FLAG_UNREGISTER: u64 = 1;
            let r = self.syscall(
                nr::RSEQ,
                [
                    area,
                    size as u64,
                    RSEQ_FLAG_UNREGISTER,
                    signature as u64,
                    0,
                    0,
                ],
            )?;
            if r < 0 {
                return Err(io::Error::from_raw_os_error(-r as i32));
            }
        }
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid))?;
        for line in maps.lines() {
            let Some((lo, hi)) = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'))
                .and_then(|(a, b)| {
                    Some((
                        u64::from_str_radix(a, 16).ok()?,
                        u64::from_str_radix(b, 16).ok()?,
                    ))
                })
            else {
                continue;
            };
            if hi <= lo || line.ends_with("[vsyscall]") || (lo < home + 3 * self.page && home < hi)
            {
                continue;
            }
            self.syscall(nr::MUNMAP, [lo, hi - lo, 0, 0, 0, 0])?;
        }
        Ok(())
    }

    /// Runs system call `nr` with `args` in the lab, through its system call instruction.
    fn syscall(&mut self, nr: u64, args: [u64; 6]) -> io::Result<i64> {
        let mut r = self.base;
        #[cfg(target_arch = "x86_64")]
        {
            r.rip = self.gadget;
            r.rax = nr;
            r.orig_rax = u64::MAX;
            [r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9] = args;
        }
        #[cfg(target_arch = "aarch64")]
        {
            r.pc = self.gadget;
            r.regs[8] = nr;
            r.regs[..6].copy_from_slice(&args);
        }
        raw::set_regs_outside_syscall(self.pid, &r)?;
        raw::single_step(self.pid, 0)?;
        let sig = wait_stop(self.pid)?;
        if sig != libc::SIGTRAP {
            return Err(io::Error::other(format!(
                "a system call ({nr}) in the lab stopped with signal {sig}"
            )));
        }
        Ok(raw::syscall_result(&raw::raw_regs(self.pid)?))
    }

    /// Maps the pages of `[addr, addr + len)` in the lab, if they are not yet.
    fn map(&mut self, addr: u64, len: u64) -> io::Result<()> {
        let first = addr & !(self.page - 1);
        let end = addr
            .checked_add(len.max(1) - 1)
            .ok_or_else(|| io::Error::other("code past the end of the address space"))?;
        let last = end & !(self.page - 1);
        let mut p = first;
        while p <= last {
            if (self.home..self.home + 3 * self.page).contains(&p) {
                return Err(io::Error::other("code at the lab's own pages"));
            }
            if !self.pages.contains(&p) {
                if self.pages.len() >= MAX_PAGES {
                    let pages: Vec<u64> = self.pages.drain().collect();
                    for q in pages {
                        self.syscall(nr::MUNMAP, [q, self.page, 0, 0, 0, 0])?;
                    }
                }
                let flags = MAP_PRIVATE_ANONYMOUS | MAP_FIXED_NOREPLACE;
                let got = self.syscall(nr::MMAP, [p, self.page, PROT_RWX, flags, u64::MAX, 0])?;
                if got as u64 != p {
                    if got >= 0 {
                        self.syscall(nr::MUNMAP, [got as u64, self.page, 0, 0, 0, 0])?;
                    }
                    return Err(io::Error::other(format!("cannot map {p:#x} in the lab")));
                }
                self.pages.insert(p);
            }
            p += self.page;
        }
        Ok(())
    }

    /// Whether the lab still runs (it stops for superprof).
    pub fn alive(&self) -> bool {
        matches!(raw::waitpid(self.pid, true), Ok(None))
    }

    /// Runs the instruction whose bytes start `code` (`len` bytes long) at `addr` and says
    /// what it did: under every combination of the condition flags with the general
    /// registers all zeros, then all ones (a register tested for zero, or a bit of it, either
    /// way), then, flags clear, with every register different, in increasing and in
    /// decreasing order (two registers compared either way), then all pointing into the
    /// scratch data page (an instruction that reads or writes memory through a register
    /// runs; a `rep` string instruction repeats itself, and so stays: a block of its own, as
    /// the decoder has it). The stack pointer is on the scratch stack, whose words read zero.
    pub fn probe(&mut self, addr: u64, code: &[u8], len: u64) -> io::Result<Probed> {
        // Superprof and the lab hand the CPU to each other at every run: on one CPU, with no
        // wakeup across CPUs, a run costs a third of the time.
        let _pin = raw::pin_with(self.pid);
        self.map(addr, code.len() as u64)?;
        self.mem.write_all_at(code, addr)?;
        let next = addr.wrapping_add(len);
        let all_flags = 1u64 << CONDITION_BITS.len();
        let mut ran_straight = false;
        for (fill, combos) in [
            (Fill::Same(0), all_flags),
            (Fill::Same(u64::MAX), all_flags),
            (Fill::Increasing, 1),
            (Fill::Decreasing, 1),
            (Fill::Same(self.scratch), 1),
        ] {
            // A clean stack for each: what a return would pop is zero.
            self.mem
                .write_all_at(&[0u8; 256], self.stack.wrapping_sub(128))?;
            for combo in 0..combos {
                let flags = CONDITION_BITS
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| combo >> i & 1 == 1)
                    .fold(0u64, |f, (_, &bit)| f | 1 << bit);
                match self.trial(addr, fill, flags)? {
                    Trial::Syscall => return Ok(Probed::Syscall),
                    Trial::Went(pc) if pc == next => ran_straight = true,
                    Trial::Went(_) => return Ok(Probed::Branch),
                    // It touches memory the lab does not have; the flags do not change where.
                    Trial::Fault => break,
                }
            }
        }
        // An instruction that faulted under some registers touches memory, and is no
        // conditional branch: wherever it ran, it went straight on.
        Ok(if ran_straight {
            Probed::Straight
        } else {
            Probed::TouchesMemory
        })
    }

    /// One run of the instruction at `addr`: the general registers as `fill` says, the stack
    /// pointer on the scratch stack, the condition flags `flags`.
    fn trial(&mut self, addr: u64, fill: Fill, flags: u64) -> io::Result<Trial> {
        self.runs += 1;
        let mut r = self.base;
        let value = |i: u64| match fill {
            Fill::Same(v) => v,
            // Distinct, positive either way they are read (signed or not), in order.
            Fill::Increasing => (i + 1) << 32 | (i + 1),
            Fill::Decreasing => (40 - i) << 32 | (40 - i),
        };
        let mut values = [0u64; 31];
        for (i, v) in values.iter_mut().enumerate() {
            *v = value(i as u64);
        }
        #[cfg(target_arch = "x86_64")]
        {
            [
                r.rax, r.rcx, r.rdx, r.rbx, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11, r.r12,
                r.r13, r.r14, r.r15,
            ] = values[..15].try_into().unwrap_or([0; 15]);
            r.rsp = self.stack;
            r.rip = addr;
            r.orig_rax = u64::MAX;
            r.eflags = 0x202 | flags;
        }
        #[cfg(target_arch = "aarch64")]
        {
            r.regs = values;
            r.sp = self.stack;
            r.pc = addr;
            r.pstate = flags;
        }
        // A step that traps with nothing run (the pc where it was, the registers as set) is
        // taken again: AArch64's step, resumed after a fault in a stepped instruction, can
        // trap before it runs anything. An instruction that really stays on itself (a `rep`
        // string instruction, an iteration each step) stays again.
        for _ in 0..2 {
            raw::set_regs_outside_syscall(self.pid, &r)?;
            raw::sysemu_step(self.pid)?;
            let sig = wait_stop(self.pid)?;
            if sig == libc::SIGTRAP | 0x80 {
                return Ok(Trial::Syscall);
            }
            let after = raw::raw_regs(self.pid)?;
            let pc = raw::pc_of(&after);
            if sig != libc::SIGTRAP && pc == addr {
                return Ok(Trial::Fault);
            }
            if !(sig == libc::SIGTRAP && pc == addr && same_regs(&after, &r)) {
                return Ok(Trial::Went(pc));
            }
        }
        Ok(Trial::Went(addr))
    }
}

/// Whether a run left the general registers as they were set.
fn same_regs(a: &RawRegs, b: &RawRegs) -> bool {
    #[cfg(target_arch = "x86_64")]
    return [
        a.rax, a.rbx, a.rcx, a.rdx, a.rsi, a.rdi, a.rbp, a.rsp, a.r8, a.r9, a.r10, a.r11, a.r12,
        a.r13, a.r14, a.r15,
    ] == [
        b.rax, b.rbx, b.rcx, b.rdx, b.rsi, b.rdi, b.rbp, b.rsp, b.r8, b.r9, b.r10, b.r11, b.r12,
        b.r13, b.r14, b.r15,
    ];
    #[cfg(target_arch = "aarch64")]
    return a.regs == b.regs && a.sp == b.sp;
}

/// Waits for the lab to stop; its stop signal. An error if it ended.
fn wait_stop(pid: u32) -> io::Result<i32> {
    loop {
        match raw::waitpid(pid, false) {
            Ok(Some(status)) if status & 0xff == 0x7f => return Ok((status >> 8) & 0xff),
            Ok(Some(status)) => {
                return Err(io::Error::other(format!(
                    "the lab ended (wait status {status:#x})"
                )))
            }
            Ok(None) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        raw::kill(self.pid, libc::SIGKILL);
        let _ = raw::waitpid(self.pid, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_lab_tells_branches_from_straight_code() {
        let mut lab = Lab::new().expect("a lab");
        let at = 0x5555_0000_1000u64;
        let cases: &[(&[u8], u64, Probed)] = &[
            (&[0x48, 0x01, 0xd8], 3, Probed::Straight), // add rax, rbx
            (&[0x74, 0x05], 2, Probed::Branch),         // je
            (&[0x70, 0x05], 2, Probed::Branch),         // jo
            (&[0x0f, 0x8a, 0, 1, 0, 0], 6, Probed::Branch), // jp rel32
            (&[0xe3, 0x05], 2, Probed::Branch),         // jrcxz
            (&[0xe2, 0x05], 2, Probed::Branch),         // loop
            (&[0xc3], 1, Probed::Branch),               // ret
            (&[0xe8, 0x10, 0, 0, 0], 5, Probed::Branch), // call
            (&[0xff, 0xe0], 2, Probed::Branch),         // jmp rax
            (&[0x0f, 0x05], 2, Probed::Syscall),        // syscall
            (&[0x48, 0x8b, 0x03], 3, Probed::Straight), // mov rax, [rbx]
            (&[0x48, 0x8b, 0x05, 0, 0, 0, 1], 7, Probed::TouchesMemory), // mov rax, [rip+16M]
            (&[0x48, 0x8b, 0x04, 0x24], 4, Probed::Straight), // mov rax, [rsp]
            (&[0x50], 1, Probed::Straight),             // push rax
            (&[0x0f, 0x44, 0xc3], 3, Probed::Straight), // cmove eax, ebx
            (&[0xf3, 0x48, 0xa5], 3, Probed::Branch),   // rep movsq: repeats itself
            (&[0xf3, 0x90], 2, Probed::Straight),       // pause
            (&[0xff, 0x25, 0, 0, 0, 1], 6, Probed::TouchesMemory), // jmp [rip+16M]
        ];
        for &(code, len, want) in cases {
            let got = lab.probe(at, code, len).expect("a probe");
            assert_eq!(got, want, "{code:02x?}");
        }
        assert!(lab.runs > 0);
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn the_lab_tells_branches_from_straight_code() {
        let mut lab = Lab::new().expect("a lab");
        let at = 0x5555_0000_1000u64;
        let cases: &[(u32, Probed)] = &[
            (0x8b020020, Probed::Straight),      // add x0, x1, x2
            (0x54000040, Probed::Branch),        // b.eq +8
            (0x54000068, Probed::Branch),        // b.hi +12
            (0xb4000040, Probed::Branch),        // cbz x0, +8
            (0xb5000040, Probed::Branch),        // cbnz x0, +8
            (0x36180040, Probed::Branch),        // tbz w0, #3, +8
            (0x37180040, Probed::Branch),        // tbnz w0, #3, +8
            (0xd65f03c0, Probed::Branch),        // ret
            (0x94000010, Probed::Branch),        // bl +64
            (0xd4000001, Probed::Syscall),       // svc #0
            (0xf9400020, Probed::Straight),      // ldr x0, [x1]
            (0x58800000, Probed::TouchesMemory), // ldr x0, . - 1M (a literal)
            (0xa9bf7bfd, Probed::Straight),      // stp x29, x30, [sp, #-16]!
            (0x9a821020, Probed::Straight),      // csel x0, x1, x2, ne
        ];
        for &(word, want) in cases {
            let got = lab.probe(at, &word.to_le_bytes(), 4).expect("a probe");
            assert_eq!(got, want, "{word:08x}");
        }
    }

    #[test]
    fn the_lab_is_gone_when_dropped() {
        let lab = Lab::new().expect("a lab");
        let pid = lab.pid;
        drop(lab);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}
