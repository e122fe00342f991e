//! Sampling a guest: stop it, read the registers, unwind through guest memory, let it go; and
//! recognizing the guest's programs by their code. (`superprof qemu` decides when; this is
//! one sample's work.)

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Arch, Backend, QemuError};
use superprof_unwind::{frame_parts, ElfImage, GuestUnwinder, Truncation, UnwindOutcome, UserRegs};

/// An ELF file of the guest: the kernel, or a program given with --user.
pub struct GuestElf {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its file name (the module's name in profiles).
    pub name: String,
    /// Its unwind tables and sections, parsed once.
    pub image: Arc<ElfImage>,
    /// `.text`: ELF address and bytes (programs are recognized by it).
    pub text: (u64, Vec<u8>),
    /// Whether it has a symbol table (static or dynamic).
    pub has_symbols: bool,
    /// Linux's own unwind tables (`.orc_unwind`), which superprof does not read.
    pub has_orc: bool,
    /// The machine it is for (None: neither x86_64 nor AArch64).
    pub arch: Option<Arch>,
}

/// The largest `.text` a guest ELF file may have (it is copied).
const MAX_TEXT: u64 = 512 << 20;

impl GuestElf {
    /// Reads the ELF file at `path` (mapped, not read whole: a 2 GB file costs no memory; a
    /// device or FIFO is refused), or says why it cannot.
    pub fn open(path: &Path) -> Result<GuestElf, String> {
        use object::{Object, ObjectSection};
        let data = superprof_unwind::map_file(path).map_err(|e| e.to_string())?;
        let obj = object::File::parse(&*data)
            .map_err(|_| "not an x86_64 or AArch64 ELF file".to_owned())?;
        // Copied (programs are recognized by it): at most MAX_TEXT, a kernel's is tens of MB.
        let text = obj
            .section_by_name(".text")
            .and_then(|s| Some((s.address(), s.data().ok()?)))
            .unwrap_or_default();
        if text.1.len() as u64 > MAX_TEXT {
            return Err(format!(
                "its .text is {} MiB (at most {} MiB)",
                text.1.len() >> 20,
                MAX_TEXT >> 20
            ));
        }
        let text = (text.0, text.1.to_vec());
        let has_symbols = obj.symbols().next().is_some() || obj.dynamic_symbols().next().is_some();
        let has_orc = obj.section_by_name(".orc_unwind").is_some();
        let arch = match obj.architecture() {
            object::Architecture::X86_64 => Some(Arch::X86_64),
            object::Architecture::Aarch64 => Some(Arch::Aarch64),
            _ => None,
        };
        Ok(GuestElf {
            path: path.to_owned(),
            name: path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            image: Arc::new(ElfImage::open(path).ok_or("not an ELF file it can read")?),
            text,
            has_symbols,
            has_orc,
            arch,
        })
    }
}

/// Whose code a sample is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// The kernel's code (its ELF, slid).
    Kernel,
    /// Index into the --user programs.
    User(usize),
    /// Code of no ELF given.
    Unknown,
}

/// One sample: owner, frames innermost first as (guest address, is a return address, the
/// ELF it belongs to and its bias), and why the unwind stopped before the stack's root, if
/// it did.
pub struct RawSample {
    /// When it was taken, from the start of sampling.
    pub time: Duration,
    /// The vCPU it was taken on.
    pub vcpu: usize,
    /// Whose code its pc is in.
    pub owner: Owner,
    /// The address space of a sample in user code (the root of its page tables), where the
    /// backend can read it.
    pub space: Option<u64>,
    /// (guest address, is a return address, its ELF, that ELF's bias), innermost first.
    pub frames: Vec<(u64, bool, Owner, u64)>,
    /// Why the unwind stopped early, if it did.
    pub truncated: Option<Truncation>,
}

impl RawSample {
    /// Whether the unwind ended where the CFI says the stack ends.
    pub fn complete(&self) -> bool {
        self.truncated.is_none()
    }
}

/// An address space of the guest (or all of them, where the backend cannot tell them apart):
/// the programs found in it, and an unwinder that knows the kernel and them.
struct Space {
    /// Guest ranges where a program's .text was found: (range, program, bias).
    placed: Vec<(Range<u64>, usize, u64)>,
    /// Guest pages of unknown code already searched.
    unmatched: HashSet<u64>,
    unwinder: GuestUnwinder,
}

/// The most address spaces kept apart; samples of more share one.
pub const MAX_SPACES: usize = 4096;

/// One sample of a stopped guest at a time: the registers read, the stack unwound through
/// guest memory by the kernel's tables or a recognized program's, the KASLR slide found, the
/// programs placed by their code per address space.
pub struct Sampler {
    arch: Arch,
    /// The kernel's ELF file.
    pub kernel: GuestElf,
    /// Where the kernel's code is in the guest: its ELF's executable ranges, plus the slide.
    kernel_ranges: Vec<Range<u64>>,
    /// How far above its link addresses the kernel runs (KASLR), once known.
    pub kernel_slide: u64,
    /// Whether the slide is known (found in memory or given), or no longer looked for.
    slide_settled: bool,
    /// Pages of the upper half already tried for the slide.
    slide_tried: HashSet<u64>,
    /// The kernel's symbols from --kallsyms, at link addresses.
    pub kernel_symbols: Option<superprof_symbols::Kallsyms>,
    /// The same file as it was read, for modules' code (kallsyms gives their addresses).
    pub runtime_symbols: Option<superprof_symbols::Kallsyms>,
    /// The programs given with --user.
    pub users: Vec<GuestElf>,
    /// By address space (None: not known); the kernel's samples use None's.
    spaces: HashMap<Option<u64>, Space>,
    /// Says on stderr what it finds (slide, programs placed).
    pub verbose: bool,
    /// Time spent per sample, stop to resume.
    pub busy: Duration,
}

/// Chunks of guest memory read during one sample.
struct MemCache<'a> {
    backend: &'a mut dyn Backend,
    chunks: HashMap<u64, Option<Vec<u8>>>,
    /// The top of the stack, read at once from sp: (sp, bytes).
    top: Option<(u64, Vec<u8>)>,
}

const CHUNK: u64 = 512;
/// Bytes read from the stack pointer up, first: the frames of most samples lie there, so
/// that one read serves the whole unwind.
const TOP: u64 = 1024;

impl MemCache<'_> {
    fn new(backend: &mut dyn Backend) -> MemCache<'_> {
        MemCache {
            backend,
            chunks: HashMap::new(),
            top: None,
        }
    }

    /// Reads the stack from `sp` up: TOP bytes, or to the end of sp's page when that is
    /// 256 bytes or more away (a read that runs into an unmapped page gets nothing).
    fn read_top(&mut self, sp: u64) {
        let to_page_end = 0x1000 - (sp & 0xfff);
        let len = if to_page_end >= 256 {
            to_page_end.min(TOP)
        } else {
            TOP
        };
        let mut buf = vec![0u8; len as usize];
        if let Ok(n) = self.backend.read(sp, &mut buf) {
            buf.truncate(n);
            self.top = Some((sp, buf));
        }
    }

    fn word(&mut self, addr: u64) -> Option<u64> {
        if let Some((sp, top)) = &self.top {
            if let Some(b) = addr
                .checked_sub(*sp)
                .and_then(|off| top.get(off as usize..(off as usize).checked_add(8)?))
            {
                return Some(u64::from_le_bytes(b.try_into().ok()?));
            }
        }
        let mut out = [0u8; 8];
        for (i, b) in out.iter_mut().enumerate() {
            let a = addr.checked_add(i as u64)?;
            let base = a - a % CHUNK;
            let chunk = self.chunks.entry(base).or_insert_with(|| {
                let mut buf = vec![0u8; CHUNK as usize];
                match self.backend.read(base, &mut buf) {
                    Ok(n) if n == buf.len() => Some(buf),
                    _ => None,
                }
            });
            *b = chunk.as_ref()?[(a - base) as usize];
        }
        Some(u64::from_le_bytes(out))
    }
}

impl Sampler {
    /// A sampler of a guest of `arch` running `kernel` and the programs `users`.
    pub fn new(arch: Arch, kernel: GuestElf, users: Vec<GuestElf>) -> Sampler {
        let kernel_ranges = kernel.image.executable_ranges();
        Sampler {
            arch,
            kernel,
            kernel_ranges,
            kernel_slide: 0,
            slide_settled: false,
            slide_tried: HashSet::new(),
            kernel_symbols: None,
            runtime_symbols: None,
            users,
            spaces: HashMap::new(),
            verbose: false,
            busy: Duration::ZERO,
        }
    }

    /// Address space `key`'s state, made on first use (with the kernel in its unwinder).
    fn space(&mut self, key: Option<u64>) -> &mut Space {
        let (arch, kernel, ranges) = (self.arch, &self.kernel, &self.kernel_ranges);
        let slide = self.kernel_slide;
        self.spaces.entry(key).or_insert_with(|| {
            let mut unwinder = GuestUnwinder::new(arch);
            for r in ranges {
                unwinder.add_module(&kernel.image, &kernel.name, r.clone(), slide);
            }
            Space {
                placed: Vec::new(),
                unmatched: HashSet::new(),
                unwinder,
            }
        })
    }

    fn in_kernel(&self, pc: u64) -> bool {
        self.kernel_ranges.iter().any(|r| r.contains(&pc))
    }

    /// Places the kernel `slide` above its link addresses (KASLR): its ranges move, and the
    /// address spaces start again (their unwinders had the kernel where it is not).
    pub fn set_slide(&mut self, slide: u64) {
        self.kernel_slide = slide;
        self.slide_settled = true;
        self.kernel_ranges = self
            .kernel
            .image
            .executable_ranges()
            .into_iter()
            .map(|r| r.start.wrapping_add(slide)..r.end.wrapping_add(slide))
            .collect();
        self.spaces.clear();
    }

    /// Looks for the kernel's slide from a pc in the upper half (inside the kernel's link
    /// ranges too: a small slide leaves pcs there), when the kernel is linked there too: the
    /// 4 KiB page around the pc is compared with each page of the kernel's .text at the same
    /// offset in a page; the best match, if it is one (75% of the bytes equal: relocations
    /// and the running kernel's own patching change some), and clearly better than any other,
    /// gives the slide (0: not slid, settled silently), confirmed on a second page. At most
    /// 64 pages are tried (code in modules matches nothing).
    fn find_slide(&mut self, mem: &mut MemCache, pc: u64) {
        let (text_addr, text) = (self.kernel.text.0, &self.kernel.text.1);
        let upper = |a: u64| a >> 63 == 1;
        if self.slide_settled || !upper(pc) || !upper(text_addr) || text.len() < 64 {
            return;
        }
        let page = pc & !0xfff;
        if !self.slide_tried.insert(page) {
            return;
        }
        if self.slide_tried.len() > 64 {
            self.slide_settled = true;
            return;
        }
        let mut guest = vec![0u8; 4096];
        if !matches!(mem.backend.read(page, &mut guest), Ok(4096)) {
            return;
        }
        // The share of bytes equal between guest memory at `at` and the kernel's .text at
        // link address `link` (4096 bytes, or what of them lies in .text: 1 KiB at least, or
        // all of a smaller .text).
        let least = text.len().min(1024) as u64;
        let similar = |guest: &[u8], link: u64| -> f64 {
            let start = link.max(text_addr);
            let end = link.saturating_add(4096).min(text_addr + text.len() as u64);
            if end <= start || end - start < least {
                return 0.0;
            }
            let (g, t) = (
                &guest[(start - link) as usize..(end - link) as usize],
                &text[(start - text_addr) as usize..(end - text_addr) as usize],
            );
            // A running kernel patches its own code (alternatives, static keys, paravirt
            // calls, ftrace's nops): a page of Debian's kernel can differ from the file in
            // more than a tenth of its bytes. Unrelated code agrees in far fewer than 3 in 4.
            let allowed = g.len() / 4;
            let mut differ = 0;
            for (a, b) in g.iter().zip(t) {
                if a != b {
                    differ += 1;
                    if differ > allowed {
                        return 0.0;
                    }
                }
            }
            1.0 - differ as f64 / g.len() as f64
        };
        let mut scored: Vec<(f64, u64)> = Vec::new();
        let mut link = text_addr & !0xfff;
        while link < text_addr + text.len() as u64 {
            let score = similar(&guest, link);
            if score > 0.0 {
                scored.push((score, page.wrapping_sub(link)));
            }
            link += 4096;
        }
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        let Some(&(best, slide)) = scored.first() else {
            return;
        };
        if scored
            .get(1)
            .is_some_and(|&(second, _)| second > best - 0.05)
        {
            return; // no clear winner (a page of padding, or repeated code)
        }
        // Confirmed on another page of .text: its middle.
        let other = (text_addr + text.len() as u64 / 2) & !0xfff;
        if other != page.wrapping_sub(slide)
            && (!matches!(
                mem.backend.read(other.wrapping_add(slide), &mut guest),
                Ok(4096)
            ) || similar(&guest, other) < 0.75)
        {
            return;
        }
        if slide != 0 {
            superprof_unwind::say!(
                "superprof: the kernel runs {slide:#x} above its link addresses (KASLR): found in \
                 guest memory, its frames are placed there"
            );
        }
        self.set_slide(slide);
    }

    /// Takes the kernel's symbols from a System.map or kallsyms file. A file whose `_stext`
    /// (or `_text`) is not the ELF's `.text` address was read from the running kernel: the
    /// difference is the slide.
    pub fn set_kernel_symbols(&mut self, syms: superprof_symbols::Kallsyms) -> Option<u64> {
        let at = syms
            .address_of("_stext")
            .or_else(|| syms.address_of("_text"));
        let offset = at.map_or(0, |a| a.wrapping_sub(self.kernel.text.0));
        let slid = offset != 0 && self.kernel.text.0 != 0;
        if slid {
            self.set_slide(offset);
            self.kernel_symbols = Some(syms.shifted(offset.wrapping_neg()));
        } else {
            self.kernel_symbols = Some(syms.shifted(0));
        }
        self.runtime_symbols = Some(syms);
        slid.then_some(offset)
    }

    fn owner_of(&self, space: Option<u64>, pc: u64) -> Option<(Owner, u64)> {
        if self.in_kernel(pc) {
            return Some((Owner::Kernel, self.kernel_slide));
        }
        self.spaces
            .get(&space)?
            .placed
            .iter()
            .find(|(r, _, _)| r.contains(&pc))
            .map(|&(_, u, bias)| (Owner::User(u), bias))
    }

    /// Looks for the code at `pc` of address space `space` in the programs' .text; a match is
    /// confirmed by comparing the hash of the whole .text in guest memory with the file's.
    fn recognize(
        &mut self,
        mem: &mut MemCache,
        space: Option<u64>,
        pc: u64,
    ) -> Option<(Owner, u64)> {
        let page = pc & !0xfff;
        if self.users.is_empty() || self.space(space).unmatched.contains(&page) {
            return None;
        }
        // 16 bytes from pc, and the 16 before it: one of them lies inside the program's .text
        // even where pc is near either end of it.
        let mut window = |from: u64| -> Option<[u8; 16]> {
            let mut w = [0u8; 16];
            w[..8].copy_from_slice(&mem.word(from)?.to_le_bytes());
            w[8..].copy_from_slice(&mem.word(from.checked_add(8)?)?.to_le_bytes());
            Some(w)
        };
        let after = window(pc);
        let before = pc.checked_sub(16).and_then(&mut window);
        if after.is_none() && before.is_none() {
            return None;
        }
        for (u, elf) in self.users.iter().enumerate() {
            let (text_addr, text) = &elf.text;
            // Where the code at pc could start: each place the bytes occur (at most a few,
            // each checked below).
            let mut starts: Vec<u64> = Vec::new();
            for (i, w) in text.windows(16).enumerate() {
                if starts.len() >= 8 {
                    break;
                }
                let start = if Some(w) == after.as_ref().map(|a| &a[..]) {
                    pc.checked_sub(i as u64)
                } else if Some(w) == before.as_ref().map(|b| &b[..]) {
                    pc.checked_sub(i as u64 + 16)
                } else {
                    None
                };
                if let Some(st) = start.filter(|st| !starts.contains(st)) {
                    starts.push(st);
                }
            }
            let Some(start) = starts.into_iter().find(|&start| {
                // The whole .text, read back from the guest and hashed.
                let mut guest = vec![0u8; text.len()];
                matches!(mem.backend.read(start, &mut guest), Ok(n) if n == text.len())
                    && hash(&guest) == hash(text)
            }) else {
                continue;
            };
            let bias = start.wrapping_sub(*text_addr);
            if self.verbose {
                superprof_unwind::say!(
                    "superprof: found {} at {start:#x}{} (its .text hash matches)",
                    elf.path.display(),
                    space.map_or(String::new(), |s| format!(" in address space {s:#x}"))
                );
            }
            let range = start..start.saturating_add(text.len() as u64);
            let (image, name) = (elf.image.clone(), elf.name.clone());
            let sp = self.space(space);
            sp.unwinder.add_module(&image, &name, range.clone(), bias);
            sp.placed.push((range, u, bias));
            return Some((Owner::User(u), bias));
        }
        self.space(space).unmatched.insert(page);
        None
    }

    /// Takes one sample of every vCPU: the guest is stopped, read, and let go.
    pub fn sample(
        &mut self,
        backend: &mut dyn Backend,
        t: Duration,
    ) -> Result<Vec<RawSample>, QemuError> {
        let started = Instant::now();
        backend.stop()?;
        let vcpus = backend.vcpus()?;
        let mut out = Vec::with_capacity(vcpus);
        for vcpu in 0..vcpus {
            if vcpus > 1 {
                backend.select(vcpu)?;
            }
            out.push(self.sample_vcpu(backend, t, vcpu)?);
        }
        backend.resume()?;
        self.busy += started.elapsed();
        Ok(out)
    }

    /// The current vCPU's stack.
    fn sample_vcpu(
        &mut self,
        backend: &mut dyn Backend,
        t: Duration,
        vcpu: usize,
    ) -> Result<RawSample, QemuError> {
        let regs = backend.regs()?;
        // Code outside the kernel's ELF is told apart by address space (a program found in
        // one says nothing of another); the kernel's is the same in all.
        // Until the slide is settled, any kernel pc: one slid by less than the kernel's size
        // still falls inside its link ranges (Debian's kernel, slid 0x2200000, was never
        // searched and its frames were named at the wrong addresses).
        if !self.slide_settled {
            let mut mem = MemCache::new(backend);
            self.find_slide(&mut mem, regs.pc);
        }
        let space = if self.in_kernel(regs.pc) {
            None
        } else {
            // Past MAX_SPACES a new address space shares the unknown one, for every lookup
            // of this sample alike.
            backend
                .space()?
                .filter(|s| self.spaces.len() < MAX_SPACES || self.spaces.contains_key(&Some(*s)))
        };
        let mut mem = MemCache::new(backend);
        let owner = match self.owner_of(space, regs.pc) {
            Some(o) => Some(o),
            None => self.recognize(&mut mem, space, regs.pc),
        };
        if owner.is_some() {
            mem.read_top(regs.sp);
        }
        let mut frames = Vec::new();
        // A pc in no known ELF: nothing to unwind it with.
        let mut truncated = Some(Truncation::NoUnwindInfo);
        if owner.is_some() {
            let uregs = UserRegs {
                pc: regs.pc,
                sp: regs.sp,
                fp: regs.fp,
                lr: regs.lr,
            };
            let mut read = |a: u64| mem.word(a).ok_or(());
            let mut unwound = Vec::new();
            let unwinder = &mut self.space(space).unwinder;
            truncated = match unwinder.unwind(&uregs, &mut read, &mut unwound) {
                UnwindOutcome::Complete => None,
                UnwindOutcome::Truncated(why) => Some(why),
            };
            for f in &unwound {
                let (addr, ret) = frame_parts(f);
                let (o, bias) = self.owner_of(space, addr).unwrap_or((Owner::Unknown, 0));
                frames.push((addr, ret, o, bias));
            }
        } else {
            frames.push((regs.pc, false, Owner::Unknown, 0));
        }
        Ok(RawSample {
            time: t,
            vcpu,
            owner: owner.map_or(Owner::Unknown, |(o, _)| o),
            space,
            frames,
            truncated,
        })
    }
}

fn hash(b: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}
