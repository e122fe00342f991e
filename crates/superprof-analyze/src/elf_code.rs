//! The code of an ELF file, for decoding blocks without the process: function symbols, and
//! the bytes at an ELF virtual address. Read by superprof's blocks, stat's placement and the
//! in-process engine's patches.

use std::path::Path;

use crate::{blocks_for, Arch, Block};
use object::{Object, ObjectSection, SectionKind};

/// The FDE ranges of the file at `path` (see `ElfCode::fdes`), parsed once per file and run:
/// a region per function of one library (libpython's five in a test) opens five ElfCodes of it,
/// and a parse of a large `.eh_frame` costs seconds under emulation.
fn fde_ranges(path: &Path) -> Vec<(u64, u64)> {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;
    use std::sync::{Arc, Mutex};
    type Key = (u64, u64, u64, i64);
    type Ranges = Arc<Vec<(u64, u64)>>;
    static CACHE: Mutex<Option<HashMap<Key, Ranges>>> = Mutex::new(None);
    let key = std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.size(), m.mtime()));
    if let Some(k) = key {
        let cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = cache.as_ref().and_then(|c| c.get(&k)) {
            return hit.as_ref().clone();
        }
    }
    let ranges = superprof_unwind::map_file(path)
        .map(|data| superprof_symbols::function_ranges(&data))
        .unwrap_or_default();
    if let Some(k) = key {
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        let map = cache.get_or_insert_with(HashMap::new);
        // (A handful of files a run: no eviction needed, but no unbounded growth either.)
        if map.len() < 256 {
            map.insert(k, Arc::new(ranges.clone()));
        }
    }
    ranges
}

/// A function symbol: ELF virtual address and size.
#[derive(Debug, Clone)]
pub struct Function {
    /// Its name, demangled.
    pub name: String,
    /// Its ELF virtual address.
    pub addr: u64,
    /// Its size in bytes.
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
    /// [start, end) of each function its call-frame information (FDEs of `.eh_frame` and
    /// `.debug_frame`) covers, sorted: where instructions are known to start, whatever the
    /// symbol table says. Read at the first proof (`path`): parsing every FDE of a large file
    /// costs seconds under emulation, and most uses of an ElfCode prove nothing.
    fdes: std::sync::OnceLock<Vec<(u64, u64)>>,
    /// The landing pads the file's exception tables list, sorted: read at the first need
    /// (`blocks --engine ptrace`), once for every region.
    landing_pads: std::sync::OnceLock<Vec<u64>>,
    /// The file, for `fdes`.
    path: std::path::PathBuf,
    /// Sorted by address.
    pub functions: Vec<Function>,
    /// The machine its code is for.
    pub arch: Arch,
    /// A 64-bit ELF file (blocks decodes x86_64 and AArch64 code only).
    pub is_64: bool,
}

/// The function symbols of `path`'s separate debug file, if one is installed.
fn debug_file_functions(path: &Path) -> Vec<Function> {
    let Some(debug) = superprof_symbols::find_debug_file(path) else {
        return Vec::new();
    };
    let Ok(data) = superprof_unwind::map_file(&debug) else {
        return Vec::new();
    };
    let Ok(obj) = object::File::parse(&*data) else {
        return Vec::new();
    };
    superprof_symbols::elf_functions(&obj)
        .filter(|s| s.size > 0)
        .map(|s| Function {
            name: superprof_symbols::demangle(s.name),
            addr: s.addr,
            size: s.size,
        })
        .collect()
}

impl ElfCode {
    /// Reads the file at `path`: its executable sections, its function symbols (and its
    /// separate debug file's, where one is installed); None if it is no ELF file it can read.
    pub fn open(path: &Path) -> Option<ElfCode> {
        // Mapped, not read whole: only the executable sections are copied.
        let data = superprof_unwind::map_file(path).ok()?;
        let obj = object::File::parse(&*data).ok()?;
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
        // A stripped file's full symbol table is in its separate debug file when one is
        // installed (found by build id, or by a debug link whose checksum matches): its
        // symbols are as good as the file's own for knowing where functions start.
        if obj.symbol_table().is_none() {
            functions.extend(debug_file_functions(path));
        }
        functions.sort_by_key(|f| (f.addr, std::cmp::Reverse(f.size)));
        functions.dedup_by_key(|f| f.addr);
        Some(ElfCode::of(path, &obj, sections, plt, functions))
    }

    /// The code of `path` reduced to the functions of these raw symbol names, as if nothing
    /// else were in the file: no branch from elsewhere into them is looked for, and no name
    /// is demangled. For superprof's own calibration functions, which only calls reach
    /// (naked functions with no symbol inside): each run measures its engine on one, and a
    /// whole-file scan of superprof's 10 MB binary was most of a short run's fixed cost.
    pub fn open_only(path: &Path, names: &[&str]) -> Option<ElfCode> {
        let data = superprof_unwind::map_file(path).ok()?;
        let obj = object::File::parse(&*data).ok()?;
        let functions: Vec<Function> = superprof_symbols::elf_functions(&obj)
            .filter(|s| s.size > 0 && names.contains(&s.name))
            .map(|s| Function {
                name: s.name.to_owned(),
                addr: s.addr,
                size: s.size,
            })
            .collect();
        let sections = functions
            .iter()
            .map(|f| {
                let section = obj.sections().find(|s| {
                    s.kind() == SectionKind::Text
                        && s.address() <= f.addr
                        && f.addr + f.size <= s.address().saturating_add(s.size())
                })?;
                let from = usize::try_from(f.addr - section.address()).ok()?;
                let to = from.checked_add(usize::try_from(f.size).ok()?)?;
                Some((f.addr, section.data().ok()?.get(from..to)?.to_vec()))
            })
            .collect::<Option<Vec<_>>>()?;
        let mut code = ElfCode::of(path, &obj, sections, Vec::new(), functions);
        // (A symbol in both .symtab and .dynsym is one function.)
        code.functions.sort_by_key(|f| f.addr);
        code.functions.dedup_by_key(|f| f.addr);
        code.sections.sort_by_key(|s| s.0);
        code.sections.dedup_by_key(|s| s.0);
        Some(code)
    }

    fn of(
        path: &Path,
        obj: &object::File,
        sections: Vec<(u64, Vec<u8>)>,
        plt: Vec<(u64, u64)>,
        functions: Vec<Function>,
    ) -> ElfCode {
        ElfCode {
            sections,
            fdes: std::sync::OnceLock::new(),
            landing_pads: std::sync::OnceLock::new(),
            path: path.to_owned(),
            plt,
            targets: std::sync::OnceLock::new(),
            functions,
            arch: match obj.architecture() {
                object::Architecture::Aarch64 => Arch::Aarch64,
                _ => Arch::X86_64,
            },
            is_64: obj.is_64(),
        }
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

    /// Whether `addr` is where an instruction starts (see [`ElfCode::prove_instruction_start`]).
    pub fn is_instruction_start(&self, addr: u64) -> bool {
        self.prove_instruction_start(addr).is_ok()
    }

    /// The code `addr` is proven part of, [start, end): the innermost function its call-frame
    /// information covers (the compiler's own record of where the function starts), else a
    /// function symbol whose bytes decode to exactly its end. Instructions start where a
    /// decoding from its start says.
    fn trusted_unit(&self, addr: u64) -> Result<(u64, u64), String> {
        let fdes = self.fdes.get_or_init(|| fde_ranges(&self.path));
        let i = fdes.partition_point(|r| r.0 <= addr);
        let fde = fdes[..i]
            .iter()
            .rev()
            .take(8)
            .filter(|r| addr < r.1)
            .max_by_key(|r| r.0);
        if let Some(&(start, end)) = fde {
            return Ok((start, end));
        }
        let f = self.function_at(addr).ok_or_else(|| {
            format!(
                "{addr:#x} is in code that neither a function symbol nor call-frame                  information covers: nothing proves where its instructions start"
            )
        })?;
        let end = f.addr.saturating_add(f.size);
        if !self.decodes_to_its_end(f.addr, end) {
            return Err(format!(
                "the symbol '{}' ({:#x}, {} bytes) does not decode to its end: the symbol table                  does not match the code",
                f.name, f.addr, f.size
            ));
        }
        Ok((f.addr, end))
    }

    /// Whether [start, end) decodes as instructions that end exactly at `end`.
    fn decodes_to_its_end(&self, start: u64, end: u64) -> bool {
        let Some(bytes) = self.bytes(start, end.saturating_sub(start)) else {
            return false;
        };
        match self.arch {
            // Fixed 4-byte instructions (an encoding the decoder does not know still has its
            // length).
            Arch::Aarch64 => (end - start).is_multiple_of(4),
            Arch::X86_64 => crate::decode_all_for(self.arch, bytes, start)
                .last()
                .is_some_and(|i| i.addr + i.len as u64 == end),
        }
    }

    /// Whether a decoding of [start, end) from `start` has an instruction at `addr`.
    fn decoded_at(&self, start: u64, end: u64, addr: u64) -> bool {
        match self.arch {
            Arch::Aarch64 => addr >= start && (addr - start).is_multiple_of(4),
            Arch::X86_64 => self
                .bytes(start, end.saturating_sub(start))
                .is_some_and(|b| {
                    crate::decode_all_for(self.arch, b, start)
                        .iter()
                        .any(|i| i.addr == addr)
                }),
        }
    }

    /// Proves that ELF address `addr` is where an instruction starts, before a probe goes
    /// there: it lies in an executable section, and decoding from a trusted start (a function
    /// start its call-frame information gives) reaches it. A probe anywhere else would corrupt the
    /// program's code (the middle of an instruction) or its data (`.rodata`).
    pub fn prove_instruction_start(&self, addr: u64) -> Result<(), String> {
        if self.bytes(addr, 1).is_none() {
            return Err(format!(
                "{addr:#x} is not in the executable code of its file (data, or no code at all)"
            ));
        }
        let (start, end) = self.trusted_unit(addr)?;
        if !self.decoded_at(start, end, addr) {
            return Err(format!(
                "{addr:#x} is not the start of an instruction (decoding from the function's \
                 start at {start:#x})"
            ));
        }
        Ok(())
    }

    /// Proves the (exclusive) end of a region, where its last probe goes: an instruction's
    /// start, or the end of a function (the padding or the next function after it).
    pub fn prove_region_end(&self, end: u64) -> Result<(), String> {
        let proven = self.prove_instruction_start(end);
        if proven.is_err() {
            if let Some(before) = end.checked_sub(1) {
                if self.trusted_unit(before).is_ok_and(|(_, e)| e == end)
                    && self.bytes(end, 1).is_some()
                {
                    return Ok(());
                }
            }
        }
        proven.map_err(|e| format!("the region's end: {e}"))
    }

    /// Proves a function symbol before its entry and exits are probed: its bytes lie in
    /// executable code and, where call-frame information covers it, the symbol agrees with it
    /// (starts at an instruction of that function and ends within it). A symbol table shifted
    /// off the code (a stripped and relinked file, a hostile one) is refused.
    pub fn prove_function(&self, addr: u64, size: u64, name: &str) -> Result<(), String> {
        let end = addr.saturating_add(size);
        if size == 0 {
            return self.prove_instruction_start(addr);
        }
        if self.bytes(addr, size).is_none() {
            return Err(format!(
                "the symbol '{name}' ({addr:#x}, {size} bytes) lies outside the executable code \
                 of its file: the symbol table does not match the code"
            ));
        }
        let (start, unit_end) = self.trusted_unit(addr)?;
        if start == addr {
            return Ok(());
        }
        if end > unit_end || !self.decoded_at(start, unit_end, addr) {
            return Err(format!(
                "the symbol table puts '{name}' at {addr:#x} ({size} bytes), which the \
                 call-frame information says is inside the function at {start:#x}-{unit_end:#x}: \
                 the symbol table does not match the code"
            ));
        }
        Ok(())
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
                    let n = crate::branch_pairs_for(
                        self.arch,
                        &data[off..],
                        base + off as u64,
                        &mut out,
                    );
                    // Past an undecodable byte, on.
                    off += n.max(1);
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

    /// The blocks of [lo, hi) that nothing in the code flows into: after an instruction that
    /// does not go on (a jump, a return) and no direct branch's target. They run only when
    /// something from elsewhere jumps there: an exception's landing pad (the unwinder jumps
    /// to it), a jump table's case, a pointer's target. (The block at `lo` is an entry of
    /// its own.)
    /// The landing pads the exception tables list (after a call that never returns, say a
    /// `longjmp`'s, where the rule above cannot see them) come too.
    pub fn unreached_starts(&self, lo: u64, hi: u64) -> Vec<u64> {
        use crate::Flow;
        let targets = self.targets_in(lo, hi);
        let blocks = self.static_blocks(lo, hi);
        let mut out: Vec<u64> = blocks
            .windows(2)
            .filter(|w| {
                matches!(
                    w[0].flow,
                    Flow::Return | Flow::Jump { .. } | Flow::IndirectJump
                ) && w[1].start != lo
                    && targets.binary_search(&w[1].start).is_err()
            })
            .map(|w| w[1].start)
            .collect();
        let pads = self.landing_pads.get_or_init(|| {
            superprof_unwind::map_file(&self.path)
                .map(|data| superprof_symbols::landing_pads(&data, 0, u64::MAX))
                .unwrap_or_default()
        });
        let from = pads.partition_point(|&p| p <= lo);
        out.extend(
            pads[from..]
                .iter()
                .copied()
                .take_while(|&p| p < hi)
                .filter(|&p| self.is_instruction_start(p)),
        );
        out.sort_unstable();
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
            // A target off the block's instructions (a linear sweep fallen out of step on
            // data in the code) is no place for a probe.
            let inside: Vec<u64> = at
                .iter()
                .copied()
                .filter(|&c| c > b.start && c < b.end)
                .collect();
            let starts = if inside.is_empty() {
                Vec::new()
            } else {
                self.starts(b.start, b.end)
            };
            for cut in inside.into_iter().filter(|c| starts.contains(c)) {
                out.push(Block {
                    start,
                    end: cut,
                    instructions: self.instructions(start, cut),
                    flow: crate::Flow::Next,
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
        for i in crate::decode_all_for(self.arch, bytes, addr) {
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
        !crate::decode_all_for(self.arch, bytes, f.addr)
            .iter()
            .any(|i| i.flow == crate::Flow::IndirectJump)
    }

    /// Where the instructions of [start, end) start, decoding from `start`.
    fn starts(&self, start: u64, end: u64) -> Vec<u64> {
        self.bytes(start, end.saturating_sub(start))
            .map(|b| {
                crate::decode_all_for(self.arch, b, start)
                    .iter()
                    .map(|i| i.addr)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many instructions [start, end) holds.
    pub fn instructions(&self, start: u64, end: u64) -> u32 {
        self.bytes(start, end.saturating_sub(start)).map_or(0, |b| {
            crate::decode_all_for(self.arch, b, start).len() as u32
        })
    }
}

#[cfg(test)]
#[path = "../../../tests/fixtures/elf_patch.rs"]
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

    /// Issue 31, item 1: instruction starts are proven from call-frame information, which a
    /// shifted symbol table cannot move; data and the middle of an instruction are refused.
    #[test]
    fn instruction_starts_are_proven_from_trusted_starts() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = std::env::temp_dir().join(format!("superprof-prove-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = elf_patch::compile_child(&root, &dir);
        let original = Elf::read(&exe);
        let work = original.symbol("child_work", SymField::Value);
        let size = original.symbol("child_work", SymField::Size);
        let code = ElfCode::open(&exe).unwrap();
        code.prove_function(work, size, "child_work").unwrap();
        code.prove_instruction_start(work).unwrap();

        // The starts a decoder finds from the function's start are all proven; the byte after
        // each multi-byte instruction's first is not.
        let bytes = code.bytes(work, size).unwrap();
        let insns = crate::decode_all_for(code.arch, bytes, work);
        assert!(insns.len() > 3);
        for i in &insns {
            code.prove_instruction_start(i.addr).unwrap();
            if i.len > 1 {
                let err = code.prove_instruction_start(i.addr + 1).unwrap_err();
                assert!(err.contains("not the start of an instruction"), "{err}");
            }
        }
        // Data: the ELF header's address range and .rodata are no code.
        let rodata = original.section(".rodata", elf_patch::Field::Addr);
        let err = code.prove_instruction_start(rodata).unwrap_err();
        assert!(err.contains("not in the executable code"), "{err}");
        // A symbol table shifted off the code.
        for shift in [2, 4, 11] {
            let mut e = original.clone();
            e.set_symbol("child_work", SymField::Value, work + shift);
            let path = dir.join(format!("shifted-{shift}"));
            e.write(&path);
            let shifted = ElfCode::open(&path).unwrap();
            let err = shifted
                .prove_function(work + shift, size, "child_work")
                .unwrap_err();
            assert!(
                err.contains("does not match the code")
                    || err.contains("not the start of an instruction"),
                "shift {shift}: {err}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
