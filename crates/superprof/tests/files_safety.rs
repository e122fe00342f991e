//! Issue 12, item 7: superprof runs as root and writes into folders that other users own. No
//! name it uses there can be planted (temp files, the vDSO copy), outputs are private (0600),
//! a device, FIFO or symlink given as -o is written through, a debug link cannot point
//! elsewhere, and `syscalls -o` streams to its file.
#![allow(clippy::disallowed_macros)] // a test's own diagnostics

mod common;

use common::*;
use std::io::BufRead;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A folder owned by `nobody`, as a user's working folder or home would be.
fn folder_of_nobody(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    run_ok(Command::new("chown").arg("nobody").arg(&dir.0));
    run_ok(Command::new("chmod").arg("755").arg(&dir.0));
    dir
}

/// A root-only file that must come through untouched, in a folder of its own.
fn victim() -> (TempDir, PathBuf) {
    let dir = TempDir::new("victim");
    run_ok(Command::new("chmod").arg("700").arg(&dir.0));
    let file = dir.path("victim.txt");
    std::fs::write(&file, "precious\n").unwrap();
    (dir, file)
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o777
}

fn fixture(dir: &TempDir, name: &str) -> PathBuf {
    compile(dir, name, &[&format!("{name}.c")], &["-O2"])
}

/// Names of the vDSO function clock_gettime ends in (x86_64, AArch64).
const VDSO_CLOCK: [&str; 2] = ["__vdso_clock_gettime", "__kernel_clock_gettime"];

#[test]
fn planted_symlinks_at_predictable_names_are_not_followed() {
    require_root("planting symlinks in folders of other users");
    let _cpu = cpu_lock();
    let build = TempDir::new("plant-build");
    let exe = fixture(&build, "vdso_clock");
    let calls = fixture(&build, "manycalls");
    let (_victim_dir, victim) = victim();
    let dir = folder_of_nobody("plant");
    let outputs = ["out.folded", "out.parquet", "report.folded", "calls.txt"];
    // What the owner of the folder would plant: a link at each temp name the old scheme used
    // (`.NAME.superprof-PID.tmp`) and at the vDSO copy's name (TMPDIR is their folder), for
    // the next few thousand pids.
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pids = last + 1..last + 3000;
    for pid in pids.clone() {
        for name in outputs {
            let link = dir.path(&format!(".{name}.superprof-{pid}.tmp"));
            std::os::unix::fs::symlink(&victim, link).unwrap();
        }
        std::os::unix::fs::symlink(&victim, dir.path(&format!("superprof-vdso-{pid}.so"))).unwrap();
    }
    run_ok(Command::new("chown").arg("-hR").arg("nobody").arg(&dir.0));
    let planted = std::fs::read_dir(&dir.0).unwrap().count();

    let run = |cmd: &mut Command| {
        let child = cmd
            .env("TMPDIR", &dir.0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = child.spawn().unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            pids.contains(&pid),
            "superprof ran as pid {pid}, outside the planted range {pids:?}: the test proves nothing"
        );
    };
    run(superprof()
        .args(["record", "-q", "-o"])
        .arg(dir.path("out.folded"))
        .arg("-o")
        .arg(dir.path("out.parquet"))
        .arg("--")
        .arg(&exe));
    run(superprof()
        .arg("report")
        .arg(dir.path("out.parquet"))
        .arg("-o")
        .arg(dir.path("report.folded")));
    run(superprof()
        .args(["syscalls", "-o"])
        .arg(dir.path("calls.txt"))
        .arg("--")
        .arg(&calls)
        .arg("100"));

    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    for name in outputs {
        let path = dir.path(name);
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file() && meta.len() > 0, "{name}: {meta:?}");
        assert_eq!(mode(&path), 0o600, "{name} is not private");
        assert_eq!(meta.uid(), 0);
    }
    // The vDSO copy was made (its frames are symbolized) and removed with its folder; nothing
    // else is left behind.
    let folded = Folded::read(&dir.path("out.folded"));
    assert!(
        folded
            .0
            .iter()
            .any(|(s, _)| s.iter().any(|f| VDSO_CLOCK.contains(&f.as_str()))),
        "no vDSO frame in {folded:?}"
    );
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        planted + outputs.len()
    );
}

#[test]
fn outputs_are_private() {
    let dir = TempDir::new("private");
    let build = TempDir::new("private-build");
    let exe = fixture(&build, "vdso_clock");
    let old = dir.path("old.folded");
    std::fs::write(&old, "x 1\n").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
    run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(dir.path("new.parquet"))
            .arg("-o")
            .arg(&old)
            .arg("--")
            .arg(&exe)
            .arg("0.2"),
    );
    run_ok(
        superprof()
            .args(["syscalls", "--summary-only", "-o"])
            .arg(dir.path("calls.txt"))
            .arg("--")
            .arg("true"),
    );
    for name in ["new.parquet", "old.folded", "calls.txt"] {
        assert_eq!(mode(&dir.path(name)), 0o600, "{name}");
    }
    assert!(Folded::read(&old).total() > 10);
}

#[test]
fn devices_are_written_through_not_replaced() {
    require_root("mknod");
    let dir = TempDir::new("devices");
    let build = TempDir::new("devices-build");
    let exe = fixture(&build, "vdso_clock");
    // A node of its own for /dev/null's device (1, 3), so a regression replaces it and not the
    // machine's /dev/null.
    let node = dir.path("null");
    let named = dir.path("null.folded");
    for n in [&node, &named] {
        run_ok(Command::new("mknod").arg(n).args(["c", "1", "3"]));
    }
    let rdev = std::fs::metadata(&node).unwrap().rdev();
    run_ok(
        superprof()
            .args(["syscalls", "-o"])
            .arg(&node)
            .arg("--")
            .arg("true"),
    );
    run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&named)
            .arg("--")
            .arg(&exe)
            .arg("0.1"),
    );
    for n in [&node, &named] {
        let meta = std::fs::symlink_metadata(n).unwrap();
        assert!(meta.file_type().is_char_device(), "{n:?} was replaced");
        assert_eq!(meta.rdev(), rdev);
    }
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 2);
    // Now the real one.
    run_ok(
        superprof()
            .args(["syscalls", "-o", "/dev/null", "--"])
            .arg("true"),
    );
    let meta = std::fs::symlink_metadata("/dev/null").unwrap();
    assert!(meta.file_type().is_char_device() && meta.rdev() == rdev);
}

/// Reads a FIFO to its end on a thread. The FIFO is also held open for writing here until
/// [`FifoReader::text`], so the reader never waits for a writer that does not come (superprof
/// failing, or replacing the FIFO instead of writing into it).
struct FifoReader {
    keep: std::fs::File,
    thread: std::thread::JoinHandle<String>,
}

impl FifoReader {
    fn new(path: &Path) -> FifoReader {
        // O_RDWR: a FIFO's open that does not wait.
        let keep = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let path = path.to_owned();
        let thread = std::thread::spawn(move || std::fs::read_to_string(path).unwrap());
        FifoReader { keep, thread }
    }

    /// What was read, once every writer is gone.
    fn text(self) -> String {
        drop(self.keep);
        self.thread.join().unwrap()
    }
}

#[test]
fn fifos_deliver_the_output_to_their_reader() {
    let dir = TempDir::new("fifo");
    let build = TempDir::new("fifo-build");
    let exe = fixture(&build, "vdso_clock");
    let prof = dir.path("prof.folded");
    let log = dir.path("log.fifo");
    for f in [&prof, &log] {
        run_ok(Command::new("mkfifo").arg(f));
    }
    let reader = FifoReader::new(&prof);
    let out = superprof()
        .args(["record", "-q", "-o"])
        .arg(&prof)
        .arg("--")
        .arg(&exe)
        .arg("0.2")
        .output()
        .unwrap();
    let text = reader.text();
    assert!(out.status.success(), "{out:?}");
    assert!(Folded::parse(&text).total() > 10, "{text}");

    let reader = FifoReader::new(&log);
    let out = superprof()
        .args(["syscalls", "-o"])
        .arg(&log)
        .arg("--")
        .arg("true")
        .output()
        .unwrap();
    let text = reader.text();
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("execve(") && text.contains(" total"),
        "{text}"
    );
    for f in [&prof, &log] {
        assert!(std::fs::symlink_metadata(f).unwrap().file_type().is_fifo());
    }
}

#[test]
fn symlinks_are_written_through_to_their_target() {
    let dir = TempDir::new("link");
    let build = TempDir::new("link-build");
    let exe = fixture(&build, "vdso_clock");
    let target = dir.path("real.folded");
    std::fs::write(&target, "old 1\n").unwrap();
    let link = dir.path("link.folded");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&link)
            .arg("--")
            .arg(&exe)
            .arg("0.2"),
    );
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let folded = Folded::read(&target);
    assert!(folded.total() > 10 && folded.0.iter().all(|(s, _)| s[0] != "old"));

    // A link to nothing is not followed: it would create a file wherever it points.
    let dangling = dir.path("dangling.folded");
    let missing = dir.path("missing.folded");
    std::os::unix::fs::symlink(&missing, &dangling).unwrap();
    let out = superprof()
        .args(["record", "-q", "-o"])
        .arg(&dangling)
        .arg("--")
        .arg(&exe)
        .arg("0.1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("symbolic link to a missing file"));
    assert!(!missing.exists());
}

/// The top table of `record` on the split fixture: the row of work_alpha.
fn work_alpha_row(exe: &Path) -> String {
    let out = run_ok(
        superprof()
            .args(["record", "--"])
            .arg(exe)
            .arg("0.4")
            .current_dir(exe.parent().unwrap()),
    );
    let table = String::from_utf8_lossy(&out.stderr);
    table
        .lines()
        .find(|l| l.contains(" work_alpha "))
        .unwrap_or_else(|| panic!("no work_alpha in\n{table}"))
        .to_owned()
}

/// `exe` with its .gnu_debuglink section holding `name` and `crc`.
fn set_debuglink(exe: &Path, name: &str, crc: [u8; 4]) {
    let mut section = name.as_bytes().to_vec();
    section.push(0);
    section.resize(section.len().next_multiple_of(4), 0);
    section.extend_from_slice(&crc);
    let file = exe.with_extension("link");
    std::fs::write(&file, section).unwrap();
    run_ok(
        Command::new("objcopy")
            .arg(format!(
                "--update-section=.gnu_debuglink={}",
                file.display()
            ))
            .arg(exe),
    );
}

#[test]
fn debuglinks_are_file_names_with_a_matching_crc() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("debuglink-safety");
    let deep = dir.0.join("a/b");
    std::fs::create_dir_all(&deep).unwrap();
    let exe = compile(&dir, "a/b/split", &["split.c"], &["-O2", "-g"]);
    let debug = dir.path("split.debug");
    split_debug(&exe, &debug);
    // objcopy computes the CRC of the debug file; the link names it beside the program.
    std::fs::copy(&debug, deep.join("split.debug")).unwrap();
    run_ok(
        Command::new("objcopy")
            .arg("--add-gnu-debuglink=split.debug")
            .arg(&exe)
            .current_dir(&deep),
    );
    let dump = dir.path("link.bin");
    run_ok(
        Command::new("objcopy")
            .arg(format!("--dump-section=.gnu_debuglink={}", dump.display()))
            .arg(&exe),
    );
    let bytes = std::fs::read(&dump).unwrap();
    let crc: [u8; 4] = bytes[bytes.len() - 4..].try_into().unwrap();

    // The control: a good link is used.
    let row = work_alpha_row(&exe);
    assert!(
        row.contains("split.c:"),
        "the debug file is not used: {row}"
    );

    // A name that leaves the folder (the file it reaches has the right CRC) is not followed.
    std::fs::remove_file(deep.join("split.debug")).unwrap();
    set_debuglink(&exe, "../../split.debug", crc);
    let row = work_alpha_row(&exe);
    assert!(
        !row.contains("split.c:"),
        "a '../' debug link was followed: {row}"
    );

    // A file of the right name whose CRC differs (a stale or planted one) is skipped.
    set_debuglink(&exe, "split.debug", crc);
    let mut stale = std::fs::read(&debug).unwrap();
    stale.extend_from_slice(b"stale");
    std::fs::write(deep.join("split.debug"), stale).unwrap();
    let row = work_alpha_row(&exe);
    assert!(
        !row.contains("split.c:"),
        "a debug file with the wrong CRC was used: {row}"
    );
}

/// Lines of a file that end in a newline and mention `what`.
fn complete_lines(path: &Path, what: &str) -> usize {
    let Ok(f) = std::fs::File::open(path) else {
        return 0;
    };
    std::io::BufReader::new(f)
        .split(b'\n')
        .filter_map(Result::ok)
        .filter(|l| String::from_utf8_lossy(l).contains(what))
        .count()
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_syscalls_run_keeps_its_log() {
    let dir = TempDir::new("killed");
    let calls = fixture(&dir, "manycalls");
    let log = dir.path("log.txt");
    let mut child = KillOnDrop(
        superprof()
            .args(["syscalls", "-o"])
            .arg(&log)
            .arg("--")
            .arg(&calls)
            // Minutes of calls under the tracer; a second or two on its own, which is how it
            // runs on once superprof is killed (issue 12, item 4).
            .arg("10000000")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while complete_lines(&log, "getppid()") < 2000 {
        assert!(Instant::now() < deadline, "no log lines appear");
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen = complete_lines(&log, "getppid()");
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();
    let kept = complete_lines(&log, "getppid()");
    assert!(
        kept >= seen,
        "{kept} lines kept, {seen} were there before the kill"
    );
}

/// superprof's peak memory (VmHWM, KiB) over `syscalls --format FORMAT -o FILE` of `n` calls.
/// The fixture sleeps once its calls are made, so the last reading covers the whole log.
fn syscalls_peak_kib(calls: &Path, out: &Path, format: &str, n: u64) -> u64 {
    let mut child = KillOnDrop(
        superprof()
            .args(["syscalls", "--format", format, "-o"])
            .arg(out)
            .arg("--")
            .arg(calls)
            .arg(n.to_string())
            .arg("1000")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = format!("/proc/{}/status", child.0.id());
    let mut peak = 0;
    while child.0.try_wait().unwrap().is_none() {
        if let Some(kib) = std::fs::read_to_string(&status).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        }) {
            peak = kib;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.0.wait().unwrap().success());
    peak
}

#[test]
fn syscalls_memory_stays_flat_with_the_log() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("flat");
    let calls = fixture(&dir, "manycalls");
    for format in ["table", "json"] {
        let out = dir.path(&format!("log.{format}"));
        let small = syscalls_peak_kib(&calls, &out, format, 1000);
        let large = syscalls_peak_kib(&calls, &out, format, 300_000);
        let logged = complete_lines(&out, "getppid");
        let size = std::fs::metadata(&out).unwrap().len();
        eprintln!(
            "syscalls --format {format}: VmHWM {small} KiB with 1000 calls, {large} KiB with \
             300000 ({size} bytes of log)"
        );
        if format == "table" {
            assert!(logged >= 300_000, "{logged} lines");
        }
        assert!(
            large < small + 4096,
            "{format}: memory grows with the log: {small} KiB -> {large} KiB"
        );
    }
}
