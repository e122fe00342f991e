//! Function bounds from call-frame information, for code without a symbol (a stripped
//! library): each FDE of `.eh_frame` or `.debug_frame` covers one function, so its start names
//! every address inside it alike (`liblzma.so.5.4.1+0x15ae0`), where one name per address would
//! scatter one function over hundreds of leaves.

use addr2line::gimli::{self, UnwindSection};
use object::{Object, ObjectSection};

/// The most FDEs taken from one file.
const MAX_FDES: usize = 1 << 21;

/// The [start, end) ELF address ranges the FDEs of `data` (an ELF file) cover, sorted by
/// start; empty when it has no CFI or is not an ELF file.
pub fn function_ranges(data: &[u8]) -> Vec<(u64, u64)> {
    let Ok(obj) = object::File::parse(data) else {
        return Vec::new();
    };
    let addr_of = |name: &str| obj.section_by_name(name).map(|s| s.address());
    let mut out = Vec::new();
    let little = obj.is_little_endian();
    let endian = if little {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let mut bases = gimli::BaseAddresses::default();
    if let Some(t) = addr_of(".text") {
        bases = bases.set_text(t);
    }
    if let Some(g) = addr_of(".got") {
        bases = bases.set_got(g);
    }
    if let Some(s) = obj.section_by_name(".eh_frame") {
        if let Ok(bytes) = s.data() {
            let mut eh = gimli::EhFrame::new(bytes, endian);
            eh.set_address_size(if obj.is_64() { 8 } else { 4 });
            let b = bases.clone().set_eh_frame(s.address());
            collect(&eh, &b, &mut out);
        }
    }
    if let Some(s) = obj.section_by_name(".debug_frame") {
        if let Ok(bytes) = s.data() {
            let mut df = gimli::DebugFrame::new(bytes, endian);
            df.set_address_size(if obj.is_64() { 8 } else { 4 });
            collect(&df, &bases, &mut out);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn collect<R: gimli::Reader, S: UnwindSection<R>>(
    section: &S,
    bases: &gimli::BaseAddresses,
    out: &mut Vec<(u64, u64)>,
) where
    S::Offset: gimli::UnwindOffset<R::Offset>,
{
    let mut entries = section.entries(bases);
    loop {
        match entries.next() {
            Ok(Some(gimli::CieOrFde::Fde(partial))) => {
                if out.len() >= MAX_FDES {
                    return;
                }
                let Ok(fde) = partial.parse(S::cie_from_offset) else {
                    continue;
                };
                let start = fde.initial_address();
                let end = start.saturating_add(fde.len());
                if fde.len() > 0 && start > 0 {
                    out.push((start, end));
                }
            }
            Ok(Some(gimli::CieOrFde::Cie(_))) => {}
            // The end, or a broken entry: what came before stays.
            Ok(None) | Err(_) => return,
        }
    }
}

/// The start of the function `ranges` say contains `addr` (the innermost: the last range that
/// starts at or before it and ends after it).
pub fn function_start(ranges: &[(u64, u64)], addr: u64) -> Option<u64> {
    let i = ranges.partition_point(|r| r.0 <= addr);
    ranges[..i]
        .iter()
        .rev()
        .take(8)
        .find(|r| addr < r.1)
        .map(|r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_of_our_own_executable() {
        let exe = std::env::current_exe().unwrap();
        let data = std::fs::read(exe).unwrap();
        let r = function_ranges(&data);
        assert!(r.len() > 100, "{} FDEs", r.len());
        let (s, e) = r[r.len() / 2];
        assert_eq!(function_start(&r, s), Some(s));
        assert_eq!(function_start(&r, e - 1), Some(s));
        assert_eq!(function_start(&r, 0), None);
    }

    #[test]
    fn hostile_bytes_give_nothing() {
        assert!(function_ranges(b"not an elf").is_empty());
        let mut data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // Scribble over the middle of the file: whatever parses still gives sorted ranges.
        let mid = data.len() / 2;
        for b in &mut data[mid..mid + 4096] {
            *b = 0xff;
        }
        let r = function_ranges(&data);
        assert!(r.windows(2).all(|w| w[0] <= w[1]));
    }
}
