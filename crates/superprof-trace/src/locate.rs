//! "Address of function F in this process": the ELF symbol tables of the files a process maps,
//! with each file's load bias (PIE executables and shared libraries included).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSymbol};
use superprof_unwind::ElfImage;

/// A function found in a running process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionAddress {
    /// The symbol's name, demangled.
    pub name: String,
    pub module: PathBuf,
    /// Runtime address of the function's entry.
    pub addr: u64,
    /// Its size in bytes (0 when the symbol table does not say).
    pub size: u64,
}

/// The functions of process `pid` named `name` (the exact symbol name, or its demangled form),
/// in every executable file it maps.
pub fn find_function(pid: u32, name: &str) -> std::io::Result<Vec<FunctionAddress>> {
    scan(pid, |raw, demangled| raw == name || demangled == name)
}

/// Functions for a user's region name: the exact matches if there are any, else those whose
/// demangled name contains `pattern`.
pub fn find_functions_matching(pid: u32, pattern: &str) -> std::io::Result<Vec<FunctionAddress>> {
    let exact = find_function(pid, pattern)?;
    if !exact.is_empty() {
        return Ok(exact);
    }
    scan(pid, |_, demangled| demangled.contains(pattern))
}

/// Every function name of the process, for suggestions.
pub fn function_names(pid: u32) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = scan(pid, |_, _| true)?
        .into_iter()
        .map(|f| f.name)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

fn scan(pid: u32, want: impl Fn(&str, &str) -> bool) -> std::io::Result<Vec<FunctionAddress>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    // One executable mapping per file is enough to place it.
    let mut files: BTreeMap<PathBuf, (u64, u64, u64)> = BTreeMap::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with('/') {
            continue;
        }
        let Some((a, b)) = f[0].split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b), Ok(off)) = (
            u64::from_str_radix(a, 16),
            u64::from_str_radix(b, 16),
            u64::from_str_radix(f[2], 16),
        ) else {
            continue;
        };
        files.entry(PathBuf::from(f[5])).or_insert((a, b - a, off));
    }
    let mut found = Vec::new();
    for (path, (start, len, pgoff)) in files {
        let open = Path::new("/proc")
            .join(pid.to_string())
            .join("root")
            .join(path.strip_prefix("/").unwrap_or(&path));
        let open = if open.exists() { open } else { path.clone() };
        let Some(image) = ElfImage::open(&open) else {
            continue;
        };
        let bias = image.bias_for_mapping(start, len, pgoff);
        let Ok(data) = std::fs::read(&open) else {
            continue;
        };
        let Ok(obj) = object::File::parse(&*data) else {
            continue;
        };
        for sym in obj.symbols().chain(obj.dynamic_symbols()) {
            if sym.kind() != object::SymbolKind::Text || sym.address() == 0 {
                continue;
            }
            let Ok(raw) = sym.name() else { continue };
            let demangled = superprof_symbols::demangle(raw);
            if want(raw, &demangled) {
                let f = FunctionAddress {
                    name: demangled,
                    module: path.clone(),
                    addr: sym.address().wrapping_add(bias),
                    size: sym.size(),
                };
                if !found.contains(&f) {
                    found.push(f);
                }
            }
        }
    }
    Ok(found)
}
