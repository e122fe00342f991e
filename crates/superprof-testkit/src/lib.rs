//! superprof-testkit: what every test suite of the workspace needs, once (a `publish = false`
//! dev-dependency of the crates whose tests run real processes):
//!
//! - fixtures: [`fixtures_dir`], [`compile`] (gcc), [`run_ok`], [`spawn_ready`];
//! - scratch folders: [`TempDir`] (one per test, removed after), [`scratch_dir`];
//! - CPU locks: [`cpu_lock`] and [`cpu_share`], so that tests that measure CPU shares do not
//!   compete for this machine's two cores;
//! - readings: [`Folded`] stacks, [`fixture_values`] (what a fixture prints of itself),
//!   [`code_bytes`] of a running process, [`thread_cpu`];
//! - tolerances from statistics: [`assert_share`] (4σ of a binomial share),
//!   [`assert_sample_count`] (a count against the CPU time it stands for, at the rate
//!   [`perf_cpu_clock_rate`] measures), [`samples_behind`] (the samples a weighted share
//!   stands on);
//! - generated programs that count their own calls: [`exact_gen`];
//! - processes: [`is_root`], [`require_root`], [`wait_exec`], [`assert_running_untraced`].
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod exact_gen;
mod folded;

pub use folded::Folded;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

static CPU: RwLock<()> = RwLock::new(());

/// Serializes CPU-heavy tests of one test binary: one at a time, and none beside a test that
/// holds [`cpu_share`].
pub fn cpu_lock() -> RwLockWriteGuard<'static, ()> {
    CPU.write().unwrap_or_else(|e| e.into_inner())
}

/// Taken by the lighter tests of a file whose timing tests must run alone: they run side by
/// side, never beside a test holding [`cpu_lock`].
pub fn cpu_share() -> RwLockReadGuard<'static, ()> {
    CPU.read().unwrap_or_else(|e| e.into_inner())
}

/// The workspace's root folder.
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The workspace's test fixtures (tests/fixtures).
pub fn fixtures_dir() -> PathBuf {
    workspace_dir().join("tests/fixtures")
}

/// A folder shared by the tests of this process (a working folder for commands that write
/// beside themselves), writable by everyone (for the tests that run as an unprivileged user).
pub fn scratch_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("superprof-test-cwd-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let _ = Command::new("chmod").arg("777").arg(&d).status();
        d
    })
    .clone()
}

/// A scratch folder of one test, removed when dropped; writable by every user (for the
/// tests that run programs as nobody there).
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh, empty folder named after `tag`, this process and a counter.
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("superprof-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let _ = Command::new("chmod").arg("777").arg(&dir).status();
        TempDir(dir)
    }

    /// `name` in this folder.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles C sources from tests/fixtures into `dir/out` with gcc and `flags` (the fixtures'
/// folder is on the include path).
pub fn compile(dir: impl AsRef<Path>, out: &str, sources: &[&str], flags: &[&str]) -> PathBuf {
    compile_with("gcc", dir, out, sources, flags)
}

/// [`compile`] with compiler `cc` (a cross compiler: aarch64-linux-gnu-gcc).
pub fn compile_with(
    cc: &str,
    dir: impl AsRef<Path>,
    out: &str,
    sources: &[&str],
    flags: &[&str],
) -> PathBuf {
    let exe = dir.as_ref().join(out);
    let mut cmd = Command::new(cc);
    cmd.args(flags)
        .arg("-I")
        .arg(fixtures_dir())
        .arg("-o")
        .arg(&exe);
    for s in sources {
        cmd.arg(fixtures_dir().join(s));
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cc} runs (scripts/test installs it): {e}"));
    assert!(
        out.status.success(),
        "{cc} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs `cmd` and asserts that it succeeded, with its output in the message if not.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("command runs");
    assert!(
        out.status.success(),
        "{:?} failed ({:?}):\nstdout: {}\nstderr: {}",
        cmd,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Starts a fixture that prints "ready" once it runs, and waits for that line. The child's
/// stdout stays open (in the returned reader) so that the fixture never sees a closed pipe.
pub fn spawn_ready(
    exe: &Path,
    args: &[&str],
) -> (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
) {
    use std::io::BufRead;
    let mut child = Command::new(exe)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    (child, lines)
}

/// The "key=value" pairs a fixture printed (what it measured of itself).
pub fn fixture_values(stdout: &str) -> BTreeMap<String, f64> {
    stdout
        .split_whitespace()
        .filter_map(|w| {
            let (k, v) = w.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// A share measured on `n` samples against the fixture's own figure `truth`: within 4σ of a
/// binomial share (σ = √(p(1−p)/n)), plus half a point for the fixture's own rounding and
/// clock.
pub fn assert_share(what: &str, measured: f64, truth: f64, n: u64) {
    assert_share_with(what, measured, truth, n, 0.0);
}

/// [`assert_share`], `extra` wider: what a known cause may move the share by beyond
/// sampling's noise (samples lost: a share can move by at most the share of them lost).
pub fn assert_share_with(what: &str, measured: f64, truth: f64, n: u64, extra: f64) {
    let sigma = (truth * (1.0 - truth) / n.max(1) as f64).sqrt();
    let allowed = 4.0 * sigma + 0.005 + extra;
    let diff = (measured - truth).abs();
    assert!(
        diff <= allowed,
        "{what}: superprof says {:.2}% of {n} samples, ground truth {:.2}% (off by {:.2} points, \
         4σ allows {:.2})",
        measured * 100.0,
        truth * 100.0,
        diff * 100.0,
        allowed * 100.0
    );
}

/// A sample count against the CPU time it stands for, at the rate this machine delivers now:
/// `delivered_hz` (perf's own, [`perf_cpu_clock_rate`], taken as at most the rate asked: on
/// this VM cpu-clock has given from about half the rate asked to all of it, with the load),
/// from half of it (a sampler of its own is not perf, and the load moves between the two
/// measures: 630 Hz against perf's 999 once, in the suite) to `asked_hz` (no sample twice;
/// not a bound from the rate measured earlier: the host's load changes within a run, and a
/// rate measured while it stole time is lower than the one a calmer moment gives), each with
/// 4σ of Poisson noise: twice the rate asked fails, and a third of the rate delivered.
pub fn assert_sample_count(what: &str, n: u64, cpu_seconds: f64, asked_hz: f64, delivered_hz: f64) {
    let rate = delivered_hz.min(asked_hz);
    let low = 0.5 * rate * cpu_seconds;
    let high = asked_hz * cpu_seconds;
    assert!(
        n as f64 >= low - 4.0 * low.sqrt() && n as f64 <= high + 4.0 * high.sqrt(),
        "{what}: {n} samples in {cpu_seconds:.3} s of CPU time: not between {:.0} and {:.0} \
         (perf delivers {delivered_hz:.0} Hz of the {asked_hz} asked here now)",
        low / cpu_seconds,
        high / cpu_seconds
    );
}

/// The rate perf's cpu-clock event delivers at `asked_hz` on this machine now: samples per
/// second of CPU time of `perf record -e cpu-clock -F HZ` of a program that spins 0.6 s of
/// CPU time and prints how much it used. Measured once per test process and rate.
pub fn perf_cpu_clock_rate(asked_hz: u32) -> f64 {
    static RATES: std::sync::Mutex<BTreeMap<u32, f64>> = std::sync::Mutex::new(BTreeMap::new());
    let mut rates = RATES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&r) = rates.get(&asked_hz) {
        return r;
    }
    let dir = TempDir::new("perf-rate");
    let data = dir.path("perf.data");
    let out = run_ok(
        Command::new("perf")
            .args([
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-F",
                &asked_hz.to_string(),
                "-o",
            ])
            .arg(&data)
            .args([
                "--",
                "python3",
                "-c",
                "import time\nwhile time.process_time() < 0.6: pass\nprint(time.process_time())",
            ]),
    );
    let cpu: f64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the spinner's CPU time");
    let script = run_ok(
        Command::new("perf")
            .args(["script", "-F", "comm", "-i"])
            .arg(&data),
    );
    let samples = String::from_utf8_lossy(&script.stdout).lines().count();
    let rate = samples as f64 / cpu;
    rates.insert(asked_hz, rate);
    rate
}

/// How many samples stand behind `part` of a profile's `total` periods, when superprof's
/// summary on `stderr` ("superprof: N samples ...") says how many samples the whole profile
/// came from: a sample of libsuperprof weighs every period its signal stood for, and a share's
/// σ counts samples, not periods. Without such a line, `part` itself.
pub fn samples_behind(part: u64, total: u64, stderr: &str) -> u64 {
    // N of the "superprof: N samples ..." line (the largest: preload's merged profile's
    // line beside any of its processes').
    let said: u64 = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("superprof: ")?.split_once(' '))
        .filter(|(_, rest)| rest.starts_with("samples"))
        .filter_map(|(n, _)| n.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    if said == 0 || total == 0 {
        return part;
    }
    ((part as f64 * said as f64 / total as f64).round() as u64).max(1)
}

/// A share against a figure with a tolerance in points that is not statistical (a peer's
/// rounding, a clock's granularity): say why where it is used.
pub fn assert_close(what: &str, measured: f64, truth: f64, points: f64) {
    let diff = (measured - truth).abs() * 100.0;
    assert!(
        diff <= points,
        "{what}: superprof says {:.2}%, ground truth {:.2}% (off by {diff:.2} points, allowed {points})",
        measured * 100.0,
        truth * 100.0
    );
}

/// The bytes of `exe`'s code (its executable mapping) in running process `pid`.
pub fn code_bytes(pid: u32, exe: &Path) -> Vec<u8> {
    let m = superprof_unwind::maps::executable_mappings(pid)
        .unwrap()
        .into_iter()
        .find(|m| m.path == exe)
        .expect("code mapping");
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    // The executable segments' bytes only, not the rest of their last page: the in-process
    // engine writes its system call stub there for a while, never run and left behind by a
    // superprof killed meanwhile.
    let image = superprof_unwind::ElfImage::open(exe).expect("an ELF file");
    let bias = image.bias_for_mapping(m.start, m.end - m.start, m.offset);
    let mut buf = Vec::new();
    for r in image.executable_ranges() {
        let start = r.start.wrapping_add(bias).max(m.start);
        let end = r.end.wrapping_add(bias).min(m.end);
        if start < end {
            let mut part = vec![0u8; (end - start) as usize];
            mem.read_exact_at(&mut part, start).unwrap();
            buf.extend(part);
        }
    }
    assert!(
        !buf.is_empty(),
        "no code of {} in its mapping",
        exe.display()
    );
    buf
}

/// The /proc status of a process a tracer has let go: it must be alive, untraced and not
/// stopped.
pub fn assert_running_untraced(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    assert!(status.contains("TracerPid:\t0"), "still traced:\n{status}");
    for stopped in ["State:\tt", "State:\tT", "State:\tZ"] {
        assert!(!status.contains(stopped), "left stopped or dead:\n{status}");
    }
}

/// Whether the tests run as root (they do: scripts/test installs packages, and CI runs it as
/// root).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

/// Fails a test that needs root (`what` for) when run otherwise, rather than passing it
/// unchecked.
pub fn require_root(what: &str) {
    assert!(
        is_root(),
        "this test needs root ({what}); the suite runs as root (scripts/test)"
    );
}

/// Waits (10 s at most) until process `pid` runs `exe`: its exec is done.
pub fn wait_exec(pid: u32, exe: &Path) {
    let want = std::fs::canonicalize(exe).unwrap();
    let start = Instant::now();
    while std::fs::read_link(format!("/proc/{pid}/exe")).ok() != Some(want.clone()) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "process {pid} never ran {}",
            exe.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// CPU time the hypervisor took from this machine's CPUs since [`Steal::start`]: the `steal`
/// column of /proc/stat, all CPUs summed (a bound on what any one thread lost). Clocks differ
/// by up to this much: a thread's CPU clock (and /proc's schedstat, the ptrace sampler's) leaves
/// stolen time out; perf's task-clock counts it; cpu-clock's timer, firing late after it, drops
/// the periods it missed; a wall clock counts it. On a busy host (CI's, once: the suite ran
/// twice as long as here) it is tens of milliseconds a second.
pub struct Steal(f64);

impl Steal {
    /// From now.
    pub fn start() -> Steal {
        Steal(steal_seconds(
            &std::fs::read_to_string("/proc/stat").unwrap_or_default(),
        ))
    }

    /// Seconds stolen since the start.
    pub fn seconds(&self) -> f64 {
        let now = steal_seconds(&std::fs::read_to_string("/proc/stat").unwrap_or_default());
        (now - self.0).max(0.0)
    }
}

/// The `cpu` line's steal (its eighth figure), in seconds: /proc/stat counts in USER_HZ, 100
/// on every Linux architecture.
fn steal_seconds(stat: &str) -> f64 {
    stat.lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .and_then(|l| l.split_whitespace().nth(7))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |ticks| ticks / 100.0)
}

/// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu() -> Duration {
    Duration::from_nanos(superprof_unwind::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID))
}

/// Burns `d` of the calling thread's CPU time (in this function: not inlined).
#[inline(never)]
pub fn burn(d: Duration) -> u64 {
    let end = thread_cpu() + d;
    let mut x = 1u64;
    while thread_cpu() < end {
        for _ in 0..20_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_within_four_sigma_passes() {
        // p = 0.5, n = 10,000: σ = 0.005, 4σ + 0.5 point = 2.5 points.
        assert_share("in", 0.524, 0.5, 10_000);
        assert_sample_count("in", 500, 1.0, 999.0, 500.0);
        assert_sample_count("all", 990, 1.0, 999.0, 999.0);
    }

    #[test]
    fn samples_behind_periods_come_from_the_summary() {
        let stderr = "x\nsuperprof: 250 samples standing for 1000 periods (0 dropped)\n";
        assert_eq!(samples_behind(400, 1000, stderr), 100);
        assert_eq!(samples_behind(400, 1000, "no summary"), 400);
        // preload: the merged profile's line.
        let merged = "superprof: 300 samples from 2 processes (3 threads) in 1.00 s; 0 dropped";
        assert_eq!(samples_behind(1200, 1200, merged), 300);
    }

    #[test]
    #[should_panic(expected = "4σ allows 2.50")]
    fn a_share_beyond_four_sigma_fails() {
        assert_share("out", 0.526, 0.5, 10_000);
    }

    #[test]
    #[should_panic(expected = "not between 250 and 999")]
    fn twice_the_asked_rate_fails() {
        assert_sample_count("out", 2_000, 1.0, 999.0, 500.0);
    }

    #[test]
    fn the_asked_rate_passes_whatever_was_delivered_before() {
        assert_sample_count("out", 990, 1.0, 999.0, 500.0);
    }

    #[test]
    #[should_panic(expected = "not between 250 and 999")]
    fn a_third_of_the_delivered_rate_fails() {
        assert_sample_count("out", 166, 1.0, 999.0, 500.0);
    }

    #[test]
    fn steal_is_the_cpu_lines_eighth_figure() {
        let stat = "cpu  9202562 21767 986053 5540803 37383 0 39524 252100 0 0\n\
                    cpu0 1 2 3 4 5 6 7 8 0 0\n";
        assert_eq!(steal_seconds(stat), 2521.0);
        assert_eq!(steal_seconds("intr 1 2"), 0.0);
    }

    #[test]
    fn fixture_values_are_read_from_key_value_words() {
        let v = fixture_values("alpha=0.6 beta=0.3 noise x=y\ncpu_ms=812");
        assert_eq!(v.len(), 3);
        assert_eq!(v["cpu_ms"], 812.0);
    }
}
