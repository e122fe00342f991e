//! The coordinator: the ptrace sampler, the automatic fallback where perf_event_open is
//! denied, and the reliability of tracing (signals, crashes, thread churn, clean detach).

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs a command, failing the test if it takes longer than `limit` (a hang).
fn run_limited(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} hung for {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn check_split_shares(out: &Output, f: &Folded) {
    let truth = fixture_values(&String::from_utf8_lossy(&out.stdout));
    for func in ["work_alpha", "work_beta", "work_gamma"] {
        assert_share(func, f.share_through(func), truth[func], f.total());
    }
}

#[test]
fn ptrace_sampler_matches_the_known_split() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("pt-split");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let folded = dir.path("s.folded");
    let out = run_ok(
        superprof()
            .args(["record", "--sampler", "ptrace", "-q", "-o"])
            .arg(&folded)
            .arg("--")
            .arg(&exe)
            .arg("2"),
    );
    let f = Folded::read(&folded);
    // (split burns 2 s of CPU time.)
    assert_sample_count("ptrace", f.total(), 2.0, 999.0, perf_cpu_clock_rate(999));
    check_split_shares(&out, &f);
    // Stacks are complete: through main.
    assert!(
        f.share_through("main") > 0.97,
        "main in {}",
        f.share_through("main")
    );
}

#[test]
fn auto_falls_back_to_ptrace_under_a_seccomp_filter() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("pt-seccomp");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let wrapper = compile(&dir, "no_perf", &["no_perf.c"], &["-O2"]);
    let folded = dir.path("s.folded");
    let out = run_ok(
        Command::new(&wrapper)
            .arg(env!("CARGO_BIN_EXE_superprof"))
            .args(["record", "-q", "-o"])
            .arg(&folded)
            .arg("--")
            .arg(&exe)
            .arg("1.5")
            .current_dir(&dir.0),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let notice: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("sampling with ptrace instead"))
        .collect();
    assert_eq!(notice.len(), 1, "{stderr}");
    check_split_shares(&out, &Folded::read(&folded));
    // Asked for explicitly, perf is refused with the reason.
    let denied = Command::new(&wrapper)
        .arg(env!("CARGO_BIN_EXE_superprof"))
        .args(["record", "--sampler", "perf", "-o"])
        .arg(dir.path("x.folded"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("permission denied"));
}

#[test]
fn attach_with_ptrace_then_process_runs_on_unchanged() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("pt-attach");
    let exe = compile(&dir, "attach", &["attach.c"], &["-O2", "-g", "-pthread"]);
    let (mut child, _stdout) = spawn_ready(&exe, &["30", "1.0"]);
    let pid = child.id();
    let before = code_bytes(pid, &exe);
    let folded = dir.path("a.folded");
    let out = run_limited(
        superprof()
            .args([
                "record",
                "--sampler",
                "ptrace",
                "-q",
                "--duration",
                "2.5",
                "-p",
                &pid.to_string(),
                "-o",
            ])
            .arg(&folded),
        Duration::from_secs(30),
    );
    let alive = child.try_wait().unwrap().is_none();
    assert!(alive, "the process died");
    assert_running_untraced(pid);
    let after = code_bytes(pid, &exe);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(before == after, "code bytes changed");
    let f = Folded::read(&folded);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        f.share_through("attached_spin") > 0.3,
        "{:?}\n{stderr}",
        (f.share_per_root(), f.leaves())
    );
    assert!(
        f.share_through("late_thread_spin") > 0.2,
        "thread started after attach not followed: {:?}\n{stderr}",
        (f.share_per_root(), f.leaves())
    );
}

fn signals_fixture(dir: &TempDir) -> std::path::PathBuf {
    compile(dir, "signals", &["signals.c"], &["-O2", "-g"])
}

#[test]
fn exit_status_and_output_are_unchanged_under_every_sampler() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("pt-status");
    let sig = signals_fixture(&dir);
    for (args, code) in [
        (vec!["segv", "0.3"], 128 + 11),
        (vec!["sigkill", "0.3"], 128 + 9),
        (vec!["usr1"], 0),
    ] {
        let bare = Command::new(&sig).args(&args).output().unwrap();
        let bare_code = bare.status.code().unwrap_or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            128 + bare.status.signal().unwrap()
        });
        assert_eq!(bare_code, code, "bare run of {args:?}");
        for sampler in ["perf", "ptrace"] {
            let out = run_limited(
                superprof()
                    .args(["record", "-q", "--sampler", sampler, "-o"])
                    .arg(dir.path("x.folded"))
                    .arg("--")
                    .arg(&sig)
                    .args(&args),
                Duration::from_secs(30),
            );
            assert_eq!(
                out.status.code(),
                Some(code),
                "{args:?} under {sampler}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                out.stdout, bare.stdout,
                "{args:?} under {sampler}: output differs"
            );
        }
        // And under the syscall log.
        let out = run_limited(
            superprof()
                .args(["syscalls", "--summary-only", "-o"])
                .arg(dir.path("s.txt"))
                .arg("--")
                .arg(&sig)
                .args(&args),
            Duration::from_secs(30),
        );
        assert_eq!(out.status.code(), Some(code), "{args:?} under syscalls");
        assert_eq!(
            out.stdout, bare.stdout,
            "{args:?} under syscalls: output differs"
        );
    }
}

#[test]
fn a_target_that_handles_sigterm_itself_keeps_its_exit_status() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("pt-sigterm");
    let sig = signals_fixture(&dir);
    for sampler in ["perf", "ptrace"] {
        // --duration ends the command with SIGTERM, which it handles: exit 3.
        let out = run_limited(
            superprof()
                .args([
                    "record",
                    "-q",
                    "--duration",
                    "1",
                    "--sampler",
                    sampler,
                    "-o",
                ])
                .arg(dir.path("t.folded"))
                .arg("--")
                .arg(&sig)
                .arg("sigterm"),
            Duration::from_secs(30),
        );
        assert_eq!(
            out.status.code(),
            Some(3),
            "{sampler}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("got SIGTERM"), "{stdout}");
        let cpu = fixture_values(&stdout)["cpu_ms"] / 1000.0;
        assert_sample_count(
            sampler,
            Folded::read(&dir.path("t.folded")).total(),
            cpu,
            999.0,
            perf_cpu_clock_rate(999),
        );
    }
}

#[test]
fn a_target_that_blocks_sigint_is_neither_hung_nor_harmed() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("pt-sigint");
    let sig = signals_fixture(&dir);
    for sampler in ["perf", "ptrace"] {
        let folded = dir.path("i.folded");
        let mut rec = superprof()
            .args(["record", "-q", "--sampler", sampler, "-o"])
            .arg(&folded)
            .arg("--")
            .arg(&sig)
            .args(["block-sigint", "1.5"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(rec.stdout.take().unwrap()).lines();
        assert_eq!(lines.next().unwrap().unwrap(), "ready");
        // SIGINT to the target only: it is blocked there, so the target finishes its work.
        let pattern = format!("^{} block-sigint", sig.display());
        let target = Command::new("pgrep")
            .args(["-f", &pattern])
            .output()
            .unwrap();
        assert!(!target.stdout.is_empty(), "target not found");
        for pid in String::from_utf8_lossy(&target.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-INT", pid]).status();
        }
        let start = Instant::now();
        let status = loop {
            if let Some(s) = rec.try_wait().unwrap() {
                break s;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{sampler}: hung");
            std::thread::sleep(Duration::from_millis(20));
        };
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        assert_eq!(status.code(), Some(0), "{sampler}");
        assert_eq!(rest, vec!["done".to_string()], "{sampler}");
        // It burnt 1.5 s of CPU time.
        assert_sample_count(
            sampler,
            Folded::read(&folded).total(),
            1.5,
            999.0,
            perf_cpu_clock_rate(999),
        );
    }
}

#[test]
fn sixty_four_churning_threads_hang_nothing_and_lose_no_thread() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("pt-churn");
    // Not named "churn": the main thread's name must differ from the workers'.
    let exe = compile(&dir, "churner", &["churn.c"], &["-O2", "-g", "-pthread"]);
    for sampler in ["perf", "ptrace"] {
        let pq = dir.path(&format!("{sampler}.parquet"));
        let out = run_limited(
            superprof()
                .args(["record", "-q", "--sampler", sampler, "-o"])
                .arg(&pq)
                .arg("--")
                .arg(&exe)
                .args(["5", "0.03"]),
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "{sampler}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let created = fixture_values(&String::from_utf8_lossy(&out.stdout))["created"] as u64;
        let py = Command::new("python3")
            .arg("-c")
            .arg(
                "import pyarrow.parquet as pq, sys\n\
                 t = pq.read_table(sys.argv[1]).to_pydict()\n\
                 print(len({tid for tid, n in zip(t['tid'], t['thread_name']) if n == 'churn'}))",
            )
            .arg(&pq)
            .output()
            .unwrap();
        assert!(
            py.status.success(),
            "{}",
            String::from_utf8_lossy(&py.stderr)
        );
        let seen: u64 = String::from_utf8_lossy(&py.stdout).trim().parse().unwrap();
        // Threads replaced, more than once each: 64 at a time, each 30 ms of CPU time, over
        // 5 s on two cores would be about 330; a host that gives the machine less, fewer
        // (195 once, throttled to one core's worth).
        assert!(created > 128, "only {created} threads created");
        assert_eq!(
            seen, created,
            "{sampler}: {seen} of {created} threads in the profile"
        );
    }
}
