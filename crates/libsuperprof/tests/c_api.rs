//! The C API on real C programs linked with libsuperprof.so: what is profiled and what is
//! not, against the split the program measures itself; threads started later, malloc-heavy
//! code, fork, a program with its own SIGPROF handler, and misuse.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

fn build(dir: &Path) -> PathBuf {
    build_with(dir, false, "-fno-omit-frame-pointer")
}

/// The fixture linked with libsuperprof.so, or with libsuperprof.a (`static_lib`).
fn build_with(dir: &Path, static_lib: bool, frame_pointers: &str) -> PathBuf {
    let link = if static_lib {
        Link::Static
    } else {
        Link::Shared
    };
    compile(
        dir,
        "lib_api",
        "lib_api.c",
        link,
        &["-O2", "-g", frame_pointers],
    )
}

fn run(exe: &Path, mode: &str, output: Option<&Path>) -> Output {
    let _cpu = cpu_lock();
    let mut c = Command::new(exe);
    c.arg(mode);
    if let Some(o) = output {
        c.env("SUPERPROF_OUTPUT", o);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{mode}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn profiles_only_between_start_and_stop_with_the_split_and_a_late_thread() {
    let dir = TempDir::new("lib-split");
    let exe = build(&dir);
    let folded = dir.join("out.folded");
    let out = run(&exe, "split", Some(&folded));
    let truth = fixture_values(&String::from_utf8_lossy(&out.stdout));
    let f = Folded::read(&folded);
    let (m, total) = (f.leaves(), f.total());
    // (Counts are periods: a sample weighs each its signal stood for; σ counts samples.)
    let stderr = String::from_utf8_lossy(&out.stderr);
    let n = samples_behind(total, total, &stderr);
    assert!(n > 150, "{n} samples ({total} periods): {m:?}");
    assert!(
        !m.contains_key("before_start"),
        "work before perf_start was sampled: {m:?}"
    );
    for f in ["inside_alpha", "inside_beta", "late_thread_work"] {
        let share = *m.get(f).unwrap_or(&0) as f64 / total as f64;
        assert_share(f, share, truth[f], n);
    }
    // Full stacks for 95% of each function's samples: main calls inside_alpha; the late
    // thread's work comes from its thread's entry (under the thread's name).
    for (leaf, tail) in [
        ("inside_alpha", "main;inside_alpha"),
        ("late_thread_work", "late;late_thread_work"),
    ] {
        let whole = f.share_ending(leaf, tail);
        assert!(whole >= 0.95, "{leaf}: {:.1}% whole stacks", whole * 100.0);
    }
    // The table on stderr.
    assert!(
        stderr.contains("inside_alpha") && stderr.contains("Self%"),
        "{stderr}"
    );
}

#[test]
fn malloc_heavy_code_started_and_stopped_many_times() {
    let dir = TempDir::new("lib-malloc");
    let exe = build(&dir);
    let out = run(&exe, "malloc", None);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("superprof: ").count(), 30, "{stderr}");
    assert!(stderr.contains("churn"), "{stderr}");
}

#[test]
fn fork_inside_the_profiled_part() {
    let dir = TempDir::new("lib-fork");
    let exe = build(&dir);
    let folded = dir.join("fork.folded");
    let out = run(&exe, "fork", Some(&folded));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "child=7");
    let f = Folded::read(&folded);
    let (m, total) = (f.leaves(), f.total());
    // The parent's work: 0.6 s alpha, 0.3 s beta (the child's 0.3 s of beta is its own).
    let alpha = m.get("inside_alpha").copied().unwrap_or(0) as f64;
    let beta = m.get("inside_beta").copied().unwrap_or(0) as f64;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let n = samples_behind((alpha + beta) as u64, total, &stderr);
    assert!(total > 50, "{m:?}");
    // (The fixture burns CPU time by its own clock: 2/3 of it in alpha.)
    assert_share("inside_alpha", alpha / (alpha + beta), 2.0 / 3.0, n);
}

#[test]
fn a_program_with_its_own_sigprof_handler_is_refused() {
    let dir = TempDir::new("lib-handler");
    let exe = build(&dir);
    let out = run(&exe, "handler", None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ebusy=1") && stdout.contains("hits=1"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("own SIGPROF handler"), "{stderr}");
}

/// The C API gives the reason of a failed write as errno (ENOENT: the folder is gone), not EIO.
#[test]
fn a_failed_write_gives_its_errno() {
    let dir = TempDir::new("lib-gone");
    let exe = build(&dir);
    let folder = dir.join("out");
    std::fs::create_dir(&folder).unwrap();
    let _cpu = cpu_lock();
    let out = Command::new(&exe)
        .arg("gone")
        .arg(&folder)
        .output()
        .unwrap();
    let v = fixture_values(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(v["start"], 0.0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        v["enoent"],
        1.0,
        "{v:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn stop_without_start_and_start_twice_are_harmless() {
    let dir = TempDir::new("lib-misuse");
    let exe = build(&dir);
    let out = run(&exe, "misuse", None);
    let v = fixture_values(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(v["einval"], 1.0);
    assert_eq!(v["start"], 0.0);
    assert_eq!(v["ealready"], 1.0);
    assert_eq!(v["stopped"], 0.0);
}

/// The samples of `func` in folded `text`, and of them those whose stack holds `path` (the
/// callers down to a root): the whole stacks.
fn whole(text: &str, func: &str, path: &str) -> (u64, u64) {
    let mut all = 0;
    let mut full = 0;
    for l in text.lines() {
        let Some((stack, n)) = l.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        if stack.split(';').any(|f| f == func) {
            all += n;
            if stack.contains(path) {
                full += n;
            }
        }
    }
    (all, full)
}

/// Nearly every sample of the fixture's two working functions has its whole stack (a few may
/// be taken where the unwinding cannot go on: in a prologue, say).
fn assert_whole_stacks(text: &str, alpha: &str, late: &str) {
    for (func, path) in [("inside_alpha", alpha), ("late_thread_work", late)] {
        let (all, full) = whole(text, func, path);
        assert!(all > 0, "no sample in {func}: {text}");
        assert!(
            full as f64 >= 0.95 * all as f64,
            "{full} of {all} samples of {func} have the stack {path}: {text}"
        );
    }
}

#[test]
fn linked_statically() {
    let dir = TempDir::new("lib-static");
    let exe = build_with(&dir, true, "-fno-omit-frame-pointer");
    let folded = dir.join("static.folded");
    run(&exe, "split", Some(&folded));
    let text = std::fs::read_to_string(&folded).unwrap();
    assert_whole_stacks(&text, ";main;inside_alpha", ";late;late_thread_work");
}

#[test]
fn full_stacks_without_frame_pointers() {
    let dir = TempDir::new("lib-nofp");
    let exe = build_with(&dir, false, "-fomit-frame-pointer");
    let folded = dir.join("nofp.folded");
    run(&exe, "split", Some(&folded));
    let text = std::fs::read_to_string(&folded).unwrap();
    // Unwound from the CFI (.eh_frame) down to the entry point and the thread start.
    assert_whole_stacks(
        &text,
        "__libc_start_call_main;main;inside_alpha",
        "start_thread;late;late_thread_work",
    );
}
