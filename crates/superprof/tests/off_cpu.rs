//! `record --off-cpu`: where threads wait, against what the fixture measures of itself
//! (tests/fixtures/offcpu.c), by each mechanism: sched:sched_switch (root), the
//! context-switches event (an ordinary user at perf_event_paranoid 1), and the ptrace
//! sampler's wall-clock mode (an ordinary user at paranoid 2).
//!
//! Every test holds the CPU lock: they measure time shares, and one of them changes
//! perf_event_paranoid for a moment.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// The fixture, built once per test.
fn fixture(dir: &TempDir) -> PathBuf {
    compile(dir, "offcpu", &["offcpu.c"], &["-O1", "-g", "-pthread"])
}

/// A folder an ordinary user may write into.
fn open_folder(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    run_ok(Command::new("chmod").arg("777").arg(&dir.0));
    dir
}

/// The off-CPU profile of one run: folded stacks, the fixture's own figures, stderr.
struct Run {
    folded: Folded,
    truth: BTreeMap<String, f64>,
    stderr: String,
    parquet: PathBuf,
    frequency: f64,
    /// Seconds the host stole from this machine's CPUs during the run (see `Steal`): the
    /// samplers' CPU clocks leave them out, the fixture's wall clock counts them.
    stolen: f64,
}

fn record(mut superprof: Command, dir: &TempDir, args: &[&str], cmd: &[&std::ffi::OsStr]) -> Run {
    let folded = dir.path("off.folded");
    let parquet = dir.path("off.parquet");
    let steal = Steal::start();
    let out: Output = run_ok(
        superprof
            .args(["record", "-q", "--off-cpu", "-o"])
            .arg(&folded)
            .arg("-o")
            .arg(&parquet)
            .args(args)
            .arg("--")
            .args(cmd),
    );
    Run {
        folded: Folded::read(&folded),
        truth: fixture_values(&String::from_utf8_lossy(&out.stdout)),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        parquet,
        frequency: 999.0,
        stolen: steal.seconds(),
    }
}

/// Records `offcpu phases` (run by `superprof`), checks that `mechanism` recorded the waits
/// and the main thread's shares: computing, asleep, on the pipe.
fn phases(superprof: Command, dir: &TempDir, args: &[&str], mechanism: &str) -> Run {
    let exe = fixture(dir);
    let r = record(superprof, dir, args, &[exe.as_os_str(), "phases".as_ref()]);
    assert!(
        r.stderr.contains(&format!("off-CPU time by {mechanism}")),
        "{}",
        r.stderr
    );
    r.check_shares(&[
        ("compute", "compute"),
        ("do_sleep", "sleep"),
        ("wait_pipe", "pipe"),
    ]);
    r
}

impl Run {
    /// The lines of one thread (the folded root is its name).
    fn thread(&self, name: &str) -> Folded {
        Folded(
            self.folded
                .0
                .iter()
                .filter(|(s, _)| s[0] == name)
                .cloned()
                .collect(),
        )
    }

    /// Seconds a thread's lines stand for (counts are sampling periods).
    fn seconds(&self, name: &str) -> f64 {
        self.thread(name).total() as f64 / self.frequency
    }

    /// Checks the main thread's share through each function against the fixture's own
    /// figure for it (seconds, over `wall`), within 5 points, and that its profile adds up to
    /// its wall-clock time (each with what the host stole meanwhile).
    fn check_shares(&self, shares: &[(&str, &str)]) {
        let main = self.thread("offcpu");
        let wall = self.truth["wall"];
        for (function, key) in shares {
            assert_close(
                &format!("{function} (main thread)\n{}", self.stderr),
                main.share_through(function),
                self.truth[*key] / wall,
                self.points(5.0, wall),
            );
        }
        let seconds = self.seconds("offcpu");
        assert!(
            (seconds - wall).abs() <= 0.05 * wall + 0.01 + self.stolen,
            "the main thread's profile adds up to {seconds:.3} s, its wall time is {wall:.3} s \
             ({:.3} s stolen)\n{}",
            self.stolen,
            self.stderr
        );
    }

    /// `points` of a share of `wall` seconds, widened by the points the stolen time makes.
    fn points(&self, points: f64, wall: f64) -> f64 {
        points + 100.0 * self.stolen / wall
    }

    /// The leaf frames of the stacks through `function`, with their counts.
    fn leaves_under(&self, function: &str) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for (s, n) in &self.folded.0 {
            if s.iter().any(|f| f == function) {
                *m.entry(s.last().unwrap().clone()).or_default() += n;
            }
        }
        m
    }

    /// The share of a function's stacks that end in `leaf`.
    fn leaf_share_under(&self, function: &str, leaf: &str) -> f64 {
        let l = self.leaves_under(function);
        let total: u64 = l.values().sum();
        l.get(leaf).copied().unwrap_or(0) as f64 / total.max(1) as f64
    }
}

#[test]
fn root_records_waits_with_sched_switch() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("offcpu-root");
    let r = phases(superprof(), &dir, &[], "sched:sched_switch");
    // The waits are named after the system call, from the kernel frames.
    assert!(r.leaf_share_under("do_sleep", "[off-cpu: clock_nanosleep]") > 0.95);
    assert!(r.leaf_share_under("wait_pipe", "[off-cpu: read]") > 0.95);
    // The writer thread sleeps 0.2 s.
    let writer = r.seconds("writer");
    assert!((writer - 0.2).abs() < 0.02, "writer: {writer:.3} s");

    // report keeps one kind: on-CPU stacks never end in a wait, off-CPU ones always do.
    for (flag, off) in [("--on-cpu", false), ("--off-cpu", true)] {
        let f = dir.path(&format!("kind{off}.folded"));
        run_ok(
            superprof()
                .arg("report")
                .arg(&r.parquet)
                .arg(flag)
                .arg("-o")
                .arg(&f),
        );
        let kept = Folded::read(&f);
        assert!(kept.total() > 0, "{flag} kept nothing");
        for (s, n) in &kept.0 {
            let leaf = s.last().unwrap();
            let wait = leaf.starts_with("[off-cpu") || leaf == "[preempted]";
            assert_eq!(wait, off, "{flag} kept {s:?} {n}");
        }
    }
    // The top table has both columns.
    let out = run_ok(superprof().arg("report").arg(&r.parquet));
    let top = String::from_utf8_lossy(&out.stdout);
    assert!(
        top.contains("On-CPU ms") && top.contains("Off-CPU ms"),
        "{top}"
    );
    assert!(top.contains("[off-cpu: clock_nanosleep]"), "{top}");
}

/// 400 short threads one after another (a thread per request), each asleep 0.2 ms once: a
/// quarter of a sampling period each. Their time asleep adds up to what they measured of
/// themselves (each thread's time short of a period drawn as a clock would draw it: binomial,
/// within 4σ); before, a wait under half a period was dropped and none of them was seen.
#[test]
fn short_threads_waits_add_up() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("offcpu-short");
    let exe = fixture(&dir);
    let threads = 400.0;
    let r = record(
        superprof(),
        &dir,
        &[],
        &[exe.as_os_str(), "short".as_ref(), "400".as_ref()],
    );
    let periods: u64 = r
        .folded
        .0
        .iter()
        .filter(|(s, _)| s.iter().any(|f| f == "short_wait"))
        .filter(|(s, _)| s.last().is_some_and(|l| l.starts_with("[off-cpu")))
        .map(|(_, n)| n)
        .sum();
    let expected = r.truth["short_waited"] * r.frequency;
    // Each thread: one draw with p = its time over a period.
    let p = expected / threads;
    let sigma = (threads * p * (1.0 - p)).sqrt();
    assert!(
        (periods as f64 - expected).abs() <= 4.0 * sigma,
        "{periods} periods asleep in short_wait, the threads measured {expected:.1} \
         (4σ = {:.1})\n{}",
        4.0 * sigma,
        r.stderr
    );
}

#[test]
fn unprivileged_user_at_paranoid_2_gets_the_ptrace_wall_clock_mode() {
    let _cpu = cpu_lock();
    assert_eq!(paranoid(), 2, "this machine's perf_event_paranoid");
    let dir = open_folder("offcpu-user");
    let r = phases(superprof_as_nobody(), &dir, &[], "ptrace wall-clock");
    assert!(r.stderr.contains("wall-clock mode instead"), "{}", r.stderr);
    assert!(r.leaf_share_under("wait_pipe", "[off-cpu: read]") > 0.95);
}

fn paranoid() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Sets perf_event_paranoid, and puts the old value back when dropped.
struct Paranoid(String);

impl Paranoid {
    fn set(level: i32) -> Paranoid {
        const P: &str = "/proc/sys/kernel/perf_event_paranoid";
        let old = std::fs::read_to_string(P).unwrap();
        std::fs::write(P, level.to_string()).unwrap();
        Paranoid(old)
    }
}

impl Drop for Paranoid {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/perf_event_paranoid", self.0.trim());
    }
}

#[test]
fn unprivileged_user_at_paranoid_1_gets_context_switches_with_kernel_frames() {
    let _cpu = cpu_lock();
    let dir = open_folder("offcpu-p1");
    let r = {
        let _p = Paranoid::set(1);
        phases(superprof_as_nobody(), &dir, &[], "context-switches")
    };
    assert!(r.leaf_share_under("wait_pipe", "[off-cpu: read]") > 0.95);
}

#[test]
fn threads_blocked_on_a_mutex() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("offcpu-mutex");
    let exe = fixture(&dir);
    for (who, sampler) in [("root", "auto"), ("ptrace", "ptrace")] {
        let r = record(
            superprof(),
            &dir,
            &["--sampler", sampler],
            &[exe.as_os_str(), "mutex".as_ref()],
        );
        let main = r.thread("offcpu");
        let wall = r.truth["wall"];
        assert_close(
            &format!("lock_wait ({who})"),
            main.share_through("lock_wait"),
            r.truth["lock_wait"] / wall,
            r.points(5.0, wall),
        );
        assert!(
            r.leaf_share_under("lock_wait", "[off-cpu: futex]") > 0.95,
            "{who}: {:?}",
            r.leaves_under("lock_wait")
        );
        // The holder computes 0.4 s.
        let holder = r.thread("holder");
        let computing = holder.share_through("compute") * r.seconds("holder");
        assert!(
            (computing - 0.4).abs() < 0.04 + r.stolen,
            "{who}: holder computes {computing:.3} s ({:.3} s stolen)",
            r.stolen
        );
    }
}

#[test]
fn a_process_waiting_on_fsync_with_kernel_frames() {
    // With perf, kernel frames between the program's call and the wait; with ptrace, an
    // uninterruptible wait (D) read without a stop, which would wait for the disk.
    let _cpu = cpu_lock();
    let dir = TempDir::new("offcpu-fsync");
    let exe = fixture(&dir);
    let file = dir.path("data.bin");
    for sampler in ["auto", "ptrace"] {
        let r = record(
            superprof(),
            &dir,
            &["--sampler", sampler],
            &[
                exe.as_os_str(),
                "fsync".as_ref(),
                file.as_os_str(),
                "8".as_ref(),
            ],
        );
        // The wall-clock mode looks once a period: a share from n looks has
        // σ = √(p(1−p)/n); 4σ, or the issue's 5 points where that is wider.
        let main = r.thread("offcpu");
        let wall = r.truth["wall"];
        let truth = r.truth["fsync"] / wall;
        let looks = wall * 999.0;
        let sigma = (truth * (1.0 - truth) / looks).sqrt();
        let allowed = r.points(
            if sampler == "ptrace" {
                (400.0 * sigma).max(5.0)
            } else {
                5.0
            },
            wall,
        );
        assert_close(
            &format!("flush_file ({sampler})\n{}", r.stderr),
            main.share_through("flush_file"),
            truth,
            allowed,
        );
        let seconds = r.seconds("offcpu");
        assert!(
            (seconds - wall).abs() <= 0.05 * wall + 0.01 + r.stolen,
            "{sampler}: {seconds:.3} s of {wall:.3} ({:.3} s stolen)\n{}",
            r.stolen,
            r.stderr
        );
        // (fsync also works on the CPU, in the kernel: its waits are named fsync.)
        let leaves = r.leaves_under("flush_file");
        let waits: u64 = leaves
            .iter()
            .filter(|(l, _)| l.starts_with("[off-cpu") || *l == "[preempted]")
            .map(|(_, n)| n)
            .sum();
        let named = leaves.get("[off-cpu: fsync]").copied().unwrap_or(0);
        assert!(
            named as f64 > 0.9 * waits as f64 && waits > 0,
            "{sampler}: {leaves:?}"
        );
        if sampler == "auto" && cfg!(target_arch = "x86_64") {
            let through_kernel = r.folded.0.iter().any(|(s, _)| {
                let at = s.iter().position(|f| f == "flush_file");
                at.is_some_and(|i| s[i..].iter().any(|f| f == "__x64_sys_fsync"))
            });
            assert!(through_kernel, "{:?}", r.folded);
        }
    }
}

#[test]
fn attach_with_pid_and_duration() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("offcpu-attach");
    let exe = fixture(&dir);
    for sampler in ["auto", "ptrace"] {
        let mut child = Command::new(&exe)
            .args(["phases", "6"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let folded = dir.path("attach.folded");
        let steal = Steal::start();
        let out = run_ok(
            superprof()
                .args([
                    "record",
                    "-q",
                    "--off-cpu",
                    "--duration",
                    "2",
                    "--sampler",
                    sampler,
                ])
                .arg("-p")
                .arg(child.id().to_string())
                .arg("-o")
                .arg(&folded),
        );
        let stolen = steal.seconds();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let f = Folded::read(&folded);
        let main = Folded(
            f.0.iter()
                .filter(|(s, _)| s[0] == "offcpu")
                .cloned()
                .collect(),
        );
        // Two whole rounds of 1 s: 0.5 s computing, 0.3 s asleep, 0.2 s on the pipe (with
        // what the host stole meanwhile: the samplers' CPU clocks leave it out).
        for (function, truth) in [("compute", 0.5), ("do_sleep", 0.3), ("wait_pipe", 0.2)] {
            assert_close(
                &format!("{function} ({sampler}, attached, {stolen:.3} s stolen)\n{stderr}"),
                main.share_through(function),
                truth,
                5.0 + 100.0 * stolen / 2.0,
            );
        }
        let seconds = main.total() as f64 / 999.0;
        assert!(
            (seconds - 2.0).abs() < 0.15 + stolen,
            "{sampler}: {seconds:.3} s of 2 ({stolen:.3} s stolen)\n{stderr}"
        );
        // It runs on, undisturbed.
        assert!(child.try_wait().unwrap().is_none());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

#[test]
fn parquet_and_pprof_carry_the_kind_and_the_time() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("offcpu-files");
    let exe = fixture(&dir);
    let r = record(
        superprof(),
        &dir,
        &[],
        &[exe.as_os_str(), "phases".as_ref()],
    );
    // DuckDB: weight per kind; the off-CPU weight is the waits' time in periods.
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import duckdb, sys\n\
             for k, w in duckdb.sql(f\"select kind, sum(weight) from read_parquet('{sys.argv[1]}') \
             group by kind\").fetchall(): print(k, w)",
        )
        .arg(&r.parquet)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let by_kind: BTreeMap<String, f64> = text
        .lines()
        .filter_map(|l| {
            let (k, w) = l.split_once(' ')?;
            Some((k.to_owned(), w.parse().ok()?))
        })
        .collect();
    // Main thread: 0.3 s asleep and 0.2 s on the pipe; the writer: 0.2 s asleep.
    let off = by_kind.get("off-cpu").copied().unwrap_or(0.0) / 999.0;
    let truth = r.truth["sleep"] + r.truth["pipe"] + 0.2;
    assert!(
        (off - truth).abs() < 0.05,
        "off-CPU {off:.3} s, fixture {truth:.3} s: {text}"
    );
    assert!(by_kind.get("cpu").copied().unwrap_or(0.0) > 0.0, "{text}");

    // go tool pprof reads the off-CPU and wall sample types.
    let pb = dir.path("off.pb.gz");
    run_ok(superprof().arg("report").arg(&r.parquet).arg("-o").arg(&pb));
    for index in ["off-cpu", "wall"] {
        let out = Command::new("go")
            .args(["tool", "pprof", "-top", &format!("-sample_index={index}")])
            .arg(&pb)
            .env("HOME", &dir.0)
            .output()
            .expect("go runs (./scripts/test installs golang-go)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("[off-cpu: read]"), "{index}: {text}");
        assert!(
            text.contains("Type: ") && text.contains(index),
            "{index}: {text}"
        );
    }
}

#[test]
fn attach_to_a_thread_blocked_already() {
    // The thread is asleep before the recording starts and all through it: no switch out is
    // to come, the wait must still be seen (with perf, from /proc at attach).
    let _cpu = cpu_lock();
    let dir = TempDir::new("offcpu-blocked");
    let exe = fixture(&dir);
    for sampler in ["auto", "ptrace"] {
        let (mut child, mut lines) = spawn_ready(&exe, &["sleep", "2.5"]);
        let folded = dir.path("blocked.folded");
        let out = run_ok(
            superprof()
                .args([
                    "record",
                    "-q",
                    "--off-cpu",
                    "--duration",
                    "1",
                    "--sampler",
                    sampler,
                ])
                .arg("-p")
                .arg(child.id().to_string())
                .arg("-o")
                .arg(&folded),
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let f = Folded::read(&folded);
        let seconds = f.total() as f64 / 999.0;
        assert!(
            (seconds - 1.0).abs() < 0.08,
            "{sampler}: {seconds:.3} s of 1\n{stderr}"
        );
        let waits: u64 =
            f.0.iter()
                .filter(|(s, _)| {
                    s.iter().any(|x| x == "do_sleep")
                        && s.last().unwrap() == "[off-cpu: clock_nanosleep]"
                })
                .map(|(_, n)| n)
                .sum();
        assert!(
            waits as f64 > 0.95 * f.total() as f64,
            "{sampler}: {:?}",
            f.0
        );
        // Its sleep lasted its whole time.
        let slept = fixture_values(&lines.next().unwrap().unwrap())["slept"];
        assert!((slept - 2.5).abs() < 0.05, "{sampler}: slept {slept}");
        child.wait().unwrap();
    }
}

#[test]
fn time_waiting_for_a_cpu_is_preempted() {
    // The fixture shares one CPU with a spinner: besides its waits, what its wall time has
    // more than its CPU time is time it could have run.
    let _cpu = cpu_lock();
    let dir = TempDir::new("offcpu-preempt");
    let exe = fixture(&dir);
    let mut spinner = Command::new("taskset")
        .args(["-c", "0", "sh", "-c", "while :; do :; done"])
        .spawn()
        .unwrap();
    for sampler in ["auto", "ptrace"] {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", "0", env!("CARGO_BIN_EXE_superprof")])
            .current_dir(scratch_dir());
        let r = record(
            cmd,
            &dir,
            &["--sampler", sampler],
            &[exe.as_os_str(), "phases".as_ref()],
        );
        let main = r.thread("offcpu");
        let t = &r.truth;
        let runnable = (t["wall"] - t["cpu"] - t["sleep"] - t["pipe"]) / t["wall"];
        assert!(runnable > 0.1, "the spinner took too little: {t:?}");
        assert_close(
            &format!("[preempted] ({sampler})\n{}", r.stderr),
            main.share_leaf("[preempted]"),
            runnable,
            5.0,
        );
        let seconds = r.seconds("offcpu");
        assert!(
            (seconds - t["wall"]).abs() <= 0.05 * t["wall"] + 0.01,
            "{sampler}: {seconds:.3} s of {:.3}\n{}",
            t["wall"],
            r.stderr
        );
    }
    spinner.kill().unwrap();
    spinner.wait().unwrap();
}

/// A Python program that measures its own waits: 0.3 s computing, time.sleep(0.3), 0.2 s on
/// a pipe (a thread writes after 0.2 s), 0.3 s for a lock another thread holds. (Reading its
/// modules may wait for the disk in `read`: the pipe is read with `readv`.)
const PYTHON_WAITS: &str = r#"
import ctypes, os, threading, time
def name(n):  # the thread's comm: the root of its folded stacks
    ctypes.CDLL(None).prctl(15, n.encode(), 0, 0, 0)
def compute(s):
    end = time.monotonic() + s
    x = 0
    while time.monotonic() < end:
        x += 1
def do_sleep(): time.sleep(0.3)
def wait_pipe(r): os.readv(r, [bytearray(1)])  # readv: imports read files too
def wait_lock(l):
    with l: pass
t0 = time.monotonic()
t = time.monotonic(); compute(0.3); c = time.monotonic() - t
t = time.monotonic(); do_sleep(); s = time.monotonic() - t
r, w = os.pipe()
threading.Thread(target=lambda: (name("writer"), time.sleep(0.2), os.write(w, b"x"))).start()
t = time.monotonic(); wait_pipe(r); p = time.monotonic() - t
lock = threading.Lock(); held = threading.Event()
def holder():
    name("holder")
    with lock:
        held.set(); time.sleep(0.3)
threading.Thread(target=holder).start(); held.wait()
t = time.monotonic(); wait_lock(lock); l = time.monotonic() - t
print(f"compute={c:.4f} sleep={s:.4f} pipe={p:.4f} lock={l:.4f} wall={time.monotonic() - t0:.4f}")
"#;

#[test]
fn debians_python_waits_as_it_measures_them() {
    // Debian's stripped python3.11 (scripts/test installs it): its waits, named after the
    // system call, against what the script measures of itself, by sched:sched_switch (root)
    // and by the wall-clock mode.
    let _cpu = cpu_lock();
    let python = Path::new("/usr/bin/python3.11");
    assert!(python.exists(), "scripts/test installs python3.11");
    let dir = open_folder("offcpu-python");
    let script = dir.path("waits.py");
    std::fs::write(&script, PYTHON_WAITS).unwrap();
    for (who, sampler) in [("root", "auto"), ("ptrace", "ptrace")] {
        let r = record(
            superprof(),
            &dir,
            &["--sampler", sampler],
            &[python.as_os_str(), script.as_os_str()],
        );
        // Python's main thread is named after the program.
        let main = r.thread("python3.11");
        let t = &r.truth;
        let through = |leaf: &str| {
            main.0
                .iter()
                .filter(|(s, _)| s.last().is_some_and(|l| l == leaf))
                .map(|(_, n)| *n as f64 / 999.0)
                .sum::<f64>()
        };
        for (leaf, key) in [
            ("[off-cpu: clock_nanosleep]", "sleep"),
            ("[off-cpu: readv]", "pipe"),
            ("[off-cpu: futex]", "lock"),
        ] {
            let seconds = through(leaf);
            assert!(
                (seconds - t[key]).abs() < 0.03,
                "{who}: {leaf} {seconds:.3} s, the script waited {:.3} s\n{}",
                t[key],
                r.stderr
            );
        }
        // The main thread lives from the script's start (its imports: longer with a cold
        // page cache) to the end of the recording (the summary's "in X s").
        let seconds = r.seconds("python3.11");
        let recorded: f64 = r
            .stderr
            .split(" threads in ")
            .nth(1)
            .or_else(|| r.stderr.split(" thread in ").nth(1))
            .and_then(|rest| rest.split(' ').next())
            .and_then(|x| x.parse().ok())
            .expect("the summary gives the recording's length");
        assert!(
            seconds > t["wall"] - 0.06 && seconds < recorded * 1.05,
            "{who}: the main thread adds up to {seconds:.3} s, the script ran {:.3} s, the \
             recording {recorded:.3} s\n{}",
            t["wall"],
            r.stderr
        );
    }
}
