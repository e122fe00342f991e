//! The code of an ELF file, for decoding blocks without the process: function symbols, and
//! the bytes at an ELF virtual address.

use std::path::Path;

use object::{Object, ObjectSection, ObjectSymbol, SectionKind};
use superprof_analyze::{blocks_for, Arch, Block};

/// A function symbol: ELF virtual address and size.
#[derive(Debug, Clone)]
pub struct Function {
    pub name: String,
    pub addr: u64,
    pub size: u64,
}

/// An ELF file's executable sections and functions.
pub struct ElfCode {
    /// (address, bytes) of each executable section.
    sections: Vec<(u64, Vec<u8>)>,
    /// Sorted by address.
    pub functions: Vec<Function>,
    pub arch: Arch,
    /// A 64-bit ELF file (blocks decodes x86_64 and AArch64 code only).
    pub is_64: bool,
}

impl ElfCode {
    pub fn open(path: &Path) -> Option<ElfCode> {
        let data = std::fs::read(path).ok()?;
        let obj = object::File::parse(&*data).ok()?;
        let arch = match obj.architecture() {
            object::Architecture::Aarch64 => Arch::Aarch64,
            _ => Arch::X86_64,
        };
        let sections = obj
            .sections()
            .filter(|s| s.kind() == SectionKind::Text)
            .filter_map(|s| Some((s.address(), s.data().ok()?.to_vec())))
            .collect();
        let mut functions: Vec<Function> = obj
            .symbols()
            .chain(obj.dynamic_symbols())
            .filter(|s| s.kind() == object::SymbolKind::Text && s.address() != 0 && s.size() > 0)
            .filter_map(|s| {
                Some(Function {
                    name: superprof_symbols::demangle(s.name().ok()?),
                    addr: s.address(),
                    size: s.size(),
                })
            })
            .collect();
        functions.sort_by_key(|f| (f.addr, std::cmp::Reverse(f.size)));
        functions.dedup_by_key(|f| f.addr);
        Some(ElfCode {
            sections,
            functions,
            arch,
            is_64: obj.is_64(),
        })
    }

    /// The bytes of [addr, addr+len) when one executable section holds them.
    pub fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
        self.sections.iter().find_map(|(start, data)| {
            let end = start + data.len() as u64;
            (addr >= *start && addr + len <= end)
                .then(|| &data[(addr - start) as usize..(addr + len - start) as usize])
        })
    }

    /// Whether `addr` is where an instruction starts, decoding from the start of its function
    /// (true when no function holds it: nothing to check against).
    pub fn is_instruction_start(&self, addr: u64) -> bool {
        let Some(f) = self.function_at(addr) else {
            return true;
        };
        let Some(bytes) = self.bytes(f.addr, f.size) else {
            return true;
        };
        superprof_analyze::decode_all_for(self.arch, bytes, f.addr)
            .iter()
            .any(|i| i.addr == addr)
    }

    /// The function containing `addr`.
    pub fn function_at(&self, addr: u64) -> Option<&Function> {
        let i = self.functions.partition_point(|f| f.addr <= addr);
        let f = self.functions.get(i.checked_sub(1)?)?;
        (addr < f.addr + f.size).then_some(f)
    }

    /// The functions overlapping [lo, hi).
    pub fn functions_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = &Function> {
        self.functions
            .iter()
            .filter(move |f| f.addr < hi && f.addr + f.size > lo)
    }

    /// The basic blocks of [lo, hi), decoded function by function (so that block boundaries
    /// are those of the whole function), cut at lo and hi.
    pub fn static_blocks(&self, lo: u64, hi: u64) -> Vec<Block> {
        let mut out: Vec<Block> = Vec::new();
        for f in self.functions_in(lo, hi) {
            let Some(bytes) = self.bytes(f.addr, f.size) else {
                continue;
            };
            for b in blocks_for(self.arch, bytes, f.addr) {
                if b.end <= lo || b.start >= hi {
                    continue;
                }
                if out.last().is_some_and(|l| l.end > b.start) {
                    continue; // overlapping symbols (aliases of one function)
                }
                let mut b = b;
                if b.start < lo || b.end > hi {
                    let (s, e) = (b.start.max(lo), b.end.min(hi));
                    b.instructions = self.instructions(s, e);
                    b.start = s;
                    b.end = e;
                }
                out.push(b);
            }
        }
        out
    }

    /// Where code outside [lo, hi) jumps back into it: the direct jump targets in [lo, hi) of
    /// the functions that [lo, hi) itself jumps out to (a compiler's `f.cold` part that
    /// rejoins `f`, say). Entries there are not seen by following branches from the region.
    pub fn reentries(&self, lo: u64, hi: u64) -> Vec<u64> {
        use superprof_analyze::{decode_all_for, Flow};
        let jump_target = |f: Flow| match f {
            Flow::Jump { target } | Flow::Conditional { target } => Some(target),
            _ => None,
        };
        let mut outside: Vec<u64> = Vec::new();
        for f in self.functions_in(lo, hi) {
            let Some(bytes) = self.bytes(f.addr, f.size) else {
                continue;
            };
            for i in decode_all_for(self.arch, bytes, f.addr) {
                if !(lo..hi).contains(&i.addr) {
                    continue;
                }
                if let Some(t) = jump_target(i.flow).filter(|t| !(lo..hi).contains(t)) {
                    if let Some(g) = self.function_at(t) {
                        if !outside.contains(&g.addr) {
                            outside.push(g.addr);
                        }
                    }
                }
            }
        }
        let mut back: Vec<u64> = Vec::new();
        for start in outside {
            let Some(g) = self.function_at(start) else {
                continue;
            };
            let Some(bytes) = self.bytes(g.addr, g.size) else {
                continue;
            };
            for i in decode_all_for(self.arch, bytes, g.addr) {
                if let Some(t) = jump_target(i.flow).filter(|t| (lo..hi).contains(t)) {
                    // Only where an instruction of the region starts.
                    if !back.contains(&t) && self.is_instruction_start(t) {
                        back.push(t);
                    }
                }
            }
        }
        back
    }

    /// How many instructions [start, end) holds.
    pub fn instructions(&self, start: u64, end: u64) -> u32 {
        self.bytes(start, end.saturating_sub(start)).map_or(0, |b| {
            superprof_analyze::decode_all_for(self.arch, b, start).len() as u32
        })
    }
}
