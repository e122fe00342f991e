//! The Rust API on a Rust workload: a guard that samples every thread between start and stop.

use std::time::{Duration, Instant};

mod common;

use common::{assert_share, burn};
use superprof::{Options, Profiler};

// (Work after the call keeps them out of tail calls: each has a frame of its own.)
#[inline(never)]
fn rust_heavy() -> u64 {
    std::hint::black_box(burn(Duration::from_millis(600))) + 1
}

#[inline(never)]
fn rust_light() -> u64 {
    std::hint::black_box(burn(Duration::from_millis(300))) + 1
}

#[test]
fn guard_samples_a_rust_program() {
    let _ = burn(Duration::from_millis(200)); // before start: not in the profile
    let p = Profiler::start(Options::default()).unwrap();
    // A second profiler while one runs is refused.
    assert!(matches!(
        Profiler::start(Options::default()),
        Err(superprof::Error::AlreadyRunning)
    ));
    let t = std::thread::Builder::new()
        .name("light".into())
        .spawn(rust_light)
        .unwrap();
    let a = rust_heavy();
    let b = t.join().unwrap();
    let started = Instant::now();
    let profile = p.stop().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    std::hint::black_box((a, b));
    // Two threads: 0.6 s of CPU time in this one, 0.3 s in the other (gone by now, so known by
    // its thread id).
    // (Shares of the periods the samples weigh; σ counts the samples.)
    let mut light = 0;
    let mut total = 0;
    let mut n = 0;
    for s in &profile.samples {
        total += s.weight;
        n += 1;
        // SAFETY: gettid has no arguments.
        let me = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        if profile.threads[s.thread as usize].tid != me {
            light += s.weight;
        }
        let leaf = s.stack.and_then(|st| profile.stack_frames(Some(st)).next());
        let name = leaf.map(|f| profile.str(profile.frame(f).function).to_owned());
        assert!(name.is_some(), "a sample without a frame");
    }
    assert!(n > 40, "{n} samples");
    let share = 1.0 - light as f64 / total as f64;
    // Each thread is sampled on its own CPU clock: the main thread's share is 2/3 within 4σ.
    let sigma = (2.0 / 9.0 / n as f64).sqrt();
    assert!(
        (share - 2.0 / 3.0).abs() < 4.0 * sigma,
        "light {light} of {total}"
    );
    // The leaf address's frames: inlined std functions inside burn, demangled.
    // Full stacks (from the CFI: Rust code has no frame pointers here): each function under
    // its caller.
    let through = |f: &str| -> u64 {
        profile
            .samples
            .iter()
            .filter(|s| {
                profile
                    .stack_frames(s.stack)
                    .any(|x| profile.str(profile.frame(x).function).ends_with(f))
            })
            .map(|s| s.weight)
            .sum()
    };
    let (heavy, light_fn) = (
        through("rust_api::rust_heavy"),
        through("rust_api::rust_light"),
    );
    assert!(
        heavy + light_fn >= total * 8 / 10,
        "heavy {heavy}, light {light_fn}, total {total}"
    );
    // (2/3 of the CPU time in rust_heavy, by the test's own thread clocks.)
    assert_share(
        "rust_heavy",
        heavy as f64 / (heavy + light_fn) as f64,
        2.0 / 3.0,
        (n as u64 * (heavy + light_fn) / total).max(1),
    );
    let burn = profile
        .samples
        .iter()
        .filter(|s| {
            profile.stack_frames(s.stack).any(|f| {
                profile
                    .str(profile.frame(f).function)
                    .ends_with("superprof_testkit::burn")
            })
        })
        .map(|s| s.weight)
        .sum::<u64>();
    assert!(
        burn * 10 >= total * 8,
        "{burn} of {total} periods in burn (demangled)"
    );
    // The guard writes its output when dropped.
    let out =
        std::env::temp_dir().join(format!("superprof-rust-api-{}.folded", std::process::id()));
    {
        let _g = Profiler::start(Options {
            output: Some(out.clone()),
            print_table: false,
            ..Options::default()
        })
        .unwrap();
        rust_light();
    }
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("burn"), "{text}");
    let _ = std::fs::remove_file(&out);
}
