//! Symbolization of this very test binary (built with debug info by cargo's test profile) and
//! of the running kernel.

use superprof_symbols::{Kallsyms, Symbolizer};
use superprof_unwind::{ElfCache, ProcessModules};

#[inline(never)]
pub fn symbol_marker_function() -> (u64, u32) {
    (std::hint::black_box(7), line!())
}

fn own_modules() -> (ElfCache, ProcessModules) {
    let mut elves = ElfCache::default();
    let mut process = ProcessModules::default();
    let own = superprof_unwind::maps::executable_mappings(std::process::id()).unwrap();
    for m in own.iter().filter(|m| m.path.is_absolute()) {
        process.add_mapping(&mut elves, m.start, m.end - m.start, m.offset, &m.path);
    }
    (elves, process)
}

#[test]
fn own_function_has_name_file_and_line() {
    let (elves, process) = own_modules();
    let avma = symbol_marker_function as *const () as u64;
    let m = process.lookup(avma).unwrap();
    let path = elves.path(m.module);
    let frames = Symbolizer::default().symbolize(path, path, avma - m.bias);
    let outer = frames.first().expect("frames");
    assert!(
        outer
            .function
            .as_deref()
            .unwrap()
            .ends_with("symbol_marker_function"),
        "{frames:?}"
    );
    assert!(outer.file.as_deref().unwrap().ends_with("self_symbols.rs"));
    // The entry address belongs to the `fn` line, a line or two above line!().
    let line = outer.line.unwrap();
    let marker_line = symbol_marker_function().1;
    assert!(
        line <= marker_line && line + 3 >= marker_line,
        "line {line} vs {marker_line}"
    );
}

#[test]
fn libc_function_is_named() {
    let (elves, process) = own_modules();
    let avma = libc_getpid_address();
    let m = process.lookup(avma).unwrap();
    let path = elves.path(m.module);
    let frames = Symbolizer::default().symbolize(path, path, avma - m.bias);
    let name = frames
        .last()
        .and_then(|f| f.function.clone())
        .unwrap_or_default();
    assert!(name.contains("getpid"), "{frames:?}");
}

extern "C" {
    fn getpid() -> i32;
}

fn libc_getpid_address() -> u64 {
    getpid as *const () as u64
}

/// The test suite runs as root (scripts/test), where kallsyms shows its addresses: hidden
/// ones fail the test rather than pass it unchecked.
#[test]
fn kernel_symbols_resolve() {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let line = text
        .lines()
        .find(|l| l.ends_with(" do_syscall_64") && !l.starts_with("0000000000000000"))
        .expect(
            "kallsyms hides its addresses (not root, or kernel.kptr_restrict=2): \
             run the suite as root with kptr_restrict at most 1",
        );
    let addr = u64::from_str_radix(line.split_whitespace().next().unwrap(), 16).unwrap();
    let k = Kallsyms::parse(&text);
    assert_eq!(k.lookup(addr + 1), Some("do_syscall_64"));
}

#[test]
fn demangles_rust_and_cxx() {
    assert_eq!(
        superprof_symbols::demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
        "core::fmt::write"
    );
    assert_eq!(
        superprof_symbols::demangle("_ZN8geometry4Mesh5relaxEi"),
        "geometry::Mesh::relax(int)"
    );
    assert_eq!(superprof_symbols::demangle("plain_c"), "plain_c");
}
