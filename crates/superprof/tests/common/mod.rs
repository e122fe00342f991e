//! Helpers of the integration tests: compile C fixtures with gcc, run the real superprof
//! binary, read folded stacks. Tests that measure CPU shares take a global lock so that they
//! do not compete for this machine's two cores.
#![allow(dead_code)]

pub mod guest;
pub mod pprof;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static CPU: RwLock<()> = RwLock::new(());

/// Serializes CPU-heavy tests: one at a time, and none beside a test that holds
/// [`cpu_share`].
pub fn cpu_lock() -> RwLockWriteGuard<'static, ()> {
    CPU.write().unwrap_or_else(|e| e.into_inner())
}

/// Taken by the lighter tests of a file whose timing tests must run alone: they run side by
/// side, never beside a test holding [`cpu_lock`].
pub fn cpu_share() -> RwLockReadGuard<'static, ()> {
    CPU.read().unwrap_or_else(|e| e.into_inner())
}

/// The superprof binary, run in a scratch folder of this test process (record writes
/// superprof.parquet into the current folder when no -o is given).
pub fn superprof() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_superprof"));
    c.current_dir(scratch_dir());
    c
}

/// A folder shared by the tests of this process, writable by everyone (for the tests that run
/// superprof as an unprivileged user).
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

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("superprof-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Writable by other users, for the unprivileged-user tests.
        let _ = Command::new("chmod").arg("777").arg(&dir).status();
        TempDir(dir)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles C sources from tests/fixtures into `dir/out` with gcc and the given flags.
pub fn compile(dir: &TempDir, out: &str, sources: &[&str], flags: &[&str]) -> PathBuf {
    let exe = dir.path(out);
    let mut cmd = Command::new("gcc");
    cmd.args(flags)
        .arg("-I")
        .arg(fixtures_dir())
        .arg("-o")
        .arg(&exe);
    for s in sources {
        cmd.arg(fixtures_dir().join(s));
    }
    let out = cmd.output().expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

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

/// Runs `superprof record -q -o DIR/record.folded -- CMD...` and reads the folded stacks.
pub fn record_folded(dir: &TempDir, cmd: &[&std::ffi::OsStr]) -> (Output, Folded) {
    let folded = dir.path("record.folded");
    let out = run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&folded)
            .arg("--")
            .args(cmd),
    );
    (out, Folded::read(&folded))
}

/// Folded stacks: frames root first, with their count.
#[derive(Debug)]
pub struct Folded(pub Vec<(Vec<String>, u64)>);

impl Folded {
    pub fn read(path: &Path) -> Folded {
        let text = std::fs::read_to_string(path).expect("folded output exists");
        Folded::parse(&text)
    }

    pub fn parse(text: &str) -> Folded {
        Folded(
            text.lines()
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let (stack, n) = l.rsplit_once(' ').expect("count");
                    (
                        stack.split(';').map(str::to_owned).collect(),
                        n.parse().expect("number"),
                    )
                })
                .collect(),
        )
    }

    pub fn total(&self) -> u64 {
        self.0.iter().map(|(_, n)| n).sum()
    }

    /// Of the samples whose leaf is `leaf`, the share whose stack is whole: `via` calls it
    /// directly (main calling a work function).
    pub fn complete_share(&self, leaf: &str, via: &str) -> f64 {
        let (mut all, mut whole) = (0, 0);
        for (s, n) in &self.0 {
            if s.last().is_some_and(|x| x == leaf) {
                all += n;
                if s.len() >= 2 && s[s.len() - 2] == via {
                    whole += n;
                }
            }
        }
        whole as f64 / all.max(1) as f64
    }

    /// Share of samples whose stack passes through a frame named `f`.
    pub fn share_through(&self, f: &str) -> f64 {
        let n: u64 = self
            .0
            .iter()
            .filter(|(s, _)| s.iter().skip(1).any(|x| x == f))
            .map(|(_, n)| n)
            .sum();
        n as f64 / self.total() as f64
    }

    /// Share of samples whose leaf frame is `f`.
    pub fn share_leaf(&self, f: &str) -> f64 {
        let n: u64 = self
            .0
            .iter()
            .filter(|(s, _)| s.last().is_some_and(|x| x == f))
            .map(|(_, n)| n)
            .sum();
        n as f64 / self.total() as f64
    }

    /// Share of samples per root frame (thread name).
    pub fn share_per_root(&self) -> BTreeMap<String, f64> {
        let mut m: BTreeMap<String, u64> = BTreeMap::new();
        for (s, n) in &self.0 {
            *m.entry(s[0].clone()).or_default() += n;
        }
        let t = self.total() as f64;
        m.into_iter().map(|(k, v)| (k, v as f64 / t)).collect()
    }
}

/// Parses "key=value" pairs printed by a fixture.
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
    let sigma = (truth * (1.0 - truth) / n.max(1) as f64).sqrt();
    let allowed = 4.0 * sigma + 0.005;
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

/// A sample count against the CPU time it stands for, whatever rate this machine delivers
/// (on this VM cpu-clock gives about half the rate asked): never more than `asked_hz` (no
/// sample twice) and never fewer than the slowest scheduler tick, 100 Hz (a timer that fires
/// at all fires each tick), each with 4σ of Poisson noise.
pub fn assert_sample_count(what: &str, n: u64, cpu_seconds: f64, asked_hz: f64) {
    let (low, high) = (100.0 * cpu_seconds, asked_hz * cpu_seconds);
    assert!(
        n as f64 >= low - 4.0 * low.sqrt() && n as f64 <= high + 4.0 * high.sqrt(),
        "{what}: {n} samples in {cpu_seconds:.3} s of CPU time: not between 100 and {asked_hz} Hz"
    );
}

pub fn assert_close(what: &str, measured: f64, truth: f64, points: f64) {
    let diff = (measured - truth).abs() * 100.0;
    assert!(
        diff <= points,
        "{what}: superprof says {:.2}%, ground truth {:.2}% (off by {diff:.2} points, allowed {points})",
        measured * 100.0,
        truth * 100.0
    );
}

/// The bytes of the executable's code in a running process.
pub fn code_bytes(pid: u32, exe: &std::path::Path) -> Vec<u8> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let line = maps
        .lines()
        .find(|l| l.contains("r-xp") && l.ends_with(exe.to_str().unwrap()))
        .expect("code mapping");
    let (a, b) = line
        .split_whitespace()
        .next()
        .unwrap()
        .split_once('-')
        .unwrap();
    let (a, b) = (
        u64::from_str_radix(a, 16).unwrap(),
        u64::from_str_radix(b, 16).unwrap(),
    );
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut buf = vec![0u8; (b - a) as usize];
    mem.read_exact_at(&mut buf, a).unwrap();
    buf
}

/// The /proc status of a process that superprof has let go: it must be alive, untraced and
/// not stopped.
pub fn assert_running_untraced(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    assert!(status.contains("TracerPid:\t0"), "still traced:\n{status}");
    for stopped in ["State:\tt", "State:\tT", "State:\tZ"] {
        assert!(!status.contains(stopped), "left stopped or dead:\n{status}");
    }
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

/// A failure with one line on stderr that mentions `mention`.
pub fn assert_one_line_error(out: &Output, mention: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains(mention), "{}", lines[0]);
}

/// Nothing to show for a command that ran (no samples, a region never found): one line on
/// stderr that mentions `mention`, and the command's own exit status (issue 12).
pub fn assert_one_line_notice(out: &Output, mention: &str, status: i32) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(status), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains(mention), "{}", lines[0]);
}

/// Moves `exe`'s DWARF into the separate file `debug` (objcopy --only-keep-debug, then
/// --strip-debug: the symbol table stays).
pub fn split_debug(exe: &Path, debug: &Path) {
    run_ok(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(exe)
            .arg(debug),
    );
    run_ok(Command::new("objcopy").arg("--strip-debug").arg(exe));
}

/// superprof run as the unprivileged user 65534 (setpriv), in the scratch folder.
pub fn superprof_as_nobody() -> Command {
    let mut c = Command::new("setpriv");
    c.current_dir(scratch_dir()).args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        env!("CARGO_BIN_EXE_superprof"),
    ]);
    c
}

/// One HTTP request: (request line, headers in lower case, body).
pub type HttpRequest = (String, Vec<(String, String)>, Vec<u8>);

/// Reads one HTTP/1.1 request from `stream` and answers it with `status`.
fn serve_http_request(stream: std::net::TcpStream, status: &str) -> HttpRequest {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut r = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse().unwrap())
        .expect("a content-length");
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    let mut w = stream;
    write!(
        w,
        "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    (line.trim_end().to_owned(), headers, body)
}

/// Serves one HTTP/1.1 request with `status`, and gives it back (the push tests' server).
pub fn serve_http_once(
    listener: std::net::TcpListener,
    status: &'static str,
) -> std::thread::JoinHandle<HttpRequest> {
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        serve_http_request(stream, status)
    })
}

/// Serves every request with 200 OK, for as long as the test runs; they are kept in order.
pub fn serve_http_all(
    listener: std::net::TcpListener,
) -> std::sync::Arc<std::sync::Mutex<Vec<HttpRequest>>> {
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = got.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let request = serve_http_request(stream, "200 OK");
            kept.lock().unwrap().push(request);
        }
    });
    got
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
    let start = std::time::Instant::now();
    while std::fs::read_link(format!("/proc/{pid}/exe")).ok() != Some(want.clone()) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "process {pid} never ran {}",
            exe.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Waits (10 s at most) until superprof (`pid`) has its perf events open: it samples.
pub fn wait_sampling(pid: u32) {
    let start = std::time::Instant::now();
    loop {
        let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|l| l.to_string_lossy().contains("perf_event"))
            });
        if open {
            return;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "superprof ({pid}) opened no perf event"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
