//! Progress lines (issue 17): on a terminal, record, stat, blocks and syscalls (its log in a
//! file) redraw a line on stderr with the time so far and what they counted, and erase it at
//! the end; on a pipe, nothing.

mod common;

use std::process::Command;

use common::*;

/// `superprof ARGS -- chatty CALLS` on a pseudo-terminal (script(1)): what the terminal got.
fn on_a_terminal(dir: &TempDir, args: &str, calls: &str) -> String {
    let exe = compile(dir, "chatty", &["chatty.c"], &["-O2", "-g"]);
    let cmd = format!(
        "{} {args} -- {} {calls}",
        env!("CARGO_BIN_EXE_superprof"),
        exe.display()
    );
    let out = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .current_dir(&dir.0)
        .output()
        .unwrap();
    // (script -e: chatty's own status, 3.)
    assert_eq!(out.status.code(), Some(3), "{cmd}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn long_runs_show_a_progress_line_on_a_terminal_only() {
    let _cpu = cpu_share();
    let dir = TempDir::new("progress");
    let log = dir.path("s.log");
    for (args, counted) in [
        ("record -o p.folded".to_owned(), "samples"),
        ("stat -r work -e task-clock".to_owned(), "calls"),
        ("blocks -r work".to_owned(), "executions"),
        (format!("syscalls -o {}", log.display()), "syscalls"),
    ] {
        let text = on_a_terminal(&dir, &args, "300");
        let line = text
            .split("\r\x1b[K")
            .find(|l| l.starts_with("[superprof] "))
            .unwrap_or_else(|| panic!("{args}: no progress line in {text:?}"));
        assert!(
            line.contains(" s, ") && line.contains(counted),
            "{args}: {line:?}"
        );
        // Erased before the results.
        assert!(text.contains("\r\x1b[K"), "{args}");
        // On a pipe: no line.
        let exe = dir.path("chatty");
        let out = Command::new(env!("CARGO_BIN_EXE_superprof"))
            .args(args.split(' '))
            .arg("--")
            .arg(&exe)
            .arg("30")
            .current_dir(&dir.0)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("[superprof]"), "{args}: {stderr}");
    }
}

/// In a real terminal (tmux) the line has the last row to itself: a launched program's lines
/// scroll above it, whole, never sharing a line with it; at the end the row is given back
/// and nothing of the line is left.
#[test]
fn the_line_keeps_to_the_last_row_while_the_program_writes() {
    let _cpu = cpu_share();
    let socket = format!("superprof-test-{}-progress", std::process::id());
    let tmux = || {
        let mut c = Command::new("tmux");
        c.args(["-L", &socket]);
        c
    };
    struct Kill<F: Fn() -> Command>(F);
    impl<F: Fn() -> Command> Drop for Kill<F> {
        fn drop(&mut self) {
            let _ = (self.0)().arg("kill-server").output();
        }
    }
    let _kill = Kill(tmux);
    let dir = TempDir::new("progress-row");
    let script = "i=0; while [ $i -lt 25 ]; do echo \"program line $i\"; i=$((i+1)); sleep 0.1; \
                  done";
    let cmd = format!(
        "{} record -o {} -- sh -c '{script}'; echo EXITED $?; sleep 60",
        env!("CARGO_BIN_EXE_superprof"),
        dir.path("p.folded").display()
    );
    run_ok(tmux().args([
        "new-session",
        "-d",
        "-s",
        "p",
        "-x",
        "100",
        "-y",
        "12",
        &cmd,
    ]));
    let screen = |history: bool| {
        let mut c = tmux();
        c.args(["capture-pane", "-p", "-t", "p"]);
        if history {
            c.args(["-S", "-100"]);
        }
        String::from_utf8_lossy(&run_ok(&mut c).stdout).into_owned()
    };
    // While it runs: the last row is the line, every other row the program's.
    let mut during = String::new();
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        during = screen(false);
        if during.contains("program line 15") {
            break;
        }
    }
    let rows: Vec<&str> = during.lines().collect();
    assert!(
        rows.last().is_some_and(|l| l.starts_with("[superprof] ")),
        "{during}"
    );
    for row in &rows[..rows.len() - 1] {
        assert!(
            row.is_empty() || row.starts_with("program line "),
            "a row shared: {row:?}\n{during}"
        );
        assert!(!row.contains("[superprof]"), "{during}");
    }
    // At the end: each of the program's lines whole, and the line gone.
    let mut after = String::new();
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        after = screen(true);
        if after.contains("EXITED") {
            break;
        }
    }
    assert!(after.contains("EXITED 0"), "{after}");
    for i in 0..25 {
        let line = format!("program line {i}");
        assert!(
            after.lines().any(|l| l == line),
            "{line} not whole:\n{after}"
        );
    }
    assert!(!after.contains("[superprof]"), "{after}");
}
