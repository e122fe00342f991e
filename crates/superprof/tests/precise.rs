//! `record --precise`: exact calls beside the samples, and the time per call they give,
//! against a fixture that counts and times its own calls (tests/fixtures/precise.c).

mod common;

use common::*;
use serde_json::Value;

/// Runs the fixture under `record --precise` for `secs` of CPU time; the fixture's own
/// figures, superprof's `report --calls --format json`, and record's stderr.
fn precise_run(
    dir: &TempDir,
    functions: &str,
    secs: &str,
) -> (std::collections::BTreeMap<String, f64>, Value, String) {
    let exe = compile(dir, "precise", &["precise.c"], &["-O2", "-g", "-pthread"]);
    let profile = dir.path("p.parquet");
    let out = run_ok(
        superprof()
            .args(["record", "--precise", functions, "-o"])
            .arg(&profile)
            .arg("--")
            .arg(&exe)
            .arg(secs),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let truth = fixture_values(&stdout);
    (truth, report_calls(&profile), stderr)
}

fn function<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {doc}"))
}

/// `report --calls --format json` of `profile`.
fn report_calls(profile: &std::path::Path) -> Value {
    let report = run_ok(
        superprof()
            .arg("report")
            .arg(profile)
            .args(["--calls", "--format", "json"]),
    );
    serde_json::from_slice(&report.stdout).expect("report --calls json")
}

/// Function `f`'s time per call (as `report --calls` gives it) within max(10%, 4σ) of the
/// program's own, `own` ns.
fn assert_time_agrees(name: &str, f: &Value, own: f64) {
    let ns = f["ns_per_call"].as_f64().unwrap();
    let err = f["ns_per_call_error"].as_f64().unwrap();
    let tolerance = (0.10 * own).max(4.0 * err);
    assert!(
        (ns - own).abs() <= tolerance,
        "{name}: {ns:.1} ns per call ± {err:.1} against the program's own {own:.1} \
         (tolerance {tolerance:.1}); {f}"
    );
}

/// Calls exact, for every function (recursion: its outermost calls; two threads; one called
/// late), and the time per call within max(10%, 4σ) of the fixture's own.
#[test]
fn calls_are_exact_and_time_per_call_agrees_with_the_program() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("precise");
    let (truth, doc, stderr) = precise_run(&dir, "tiny,small,big,fib,late", "1.5");
    for name in ["tiny", "small", "big", "fib", "late"] {
        let f = function(&doc, name);
        let calls = f["calls"].as_u64().unwrap();
        let want = truth[&format!("calls_{name}")] as u64;
        assert_eq!(
            calls, want,
            "{name}: {calls} calls counted, the program made {want}"
        );
        assert_eq!(f["exact"], true, "{name}: {f}");
        assert_time_agrees(name, f, truth[&format!("ns_{name}")]);
    }
    // Recursion: fib enters itself far more often than it is called.
    let fib = function(&doc, "fib");
    assert!(fib["entries"].as_u64().unwrap() > 100 * fib["calls"].as_u64().unwrap());
    // The table on stderr has the calls beside the samples.
    assert!(
        stderr.contains("Calls") && stderr.contains("Time/call"),
        "{stderr}"
    );
}

/// A name that is no function of the program: said, with the others counted (a name missing
/// before them once shifted every count to the wrong function).
#[test]
fn a_function_that_does_not_exist_is_said() {
    let _cpu = cpu_share();
    let dir = TempDir::new("precise-missing");
    let (truth, doc, _) = precise_run(&dir, "no_such_function_here,big,small", "0.3");
    for name in ["big", "small"] {
        let f = function(&doc, name);
        let want = truth[&format!("calls_{name}")] as u64;
        assert_eq!(f["calls"].as_u64().unwrap(), want, "{name}: {f}");
    }
    let missing = function(&doc, "no_such_function_here");
    assert_eq!(missing["counted"], false);
    assert!(
        missing["note"]
            .as_str()
            .unwrap()
            .contains("no_such_function_here"),
        "{missing}"
    );
}

/// The program's output and exit status are its own under --precise.
#[test]
fn the_program_is_unharmed() {
    let _cpu = cpu_share();
    let dir = TempDir::new("precise-harm");
    let exe = compile(&dir, "precise", &["precise.c"], &["-O2", "-g", "-pthread"]);
    let out = run_ok(
        superprof()
            .args(["record", "-q", "--precise", "tiny", "-o"])
            .arg(dir.path("p.parquet"))
            .arg("--")
            .arg(&exe)
            .arg("0.2"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("calls_tiny=") && text.contains("ns_late="),
        "{text}"
    );
    let status = superprof()
        .args(["record", "-q", "--precise", "main", "-o"])
        .arg(dir.path("q.parquet"))
        .args(["--", "sh", "-c", "exit 7"])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(7));
}

/// No names: the hottest functions are chosen from the samples while the command runs (one
/// that becomes hot only in the second half too), counted from then on, and their time per
/// call agrees with the program's own within max(10%, 4σ).
#[test]
fn the_hottest_functions_are_chosen_while_the_command_runs() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("precise-auto");
    let exe = compile(&dir, "precise", &["precise.c"], &["-O2", "-g", "-pthread"]);
    let profile = dir.path("p.parquet");
    let out = run_ok(
        superprof()
            .args(["record", "--precise", "--precise-top", "5", "-o"])
            .arg(&profile)
            .arg("--")
            .arg(&exe)
            .arg("1.5"),
    );
    let truth = fixture_values(&String::from_utf8_lossy(&out.stdout));
    let doc = report_calls(&profile);
    let names: Vec<&str> = doc["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    // The three hot from the start, and late (second half); never main, called once.
    for name in ["tiny", "small", "big", "late"] {
        assert!(names.contains(&name), "{name} not chosen: {names:?}");
    }
    assert!(
        !names.contains(&"main") && !names.contains(&"second"),
        "{names:?}"
    );
    for name in ["tiny", "small", "big", "late"] {
        let f = function(&doc, name);
        let calls = f["calls"].as_u64().unwrap();
        let all = truth[&format!("calls_{name}")] as u64;
        // Counted from when it was chosen: some of the calls, not all.
        assert!(calls > 0 && calls < all, "{name}: {calls} of {all}");
        assert!(f["since_ns"].as_u64().unwrap() >= 200_000_000, "{f}");
        assert_time_agrees(name, f, truth[&format!("ns_{name}")]);
    }
}

/// `--precise-lines`: every block of the function counted, and `report --lines` gives each
/// source line's executions beside the source: the line of tiny's loop body runs once per
/// iteration at most 24 per call, its first line once per call.
#[test]
fn lines_are_counted_beside_the_source() {
    let _cpu = cpu_share();
    let dir = TempDir::new("precise-lines");
    let exe = compile(&dir, "precise", &["precise.c"], &["-O2", "-g", "-pthread"]);
    let profile = dir.path("p.parquet");
    let out = run_ok(
        superprof()
            .args(["record", "-q", "--precise", "tiny", "--precise-lines", "-o"])
            .arg(&profile)
            .arg("--")
            .arg(&exe)
            .arg("0.3"),
    );
    let calls = fixture_values(&String::from_utf8_lossy(&out.stdout))["calls_tiny"] as u64;
    let report = run_ok(
        superprof()
            .arg("report")
            .arg(&profile)
            .args(["--lines", "tiny"]),
    );
    let text = String::from_utf8_lossy(&report.stdout).into_owned();
    // "  EXECUTIONS  LINE  SOURCE"
    let rows: Vec<(u64, u32, String)> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let n = w.next()?.parse().ok()?;
            let line = w.next()?.parse().ok()?;
            Some((n, line, w.collect::<Vec<_>>().join(" ")))
        })
        .collect();
    assert!(text.contains("precise.c"), "{text}");
    let body = rows
        .iter()
        .find(|r| r.2.contains("6364136223846793005UL"))
        .unwrap_or_else(|| panic!("the loop's body line: {text}"));
    assert!(
        body.0 >= calls && body.0 <= 24 * calls,
        "{body:?} for {calls} calls\n{text}"
    );
    let first = rows
        .iter()
        .find(|r| r.2.contains("unsigned long tiny("))
        .unwrap_or_else(|| panic!("tiny's first line: {text}"));
    assert_eq!(first.0, calls, "{text}");
    // A function not counted with --precise-lines is said.
    let err = superprof()
        .arg("report")
        .arg(&profile)
        .args(["--lines", "small"])
        .output()
        .unwrap();
    assert_one_line_error(&err, "small");
}

/// `-p PID`: a running program attached, its functions counted from then on, and let go as it
/// was: it runs on to its end, its output whole and its status 0.
#[test]
fn an_attached_process_is_counted_and_let_go() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("precise-attach");
    let exe = compile(&dir, "precise", &["precise.c"], &["-O2", "-g", "-pthread"]);
    let child = std::process::Command::new(&exe)
        .arg("2.5")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let profile = dir.path("p.parquet");
    run_ok(
        superprof()
            .args([
                "record",
                "-q",
                "--precise",
                "tiny,small,big",
                "--duration",
                "1",
                "-o",
            ])
            .arg(&profile)
            .args(["-p", &child.id().to_string()]),
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let truth = fixture_values(&String::from_utf8_lossy(&out.stdout));
    assert!(truth.contains_key("ns_late"), "output cut short: {truth:?}");
    let doc = report_calls(&profile);
    for name in ["tiny", "small", "big"] {
        let f = function(&doc, name);
        let calls = f["calls"].as_u64().unwrap();
        let all = truth[&format!("calls_{name}")] as u64;
        assert!(calls > 0 && calls < all, "{name}: {calls} of {all}");
        assert_time_agrees(name, f, truth[&format!("ns_{name}")]);
    }
}
