//! Issue 31, what a hostile review found: a closed stderr, a FIFO nobody reads, a full disk, a
//! symlink planted in /tmp by another user, and an output that fails after the command ran. In
//! each, the command's exit status and whole output files survive, and superprof ends.

mod common;

use common::*;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Debian's own shell burning about `rounds / 500,000` s of CPU, then exiting with `status`.
fn busy_sh(rounds: u32, status: i32) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!("i=0; while [ $i -lt {rounds} ]; do i=$((i+1)); done; exit {status}"),
    ]
}

/// A pipe whose reader is already gone, as stderr: every write to it fails with EPIPE.
fn closed_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Stdio::from(writer)
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits at most `limit` for `child` to end: its status and what it wrote to its (piped)
/// stderr.
fn wait_for(child: &mut Child, limit: Duration) -> Option<(std::process::ExitStatus, String)> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut err).unwrap();
            }
            return Some((s, err));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Item 5: superprof's stderr is a pipe whose reader is gone (`2>&1 | head -1`). Every
/// subcommand that launches a command exits with the command's status and writes its outputs
/// whole; before, `record` panicked (exit 101) in a diagnostic and wrote no file.
#[test]
fn a_closed_stderr_costs_neither_status_nor_output() {
    let dir = TempDir::new("closed-stderr");
    let folded = dir.path("p.folded");
    let out = superprof()
        .args(["record", "-o"])
        .arg(&folded)
        .arg("--")
        .args(busy_sh(100_000, 3))
        .stderr(closed_pipe())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "record: {out:?}");
    let profile = Folded::read(&folded);
    assert!(profile.total() > 5, "{:?}", profile.0);

    // stat's table and notices go to the closed stderr; blocks' too.
    let exits = compile(&dir, "exits", &["exits.c"], &["-O2"]);
    for sub in ["stat", "blocks"] {
        let out = superprof()
            .args([sub, "-r", "work", "--"])
            .arg(&exits)
            .args(["50", "4"])
            .stderr(closed_pipe())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(4), "{sub}: {out:?}");
    }

    // The log itself goes to the closed stderr: lost, but the command runs to its end.
    let out = superprof()
        .args(["syscalls", "--"])
        .args(busy_sh(20_000, 5))
        .stderr(closed_pipe())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "syscalls: {out:?}");
}

/// Item 13: an output that cannot be written once the command has run (a full disk) is said in
/// one line, and the command's failing status is kept (before, it became 1).
#[test]
fn a_failed_output_keeps_the_commands_status() {
    require_root("mount, lchown");
    let disk = SmallDisk::new("full-record", 4);
    let out = superprof()
        .args(["record", "-q", "-o"])
        .arg(disk.path("p.parquet"))
        .arg("--")
        .args(busy_sh(100_000, 3))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!disk.path("p.parquet").exists());
    assert_eq!(disk.files(), Vec::<String>::new(), "temporary files left");
}

/// A tmpfs of `kib` KiB mounted on a scratch folder (unmounted on drop): a disk that fills up.
struct SmallDisk(TempDir);

impl SmallDisk {
    fn new(tag: &str, kib: u32) -> SmallDisk {
        let dir = TempDir::new(tag);
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
                .arg(&dir.0),
        );
        SmallDisk(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path(name)
    }

    fn files(&self) -> Vec<String> {
        std::fs::read_dir(&self.0 .0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0 .0).status();
    }
}

/// Item 8: a log that fills the disk is cut back to its last whole line (a table) or removed
/// (a JSON document cut short), and superprof says so with the command's status kept where it
/// failed; a run that could not attach leaves no empty log.
#[test]
fn a_full_disk_leaves_whole_lines_or_nothing() {
    require_root("mount, lchown");
    let build = TempDir::new("full-log-build");
    let calls = compile(&build, "manycalls", &["manycalls.c"], &["-O2"]);
    let disk = SmallDisk::new("full-log", 16);
    let log = disk.path("log.txt");
    let out = superprof()
        .args(["syscalls", "-o"])
        .arg(&log)
        .arg("--")
        .arg(&calls)
        .arg("20000")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    let text = std::fs::read(&log).unwrap();
    assert!(text.len() > 1000, "{} bytes kept", text.len());
    assert_eq!(text.last(), Some(&b'\n'), "the log ends mid-line");
    std::fs::remove_file(&log).unwrap();

    let json = disk.path("log.json");
    let out = superprof()
        .args(["syscalls", "--format", "json", "-o"])
        .arg(&json)
        .arg("--")
        .arg(&calls)
        .arg("20000")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(!json.exists(), "a JSON log cut short was left");

    let dir = TempDir::new("no-attach");
    let log = dir.path("log.txt");
    let out = superprof()
        .args(["syscalls", "-o"])
        .arg(&log)
        .args(["-p", "999999999"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(!log.exists(), "an empty log was left");
}

/// Item 8: `-o` naming a FIFO that nobody reads: superprof ends at SIGTERM (before, it hung in
/// open for minutes, SIGTERM ignored), with the command's status. `report` on a FIFO is refused
/// at once instead of blocking in open.
#[test]
fn a_fifo_without_reader_does_not_hold_superprof() {
    let dir = TempDir::new("fifo-no-reader");
    let fifo = dir.path("p.folded");
    run_ok(Command::new("mkfifo").arg(&fifo));
    let mut child = KillOnDrop(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&fifo)
            .arg("--")
            .args(busy_sh(20_000, 0))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The command is done within a second; superprof then waits for a reader.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(child.0.try_wait().unwrap().is_none(), "did not wait");
    run_ok(Command::new("kill").arg(child.0.id().to_string()));
    let (status, err) = wait_for(&mut child.0, Duration::from_secs(5)).expect("SIGTERM ignored");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("FIFO"), "{err}");

    let mut report = KillOnDrop(
        superprof()
            .arg("report")
            .arg(&fifo)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (status, err) = wait_for(&mut report.0, Duration::from_secs(5)).expect("report blocks");
    assert!(!status.success(), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
}

/// Item 9: as root, `-o /tmp/x` where /tmp/x is a symlink another user planted is refused (the
/// kernel's protected_symlinks rule, which may be off); the file it names is untouched. A link
/// of one's own there is still written through.
#[test]
fn a_symlink_planted_by_another_user_in_tmp_is_not_followed() {
    require_root("mount, lchown");
    let tmp = TempDir::new("sticky");
    run_ok(Command::new("chmod").arg("1777").arg(&tmp.0));
    let victims = TempDir::new("sticky-victim");
    let victim = victims.path("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    let link = tmp.path("x.folded");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let nobody = nobody_uid();
    std::os::unix::fs::lchown(&link, Some(nobody), Some(nobody)).unwrap();
    let out = superprof()
        .args(["record", "-q", "-o"])
        .arg(&link)
        .arg("--")
        .args(busy_sh(20_000, 0))
        .output()
        .unwrap();
    assert_one_line_error(&out, "owned by another user");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");

    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&link)
            .arg("--")
            .args(busy_sh(100_000, 0)),
    );
    assert!(Folded::read(&victim).total() > 5);
    assert_eq!(std::fs::symlink_metadata(&link).unwrap().uid(), 0);
}

fn nobody_uid() -> u32 {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f[0] == "nobody").then(|| f[2].parse().unwrap())
        })
        .unwrap()
}

/// Issue 31, item 11: a `.gnu_debuglink` naming a 2 GB (sparse) file beside the program costs
/// time, not memory: its CRC is read through a buffer (mapped and hashed, it cost 4.2 GB of
/// resident memory). Peak memory by GNU time.
#[test]
fn a_huge_debug_link_target_costs_no_memory() {
    let dir = TempDir::new("huge-debuglink");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let debug = dir.path("split.debug");
    split_debug(&exe, &debug);
    run_ok(
        Command::new("objcopy")
            .arg("--add-gnu-debuglink=split.debug")
            .arg(&exe)
            .current_dir(&dir.0),
    );
    // The same name, now 2 GB of holes: its CRC differs, and reading it must not cost memory.
    std::fs::remove_file(&debug).unwrap();
    run_ok(Command::new("truncate").args(["-s", "2G"]).arg(&debug));
    let folded = dir.path("p.folded");
    let (out, peak) = peak_kib(
        Command::new(env!("CARGO_BIN_EXE_superprof"))
            .args(["record", "-q", "-o"])
            .arg(&folded)
            .arg("--")
            .arg(&exe)
            .arg("0.2"),
    );
    assert!(out.status.success(), "{out:?}");
    assert!(Folded::read(&folded).total() > 10);
    // superprof alone peaks at a few tens of MB here.
    assert!(peak < 400 << 10, "peak {} MiB", peak >> 10);
}

/// Issue 31, item 13: an argument that is not UTF-8 reaches the command byte for byte (it was
/// refused and the command not run).
#[test]
fn arguments_that_are_not_utf8_pass_through() {
    use std::os::unix::ffi::OsStrExt;
    let arg = std::ffi::OsStr::from_bytes(b"caf\xe9\xff");
    let script =
        "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; printf %s \"$1\" | od -An -tx1";
    let dir = TempDir::new("not-utf8");
    for sub in [
        &["syscalls", "--summary-only"][..],
        &["record", "-q", "-o", "p.folded"],
    ] {
        let out = superprof()
            .args(sub)
            .current_dir(&dir.0)
            .args(["--", "sh", "-c", script, "sh"])
            .arg(arg)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{sub:?}: {out:?}");
        assert_eq!(stdout.trim(), "63 61 66 e9 ff", "{sub:?}");
    }
}

/// Issue 31, item 13: a program whose file was deleted after it started is still found, read
/// through /proc/PID/map_files ("no function 'work' ... did you mean fork?" before).
#[test]
fn a_deleted_program_is_read_through_its_mapping() {
    let dir = TempDir::new("deleted-exe");
    let exits = compile(&dir, "exits", &["exits.c"], &["-O2"]);
    let mut child = KillOnDrop(
        Command::new(&exits)
            .args(["3000", "0"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_exec(child.0.id(), &exits);
    std::fs::remove_file(&exits).unwrap();
    let out = superprof()
        .args(["stat", "-r", "work", "-e", "task-clock", "--format", "json"])
        .args(["--duration", "0.5", "-p", &child.0.id().to_string()])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert!(doc["regions"][0]["calls"].as_u64().unwrap() > 10, "{doc}");
    let _ = child.0.kill();
}

/// Issue 31, item 6: a library that its program cuts (truncates) while superprof has it mapped
/// reads as zeros instead of killing superprof with SIGBUS (exit 135, no output): `record`
/// and `blocks --mode sample` write their output and pass the program's status on.
#[test]
fn a_library_cut_while_mapped_does_not_kill_superprof() {
    let dir = TempDir::new("cut-library");
    let lib = compile(
        &dir,
        "libhot.so",
        &["libhot.c"],
        &["-O2", "-g", "-shared", "-fPIC"],
    );
    let exe = compile(&dir, "trl", &["truncate_lib.c"], &["-O2", "-g", "-ldl"]);
    for sub in [
        &["record", "-q", "-o", "p.folded"][..],
        &["blocks", "--mode", "sample"],
    ] {
        for keep in ["0", "4096"] {
            let copy = dir.path("copy.so");
            std::fs::copy(&lib, &copy).unwrap();
            let out = superprof()
                .args(sub)
                .current_dir(&dir.0)
                .arg("--")
                .arg(&exe)
                .arg(&copy)
                .arg(keep)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "{sub:?} keep {keep}: {err}");
            assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n", "{err}");
            if sub[0] == "record" {
                assert!(Folded::read(&dir.path("p.folded")).total() > 100, "{err}");
            }
        }
    }
}

/// Issue 31, item 10: a profile of a few kilobytes whose zstd page inflates to 200 MB (one
/// thread name) is refused from its page header, before anything is decompressed: peak memory
/// stays small (it reached 595 MB for 300 MB; 3.16 GB for three pages of 1 GB).
#[test]
fn a_decompression_bomb_is_refused_from_its_page_headers() {
    let dir = TempDir::new("parquet-bomb");
    let bomb = dir.path("bomb.parquet");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/hostile_parquet.py");
    run_ok(
        Command::new("python3")
            .arg(script)
            .args(["bomb", "200000000"])
            .arg(&bomb),
    );
    assert!(std::fs::metadata(&bomb).unwrap().len() < 100_000);
    let (out, peak) = peak_kib(
        Command::new(env!("CARGO_BIN_EXE_superprof"))
            .arg("report")
            .arg(&bomb),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("has a page of 200000004 bytes uncompressed"),
        "{err}"
    );
    assert!(peak < 100 << 10, "peak {} MiB", peak >> 10);
}

/// Runs `cmd` under GNU time: its output, and its peak resident memory in KiB.
fn peak_kib(cmd: &mut Command) -> (std::process::Output, u64) {
    let out = Command::new("/usr/bin/time")
        .args(["-f", "peak-kib=%M"])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let peak = err
        .lines()
        .find_map(|l| l.strip_prefix("peak-kib="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    (out, peak)
}
