//! Sampling a guest: stop it, read the registers, unwind through guest memory, let it go; and
//! recognizing the guest's programs by their code.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use superprof_qemu::{Backend, GuestArch, QemuError};
use superprof_unwind::{frame_parts, ElfImage, GuestUnwinder, Truncation, UnwindOutcome, UserRegs};

/// An ELF file of the guest: the kernel, or a program given with --user.
pub struct GuestElf {
    pub path: PathBuf,
    pub name: String,
    pub image: Arc<ElfImage>,
    /// `.text`: ELF address and bytes (programs are recognized by it).
    pub text: (u64, Vec<u8>),
    pub has_symbols: bool,
    /// Linux's own unwind tables (`.orc_unwind`), which superprof does not read.
    pub has_orc: bool,
    /// The machine it is for (None: neither x86_64 nor AArch64).
    pub arch: Option<GuestArch>,
}

impl GuestElf {
    pub fn open(path: &Path) -> Option<GuestElf> {
        use object::{Object, ObjectSection};
        let data = std::fs::read(path).ok()?;
        let obj = object::File::parse(&*data).ok()?;
        let text = obj
            .section_by_name(".text")
            .and_then(|s| Some((s.address(), s.data().ok()?.to_vec())))
            .unwrap_or_default();
        let has_symbols = obj.symbols().next().is_some() || obj.dynamic_symbols().next().is_some();
        let has_orc = obj.section_by_name(".orc_unwind").is_some();
        let arch = match obj.architecture() {
            object::Architecture::X86_64 => Some(GuestArch::X86_64),
            object::Architecture::Aarch64 => Some(GuestArch::Aarch64),
            _ => None,
        };
        Some(GuestElf {
            path: path.to_owned(),
            name: path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            image: Arc::new(ElfImage::open(path)?),
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
    Kernel,
    /// Index into the --user programs.
    User(usize),
    Unknown,
}

/// One sample: owner, frames innermost first as (guest address, is a return address, the
/// ELF it belongs to and its bias), and why the unwind stopped before the stack's root, if
/// it did.
pub struct RawSample {
    pub time: Duration,
    /// The vCPU it was taken on.
    pub vcpu: usize,
    pub owner: Owner,
    pub frames: Vec<(u64, bool, Owner, u64)>,
    pub truncated: Option<Truncation>,
}

impl RawSample {
    /// Whether the unwind ended where the CFI says the stack ends.
    pub fn complete(&self) -> bool {
        self.truncated.is_none()
    }
}

pub struct Sampler {
    pub kernel: GuestElf,
    kernel_ranges: Vec<Range<u64>>,
    pub users: Vec<GuestElf>,
    /// Guest ranges where a program's .text was found: (range, program, bias).
    placed: Vec<(Range<u64>, usize, u64)>,
    /// Guest pages of unknown code already searched.
    unmatched: HashSet<u64>,
    unwinder: GuestUnwinder,
    pub verbose: bool,
    /// Time spent per sample, stop to resume.
    pub busy: Duration,
}

/// Chunks of guest memory read during one sample.
struct MemCache<'a> {
    backend: &'a mut dyn Backend,
    chunks: HashMap<u64, Option<Vec<u8>>>,
}

const CHUNK: u64 = 512;

impl MemCache<'_> {
    fn word(&mut self, addr: u64) -> Option<u64> {
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
    pub fn new(arch: GuestArch, kernel: GuestElf, users: Vec<GuestElf>) -> Sampler {
        let kernel_ranges = kernel.image.executable_ranges();
        let mut unwinder = GuestUnwinder::new(arch);
        for r in &kernel_ranges {
            unwinder.add_module(&kernel.image, &kernel.name, r.clone(), 0);
        }
        Sampler {
            kernel,
            kernel_ranges,
            users,
            placed: Vec::new(),
            unmatched: HashSet::new(),
            unwinder,
            verbose: false,
            busy: Duration::ZERO,
        }
    }

    fn owner_of(&self, pc: u64) -> Option<(Owner, u64)> {
        if self.kernel_ranges.iter().any(|r| r.contains(&pc)) {
            return Some((Owner::Kernel, 0));
        }
        self.placed
            .iter()
            .find(|(r, _, _)| r.contains(&pc))
            .map(|&(_, u, bias)| (Owner::User(u), bias))
    }

    /// Looks for the code at `pc` in the programs' .text; a match is confirmed by comparing
    /// the hash of the whole .text in guest memory with the file's.
    fn recognize(&mut self, mem: &mut MemCache, pc: u64) -> Option<(Owner, u64)> {
        let page = pc & !0xfff;
        if self.users.is_empty() || self.unmatched.contains(&page) {
            return None;
        }
        let mut window = [0u8; 32];
        for (i, w) in window.chunks_mut(8).enumerate() {
            w.copy_from_slice(&mem.word(pc + 8 * i as u64)?.to_le_bytes());
        }
        for (u, elf) in self.users.iter().enumerate() {
            let (text_addr, text) = &elf.text;
            let Some(off) = text.windows(window.len()).position(|w| w == window) else {
                continue;
            };
            let Some(start) = pc.checked_sub(off as u64) else {
                continue;
            };
            // The whole .text, read back from the guest and hashed.
            let mut guest = vec![0u8; text.len()];
            if mem.backend.read(start, &mut guest).ok()? != text.len() || hash(&guest) != hash(text)
            {
                continue;
            }
            let bias = start.wrapping_sub(*text_addr);
            if self.verbose {
                eprintln!(
                    "superprof: found {} at {start:#x} (its .text hash matches)",
                    elf.path.display()
                );
            }
            let range = start..start.saturating_add(text.len() as u64);
            self.unwinder
                .add_module(&elf.image, &elf.name, range.clone(), bias);
            self.placed.push((range, u, bias));
            return Some((Owner::User(u), bias));
        }
        self.unmatched.insert(page);
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
        let mut mem = MemCache {
            backend,
            chunks: HashMap::new(),
        };
        let owner = match self.owner_of(regs.pc) {
            Some(o) => Some(o),
            None => self.recognize(&mut mem, regs.pc),
        };
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
            truncated = match self.unwinder.unwind(&uregs, &mut read, &mut unwound) {
                UnwindOutcome::Complete => None,
                UnwindOutcome::Truncated(why) => Some(why),
            };
            for f in &unwound {
                let (addr, ret) = frame_parts(f);
                let (o, bias) = self.owner_of(addr).unwrap_or((Owner::Unknown, 0));
                frames.push((addr, ret, o, bias));
            }
        } else {
            frames.push((regs.pc, false, Owner::Unknown, 0));
        }
        Ok(RawSample {
            time: t,
            vcpu,
            owner: owner.map_or(Owner::Unknown, |(o, _)| o),
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
