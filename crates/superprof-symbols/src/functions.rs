//! The functions an ELF file defines, from its symbol tables: one reading of `.symtab` and
//! `.dynsym` for every part of superprof that looks functions up by name or address (the
//! regions of `stat` and `blocks`, and the code `blocks` decodes).

use object::{Object, ObjectSymbol};

/// A function an ELF file defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfFunction<'data> {
    /// Its name as the symbol table has it (mangled).
    pub name: &'data str,
    /// Its address in the file (add the load bias for the running one).
    pub addr: u64,
    /// Its size in bytes (0 where the symbol table does not say).
    pub size: u64,
    /// An indirect function (STT_GNU_IFUNC): the symbol is its resolver, not the function
    /// a call through the PLT reaches.
    pub ifunc: bool,
}

/// The functions `obj` defines, from `.symtab` then `.dynsym` (a function may be in both):
/// text symbols with an address, not undefined (an undefined function of a non-PIE program
/// has an address too, its PLT entry's), with a name, and whose range does not wrap.
pub fn elf_functions<'data, 'file>(
    obj: &'file object::File<'data>,
) -> impl Iterator<Item = ElfFunction<'data>> + 'file {
    obj.symbols()
        .chain(obj.dynamic_symbols())
        .filter_map(|sym| {
            if sym.kind() != object::SymbolKind::Text || sym.address() == 0 || sym.is_undefined() {
                return None;
            }
            sym.address().checked_add(sym.size())?;
            const STT_GNU_IFUNC: u8 = 10;
            let ifunc = matches!(
                sym.flags(),
                object::SymbolFlags::Elf { st_info, .. } if st_info.0 & 0xf == STT_GNU_IFUNC
            );
            Some(ElfFunction {
                name: sym.name().ok()?,
                addr: sym.address(),
                size: sym.size(),
                ifunc,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_defines_its_own_functions_and_the_libc_ifuncs_are_marked() {
        let data = std::fs::read("/proc/self/exe").unwrap();
        let obj = object::File::parse(&*data).unwrap();
        let all: Vec<ElfFunction> = elf_functions(&obj).collect();
        let me = all
            .iter()
            .find(|f| crate::demangle(f.name).contains("this_test_binary_defines_its_own"))
            .expect("this test's own function");
        assert!(me.addr != 0 && me.size > 0, "{me:?}");
        // Nothing undefined (memcpy is libc's: only an undefined symbol here).
        assert!(!all.iter().any(|f| f.name == "memcpy"), "{all:?}");
        // Debian's libc: memcpy is an indirect function there.
        let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6")
            .or_else(|_| std::fs::read("/lib/aarch64-linux-gnu/libc.so.6"))
            .unwrap();
        let obj = object::File::parse(&*libc).unwrap();
        // (Its memcpy@GLIBC_2.2.5, a compatibility symbol, is a plain function.)
        let memcpy: Vec<ElfFunction> = elf_functions(&obj).filter(|f| f.name == "memcpy").collect();
        assert!(memcpy.iter().any(|f| f.ifunc), "{memcpy:?}");
        assert!(
            !elf_functions(&obj)
                .find(|f| f.name == "getpid")
                .unwrap()
                .ifunc
        );
    }
}
