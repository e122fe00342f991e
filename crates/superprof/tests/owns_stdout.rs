//! A launched program owns stdout (issue 17): under record, stat, blocks, syscalls and
//! preload its stdout is byte for byte what it prints alone, its exit status the same, and
//! superprof's results are on stderr (or in -o). `report`, which launches nothing, and a
//! command attached to with -p, keep stdout for the results.

mod common;

use std::process::{Command, Output};

use common::*;

fn chatty(dir: &TempDir) -> std::path::PathBuf {
    compile(dir, "chatty", &["chatty.c"], &["-O2", "-g"])
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `superprof ARGS -- chatty CALLS`, against chatty alone: the same stdout and status.
fn launched(dir: &TempDir, args: &[&str], calls: &str) -> Output {
    let exe = chatty(dir);
    let alone = Command::new(&exe).arg(calls).output().unwrap();
    assert_eq!(alone.status.code(), Some(3));
    let out = superprof()
        .args(args)
        .arg("--")
        .arg(&exe)
        .arg(calls)
        .current_dir(&dir.0)
        .output()
        .unwrap();
    assert_eq!(
        out.stdout,
        alone.stdout,
        "{args:?}: the program's stdout changed; stderr: {}",
        text(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{args:?}: {}",
        text(&out.stderr)
    );
    out
}

/// The line of `stderr` that starts (after spaces) with `first` and names `name`.
fn row<'a>(stderr: &'a str, name: &str) -> Option<&'a str> {
    stderr
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == name) && !l.starts_with("superprof:"))
}

#[test]
fn record_leaves_stdout_to_the_program_and_report_keeps_it() {
    let _cpu = cpu_share();
    let dir = TempDir::new("stdout-record");
    let folded = dir.path("c.parquet");
    let out = launched(&dir, &["record", "-o", folded.to_str().unwrap()], "300");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("Self%"), "no table on stderr: {stderr}");
    assert!(row(&stderr, "work").is_some(), "{stderr}");
    // report launches nothing: its table is on stdout.
    let rep = run_ok(superprof().arg("report").arg(&folded));
    let stdout = text(&rep.stdout);
    assert!(stdout.contains("Self%"), "{stdout}");
    assert!(row(&stdout, "work").is_some(), "{stdout}");
}

#[test]
fn stat_results_go_to_stderr_or_to_o() {
    let _cpu = cpu_share();
    let dir = TempDir::new("stdout-stat");
    let out = launched(&dir, &["stat", "-r", "work", "-e", "task-clock"], "40");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("Region work: 40 calls"),
        "no results on stderr: {stderr}"
    );
    // With -o, the results are in the file, nowhere else.
    let json = dir.path("s.json");
    let out = launched(
        &dir,
        &[
            "stat",
            "-r",
            "work",
            "-e",
            "task-clock",
            "--format",
            "json",
            "-o",
            json.to_str().unwrap(),
        ],
        "40",
    );
    assert!(!text(&out.stderr).contains("Region work"));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["regions"][0]["calls"], 40, "{doc}");
}

#[test]
fn blocks_results_go_to_stderr() {
    let _cpu = cpu_share();
    let dir = TempDir::new("stdout-blocks");
    let out = launched(&dir, &["blocks", "-r", "work"], "5");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("executions"),
        "no table on stderr: {stderr}"
    );
    // The loop's block ran a million and more times per call.
    let hot = stderr
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .max();
    assert!(hot > Some(5_000_000), "{stderr}");
}

#[test]
fn the_syscall_log_goes_to_stderr() {
    let _cpu = cpu_share();
    let dir = TempDir::new("stdout-syscalls");
    let out = launched(&dir, &["syscalls"], "5");
    let stderr = text(&out.stderr);
    // chatty's two writes on stdout, logged; the summary's write row.
    let writes = stderr.lines().filter(|l| l.contains("] write(1, ")).count();
    assert_eq!(writes, 2, "{stderr}");
    assert!(
        stderr.lines().any(|l| l.trim_end().ends_with(" write")),
        "{stderr}"
    );
}

#[test]
fn preload_leaves_stdout_to_the_program() {
    let _cpu = cpu_share();
    let dir = TempDir::new("stdout-preload");
    let out = launched(&dir, &["preload"], "300");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("Self%"), "no table on stderr: {stderr}");
    assert!(row(&stderr, "work").is_some(), "{stderr}");
}

#[test]
fn attached_results_go_to_stdout() {
    let _cpu = cpu_share();
    let dir = TempDir::new("stdout-attach");
    let exe = chatty(&dir);
    let (mut child, _lines) = spawn_ready(&exe, &["ready", "3"]);
    let out = run_ok(
        superprof()
            .args([
                "stat",
                "-r",
                "work",
                "-e",
                "task-clock",
                "--duration",
                "0.5",
                "-p",
            ])
            .arg(child.id().to_string()),
    );
    let _ = child.kill();
    let _ = child.wait();
    let stdout = text(&out.stdout);
    assert!(stdout.contains("Region work: "), "{stdout}");
    assert!(!text(&out.stderr).contains("Region work"));
}
