//! superprof-symbols: from a module and an address to function names, files and lines.
//!
//! ELF `.symtab` / `.dynsym` for names, DWARF through addr2line for inlined frames and
//! file:line, separate debug files found by build id (`/usr/lib/debug/.build-id/xx/yyyy.debug`)
//! or `.gnu_debuglink`, Rust and C++ demangling, and `/proc/kallsyms` for kernel addresses.
//! Each file is opened and parsed once; callers symbolize each distinct address once.
//!
//! - [`Symbolizer`]: the frames ([`SymFrame`]) of an ELF address of a module.
//! - [`SymbolService`]: a symbolizer on a thread of its own, loading modules while the target
//!   runs, and fetching missing debug files with [`Debuginfod`] where `DEBUGINFOD_URLS` is set.
//! - [`Kallsyms`]: kernel function names, from /proc/kallsyms or a System.map.
//! - [`PerfMap`] and [`JitDump`]: names (and, in a jitdump, lines and unwind tables) of JIT
//!   code, as runtimes write them for perf.
//!
//! ```no_run
//! use superprof_symbols::Symbolizer;
//! let mut symbolizer = Symbolizer::default();
//! for frame in symbolizer.symbolize("/usr/bin/true".as_ref(), "/usr/bin/true".as_ref(), 0x2040) {
//!     println!("{:?} {:?}:{:?}", frame.function, frame.file, frame.line);
//! }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod cfi;
pub use cfi::{function_ranges, landing_pads};
mod debugfile;
mod debuginfod;
mod functions;
mod jitdump;
mod kallsyms;
mod locate;
mod perfmap;
mod plt;
mod service;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use addr2line::Loader;

pub use debugfile::find as find_debug_file;
pub use debuginfod::Debuginfod;
pub use functions::{elf_functions, ElfFunction};
pub use jitdump::{is_jitdump, JitDump, JitUnwind, JitUnwindReader};
pub use kallsyms::Kallsyms;
pub use locate::{
    entry_point, find_function, find_functions_matching, function_at, function_names, mapped_files,
    symbol_containing, FunctionAddress, MappedFile,
};
pub use perfmap::PerfMap;
pub use service::{Answer, Query, SymbolService};
pub use superprof_unwind::map_file;

/// The address to look up for a frame at `addr`: the address itself for the sampled
/// instruction (the leaf), the byte before it for a return address (a caller's frame), which
/// points after its call: the call itself is what the caller was doing, and the next
/// instruction may be another line, another inlined function or, after a call that does not
/// return, another function altogether. The one place this rule lives (record, libsuperprof
/// and qemu name frames through it).
///
/// ```
/// assert_eq!(superprof_symbols::lookup_address(0x1005, true), 0x1004);
/// assert_eq!(superprof_symbols::lookup_address(0x1005, false), 0x1005);
/// ```
pub fn lookup_address(addr: u64, is_return_address: bool) -> u64 {
    if is_return_address {
        addr.wrapping_sub(1)
    } else {
        addr
    }
}

/// Where an inlined copy was made: the calling function and the call's file, line and column.
type CallSite = (Option<String>, Option<String>, Option<u32>, Option<u32>);

/// One source-level frame. An address gives one or more, outermost first (as
/// [`Symbolizer::symbolize`] returns them): the function that contains the address, then each
/// call inlined into it, the innermost last.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SymFrame {
    /// The function's name, demangled; None where neither DWARF, the symbol table nor the
    /// CFI names it.
    pub function: Option<String>,
    /// The source file of `line`, as DWARF gives it (the path the compiler saw); None without
    /// line information.
    pub file: Option<String>,
    /// The source line in this function: for the innermost frame the address's own, for
    /// each outer one the line of the call into the frame inside it.
    pub line: Option<u32>,
    /// This frame was inlined into the one before it in the list (its caller, one level out);
    /// false for the first (outermost) frame.
    pub inlined: bool,
}

struct ModuleSymbols {
    code: Loader,
    /// A separate debug file, when the code file has no DWARF of its own.
    debug: Option<Loader>,
    /// Where the code file is read (for its CFI).
    open_path: PathBuf,
    /// The functions its FDEs cover, read at the first address without a symbol.
    functions: Option<Vec<(u64, u64)>>,
    /// Its PLT entries (`malloc@plt`), read at the first address without a symbol.
    plt: Option<Vec<(u64, u64, String)>>,
}

/// `module+0xADDR`: the name of code without a symbol (the file name of `module`, and the
/// function's start where the CFI tells it, else the address itself). Every part of superprof
/// names such code this way.
pub fn address_name(module: &str, addr: u64) -> String {
    let base = module.rsplit('/').next().unwrap_or(module);
    format!("{base}+{addr:#x}")
}

/// Symbolizes addresses of many modules, parsing each module once.
#[derive(Default)]
pub struct Symbolizer {
    modules: HashMap<PathBuf, Option<ModuleSymbols>>,
}

impl Symbolizer {
    /// Opens and parses a module's symbols now rather than at its first lookup.
    pub fn preload(&mut self, path: &Path, open_path: &Path) {
        if let Some(m) = self
            .modules
            .entry(path.to_owned())
            .or_insert_with(|| load_module(open_path))
        {
            // A first lookup makes addr2line parse its unit index and line programs' headers.
            let _ = m.debug.as_ref().map(|d| d.find_location(0));
            let _ = m.code.find_location(0);
        }
    }

    /// The code of source lines `lines` of a file whose path ends with `file`, in the module
    /// known as `path`: (ELF virtual address, length) of each line-table row, sorted.
    pub fn line_rows(
        &mut self,
        path: &Path,
        open_path: &Path,
        file: &str,
        lines: std::ops::RangeInclusive<u32>,
    ) -> Vec<(u64, u64)> {
        let entry = self
            .modules
            .entry(path.to_owned())
            .or_insert_with(|| load_module(open_path));
        let Some(m) = entry else {
            return Vec::new();
        };
        let loader = m.debug.as_ref().unwrap_or(&m.code);
        let mut rows = Vec::new();
        if let Ok(iter) = loader.find_location_range(0, u64::MAX) {
            for (addr, len, loc) in iter {
                let same_file = loc.file.is_some_and(|f| {
                    f == file || f.ends_with(&format!("/{}", file.trim_start_matches("./")))
                });
                if same_file && loc.line.is_some_and(|l| lines.contains(&l)) {
                    rows.push((addr, len));
                }
            }
        }
        rows.sort_unstable();
        rows
    }

    /// Where copies of function `name` were inlined in the module known as `path`: one
    /// [start, end) ELF virtual address range per inlined instance (per call site), from the
    /// lowest to the end of the highest code DWARF attributes to it.
    pub fn inlined_sites(&mut self, path: &Path, open_path: &Path, name: &str) -> Vec<(u64, u64)> {
        let entry = self
            .modules
            .entry(path.to_owned())
            .or_insert_with(|| load_module(open_path));
        let Some(m) = entry else {
            return Vec::new();
        };
        let loader = m.debug.as_ref().unwrap_or(&m.code);
        // Call site (caller, file, line, column) -> [min, max).
        let mut instances: HashMap<CallSite, (u64, u64)> = HashMap::new();
        let Ok(rows) = loader.find_location_range(0, u64::MAX) else {
            return Vec::new();
        };
        for (addr, len, _) in rows {
            let Ok(mut frames) = loader.find_frames(addr) else {
                continue;
            };
            // Innermost first: (function name, location) of each frame.
            let mut chain = Vec::new();
            while let Ok(Some(f)) = frames.next() {
                let fname = f
                    .function
                    .as_ref()
                    .and_then(|f| f.demangle().ok().map(|n| n.into_owned()));
                let loc = f
                    .location
                    .as_ref()
                    .map(|l| (l.file.map(str::to_owned), l.line, l.column));
                chain.push((fname, loc));
            }
            // An inlined frame of `name` (not the outermost); its caller's location is the call.
            let Some(k) = chain[..chain.len().saturating_sub(1)]
                .iter()
                .position(|(n, _)| n.as_deref() == Some(name))
            else {
                continue;
            };
            let (caller, call) = &chain[k + 1];
            let (file, line, column) = call.clone().unwrap_or((None, None, None));
            // Addresses and lengths come from the file: an end that would wrap is clamped.
            let end = addr.saturating_add(len);
            let e = instances
                .entry((caller.clone(), file, line, column))
                .or_insert((addr, end));
            e.0 = e.0.min(addr);
            e.1 = e.1.max(end);
        }
        let mut sites: Vec<(u64, u64)> = instances.into_values().collect();
        sites.sort_unstable();
        sites
    }

    /// Frames for the ELF virtual address `svma` of the module known as `path` (readable at
    /// `open_path`), outermost first: the function, then each inlined call inside it.
    /// Empty when nothing is known about the address.
    pub fn symbolize(&mut self, path: &Path, open_path: &Path, svma: u64) -> Vec<SymFrame> {
        let entry = self
            .modules
            .entry(path.to_owned())
            .or_insert_with(|| load_module(open_path));
        let Some(m) = entry else {
            return Vec::new();
        };
        let mut frames = m
            .debug
            .as_ref()
            .map(|d| dwarf_frames(d, svma))
            .unwrap_or_default();
        if frames.is_empty() {
            frames = dwarf_frames(&m.code, svma);
        }
        let symbol = m
            .code
            .find_symbol(svma)
            .or_else(|| m.debug.as_ref().and_then(|d| d.find_symbol(svma)))
            .map(demangle);
        // No symbol: a PLT entry is named by the function it goes to.
        let symbol = symbol.or_else(|| {
            let open = m.open_path.clone();
            let plt = m.plt.get_or_insert_with(|| {
                superprof_unwind::map_file(&open)
                    .ok()
                    .and_then(|d| object::File::parse(&*d).ok().map(|o| plt::plt_entries(&o)))
                    .unwrap_or_default()
            });
            plt::plt_name(plt, svma).map(str::to_owned)
        });
        // Else the function's start from the CFI names it.
        let symbol = symbol.or_else(|| {
            let open = m.open_path.clone();
            let ranges = m.functions.get_or_insert_with(|| {
                superprof_unwind::map_file(&open)
                    .map(|d| cfi::function_ranges(&d))
                    .unwrap_or_default()
            });
            cfi::function_start(ranges, svma)
                .map(|start| address_name(&path.to_string_lossy(), start))
        });
        match frames.last_mut() {
            Some(outer) if outer.function.is_none() => {
                outer.function = symbol;
            }
            // DWARF of line tables only names a function without its path (`crunch_numbers`):
            // the symbol table's name of the same function is whole.
            Some(outer) => {
                if let (Some(name), Some(sym)) = (&outer.function, &symbol) {
                    if qualifies(sym, name) {
                        outer.function = symbol;
                    }
                }
            }
            None => {
                if let Some(name) = symbol {
                    frames.push(SymFrame {
                        function: Some(name),
                        file: None,
                        line: None,
                        inlined: false,
                    });
                }
            }
        }
        frames.reverse();
        frames
    }
}

fn load_module(open_path: &Path) -> Option<ModuleSymbols> {
    let code = Loader::new(open_path).ok()?;
    let debug = if debugfile::has_dwarf(open_path) {
        None
    } else {
        debugfile::find(open_path).and_then(|p| Loader::new(p).ok())
    };
    Some(ModuleSymbols {
        code,
        debug,
        open_path: open_path.to_owned(),
        functions: None,
        plt: None,
    })
}

/// DWARF frames, innermost first.
fn dwarf_frames(loader: &Loader, svma: u64) -> Vec<SymFrame> {
    let mut out = Vec::new();
    let Ok(mut iter) = loader.find_frames(svma) else {
        return out;
    };
    while let Ok(Some(frame)) = iter.next() {
        let function = frame
            .function
            .as_ref()
            .and_then(|f| f.demangle().ok().map(|s| s.into_owned()));
        let (file, line) = frame
            .location
            .as_ref()
            .map_or((None, None), |l| (l.file.map(str::to_owned), l.line));
        out.push(SymFrame {
            function,
            file,
            line,
            inlined: true,
        });
    }
    if let Some(last) = out.last_mut() {
        last.inlined = false;
    }
    out
}

/// Whether `symbol` is `name` with its path (and, for C++, its argument list): the same
/// function named in full.
fn qualifies(symbol: &str, name: &str) -> bool {
    if symbol.len() <= name.len() || name.is_empty() {
        return false;
    }
    let Some(at) = symbol.rfind(&format!("::{name}")) else {
        return false;
    };
    let rest = &symbol[at + 2 + name.len()..];
    rest.is_empty() || rest.starts_with('(') || rest.starts_with('<')
}

/// Demangles a Rust or C++ symbol name; other names come back unchanged.
pub fn demangle(name: &str) -> String {
    addr2line::demangle_auto(name.into(), None).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_symbol_names_a_bare_dwarf_name_in_full() {
        use super::qualifies;
        assert!(qualifies(
            "superprof::demo::crunch_numbers",
            "crunch_numbers"
        ));
        assert!(qualifies("geometry::Mesh::relax(int)", "relax"));
        assert!(qualifies(
            "core::ptr::drop_in_place<u8>",
            "drop_in_place<u8>"
        ));
        assert!(!qualifies("a::crunch_numbers_fast", "crunch_numbers"));
        assert!(!qualifies("main", "main"));
        assert!(!qualifies("other::thing", "crunch_numbers"));
    }
}
