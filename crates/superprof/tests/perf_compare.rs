//! The same fixture under `perf record --call-graph dwarf` and under superprof: whole call
//! stacks (caller chains from `perf script`, from `main` to the leaf) agree, each stack's share
//! within 4σ of the difference of two binomial shares; and superprof completes as many stacks
//! as perf does. On split.c (main calling three functions) and on recurse.c (30 frames of
//! recursion built without frame pointers: only CFI unwinds it).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::process::Command;

/// Stacks from `main` to the leaf (root first, `;`-joined) and their sample counts; a stack
/// that does not reach main counts as "(incomplete)".
type Stacks = BTreeMap<String, u64>;

fn from_main(frames: &[String]) -> String {
    match frames.iter().position(|f| f == "main") {
        Some(i) => frames[i..].join(";"),
        None => "(incomplete)".to_owned(),
    }
}

/// perf script's samples of `comm`, folded: each sample a header line, then its frames leaf
/// first ("ADDR SYMBOL" or "ADDR SYMBOL (inlined)"), then a blank line.
fn perf_stacks(data: &std::path::Path, comm: &str) -> Stacks {
    let out = run_ok(
        Command::new("perf")
            .arg("script")
            .arg("-i")
            .arg(data)
            .args(["-F", "comm,tid,ip,sym"]),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut stacks = Stacks::new();
    for block in text.split("\n\n") {
        let mut lines = block.lines().filter(|l| !l.trim().is_empty());
        let Some(head) = lines.next() else { continue };
        if head.split_whitespace().next() != Some(comm) {
            continue;
        }
        let mut frames: Vec<String> = lines
            .filter_map(|l| {
                let sym = l.trim().split_once(' ')?.1;
                Some(sym.trim_end_matches(" (inlined)").to_owned())
            })
            .collect();
        frames.reverse();
        *stacks.entry(from_main(&frames)).or_default() += 1;
    }
    stacks
}

/// superprof's folded output, cut the same way (its first frame is the thread's name).
fn our_stacks(folded: &Folded) -> Stacks {
    let mut stacks = Stacks::new();
    for (frames, n) in &folded.0 {
        *stacks.entry(from_main(&frames[1..])).or_default() += n;
    }
    stacks
}

/// Every stack that holds 2% of either profile has the same share in both, within 4σ of
/// the difference of two independent binomial shares; returns the shares of stacks reaching
/// main.
fn assert_same_stacks(what: &str, perf: &Stacks, ours: &Stacks) {
    let (np, no) = (
        perf.values().sum::<u64>() as f64,
        ours.values().sum::<u64>() as f64,
    );
    assert!(np > 300.0 && no > 300.0, "{what}: {np} and {no} samples");
    let share = |s: &Stacks, k: &str, n: f64| *s.get(k).unwrap_or(&0) as f64 / n;
    let keys: std::collections::BTreeSet<&String> = perf.keys().chain(ours.keys()).collect();
    for k in keys {
        let (a, b) = (share(perf, k, np), share(ours, k, no));
        if a < 0.02 && b < 0.02 {
            continue;
        }
        let p = (a * np + b * no) / (np + no);
        let sigma = (p * (1.0 - p) * (1.0 / np + 1.0 / no)).sqrt();
        assert!(
            (a - b).abs() <= 4.0 * sigma + 0.005,
            "{what}: stack {k}: perf {:.2}% of {np}, superprof {:.2}% of {no} (4σ {:.2} points)",
            a * 100.0,
            b * 100.0,
            400.0 * sigma
        );
    }
    // As many stacks reach main in superprof as in perf (within the same 4σ).
    let (a, b) = (
        1.0 - share(perf, "(incomplete)", np),
        1.0 - share(ours, "(incomplete)", no),
    );
    let p = (a * np + b * no) / (np + no);
    let sigma = (p * (1.0 - p) * (1.0 / np + 1.0 / no)).sqrt();
    assert!(
        b >= a - 4.0 * sigma - 0.005,
        "{what}: {:.1}% of superprof's stacks reach main, perf's {:.1}%",
        b * 100.0,
        a * 100.0
    );
}

fn compare(dir: &TempDir, exe: &std::path::Path, arg: &str, comm: &str) {
    let data = dir.path(&format!("{comm}.data"));
    run_ok(
        Command::new("perf")
            .args(["record", "-q", "-F", "999", "--call-graph", "dwarf", "-o"])
            .arg(&data)
            .arg("--")
            .arg(exe)
            .arg(arg),
    );
    let perf = perf_stacks(&data, comm);
    let folded = dir.path(&format!("{comm}.folded"));
    run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&folded)
            .arg("--")
            .arg(exe)
            .arg(arg),
    );
    let ours = our_stacks(&Folded::read(&folded));
    assert_same_stacks(comm, &perf, &ours);
}

#[test]
fn whole_stacks_agree_with_perf_record_call_graph_dwarf() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("perf");
    let split = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    compare(&dir, &split, "2", "split");
    let recurse = compile(
        &dir,
        "recurse",
        &["recurse.c"],
        &["-O2", "-g", "-fomit-frame-pointer"],
    );
    compare(&dir, &recurse, "1.5", "recurse");
}
