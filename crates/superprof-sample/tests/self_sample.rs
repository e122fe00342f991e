//! The sampler on a real process: this test process samples itself through the kernel.

use std::hint::black_box;
use std::time::{Duration, Instant};

use superprof_sample::{
    list_threads, parse_record, split_records, PerfSampler, Record, SamplerConfig, TargetMode,
};

#[test]
fn samples_this_process_with_registers_and_stack() {
    let pid = std::process::id();
    let cfg = SamplerConfig {
        frequency: 999,
        stack_size: 8192,
        off_cpu: false,
    };
    let mut sampler = PerfSampler::open(pid, TargetMode::Attached, &cfg).expect("perf_event_open");
    sampler.enable().unwrap();
    let end = Instant::now() + Duration::from_millis(400);
    let mut x = 1u64;
    while Instant::now() < end {
        for i in 0..10_000u64 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    sampler.disable();
    let mut buf = Vec::new();
    sampler.drain(&mut buf);
    let tids = list_threads(pid).unwrap();
    let me = tids
        .iter()
        .copied()
        .collect::<std::collections::HashSet<_>>();
    let mut samples = 0;
    for (ty, misc, body) in split_records(&buf) {
        if let Some(Record::Sample(s)) = parse_record(ty, misc, body, sampler.layout()) {
            assert_eq!(s.pid, pid);
            assert!(me.contains(&s.tid), "sample from unknown thread {}", s.tid);
            if let Some(regs) = s.regs {
                assert!(regs.sp != 0 && regs.pc != 0);
                assert!(!s.stack.is_empty() && s.stack.len() <= 8192);
            }
            samples += 1;
        }
    }
    // 400 ms at 999 Hz: about 400 samples; scheduling noise allows a wide margin.
    assert!(samples > 200, "only {samples} samples");
    black_box(x);
}

#[test]
fn a_pid_that_does_not_exist_is_reported_as_such() {
    let err = PerfSampler::open(999_999_999, TargetMode::Attached, &SamplerConfig::default())
        .err()
        .expect("fails");
    assert!(err.to_string().contains("no process"), "{err}");
}

#[test]
fn online_cpus_are_listed() {
    let cpus = superprof_sample::online_cpus().unwrap();
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    assert!(cpus.len() >= n, "{cpus:?} vs {n}");
}
