//! Bad input: one clear line on stderr, a non-zero exit, no panic, no output file.

mod common;

use common::*;
use std::path::Path;
use std::process::Output;

fn assert_clean_error(out: &Output, expect: &[&str], output_file: Option<&Path>) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exit status was success; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    assert!(lines[0].starts_with("superprof: "), "line: {}", lines[0]);
    for e in expect {
        assert!(
            lines[0].contains(e),
            "'{}' does not mention '{e}'",
            lines[0]
        );
    }
    if let Some(f) = output_file {
        assert!(!f.exists(), "{} was created", f.display());
        let dir = f.parent().unwrap();
        if let Ok(entries) = std::fs::read_dir(dir) {
            let leftovers: Vec<_> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .collect();
            assert!(
                leftovers
                    .iter()
                    .all(|n| !n.to_string_lossy().contains(".tmp")),
                "temp files left: {leftovers:?}"
            );
        }
    }
}

#[test]
fn unknown_subcommand() {
    let out = superprof().arg("frobnicate").output().unwrap();
    assert_clean_error(&out, &["frobnicate"], None);
}

#[test]
fn unknown_option() {
    let out = superprof()
        .args(["record", "--bogus", "--", "true"])
        .output()
        .unwrap();
    assert_clean_error(&out, &["--bogus"], None);
}

#[test]
fn record_needs_a_target() {
    let out = superprof().args(["record"]).output().unwrap();
    assert_clean_error(&out, &["<CMD>"], None);
}

#[test]
fn pid_that_does_not_exist() {
    let dir = TempDir::new("badpid");
    let o = dir.path("x.folded");
    let out = superprof()
        .args(["record", "-p", "999999999", "-o"])
        .arg(&o)
        .output()
        .unwrap();
    assert_clean_error(&out, &["no process", "999999999"], Some(&o));
}

#[test]
fn permission_denied_says_why() {
    // An unprivileged user may not sample a root process (pid 1).
    let dir = TempDir::new("perm");
    let o = dir.path("x.folded");
    let out = superprof_as_nobody()
        .args(["record", "-p", "1", "--duration", "1", "-o"])
        .arg(&o)
        .output()
        .unwrap();
    assert_clean_error(
        &out,
        &["permission denied", "perf_event_paranoid", "CAP_PERFMON"],
        Some(&o),
    );
}

#[test]
fn unprivileged_user_samples_its_own_program_in_user_space() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("user");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let out = superprof_as_nobody()
        .args(["record", "--"])
        .arg(&exe)
        .arg("0.5")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("user space only"), "{stderr}");
    assert!(stderr.contains("work_alpha"), "{stderr}");
}

#[test]
fn zero_frequency() {
    let out = superprof()
        .args(["record", "-F", "0", "--", "true"])
        .output()
        .unwrap();
    assert_clean_error(&out, &["frequency"], None);
}

#[test]
fn unwritable_output() {
    let out = superprof()
        .args(["record", "-o", "/nonexistent-dir/x.svg", "--", "true"])
        .output()
        .unwrap();
    assert_clean_error(&out, &["/nonexistent-dir/x.svg"], None);
}

#[test]
fn unknown_output_extension() {
    let dir = TempDir::new("ext");
    let o = dir.path("x.txt");
    let out = superprof()
        .args(["record", "-o"])
        .arg(&o)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_clean_error(&out, &["x.txt", ".folded", ".svg"], Some(&o));
}

#[test]
fn command_not_found() {
    let out = superprof()
        .args(["record", "--", "/no/such/program"])
        .output()
        .unwrap();
    assert_clean_error(&out, &["/no/such/program"], None);
}

/// Issue 32: a command that cannot be run ends superprof with the status a shell gives it:
/// 127 when it is not found, 126 when it is found but cannot be executed; one line says why.
#[test]
fn a_command_that_cannot_run_gives_the_shells_status() {
    let dir = TempDir::new("cannot-run");
    let plain = dir.path("not-executable");
    std::fs::write(&plain, "just text\n").unwrap();
    let missing = dir.path("missing");
    for (program, status) in [(&missing, 127), (&plain, 126)] {
        // The shell's own status, for the record.
        let sh = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("'{}'", program.display()))
            .output()
            .unwrap();
        assert_eq!(
            sh.status.code(),
            Some(status),
            "sh on {}",
            program.display()
        );
        for args in [
            &["record", "-q", "-o", "x.folded"][..],
            &["record", "-q", "--sampler", "ptrace", "-o", "x.folded"][..],
            &["stat", "-e", "task-clock", "-r", "main"][..],
            &["syscalls"][..],
            &["blocks", "-r", "main"][..],
            &["preload", "-o", "x.folded"][..],
        ] {
            let out = superprof()
                .current_dir(dir.path(""))
                .args(args)
                .arg("--")
                .arg(program)
                .output()
                .unwrap();
            assert_eq!(
                out.status.code(),
                Some(status),
                "{args:?} {}: {}",
                program.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_one_line_error(&out, "cannot run");
        }
    }
    // Not on PATH at all.
    let out = superprof()
        .args([
            "stat",
            "-e",
            "task-clock",
            "-r",
            "main",
            "--",
            "no-such-command-anywhere",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert_one_line_error(&out, "command not found");
}

#[test]
fn target_exits_before_any_sample() {
    let dir = TempDir::new("empty");
    let o = dir.path("x.svg");
    // At 1 Hz a sample comes after 1 s of CPU time, which the shell never uses. Nothing to
    // show is said in one line, and superprof exits with the command's status (issue 12).
    let out = superprof()
        .args(["record", "-F", "1", "-o"])
        .arg(&o)
        .args(["--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_clean_error(&out, &["empty"], Some(&o));
}
