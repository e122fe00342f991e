//! Helpers of superprof's integration tests: the real superprof binary, run as root or as
//! nobody, its one-line errors, HTTP peers. What every suite of the workspace needs (fixtures,
//! scratch folders, CPU locks, folded stacks, tolerances) is the test kit's
//! (superprof-testkit), re-exported here.
#![allow(dead_code)]

pub mod guest;
pub mod pprof;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

pub use superprof_testkit::*;

/// The superprof binary, run in a scratch folder of this test process (record writes
/// superprof.parquet into the current folder when no -o is given).
pub fn superprof() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_superprof"));
    c.current_dir(scratch_dir());
    c
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

/// Executions of each instruction of `exe` (ELF addresses), from a callgrind output file:
/// the Ir cost of each instruction is how many times it ran. (`exe` may be a library the
/// program maps.)
pub fn callgrind_counts(out_file: &Path, exe: &Path) -> BTreeMap<u64, u64> {
    let text = std::fs::read_to_string(out_file).unwrap();
    let exe = exe.canonicalize().unwrap_or(exe.to_owned());
    let exe = exe.to_string_lossy();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut current_object = String::new();
    let mut last = 0u64;
    // The line after calls= carries the call's inclusive cost; after jump=/jcnd=, none.
    let mut skip_cost = false;
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        for (prefix, is_ob) in [("ob=", true), ("cob=", false)] {
            if let Some(rest) = line.strip_prefix(prefix) {
                let (id, name) = match rest.split_once(") ") {
                    Some((id, name)) if rest.starts_with('(') => (id.to_owned() + ")", name),
                    _ if rest.starts_with('(') => (rest.to_owned(), ""),
                    _ => (String::new(), rest),
                };
                if !name.is_empty() {
                    names.insert(id.clone(), name.to_owned());
                }
                if is_ob {
                    current_object = names.get(&id).cloned().unwrap_or(name.to_owned());
                }
            }
        }
        if line.starts_with("calls=") || line.starts_with("jump=") || line.starts_with("jcnd=") {
            skip_cost = true;
            continue;
        }
        let mut parts = line.split_whitespace();
        let Some(pos) = parts.next() else { continue };
        let addr = if pos == "*" {
            last
        } else if let Some(hex) = pos.strip_prefix("0x") {
            u64::from_str_radix(hex, 16).unwrap()
        } else if pos.starts_with('+') || pos.starts_with('-') {
            match pos.parse::<i64>() {
                Ok(d) => last.wrapping_add(d as u64),
                Err(_) => continue,
            }
        } else {
            continue;
        };
        last = addr;
        if std::mem::take(&mut skip_cost) {
            continue;
        }
        let _line = parts.next();
        if let (true, Some(ir)) = (current_object == exe, parts.next()) {
            *counts.entry(addr).or_insert(0) += ir.parse::<u64>().unwrap();
        }
    }
    assert!(
        !counts.is_empty(),
        "no costs for {exe} in {}",
        out_file.display()
    );
    counts
}

/// callgrind's counts for the instructions of `object` (the program or a library), the
/// program run with the environment `env`.
pub fn callgrind_of(
    dir: &TempDir,
    exe: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    object: &Path,
) -> BTreeMap<u64, u64> {
    // (One file per process: a fork child writes its own.)
    let pattern = dir.path("callgrind.out.%p");
    let child = Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--dump-instr=yes",
            "--collect-jumps=yes",
            // PLT stubs counted as their own code, not added to the calling instruction.
            "--skip-plt=no",
        ])
        .arg(format!("--callgrind-out-file={}", pattern.display()))
        .arg(exe)
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("valgrind runs (scripts/test installs it)");
    let out_file = dir.path(&format!("callgrind.out.{}", child.id()));
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    callgrind_counts(&out_file, object)
}

/// [start, end) of function `name` in `file` from `nm -S` (then `nm -D -S`, then `nm -S` of
/// its debug file under /usr/lib/debug/.build-id, by the build id `readelf -n` shows).
pub fn symbol_range(file: &std::path::Path, name: &str) -> Option<(u64, u64)> {
    let notes = std::process::Command::new("readelf")
        .arg("-n")
        .arg(file)
        .output()
        .unwrap();
    let debug = String::from_utf8_lossy(&notes.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_owned))
        .filter(|id| id.len() > 2)
        .map(|id| format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]));
    let tries = [
        (file.to_owned(), false),
        (file.to_owned(), true),
        (debug.map(Into::into).unwrap_or_default(), false),
    ];
    for (file, dynamic) in tries {
        let mut nm = std::process::Command::new("nm");
        nm.args(["-S", "--defined-only"]);
        if dynamic {
            nm.arg("-D");
        }
        let out = nm.arg(&file).output().unwrap();
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            if let [addr, size, kind, sym] = w[..] {
                let sym = sym.split('@').next().unwrap_or(sym);
                if sym == name && matches!(kind, "T" | "t" | "W" | "i") {
                    let a = u64::from_str_radix(addr, 16).ok()?;
                    return Some((a, a + u64::from_str_radix(size, 16).ok()?));
                }
            }
        }
    }
    None
}

/// The two-thread spinner (tests/fixtures/spin2.c), running until dropped: its threads spin in
/// `spin_a` and `spin_b`, whose ids it printed once both ran.
pub struct Spinner {
    child: std::process::Child,
    /// The thread spinning in `spin_a`.
    pub a: u32,
    /// The thread spinning in `spin_b`.
    pub b: u32,
}

impl Spinner {
    pub fn start(dir: &TempDir) -> Spinner {
        use std::io::BufRead;
        let exe = compile(dir, "spin2", &["spin2.c"], &["-O1", "-g", "-pthread"]);
        let mut child = Command::new(&exe)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v = fixture_values(&line);
        Spinner {
            child,
            a: v["a"] as u32,
            b: v["b"] as u32,
        }
    }

    /// The spinner's process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
