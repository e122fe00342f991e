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

/// The landing pads (where the unwinder resumes a frame that catches an exception or runs
/// cleanups) of the functions whose FDEs of `.eh_frame` start in [lo, hi), from their
/// language-specific data (`.gcc_except_table`): code that no branch reaches. Sorted, each
/// once; empty where there is none or it cannot be read (hostile bytes give nothing).
pub fn landing_pads(data: &[u8], lo: u64, hi: u64) -> Vec<u64> {
    let Ok(obj) = object::File::parse(data) else {
        return Vec::new();
    };
    let endian = if obj.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let Some(eh) = obj.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(bytes) = eh.data() else {
        return Vec::new();
    };
    let mut section = gimli::EhFrame::new(bytes, endian);
    section.set_address_size(if obj.is_64() { 8 } else { 4 });
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(eh.address());
    if let Some(t) = obj.section_by_name(".text") {
        bases = bases.set_text(t.address());
    }
    if let Some(g) = obj.section_by_name(".got") {
        bases = bases.set_got(g.address());
    }
    // The sections an LSDA may lie in (read-only data).
    let tables: Vec<(u64, &[u8])> = obj
        .sections()
        .filter(|s| {
            s.name()
                .is_ok_and(|n| n.starts_with(".gcc_except_table") || n == ".rodata")
        })
        .filter_map(|s| Some((s.address(), s.data().ok()?)))
        .collect();
    let mut out = Vec::new();
    let mut entries = section.entries(&bases);
    let mut n = 0usize;
    while let Ok(Some(entry)) = entries.next() {
        n += 1;
        if n > MAX_FDES {
            break;
        }
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset) else {
            continue;
        };
        let start = fde.initial_address();
        if start < lo || start >= hi {
            continue;
        }
        let Some(gimli::Pointer::Direct(lsda)) = fde.lsda() else {
            continue;
        };
        let Some(bytes) = tables.iter().find_map(|&(a, d)| {
            let off = usize::try_from(lsda.checked_sub(a)?).ok()?;
            d.get(off..)
        }) else {
            continue;
        };
        if let Some(pads) = lsda_landing_pads(bytes, lsda, start, fde.len(), endian) {
            out.extend(pads);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The most call sites taken from one LSDA.
const MAX_CALL_SITES: usize = 1 << 16;

/// The landing pads an LSDA (at address `at`, its bytes from there on) lists for the function
/// [start, start + len): its header (landing-pad base, type table, call-site encoding), then
/// call sites of (start, length, landing pad, action), the pads relative to the base.
fn lsda_landing_pads(
    bytes: &[u8],
    at: u64,
    start: u64,
    len: u64,
    endian: gimli::RunTimeEndian,
) -> Option<Vec<u64>> {
    use gimli::Reader;
    let mut r = gimli::EndianSlice::new(bytes, endian);
    let pos = |r: &gimli::EndianSlice<gimli::RunTimeEndian>| {
        at.checked_add((bytes.len() - r.len()) as u64)
    };
    let lp_enc = r.read_u8().ok()?;
    let mut base = start;
    if lp_enc != 0xff {
        let p = pos(&r)?;
        base = read_encoded(&mut r, lp_enc, p)?;
    }
    let tt_enc = r.read_u8().ok()?;
    if tt_enc != 0xff {
        r.read_uleb128().ok()?;
    }
    let cs_enc = r.read_u8().ok()?;
    let table_len = usize::try_from(r.read_uleb128().ok()?).ok()?;
    let mut table = r.split(table_len).ok()?;
    let mut pads = Vec::new();
    while !table.is_empty() && pads.len() < MAX_CALL_SITES {
        let p = pos(&table)?;
        let _site = read_encoded(&mut table, cs_enc, p)?;
        let p = pos(&table)?;
        let _site_len = read_encoded(&mut table, cs_enc, p)?;
        let p = pos(&table)?;
        let pad = read_encoded(&mut table, cs_enc, p)?;
        table.read_uleb128().ok()?;
        if pad != 0 {
            let pad = base.checked_add(pad)?;
            // A pad outside its function is not believed.
            if pad >= start && pad - start < len {
                pads.push(pad);
            }
        }
    }
    Some(pads)
}

/// A DW_EH_PE-encoded value at address `at` (absolute, or relative to `at` with pcrel; the
/// other bases do not occur in call-site tables and are refused).
fn read_encoded(r: &mut gimli::EndianSlice<gimli::RunTimeEndian>, enc: u8, at: u64) -> Option<u64> {
    use gimli::Reader;
    if enc & 0x80 != 0 {
        return None; // indirect
    }
    let value = match enc & 0x0f {
        0x00 => r.read_u64().ok()?,
        0x01 => r.read_uleb128().ok()?,
        0x02 => u64::from(r.read_u16().ok()?),
        0x03 => u64::from(r.read_u32().ok()?),
        0x04 => r.read_u64().ok()?,
        0x09 => r.read_sleb128().ok()? as u64,
        0x0a => r.read_i16().ok()? as i64 as u64,
        0x0b => r.read_i32().ok()? as i64 as u64,
        0x0c => r.read_i64().ok()? as u64,
        _ => return None,
    };
    match enc & 0x70 {
        0x00 => Some(value),
        0x10 => Some(at.wrapping_add(value)),
        _ => None,
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
    fn an_lsdas_call_sites_give_its_landing_pads() {
        // No landing-pad base, no type table, call sites in ULEB128: (0x10, 5, pad 0x40,
        // action 0), (0x20, 3, no pad, 0), (0x30, 2, pad 0x90: outside a 0x80-byte function).
        let lsda = [
            0xff, 0xff, 0x01, 13, 0x10, 5, 0x40, 0, 0x20, 3, 0, 0, 0x30, 2, 0x90, 0x01, 1, 1,
        ];
        let pads = lsda_landing_pads(&lsda, 0x5000, 0x1000, 0x80, gimli::RunTimeEndian::Little);
        assert_eq!(pads, Some(vec![0x1040]));
        // Cut short: nothing, no panic.
        for n in 0..lsda.len() - 2 {
            let _ = lsda_landing_pads(
                &lsda[..n],
                0x5000,
                0x1000,
                0x80,
                gimli::RunTimeEndian::Little,
            );
        }
        // udata4 call sites.
        let mut four = vec![0xff, 0xff, 0x03, 13];
        for v in [0x10u32, 5, 0x44] {
            four.extend(v.to_le_bytes());
        }
        four.push(0); // the action: always ULEB128
        assert_eq!(
            lsda_landing_pads(&four, 0, 0x1000, 0x80, gimli::RunTimeEndian::Little),
            Some(vec![0x1044])
        );
    }

    #[test]
    fn hostile_bytes_give_nothing() {
        assert!(landing_pads(b"not an elf", 0, u64::MAX).is_empty());
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
