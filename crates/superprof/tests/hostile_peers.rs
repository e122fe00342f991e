//! Hostile input (issue 12, item 8), on the real binary. Fake QMP and gdbstub peers flood,
//! trickle or never end a reply; profile files describe stacks of millions of frames in a few
//! kilobytes; a program names its thread and its function with control characters. Each time
//! superprof must end in bounded time and memory: with one line of error and a non-zero
//! exit, or at --duration or Ctrl-C with the samples so far; and print names escaped.
#![allow(clippy::disallowed_macros)] // a test's own diagnostics

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// The most memory superprof may use on any of these inputs.
const MAX_PEAK_MB: u64 = 200;

/// How a watched run of superprof ended.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    /// From the start to the exit.
    took: Duration,
    /// From SIGINT to the exit, when one was sent.
    after_sigint: Option<Duration>,
    /// VmHWM, the peak resident memory, in MB.
    peak_mb: u64,
}

fn vm_hwm_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Runs superprof, reading its peak memory while it runs; sends SIGINT after `sigint_after`;
/// kills it (and fails) past `limit` or past MAX_PEAK_MB.
fn watch(args: &[&str], sigint_after: Option<Duration>, limit: Duration) -> Finished {
    let mut child = superprof()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let mut peak_kb = 0;
    let mut sigint: Option<Instant> = None;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        peak_kb = peak_kb.max(vm_hwm_kb(child.id()));
        let over = if peak_kb > MAX_PEAK_MB * 1024 {
            Some(format!("uses {} MB", peak_kb / 1024))
        } else if start.elapsed() > limit {
            Some(format!("still runs after {limit:?}"))
        } else {
            None
        };
        if let Some(why) = over {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "superprof {args:?} {why}; stderr: {}",
                err.join().unwrap_or_default()
            );
        }
        if sigint.is_none() && sigint_after.is_some_and(|t| start.elapsed() >= t) {
            let ok = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status()
                .unwrap();
            assert!(ok.success());
            sigint = Some(Instant::now());
        }
        thread::sleep(Duration::from_millis(5));
    };
    Finished {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        took: start.elapsed(),
        after_sigint: sigint.map(|t| t.elapsed()),
        peak_mb: peak_kb / 1024,
    }
}

impl Finished {
    /// A failure with one line on stderr that mentions `mention`, in bounded memory.
    fn one_line_error(&self, mention: &str) {
        let lines: Vec<&str> = self.stderr.lines().filter(|l| !l.is_empty()).collect();
        assert!(!self.status.success(), "succeeded: {}", self.stderr);
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        assert_eq!(lines.len(), 1, "{}", self.stderr);
        assert!(lines[0].starts_with("superprof: "), "{}", lines[0]);
        assert!(lines[0].contains(mention), "{}", lines[0]);
        self.bounded_memory();
    }

    /// Success, with the samples taken before the peer turned hostile.
    fn kept_samples(&self, n: u64, folded: &Path) {
        assert!(self.status.success(), "{}", self.stderr);
        assert!(
            self.stdout.starts_with(&format!("{n} samples")),
            "{}",
            self.stdout
        );
        assert_eq!(Folded::read(folded).total(), n);
        self.bounded_memory();
    }

    fn bounded_memory(&self) {
        assert!(self.peak_mb < MAX_PEAK_MB, "peak {} MB", self.peak_mb);
    }

    /// Ended within `slack` of Ctrl-C.
    fn prompt_after_sigint(&self, slack: Duration) {
        let t = self.after_sigint.expect("SIGINT sent");
        assert!(
            t < slack,
            "took {t:?} after Ctrl-C; stderr: {}",
            self.stderr
        );
    }
}

/// A guest kernel ELF for --kernel: any ELF of this machine's architecture with symbols and
/// unwind tables (the fake peers never run it).
fn kernel(dir: &TempDir) -> String {
    compile(dir, "kernel.elf", &["split.c"], &["-O1", "-g"])
        .to_string_lossy()
        .into_owned()
}

/// Listens on a Unix socket in `dir` and serves each connection with `serve` on its own
/// thread; the thread ends when superprof goes (its writes fail).
fn peer(dir: &TempDir, serve: fn(UnixStream) -> std::io::Result<()>) -> String {
    let path = dir.path("peer.sock");
    let listener = UnixListener::bind(&path).unwrap();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            thread::spawn(move || {
                let _ = serve(conn);
            });
        }
    });
    path.to_string_lossy().into_owned()
}

/// Writes `bytes` over and over, one byte each 50 ms, until superprof goes.
fn trickle(mut c: UnixStream, bytes: &[u8]) -> std::io::Result<()> {
    for b in bytes.iter().cycle() {
        c.write_all(&[*b])?;
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Writes junk as fast as superprof takes it, until it goes.
fn flood(mut c: UnixStream, head: &[u8]) -> std::io::Result<()> {
    c.write_all(head)?;
    let junk = [b'A'; 65536];
    loop {
        c.write_all(&junk)?;
    }
}

// ---------------------------------------------------------------------------------------
// QMP

/// A QMP session that serves `GOOD_SAMPLES` samples (stop, registers, cont), then answers the
/// next `stop` with nothing but an event every 100 ms, forever: each message comes well
/// within any per-read timeout.
fn qmp_events_forever(c: UnixStream) -> std::io::Result<()> {
    let mut w = c.try_clone()?;
    w.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")?;
    let (arch, regs) = if cfg!(target_arch = "aarch64") {
        (
            "aarch64",
            " PC=0000000000000000 X29=0000000000000000 X30=0000000000000000  SP=0000000000000000\n",
        )
    } else {
        ("x86_64", "RAX=0000000000000000 RBP=0000000000000000 RSP=0000000000000000\nRIP=0000000000000000 RFL=00000002\n")
    };
    let mut stops = 0;
    for line in BufReader::new(c).lines() {
        let v: serde_json::Value = serde_json::from_str(&line?)?;
        let cmd = v["execute"].as_str().unwrap_or_default();
        if cmd == "stop" {
            stops += 1;
            if stops > GOOD_SAMPLES {
                loop {
                    w.write_all(b"{\"event\": \"RESUME\", \"timestamp\": {}}\n")?;
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
        let ret = match cmd {
            "query-target" => serde_json::json!({ "arch": arch }),
            "query-cpus-fast" => serde_json::json!([{ "cpu-index": 0 }]),
            "human-monitor-command" => serde_json::json!(regs),
            _ => serde_json::json!({}),
        };
        writeln!(w, "{}", serde_json::json!({ "return": ret, "id": v["id"] }))?;
    }
    Ok(())
}

const GOOD_SAMPLES: u64 = 3;

#[test]
fn qmp_greeting_without_a_newline_is_refused_in_bounded_memory() {
    let dir = TempDir::new("qmp-flood");
    let k = kernel(&dir);
    let sock = peer(&dir, |c| flood(c, b"{\"QMP\": "));
    let f = watch(
        &["qemu", "--kernel", &k, "--qmp", &sock],
        None,
        Duration::from_secs(10),
    );
    f.one_line_error("not a QMP socket");
    eprintln!("QMP flood: refused in {:?}, peak {} MB", f.took, f.peak_mb);
}

#[test]
fn qmp_trickled_greeting_times_out_and_ctrl_c_ends_it() {
    let dir = TempDir::new("qmp-trickle");
    let k = kernel(&dir);
    let sock = peer(&dir, |c| trickle(c, b"{\"QMP\": {\"version\": "));
    let args = ["qemu", "--kernel", &k, "--qmp", &sock, "--duration", "1"];
    // The greeting must be whole within the reply timeout (5 s).
    let f = watch(&args, None, Duration::from_secs(10));
    f.one_line_error("not a QMP socket");
    assert!(f.took < Duration::from_secs(7), "{:?}", f.took);
    // Ctrl-C ends the wait at once.
    let f = watch(
        &args,
        Some(Duration::from_millis(500)),
        Duration::from_secs(10),
    );
    f.one_line_error("interrupted");
    f.prompt_after_sigint(Duration::from_millis(1500));
    eprintln!("QMP trickle: Ctrl-C honoured in {:?}", f.after_sigint);
}

// ---------------------------------------------------------------------------------------
// gdbstub

/// One packet from superprof (`$data#xx`), or the interrupt byte 0x03 as `[0x03]`.
fn gdb_packet(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut b = [0u8];
    loop {
        r.read_exact(&mut b)?;
        match b[0] {
            0x03 => return Ok(vec![0x03]),
            b'$' => break,
            _ => {} // acks
        }
    }
    let mut data = Vec::new();
    loop {
        r.read_exact(&mut b)?;
        if b[0] == b'#' {
            let mut sum = [0u8; 2];
            r.read_exact(&mut sum)?;
            return Ok(data);
        }
        data.push(b[0]);
    }
}

fn gdb_send(w: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    let sum = data.iter().fold(0u8, |a, &b| a.wrapping_add(b));
    w.write_all(b"$")?;
    w.write_all(data)?;
    write!(w, "#{sum:02x}")
}

/// How a fake gdbstub misbehaves, once connected properly.
#[derive(Clone, Copy, PartialEq)]
enum GdbTurn {
    /// Its thread list never ends (`m` replies to every qsThreadInfo).
    EndlessThreads,
    /// After GOOD_SAMPLES samples, console output (`O`) every 100 ms instead of a stop reply.
    ConsoleForever,
}

fn gdb_stub(c: UnixStream, turn: GdbTurn) -> std::io::Result<()> {
    let mut w = c.try_clone()?;
    let mut r = BufReader::new(c);
    let arch = if cfg!(target_arch = "aarch64") {
        "aarch64"
    } else {
        "i386:x86-64"
    };
    let (mut stops, mut threads) = (0, 0);
    loop {
        let p = gdb_packet(&mut r)?;
        let reply: Vec<u8> = match p.as_slice() {
            [0x03] => {
                stops += 1;
                if turn == GdbTurn::ConsoleForever && stops > GOOD_SAMPLES {
                    loop {
                        gdb_send(&mut w, b"O68690a")?; // "hi\n"
                        thread::sleep(Duration::from_millis(100));
                    }
                }
                b"T02".to_vec()
            }
            b"c" => continue,
            b"?" => b"T05".to_vec(),
            b"QStartNoAckMode" => b"OK".to_vec(),
            b"qfThreadInfo" => b"m1".to_vec(),
            b"qsThreadInfo" if turn == GdbTurn::EndlessThreads => {
                threads += 1;
                format!("mp1.{threads:x}").into_bytes()
            }
            b"qsThreadInfo" => b"l".to_vec(),
            b"g" => vec![b'0'; 16 * 40],
            b"D" => b"OK".to_vec(),
            p if p.starts_with(b"qSupported") => b"PacketSize=1000".to_vec(),
            p if p.starts_with(b"qXfer:features:read:target.xml") => {
                format!("l<target><architecture>{arch}</architecture></target>").into_bytes()
            }
            p if p.starts_with(b"m") => b"E01".to_vec(),
            _ => Vec::new(),
        };
        gdb_send(&mut w, &reply)?;
    }
}

#[test]
fn gdb_packet_that_never_ends_is_refused_in_bounded_memory() {
    let dir = TempDir::new("gdb-packet");
    let k = kernel(&dir);
    let sock = peer(&dir, |mut c| {
        let mut first = [0u8; 64];
        let _ = c.read(&mut first)?;
        flood(c, b"$")
    });
    let f = watch(
        &["qemu", "--kernel", &k, "--gdb", &sock],
        None,
        Duration::from_secs(10),
    );
    f.one_line_error("gdb remote protocol");
    eprintln!(
        "gdb packet flood: refused in {:?}, peak {} MB",
        f.took, f.peak_mb
    );
}

#[test]
fn gdb_thread_list_that_never_ends_is_refused() {
    let dir = TempDir::new("gdb-threads");
    let k = kernel(&dir);
    let sock = peer(&dir, |c| gdb_stub(c, GdbTurn::EndlessThreads));
    let f = watch(
        &["qemu", "--kernel", &k, "--gdb", &sock, "--duration", "30"],
        None,
        Duration::from_secs(10),
    );
    f.one_line_error("threads");
    eprintln!(
        "gdb thread list: refused in {:?}, peak {} MB",
        f.took, f.peak_mb
    );
}

#[test]
fn gdb_trickled_handshake_ends_at_ctrl_c() {
    let dir = TempDir::new("gdb-trickle");
    let k = kernel(&dir);
    let sock = peer(&dir, |c| trickle(c, b"$qSupported-but-never-ending"));
    let f = watch(
        &["qemu", "--kernel", &k, "--gdb", &sock],
        Some(Duration::from_millis(500)),
        Duration::from_secs(10),
    );
    f.one_line_error("interrupted");
    f.prompt_after_sigint(Duration::from_millis(1500));
}

// ---------------------------------------------------------------------------------------
// Profile files

/// Files of tests/fixtures/hostile_parquet.py: a few KB that describe millions of frames.
#[test]
fn profile_with_a_stack_of_millions_of_frames_is_refused_quickly() {
    for (file, mention) in [
        ("deep_stack.parquet", "5000000 frames for 1 samples"),
        ("skewed_stack.parquet", "deeper than 8192 frames"),
    ] {
        let path = fixtures_dir().join(file);
        let path = path.to_string_lossy();
        for format in ["top", "folded", "tree"] {
            let f = watch(
                &["report", "--format", format, &path],
                None,
                Duration::from_secs(10),
            );
            f.one_line_error(mention);
            assert!(f.took < Duration::from_secs(2), "{file}: {:?}", f.took);
            eprintln!(
                "{file} ({format}): refused in {:?}, peak {} MB",
                f.took, f.peak_mb
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Names

#[test]
fn thread_and_function_names_with_control_characters_are_printed_escaped() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("evil-names");
    // No -g: the function's name comes from the symbol table, ESC and ';' included.
    let exe = compile(&dir, "evil", &["evil_names.c"], &["-O2", "-pthread"]);
    let folded = dir.path("evil.folded");
    let parquet = dir.path("evil.parquet");
    let out = run_ok(
        superprof()
            .args(["record", "-o"])
            .arg(&folded)
            .arg("-o")
            .arg(&parquet)
            .arg("--")
            .arg(&exe)
            .arg("0.5"),
    );
    // (On stderr: the program's output owns stdout.)
    let top = String::from_utf8_lossy(&out.stderr);
    let tree = String::from_utf8_lossy(
        &run_ok(
            superprof()
                .args(["report", "--format", "tree"])
                .arg(&parquet),
        )
        .stdout,
    )
    .into_owned();
    let folded_text = std::fs::read_to_string(&folded).unwrap();
    for (what, text) in [("top", &*top), ("tree", &tree), ("folded", &folded_text)] {
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{what} holds control characters: {text:?}"
        );
    }
    // The top table: one line per row, the name escaped as strace would.
    let row = top
        .lines()
        .find(|l| l.contains("spin"))
        .unwrap_or_else(|| panic!("no spin row: {top}"));
    assert!(row.contains("evil\\e[7m;spin"), "{row}");
    assert!(
        row.trim_start().starts_with(|c: char| c.is_ascii_digit()),
        "{row}"
    );
    assert!(tree.contains("evil\\e[7m;spin"), "{tree}");
    // Folded: the thread is the root frame, escaped; the ';' in the function's name does not
    // split it (FlameGraph's and inferno's own rule: ';' becomes ':').
    let stacks = Folded::parse(&folded_text);
    let mine: u64 = stacks
        .0
        .iter()
        .filter(|(s, _)| s[0] == "ev\\nil\\e[31m" && s.last().unwrap() == "evil\\e[7m:spin")
        .map(|(_, n)| n)
        .sum();
    assert!(mine as f64 > 0.5 * stacks.total() as f64, "{folded_text}");
}

/// A peer that, after [`GOOD_SAMPLES`] samples, never answers usefully again (events, console
/// output): superprof ends at `--duration`, and promptly at Ctrl-C, keeping the samples so far.
fn ends_at_duration_and_at_ctrl_c(
    what: &str,
    backend: &str,
    serve: fn(UnixStream) -> std::io::Result<()>,
) {
    let dir = TempDir::new(what);
    let k = kernel(&dir);
    let sock = peer(&dir, serve);
    let folded = dir.path("out.folded");
    let out = folded.to_string_lossy().into_owned();
    for (duration, sigint) in [("2", None), ("60", Some(Duration::from_millis(1500)))] {
        let f = watch(
            &[
                "qemu",
                "--kernel",
                &k,
                backend,
                &sock,
                "--duration",
                duration,
                "-o",
                &out,
            ],
            sigint,
            Duration::from_secs(15),
        );
        f.kept_samples(GOOD_SAMPLES, &folded);
        if sigint.is_none() {
            assert!(f.took < Duration::from_millis(3500), "{:?}", f.took);
            eprintln!("{what}: ended {:?} after a 2 s duration", f.took);
        } else {
            f.prompt_after_sigint(Duration::from_millis(1500));
            eprintln!("{what}: Ctrl-C honoured in {:?}", f.after_sigint);
        }
    }
}

#[test]
fn qmp_events_instead_of_a_reply_end_at_duration_and_at_ctrl_c() {
    ends_at_duration_and_at_ctrl_c("qmp-events", "--qmp", qmp_events_forever);
}

#[test]
fn gdb_console_output_instead_of_a_stop_ends_at_duration_and_at_ctrl_c() {
    ends_at_duration_and_at_ctrl_c("gdb-console", "--gdb", |c| {
        gdb_stub(c, GdbTurn::ConsoleForever)
    });
}
