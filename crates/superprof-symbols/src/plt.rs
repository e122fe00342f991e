//! Names for the entries of an ELF file's PLT (`malloc@plt`, `*ABS*+0x9f550@plt` for an
//! indirect function's), as perf and objdump give them: a sample in a call's PLT stub is named
//! by the function it goes to, not left as `libc.so.6+0x27310`.
//!
//! Each entry (16 bytes: after a 16-byte header in `.plt` on x86_64, or in `.plt.sec`, with no
//! header, where the file has one (IBT); after a 32-byte header on AArch64) jumps through a
//! GOT slot: decoded from its instructions (x86_64's `jmp *disp(%rip)`, AArch64's `adrp x16` and
//! `ldr x17, [x16, #off]`), the slot is the `r_offset` of one relocation of `.rela.plt`, which
//! names it (a JUMP_SLOT's symbol, an IRELATIVE's addend). (Not the relocations' order: an
//! indirect function's entries come first in libc's PLT, its relocations last.) The rest of
//! `.plt` (its header, the lazy binder's stub; with `.plt.sec`, the whole of `.plt`) is
//! `[plt]`. Files of other machines get no names.

use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable};

/// Bytes of one `Elf64_Rela`.
const RELA: usize = 24;
/// The most relocations read (a PLT of more entries is not believed).
const MAX_ENTRIES: usize = 1 << 20;

/// The PLT entries of `obj`: (start, end, name), by address.
pub fn plt_entries(obj: &object::File) -> Vec<(u64, u64, String)> {
    let (header, section) = match obj.architecture() {
        object::Architecture::X86_64 => match obj.section_by_name(".plt.sec") {
            Some(s) => (0, s),
            None => match obj.section_by_name(".plt") {
                Some(s) => (16, s),
                None => return Vec::new(),
            },
        },
        object::Architecture::Aarch64 => match obj.section_by_name(".plt") {
            Some(s) => (32, s),
            None => return Vec::new(),
        },
        _ => return Vec::new(),
    };
    let Some(rela) = obj.section_by_name(".rela.plt").and_then(|s| s.data().ok()) else {
        return Vec::new();
    };
    let dynsym = obj.dynamic_symbol_table();
    // GOT slot -> name.
    let mut names = std::collections::HashMap::new();
    for r in rela.chunks_exact(RELA).take(MAX_ENTRIES) {
        let word = |k: usize| u64::from_le_bytes(r[k * 8..k * 8 + 8].try_into().expect("8 bytes"));
        let (slot, info, addend) = (word(0), word(1), word(2));
        let sym = (info >> 32) as usize;
        let name = if sym == 0 {
            format!("*ABS*+{addend:#x}")
        } else {
            match dynsym
                .as_ref()
                .and_then(|t| t.symbol_by_index(object::SymbolIndex(sym)).ok())
                .and_then(|s| s.name().ok())
            {
                Some(n) if !n.is_empty() => n.to_owned(),
                _ => continue,
            }
        };
        names.insert(slot, name);
    }
    let Ok(code) = section.data() else {
        return Vec::new();
    };
    let aarch64 = obj.architecture() == object::Architecture::Aarch64;
    let mut out = Vec::new();
    // The lazy binder's stub: the header, or all of `.plt` beside a `.plt.sec`.
    if let Some(plt) = obj.section_by_name(".plt") {
        let len = if header > 0 { header } else { plt.size() };
        if let Some(end) = plt.address().checked_add(len).filter(|_| len > 0) {
            out.push((plt.address(), end, "[plt]".to_owned()));
        }
    }
    let mut off = header as usize;
    while let Some(entry) = code.get(off..off + 16) {
        // (A section placed at the top of the address space names nothing past it.)
        let Some(at) = section
            .address()
            .checked_add(off as u64 + 16)
            .map(|e| e - 16)
        else {
            break;
        };
        let slot = if aarch64 {
            got_slot_a64(entry, at)
        } else {
            got_slot_x86(entry, at)
        };
        if let Some(name) = slot.and_then(|s| names.get(&s)) {
            out.push((at, at + 16, format!("{name}@plt")));
        }
        off += 16;
    }
    out.sort_by_key(|e| e.0);
    out
}

/// The GOT slot an x86_64 PLT entry at `at` jumps through: its `jmp *disp32(%rip)` (ff 25,
/// after an `endbr64` and a `bnd` prefix in `.plt.sec`).
fn got_slot_x86(entry: &[u8], at: u64) -> Option<u64> {
    let k = entry.windows(2).take(10).position(|w| w == [0xff, 0x25])?;
    let disp = i32::from_le_bytes(entry.get(k + 2..k + 6)?.try_into().ok()?);
    at.checked_add(k as u64 + 6)?
        .checked_add_signed(disp as i64)
}

/// The GOT slot an AArch64 PLT entry at `at` loads: `adrp x16, PAGE` then
/// `ldr x17, [x16, #OFF]`.
fn got_slot_a64(entry: &[u8], at: u64) -> Option<u64> {
    let insn = |k: usize| Some(u32::from_le_bytes(entry.get(k..k + 4)?.try_into().ok()?));
    let (adrp, ldr) = (insn(0)?, insn(4)?);
    // adrp x16: op 1, bits 28-24 10000, rd 16; ldr x17, [x16, #imm] (64-bit, unsigned offset).
    if adrp & 0x9f00_001f != 0x9000_0010 || ldr & 0xffc0_03ff != 0xf940_0211 {
        return None;
    }
    let immlo = u64::from((adrp >> 29) & 3);
    let immhi = u64::from((adrp >> 5) & 0x7_ffff);
    // A 21-bit page count, signed.
    let pages = (((immhi << 2) | immlo) << 43) as i64 >> 43;
    let page = (at & !0xfff).checked_add_signed(pages << 12)?;
    page.checked_add(u64::from((ldr >> 10) & 0xfff) * 8)
}

/// The name of the PLT entry holding `addr` in `entries` (from [`plt_entries`]).
pub fn plt_name(entries: &[(u64, u64, String)], addr: u64) -> Option<&str> {
    let i = entries.partition_point(|e| e.1 <= addr);
    entries.get(i).filter(|e| e.0 <= addr).map(|e| e.2.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian's arm64 libc: `malloc@plt` at 0x27310 loads the slot at 0x1a0078.
    #[test]
    fn decodes_an_aarch64_plt_entry() {
        let entry = [
            0xd0, 0x0b, 0x00, 0xb0, 0x11, 0x3e, 0x40, 0xf9, 0x10, 0xe2, 0x01, 0x91, 0x20, 0x02,
            0x1f, 0xd6,
        ];
        assert_eq!(got_slot_a64(&entry, 0x27310), Some(0x1a0078));
        assert_eq!(got_slot_a64(&[0u8; 16], 0x27310), None);
    }

    /// This machine's libc, named as objdump names its PLT.
    #[test]
    fn names_libcs_plt_as_objdump_does() {
        let path = if cfg!(target_arch = "x86_64") {
            "/lib/x86_64-linux-gnu/libc.so.6"
        } else {
            "/lib/aarch64-linux-gnu/libc.so.6"
        };
        let data = std::fs::read(path).unwrap();
        let obj = object::File::parse(&*data).unwrap();
        let entries = plt_entries(&obj);
        assert!(entries.len() > 10, "{entries:?}");
        let out = std::process::Command::new("objdump")
            .args(["-d", "-j", ".plt", "-j", ".plt.sec", path])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut checked = 0;
        for line in text.lines() {
            // "0000000000026030 <realloc@plt>:"
            let Some((addr, rest)) = line.split_once(" <") else {
                continue;
            };
            let (Ok(addr), Some(name)) = (u64::from_str_radix(addr, 16), rest.strip_suffix(">:"))
            else {
                continue;
            };
            // (The header, "<first@plt-0x10>", is the lazy binder's stub.)
            if !name.ends_with("@plt") {
                assert_eq!(plt_name(&entries, addr), Some("[plt]"), "{line}");
                continue;
            }
            assert_eq!(plt_name(&entries, addr), Some(name), "{line}");
            assert_eq!(plt_name(&entries, addr + 15), Some(name), "{line}");
            checked += 1;
        }
        assert!(checked > 10, "{text}");
        assert_eq!(plt_name(&entries, entries[0].0 - 1), None);
        assert_eq!(entries[0].2, "[plt]");
    }
}
