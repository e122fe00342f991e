//! Every format round-trips: one recording of four threads (threads.c, 1:2:3:4 units of CPU)
//! written by `record` as folded stacks, Parquet, pprof, speedscope, Firefox's processed
//! profile and an SVG flamegraph, and the same formats written again by `report` from the
//! Parquet file. Each file, read back as its own readers read it (pprof's protobuf, speedscope's
//! and Firefox's JSON tables, the SVG's frame titles), gives exactly the stacks and counts of
//! the folded output, per thread; and the threads' shares are what each measured of itself.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;

/// "thread;root;...;leaf" -> samples, as superprof's folded output has them.
type Stacks = BTreeMap<String, u64>;

fn folded(path: &Path) -> Stacks {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let (s, n) = l.rsplit_once(' ').unwrap();
            (s.to_owned(), n.parse().unwrap())
        })
        .collect()
}

/// A stack of names, root first, under its thread; "[unknown]" for a sample with none.
fn key(thread: &str, frames: &[String]) -> String {
    if frames.is_empty() {
        format!("{thread};[unknown]")
    } else {
        format!("{thread};{}", frames.join(";"))
    }
}

fn pprof_stacks(path: &Path) -> Stacks {
    let mut out = Stacks::new();
    for (thread, frames, n) in pprof::samples(&std::fs::read(path).unwrap()) {
        *out.entry(key(&thread.expect("a thread label"), &frames))
            .or_default() += n;
    }
    out
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn speedscope_stacks(path: &Path) -> Stacks {
    let d = json(path);
    let frames = d["shared"]["frames"].as_array().unwrap();
    let mut out = Stacks::new();
    for p in d["profiles"].as_array().unwrap() {
        // "NAME (TID)"
        let name = p["name"].as_str().unwrap();
        let thread = name.rsplit_once(" (").unwrap().0;
        let period = 1e9 / 999.0;
        for (stack, w) in p["samples"]
            .as_array()
            .unwrap()
            .iter()
            .zip(p["weights"].as_array().unwrap())
        {
            let names: Vec<String> = stack
                .as_array()
                .unwrap()
                .iter()
                .map(|i| {
                    frames[i.as_u64().unwrap() as usize]["name"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect();
            let n = (w.as_f64().unwrap() / period).round() as u64;
            *out.entry(key(thread, &names)).or_default() += n;
        }
    }
    out
}

fn firefox_stacks(path: &Path) -> Stacks {
    let d = json(path);
    let mut out = Stacks::new();
    for t in d["threads"].as_array().unwrap() {
        let thread = t["name"].as_str().unwrap();
        let strings = t["stringArray"].as_array().unwrap();
        let st = &t["stackTable"];
        let (prefix, frame) = (
            st["prefix"].as_array().unwrap(),
            st["frame"].as_array().unwrap(),
        );
        let func = t["frameTable"]["func"].as_array().unwrap();
        let names = t["funcTable"]["name"].as_array().unwrap();
        let samples = &t["samples"];
        let weights = samples["weight"].as_array();
        for (i, stack) in samples["stack"].as_array().unwrap().iter().enumerate() {
            let mut frames = Vec::new();
            let mut at = stack.as_u64();
            while let Some(s) = at {
                let f = func[frame[s as usize].as_u64().unwrap() as usize]
                    .as_u64()
                    .unwrap();
                let n = names[f as usize].as_u64().unwrap();
                frames.push(strings[n as usize].as_str().unwrap().to_owned());
                at = prefix[s as usize].as_u64();
            }
            frames.reverse();
            let w = weights.map_or(1, |w| w[i].as_u64().unwrap());
            *out.entry(key(thread, &frames)).or_default() += w;
        }
    }
    out
}

/// The samples under each thread's root frame of the flamegraph, from its `<title>`s
/// ("NAME (N samples, P%)" at the depth below "all").
fn svg_threads(path: &Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut totals = BTreeMap::new();
    for g in text.split("<g>").skip(1) {
        let Some(title) = g
            .split("<title>")
            .nth(1)
            .and_then(|t| t.split("</title>").next())
        else {
            continue;
        };
        // The root frames sit just above "all": their rectangle's y is the lowest but one.
        let y: f64 = g
            .split(" y=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let Some((name, rest)) = title.rsplit_once(" (") else {
            continue;
        };
        let n: u64 = rest
            .split(' ')
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap_or(0);
        totals
            .entry(y as i64)
            .or_insert_with(BTreeMap::new)
            .insert(name.to_owned(), n);
    }
    // The "all" frame is the deepest row; the thread roots the one above it.
    let mut rows: Vec<_> = totals.into_iter().collect();
    rows.sort_by_key(|(y, _)| -*y);
    rows.get(1).map(|(_, r)| r.clone()).unwrap_or_default()
}

/// Per thread, the sum of its stacks.
fn per_thread(stacks: &Stacks) -> BTreeMap<String, u64> {
    let mut t = BTreeMap::new();
    for (k, n) in stacks {
        *t.entry(k.split(';').next().unwrap().to_owned())
            .or_default() += n;
    }
    t
}

fn check_all(dir: &TempDir, prefix: &str, truth: &Stacks, from: &str) {
    let p = |ext: &str| dir.path(&format!("{prefix}.{ext}"));
    assert_eq!(&folded(&p("folded")), truth, "{from}: folded");
    assert_eq!(&pprof_stacks(&p("pb.gz")), truth, "{from}: pprof");
    assert_eq!(
        &speedscope_stacks(&p("speedscope.json")),
        truth,
        "{from}: speedscope"
    );
    assert_eq!(
        &firefox_stacks(&p("firefox.json")),
        truth,
        "{from}: firefox"
    );
    assert_eq!(svg_threads(&p("svg")), per_thread(truth), "{from}: svg");
}

#[test]
fn every_format_round_trips_a_four_thread_recording() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("formats");
    let exe = compile(&dir, "threads", &["threads.c"], &["-O2", "-g", "-pthread"]);
    let formats = [
        "parquet",
        "folded",
        "pb.gz",
        "speedscope.json",
        "firefox.json",
        "svg",
    ];
    let mut cmd = superprof();
    cmd.args(["record", "-q", "-F", "999"]);
    for f in formats {
        cmd.arg("-o").arg(dir.path(&format!("r.{f}")));
    }
    let out = run_ok(cmd.arg("--").arg(&exe).arg("0.25"));
    let truth = folded(&dir.path("r.folded"));
    // Four worker threads, their shares as they measured their own CPU time.
    let threads = per_thread(&truth);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let cpu: BTreeMap<String, f64> = stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("thread ")?;
            let (name, v) = rest.split_once(" cpu=")?;
            Some((name.to_owned(), v.trim().parse().ok()?))
        })
        .collect();
    assert_eq!(cpu.len(), 4, "{stdout}");
    let all: f64 = cpu.values().sum();
    let workers: u64 = cpu
        .keys()
        .map(|t| threads.get(t).copied().unwrap_or(0))
        .sum();
    for (t, c) in &cpu {
        assert_share(t, threads[t] as f64 / workers as f64, c / all, workers);
    }
    check_all(&dir, "r", &truth, "record");
    // The same formats from the Parquet file.
    for f in ["folded", "pb.gz", "speedscope.json", "firefox.json", "svg"] {
        run_ok(
            superprof()
                .arg("report")
                .arg(dir.path("r.parquet"))
                .arg("-o")
                .arg(dir.path(&format!("p.{f}"))),
        );
    }
    check_all(&dir, "p", &truth, "report");
}
