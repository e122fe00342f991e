//! Symbolization cases on real binaries: C++ demangling, separate debug files found through
//! .gnu_debuglink, and code with no symbol at all.

mod common;

use common::*;
use std::process::Command;

#[test]
fn cxx_names_are_demangled() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("cxx");
    let exe = dir.path("cxx");
    run_ok(
        Command::new("g++")
            .args(["-O2", "-g", "-o"])
            .arg(&exe)
            .arg(fixtures_dir().join("cxx.cpp")),
    );
    let (_, f) = record_folded(&dir, &[exe.as_ref(), "1".as_ref()]);
    assert!(
        f.share_through("geometry::Mesh::relax(int)") > 0.8,
        "relax share {}",
        f.share_through("geometry::Mesh::relax(int)")
    );
    assert!(
        !f.0.iter()
            .any(|(s, _)| s.iter().any(|x| x.starts_with("_Z"))),
        "mangled names left"
    );
}

#[test]
fn debug_info_is_found_through_gnu_debuglink() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("debuglink");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let debug = dir.path("split.debug");
    run_ok(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&exe)
            .arg(&debug),
    );
    run_ok(Command::new("objcopy").arg("--strip-debug").arg(&exe));
    run_ok(
        Command::new("objcopy")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(&exe)
            .current_dir(&dir.0),
    );
    let out = run_ok(
        superprof()
            .args(["record", "--"])
            .arg(&exe)
            .arg("0.6")
            .current_dir(&dir.0),
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.contains(" work_alpha "))
        .unwrap_or_else(|| panic!("no work_alpha in\n{table}"));
    assert!(
        row.contains("split.c:"),
        "no file:line from the debug file: {row}"
    );
}

#[test]
fn code_without_symbols_shows_module_and_offset() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("stripped");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-no-pie", "-fno-pie"]);
    run_ok(Command::new("strip").arg("--strip-all").arg(&exe));
    let (_, f) = record_folded(&dir, &[exe.as_ref(), "0.6".as_ref()]);
    let named: u64 =
        f.0.iter()
            .filter(|(s, _)| s.iter().skip(1).any(|x| x.starts_with("split+0x")))
            .map(|(_, n)| n)
            .sum();
    // Nothing is dropped: the stripped code is counted under split+0xOFFSET.
    assert!(
        named as f64 > 0.9 * f.total() as f64,
        "{named} of {} samples in split+0x...",
        f.total()
    );
    assert!(f.total() > 400);
}
