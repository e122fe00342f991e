//! ELF images: parsed once per run, shared by every process that maps them.

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
pub struct SectionBytes {
    map: Arc<Mmap>,
    range: Range<usize>,
}

impl Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[self.range.clone()]
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
    pub path: PathBuf,
    map: Arc<Mmap>,
    segments: Vec<Segment>,
    sections: HashMap<&'static [u8], SectionInfo>,
}

const UNWIND_SECTIONS: [&[u8]; 5] = [
    b".text",
    b".eh_frame",
    b".eh_frame_hdr",
    b".debug_frame",
    b".got",
];

impl ElfImage {
    pub fn open(path: &Path) -> Option<ElfImage> {
        let map = Arc::new(crate::sys::map_file(path).ok()?);
        let obj = object::File::parse(&**map).ok()?;
        let segments = obj
            .segments()
            .map(|s| {
                let (offset, filesz) = s.file_range();
                let executable = match s.flags() {
                    object::SegmentFlags::Elf { p_flags, .. } => {
                        p_flags.0 & object::elf::PF_X.0 != 0
                    }
                    _ => false,
                };
                Segment {
                    vaddr: s.address(),
                    offset,
                    filesz,
                    executable,
                }
            })
            .collect();
        let mut sections = HashMap::new();
        for name in UNWIND_SECTIONS {
            let Ok(Some(sec)) = std::str::from_utf8(name).map(|n| obj.section_by_name(n)) else {
                continue;
            };
            let Some((off, size)) = sec.file_range() else {
                continue;
            };
            let file = off as usize..(off + size) as usize;
            if file.end > map.len() {
                continue;
            }
            sections.insert(
                name,
                SectionInfo {
                    svma: sec.address()..sec.address() + sec.size(),
                    file,
                },
            );
        }
        Some(ElfImage {
            path: path.to_owned(),
            map,
            segments,
            sections,
        })
    }

    /// The load bias (runtime address minus ELF virtual address) of an executable mapping of
    /// this file: `len` bytes at `start`, mapping file offset `pgoff`. The segment is the
    /// executable PT_LOAD whose file range overlaps the mapping (independent of page size, and
    /// right for linkers such as lld whose code segment shares a page with read-only data).
    pub fn bias_for_mapping(&self, start: u64, len: u64, pgoff: u64) -> u64 {
        let overlaps = |s: &&Segment| s.offset < pgoff + len && pgoff < s.offset + s.filesz.max(1);
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

    pub fn framehop_module(
        &self,
        name: String,
        avma: Range<u64>,
        bias: u64,
    ) -> framehop::Module<SectionBytes> {
        framehop::Module::new(name, avma, bias, SectionSource(self))
    }
}

impl ElfImage {
    /// ELF address ranges of the executable PT_LOAD segments.
    pub fn executable_ranges(&self) -> Vec<Range<u64>> {
        self.segments
            .iter()
            .filter(|s| s.executable && s.filesz > 0)
            .map(|s| s.vaddr..s.vaddr + s.filesz)
            .collect()
    }

    /// Whether the file has unwind information (.eh_frame or .debug_frame).
    pub fn has_unwind_info(&self) -> bool {
        self.sections.contains_key(&b".eh_frame"[..])
            || self.sections.contains_key(&b".debug_frame"[..])
    }
}

struct SectionSource<'a>(&'a ElfImage);

impl framehop::ModuleSectionInfo<SectionBytes> for SectionSource<'_> {
    fn base_svma(&self) -> u64 {
        0
    }
    fn section_svma_range(&mut self, name: &[u8]) -> Option<Range<u64>> {
        self.0.sections.get(name).map(|s| s.svma.clone())
    }
    fn section_data(&mut self, name: &[u8]) -> Option<SectionBytes> {
        self.0.sections.get(name).map(|s| SectionBytes {
            map: self.0.map.clone(),
            range: s.file.clone(),
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

    pub fn path(&self, id: ModuleId) -> &Path {
        &self.modules[id.0 as usize].0
    }

    pub fn image(&self, id: ModuleId) -> Option<&Arc<ElfImage>> {
        self.modules[id.0 as usize].1.as_ref()
    }

    pub fn len(&self) -> usize {
        self.modules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }
}
