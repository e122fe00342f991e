//! Unwinding for a guest of any architecture (a kernel in QEMU), whatever the host's: both
//! framehop unwinders, modules placed where the guest has them, and stack memory read through
//! a callback (guest memory arrives over QMP or the gdbstub).

use std::ops::Range;
use std::sync::Arc;

use framehop::{FrameAddress, Unwinder};

use crate::arch::Arch;
use crate::elf::{ElfImage, SectionBytes};
use crate::process::{outcome, walk, UnwindOutcome};
use crate::regs::UserRegs;

enum Inner {
    X86_64(
        framehop::x86_64::UnwinderX86_64<SectionBytes>,
        framehop::x86_64::CacheX86_64,
    ),
    Aarch64(
        framehop::aarch64::UnwinderAarch64<SectionBytes>,
        framehop::aarch64::CacheAarch64,
    ),
}

/// The unwinder of one guest address space.
pub struct GuestUnwinder {
    inner: Inner,
    /// Each module's guest addresses, image and bias (to ask its CFI where the stack ends).
    modules: Vec<(Range<u64>, Arc<ElfImage>, u64)>,
}

impl GuestUnwinder {
    /// An unwinder for a guest of `arch` that knows no module yet
    /// ([`GuestUnwinder::add_module`]).
    pub fn new(arch: Arch) -> GuestUnwinder {
        let inner = match arch {
            Arch::X86_64 => Inner::X86_64(
                framehop::x86_64::UnwinderX86_64::new(),
                framehop::x86_64::CacheX86_64::new(),
            ),
            Arch::Aarch64 => Inner::Aarch64(
                framehop::aarch64::UnwinderAarch64::new(),
                framehop::aarch64::CacheAarch64::new(),
            ),
        };
        GuestUnwinder {
            inner,
            modules: Vec::new(),
        }
    }

    /// Places `image` at guest addresses `avma` (its ELF addresses plus `bias`).
    pub fn add_module(&mut self, image: &Arc<ElfImage>, name: &str, avma: Range<u64>, bias: u64) {
        self.modules.push((avma.clone(), image.clone(), bias));
        let m = image.framehop_module(name.to_owned(), avma, bias);
        match &mut self.inner {
            Inner::X86_64(u, _) => u.add_module(m),
            Inner::Aarch64(u, _) => u.add_module(m),
        }
    }

    /// Unwinds from `regs`, reading 8-byte stack words with `read`; frames go to `out`,
    /// innermost first.
    pub fn unwind<F: FnMut(u64) -> Result<u64, ()>>(
        &mut self,
        regs: &UserRegs,
        read: &mut F,
        out: &mut Vec<FrameAddress>,
    ) -> UnwindOutcome {
        // Code whose ELF has no unwind tables (a kernel built with frame pointers and no
        // .eh_frame): its chain of frame records, as perf walks it.
        if self
            .modules
            .iter()
            .any(|(r, img, _)| r.contains(&regs.pc) && !img.has_unwind_info())
        {
            return frame_pointer_walk(regs, read, out, 256);
        }
        let (end, ra) = match &mut self.inner {
            Inner::X86_64(u, cache) => {
                let r = framehop::x86_64::UnwindRegsX86_64::new(regs.pc, regs.sp, regs.fp);
                (
                    walk(u.iter_frames(regs.pc, r, cache, read), 256, out),
                    gimli::X86_64::RA,
                )
            }
            Inner::Aarch64(u, cache) => {
                let r = framehop::aarch64::UnwindRegsAarch64::new(regs.lr, regs.sp, regs.fp);
                (
                    walk(u.iter_frames(regs.pc, r, cache, read), 256, out),
                    gimli::AArch64::X30,
                )
            }
        };
        let aarch64 = ra == gimli::AArch64::X30; // (the return-address column says the arch)
        outcome(end, out.last(), aarch64, |avma| {
            let (_, img, bias) = self.modules.iter().find(|(r, _, _)| r.contains(&avma))?;
            img.cfi_ends_stack(avma.wrapping_sub(*bias), ra)
        })
    }
}

/// A frame address as a plain address and whether it is a return address.
pub fn frame_parts(f: &FrameAddress) -> (u64, bool) {
    match f {
        FrameAddress::InstructionPointer(a) => (*a, false),
        FrameAddress::ReturnAddress(a) => (a.get(), true),
    }
}

/// The chain of frame records from `regs`: the pc, then each record's return address, until a
/// null frame pointer (the convention's end of the stack, after its record's return address)
/// or a null return address. A record is [caller's frame pointer, return address] at the frame
/// pointer, on both architectures (rbp on x86_64, x29 on AArch64); each must lie above the one
/// before. The caller of a leaf function that keeps no record is not seen (as with perf).
pub fn frame_pointer_walk<F: FnMut(u64) -> Result<u64, ()>>(
    regs: &UserRegs,
    read: &mut F,
    out: &mut Vec<FrameAddress>,
    max_depth: usize,
) -> UnwindOutcome {
    use crate::process::Truncation;
    out.push(FrameAddress::from_instruction_pointer(regs.pc));
    let mut fp = regs.fp;
    let mut last = regs.sp;
    loop {
        if fp == 0 {
            return if out.len() >= 2 {
                UnwindOutcome::Complete
            } else {
                UnwindOutcome::Truncated(Truncation::NoUnwindInfo)
            };
        }
        if fp < last || !fp.is_multiple_of(8) {
            return UnwindOutcome::Truncated(Truncation::FramePointer);
        }
        let (Some(ra_at), true) = (fp.checked_add(8), out.len() < max_depth) else {
            return UnwindOutcome::Truncated(Truncation::Depth);
        };
        let (Ok(next), Ok(ra)) = (read(fp), read(ra_at)) else {
            return UnwindOutcome::Truncated(Truncation::Unreadable);
        };
        let Some(ra) = FrameAddress::from_return_address(ra) else {
            // A null return address: the end, as a null frame pointer.
            return if out.len() >= 2 {
                UnwindOutcome::Complete
            } else {
                UnwindOutcome::Truncated(Truncation::FramePointer)
            };
        };
        out.push(ra);
        if next != 0 && next <= fp {
            return UnwindOutcome::Truncated(Truncation::FramePointer);
        }
        last = fp;
        fp = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack of records: leaf at 0x1000 with fp 0x7f00 -> [0x7f20, ra1] -> [0x7f40, ra2] ->
    /// [0, ra3]: four frames, complete.
    #[test]
    fn frame_records_to_the_null_frame_pointer() {
        let mem: std::collections::HashMap<u64, u64> = [
            (0x7f00, 0x7f20),
            (0x7f08, 0x2004),
            (0x7f20, 0x7f40),
            (0x7f28, 0x3008),
            (0x7f40, 0),
            (0x7f48, 0x400c),
        ]
        .into_iter()
        .collect();
        let regs = UserRegs {
            pc: 0x1000,
            sp: 0x7ef0,
            fp: 0x7f00,
            lr: 0,
        };
        let mut read = |a: u64| mem.get(&a).copied().ok_or(());
        let mut out = Vec::new();
        let o = frame_pointer_walk(&regs, &mut read, &mut out, 64);
        assert_eq!(o, UnwindOutcome::Complete);
        let addrs: Vec<u64> = out.iter().map(|f| crate::guest::frame_parts(f).0).collect();
        assert_eq!(addrs, [0x1000, 0x2004, 0x3008, 0x400c]);
        // A record pointing backwards, memory that cannot be read, the depth limit.
        let mut bad = mem.clone();
        bad.insert(0x7f20, 0x7f00);
        let mut read = |a: u64| bad.get(&a).copied().ok_or(());
        let mut out = Vec::new();
        assert_eq!(
            frame_pointer_walk(&regs, &mut read, &mut out, 64),
            UnwindOutcome::Truncated(crate::process::Truncation::FramePointer)
        );
        let mut read = |a: u64| {
            if a < 0x7f40 {
                mem.get(&a).copied().ok_or(())
            } else {
                Err(())
            }
        };
        let mut out = Vec::new();
        assert_eq!(
            frame_pointer_walk(&regs, &mut read, &mut out, 64),
            UnwindOutcome::Truncated(crate::process::Truncation::Unreadable)
        );
        let mut read = |a: u64| mem.get(&a).copied().ok_or(());
        let mut out = Vec::new();
        assert_eq!(
            frame_pointer_walk(&regs, &mut read, &mut out, 2),
            UnwindOutcome::Truncated(crate::process::Truncation::Depth)
        );
    }
}
