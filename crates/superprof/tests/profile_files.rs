//! Profile files read by real clients: DuckDB and pyarrow (Parquet), `go tool pprof`,
//! speedscope's own JSON schema, and the fields the Firefox Profiler requires; plus the
//! filters of `superprof report` and its bad input.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// One recording of the split fixture (one thread; tests/formats.rs takes four) shared by the
/// tests of this file, in several formats written by the same run.
struct Recording {
    _dir: TempDir,
    parquet: PathBuf,
    folded: PathBuf,
    truth: BTreeMap<String, f64>,
}

fn recording() -> &'static Recording {
    static R: OnceLock<Recording> = OnceLock::new();
    R.get_or_init(|| {
        let _cpu = cpu_lock();
        let dir = TempDir::new("files");
        let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
        let parquet = dir.path("p.parquet");
        let folded = dir.path("p.folded");
        let out = run_ok(
            superprof()
                .args(["record", "-q", "-o"])
                .arg(&parquet)
                .arg("-o")
                .arg(&folded)
                .arg("--")
                .arg(&exe)
                .arg("2.5"),
        );
        let truth = fixture_values(&String::from_utf8_lossy(&out.stdout));
        Recording {
            _dir: dir,
            parquet,
            folded,
            truth,
        }
    })
}

fn python(script: &str, args: &[&Path]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python failed (run ./scripts/test to install duckdb, pyarrow and jsonschema): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn report(args: &[&str]) -> String {
    let r = recording();
    let out = run_ok(superprof().arg("report").arg(&r.parquet).args(args));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// "function count" lines into a map.
fn counts(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (f, n) = l.rsplit_once(' ')?;
            Some((f.to_owned(), n.trim().parse().ok()?))
        })
        .collect()
}

/// Self samples per function from the top table of `superprof report`.
fn top_self_counts() -> BTreeMap<String, u64> {
    let text = report(&["--format", "top"]);
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let n: u64 = w.get(2)?.parse().ok()?;
            let f = w.get(3)?.to_string();
            (n > 0).then_some((f, n))
        })
        .collect()
}

#[test]
fn duckdb_counts_leaf_functions_like_report() {
    let r = recording();
    let duck = counts(&python(
        "import duckdb, sys\n\
         rows = duckdb.sql(f\"select stack[1].function, count(*) from read_parquet('{sys.argv[1]}') \
         where len(stack) > 0 group by 1\").fetchall()\n\
         for f, n in rows: print(f, n)",
        &[&r.parquet],
    ));
    let ours = top_self_counts();
    assert!(ours.len() >= 3, "{ours:?}");
    for (f, n) in &ours {
        assert_eq!(duck.get(f), Some(n), "DuckDB and report disagree on {f}");
    }
}

#[test]
fn pyarrow_reads_samples_and_metadata() {
    let r = recording();
    let py = counts(&python(
        "import pyarrow.parquet as pq, sys, collections\n\
         t = pq.read_table(sys.argv[1])\n\
         c = collections.Counter(s[0]['function'] for s in t.column('stack').to_pylist() if s)\n\
         for f, n in c.items(): print(f, n)\n\
         m = t.schema.metadata\n\
         print('meta_freq', int(m[b'superprof.frequency_hz']))\n\
         print('rows', t.num_rows)",
        &[&r.parquet],
    ));
    assert_eq!(py["meta_freq"], 999);
    let folded = Folded::read(&r.folded);
    assert_eq!(py["rows"], folded.total());
    for (f, n) in top_self_counts() {
        assert_eq!(py.get(&f), Some(&n), "pyarrow and report disagree on {f}");
    }
}

#[test]
fn folded_from_parquet_equals_folded_from_record() {
    let r = recording();
    let from_report = report(&["--format", "folded"]);
    let from_record = std::fs::read_to_string(&r.folded).unwrap();
    assert_eq!(from_report, from_record);
}

#[test]
fn go_pprof_shows_the_hot_functions_with_their_shares() {
    let r = recording();
    let dir = TempDir::new("pprof");
    let pb = dir.path("p.pb.gz");
    run_ok(superprof().arg("report").arg(&r.parquet).arg("-o").arg(&pb));
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-sample_index=samples"])
        .arg(&pb)
        .env("HOME", &dir.0)
        .output()
        .expect("go runs (./scripts/test installs golang-go)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Lines: flat flat% sum% cum cum% name
    let cum: BTreeMap<String, f64> = text
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() < 6 {
                return None;
            }
            Some((
                w[5..].join(" "),
                w[4].strip_suffix('%')?.parse::<f64>().ok()? / 100.0,
            ))
        })
        .collect();
    for f in ["work_alpha", "work_beta", "work_gamma"] {
        let share = *cum
            .get(f)
            .unwrap_or_else(|| panic!("{f} missing from pprof -top:\n{text}"));
        let n = Folded::read(&r.folded).total();
        assert_share(&format!("{f} in go tool pprof"), share, r.truth[f], n);
    }
    // File and line come through: the -list view shows the fixture's source lines.
    let list = Command::new("go")
        .args(["tool", "pprof", "-traces"])
        .arg(&pb)
        .env("HOME", &dir.0)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&list.stdout).contains("work_alpha"));
    let lines = Command::new("go")
        .args(["tool", "pprof", "-top", "-lines"])
        .arg(&pb)
        .env("HOME", &dir.0)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&lines.stdout).contains("split.c:"),
        "no file:line in pprof -lines"
    );
}

fn speedscope_schema() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/test-deps/speedscope/file-format-schema.json");
    assert!(
        p.exists(),
        "{} missing: ./scripts/test fetches it with npm",
        p.display()
    );
    p
}

#[test]
fn speedscope_file_satisfies_the_schema() {
    let r = recording();
    let dir = TempDir::new("speedscope");
    let json = dir.path("p.speedscope.json");
    run_ok(
        superprof()
            .arg("report")
            .arg(&r.parquet)
            .arg("-o")
            .arg(&json),
    );
    let out = python(
        "import json, sys, jsonschema, pyarrow.parquet as pq\n\
         schema = json.load(open(sys.argv[1])); doc = json.load(open(sys.argv[2]))\n\
         hz = int(pq.read_metadata(sys.argv[3]).metadata[b'superprof.frequency_hz'])\n\
         jsonschema.validate(doc, schema)\n\
         nframes = len(doc['shared']['frames'])\n\
         total = 0; entries = 0\n\
         for p in doc['profiles']:\n\
         \x20   assert len(p['samples']) == len(p['weights']), 'weights'\n\
         \x20   assert all(0 <= i < nframes for s in p['samples'] for i in s), 'frame index'\n\
         \x20   assert all(a != b for a, b in zip(p['samples'], p['samples'][1:])), 'repeat'\n\
         \x20   total += sum(p['weights']); entries += len(p['samples'])\n\
         print('samples', round(total * hz / 1e9))\n\
         print('entries', entries)",
        &[&speedscope_schema(), &json, &r.parquet],
    );
    // Consecutive samples of one stack are one entry of their summed weight.
    let folded = Folded::read(&r.folded).total();
    assert_eq!(counts(&out)["samples"], folded);
    assert!(counts(&out)["entries"] < folded, "{out}");
}

#[test]
fn firefox_file_has_the_fields_the_profiler_requires() {
    let r = recording();
    let dir = TempDir::new("firefox");
    let json = dir.path("p.firefox.json");
    run_ok(
        superprof()
            .arg("report")
            .arg(&r.parquet)
            .arg("-o")
            .arg(&json),
    );
    let out = python(
        "import json, sys\n\
         d = json.load(open(sys.argv[1]))\n\
         m = d['meta']\n\
         for k in ['version', 'interval', 'startTime', 'product', 'categories']: assert k in m, k\n\
         n = 0\n\
         for t in d['threads']:\n\
         \x20   for k in ['samples', 'stackTable', 'frameTable', 'funcTable', 'name', 'tid', 'pid']: assert k in t, k\n\
         \x20   s = t['samples']; n += s['length']\n\
         \x20   assert 'stack' in s and ('time' in s or 'timeDeltas' in s)\n\
         \x20   assert all(x is None or x < t['stackTable']['length'] for x in s['stack'])\n\
         \x20   assert all(f < t['frameTable']['length'] for f in t['stackTable']['frame'])\n\
         \x20   assert all(f < t['funcTable']['length'] for f in t['frameTable']['func'])\n\
         print('samples', n)",
        &[&json],
    );
    assert_eq!(counts(&out)["samples"], Folded::read(&r.folded).total());
}

#[test]
fn filters_give_the_expected_subsets() {
    let r = recording();
    let all = Folded::read(&r.folded);
    // --focus: only stacks through work_beta, re-rooted there.
    let focus = Folded::parse(&report(&["--format", "folded", "--focus", "work_beta"]));
    assert!(
        focus.0.iter().all(|(s, _)| s[1] == "work_beta"),
        "not re-rooted"
    );
    // DuckDB counts the samples whose stack passes through work_beta.
    let duck_through = counts(&python(
        "import duckdb, sys\n\
         print('n', duckdb.sql(f\"select count(*) from read_parquet('{sys.argv[1]}') \
         where list_contains([f.function for f in stack], 'work_beta')\").fetchall()[0][0])",
        &[&r.parquet],
    ));
    assert_eq!(focus.total(), duck_through["n"]);
    // --exclude: everything else.
    let excl = Folded::parse(&report(&["--format", "folded", "--exclude", "work_beta"]));
    assert!(!excl
        .0
        .iter()
        .any(|(s, _)| s.iter().any(|f| f == "work_beta")));
    assert_eq!(excl.total() + focus.total(), all.total());
    // --since / --until: DuckDB counts the same window.
    let window = Folded::parse(&report(&[
        "--format", "folded", "--since", "0.5", "--until", "1.5",
    ]));
    let duck = counts(&python(
        "import duckdb, sys\n\
         print('n', duckdb.sql(f\"select count(*) from read_parquet('{sys.argv[1]}') \
         where time_ns >= 500000000 and time_ns < 1500000000\").fetchall()[0][0])",
        &[&r.parquet],
    ));
    assert_eq!(window.total(), duck["n"]);
    // 1 s of the 2.5 s the fixture runs on its one CPU: 40% of the samples, whatever the rate.
    let n = all.total();
    assert_share(
        "the second 0.5-1.5",
        window.total() as f64 / n as f64,
        0.4,
        n,
    );
    // --tid: the fixture's only thread, and a tid that does not exist.
    let tid = python(
        "import duckdb, sys\nprint(duckdb.sql(f\"select min(tid) from read_parquet('{sys.argv[1]}')\").fetchall()[0][0])",
        &[&r.parquet],
    );
    let one = Folded::parse(&report(&["--format", "folded", "--tid", tid.trim()]));
    assert_eq!(one.total(), all.total());
    let none = report(&["--format", "folded", "--tid", "1"]);
    assert!(none.trim().is_empty());
    // A --focus that names no function is an error naming the near ones (issue 34), not an
    // empty profile; an --exclude that names none is said, and leaves everything.
    let typo = superprof()
        .arg("report")
        .arg(&r.parquet)
        .args(["--format", "folded", "--focus", "work_betta"])
        .output()
        .unwrap();
    assert_one_line_error(&typo, "did you mean work_beta");
    assert!(typo.stdout.is_empty());
    let out = superprof()
        .arg("report")
        .arg(&r.parquet)
        .args(["--format", "folded", "--exclude", "no_such_function_here"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("names no function"));
    assert_eq!(
        Folded::parse(&String::from_utf8_lossy(&out.stdout)).total(),
        all.total()
    );
}

#[test]
fn tree_shows_total_and_self_shares() {
    let text = report(&["--format", "tree"]);
    let row = |f: &str| {
        text.lines()
            .find(|l| l.contains(&format!(" {f} ")))
            .unwrap_or_else(|| panic!("no {f} in\n{text}"))
            .to_owned()
    };
    let pct = |l: &str, i: usize| {
        l.split_whitespace()
            .nth(i)
            .unwrap()
            .trim_end_matches('%')
            .parse::<f64>()
            .unwrap()
    };
    let main = row("main");
    let alpha = row("work_alpha");
    assert!(pct(&main, 0) > 95.0, "{main}");
    // work_alpha is indented under main.
    let indent = |l: &str| l.len() - l[17..].trim_start().len();
    assert!(indent(&alpha) > indent(&main));
    // Each work function's total share is the fixture's own measure of it, within 4σ of the recording's sample count.
    let r = recording();
    for f in ["work_alpha", "work_beta", "work_gamma"] {
        assert_share(
            &format!("{f} in the tree"),
            pct(&row(f), 0) / 100.0,
            r.truth[f],
            Folded::read(&r.folded).total(),
        );
    }
}

fn assert_report_fails(file: &Path, mention: &str) {
    let dir = TempDir::new("badfile");
    let out_file = dir.path("out.svg");
    let out = superprof()
        .arg("report")
        .arg(file)
        .arg("-o")
        .arg(&out_file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("superprof: ") && lines[0].contains(mention),
        "{}",
        lines[0]
    );
    assert!(!out_file.exists());
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        0,
        "files left behind"
    );
}

#[test]
fn bad_profile_files_are_refused_cleanly() {
    let r = recording();
    let dir = TempDir::new("bad");
    assert_report_fails(&dir.path("missing.parquet"), "No such file");
    let bytes = std::fs::read(&r.parquet).unwrap();
    let truncated = dir.path("truncated.parquet");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert_report_fails(&truncated, "cannot read profile");
    let corrupt = dir.path("corrupt.parquet");
    let mut c = bytes.clone();
    let mid = c.len() / 3;
    for b in &mut c[mid..mid + 4096.min(bytes.len() / 3)] {
        *b = !*b;
    }
    std::fs::write(&corrupt, &c).unwrap();
    assert_report_fails(&corrupt, "cannot read profile");
    let text = dir.path("text.parquet");
    std::fs::write(&text, "this is not parquet\n").unwrap();
    assert_report_fails(&text, "cannot read profile");
    let other = dir.path("other.parquet");
    python(
        "import pyarrow as pa, pyarrow.parquet as pq, sys\n\
         pq.write_table(pa.table({'a': [1, 2, 3], 'b': ['x', 'y', 'z']}), sys.argv[1])",
        &[&other],
    );
    assert_report_fails(&other, "not a superprof profile");
}
