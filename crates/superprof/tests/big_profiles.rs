//! Memory follows distinct stacks, not samples (issue 31, item 12): `report` turns a profile of
//! a million samples into every format in about the memory it needs for 20 thousand.

#![allow(clippy::disallowed_macros)] // a test's own diagnostics

mod common;

use common::*;
use std::path::Path;
use std::process::Stdio;

use superprof_profile::Profile;

/// A profile of `n` samples over 4 threads and 400 stacks of 24 frames; a thread stays in one
/// stack for 40 samples in a row, as a thread sampled at a high rate does.
fn profile(n: u64) -> Profile {
    let mut p = Profile::default();
    p.meta.frequency = 10_000;
    p.meta.command = vec!["big".into()];
    let threads: Vec<u32> = (0..4)
        .map(|t| p.add_thread(100, 100 + t, "worker"))
        .collect();
    let stacks: Vec<_> = (0..400u64)
        .map(|s| {
            let mut id = None;
            for d in 0..24u64 {
                let name = format!("fn_{}_{}", d, (s >> (d % 8)) % 7);
                let f = p.intern_frame_named(
                    &name,
                    "/bin/big",
                    Some("big.c"),
                    d as u32 + 1,
                    0x1000 + d,
                    false,
                );
                id = Some(p.intern_stack(id, f));
            }
            id
        })
        .collect();
    for i in 0..n {
        let run = i / 40;
        let stack = stacks[(run * 7919 % 400) as usize];
        p.add_sample(i * 100_000, threads[(run % 4) as usize], 0, 1, stack);
    }
    p
}

/// Peak resident memory (VmHWM, KiB) of `superprof report IN ARGS`, read until it exits (not
/// wait4's rusage: that counts this test's own memory, shared at the fork).
fn report_peak_kib(input: &Path, args: &[&str]) -> u64 {
    let mut child = superprof()
        .arg("report")
        .arg(input)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    // A zombie has no VmHWM: the last reading before the exit is the peak so far, which
    // misses at most the last few milliseconds.
    while child.try_wait().unwrap().is_none() {
        if let Some(kib) = std::fs::read_to_string(&status).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        }) {
            peak = kib;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(child.wait().unwrap().success(), "report {args:?} failed");
    peak
}

#[test]
fn report_memory_follows_stacks_not_samples() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("big");
    let small = dir.path("small.parquet");
    let large = dir.path("large.parquet");
    for (path, n) in [(&small, 20_000), (&large, 1_000_000)] {
        let f = std::fs::File::create(path).unwrap();
        superprof_profile::parquet::write(&profile(n), std::io::BufWriter::new(f)).unwrap();
    }
    for out in ["x.parquet", "x.html", "x.pb.gz", "x.folded", "-"] {
        let args: Vec<String> = if out == "-" {
            vec![] // the top table on stdout
        } else {
            vec!["-o".into(), dir.path(out).display().to_string()]
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let s = report_peak_kib(&small, &args);
        let l = report_peak_kib(&large, &args);
        eprintln!("report {out}: {s} KiB for 20,000 samples, {l} KiB for 1,000,000");
        // 50x the samples; the samples in memory are capped (spill::DEFAULT_CAP, 8 MiB),
        // the Parquet reader and writer work a batch at a time, and html holds 16 bytes per
        // change of stack (25,000 here).
        assert!(
            l < s + 96 * 1024,
            "report {out}: {s} KiB for 20,000 samples, {l} KiB for 1,000,000"
        );
    }
}
