//! The progress line of a long run (record, stat, blocks, syscalls, qemu): on stderr, only on
//! a terminal, redrawn at most four times a second with the time so far and what was counted,
//! and erased when the run ends (also when it ends in an error: on drop).
//!
//! A launched program writes to the same terminal, so the line has a row of its own: the
//! terminal's last, kept out of the scrolling region (as apt's progress bar), so that the
//! program's output scrolls above it and never shares its line. The region is given back
//! whole at the end. Where the terminal's size is unknown, the line is redrawn in place
//! (`\r`, erase to the end of the line).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// The progress line (see the module's text).
pub struct Progress {
    enabled: bool,
    start: Instant,
    last: Option<Instant>,
    /// The terminal's rows, where the line has the last one to itself (set at the first
    /// draw).
    rows: Option<usize>,
}

impl Progress {
    /// A progress line, shown if `wanted` and stderr is a terminal.
    pub fn new(wanted: bool) -> Progress {
        Progress {
            enabled: wanted && std::io::stderr().is_terminal(),
            start: Instant::now(),
            last: None,
            rows: None,
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
        let first = self.last.is_none();
        self.last = Some(Instant::now());
        let text = format!(
            "[superprof] {:.1} s, {}",
            self.start.elapsed().as_secs_f64(),
            what()
        );
        let mut out = String::new();
        use std::os::fd::AsFd;
        let rows = superprof_unwind::terminal_size(std::io::stderr().as_fd())
            .map(|(rows, _)| rows)
            .filter(|&r| r >= 3);
        if first {
            self.rows = rows;
            if let Some(rows) = self.rows {
                out.push_str(&reserve_last_row(rows));
            }
        } else if let (Some(old), Some(new)) = (self.rows, rows) {
            // The terminal was resized: the region follows.
            if old != new {
                out.push_str(&format!(
                    "\x1b7\x1b[{old};1H\x1b[2K\x1b[1;{}r\x1b8",
                    new - 1
                ));
                self.rows = Some(new);
            }
        }
        match self.rows {
            Some(rows) => out.push_str(&draw_on_row(rows, &text)),
            None => out.push_str(&format!("\r\x1b[K{text}")),
        }
        // One write, so that the program's output does not come between its parts; never a
        // panic on a closed stderr (see superprof_unwind::say!).
        let _ = std::io::stderr().write_all(out.as_bytes());
    }

    /// Erases the line (before other output, and at the end), and gives the terminal its
    /// last row back.
    pub fn clear(&mut self) {
        if self.enabled && self.last.take().is_some() {
            let out = match self.rows.take() {
                Some(rows) => release_last_row(rows),
                None => "\r\x1b[K".to_owned(),
            };
            let _ = std::io::stderr().write_all(out.as_bytes());
        }
    }
}

/// Makes room for a line on the last of `rows` rows: a new line (the screen scrolls where the
/// cursor is at the bottom), the scrolling region rows 1 to `rows - 1` (which moves the
/// cursor home: saved and put back), the cursor back on the line it was on.
fn reserve_last_row(rows: usize) -> String {
    format!("\n\x1b7\x1b[1;{}r\x1b8\x1b[1A", rows - 1)
}

/// `text` on row `rows`, the cursor put back where the program left it.
fn draw_on_row(rows: usize, text: &str) -> String {
    format!("\x1b7\x1b[{rows};1H\x1b[2K{text}\x1b8")
}

/// The whole screen scrolling again (the region reset, whatever the size now), and the last
/// row erased.
fn release_last_row(rows: usize) -> String {
    format!("\x1b7\x1b[r\x1b[{rows};1H\x1b[2K\x1b8")
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_last_row_is_kept_out_of_the_scrolling_and_given_back() {
        assert_eq!(super::reserve_last_row(24), "\n\x1b7\x1b[1;23r\x1b8\x1b[1A");
        assert_eq!(
            super::draw_on_row(24, "[superprof] 1.0 s"),
            "\x1b7\x1b[24;1H\x1b[2K[superprof] 1.0 s\x1b8"
        );
        assert_eq!(
            super::release_last_row(24),
            "\x1b7\x1b[r\x1b[24;1H\x1b[2K\x1b8"
        );
    }
}
