//! Issue 12, item 10: when the kernel's maximum sample rate is below the frequency asked for
//! (it lowers /proc/sys/kernel/perf_event_max_sample_rate by itself on a busy machine),
//! `record` throttles to it with a notice, as perf record does, and the profile says the rate
//! it sampled at. This file is a test binary of its own: it lowers a machine-wide setting for
//! a few seconds, and cargo runs test binaries one after another.
#![allow(clippy::disallowed_macros)] // a test's own diagnostics

mod common;

use common::*;
use std::process::Command;

const PATH: &str = "/proc/sys/kernel/perf_event_max_sample_rate";

/// Sets the kernel's maximum sample rate, putting the old value back on drop.
struct MaxRate(String);

impl MaxRate {
    fn set(hz: u32) -> Option<MaxRate> {
        let old = std::fs::read_to_string(PATH).ok()?;
        std::fs::write(PATH, hz.to_string()).ok()?;
        Some(MaxRate(old))
    }
}

impl Drop for MaxRate {
    fn drop(&mut self) {
        let _ = std::fs::write(PATH, self.0.trim());
    }
}

#[test]
fn a_lowered_kernel_maximum_throttles_like_perf() {
    let dir = TempDir::new("throttle");
    let exe = compile(&dir, "spin", &["attach.c"], &["-O2", "-g", "-pthread"]);
    // Spins 1.5 s in one thread (its late thread never starts).
    let spin = [exe.as_os_str(), "1.5".as_ref(), "1000".as_ref()];
    let max = 200;
    let _guard = MaxRate::set(max)
        .unwrap_or_else(|| panic!("cannot write {PATH}: this test needs root, as the suite runs"));
    let profile = dir.path("t.parquet");
    let out = superprof()
        .args(["record", "-F", "999", "-q", "-o"])
        .arg(&profile)
        .arg("--")
        .args(spin)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("sampling at 200 Hz") && stderr.contains("perf_event_max_sample_rate"),
        "{stderr}"
    );
    // perf on the same program, under the same maximum.
    let perf_data = dir.path("perf.data");
    let perf = Command::new("perf")
        .args(["record", "-F", "999", "-o"])
        .arg(&perf_data)
        .arg("--")
        .args(spin)
        .output()
        .unwrap();
    let perf_err = String::from_utf8_lossy(&perf.stderr);
    assert!(perf.status.success(), "{perf_err}");
    assert!(
        perf_err.contains("throttling"),
        "perf did not throttle: {perf_err}"
    );
    drop(_guard);
    // The profile says the rate it sampled at.
    let report = run_ok(superprof().arg("report").arg(&profile));
    let header = String::from_utf8_lossy(&report.stdout);
    assert!(header.contains("at 200 Hz"), "{header}");
    // Samples: at most what 200 Hz allows over 1.5 s of CPU time (4σ of a count), and as many
    // as perf took at the same rate (the difference of two counts, 4σ).
    let samples = |text: &str| -> f64 {
        text.split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no sample count in {text}"))
    };
    let ours = samples(&header);
    let script = Command::new("perf")
        .args(["script", "-F", "ip", "-i"])
        .arg(&perf_data)
        .output()
        .unwrap();
    let theirs = String::from_utf8_lossy(&script.stdout).lines().count() as f64;
    eprintln!("at {max} Hz: superprof {ours} samples, perf {theirs}");
    let allowed = max as f64 * 1.5;
    assert!(
        ours <= allowed + 4.0 * allowed.sqrt(),
        "{ours} samples in 1.5 s at {max} Hz"
    );
    assert!(
        (ours - theirs).abs() <= 4.0 * (ours + theirs).sqrt(),
        "superprof {ours} samples, perf {theirs}"
    );
}
