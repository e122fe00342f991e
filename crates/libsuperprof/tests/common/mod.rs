//! Helpers of libsuperprof's tests: C fixtures compiled with gcc and linked with the library
//! that cargo built. Scratch folders, CPU locks, folded stacks and tolerances are the test
//! kit's (superprof-testkit).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(unused_imports)] // each test file uses some
pub use superprof_testkit::{
    assert_share, burn, cpu_lock, fixture_values, samples_behind, thread_cpu,
    workspace_dir as root, Folded, TempDir,
};

/// target/release (or debug), where libsuperprof.so is.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_owned()
}

/// How a fixture is linked with libsuperprof.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// libsuperprof.so, found through the rpath.
    Shared,
    /// libsuperprof.a.
    Static,
    /// Not at all (a program run by one that is).
    None,
    /// Not at all, and the program linked statically (no ld.so: nothing can be preloaded).
    FullyStatic,
}

/// Compiles `tests/fixtures/SOURCE` into `dir/OUT` with gcc, `flags`, and libsuperprof as `link`
/// says.
pub fn compile(dir: &Path, out: &str, source: &str, link: Link, flags: &[&str]) -> PathBuf {
    let lib = lib_dir();
    if matches!(link, Link::Shared | Link::Static) {
        assert!(
            lib.join("libsuperprof.so").exists(),
            "{} is missing: cargo build --release builds it",
            lib.join("libsuperprof.so").display()
        );
    }
    let exe = dir.join(out);
    let mut cmd = Command::new("gcc");
    cmd.args(flags)
        .arg("-pthread")
        .arg("-I")
        .arg(root().join("include"))
        .arg("-I")
        .arg(root().join("tests/fixtures"))
        .arg("-o")
        .arg(&exe)
        .arg(root().join("tests/fixtures").join(source));
    match link {
        Link::Shared => {
            cmd.arg("-L")
                .arg(&lib)
                .arg(format!("-Wl,-rpath,{}", lib.display()))
                .arg("-lsuperprof");
        }
        Link::Static => {
            cmd.arg(lib.join("libsuperprof.a")).args(["-ldl", "-lm"]);
        }
        Link::None => {}
        Link::FullyStatic => {
            cmd.arg("-static");
        }
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}
