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

/// A launched command's cgroup sampled into rings mapped ahead (`RingsAhead`, root): every
/// ring is one of them, and the samples that reach them are the command's, as many as its
/// CPU time gives.
#[test]
fn a_cgroup_is_sampled_into_rings_mapped_ahead() {
    use superprof_sample::{Cgroup, RingsAhead};
    superprof_testkit::require_root("cgroups and per-CPU events");
    let cfg = SamplerConfig {
        frequency: 999,
        stack_size: 8192,
        ..SamplerConfig::default()
    };
    let ahead = RingsAhead::start(&cfg).expect("root maps rings ahead");
    let cg = Cgroup::create().expect("a cgroup v2 of our own");
    let mut child = std::process::Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .unwrap();
    let pid = child.id();
    cg.add(pid).unwrap();
    let ticks = |pid: u32| -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = after.split_whitespace().collect();
        (f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()) as f64
    };
    let mut sampler = PerfSampler::open_cgroup(&cg.fd, pid, &cfg, Some(ahead)).unwrap();
    assert!(
        sampler.rings_mapped_ahead(),
        "a ring was mapped by its event"
    );
    let t0 = ticks(pid);
    sampler.enable().unwrap();
    std::thread::sleep(Duration::from_millis(600));
    sampler.disable();
    let hz = clock_ticks_per_second();
    let cpu = (ticks(pid) - t0) / hz;
    let mut buf = Vec::new();
    sampler.drain(&mut buf);
    let _ = child.kill();
    let _ = child.wait();
    let mut samples = 0;
    for (ty, misc, body) in split_records(&buf) {
        if let Some(Record::Sample(s)) = parse_record(ty, misc, body, sampler.layout()) {
            assert_eq!(s.pid, pid, "a sample of another process than the cgroup's");
            samples += 1;
        }
    }
    // (The CPU time is counted in clock ticks: up to one tick more or less at each end.)
    superprof_testkit::assert_sample_count(
        "cgroup, rings ahead",
        samples,
        cpu,
        999.0,
        superprof_testkit::perf_cpu_clock_rate(999),
    );
    drop(sampler);
    drop(cg);
}

/// Clock ticks per second (USER_HZ), as /proc/PID/stat counts CPU time.
fn clock_ticks_per_second() -> f64 {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}
