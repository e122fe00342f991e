//! Unwinding for a guest of any architecture (a kernel in QEMU), whatever the host's: both
//! framehop unwinders, modules placed where the guest has them, and stack memory read through
//! a callback (guest memory arrives over QMP or the gdbstub).

use std::ops::Range;
use std::sync::Arc;

use framehop::{FrameAddress, Unwinder};

use crate::elf::{ElfImage, SectionBytes};
use crate::process::{outcome, walk, UnwindOutcome};
use crate::regs::UserRegs;

/// A guest's instruction set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuestArch {
    X86_64,
    Aarch64,
}

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
    pub fn new(arch: GuestArch) -> GuestUnwinder {
        let inner = match arch {
            GuestArch::X86_64 => Inner::X86_64(
                framehop::x86_64::UnwinderX86_64::new(),
                framehop::x86_64::CacheX86_64::new(),
            ),
            GuestArch::Aarch64 => Inner::Aarch64(
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
        outcome(end, out.last(), |avma| {
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
