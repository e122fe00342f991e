//! JIT code named from the runtime's perf map or jitdump (issue 14): node `--perf-basic-prof`
//! and Java `-XX:+DumpPerfMapAtExit` (written at exit) write /tmp/perf-PID.map, node
//! `--perf-prof` and a JVMTI agent write jit-PID.dump; `record` names their compiled functions
//! with it, as perf does on the same program, with each program's own split of its time between
//! two hot functions within 4σ. Launched with no flags (issue 34), node, java and python 3.12+
//! are set up by superprof to name their code, and do the same with their output unchanged.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::*;

/// Samples per leaf name, from a folded file.
fn leaves(f: &Folded) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for (s, n) in &f.0 {
        *m.entry(s.last().cloned().unwrap_or_default()).or_default() += n;
    }
    m
}

/// How perf is run beside superprof on the same program.
#[derive(PartialEq)]
enum Perf {
    No,
    /// perf record: it names JIT code from the perf map.
    Record,
    /// perf record -k mono, then perf inject --jit: it names JIT code from the jitdump.
    InjectJit,
    /// perf record of the command with the runtime's flags given by hand (node
    /// --perf-basic-prof; java -XX:+UnlockDiagnosticVMOptions -XX:+PreserveFramePointer
    /// -XX:+DumpPerfMapAtExit), where
    /// superprof was given none: the two splits of hotA and hotB agree within 4σ.
    GivenFlags,
}

/// `cmd` with the flags a perf user gives its runtime by hand.
fn with_runtime_flags<'a>(cmd: &[&'a str]) -> Vec<&'a str> {
    let flags: &[&str] = match cmd[0] {
        "node" => &["--perf-basic-prof"],
        "java" => &[
            "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+PreserveFramePointer",
            "-XX:+DumpPerfMapAtExit",
        ],
        other => panic!("no flags known for {other}"),
    };
    let mut out = vec![cmd[0]];
    out.extend_from_slice(flags);
    out.extend_from_slice(&cmd[1..]);
    out
}

/// Leaf samples of a perf.data, by symbol: (percent of all samples, count), from `perf report
/// -n` (perf's files kept under `home`). A name can be on several rows, one per mapping perf
/// saw it in: their shares and counts add up.
fn perf_leaf_rows(data: &std::path::Path, home: &std::path::Path) -> BTreeMap<String, (f64, u64)> {
    let out = Command::new("perf")
        .env("HOME", home)
        .args([
            "report",
            "--stdio",
            "--no-children",
            "--sort",
            "sym",
            "-g",
            "none",
            "-n",
            "-i",
        ])
        .arg(data)
        .output()
        .unwrap();
    let mut rows = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let mut w = l.split_whitespace();
        let (Some(pct), Some(n), Some("[.]")) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let (Some(Ok(pct)), Ok(n)) = (
            pct.strip_suffix('%').map(str::parse::<f64>),
            n.parse::<u64>(),
        ) else {
            continue;
        };
        let row = rows
            .entry(w.collect::<Vec<_>>().join(" "))
            .or_insert((0.0, 0));
        row.0 += pct;
        row.1 += n;
    }
    rows
}

/// Leaf shares (percent) of a perf.data, by symbol.
fn perf_leaves(data: &std::path::Path, home: &std::path::Path) -> BTreeMap<String, f64> {
    perf_leaf_rows(data, home)
        .into_iter()
        .map(|(k, (pct, _))| (k, pct))
        .collect()
}

/// How much of a recording must be hotA's and hotB's.
#[derive(Clone, Copy)]
enum Named {
    /// At least this share of all samples.
    AtLeast(f64),
    /// At least the program's own `hot=` figure (its CPU time in the two after they were
    /// compiled, of all its CPU time), less 4σ of a share of that many samples.
    OwnFigure,
}

/// Records `cmd` (in `dir`), and checks the JIT'd hotA and hotB: named like `jit_name` says,
/// the program's own split within 4σ, and at least `named` of all samples theirs. The
/// recording is also kept as jit.parquet in `dir`.
fn check(
    dir: &TempDir,
    cmd: &[&str],
    jit_name: fn(&str) -> Option<&'static str>,
    named: Named,
    perf: Perf,
    timed_part: bool,
) {
    let folded = dir.path("jit.folded");
    let out = run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&folded)
            .arg("-o")
            .arg(dir.path("jit.parquet"))
            .arg("--")
            .args(cmd)
            .current_dir(&dir.0),
    );
    let own = fixture_values(&String::from_utf8_lossy(&out.stdout));
    let f = Folded::read(&folded);
    let l = leaves(&f);
    let count = |which: &str| -> u64 {
        l.iter()
            .filter(|(k, _)| jit_name(k) == Some(which))
            .map(|(_, n)| n)
            .sum()
    };
    let (a, b) = (count("hotA"), count("hotB"));
    let total = f.total();
    let floor = match named {
        Named::AtLeast(share) => share,
        Named::OwnFigure => {
            let hot = own["hot"];
            hot - 4.0 * (hot * (1.0 - hot) / total as f64).sqrt()
        }
    };
    assert!(
        (a + b) as f64 >= floor * total as f64,
        "{cmd:?}: hotA {a} + hotB {b} of {total}, under {floor:.3}: {l:?}"
    );
    // (The whole recording's: the split below may count a window of it only.)
    let named_in_all = (a + b) as f64 / total as f64;
    let split_in_all = (a, b);
    // The split, from the samples of the part the program timed (after a warm-up): its
    // window, in Unix time, against the recording's start.
    let (a, b) = if timed_part {
        let parquet = dir.path("jit.parquet");
        let meta = run_ok(Command::new("python3").arg("-c").arg(
            "import pyarrow.parquet as pq, sys\n\
             print(pq.read_metadata(sys.argv[1]).metadata[b'superprof.start_time_unix_ns'].decode())",
        ).arg(&parquet));
        let start_ns: f64 = String::from_utf8_lossy(&meta.stdout)
            .trim()
            .parse()
            .unwrap();
        let at = |ms: f64| format!("{:.3}", (ms * 1e6 - start_ns) / 1e9);
        let out = run_ok(
            superprof()
                .arg("report")
                .arg(&parquet)
                .args(["--format", "folded", "--since"])
                .arg(at(own["from_ms"]))
                .arg("--until")
                .arg(at(own["until_ms"])),
        );
        let l = leaves(&Folded::parse(&String::from_utf8_lossy(&out.stdout)));
        let count = |which: &str| -> u64 {
            l.iter()
                .filter(|(k, _)| jit_name(k) == Some(which))
                .map(|(_, n)| n)
                .sum()
        };
        (count("hotA"), count("hotB"))
    } else {
        (a, b)
    };
    let share = a as f64 / (a + b) as f64;
    let want = own["hotA"];
    let sigma = (want * (1.0 - want) / (a + b) as f64).sqrt();
    assert!(
        (share - want).abs() < 4.0 * sigma,
        "{cmd:?}: hotA {share:.3} of the two, the program says {want:.3}: {l:?}"
    );
    if perf == Perf::No {
        return;
    }
    // perf on the same program names the same code the same way.
    let mut data = dir.path("perf.data");
    let mut rec = Command::new("perf");
    rec.args(["record", "-q", "-F", "999", "-g"]);
    if perf == Perf::InjectJit {
        // The jitdump's timestamps are CLOCK_MONOTONIC's.
        rec.args(["-k", "1"]);
    }
    let perf_cmd = if perf == Perf::GivenFlags {
        with_runtime_flags(cmd)
    } else {
        cmd.to_vec()
    };
    let st = rec
        .arg("-o")
        .arg(&data)
        .arg("--")
        .args(&perf_cmd)
        .current_dir(&dir.0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    if perf == Perf::InjectJit {
        let injected = dir.path("perf.jit.data");
        run_ok(
            Command::new("perf")
                .env("HOME", &dir.0)
                .args(["inject", "--jit", "-i"])
                .arg(&data)
                .arg("-o")
                .arg(&injected)
                .current_dir(&dir.0),
        );
        data = injected;
    }
    let p = perf_leaves(&data, &dir.0);
    let ours: std::collections::BTreeSet<&str> = l
        .keys()
        .filter(|k| jit_name(k).is_some())
        .map(String::as_str)
        .collect();
    let theirs: Vec<(&String, &f64)> = p.iter().filter(|(k, _)| jit_name(k).is_some()).collect();
    let perf_named: f64 = theirs.iter().map(|(_, v)| **v).sum::<f64>() / 100.0;
    // Every name perf gives the JIT's hot code (at 1% of its samples or more) is one of ours.
    let big: Vec<&str> = theirs
        .iter()
        .filter(|(_, pct)| **pct >= 1.0)
        .map(|(k, _)| k.as_str())
        .collect();
    assert!(!big.is_empty(), "{cmd:?}: perf named no hot code: {p:?}");
    for name in &big {
        assert!(
            ours.contains(name),
            "{cmd:?}: perf names {name:?}, we do not: ours {ours:?}"
        );
    }
    // As many samples named as perf names, within 4σ and 6 points, over each one's whole
    // recording. The points are not statistical: these are two runs of a JIT, which differ
    // in how long its warm-up and compilers run before hotA and hotB are compiled (node's
    // jitdump run: ours 0.889 of the samples, perf's 0.930, once in the suite). One side only:
    // naming too little is the failure looked for; half of perf's fails.
    let ours_named = named_in_all;
    let sigma = (perf_named * (1.0 - perf_named) / total as f64).sqrt();
    assert!(
        ours_named > perf_named - 4.0 * sigma - 0.06,
        "{cmd:?}: {ours_named:.3} of samples named, perf {perf_named:.3}: {theirs:?}"
    );
    if perf != Perf::GivenFlags {
        return;
    }
    // hotA's share of the two, ours (no flags) and perf's (flags by hand), over each whole
    // recording: within 4σ of the difference of two binomial shares.
    let pc = perf_leaf_rows(&data, &dir.0);
    let sum = |which: &str| -> u64 {
        pc.iter()
            .filter(|(k, _)| jit_name(k) == Some(which))
            .map(|(_, (_, n))| n)
            .sum()
    };
    let (pa, pb) = (sum("hotA"), sum("hotB"));
    let (oa, ob) = split_in_all;
    let (np, no) = ((pa + pb) as f64, (oa + ob) as f64);
    assert!(
        np > 100.0 && no > 100.0,
        "{cmd:?}: perf {pa}+{pb}, ours {oa}+{ob}"
    );
    let (sp, so) = (pa as f64 / np, oa as f64 / no);
    let pooled = (pa + oa) as f64 / (np + no);
    let sigma = (pooled * (1.0 - pooled) * (1.0 / np + 1.0 / no)).sqrt();
    assert!(
        (sp - so).abs() <= 4.0 * sigma,
        "{cmd:?}: hotA {so:.3} of {no} ours, perf {sp:.3} of {np} (4σ = {:.3})",
        4.0 * sigma
    );
}

/// hotA or hotB, for node's names of its JIT code (`JS:*hotA /path/hot.js:3:14`).
fn js_name(k: &str) -> Option<&'static str> {
    let k = k.strip_prefix("JS:")?;
    if k.contains("hotA") {
        Some("hotA")
    } else if k.contains("hotB") {
        Some("hotB")
    } else {
        None
    }
}

#[test]
fn node_perf_basic_prof_names_js_functions() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("jit-node");
    let js = fixtures_dir().join("jit/hot.js");
    check(
        &dir,
        &["node", "--perf-basic-prof", js.to_str().unwrap()],
        js_name,
        Named::OwnFigure,
        Perf::Record,
        false,
    );
}

#[test]
fn java_perf_map_at_exit_names_methods() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("jit-java");
    compile_hot_java(&dir);
    check(
        &dir,
        &[
            "java",
            "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+DumpPerfMapAtExit",
            "-XX:+PreserveFramePointer",
            // hotA and hotB stay calls: inlined into main's compiled loop, their samples
            // would be main's, one or the other or both as the JIT decided.
            "-XX:CompileCommand=quiet",
            "-XX:CompileCommand=dontinline,Hot::hot*",
            "-cp",
            dir.0.to_str().unwrap(),
            "Hot",
        ],
        java_name,
        Named::AtLeast(0.85),
        Perf::Record,
        true,
    );
}

/// Hot.java compiled into `dir` (its class path).
fn compile_hot_java(dir: &TempDir) {
    let src = dir.path("Hot.java");
    std::fs::copy(fixtures_dir().join("jit/Hot.java"), &src).unwrap();
    run_ok(Command::new("javac").arg(&src).current_dir(&dir.0));
}

/// hotA or hotB, for Java's names of its compiled methods (`Hot.hotA`, `LHot;::hotA`).
fn java_name(k: &str) -> Option<&'static str> {
    if k.contains("Hot.hotA") {
        Some("hotA")
    } else if k.contains("Hot.hotB") {
        Some("hotB")
    } else {
        None
    }
}

/// Java with a JVMTI agent writing a jitdump (tests/fixtures/jit/jitdump_agent.c, written here
/// because Debian ships no libperf-jvmti): `record` names the compiled methods from the dump,
/// with their source lines, as `perf inject --jit` does from the same kind of file.
#[test]
fn java_jitdump_names_methods_with_lines() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("jit-java-dump");
    compile_hot_java(&dir);
    // The JDK's headers, beside its javac.
    let javac = std::fs::canonicalize(
        String::from_utf8(run_ok(Command::new("sh").args(["-c", "command -v javac"])).stdout)
            .unwrap()
            .trim(),
    )
    .unwrap();
    let jdk = javac.parent().unwrap().parent().unwrap();
    let agent = dir.path("libjitdump.so");
    run_ok(
        Command::new("gcc")
            .args(["-O2", "-shared", "-fPIC"])
            .arg(format!("-I{}", jdk.join("include").display()))
            .arg(format!("-I{}", jdk.join("include/linux").display()))
            .arg("-o")
            .arg(&agent)
            .arg(fixtures_dir().join("jit/jitdump_agent.c")),
    );
    check(
        &dir,
        &[
            "java",
            &format!("-agentpath:{}", agent.display()),
            "-XX:+PreserveFramePointer",
            // hotA and hotB stay calls: inlined into main's compiled loop, their samples
            // would be main's, one or the other or both as the JIT decided.
            "-XX:CompileCommand=quiet",
            "-XX:CompileCommand=dontinline,Hot::hot*",
            "-cp",
            dir.0.to_str().unwrap(),
            "Hot",
        ],
        java_name,
        Named::AtLeast(0.85),
        Perf::InjectJit,
        true,
    );
    // The source lines the agent wrote: hotA and hotB are lines 4 and 5 of Hot.java.
    let top =
        String::from_utf8(run_ok(superprof().arg("report").arg(dir.path("jit.parquet"))).stdout)
            .unwrap();
    for (f, line) in [("Hot.hotA", "Hot.java:4"), ("Hot.hotB", "Hot.java:5")] {
        assert!(
            top.lines()
                .any(|l| l.contains(f) && l.contains("jit-") && l.trim_end().ends_with(line)),
            "{f} at {line}:\n{top}"
        );
    }
}

/// node --perf-prof writes a jitdump (jit-PID.dump, in its working folder) and maps it as a
/// marker: `record` finds it through that mapping and names the JIT code from it, as
/// `perf inject --jit` does from the same kind of run.
#[test]
fn node_jitdump_names_js_functions() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("jit-node-dump");
    let js = fixtures_dir().join("jit/hot.js");
    // With the unwinding tables V8 writes for optimized code too (read while recording and
    // given to the unwinder: tests/jit_cfi.rs of superprof-unwind checks they are used).
    check(
        &dir,
        &[
            "node",
            "--perf-prof",
            "--perf-prof-unwinding-info",
            js.to_str().unwrap(),
        ],
        js_name,
        Named::OwnFigure,
        Perf::InjectJit,
        false,
    );
    // The dump is there, and no perf map of that process: the names came from the dump.
    let pid = std::fs::read_dir(&dir.0)
        .unwrap()
        .find_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.strip_prefix("jit-")?
                .strip_suffix(".dump")?
                .parse::<u32>()
                .ok()
        })
        .expect("node's jit-PID.dump");
    assert!(!std::path::Path::new(&format!("/tmp/perf-{pid}.map")).exists());
}

/// The frames a thread's stack ends in when it is whole: every JVM thread (the Java main
/// thread too, which the launcher starts) begins in glibc's start_thread, the launcher's own
/// thread in __libc_start_main.
const THREAD_ROOTS: [&str; 4] = [
    "start_thread",
    "__libc_start_call_main",
    "__libc_start_main",
    "_start",
];

/// Issue 34: node launched with no flags gets `--perf-basic-prof` through NODE_OPTIONS from
/// superprof (said once on stderr): its JIT functions are named, hotA's share of the two
/// within 4σ of the program's own figure and of perf's, given the flag by hand.
#[test]
fn node_launched_with_no_flags_is_named() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("jit-node-noflags");
    let js = fixtures_dir().join("jit/hot.js");
    check(
        &dir,
        &["node", js.to_str().unwrap()],
        js_name,
        Named::OwnFigure,
        Perf::GivenFlags,
        false,
    );
}

/// Issue 34: java launched with no flags gets -XX:+PreserveFramePointer and
/// -XX:+DumpPerfMapAtExit on its command line from superprof: its methods are named, the
/// split of its time between them is its own within 4σ (and perf's, given the flags by
/// hand), and its stacks reach their thread's root (start_thread, or the launcher's main) in
/// at least 95% of the samples.
#[test]
fn java_launched_with_no_flags_is_named_and_unwound() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("jit-java-noflags");
    compile_hot_java(&dir);
    check(
        &dir,
        &[
            "java",
            "-XX:CompileCommand=quiet",
            "-XX:CompileCommand=dontinline,Hot::hot*",
            "-cp",
            dir.0.to_str().unwrap(),
            "Hot",
        ],
        java_name,
        Named::AtLeast(0.85),
        Perf::GivenFlags,
        true,
    );
    let f = Folded::read(&dir.path("jit.folded"));
    let whole: u64 =
        f.0.iter()
            .filter(|(s, _)| s.iter().any(|fr| THREAD_ROOTS.contains(&fr.as_str())))
            .map(|(_, n)| n)
            .sum();
    let share = whole as f64 / f.total() as f64;
    assert!(
        share >= 0.95,
        "{whole} of {} samples reach their thread's root ({share:.3})",
        f.total()
    );
}

/// A run's exit status, stdout and stderr.
type Ran = (Option<i32>, String, String);

/// The output and exit status of `cmd` run alone, and under `superprof record` with the
/// runtime's setup (the program's own output is all of its stdout and stderr lines that are
/// not superprof's).
fn alone_and_recorded(dir: &TempDir, cmd: &[&str]) -> (Ran, Ran) {
    let alone = Command::new(cmd[0])
        .args(&cmd[1..])
        .current_dir(&dir.0)
        .output()
        .unwrap();
    let recorded = superprof()
        .args(["record", "-q", "-o"])
        .arg(dir.path("x.folded"))
        .args(cmd)
        .current_dir(&dir.0)
        .output()
        .unwrap();
    let own = |b: &[u8]| -> String {
        String::from_utf8_lossy(b)
            .lines()
            .filter(|l| !l.starts_with("superprof:"))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    (
        (alone.status.code(), own(&alone.stdout), own(&alone.stderr)),
        (
            recorded.status.code(),
            own(&recorded.stdout),
            own(&recorded.stderr),
        ),
    )
}

/// Issue 34: the runtime's setup changes nothing a program does or says: node and java (given
/// without `--`, as perf takes a command) print the same lines on stdout and stderr and exit
/// with the same status under `record` as alone; superprof says what it set, once.
#[test]
fn runtime_setup_leaves_output_and_status_unchanged() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("jit-unchanged");
    let js = "let x = 0; for (let i = 0; i < 3e7; i++) x = (x * 31 + i) % 1000003; \
              console.log('sum', x, process.execArgv.length); console.error('to stderr'); \
              process.exit(3)";
    let (alone, recorded) = alone_and_recorded(&dir, &["node", "-e", js]);
    assert_eq!(alone.0, Some(3));
    assert_eq!(alone, recorded);
    std::fs::write(
        dir.path("Exit3.java"),
        "public class Exit3 { public static void main(String[] a) { long x = 0; \
         for (long i = 0; i < 300_000_000L; i++) x = (x * 31 + i) % 1000003; \
         System.out.println(\"sum \" + x + \" \" + String.join(\",\", a)); \
         System.err.println(\"to stderr\"); System.exit(3); } }",
    )
    .unwrap();
    run_ok(Command::new("javac").arg("Exit3.java").current_dir(&dir.0));
    let (alone, recorded) = alone_and_recorded(
        &dir,
        &["java", "-cp", dir.0.to_str().unwrap(), "Exit3", "a", "-b"],
    );
    assert_eq!(alone.0, Some(3));
    assert_eq!(alone, recorded);
    // Said once, and not at all when switched off.
    let out = superprof()
        .args(["record", "-q", "-o"])
        .arg(dir.path("y.folded"))
        .args(["node", "-e", js])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr)
        .matches("--perf-basic-prof")
        .count();
    assert_eq!(said, 1, "{}", String::from_utf8_lossy(&out.stderr));
    let out = superprof()
        .args(["record", "-q", "--no-runtime-setup", "-o"])
        .arg(dir.path("z.folded"))
        .args(["node", "-e", js])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("perf-basic-prof"));
}

/// Issue 34: `--no-runtime-setup` leaves node as it is: no JS function named.
#[test]
fn no_runtime_setup_leaves_node_unnamed() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("jit-node-off");
    let js = fixtures_dir().join("jit/hot.js");
    let folded = dir.path("off.folded");
    run_ok(
        superprof()
            .args(["record", "-q", "--no-runtime-setup", "-o"])
            .arg(&folded)
            .args(["node", js.to_str().unwrap()]),
    );
    let f = Folded::read(&folded);
    let named: u64 = leaves(&f)
        .iter()
        .filter(|(k, _)| js_name(k).is_some())
        .map(|(_, n)| n)
        .sum();
    assert_eq!(named, 0, "{:?}", leaves(&f));
}

/// Issue 34: attached to a node started without --perf-basic-prof, where superprof cannot
/// change it, `record -p` says so in one line naming the flag.
#[test]
fn attached_node_without_perf_maps_gets_a_hint() {
    let _cpu = cpu_lock();
    let js = fixtures_dir().join("jit/hot.js");
    let mut node = Command::new("node")
        .arg(&js)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let dir = TempDir::new("jit-node-attach");
    let out = superprof()
        .args(["record", "-q", "--duration", "0.5", "-o"])
        .arg(dir.path("attached.folded"))
        .arg("-p")
        .arg(node.id().to_string())
        .output()
        .unwrap();
    let _ = node.kill();
    let _ = node.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let hints: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("--perf-basic-prof"))
        .collect();
    assert_eq!(hints.len(), 1, "{stderr}");
}

/// The newest CPython of 3.12 or later on this machine (pyenv's builds, or on PATH).
fn python_with_trampolines() -> Option<std::path::PathBuf> {
    let mut found: Vec<(u32, std::path::PathBuf)> = Vec::new();
    if let Ok(dirs) = std::fs::read_dir("/root/.pyenv/versions") {
        for d in dirs.flatten() {
            let name = d.file_name().to_string_lossy().into_owned();
            let mut parts = name.split('.');
            let (Some(Ok(3)), Some(Ok(minor))) = (
                parts.next().map(str::parse::<u32>),
                parts.next().map(str::parse::<u32>),
            ) else {
                continue;
            };
            let exe = d.path().join(format!("bin/python3.{minor}"));
            if minor >= 12 && exe.exists() {
                found.push((minor, exe));
            }
        }
    }
    for minor in 12..20 {
        let exe = std::path::PathBuf::from(format!("/usr/bin/python3.{minor}"));
        if exe.exists() {
            found.push((minor, exe));
        }
    }
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// Issue 34: python 3.12 and later launched with no flags gets PYTHONPERFSUPPORT=1: its
/// Python functions are named (`py::hot_a:...`), hot_a's share of the two within 4σ of the
/// script's own figure.
#[test]
fn python_launched_with_no_flags_names_its_functions() {
    let Some(python) = python_with_trampolines() else {
        // (Debian 12 ships 3.11 only; pyenv's builds on this kind of machine have 3.12.)
        superprof_unwind::say!("no CPython 3.12 or later here: nothing to test");
        return;
    };
    let _cpu = cpu_lock();
    let dir = TempDir::new("jit-python");
    let script = dir.path("hot.py");
    std::fs::write(
        &script,
        "import time\n\
         def hot_a(n):\n    x = 1\n    for i in range(n):\n        x = (x * 1103515245 + 12345) % 2147483648\n    return x\n\
         def hot_b(n):\n    y = 3\n    for i in range(n):\n        y = (y * 69069 + 1) % 4294967296\n    return y\n\
         ta = tb = 0.0\n\
         start = time.process_time()\n\
         while time.process_time() - start < 1.5:\n\
         \x20   t0 = time.process_time(); hot_a(20000); t1 = time.process_time(); hot_b(10000); t2 = time.process_time()\n\
         \x20   ta += t1 - t0; tb += t2 - t1\n\
         print(f'share hotA={ta / (ta + tb):.4f} hot={(ta + tb) / time.process_time():.4f}')\n",
    )
    .unwrap();
    let folded = dir.path("py.folded");
    let out = run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&folded)
            .arg(&python)
            .arg(&script),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("PYTHONPERFSUPPORT=1"), "{stderr}");
    let own = fixture_values(&String::from_utf8_lossy(&out.stdout));
    let f = Folded::read(&folded);
    // Each sample's innermost Python function (its trampoline's name: py::NAME:FILE).
    let (mut a, mut b) = (0u64, 0u64);
    for (stack, n) in &f.0 {
        match stack.iter().rev().find(|fr| fr.starts_with("py::")) {
            Some(fr) if fr.starts_with("py::hot_a:") => a += n,
            Some(fr) if fr.starts_with("py::hot_b:") => b += n,
            _ => {}
        }
    }
    // Named in as many samples as the script spent its CPU time in the two, less 4σ.
    let (hot, total) = (own["hot"], f.total() as f64);
    let floor = hot - 4.0 * (hot * (1.0 - hot) / total).sqrt();
    assert!(
        (a + b) as f64 >= floor * total,
        "hot_a {a} + hot_b {b} of {total}, under {floor:.3}: {:?}",
        leaves(&f)
    );
    let share = a as f64 / (a + b) as f64;
    let want = own["hotA"];
    let sigma = (want * (1.0 - want) / (a + b) as f64).sqrt();
    assert!(
        (share - want).abs() < 4.0 * sigma,
        "hot_a {share:.3} of the two, the script says {want:.3}"
    );
}
