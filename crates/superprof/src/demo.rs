//! `superprof demo`: profiles a workload with a known split and draws its flamegraph.
//!
//! The workload is this same binary (`superprof __demo-workload`), so the demo needs no input
//! and exercises the whole path: launch, sampling, DWARF unwinding, Rust symbols, SVG.

use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cli::DemoArgs;
use crate::record::{self, Record};
use superprof_record::Target;

pub fn run(args: &DemoArgs) -> Result<i32> {
    let exe = std::env::current_exe().context("cannot find the superprof binary")?;
    let target = Target::Command(vec![
        exe.into_os_string(),
        "__demo-workload".into(),
        "--seconds".into(),
        args.seconds.to_string().into(),
    ]);
    let run = Record {
        config: record::record_config(target, Default::default(), false),
        outputs: vec![args.output.clone()],
        quiet: false,
        verbose: false,
        // The workload (superprof's own) prints nothing: the demo's table is on stdout.
        console: Some(superprof_resolve::Console::Stdout),
        push: None,
        top_rows: 12,
        precise: None,
    };
    // Written with `?`: a closed stdout (`demo | head`) is a broken pipe, not a panic.
    let mut out = std::io::stdout();
    writeln!(
        out,
        "superprof demo: profiling a workload that spends 50% / 30% / 20% of its CPU time in"
    )?;
    writeln!(
        out,
        "crunch_numbers / hash_strings / walk_list for {} s ...\n",
        args.seconds
    )?;
    let outputs = run.check_outputs()?;
    let recorded = record::record(&run.config)?;
    run.show(&recorded, &outputs)?;
    // The three functions' total shares (inlined helpers included) against the workload's plan.
    let rows = superprof_profile::top::rows(&recorded.profile);
    let total = recorded.profile.total_weight().max(1) as f64;
    writeln!(out)?;
    for (name, planned) in [
        ("crunch_numbers", 50),
        ("hash_strings", 30),
        ("walk_list", 20),
    ] {
        let measured = rows
            .iter()
            .find(|r| r.function.ends_with(&format!("::{name}")))
            .map_or(0.0, |r| 100.0 * r.total_weight as f64 / total);
        writeln!(
            out,
            "  {name:<16} {measured:5.1}% of samples (planned {planned}%)"
        )?;
    }
    writeln!(
        out,
        "\nOpen {} in a browser for the interactive flamegraph.",
        args.output.display()
    )?;
    Ok(recorded.exit.map_or(0, |e| e.shell_code()))
}

/// Spends the given CPU time in three functions, 50 / 30 / 20.
pub fn workload(seconds: f64) {
    let slice = Duration::from_millis(10);
    let rounds = (seconds / slice.as_secs_f64()).max(1.0) as u32;
    for _ in 0..rounds {
        crunch_numbers(slice.mul_f64(0.5));
        hash_strings(slice.mul_f64(0.3));
        walk_list(slice.mul_f64(0.2));
    }
}

// Each hot function checks the clock only every few thousand steps, so its own loop (not the
// clock) is what the profile shows.
const STEPS: u32 = 4096;

#[inline(never)]
fn crunch_numbers(budget: Duration) {
    let end = crate::sys::thread_cpu_time() + budget;
    let mut x = 1.0f64;
    while crate::sys::thread_cpu_time() < end {
        for _ in 0..STEPS {
            x = (x * 1.000_001 + 0.5).sqrt();
        }
    }
    black_box(x);
}

#[inline(never)]
fn hash_strings(budget: Duration) {
    let end = crate::sys::thread_cpu_time() + budget;
    let text = black_box(b"superprof samples stacks");
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    while crate::sys::thread_cpu_time() < end {
        for _ in 0..STEPS / 16 {
            for b in text {
                h = (h ^ *b as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    black_box(h);
}

#[inline(never)]
fn walk_list(budget: Duration) {
    let end = crate::sys::thread_cpu_time() + budget;
    let next: Vec<usize> = (0..4096)
        .map(|i| (i * 2_654_435_761usize + 1) % 4096)
        .collect();
    let mut i = 0;
    while crate::sys::thread_cpu_time() < end {
        for _ in 0..STEPS {
            i = next[i];
        }
    }
    black_box(i);
}
