//! ELF images: parsed once per run, shared by every process that maps them.
//!
//! The file is the target's, so anyone may have written it: every offset, size and address
//! read from its headers is checked here, once, when the image is opened (a section whose
//! bytes lie outside the file, whose addresses wrap, or that contradicts the segment holding
//! it is left out). What the unwinder gets afterwards (in a signal handler, for libsuperprof)
//! is consistent, and [`SectionBytes`] cannot index out of bounds.

use std::collections::HashMap;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use object::{Object, ObjectSection, ObjectSegment};

/// A run-wide number for a module (a distinct file mapped by some process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(pub u32);

/// Bytes of one section of a mapped file, cheap to clone.
#[derive(Clone)]
pub struct SectionBytes(Bytes);

#[derive(Clone)]
enum Bytes {
    /// A section of a mapped ELF file.
    Mapped { map: Arc<Mmap>, range: Range<usize> },
    /// Bytes of their own (a JIT's unwind tables, from its jitdump).
    Owned(Arc<[u8]>),
}

impl Default for SectionBytes {
    fn default() -> Self {
        SectionBytes(Bytes::Owned(Arc::from(Vec::new())))
    }
}

impl Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            // The range was checked against the file at open; `get` keeps this panic-free.
            Bytes::Mapped { map, range } => map.get(range.clone()).unwrap_or_default(),
            Bytes::Owned(b) => b,
        }
    }
}

/// A framehop module for JIT code at `code` whose `.eh_frame` (and its header, when given)
/// sit at runtime addresses `eh_frame_at` (and `hdr_at`), as a runtime's jitdump describes
/// them: the code's own unwind tables. Their CIEs are made readable first
/// ([`drop_omitted_lsda`]).
pub fn jit_module(
    name: String,
    code: Range<u64>,
    eh_frame_at: u64,
    mut eh_frame: Vec<u8>,
    hdr: Option<(u64, Vec<u8>)>,
) -> framehop::Module<SectionBytes> {
    drop_omitted_lsda(&mut eh_frame);
    let range = |at: u64, len: usize| at..at.saturating_add(len as u64);
    let info = framehop::ExplicitModuleSectionInfo {
        base_svma: code.start,
        text_svma: Some(code.clone()),
        eh_frame_svma: Some(range(eh_frame_at, eh_frame.len())),
        eh_frame: Some(SectionBytes(Bytes::Owned(eh_frame.into()))),
        eh_frame_hdr_svma: hdr.as_ref().map(|(at, b)| range(*at, b.len())),
        eh_frame_hdr: hdr.map(|(_, b)| SectionBytes(Bytes::Owned(b.into()))),
        ..Default::default()
    };
    framehop::Module::new(name, code.clone(), code.start, info)
}

/// Rewrites, in place and at the same length, each CIE of `eh_frame` whose augmentation names
/// an LSDA encoding that is "omitted" (0xff, as V8 writes "zLR"): the 'L' and its byte go, and
/// two DW_CFA_nop take their room at the CIE's end. gimli refuses such CIEs' FDEs
/// ("CannotParseOmitPointerEncoding"); they mean the same without the 'L'. Anything that does
/// not parse as expected is left alone.
pub fn drop_omitted_lsda(eh_frame: &mut [u8]) {
    let mut at = 0usize;
    while let Some(len) = eh_frame
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
    {
        if len == 0 || len == 0xffff_ffff {
            return; // the terminator, or 64-bit lengths (not written by JITs)
        }
        let Some(end) = at.checked_add(4 + len).filter(|&e| e <= eh_frame.len()) else {
            return;
        };
        let is_cie = len >= 4 && eh_frame.get(at + 4..at + 8) == Some(&[0, 0, 0, 0][..]);
        if let (true, Some(body)) = (is_cie, eh_frame.get_mut(at + 8..end)) {
            fix_cie(body);
        }
        at = end;
    }
}

/// One CIE's body after its id: version, augmentation, alignments, return register,
/// augmentation data, instructions.
fn fix_cie(body: &mut [u8]) {
    let Some(aug_end) = body.iter().skip(1).position(|&b| b == 0).map(|p| p + 1) else {
        return;
    };
    let aug = body[1..aug_end].to_vec();
    if !aug.contains(&b'L') {
        return;
    }
    if aug.first() != Some(&b'z') || !aug.iter().all(|c| b"zLRPS".contains(c)) {
        return;
    }
    // Past the NUL: code alignment (ULEB), data alignment (SLEB), return register (ULEB for
    // version 3, a byte for 1), then the augmentation data's length (ULEB, one byte here).
    let leb_len = |b: &[u8]| b.iter().position(|&x| x & 0x80 == 0).map(|p| p + 1);
    let mut p = aug_end + 1;
    for _ in 0..2 {
        let Some(n) = body.get(p..).and_then(leb_len) else {
            return;
        };
        p += n;
    }
    p += if body[0] == 1 {
        1
    } else {
        match body.get(p..).and_then(leb_len) {
            Some(n) => n,
            None => return,
        }
    };
    let Some(&data_len) = body.get(p) else { return };
    if data_len & 0x80 != 0 || data_len == 0 {
        return;
    }
    let data_start = p + 1;
    // The data holds one field per letter after 'z': P (encoding + pointer) is not handled.
    if aug.contains(&b'P') {
        return;
    }
    let Some(field) = aug[1..]
        .iter()
        .filter(|&&c| c != b'S')
        .position(|&c| c == b'L')
    else {
        return;
    };
    if body.get(data_start + field) != Some(&0xff) || data_start + data_len as usize > body.len() {
        return;
    }
    // Rebuild: augmentation without 'L', data without its byte, the rest, two nops.
    let mut out = Vec::with_capacity(body.len());
    out.push(body[0]);
    out.extend(aug.iter().filter(|&&c| c != b'L'));
    out.push(0);
    out.extend_from_slice(&body[aug_end + 1..p]);
    out.push(data_len - 1);
    for (i, b) in body[data_start..data_start + data_len as usize]
        .iter()
        .enumerate()
    {
        if i != field {
            out.push(*b);
        }
    }
    out.extend_from_slice(&body[data_start + data_len as usize..]);
    out.extend_from_slice(&[0, 0]); // DW_CFA_nop, twice
    if out.len() == body.len() {
        body.copy_from_slice(&out);
    }
}

#[derive(Debug, Clone)]
struct Segment {
    vaddr: u64,
    offset: u64,
    filesz: u64,
    executable: bool,
}

#[derive(Debug, Clone)]
struct SectionInfo {
    svma: Range<u64>,
    file: Range<usize>,
}

/// What the unwinder needs of one ELF file.
pub struct ElfImage {
    /// The path the file was opened from.
    pub path: PathBuf,
    map: Arc<Mmap>,
    segments: Vec<Segment>,
    sections: HashMap<&'static [u8], SectionInfo>,
    /// Answers of [`ElfImage::cfi_ends_stack`] by address: the outermost frames of a run's
    /// stacks are a handful of addresses (`_start`, a thread's start), asked at every sample.
    ends_stack: std::sync::Mutex<HashMap<(u64, u16), Option<bool>>>,
}

const UNWIND_SECTIONS: [&[u8]; 5] = [
    b".text",
    b".eh_frame",
    b".eh_frame_hdr",
    b".debug_frame",
    b".got",
];

impl ElfImage {
    /// Opens and checks `path`; None when it cannot be read or is not an object file. Sections
    /// and segments with impossible values are left out (the rest of the file is still used).
    pub fn open(path: &Path) -> Option<ElfImage> {
        let map = Arc::new(crate::sys::map_file(path).ok()?);
        let obj = object::File::parse(&**map).ok()?;
        let file_len = map.len() as u64;
        let segments: Vec<Segment> = obj
            .segments()
            .filter_map(|s| {
                let (offset, filesz) = s.file_range();
                // Offsets and addresses that wrap cannot be placed anywhere.
                offset.checked_add(filesz)?;
                s.address().checked_add(filesz)?;
                let executable = match s.flags() {
                    object::SegmentFlags::Elf { p_flags, .. } => {
                        p_flags.0 & object::elf::PF_X.0 != 0
                    }
                    _ => false,
                };
                Some(Segment {
                    vaddr: s.address(),
                    offset,
                    filesz,
                    executable,
                })
            })
            .collect();
        let mut sections = HashMap::new();
        for name in UNWIND_SECTIONS {
            let Ok(Some(sec)) = std::str::from_utf8(name).map(|n| obj.section_by_name(n)) else {
                continue;
            };
            if let Some(info) = checked_section(&sec, file_len, &segments) {
                sections.insert(name, info);
            }
        }
        if !eh_frame_hdr_is_sound(&map, &sections) {
            // framehop indexes .eh_frame itself when there is no .eh_frame_hdr.
            sections.remove(&b".eh_frame_hdr"[..]);
        }
        Some(ElfImage {
            path: path.to_owned(),
            map,
            segments,
            sections,
            ends_stack: Default::default(),
        })
    }

    /// The load bias (runtime address minus ELF virtual address) of an executable mapping of
    /// this file: `len` bytes at `start`, mapping file offset `pgoff`. The segment is the
    /// executable PT_LOAD whose file range overlaps the mapping (independent of page size, and
    /// right for linkers such as lld whose code segment shares a page with read-only data).
    pub fn bias_for_mapping(&self, start: u64, len: u64, pgoff: u64) -> u64 {
        let overlaps = |s: &&Segment| {
            s.offset < pgoff.saturating_add(len) && pgoff < s.offset.saturating_add(s.filesz.max(1))
        };
        let seg = self
            .segments
            .iter()
            .filter(overlaps)
            .find(|s| s.executable)
            .or_else(|| self.segments.iter().find(overlaps));
        match seg {
            Some(s) => start
                .wrapping_add(s.offset)
                .wrapping_sub(pgoff)
                .wrapping_sub(s.vaddr),
            None => start.wrapping_sub(pgoff),
        }
    }

    /// The load bias of a mapping of a file that may be unreadable (`image` None: gone,
    /// or not an ELF file): [`ElfImage::bias_for_mapping`], else `start - pgoff` (right for
    /// the usual layout, where file offsets and addresses differ by the same amount).
    pub fn mapping_bias(image: Option<&ElfImage>, start: u64, len: u64, pgoff: u64) -> u64 {
        image.map_or(start.wrapping_sub(pgoff), |img| {
            img.bias_for_mapping(start, len, pgoff)
        })
    }

    /// The module for framehop: the code at `avma`, `bias` from its ELF addresses. framehop
    /// looks code up by its offset (32 bits) from the module's base, so the base is the start
    /// of this range (and its ELF address), not address 0 nor the file's lowest segment: a
    /// kernel linked at 0xffffffff80100000 and loaded where it was linked (bias 0) is
    /// 2^64 - 2^31 bytes past a base of 0, and a low boot segment (at 1 MiB, say) is as far
    /// below its code; from either base nothing in it would be found.
    pub fn framehop_module(
        &self,
        name: String,
        avma: Range<u64>,
        bias: u64,
    ) -> framehop::Module<SectionBytes> {
        let base_svma = avma.start.wrapping_sub(bias);
        framehop::Module::new(
            name,
            avma.clone(),
            avma.start,
            SectionSource {
                image: self,
                base_svma,
            },
        )
    }
}

impl ElfImage {
    /// What the CFI says of the frame at ELF address `svma` (for a return address, give the
    /// address before it): `Some(true)` where the return address is undefined, the outermost
    /// frame of a stack (a program's or a kernel's entry, a thread's start); `Some(false)`
    /// where the CFI has a rule for it; `None` where no CFI covers it. `ra` is the
    /// architecture's return-address column.
    pub fn cfi_ends_stack(&self, svma: u64, ra: gimli::Register) -> Option<bool> {
        let key = (svma, ra.0);
        if let Some(&known) = self
            .ends_stack
            .lock()
            .ok()
            .as_ref()
            .and_then(|m| m.get(&key))
        {
            return known;
        }
        let answer = self.read_cfi_ends_stack(svma, ra);
        if let Ok(mut m) = self.ends_stack.lock() {
            if m.len() < 1 << 16 {
                m.insert(key, answer);
            }
        }
        answer
    }

    fn read_cfi_ends_stack(&self, svma: u64, ra: gimli::Register) -> Option<bool> {
        use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian, UnwindSection};
        let bases = |own: Option<u64>, eh: bool| {
            let mut b = BaseAddresses::default();
            if let (true, Some(at)) = (eh, own) {
                b = b.set_eh_frame(at);
            }
            if let Some(t) = self.sections.get(&b".text"[..]) {
                b = b.set_text(t.svma.start);
            }
            if let Some(g) = self.sections.get(&b".got"[..]) {
                b = b.set_got(g.svma.start);
            }
            b
        };
        let rule = |row: &gimli::UnwindTableRow<usize>| {
            matches!(row.register(ra), Some(gimli::RegisterRule::Undefined))
        };
        if let Some(info) = self.sections.get(&b".eh_frame"[..]) {
            let data = self.map.get(info.file.clone())?;
            let eh = EhFrame::new(data, LittleEndian);
            let mut ctx = Box::new(gimli::UnwindContext::new());
            let b = bases(Some(info.svma.start), true);
            // The binary-search table of .eh_frame_hdr where there is one (checked at open):
            // else gimli walks every FDE.
            let hdr = self.sections.get(&b".eh_frame_hdr"[..]).and_then(|hdr| {
                let hb = b.clone().set_eh_frame_hdr(hdr.svma.start);
                let d = self.map.get(hdr.file.clone())?;
                Some((
                    gimli::EhFrameHdr::new(d, LittleEndian).parse(&hb, 8).ok()?,
                    hb,
                ))
            });
            match hdr.as_ref().and_then(|(p, hb)| Some((p.table()?, hb))) {
                Some((table, hb)) => {
                    let found = table.unwind_info_for_address(
                        &eh,
                        hb,
                        &mut ctx,
                        svma,
                        EhFrame::cie_from_offset,
                    );
                    if let Ok(row) = found {
                        return Some(rule(row));
                    }
                }
                None => {
                    if let Ok(row) =
                        eh.unwind_info_for_address(&b, &mut ctx, svma, EhFrame::cie_from_offset)
                    {
                        return Some(rule(row));
                    }
                }
            }
        }
        if let Some(info) = self.sections.get(&b".debug_frame"[..]) {
            let data = self.map.get(info.file.clone())?;
            let df = DebugFrame::new(data, LittleEndian);
            let mut ctx = Box::new(gimli::UnwindContext::new());
            let b = bases(None, false);
            if let Ok(row) =
                df.unwind_info_for_address(&b, &mut ctx, svma, DebugFrame::cie_from_offset)
            {
                return Some(rule(row));
            }
        }
        None
    }

    /// ELF address ranges of the executable PT_LOAD segments.
    pub fn executable_ranges(&self) -> Vec<Range<u64>> {
        self.segments
            .iter()
            .filter(|s| s.executable && s.filesz > 0)
            .map(|s| s.vaddr..s.vaddr.saturating_add(s.filesz))
            .collect()
    }

    /// Whether the file has unwind information (.eh_frame or .debug_frame).
    pub fn has_unwind_info(&self) -> bool {
        self.sections.contains_key(&b".eh_frame"[..])
            || self.sections.contains_key(&b".debug_frame"[..])
    }
}

/// The file bytes and ELF addresses of a section, when they make sense: the bytes inside the
/// file (`offset + size` not wrapping), the addresses not wrapping, the bytes stored as they are
/// (not compressed), and for a section that is loaded (SHF_ALLOC) inside a PT_LOAD segment's
/// file range, the address the segment gives its offset.
fn checked_section<'a>(
    sec: &impl ObjectSection<'a>,
    file_len: u64,
    segments: &[Segment],
) -> Option<SectionInfo> {
    let (off, size) = sec.file_range()?;
    let end = off.checked_add(size).filter(|&e| e <= file_len)?;
    let svma = sec.address()..sec.address().checked_add(size)?;
    let object::SectionFlags::Elf { sh_flags, .. } = sec.flags() else {
        return None;
    };
    if sh_flags.0 & object::elf::SHF_COMPRESSED.0 != 0 {
        return None;
    }
    if sh_flags.0 & object::elf::SHF_ALLOC.0 != 0 {
        let mut holders = segments
            .iter()
            .filter(|s| s.offset <= off && end <= s.offset.saturating_add(s.filesz))
            .peekable();
        let held = holders.peek().is_some();
        if held && !holders.any(|s| s.vaddr.checked_add(off - s.offset) == Some(svma.start)) {
            return None;
        }
    }
    Some(SectionInfo {
        svma,
        file: usize::try_from(off).ok()?..usize::try_from(end).ok()?,
    })
}

/// Whether `.eh_frame_hdr`'s search table can be used as it is while sampling: it parses with
/// the bases framehop gives it, points at `.eh_frame`, holds as many entries as it says, sorted,
/// each naming a record inside `.eh_frame`. (gimli's lookup trusts the entry count and the
/// pointers: with others it computes offsets that overflow.)
fn eh_frame_hdr_is_sound(map: &Mmap, sections: &HashMap<&'static [u8], SectionInfo>) -> bool {
    use gimli::{BaseAddresses, EhFrameHdr, LittleEndian};
    let section = |name: &[u8]| sections.get(name);
    let (Some(hdr), Some(eh_frame)) = (section(b".eh_frame_hdr"), section(b".eh_frame")) else {
        return true; // nothing to check (or nothing framehop would use)
    };
    let Some(bytes) = map.get(hdr.file.clone()) else {
        return false;
    };
    let start = |name: &[u8]| section(name).map_or(0, |s| s.svma.start);
    let bases = BaseAddresses::default()
        .set_eh_frame(eh_frame.svma.start)
        .set_eh_frame_hdr(hdr.svma.start)
        .set_text(start(b".text"))
        .set_got(start(b".got"));
    let Ok(parsed) = EhFrameHdr::new(bytes, LittleEndian).parse(&bases, 8) else {
        return false;
    };
    if parsed.eh_frame_ptr().direct().ok() != Some(eh_frame.svma.start) {
        return false;
    }
    let Some(table) = parsed.table() else {
        return false;
    };
    let mut previous = 0;
    for entry in table.iter(&bases) {
        let Ok((from, to)) = entry else { return false };
        let (Ok(from), Ok(to)) = (from.direct(), to.direct()) else {
            return false;
        };
        if from < previous || !eh_frame.svma.contains(&to) {
            return false;
        }
        previous = from;
    }
    true
}

struct SectionSource<'a> {
    image: &'a ElfImage,
    /// The ELF address of the module's base (see [`ElfImage::framehop_module`]).
    base_svma: u64,
}

impl framehop::ModuleSectionInfo<SectionBytes> for SectionSource<'_> {
    fn base_svma(&self) -> u64 {
        self.base_svma
    }
    fn section_svma_range(&mut self, name: &[u8]) -> Option<Range<u64>> {
        self.image.sections.get(name).map(|s| s.svma.clone())
    }
    fn section_data(&mut self, name: &[u8]) -> Option<SectionBytes> {
        self.image.sections.get(name).map(|s| {
            SectionBytes(Bytes::Mapped {
                map: self.image.map.clone(),
                range: s.file.clone(),
            })
        })
    }
}

/// Every module seen in a run, each file opened and parsed once.
#[derive(Default)]
pub struct ElfCache {
    by_path: HashMap<PathBuf, ModuleId>,
    modules: Vec<(PathBuf, Option<Arc<ElfImage>>)>,
}

impl ElfCache {
    /// The module for `path` (as the target names it), opening `open_path` on first sight.
    pub fn module(&mut self, path: &Path, open_path: &Path) -> ModuleId {
        if let Some(&id) = self.by_path.get(path) {
            return id;
        }
        let image = if open_path.is_absolute() {
            ElfImage::open(open_path).map(Arc::new)
        } else {
            None // [anon:...] and friends
        };
        let id = ModuleId(self.modules.len() as u32);
        self.modules.push((path.to_owned(), image));
        self.by_path.insert(path.to_owned(), id);
        id
    }

    /// The path of module `id` as the target names it (which may differ from the path opened).
    pub fn path(&self, id: ModuleId) -> &Path {
        &self.modules[id.0 as usize].0
    }

    /// The parsed file of module `id`; None where it could not be read or parsed, or has no
    /// absolute path (`[vdso]`, `[anon:...]`).
    pub fn image(&self, id: ModuleId) -> Option<&Arc<ElfImage>> {
        self.modules[id.0 as usize].1.as_ref()
    }

    /// How many modules were seen (ids run from 0 to this, exclusive).
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    /// Whether no module was seen yet.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }
}
