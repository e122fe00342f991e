//! `superprof agent --push DEST` (issue 18): continuous profiling of the whole machine, one
//! profile per process and interval. Two processes whose functions split their CPU time in
//! known, different ways run beside the agent; each profile pushed for them, interval after
//! interval, has the split each measured of itself. A server that is down, then up: intervals
//! wait in a bounded queue, the oldest dropped and counted. SIGTERM pushes what is left.
#![allow(clippy::disallowed_macros)] // a test's own diagnostics

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// The samples of a gzipped pprof, and how many of them pass through each function.
fn shares(gz: &[u8]) -> (u64, BTreeMap<String, u64>) {
    let (mut total, mut through) = (0, BTreeMap::new());
    for (_, mut names, n) in pprof::samples(gz) {
        total += n;
        names.sort();
        names.dedup();
        for name in names {
            *through.entry(name).or_insert(0) += n;
        }
    }
    (total, through)
}

/// The query of a Pyroscope ingest request line, decoded.
fn query(line: &str) -> BTreeMap<String, String> {
    let target = line.split(' ').nth(1).unwrap();
    let q = target.split_once('?').unwrap().1;
    let unescape = |s: &str| {
        let mut out = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    };
    q.split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_owned(), unescape(v)))
        .collect()
}

/// The labels of a series name `APP.cpu{K=V,...}`.
fn labels(name: &str) -> BTreeMap<String, String> {
    let inner = name.split_once('{').unwrap().1.trim_end_matches('}');
    inner
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn spawn_split(exe: &std::path::Path, args: &[&str]) -> Child {
    Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn agent() -> Command {
    let mut c = superprof();
    c.arg("agent");
    c
}

#[test]
fn two_processes_of_known_split_each_interval_pushed() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("agent-split");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = serve_http_all(listener);
    // Each process burns one CPU for 11 s; the agent takes three intervals of 3 s meanwhile.
    let mut a = spawn_split(&exe, &["11", "50", "30", "20"]);
    let mut b = spawn_split(&exe, &["11", "20", "30", "50"]);
    std::thread::sleep(Duration::from_millis(300));
    let out = agent()
        .args(["--push", &format!("pyroscope:http://127.0.0.1:{port}")])
        .args(["--interval", "3s", "--duration", "9s", "-F", "1999"])
        .args(["--label", "env=ci"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("intervals pushed"), "{stderr}");
    // Their cgroup, as /proc says (the label is left out at the root).
    let cgroups: Vec<Option<String>> = [&a, &b]
        .iter()
        .map(|c| {
            let text = std::fs::read_to_string(format!("/proc/{}/cgroup", c.id())).unwrap();
            let path = text
                .lines()
                .find_map(|l| l.strip_prefix("0::"))?
                .trim()
                .to_owned();
            (path != "/").then_some(path)
        })
        .collect();
    let own: Vec<BTreeMap<String, f64>> = [&mut a, &mut b]
        .into_iter()
        .map(|c| {
            let mut s = String::new();
            c.stdout.take().unwrap().read_to_string(&mut s).unwrap();
            c.wait().unwrap();
            fixture_values(&s)
        })
        .collect();
    let requests = got.lock().unwrap().clone();
    let cgroup = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok();
    let _ = cgroup;
    for (child, truth, cgroup) in [(&a, &own[0], &cgroups[0]), (&b, &own[1], &cgroups[1])] {
        let pid = child.id().to_string();
        // Its profiles, in the order pushed: one per interval.
        let mine: Vec<_> = requests
            .iter()
            .filter(|(line, _, _)| labels(&query(line)["name"]).get("pid") == Some(&pid))
            .collect();
        assert!(
            mine.len() >= 3,
            "{} profiles of {pid}: {stderr}",
            mine.len()
        );
        let mut starts = Vec::new();
        for (line, _, body) in mine.iter().take(3) {
            let q = query(line);
            let l = labels(&q["name"]);
            assert!(q["name"].starts_with("split.cpu{"), "{}", q["name"]);
            assert_eq!(l["process_name"], "split");
            assert_eq!(l["env"], "ci");
            assert!(l.contains_key("host"), "{l:?}");
            assert_eq!(l.get("cgroup"), cgroup.as_ref(), "{l:?}");
            starts.push(q["from"].parse::<u64>().unwrap());
            let (total, through) = shares(body);
            // About 1,000 samples a second of one busy CPU (cpu-clock delivers half the asked
            // rate here): 4σ of a share stays under the 5 points.
            assert!(total > 1500, "{total} samples in an interval of {pid}");
            for f in ["work_alpha", "work_beta", "work_gamma"] {
                let p = truth[f];
                let share = *through.get(f).unwrap_or(&0) as f64 / total as f64;
                let sigma = (p * (1.0 - p) / total as f64).sqrt();
                eprintln!(
                    "{f} of {pid}: {share:.4} of {total} samples, measured {p:.4}, 4σ {:.4}",
                    4.0 * sigma
                );
                assert!(
                    (share - p).abs() < (4.0 * sigma + 0.005).min(0.05),
                    "{f} of {pid}: {share:.3} of {total} samples, the program measured {p:.3}"
                );
            }
        }
        // Three intervals one after the other (Unix seconds: 3 apart, within rounding).
        assert!(
            starts.windows(2).all(|w| (2..=4).contains(&(w[1] - w[0]))),
            "{starts:?}"
        );
    }
}

#[test]
fn a_server_down_then_up_gets_the_queued_intervals_and_the_drops_are_counted() {
    let _cpu = cpu_share();
    let dir = TempDir::new("agent-down");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let mut busy = spawn_split(&exe, &["6"]);
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // Down for the first 2.6 s: five intervals of 0.5 s for a queue of 2.
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(2600));
        serve_http_all(TcpListener::bind(("127.0.0.1", port)).unwrap())
    });
    let out = agent()
        .args(["--push", &format!("pyroscope:http://127.0.0.1:{port}")])
        .args(["--interval", "500ms", "--buffer", "2", "--duration", "4s"])
        .args(["--pid", &busy.id().to_string(), "-F", "199"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let got = late.join().unwrap();
    let requests = got.lock().unwrap().clone();
    // "superprof agent: N intervals pushed (P profiles, B bytes); D intervals dropped while..."
    let last = stderr.lines().last().unwrap();
    let count_before = |what: &str| -> u64 {
        let head = last.split(what).next().unwrap();
        let digits: String = head
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_digit())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("no count before '{what}' in: {last}"))
    };
    let pushed = count_before(" intervals pushed");
    let dropped = if last.contains("dropped") {
        count_before(" intervals dropped")
    } else {
        0
    };
    assert!(dropped >= 1, "{stderr}");
    assert_eq!(
        stderr.matches("dropped (").count() as u64,
        dropped,
        "{stderr}"
    );
    // Every interval was either pushed or dropped: 4 s of 0.5 s intervals (and the rest
    // at the stop).
    assert!((8..=10).contains(&(pushed + dropped)), "{stderr}");
    // One profile per interval pushed (the one process), the queued ones among them.
    assert_eq!(requests.len() as u64, pushed, "{stderr}");
    let _ = busy.kill();
    let _ = busy.wait();
}

#[test]
fn sigterm_pushes_the_interval_under_way() {
    let _cpu = cpu_share();
    let dir = TempDir::new("agent-term");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let mut busy = spawn_split(&exe, &["5"]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = serve_http_all(listener);
    let mut agent = agent()
        .args(["--push", &format!("pyroscope:http://127.0.0.1:{port}")])
        .args(["--interval", "60s", "--pid", &busy.id().to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: SIGTERM to our own child.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let status = agent.wait().unwrap();
    let mut stderr = String::new();
    agent
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{stderr}");
    let requests = got.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "{stderr}");
    let (total, _) = shares(&requests[0].2);
    // 19 Hz (half of it delivered by cpu-clock here) for about 1.5 s of one busy process.
    assert!(total >= 5, "{total} samples: {stderr}");
    assert!(stderr.contains("1 interval pushed"), "{stderr}");
    let _ = busy.kill();
    let _ = busy.wait();
}
