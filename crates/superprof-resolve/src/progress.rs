//! The progress line of a long run (record, stat, blocks, syscalls, qemu): on stderr, only on
//! a terminal, redrawn at most four times a second with the time so far and what was counted,
//! and erased when the run ends (also when it ends in an error: on drop).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// The progress line (see the module's text).
pub struct Progress {
    enabled: bool,
    start: Instant,
    last: Option<Instant>,
}

impl Progress {
    /// A progress line, shown if `wanted` and stderr is a terminal.
    pub fn new(wanted: bool) -> Progress {
        Progress {
            enabled: wanted && std::io::stderr().is_terminal(),
            start: Instant::now(),
            last: None,
        }
    }

    /// Time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Redraws the line (`what`: the counts so far) if a quarter second passed.
    pub fn update(&mut self, what: impl FnOnce() -> String) {
        if !self.enabled
            || self
                .last
                .is_some_and(|l| l.elapsed() < Duration::from_millis(250))
        {
            return;
        }
        self.last = Some(Instant::now());
        // Never a panic on a closed stderr (see superprof_unwind::say!).
        let _ = write!(
            std::io::stderr(),
            "\r\x1b[K[superprof] {:.1} s, {}",
            self.start.elapsed().as_secs_f64(),
            what()
        );
    }

    /// Erases the line (before other output, and at the end).
    pub fn clear(&mut self) {
        if self.enabled && self.last.take().is_some() {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}
