//! The ptrace engine on real processes: breakpoints counted exactly with several threads on
//! the same code, single-stepping, clean detach, "address of function F".

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use superprof_symbols::find_function;
use superprof_testkit::{code_bytes, compile, TempDir};
use superprof_trace::{ExitStatus, PendingChild, TraceEvent, TraceOptions, Tracer};

/// bp.c built with `flags` into `dir/name`.
fn fixture(dir: &TempDir, name: &str, flags: &[&str]) -> PathBuf {
    compile(dir, name, &["bp.c"], flags)
}

/// Runs the tracer until the root exits; sets a breakpoint on `counted` at exec and counts
/// its hits. Returns (hits, exit status).
fn count_hits(tracer: &mut Tracer) -> (u64, Option<ExitStatus>) {
    superprof_trace::block_sigchld();
    let mut hits = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match tracer.next_event(Duration::from_millis(50)).unwrap() {
            Some(TraceEvent::Exec { pid }) => {
                let f = find_function(pid, "counted").unwrap();
                assert_eq!(f.len(), 1, "{f:?}");
                tracer.set_breakpoint(pid, f[0].addr).unwrap();
                tracer.resume(pid);
            }
            Some(TraceEvent::Breakpoint { tid, .. }) => {
                hits += 1;
                tracer.resume(tid);
            }
            Some(TraceEvent::ProcessExited { pid, status }) if pid == tracer.root() => {
                return (hits, Some(status));
            }
            Some(TraceEvent::Stopped { tid, .. }) => tracer.resume(tid),
            _ => {}
        }
    }
    panic!("the traced program did not finish in 60 s ({hits} hits)");
}

#[test]
fn breakpoint_counts_are_exact_with_threads_on_the_same_code() {
    // PIE, five threads (four plus main) calling `counted` 3000 times each.
    let dir = TempDir::new("engine-bp-pie");
    let exe = fixture(&dir, "bp-pie", &["-O2", "-g", "-pthread", "-pie", "-fPIE"]);
    let mut child = PendingChild::spawn(
        &exe,
        &[exe.clone().into_os_string(), "3000".into(), "4".into()],
    )
    .unwrap();
    let mut tracer = Tracer::launch(child.pid, TraceOptions::default()).unwrap();
    child.release().unwrap();
    let (hits, status) = count_hits(&mut tracer);
    // The program checks that every call ran: no thread slipped past a lifted breakpoint
    // without being counted, and none ran a corrupted instruction.
    assert_eq!(status, Some(ExitStatus::Code(0)));
    assert_eq!(hits, 5 * 3000);
}

#[test]
fn single_step_moves_the_pc_past_the_breakpoint() {
    superprof_trace::block_sigchld();
    let dir = TempDir::new("engine-bp-step");
    let exe = fixture(&dir, "bp-step", &["-O2", "-g", "-pthread"]);
    let mut child = PendingChild::spawn(
        &exe,
        &[exe.clone().into_os_string(), "10".into(), "0".into()],
    )
    .unwrap();
    let mut tracer = Tracer::launch(child.pid, TraceOptions::default()).unwrap();
    child.release().unwrap();
    let mut addr = 0;
    let mut stepped = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        assert!(Instant::now() < deadline, "hung");
        match tracer.next_event(Duration::from_millis(50)).unwrap() {
            Some(TraceEvent::Exec { pid }) => {
                let f = find_function(pid, "counted").unwrap();
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
                assert_eq!(f.len(), 1, "{f:?} in pid {pid}:\n{maps}");
                addr = f[0].addr;
                tracer.set_breakpoint(pid, addr).unwrap();
                tracer.resume(pid);
            }
            Some(TraceEvent::Breakpoint { tid, addr: at, .. }) => {
                assert_eq!(at, addr);
                assert_eq!(tracer.regs(tid).unwrap().pc, addr);
                if !stepped {
                    tracer.single_step(tid).unwrap();
                } else {
                    tracer.resume(tid);
                }
            }
            Some(TraceEvent::Stepped { tid, .. }) => {
                let pc = tracer.regs(tid).unwrap().pc;
                assert!(
                    pc != addr && pc > addr && pc < addr + 16,
                    "pc {pc:#x} after one step from {addr:#x}"
                );
                stepped = true;
                tracer.resume(tid);
            }
            Some(TraceEvent::ProcessExited { status, .. }) => break status,
            _ => {}
        }
    };
    assert!(stepped);
    assert_eq!(status, ExitStatus::Code(0));
}

#[test]
fn attach_break_and_detach_leaves_the_code_as_it_was() {
    superprof_trace::block_sigchld();
    let dir = TempDir::new("engine-bp-attach");
    let exe = fixture(&dir, "bp-attach", &["-O2", "-g", "-pthread"]);
    let mut child = Command::new(&exe)
        .args(["0", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let pid = child.id();
    let before = code_bytes(pid, &exe);
    let mut tracer = Tracer::attach(pid, TraceOptions::default()).unwrap();
    let f = find_function(pid, "counted").unwrap();
    tracer.set_breakpoint(pid, f[0].addr).unwrap();
    assert_ne!(
        code_bytes(pid, &exe),
        before,
        "the breakpoint is in the code"
    );
    let mut hits = 0u64;
    let end = Instant::now() + Duration::from_millis(700);
    while Instant::now() < end {
        if let Some(TraceEvent::Breakpoint { tid, .. }) =
            tracer.next_event(Duration::from_millis(10)).unwrap()
        {
            hits += 1;
            tracer.resume(tid);
        }
    }
    // Let go while threads are still hitting the breakpoint.
    tracer.finish();
    drop(tracer);
    std::thread::sleep(Duration::from_millis(300));
    if let Some(st) = child.try_wait().unwrap() {
        panic!("the process ended after detach: {st:?} ({hits} hits)");
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let after = code_bytes(pid, &exe);
    let alive = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(hits > 100, "{hits} hits");
    assert!(alive, "the process died after detach");
    assert!(status.contains("TracerPid:\t0"), "{status}");
    assert!(
        !status.contains("State:\tt") && !status.contains("State:\tT"),
        "{status}"
    );
    assert!(before == after, "code bytes differ after detach");
}

#[test]
fn finds_functions_in_the_executable_and_in_libc() {
    let dir = TempDir::new("engine-bp-find");
    let exe = fixture(&dir, "bp-find", &["-O2", "-g", "-pthread", "-pie", "-fPIE"]);
    let mut child = Command::new(&exe)
        .args(["0", "1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let pid = child.id();
    let counted = find_function(pid, "counted").unwrap();
    let getpid = find_function(pid, "getpid").unwrap();
    // Looked for in the running process and not found (an error would not pass).
    let missing = find_function(pid, "no_such_function_here").unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(counted.len(), 1);
    assert!(counted[0].size > 0);
    // Both addresses lie in executable mappings of the right files.
    let inside = |addr: u64, file: &str| {
        maps.lines().any(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            let (a, b) = (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            );
            l.contains("r-xp") && l.contains(file) && a <= addr && addr < b
        })
    };
    assert!(inside(
        counted[0].addr,
        exe.file_name().unwrap().to_str().unwrap()
    ));
    assert!(
        getpid.iter().any(|f| inside(f.addr, "libc.so")),
        "{getpid:?}"
    );
    assert!(missing.is_empty(), "{missing:?}");
}
