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
    // (Counts are periods: a sample weighs each its signal stood for; σ counts samples.)
    let n = samples_behind(f.total(), f.total(), &String::from_utf8_lossy(&out.stderr));
    assert!(n > 200, "{n} samples");
    for func in ["work_alpha", "work_beta", "work_gamma"] {
        assert_share(func, f.share_leaf(func), truth[func], n);
        // Full stacks from main: at least 95% of the function's samples.
        let whole = f.complete_share(func, "main");
        assert!(
            whole >= 0.95,
            "{func}: {:.1}% of its stacks reach main",
            whole * 100.0
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
    // What the two runs measured of themselves, as one (they ran the same time).
    let stdout = String::from_utf8_lossy(&out.stdout);
    let runs: Vec<f64> = stdout
        .lines()
        .filter_map(|l| fixture_values(l).get("work_alpha").copied())
        .collect();
    assert_eq!(runs.len(), 2, "{stdout}");
    let truth = runs.iter().sum::<f64>() / 2.0;
    let n = samples_behind(f.total(), f.total(), &stderr);
    assert_share("work_alpha", f.share_leaf("work_alpha"), truth, n);
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
