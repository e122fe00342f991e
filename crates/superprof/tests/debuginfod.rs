//! Debug files from a debuginfod server (issue 14): Debian's own `debuginfod`, started on
//! 127.0.0.1 by the test, serves the debug file split off a fixture; with DEBUGINFOD_URLS set,
//! `record` fetches it by build id into the client cache (DEBUGINFOD_CACHE_PATH, the layout gdb
//! and perf share) and the table gets file:line; a second run uses the cache; without the
//! variable nothing is fetched.

mod common;

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The HTTP status of GET `path` on 127.0.0.1:`port`, if it answers.
fn status(port: u16, path: &str) -> Option<u32> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    String::from_utf8_lossy(&head[..n])
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[test]
fn record_fetches_a_missing_debug_file_from_debuginfod() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("debuginfod");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let served = dir.path("served");
    std::fs::create_dir_all(&served).unwrap();
    let debug = served.join("split.debug");
    split_debug(&exe, &debug);
    let readelf = run_ok(Command::new("readelf").arg("-n").arg(&exe));
    let hex = String::from_utf8_lossy(&readelf.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_owned))
        .expect("a build id");
    // A free port, then the server on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = Server(
        Command::new("debuginfod")
            .args(["-F", "-p", &port.to_string(), "-d"])
            .arg(dir.path("db.sqlite"))
            .arg(&served)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("debuginfod (scripts/test installs it)"),
    );
    let url_path = format!("/buildid/{hex}/debuginfo");
    let deadline = Instant::now() + Duration::from_secs(60);
    while status(port, &url_path) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "debuginfod did not serve {url_path}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let cache = dir.path("cache");
    let run = |with_server: bool| {
        let mut cmd = superprof();
        cmd.args(["record", "--"]).arg(&exe).arg("0.3");
        cmd.env_remove("DEBUGINFOD_URLS");
        cmd.env("DEBUGINFOD_CACHE_PATH", &cache);
        if with_server {
            cmd.env("DEBUGINFOD_URLS", format!("http://127.0.0.1:{port}"));
        }
        let out = run_ok(&mut cmd);
        // (The table is on stderr too: the program's output owns stdout.)
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (stderr.clone(), stderr)
    };
    let row = |table: &str| {
        table
            .lines()
            .find(|l| l.contains(" work_alpha "))
            .unwrap_or_else(|| panic!("no work_alpha in\n{table}"))
            .to_owned()
    };
    // Without DEBUGINFOD_URLS: nothing fetched, no file:line.
    let (table, stderr) = run(false);
    assert!(!stderr.contains("debuginfod"), "{stderr}");
    assert!(!row(&table).contains("split.c:"), "{table}");
    assert!(!cache.exists());
    // With it: fetched into the client cache's layout, with a notice, and file:line.
    let (table, stderr) = run(true);
    assert!(
        stderr.contains("debuginfod: split: debug info fetched"),
        "{stderr}"
    );
    assert!(row(&table).contains("split.c:"), "{table}");
    let cached = cache.join(&hex).join("debuginfo");
    assert_eq!(
        std::fs::read(&cached).unwrap(),
        std::fs::read(&debug).unwrap()
    );
    // Again: from the cache, nothing asked of the server.
    let (table, stderr) = run(true);
    assert!(!stderr.contains("debug info fetched"), "{stderr}");
    assert!(row(&table).contains("split.c:"), "{table}");
}
