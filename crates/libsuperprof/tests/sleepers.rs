//! A thread that sleeps while another works: sampling never interrupts its sleep (no EINTR from
//! nanosleep or poll, which SA_RESTART does not restart) and gives it no samples, and a thread
//! started after start is sampled from its first milliseconds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::burn;
use superprof::{Options, Profiler};

fn gettid() -> u32 {
    // SAFETY: gettid has no arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

#[test]
fn sleeping_threads_are_neither_woken_nor_sampled() {
    let p = Profiler::start(Options::default()).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    // Sleeps in short nanosleeps and polls until told to stop; counts the EINTRs.
    let sleeper = std::thread::spawn(move || {
        let mut eintr = 0;
        let mut sleeps = 0;
        while !d.load(Ordering::Acquire) {
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 2_000_000,
            };
            // SAFETY: nanosleep with a valid request and no remainder.
            if unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) } != 0 {
                eintr += 1;
            }
            // SAFETY: poll on no descriptors is a 2 ms sleep.
            if unsafe { libc::poll(std::ptr::null_mut(), 0, 2) } != 0 {
                eintr += 1;
            }
            sleeps += 2;
        }
        (gettid(), eintr, sleeps)
    });
    // Meanwhile a thread started after start works for 0.4 s of CPU time, and this one too.
    let worker = std::thread::spawn(|| {
        burn(Duration::from_millis(400));
        gettid()
    });
    burn(Duration::from_millis(400));
    let worker = worker.join().unwrap();
    done.store(true, Ordering::Release);
    let (sleeper, eintr, sleeps) = sleeper.join().unwrap();
    let profile = p.stop().unwrap();
    assert!(sleeps > 100, "{sleeps} sleeps");
    assert_eq!(eintr, 0, "sleeps interrupted, of {sleeps}");
    // A thread's samples, and the periods they weigh.
    let of = |tid: u32| -> (u64, u64) {
        profile
            .samples
            .iter()
            .filter(|s| profile.threads[s.thread as usize].tid == tid)
            .fold((0, 0), |(n, w), s| (n + 1, w + s.weight))
    };
    let me = gettid();
    let ((s, _), (wn, w), (mn, m)) = (of(sleeper), of(worker), of(me));
    // The sleeper used a few milliseconds of CPU time at most (two syscalls per 4 ms).
    assert!(s <= 2, "sleeper {s}, worker {w}, main {m}");
    // Worker and main thread used the same CPU time: half each (of the periods) within 4σ
    // (of the samples).
    let n = (wn + mn) as f64;
    let share = w as f64 / (w + m) as f64;
    assert!(n > 40.0, "worker {w}, main {m}");
    assert!(
        (share - 0.5).abs() < 4.0 * (0.25 / n).sqrt(),
        "worker {w}, main {m}"
    );
}
