//! `superprof top` in a real terminal (tmux: send-keys, capture-pane): the live table of a
//! two-thread spinner shows both spinning functions in the shares the threads ran, `q` quits
//! with the terminal's screen given back; on a pipe, each refresh is printed after the last.

mod common;

use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

/// A tmux server of this test's own (its own socket), killed when dropped.
struct Tmux(String);

impl Tmux {
    fn new(name: &str) -> Tmux {
        Tmux(format!("superprof-test-{}-{name}", std::process::id()))
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.0]);
        c
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(
            &run_ok(self.cmd().args(["capture-pane", "-p", "-t", "top"])).stdout,
        )
        .into_owned()
    }

    /// The screen once `ready` holds of it, within `secs`.
    fn wait_for(&self, secs: u64, ready: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if ready(&s) || Instant::now() > until {
                return s;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").output();
    }
}

/// The Samples column of `function`'s row, if the screen has one.
fn samples(screen: &str, function: &str) -> Option<u64> {
    screen
        .lines()
        .find(|l| l.split_whitespace().nth(3) == Some(function))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
}

#[test]
fn top_shows_the_spinners_live_and_quits_on_q() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("top");
    let spin = Spinner::start(&dir);
    let tmux = Tmux::new("top");
    let top = format!(
        "{} top -p {} -d 0.5 --window 3; echo EXITED $?; sleep 60",
        env!("CARGO_BIN_EXE_superprof"),
        spin.pid()
    );
    run_ok(tmux.cmd().args([
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "40",
        &top,
    ]));
    // A table of a few refreshes, both spinners in it.
    let screen = tmux.wait_for(20, |s| {
        samples(s, "spin_a").unwrap_or(0) + samples(s, "spin_b").unwrap_or(0) > 500
    });
    assert!(screen.contains("superprof top: process"), "{screen}");
    assert!(screen.contains("q quits"), "{screen}");
    let (a, b) = (
        samples(&screen, "spin_a").unwrap_or_else(|| panic!("no spin_a:\n{screen}")),
        samples(&screen, "spin_b").unwrap_or_else(|| panic!("no spin_b:\n{screen}")),
    );
    // Both threads spin all the time: the scheduler gives them the same CPU time.
    assert_share("spin_a of the two", a as f64 / (a + b) as f64, 0.5, a + b);
    // Sorted by self share: the two spinners first.
    let rows: Vec<&str> = screen
        .lines()
        .skip_while(|l| !l.contains("Self%"))
        .skip(1)
        .take(2)
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert!(
        rows.contains(&"spin_a") && rows.contains(&"spin_b"),
        "{screen}"
    );
    // q quits at once, and the shell's screen comes back (the table was on the alternate one).
    run_ok(tmux.cmd().args(["send-keys", "-t", "top", "q"]));
    let after = tmux.wait_for(5, |s| s.contains("EXITED"));
    assert!(after.contains("EXITED 0"), "{after}");
    assert!(!after.contains("Self%"), "{after}");
    // The spinner runs on, untouched.
    assert!(superprof_trace::process_alive(spin.pid()));
}

#[test]
fn top_on_a_pipe_prints_each_refresh() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("top-pipe");
    let spin = Spinner::start(&dir);
    let out = run_ok(
        superprof()
            .args(["top", "-d", "0.4", "--duration", "1.5", "-p"])
            .arg(spin.pid().to_string()),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let tables = text.matches("superprof top: process").count();
    assert!((2..=4).contains(&tables), "{tables} tables:\n{text}");
    assert!(!text.contains('\x1b'), "{text}");
    assert!(text.contains("spin_a") && text.contains("spin_b"), "{text}");
}
