//! "Address of function F in this process": the ELF symbol tables of the files a process maps,
//! with each file's load bias (PIE executables and shared libraries included).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use superprof_unwind::ElfImage;

/// A function found in a running process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionAddress {
    /// The symbol's name, demangled.
    pub name: String,
    /// The file it is in, as the process names it ([`MappedFile::path`]).
    pub module: PathBuf,
    /// Runtime address of the function's entry.
    pub addr: u64,
    /// Its size in bytes (0 when the symbol table does not say).
    pub size: u64,
    /// An indirect function (STT_GNU_IFUNC, as glibc's memcpy): the address is its resolver,
    /// run once at load time; calls go to the implementation it chose.
    pub ifunc: bool,
}

/// The functions of process `pid` named `name` (the exact symbol name, or its demangled form),
/// in every executable file it maps; if there are none, the C++ functions whose demangled name
/// without its parameter list is `name` (`f` for `f(int)`).
pub fn find_function(pid: u32, name: &str) -> std::io::Result<Vec<FunctionAddress>> {
    // A demangled name has a parameter list (C++) or a path (Rust): a plain name such as
    // `malloc` is compared with the raw names only.
    let plain = !name.contains('(') && !name.contains("::");
    let exact = scan(pid, |raw, demangled, _| {
        raw == name || (!plain && demangled() == name)
    })?;
    if !exact.is_empty() {
        return Ok(exact);
    }
    // A C++ function by its name without its parameters (`f` for `f(int)`), as perf users
    // write it.
    scan(pid, |_, demangled, _| base_name(&demangled()) == Some(name))
}

/// A demangled C++ name without its parameter list (and what follows it: `const`): `ns::f`
/// for `ns::f(int) const`; None for a name with no parameters, and for a compiler's clone
/// (`g(int) [clone .cold]`: a part of `g`, not another `g`).
fn base_name(demangled: &str) -> Option<&str> {
    if demangled.contains("[clone ") {
        return None;
    }
    let open = demangled.find('(')?;
    (open > 0).then(|| &demangled[..open])
}

/// The program's entry point (AT_ENTRY of /proc/PID/auxv): where it starts once ld.so has
/// mapped the libraries it links, whether or not the file has a `_start` symbol.
pub fn entry_point(pid: u32) -> Option<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    auxv.chunks_exact(16).find_map(|kv| {
        let k = u64::from_ne_bytes(kv[..8].try_into().ok()?);
        let v = u64::from_ne_bytes(kv[8..].try_into().ok()?);
        (k == libc::AT_ENTRY).then_some(v)
    })
}

/// The function that starts exactly at runtime address `addr`, if any.
pub fn function_at(pid: u32, addr: u64) -> std::io::Result<Option<FunctionAddress>> {
    if let Some(f) = scan(pid, |_, _, a| a == addr)?.into_iter().next() {
        return Ok(Some(f));
    }
    // A stripped file's function, named by its separate debug file: only the debug file of
    // the file that maps `addr` is read.
    let holder = superprof_unwind::maps::executable_mappings(pid)?
        .into_iter()
        .find(|m| (m.start..m.end).contains(&addr))
        .map(|m| m.path);
    let Some(holder) = holder else {
        return Ok(None);
    };
    Ok(scan_tables(pid, &|_, _, a| a == addr, true, Some(&holder))?
        .into_iter()
        .next())
}

/// The function symbol of ELF file `path` (or of its separate debug file) whose range holds
/// ELF address `addr`: its raw name, as the symbol table has it (a compiler's clone keeps its
/// suffix: `float_repr.lto_priv.0`, which a profile names `float_repr`), its address and size.
pub fn symbol_containing(path: &Path, addr: u64) -> Option<(String, u64, u64)> {
    let data = crate::map_file(path).ok()?;
    let obj = object::File::parse(&*data).ok()?;
    let debug = crate::find_debug_file(path).and_then(|p| crate::map_file(&p).ok());
    let debug_obj = debug.as_deref().and_then(|d| object::File::parse(d).ok());
    crate::elf_functions(&obj)
        .chain(debug_obj.iter().flat_map(crate::elf_functions))
        .filter(|f| f.size > 0 && (f.addr..f.addr.saturating_add(f.size)).contains(&addr))
        // (The narrowest: an alias spanning more is not this function.)
        .min_by_key(|f| f.size)
        .map(|f| (f.name.to_owned(), f.addr, f.size))
}

/// Functions for a user's region name: the exact matches in any file if there are any, else
/// the functions of the program itself (not its libraries) whose demangled name contains
/// `pattern`.
pub fn find_functions_matching(pid: u32, pattern: &str) -> std::io::Result<Vec<FunctionAddress>> {
    let exact = find_function(pid, pattern)?;
    if !exact.is_empty() {
        return Ok(exact);
    }
    // A local function that only a separate debug file names (libc6-dbg's __strlen_avx2),
    // looked for once the libraries are mapped and none of their own tables has the name
    // (at exec, ld.so's debug file would give its private copy of strchr for `strchr`).
    let in_debug_files = scan_tables(pid, &|raw, _, _| raw == pattern, true, None)?;
    if !in_debug_files.is_empty() {
        return Ok(in_debug_files);
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    Ok(scan(pid, |_, demangled, _| demangled().contains(pattern))?
        .into_iter()
        .filter(|f| Some(&f.module) == exe.as_ref())
        .collect())
}

/// Every function name of the process, for suggestions.
pub fn function_names(pid: u32) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = scan(pid, |_, _, _| true)?
        .into_iter()
        .map(|f| f.name)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// A file a process maps with execute permission: where, and how superprof can open it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    /// The path as the process names it.
    pub path: PathBuf,
    /// Where superprof reads it (through /proc/PID/root when that differs).
    pub open_path: PathBuf,
    /// Load bias: runtime address minus ELF virtual address.
    pub bias: u64,
}

/// The executable files of a process (its program and libraries), each once.
pub fn mapped_files(pid: u32) -> std::io::Result<Vec<MappedFile>> {
    // One executable mapping per file is enough to place it.
    let mut files: BTreeMap<PathBuf, (u64, u64, u64)> = BTreeMap::new();
    for m in superprof_unwind::maps::executable_mappings(pid)? {
        if m.path.is_absolute() {
            files
                .entry(m.path)
                .or_insert((m.start, m.end - m.start, m.offset));
        }
    }
    let mut out = Vec::new();
    for (path, (start, len, pgoff)) in files {
        let via_root = Path::new("/proc")
            .join(pid.to_string())
            .join("root")
            .join(path.strip_prefix("/").unwrap_or(&path));
        let open_path = if via_root.exists() {
            via_root
        } else if path.exists() {
            path.clone()
        } else {
            // Deleted since it was mapped (the maps line says "PATH (deleted)"), or out of
            // reach by name: the very file the process maps, through its map_files link.
            Path::new("/proc")
                .join(pid.to_string())
                .join("map_files")
                .join(format!("{start:x}-{:x}", start + len))
        };
        let Some(image) = ElfImage::open(&open_path) else {
            continue;
        };
        out.push(MappedFile {
            bias: image.bias_for_mapping(start, len, pgoff),
            path,
            open_path,
        });
    }
    Ok(out)
}

/// The function symbols of every file `pid` maps for which `want(raw name, demangled name,
/// runtime address)` holds. The demangled name is made only when `want` asks for it (a C++
/// program has a hundred thousand symbols: demangling them all for a lookup by address cost
/// seconds with node mapped).
fn scan(
    pid: u32,
    want: impl Fn(&str, &dyn Fn() -> String, u64) -> bool,
) -> std::io::Result<Vec<FunctionAddress>> {
    scan_tables(pid, &want, false, None)
}

fn scan_tables(
    pid: u32,
    want: &impl Fn(&str, &dyn Fn() -> String, u64) -> bool,
    debug_files: bool,
    only: Option<&Path>,
) -> std::io::Result<Vec<FunctionAddress>> {
    let mut found = Vec::new();
    for file in mapped_files(pid)? {
        if only.is_some_and(|o| o != file.path) {
            continue;
        }
        // Mapped, not read: a program built with debug info is mostly DWARF this never
        // touches (superprof's own is 126 MB; reading it took 1.5 s a lookup).
        let Ok(data) = crate::map_file(&file.open_path) else {
            continue;
        };
        let Ok(obj) = object::File::parse(&*data) else {
            continue;
        };
        // A stripped file's local functions are in its separate debug file (libc6-dbg's
        // __strlen_avx2, behind strlen's ifunc), at the same addresses.
        let debug = debug_files
            .then(|| crate::find_debug_file(&file.open_path))
            .flatten()
            .and_then(|p| crate::map_file(&p).ok());
        let debug_obj = debug.as_deref().and_then(|d| object::File::parse(d).ok());
        let syms =
            crate::elf_functions(&obj).chain(debug_obj.iter().flat_map(crate::elf_functions));
        for sym in syms {
            let raw = sym.name;
            let addr = sym.addr.wrapping_add(file.bias);
            let demangled = || crate::demangle(raw);
            if want(raw, &demangled, addr) {
                let f = FunctionAddress {
                    name: demangled(),
                    module: file.path.clone(),
                    addr,
                    size: sym.size,
                    ifunc: sym.ifunc,
                };
                if !found.contains(&f) {
                    found.push(f);
                }
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod base_name_tests {
    #[test]
    fn a_cxx_name_without_its_parameters() {
        assert_eq!(super::base_name("f(int)"), Some("f"));
        assert_eq!(
            super::base_name("ns::C::g(int, char const*) const"),
            Some("ns::C::g")
        );
        assert_eq!(super::base_name("g(int) [clone .cold]"), None);
        assert_eq!(super::base_name("malloc"), None);
        assert_eq!(super::base_name("(anonymous)"), None);
    }
}
