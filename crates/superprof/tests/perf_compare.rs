//! The same fixture under `perf record --call-graph dwarf` and under superprof: the self shares
//! of the top functions agree within 5 points.

mod common;

use common::*;
use std::process::Command;

/// Self share per symbol from `perf report --no-children`.
fn perf_self_shares(data: &std::path::Path) -> std::collections::BTreeMap<String, f64> {
    let out = run_ok(
        Command::new("perf")
            .arg("report")
            .arg("-i")
            .arg(data)
            .args([
                "--no-children",
                "--sort",
                "symbol",
                "--stdio",
                "-q",
                "-g",
                "none",
            ]),
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let pct: f64 = w.next()?.strip_suffix('%')?.parse().ok()?;
            let _kind = w.next()?;
            Some((w.next()?.to_owned(), pct / 100.0))
        })
        .collect()
}

#[test]
fn shares_agree_with_perf_record_call_graph_dwarf() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("perf");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let data = dir.path("perf.data");
    run_ok(
        Command::new("perf")
            .args(["record", "-q", "-F", "999", "--call-graph", "dwarf", "-o"])
            .arg(&data)
            .arg("--")
            .arg(&exe)
            .arg("2"),
    );
    let perf = perf_self_shares(&data);
    let folded = dir.path("s.folded");
    run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&folded)
            .arg("--")
            .arg(&exe)
            .arg("2"),
    );
    let ours = Folded::read(&folded);
    for f in ["work_alpha", "work_beta", "work_gamma"] {
        let p = *perf
            .get(f)
            .unwrap_or_else(|| panic!("perf has no {f}: {perf:?}"));
        assert!(p > 0.1, "{f} at {p} in perf");
        assert_close(&format!("{f} (vs perf)"), ours.share_leaf(f), p, 5.0);
    }
}
