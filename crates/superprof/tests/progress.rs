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
