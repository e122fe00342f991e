//! The sampler on a real process: this test process samples itself through the kernel.

use std::hint::black_box;
use std::time::{Duration, Instant};

use superprof_sample::{
    list_threads, parse_record, split_records, PerfSampler, Record, SamplerConfig, TargetMode,
};
use superprof_testkit::thread_cpu;

#[test]
fn samples_this_process_with_registers_and_stack() {
    let pid = std::process::id();
    let cfg = SamplerConfig {
        frequency: 999,
        stack_size: 8192,
        ..SamplerConfig::default()
    };
    let mut sampler = PerfSampler::open(pid, TargetMode::Attached, &cfg).expect("perf_event_open");
    sampler.enable().unwrap();
    // 400 ms of this thread's CPU time (cpu-clock counts CPU time, not a wall-clock window:
    // a thread descheduled meanwhile would make a wall window mean nothing).
    let cpu_start = thread_cpu();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut x = 1u64;
    while thread_cpu() - cpu_start < Duration::from_millis(400) && Instant::now() < deadline {
        for i in 0..10_000u64 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    sampler.disable();
    let cpu = (thread_cpu() - cpu_start).as_secs_f64();
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
            // Every sample of this user thread has its user registers and stack.
            let regs = s.regs.expect("a sample without user registers");
            assert!(regs.sp != 0 && regs.pc != 0);
            assert!(!s.stack.is_empty() && s.stack.len() <= 8192);
            samples += 1;
        }
    }
    // At the rate perf delivers on this machine now (within 25% below, 15% above), never
    // more than asked.
    superprof_testkit::assert_sample_count(
        "self",
        samples,
        cpu,
        999.0,
        superprof_testkit::perf_cpu_clock_rate(999),
    );
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
