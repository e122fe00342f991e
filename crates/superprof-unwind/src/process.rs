//! The executable mappings of one process and its framehop unwinder.

use std::path::Path;

use framehop::{FrameAddress, Unwinder};

use crate::elf::{ElfCache, ModuleId, SectionBytes};
use crate::regs::UserRegs;

#[cfg(target_arch = "x86_64")]
type ArchUnwinder = framehop::x86_64::UnwinderX86_64<SectionBytes>;
#[cfg(target_arch = "x86_64")]
type ArchCache = framehop::x86_64::CacheX86_64;
#[cfg(target_arch = "aarch64")]
type ArchUnwinder = framehop::aarch64::UnwinderAarch64<SectionBytes>;
#[cfg(target_arch = "aarch64")]
type ArchCache = framehop::aarch64::CacheAarch64;

/// One executable mapping: runtime addresses `start..end` of `module`, whose ELF virtual
/// address `svma` sits at runtime address `svma + bias`.
#[derive(Debug, Clone, Copy)]
pub struct Mapping {
    /// The first runtime address of the mapping.
    pub start: u64,
    /// The runtime address just past the mapping (exclusive).
    pub end: u64,
    /// The file mapped, in the run's [`ElfCache`].
    pub module: ModuleId,
    /// Runtime address minus ELF virtual address (wrapping: a kernel's may be "negative").
    pub bias: u64,
}

/// How an unwind ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnwindOutcome {
    /// Ended where the stack ends: the CFI of the outermost frame says its return address is
    /// undefined (`_start`, a thread's start, a kernel's entry).
    Complete,
    /// Stopped before that.
    Truncated(Truncation),
}

/// Why an unwind stopped before the end of the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Truncation {
    /// The outermost frame found has no unwind information (CFI): the frame-pointer fallback
    /// ended there.
    NoUnwindInfo,
    /// Stack memory could not be read (beyond the copy, or unmapped).
    Unreadable,
    /// The frame-pointer fallback went wrong (backwards, no progress, a null return address),
    /// or ended where the CFI has a rule for going on.
    FramePointer,
    /// The depth limit.
    Depth,
}

impl Truncation {
    /// Every reason, for tables of counts.
    pub const ALL: [Truncation; 4] = [
        Truncation::NoUnwindInfo,
        Truncation::Unreadable,
        Truncation::FramePointer,
        Truncation::Depth,
    ];

    /// The reason in a few words.
    pub fn as_str(self) -> &'static str {
        match self {
            Truncation::NoUnwindInfo => "no unwind info",
            Truncation::Unreadable => "unreadable memory",
            Truncation::FramePointer => "frame-pointer fallback failed",
            Truncation::Depth => "depth limit",
        }
    }
}

/// How framehop's walk ended: its end (Ok), its error, or the depth limit (None).
pub(crate) type WalkEnd = Option<Result<(), framehop::Error>>;

/// Walks at most `depth` frames into `out` (a bound against cycles in corrupt frame-pointer
/// chains), and says how the walk ended.
pub(crate) fn walk<U, F>(
    mut iter: framehop::UnwindIterator<'_, '_, '_, U, F>,
    depth: usize,
    out: &mut Vec<FrameAddress>,
) -> WalkEnd
where
    U: Unwinder,
    F: FnMut(u64) -> Result<u64, ()>,
{
    for _ in 0..depth {
        match iter.next() {
            Ok(Some(frame)) => out.push(frame),
            Ok(None) => return Some(Ok(())),
            Err(e) => return Some(Err(e)),
        }
    }
    None
}

/// The honest outcome of a walk: complete only where the outermost frame's CFI says the stack
/// ends (`ends` answers for an address; a return address is looked up at the call, one byte
/// before it), or, on AArch64 (`aarch64`), where framehop stopped at a frame record whose
/// saved frame pointer is null: AAPCS64's end of the chain, which glibc's thread_start sets
/// (it clears x29 before calling start_thread, whose CFI has a rule for every register).
pub(crate) fn outcome(
    end: WalkEnd,
    last: Option<&FrameAddress>,
    aarch64: bool,
    ends: impl Fn(u64) -> Option<bool>,
) -> UnwindOutcome {
    match end {
        None => UnwindOutcome::Truncated(Truncation::Depth),
        Some(Err(framehop::Error::CouldNotReadStack(_))) => {
            UnwindOutcome::Truncated(Truncation::Unreadable)
        }
        Some(Err(_)) => UnwindOutcome::Truncated(Truncation::FramePointer),
        Some(Ok(())) => {
            let at = match last {
                Some(FrameAddress::InstructionPointer(a)) => *a,
                Some(FrameAddress::ReturnAddress(a)) => a.get() - 1,
                None => return UnwindOutcome::Truncated(Truncation::NoUnwindInfo),
            };
            match ends(at) {
                Some(true) => UnwindOutcome::Complete,
                // framehop ends an AArch64 walk cleanly only at a null frame pointer or
                // return address, or an undefined return address: the chain's end.
                Some(false) if aarch64 => UnwindOutcome::Complete,
                Some(false) => UnwindOutcome::Truncated(Truncation::FramePointer),
                None => UnwindOutcome::Truncated(Truncation::NoUnwindInfo),
            }
        }
    }
}

/// The return-address column of the host's CFI.
#[cfg(target_arch = "x86_64")]
const HOST_RA: gimli::Register = gimli::X86_64::RA;
#[cfg(target_arch = "aarch64")]
const HOST_RA: gimli::Register = gimli::AArch64::X30;

/// Mappings and unwinder of one address space.
pub struct ProcessModules {
    mappings: Vec<Mapping>,
    /// The image of each mapping's module (to ask its CFI where the stack ends).
    images: std::collections::HashMap<ModuleId, std::sync::Arc<crate::elf::ElfImage>>,
    unwinder: ArchUnwinder,
    cache: ArchCache,
}

impl Default for ProcessModules {
    fn default() -> Self {
        ProcessModules {
            mappings: Vec::new(),
            images: Default::default(),
            unwinder: ArchUnwinder::new(),
            cache: ArchCache::new(),
        }
    }
}

impl ProcessModules {
    /// Records an executable mapping of `path` (as the target names it; `open_path` is where
    /// superprof can read it, e.g. through /proc/PID/root).
    pub fn add_mapping_at(
        &mut self,
        elves: &mut ElfCache,
        start: u64,
        len: u64,
        pgoff: u64,
        path: &Path,
        open_path: &Path,
    ) -> Mapping {
        let end = start.saturating_add(len);
        let module = elves.module(path, open_path);
        let image = elves.image(module).cloned();
        let bias = crate::elf::ElfImage::mapping_bias(image.as_deref(), start, len, pgoff);
        // A new mapping replaces whatever executable mapping it overlaps.
        let (gone, kept): (Vec<Mapping>, Vec<Mapping>) = self
            .mappings
            .iter()
            .partition(|m| m.start < end && start < m.end);
        for m in gone {
            self.unwinder.remove_module(m.start);
        }
        self.mappings = kept;
        let mapping = Mapping {
            start,
            end,
            module,
            bias,
        };
        let at = self.mappings.partition_point(|m| m.start < start);
        self.mappings.insert(at, mapping);
        if let Some(img) = image {
            let name = path.to_string_lossy().into_owned();
            self.unwinder
                .add_module(img.framehop_module(name, start..end, bias));
            self.images.insert(module, img);
        }
        mapping
    }

    /// [`ProcessModules::add_mapping_at`] for a file readable at the path the target uses.
    pub fn add_mapping(
        &mut self,
        elves: &mut ElfCache,
        start: u64,
        len: u64,
        pgoff: u64,
        path: &Path,
    ) -> Mapping {
        self.add_mapping_at(elves, start, len, pgoff, path, path)
    }

    /// The address space of a child forked from this process: the same mappings.
    pub fn fork(&self, elves: &ElfCache) -> ProcessModules {
        let mut child = ProcessModules {
            mappings: self.mappings.clone(),
            ..ProcessModules::default()
        };
        for m in &self.mappings {
            if let Some(img) = elves.image(m.module) {
                let name = elves.path(m.module).to_string_lossy().into_owned();
                child
                    .unwinder
                    .add_module(img.framehop_module(name, m.start..m.end, m.bias));
                child.images.insert(m.module, img.clone());
            }
        }
        child
    }

    /// Forgets every mapping (the process called exec).
    pub fn clear(&mut self) {
        *self = ProcessModules::default();
    }

    /// Adds JIT code with unwind tables of its own (from a jitdump) to the unwinder; code
    /// at an address already known is replaced.
    pub fn add_jit_module(&mut self, module: framehop::Module<SectionBytes>, start: u64) {
        self.unwinder.remove_module(start);
        self.unwinder.add_module(module);
    }

    /// The mapping that contains runtime address `avma`.
    pub fn lookup(&self, avma: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= avma);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        (avma < m.end).then_some(m)
    }

    /// The executable mappings known, by start address (none overlap).
    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// Unwinds the user stack. `stack` is a copy of memory starting at `regs.sp`. Frames are
    /// appended to `out`, innermost first.
    pub fn unwind(
        &mut self,
        regs: &UserRegs,
        stack: &[u8],
        out: &mut Vec<FrameAddress>,
    ) -> UnwindOutcome {
        let sp = regs.sp;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())? as usize;
            let bytes = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_ne_bytes(bytes.try_into().map_err(|_| ())?))
        };
        #[cfg(target_arch = "x86_64")]
        let uregs = framehop::x86_64::UnwindRegsX86_64::new(regs.pc, regs.sp, regs.fp);
        #[cfg(target_arch = "aarch64")]
        let uregs = framehop::aarch64::UnwindRegsAarch64::new(regs.lr, regs.sp, regs.fp);
        let iter = self
            .unwinder
            .iter_frames(regs.pc, uregs, &mut self.cache, &mut read_stack);
        let end = walk(iter, 1024, out);
        outcome(end, out.last(), cfg!(target_arch = "aarch64"), |avma| {
            let m = self.lookup(avma)?;
            let img = self.images.get(&m.module)?;
            img.cfi_ends_stack(avma.wrapping_sub(m.bias), HOST_RA)
        })
    }
}

#[cfg(test)]
mod outcome_tests {
    use super::*;

    #[test]
    fn a_walk_is_complete_where_the_cfi_or_aarch64s_null_frame_says_so() {
        let last = FrameAddress::InstructionPointer(0x1000);
        let (ends, rule) = (|_| Some(true), |_| Some(false));
        assert_eq!(
            outcome(Some(Ok(())), Some(&last), false, ends),
            UnwindOutcome::Complete
        );
        // x86_64: framehop's clean end at a frame whose CFI has a rule is not the stack's.
        assert_eq!(
            outcome(Some(Ok(())), Some(&last), false, rule),
            UnwindOutcome::Truncated(Truncation::FramePointer)
        );
        // AArch64: framehop ends cleanly only at a null frame pointer or return address.
        assert_eq!(
            outcome(Some(Ok(())), Some(&last), true, rule),
            UnwindOutcome::Complete
        );
        assert_eq!(
            outcome(Some(Ok(())), Some(&last), true, |_| None),
            UnwindOutcome::Truncated(Truncation::NoUnwindInfo)
        );
        assert_eq!(
            outcome(None, Some(&last), true, ends),
            UnwindOutcome::Truncated(Truncation::Depth)
        );
        assert_eq!(
            outcome(
                Some(Err(framehop::Error::CouldNotReadStack(8))),
                Some(&last),
                true,
                ends
            ),
            UnwindOutcome::Truncated(Truncation::Unreadable)
        );
    }
}
