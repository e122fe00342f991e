//! Helpers of libsuperprof's tests: C fixtures compiled with gcc and linked with the library
//! that cargo built, scratch folders, and a lock for the CPU-heavy runs.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

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

/// A scratch folder for one test, readable by every user (setuid tests run programs as
/// nobody there).
pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("libsuperprof-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// One CPU-heavy program at a time: CPU-time timers tick less for a process that shares its
/// core, and the split tests want their samples.
static CPU: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn cpu_lock() -> std::sync::MutexGuard<'static, ()> {
    CPU.lock().unwrap_or_else(|e| e.into_inner())
}

/// Samples per leaf function, and the total, from a folded file.
pub fn leaves(folded: &Path) -> (BTreeMap<String, u64>, u64) {
    let text = std::fs::read_to_string(folded).unwrap();
    let mut m = BTreeMap::new();
    let mut total = 0;
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        *m.entry(stack.rsplit(';').next().unwrap().to_owned())
            .or_insert(0) += n;
        total += n;
    }
    (m, total)
}

/// "key=value" pairs printed by a fixture.
pub fn values(stdout: &str) -> BTreeMap<String, f64> {
    stdout
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
        .collect()
}

/// CPU time of the calling thread.
pub fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Burns `d` of the calling thread's CPU time.
#[inline(never)]
pub fn burn(d: std::time::Duration) -> u64 {
    let end = thread_cpu() + d;
    let mut x = 1u64;
    while thread_cpu() < end {
        for _ in 0..20_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

/// A share measured on `n` samples against the program's own figure `truth`: within 4σ of a
/// binomial share (σ = √(p(1−p)/n)), plus half a point for the program's own clock.
pub fn assert_share(what: &str, measured: f64, truth: f64, n: u64) {
    let sigma = (truth * (1.0 - truth) / n.max(1) as f64).sqrt();
    let allowed = 4.0 * sigma + 0.005;
    assert!(
        (measured - truth).abs() <= allowed,
        "{what}: {:.2}% of {n} samples, the program measured {:.2}% (4σ allows {:.2} points)",
        measured * 100.0,
        truth * 100.0,
        allowed * 100.0
    );
}

/// Of the samples of a folded file whose leaf is `leaf`, the share whose stack ends with
/// `tail` (`main;inside_alpha`: called from main).
pub fn complete_share(folded: &Path, leaf: &str, tail: &str) -> f64 {
    let text = std::fs::read_to_string(folded).unwrap();
    let (mut all, mut whole) = (0u64, 0u64);
    for l in text.lines() {
        let Some((stack, n)) = l.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        if stack.rsplit(';').next() == Some(leaf) {
            all += n;
            if stack == tail || stack.ends_with(&format!(";{tail}")) {
                whole += n;
            }
        }
    }
    whole as f64 / all.max(1) as f64
}
