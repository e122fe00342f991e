//! `superprof preload`: an unmodified program with libsuperprof preloaded, against the split
//! the program measures itself; the programs it runs; its exit status.

mod common;

use common::*;

fn lib_built() {
    let lib = std::path::Path::new(env!("CARGO_BIN_EXE_superprof"))
        .parent()
        .unwrap()
        .join("libsuperprof.so");
    assert!(
        lib.exists(),
        "{} is missing: cargo build --release builds it",
        lib.display()
    );
}

#[test]
fn preload_matches_the_known_split() {
    lib_built();
    let _cpu = cpu_lock();
    let dir = TempDir::new("preload");
    let exe = compile(
        &dir,
        "split",
        &["split.c"],
        &["-O2", "-g", "-fno-omit-frame-pointer"],
    );
    let folded = dir.path("p.folded");
    let out = run_ok(
        superprof()
            .args(["preload", "-q", "-o"])
            .arg(&folded)
            .arg("--")
            .arg(&exe)
            .arg("2"),
    );
    let truth = fixture_values(&String::from_utf8_lossy(&out.stdout));
    let f = Folded::read(&folded);
    assert!(f.total() > 200, "{} samples", f.total());
    for func in ["work_alpha", "work_beta", "work_gamma"] {
        assert_close(func, f.share_leaf(func), truth[func], 5.0);
        // Full stacks from main.
        assert!(
            f.0.iter()
                .any(|(s, _)| s.ends_with(&["main".to_owned(), func.to_owned()])),
            "{func}"
        );
    }
}

#[test]
fn preload_follows_the_programs_a_shell_runs_and_keeps_the_exit_status() {
    lib_built();
    let _cpu = cpu_lock();
    let dir = TempDir::new("preload-sh");
    let exe = compile(
        &dir,
        "split",
        &["split.c"],
        &["-O2", "-g", "-fno-omit-frame-pointer"],
    );
    let folded = dir.path("sh.folded");
    let script = format!("{0} 0.5; {0} 0.5; exit 3", exe.display());
    let out = superprof()
        .args(["preload", "-q", "-o"])
        .arg(&folded)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("from 2 processes") || stderr.contains("from 3 processes"),
        "{stderr}"
    );
    let f = Folded::read(&folded);
    assert_close("work_alpha", f.share_leaf("work_alpha"), 0.5, 7.0);
}

#[test]
fn preload_bad_input() {
    let out = superprof()
        .args(["preload", "--", "/no/such/program"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "/no/such/program");
    let out = superprof()
        .args(["preload", "-o", "x.unknown", "--", "true"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "cannot tell the format");
}
