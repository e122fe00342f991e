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
    split_debug(&exe, &debug);
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
    // (On stderr: the program's output owns stdout.)
    let table = String::from_utf8_lossy(&out.stderr);
    let row = table
        .lines()
        .find(|l| l.contains(" work_alpha "))
        .unwrap_or_else(|| panic!("no work_alpha in\n{table}"));
    assert!(
        row.contains("split.c:"),
        "no file:line from the debug file: {row}"
    );
}

/// Code without a symbol is named per function (issue 14): the start of the FDE that covers
/// it, so every address of work_alpha shows as `split+0x<work_alpha's address>`, as nm of the
/// unstripped copy tells, with the fixture's own split of its time within 4σ.
#[test]
fn code_without_symbols_is_named_by_its_functions_start() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("stripped");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-no-pie", "-fno-pie"]);
    let nm = run_ok(Command::new("nm").arg(&exe));
    let starts: std::collections::HashMap<String, String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut p = l.split_whitespace();
            let (addr, _, name) = (p.next()?, p.next()?, p.next()?);
            name.starts_with("work_").then(|| {
                let a = u64::from_str_radix(addr, 16).unwrap();
                (format!("split+{a:#x}"), name.to_owned())
            })
        })
        .collect();
    assert_eq!(starts.len(), 3, "{starts:?}");
    run_ok(Command::new("strip").arg("--strip-all").arg(&exe));
    let (out, f) = record_folded(&dir, &[exe.as_ref(), "0.8".as_ref()]);
    let own = fixture_values(&String::from_utf8_lossy(&out.stdout));
    // Each sample's innermost frame in the program.
    let mut by_fn: std::collections::HashMap<String, u64> = Default::default();
    let mut in_split = 0;
    for (stack, n) in &f.0 {
        if let Some(fr) = stack.iter().rev().find(|x| x.starts_with("split+0x")) {
            in_split += n;
            *by_fn.entry(fr.clone()).or_default() += n;
        }
    }
    // Nothing is dropped, and one name per function: no per-address confetti.
    assert!(
        in_split as f64 > 0.9 * f.total() as f64,
        "{in_split} of {} samples in split+0x...: {by_fn:?}",
        f.total()
    );
    assert!(by_fn.len() <= 6, "{by_fn:?}");
    let total: u64 = starts
        .keys()
        .map(|k| by_fn.get(k).copied().unwrap_or(0))
        .sum();
    assert!(total as f64 > 0.9 * in_split as f64, "{by_fn:?} {starts:?}");
    let sum: f64 = ["work_alpha", "work_beta", "work_gamma"]
        .iter()
        .map(|w| own[*w])
        .sum();
    for (name, func) in &starts {
        let want = own[func] / sum;
        let got = by_fn.get(name).copied().unwrap_or(0) as f64 / total as f64;
        let sigma = (want * (1.0 - want) / total as f64).sqrt();
        assert!(
            (got - want).abs() < 4.0 * sigma,
            "{func} ({name}): {got:.3}, the fixture says {want:.3}: {by_fn:?}"
        );
    }
}
