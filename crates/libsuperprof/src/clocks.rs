//! A sampling timer on every thread, for as long as sampling is on: at start for the threads
//! there are, then from a watcher thread (every signal blocked, no sampling timer of its own)
//! that looks at /proc/self/task for threads started since, whatever started them
//! (pthread_create or a raw clone), and deletes the timers of threads that ended.
//!
//! The watcher looks after every [`LOOK_EVERY`] of CPU time the process used, woken by a
//! timer on the process's CPU clock that signals the watcher alone: a thread that uses no CPU
//! time needs no timer yet, so a process that sleeps wakes the watcher only every
//! [`IDLE_LOOK`], and one that works pays a look (about 40 µs on this VM, mostly the wake-up
//! itself) per LOOK_EVERY of CPU time at most, and at most once a tick.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::sys;

/// CPU time of the process between two looks for new threads: the most CPU time a new thread
/// can use before it is sampled (less when other threads run too).
const LOOK_EVERY: Duration = Duration::from_millis(10);
/// The longest wait between two looks.
const IDLE_LOOK: Duration = Duration::from_millis(500);
/// Between two looks when the process-clock alarm could not be made.
const POLL_EVERY: Duration = Duration::from_millis(5);

pub struct Clocks {
    /// Shared with the watcher: stop now; the watcher's thread id (0 until it runs).
    stop: Arc<(AtomicBool, AtomicU32)>,
    watcher: Option<JoinHandle<u64>>,
    /// The process that started the watcher (a fork child has none).
    owner: u32,
}

impl Clocks {
    /// Arms a timer on every thread now, and starts the watcher.
    pub fn start(hz: u32) -> std::io::Result<Clocks> {
        let mut timers = sys::ThreadTimers::new(hz);
        timers.sync(None)?;
        if timers.len() == 0 {
            // Not even the calling thread: the kernel refused (a limit on timers).
            return Err(std::io::Error::from_raw_os_error(libc::EAGAIN));
        }
        let stop = Arc::new((AtomicBool::new(false), AtomicU32::new(0)));
        let shared = stop.clone();
        let watcher = sys::with_signals_blocked(|| {
            std::thread::Builder::new()
                .name("superprof-clock".into())
                .spawn(move || {
                    let me = sys::gettid();
                    shared.1.store(me, Ordering::SeqCst);
                    let alarm = sys::ProcessCpuAlarm::start(me, LOOK_EVERY).ok();
                    while !shared.0.load(Ordering::SeqCst) {
                        let _ = timers.sync(Some(me));
                        match alarm {
                            Some(_) => sys::wait_sigprof(IDLE_LOOK),
                            None => std::thread::park_timeout(POLL_EVERY),
                        }
                    }
                    timers.refused
                    // (dropping `timers` and `alarm` deletes every timer)
                })
        })?;
        Ok(Clocks {
            stop,
            watcher: Some(watcher),
            owner: sys::getpid(),
        })
    }

    /// Deletes every timer and ends the watcher; returns how many threads the kernel refused
    /// a timer.
    pub fn stop(mut self) -> u64 {
        self.end().unwrap_or(0)
    }

    fn end(&mut self) -> Option<u64> {
        let w = self.watcher.take()?;
        if self.owner != sys::getpid() {
            // A fork child: the watcher is not there, and neither are the parent's timers.
            std::mem::forget(w);
            return None;
        }
        // The watcher publishes its id before it first looks at `stop`: either it sees stop,
        // or its id is seen here and it is woken (a signal sent before it waits stays pending).
        self.stop.0.store(true, Ordering::SeqCst);
        let tid = self.stop.1.load(Ordering::SeqCst);
        if tid != 0 {
            sys::sigprof_thread(tid);
        }
        w.thread().unpark();
        w.join().ok()
    }
}

impl Drop for Clocks {
    fn drop(&mut self) {
        self.end();
    }
}
