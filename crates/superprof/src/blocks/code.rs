//! The code of an ELF file, for decoding blocks without the process: function symbols, and
//! the bytes at an ELF virtual address.

use std::path::Path;

use object::{Object, ObjectSection, SectionKind};
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
    /// [start, end) of the procedure linkage table's sections (.plt, .plt.sec, .plt.got):
    /// stubs that jump to other modules' functions.
    plt: Vec<(u64, u64)>,
    /// Every direct branch in the executable sections, as (target, source), sorted (made at
    /// first use).
    targets: std::sync::OnceLock<Vec<(u64, u64)>>,
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
            .filter_map(|s| {
                let data = s.data().ok()?;
                // Code at addresses that wrap cannot be decoded.
                s.address().checked_add(data.len() as u64)?;
                Some((s.address(), data.to_vec()))
            })
            .collect();
        let plt = obj
            .sections()
            .filter(|s| {
                s.name()
                    .is_ok_and(|n| n.starts_with(".plt") || n == ".iplt")
            })
            .filter_map(|s| Some((s.address(), s.address().checked_add(s.size())?)))
            .collect();
        let mut functions: Vec<Function> = superprof_symbols::elf_functions(&obj)
            .filter(|s| s.size > 0)
            .map(|s| Function {
                name: superprof_symbols::demangle(s.name),
                addr: s.addr,
                size: s.size,
            })
            .collect();
        functions.sort_by_key(|f| (f.addr, std::cmp::Reverse(f.size)));
        functions.dedup_by_key(|f| f.addr);
        Some(ElfCode {
            sections,
            plt,
            targets: std::sync::OnceLock::new(),
            functions,
            arch,
            is_64: obj.is_64(),
        })
    }

    /// Whether ELF address `addr` is in a PLT stub (a jump there is a call to another function).
    pub fn in_plt(&self, addr: u64) -> bool {
        self.plt.iter().any(|&(a, b)| (a..b).contains(&addr))
    }

    /// The bytes of [addr, addr+len) when one executable section holds them. Addresses and
    /// sizes come from the file (symbols, section headers): nothing here may wrap.
    pub fn bytes(&self, addr: u64, len: u64) -> Option<&[u8]> {
        let end = addr.checked_add(len)?;
        self.sections.iter().find_map(|(start, data)| {
            let from = usize::try_from(addr.checked_sub(*start)?).ok()?;
            let to = usize::try_from(end - start).ok()?;
            data.get(from..to)
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
        (addr - f.addr < f.size).then_some(f)
    }

    /// The functions overlapping [lo, hi).
    pub fn functions_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = &Function> {
        self.functions
            .iter()
            .filter(move |f| f.addr < hi && f.addr.saturating_add(f.size) > lo)
    }

    /// The basic blocks of [lo, hi), decoded function by function (so that block boundaries
    /// are those of the whole function), cut at lo and hi. Code that no function symbol covers
    /// (a stripped program, a compiler's `.cold` parts with no symbol) is decoded as it comes,
    /// padding left out.
    pub fn static_blocks(&self, lo: u64, hi: u64) -> Vec<Block> {
        let mut out: Vec<Block> = Vec::new();
        let push = |out: &mut Vec<Block>, b: Block| {
            if b.end <= lo || b.start >= hi {
                return;
            }
            if out.last().is_some_and(|l| l.end > b.start) {
                return; // overlapping symbols (aliases of one function)
            }
            let mut b = b;
            if b.start < lo || b.end > hi {
                let (s, e) = (b.start.max(lo), b.end.min(hi));
                b.instructions = self.instructions(s, e);
                b.start = s;
                b.end = e;
            }
            out.push(b);
        };
        let mut pos = lo;
        let functions: Vec<&Function> = self.functions_in(lo, hi).collect();
        for f in functions {
            if f.addr > pos {
                for b in self.raw_blocks(pos, f.addr.min(hi)) {
                    push(&mut out, b);
                }
            }
            if let Some(bytes) = self.bytes(f.addr, f.size) {
                for b in blocks_for(self.arch, bytes, f.addr) {
                    push(&mut out, b);
                }
            }
            pos = pos.max(f.addr.saturating_add(f.size));
        }
        if pos < hi {
            for b in self.raw_blocks(pos, hi) {
                push(&mut out, b);
            }
        }
        out
    }

    /// The blocks of [lo, hi), code no function symbol covers, padding at its start left out
    /// (what follows a function's end: padding within, after a return or a jump, is left out
    /// by the decoder).
    fn raw_blocks(&self, lo: u64, hi: u64) -> Vec<Block> {
        let mut lo = lo;
        loop {
            let n = self.filler_at(lo, hi);
            if n == 0 {
                break;
            }
            lo += n as u64;
        }
        let Some(bytes) = self.bytes(lo, hi.saturating_sub(lo)) else {
            return Vec::new();
        };
        blocks_for(self.arch, bytes, lo)
    }

    /// Every direct branch (jump, conditional jump, call) in the executable sections, as
    /// (target, source), sorted: a linear sweep of all the code, which sees the jumps of parts
    /// that no symbol covers (gcc's `.cold` parts in a program with dynamic symbols only) back
    /// into a function's middle.
    fn branches(&self) -> &[(u64, u64)] {
        self.targets.get_or_init(|| {
            let mut out = Vec::new();
            for (base, data) in &self.sections {
                let mut off = 0usize;
                while off < data.len() {
                    let run = superprof_analyze::decode_all_for(
                        self.arch,
                        &data[off..],
                        base + off as u64,
                    );
                    out.extend(run.iter().filter_map(|i| Some((i.flow.target()?, i.addr))));
                    let end = run
                        .last()
                        .map_or(off, |i| (i.addr + i.len as u64 - base) as usize);
                    // Past an undecodable byte, on.
                    off = if end > off { end } else { off + 1 };
                }
            }
            out.sort_unstable();
            out
        })
    }

    /// The direct branch targets in [lo, hi), sorted, each once.
    pub fn targets_in(&self, lo: u64, hi: u64) -> Vec<u64> {
        let b = self.branches();
        let from = b.partition_point(|&(t, _)| t < lo);
        let mut out: Vec<u64> = b[from..]
            .iter()
            .take_while(|&&(t, _)| t < hi)
            .map(|&(t, _)| t)
            .collect();
        out.dedup();
        out
    }

    /// Where direct branches from outside [lo, hi) land inside it (an instruction's start
    /// there), sorted.
    pub fn entries_from_outside(&self, lo: u64, hi: u64) -> Vec<u64> {
        let b = self.branches();
        let from = b.partition_point(|&(t, _)| t < lo);
        let mut out: Vec<u64> = b[from..]
            .iter()
            .take_while(|&&(t, _)| t < hi)
            .filter(|&&(_, src)| !(lo..hi).contains(&src))
            .map(|&(t, _)| t)
            .collect();
        out.dedup();
        out
    }

    /// Whether a direct branch anywhere in the file lands in [lo, hi).
    pub fn targeted(&self, lo: u64, hi: u64) -> bool {
        let b = self.branches();
        let i = b.partition_point(|&(t, _)| t < lo);
        b.get(i).is_some_and(|&(t, _)| t < hi)
    }

    /// The blocks of [lo, hi) for probes that count each block once at one place (uprobes,
    /// in-process patches): [`ElfCode::static_blocks`] also split wherever a direct branch
    /// from anywhere in the file lands ([`ElfCode::targets_in`]: a `.cold` part jumping back,
    /// another function jumping into the middle), so that each part is counted as it runs.
    pub fn counted_blocks(&self, lo: u64, hi: u64) -> Vec<Block> {
        let at = self.targets_in(lo, hi);
        let mut out = Vec::new();
        for b in self.static_blocks(lo, hi) {
            let mut start = b.start;
            for &cut in at.iter().filter(|&&c| c > b.start && c < b.end) {
                out.push(Block {
                    start,
                    end: cut,
                    instructions: self.instructions(start, cut),
                    flow: superprof_analyze::Flow::Next,
                });
                start = cut;
            }
            out.push(Block {
                start,
                instructions: self.instructions(start, b.end),
                ..b
            });
        }
        out
    }

    /// How many bytes of filler (no-ops, int3: the padding compilers put after a function's
    /// last return or before an aligned jump target) start at `addr`, up to `limit` and at
    /// most 16.
    pub fn filler_at(&self, addr: u64, limit: u64) -> u32 {
        // Never into the next function (one may start with a no-op).
        let i = self.functions.partition_point(|f| f.addr <= addr);
        let limit = self.functions.get(i).map_or(limit, |f| limit.min(f.addr));
        let len = limit.saturating_sub(addr).min(16);
        let Some(bytes) = self.bytes(addr, len).or_else(|| {
            // The end of a section.
            (1..len).rev().find_map(|n| self.bytes(addr, n))
        }) else {
            return 0;
        };
        let mut n = 0u32;
        for i in superprof_analyze::decode_all_for(self.arch, bytes, addr) {
            // (A branch target is never filler: something runs it.)
            if !i.filler || i.addr != addr + n as u64 || self.targeted(i.addr, i.addr + 1) {
                break;
            }
            n += i.len;
        }
        n
    }

    /// Whether the function holding `addr` has no indirect jump (a jump table's targets are
    /// not known, so any of its instructions may be one); false outside any function.
    pub fn without_indirect_jumps(&self, addr: u64) -> bool {
        let Some(f) = self.function_at(addr) else {
            return false;
        };
        let Some(bytes) = self.bytes(f.addr, f.size) else {
            return false;
        };
        !superprof_analyze::decode_all_for(self.arch, bytes, f.addr)
            .iter()
            .any(|i| i.flow == superprof_analyze::Flow::IndirectJump)
    }

    /// How many instructions [start, end) holds.
    pub fn instructions(&self, start: u64, end: u64) -> u32 {
        self.bytes(start, end.saturating_sub(start)).map_or(0, |b| {
            superprof_analyze::decode_all_for(self.arch, b, start).len() as u32
        })
    }
}

#[cfg(test)]
#[path = "../../../../tests/fixtures/elf_patch.rs"]
mod elf_patch;

#[cfg(test)]
mod tests {
    use super::elf_patch::{self, Elf, SymField};
    use super::ElfCode;

    /// Every query of `blocks` on a real program whose headers and symbols are corrupted one
    /// at a time (issue 12, item 8): no panic; the intact file still gives its functions.
    #[test]
    fn hostile_headers_and_symbols_never_panic() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = std::env::temp_dir().join(format!("superprof-code-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = elf_patch::compile_child(&root, &dir);
        let original = Elf::read(&exe);
        let work = original.symbol("child_work", SymField::Value);
        let code = ElfCode::open(&exe).unwrap();
        assert_eq!(code.function_at(work + 1).unwrap().name, "child_work");
        let f = code.function_at(work).unwrap();
        assert!(!code.static_blocks(f.addr, f.addr + f.size).is_empty());
        let mut failures = Vec::new();
        for (i, (what, elf)) in elf_patch::hostile_variants(&original).iter().enumerate() {
            let path = dir.join(format!("v{i}"));
            elf.write(&path);
            let r = std::panic::catch_unwind(|| {
                let Some(code) = ElfCode::open(&path) else {
                    return;
                };
                for f in code.functions.iter().take(64) {
                    let hi = f.addr.saturating_add(f.size.min(1 << 16));
                    let _ = code.static_blocks(f.addr, hi);
                    let _ = code.entries_from_outside(f.addr, hi);
                    let _ = code.counted_blocks(f.addr, hi);
                    let _ = code.is_instruction_start(f.addr.wrapping_add(1));
                }
                for a in [0, work, u64::MAX - 1, u64::MAX] {
                    let _ = code.function_at(a);
                    let _ = code.bytes(a, 16);
                    let _ = code.bytes(a, u64::MAX);
                    let _ = code.functions_in(a, u64::MAX).count();
                    let _ = code.instructions(a, a.saturating_add(64));
                }
            });
            if r.is_err() {
                failures.push(what.clone());
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(failures.is_empty(), "panicked: {failures:#?}");
    }
}
