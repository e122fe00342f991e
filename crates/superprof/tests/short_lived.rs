//! Short-lived tasks (issue 14): a fork storm whose children each use less CPU time than one
//! sampling period. As root, `record` samples a launched command per CPU through a cgroup of
//! its own, so the children are sampled: their share of the samples is the program's own
//! getrusage split, within 4σ, as `perf record -a` gives on the same program.

mod common;

use std::process::Command;

use common::*;

/// Samples of the parent and of the others (its children: `column` pid for processes, tid
/// for threads), from a Parquet profile.
fn split_by(parquet: &std::path::Path, column: &str, parent: u32) -> (u64, u64) {
    let py = Command::new("python3")
        .arg("-c")
        .arg(
            "import pyarrow.parquet as pq, sys\n\
             t = pq.read_table(sys.argv[1]).to_pydict()\n\
             c, p = t[sys.argv[3]], int(sys.argv[2])\n\
             print(sum(1 for x in c if x == p), sum(1 for x in c if x != p))",
        )
        .arg(parquet)
        .arg(parent.to_string())
        .arg(column)
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    let text = String::from_utf8_lossy(&py.stdout);
    let mut w = text.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    (w.next().unwrap(), w.next().unwrap())
}

#[test]
fn a_fork_storm_is_sampled_as_its_getrusage_says() {
    storm("forkstorm", "pid", &[]);
}

#[test]
fn a_thread_churn_is_sampled_as_its_thread_clocks_say() {
    storm("threadstorm", "tid", &["-pthread"]);
}

/// Runs fixture `name` (600 short tasks) under superprof and under perf -a; the tasks' share
/// of the samples (told apart by `column`) is the fixture's own within 4σ in both.
fn storm(name: &str, column: &str, flags: &[&str]) {
    let _cpu = cpu_lock();
    require_root("per-CPU sampling of a cgroup");
    let dir = TempDir::new(name);
    let mut all = vec!["-O2", "-g"];
    all.extend(flags);
    let exe = compile(&dir, name, &[&format!("{name}.c")], &all);
    // A cgroup an earlier superprof left behind (killed with SIGKILL): the next run removes it.
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // (superprof makes its cgroups inside its own, which is this test's.)
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap()
        .trim()
        .to_owned();
    let stale = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2")
                .then(|| std::path::PathBuf::from(left.split_whitespace().nth(4).unwrap()))
        })
        .map(|root| {
            root.join(own.trim_start_matches('/'))
                .join(format!("superprof-{}-deadbeef", pid_max + 1))
        });
    if let Some(s) = &stale {
        std::fs::create_dir(s).unwrap();
    }
    let pq = dir.path("storm.parquet");
    let out = run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&pq)
            .arg("--")
            .arg(&exe)
            .arg("600"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("(per CPU)"), "{stderr}");
    if let Some(s) = &stale {
        assert!(!s.exists(), "{} left", s.display());
    }
    let own = fixture_values(&String::from_utf8_lossy(&out.stdout));
    let (parent, children) = split_by(&pq, column, own["parent"] as u32);
    let n = (parent + children) as f64;
    let share = children as f64 / n;
    let want = own["share"];
    let sigma = (want * (1.0 - want) / n).sqrt();
    assert!(
        (share - want).abs() < 4.0 * sigma,
        "children {children} of {n} samples ({share:.3}), getrusage says {want:.3}: {stderr}"
    );
    // About one sample per period of the tree's CPU time: the timer ran on across the forks
    // (per task, a new timer in every child, 54% of the periods were sampled here).
    let cpu = own["children"] + own["self"];
    assert!(
        n > 0.8 * cpu * 999.0,
        "{n} samples for {cpu:.2} s: {stderr}"
    );
    // perf record -a on the same program: the same split.
    let data = dir.path("perf.data");
    let out = Command::new("perf")
        .args(["record", "-q", "-a", "-F", "999", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&exe)
        .arg("600")
        .output()
        .unwrap();
    assert!(out.status.success());
    let own = fixture_values(&String::from_utf8_lossy(&out.stdout));
    let script = Command::new("perf")
        .args(["script", "-F", &format!("{column},comm"), "-i"])
        .arg(&data)
        .output()
        .unwrap();
    let (mut p, mut c) = (0u64, 0u64);
    for l in String::from_utf8_lossy(&script.stdout).lines() {
        // "COMM PID" (perf prints the command first whatever the order asked).
        let mut w = l.split_whitespace();
        let (Some(comm), Some(pid)) = (w.next(), w.next()) else {
            continue;
        };
        if comm != name {
            continue;
        }
        if pid.parse::<u32>().ok() == Some(own["parent"] as u32) {
            p += 1;
        } else {
            c += 1;
        }
    }
    let perf_share = c as f64 / (p + c) as f64;
    let sigma = (own["share"] * (1.0 - own["share"]) / (p + c) as f64).sqrt();
    assert!(
        (perf_share - own["share"]).abs() < 4.0 * sigma,
        "perf -a: children {c} of {} ({perf_share:.3}), getrusage says {:.3}",
        p + c,
        own["share"]
    );
}

/// Without the right to sample per CPU (an ordinary user), per-task sampling misses part of a
/// fork storm: `record` says how much of the command's CPU time its samples cover, the CPU
/// time being the program's own getrusage (user time: an ordinary user samples user space).
#[test]
fn per_task_sampling_says_what_it_could_not_see() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("forkstorm-user");
    let exe = compile(&dir, "forkstorm", &["forkstorm.c"], &["-O2", "-g"]);
    let out = superprof_as_nobody()
        .args(["record", "-q", "--"])
        .arg(&exe)
        .arg("600")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("(per CPU)"), "{stderr}");
    let own = fixture_values(&String::from_utf8_lossy(&out.stdout));
    let said: f64 = stderr
        .split("% of the ")
        .nth(1)
        .and_then(|s| s.split(" s of user CPU time").next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no user CPU time in the notice: {stderr}"));
    // The tree's user time as the program measured it (the fork storm's getrusage; the
    // children's rusage superprof reads also holds the program's own exit, a few ms).
    assert!(
        (said - own["user"]).abs() < 0.03 + 0.05 * own["user"],
        "notice {said} s, getrusage {} s: {stderr}",
        own["user"]
    );
    let cover: f64 = stderr
        .split("the samples cover ")
        .nth(1)
        .and_then(|s| s.split('%').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no cover notice: {stderr}"));
    // And the summary's rate says the same: delivered ÷ asked.
    let delivered: f64 = stderr
        .split(" Hz delivered")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        (cover - 100.0 * delivered / 999.0).abs() < 1.5,
        "{cover}% vs {delivered} Hz: {stderr}"
    );
    assert!(cover < 80.0, "{stderr}");
}
