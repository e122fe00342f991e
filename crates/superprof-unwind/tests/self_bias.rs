//! Load bias and module lookup on this very test binary, checked against its symbol table.

use std::path::Path;

use object::{Object, ObjectSymbol};
use superprof_unwind::{ElfCache, ProcessModules};

#[inline(never)]
pub fn bias_marker_function() -> u64 {
    std::hint::black_box(42)
}

#[test]
fn bias_of_own_executable_matches_symbol_table() {
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mut elves = ElfCache::default();
    let mut process = ProcessModules::default();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || Path::new(f[5]) != exe {
            continue;
        }
        let (a, b) = f[0].split_once('-').unwrap();
        let a = u64::from_str_radix(a, 16).unwrap();
        let b = u64::from_str_radix(b, 16).unwrap();
        let off = u64::from_str_radix(f[2], 16).unwrap();
        process.add_mapping(&mut elves, a, b - a, off, &exe);
    }
    let avma = bias_marker_function as *const () as u64;
    let m = process
        .lookup(avma)
        .expect("the function lies in a known mapping");
    let svma = avma - m.bias;
    let data = std::fs::read(&exe).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let sym = obj
        .symbols()
        .find(|s| s.name().is_ok_and(|n| n.contains("bias_marker_function")))
        .expect("symbol present");
    assert_eq!(svma, sym.address(), "bias {:#x}", m.bias);
    assert!(process.lookup(0x10).is_none());
}
