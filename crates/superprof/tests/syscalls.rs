//! `superprof syscalls` against strace on the same programs.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// calls and errors per syscall from `strace -f -c` of the command.
fn strace_counts(dir: &TempDir, cmd: &[&std::ffi::OsStr]) -> BTreeMap<String, (u64, u64)> {
    let out = dir.path("strace.txt");
    run_ok(
        Command::new("strace")
            .arg("-f")
            .arg("-c")
            .arg("-o")
            .arg(&out)
            .args(cmd),
    );
    let text = std::fs::read_to_string(&out).unwrap();
    text.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let (calls, errors, name) = match w.len() {
                6 => (w[3], w[4], w[5]),
                5 => (w[3], "0", w[4]),
                _ => return None,
            };
            Some((name.to_owned(), (calls.parse().ok()?, errors.parse().ok()?)))
        })
        .filter(|(n, _)| n != "total")
        .collect()
}

fn superprof_counts(
    dir: &TempDir,
    extra: &[&str],
    cmd: &[&std::ffi::OsStr],
) -> (BTreeMap<String, (u64, u64)>, serde_json_lite::Doc) {
    let out = dir.path("syscalls.json");
    run_ok(
        superprof()
            .args(["syscalls", "--format", "json", "-o"])
            .arg(&out)
            .args(extra)
            .arg("--")
            .args(cmd),
    );
    let doc = serde_json_lite::Doc::read(&out);
    (doc.counts(), doc)
}

/// A tiny reader for the JSON document, through python3's json module (no JSON crate in the
/// tests' dependencies).
mod serde_json_lite {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::process::Command;

    pub struct Doc {
        pub summary: Vec<(String, u64, u64, u64)>,
        /// (name, pid, tid, ok/err/unfinished, duration_ns).
        pub events: Vec<(String, u32, u32, String, u64)>,
    }

    impl Doc {
        pub fn read(path: &Path) -> Doc {
            let out = Command::new("python3")
                .arg("-c")
                .arg(
                    "import json, sys\n\
                     d = json.load(open(sys.argv[1]))\n\
                     for s in d['syscalls']: print('S', s['name'], s['calls'], s['errors'], s['total_ns'])\n\
                     for e in d['events']:\n\
                     \x20   assert isinstance(e['args'], list) and e['duration_ns'] >= 0 and e['time_ns'] >= 0\n\
                     \x20   print('E', e['name'], e['pid'], e['tid'], 'err' if e['errno'] else ('unfinished' if e['ret'] is None else 'ok'), e['duration_ns'])",
                )
                .arg(path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let mut summary = Vec::new();
            let mut events = Vec::new();
            for l in text.lines() {
                let w: Vec<&str> = l.split_whitespace().collect();
                match w[0] {
                    "S" => summary.push((
                        w[1].to_owned(),
                        w[2].parse().unwrap(),
                        w[3].parse().unwrap(),
                        w[4].parse().unwrap(),
                    )),
                    _ => events.push((
                        w[1].to_owned(),
                        w[2].parse().unwrap(),
                        w[3].parse().unwrap(),
                        w[4].to_owned(),
                        w[5].parse().unwrap(),
                    )),
                }
            }
            Doc { summary, events }
        }

        pub fn counts(&self) -> BTreeMap<String, (u64, u64)> {
            self.summary
                .iter()
                .map(|(n, c, e, _)| (n.clone(), (*c, *e)))
                .collect()
        }
    }
}

fn without_exec_and_exit(mut m: BTreeMap<String, (u64, u64)>) -> BTreeMap<String, (u64, u64)> {
    m.remove("execve");
    m.remove("exit_group");
    m.remove("exit"); // a thread's exit never returns either; strace -c leaves it out too
    m
}

fn sysheavy(dir: &TempDir) -> std::path::PathBuf {
    compile(dir, "sysheavy", &["sysheavy.c"], &["-O2", "-pthread"])
}

#[test]
fn counts_equal_strace_on_a_deterministic_program() {
    let dir = TempDir::new("sys-det");
    let exe = sysheavy(&dir);
    let cmd = [exe.as_os_str(), "300".as_ref()];
    let (ours, doc) = superprof_counts(&dir, &[], &cmd);
    let theirs = strace_counts(&dir, &cmd);
    assert_eq!(
        without_exec_and_exit(ours.clone()),
        without_exec_and_exit(theirs)
    );
    // 300 rounds of: a missing file, a real one, read, write, close, getppid, close(-1).
    assert!(
        ours["openat"].1 >= 300,
        "failed opens: {:?}",
        ours["openat"]
    );
    assert!(ours["close"].1 >= 300);
    assert!(ours["getppid"] == (300, 0));
    // One line per syscall in the events, failures marked.
    let events = doc.events.iter().filter(|e| e.0 == "getppid").count();
    assert_eq!(events, 300);
    assert!(doc
        .events
        .iter()
        .any(|e| e.0 == "exit_group" && e.3 == "unfinished"));
}

#[test]
fn counts_equal_strace_with_threads() {
    let dir = TempDir::new("sys-thr");
    let exe = sysheavy(&dir);
    let cmd = [exe.as_os_str(), "200".as_ref(), "threads".as_ref()];
    let (ours, doc) = superprof_counts(&dir, &[], &cmd);
    let theirs = strace_counts(&dir, &cmd);
    // Whether pthread_join has to wait on a futex depends on timing, traced or not.
    let no_futex = |m| {
        let mut m = without_exec_and_exit(m);
        m.remove("futex");
        m
    };
    assert_eq!(no_futex(ours), no_futex(theirs));
    let tids: std::collections::BTreeSet<u32> = doc
        .events
        .iter()
        .filter(|e| e.0 == "getppid")
        .map(|e| e.2)
        .collect();
    assert_eq!(tids.len(), 2, "getppid from {tids:?}");
}

#[test]
fn children_are_followed_with_follow_forks() {
    let dir = TempDir::new("sys-fork");
    let exe = sysheavy(&dir);
    let cmd = [exe.as_os_str(), "200".as_ref(), "fork".as_ref()];
    let (ours, doc) = superprof_counts(&dir, &["--follow-forks"], &cmd);
    let theirs = strace_counts(&dir, &cmd);
    assert_eq!(
        without_exec_and_exit(ours.clone()),
        without_exec_and_exit(theirs)
    );
    assert_eq!(ours["getppid"].0, 400);
    let pids: std::collections::BTreeSet<u32> = doc
        .events
        .iter()
        .filter(|e| e.0 == "getppid")
        .map(|e| e.1)
        .collect();
    assert_eq!(pids.len(), 2);
    // Without --follow-forks, only the parent's.
    let (parent_only, _) = superprof_counts(&dir, &[], &cmd);
    assert_eq!(parent_only["getppid"].0, 200);
}

#[test]
fn attach_by_pid_logs_and_detaches() {
    let dir = TempDir::new("sys-attach");
    let exe = compile(&dir, "loop", &["sysheavy.c"], &["-O2", "-pthread"]);
    // A long run, started through a shell that prints its pid.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("echo $$; exec {} 100000000", exe.display()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let pid: u32 = lines.next().unwrap().unwrap().trim().parse().unwrap();
    // (The shell's exec done: the program, not the shell, is what is attached.)
    wait_exec(pid, &exe);
    let out = dir.path("a.json");
    let rec = superprof()
        .args([
            "syscalls",
            "--format",
            "json",
            "--duration",
            "1",
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        rec.status.success(),
        "{}",
        String::from_utf8_lossy(&rec.stderr)
    );
    assert!(
        alive && status.contains("TracerPid:\t0"),
        "not detached cleanly:\n{status}"
    );
    assert!(!status.contains("State:\tt") && !status.contains("State:\tT"));
    let doc = serde_json_lite::Doc::read(&out);
    let counts = doc.counts();
    assert!(
        counts.get("getppid").is_some_and(|c| c.0 > 100),
        "{counts:?}"
    );
    assert!(counts.get("openat").is_some_and(|c| c.1 > 50), "{counts:?}");
}

/// The time of each call against what the program measured around it: a 20 ms sleep lasts
/// at least 20 ms between its entry and exit stops (the program sleeps only once resumed from
/// the first), and the calls together no longer than the program's own clock saw them take
/// (its clock reads bracket both stops); the summary's total is its calls' sum.
#[test]
fn call_times_are_bounded_by_what_the_program_measured() {
    let dir = TempDir::new("sys-times");
    let exe = sysheavy(&dir);
    let out = dir.path("times.json");
    let run = run_ok(
        superprof()
            .args(["syscalls", "--format", "json", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&exe)
            .args(["15", "sleep"]),
    );
    let measured = fixture_values(&String::from_utf8_lossy(&run.stdout))["slept_ns"] as u64;
    let doc = serde_json_lite::Doc::read(&out);
    let sleeps: Vec<u64> = doc
        .events
        .iter()
        .filter(|e| e.0 == "clock_nanosleep" || e.0 == "nanosleep")
        .map(|e| e.4)
        .collect();
    assert_eq!(sleeps.len(), 15, "{:?}", doc.events);
    for &d in &sleeps {
        assert!(d >= 20_000_000, "a 20 ms sleep took {d} ns");
    }
    let sum: u64 = sleeps.iter().sum();
    assert!(
        sum <= measured,
        "the sleeps took {sum} ns, the program measured {measured} ns around them"
    );
    let total = doc
        .summary
        .iter()
        .find(|s| s.0 == "clock_nanosleep" || s.0 == "nanosleep")
        .map(|s| s.3)
        .unwrap();
    assert_eq!(total, sum);
}

#[test]
fn table_lines_look_like_strace() {
    let dir = TempDir::new("sys-table");
    let exe = sysheavy(&dir);
    let out = dir.path("t.txt");
    run_ok(
        superprof()
            .args(["syscalls", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&exe)
            .arg("3"),
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("openat(AT_FDCWD, \"/nonexistent/superprof\", O_RDONLY) = -1 ENOENT <"),
        "{text}"
    );
    assert!(text.contains("close(-1) = -1 EBADF"));
    assert!(text.contains("% time     seconds  usecs/call     calls    errors syscall"));
    let summary_only = dir.path("s.txt");
    run_ok(
        superprof()
            .args(["syscalls", "--summary-only", "-o"])
            .arg(&summary_only)
            .arg("--")
            .arg(&exe)
            .arg("3"),
    );
    let s = std::fs::read_to_string(&summary_only).unwrap();
    assert!(s.starts_with("% time") && !s.contains("AT_FDCWD"));
}

#[test]
fn duration_ends_a_command_blocked_in_a_syscall_with_sigterm() {
    // Regression: the syscall-exit stop that SIGTERM causes must be resumed, so that the
    // signal is delivered (exit 143 at once, not SIGKILL after a 5 s grace).
    let dir = TempDir::new("sys-duration");
    let start = std::time::Instant::now();
    let out = superprof()
        .args(["syscalls", "--summary-only", "--duration", "1", "-o"])
        .arg(dir.path("s.txt"))
        .args(["--", "sleep", "30"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        start.elapsed() < std::time::Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
}
