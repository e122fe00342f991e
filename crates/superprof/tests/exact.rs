//! The differential test of exact counts (issue 32): programs generated from seeds
//! (superprof-testkit's `exact_gen`: threads, recursion and mutual recursion, a signal handler
//! that calls a counted function, longjmp, C++ exceptions, tail calls, fork and vfork
//! children) count their own calls; every `stat` engine must give each function's outermost
//! calls, and every `blocks` engine and analyzer each instruction's executions as callgrind
//! counts them, whose count at a function's entry must be the program's own count of entries.
//!
//! `SUPERPROF_EXACT_SEEDS` chooses the seeds (`0..1000`, or `3,17,40`); `scripts/soak-exact`
//! runs thousands. The default is a few seeds and the seeds of every disagreement found so
//! far (fixed, and kept as regression tests).

#![allow(clippy::disallowed_macros)] // a test's own diagnostics

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use serde_json::Value;
use superprof_testkit::exact_gen::{generate, parse_counts, tail_calls_made_calls, Program};

/// Seeds every run checks.
const DEFAULT_SEEDS: std::ops::Range<u64> = 0..6;

/// Seeds that once disagreed (kept once fixed): 22 and 33, the ptrace engine ended calls at
/// returns only, not at tail jumps; 27, a call left by longjmp taken for an outer one of a
/// later deeper call (said uncertain now); 28 and 37, a landing pad after `call longjmp`,
/// which ptrace's blocks never counted.
const REGRESSIONS: &[u64] = &[22, 27, 33, 37];

fn seeds() -> Vec<u64> {
    match std::env::var("SUPERPROF_EXACT_SEEDS") {
        Ok(s) if !s.trim().is_empty() => {
            if let Some((a, b)) = s.split_once("..") {
                let (a, b) = (a.trim().parse().unwrap(), b.trim().parse().unwrap());
                (a..b).collect()
            } else {
                s.split(',').map(|v| v.trim().parse().unwrap()).collect()
            }
        }
        _ => DEFAULT_SEEDS.chain(REGRESSIONS.iter().copied()).collect(),
    }
}

/// A generated program, built, and what it says of itself run alone.
struct Built {
    exe: PathBuf,
    stdout: String,
    /// function -> (outermost calls, entries).
    counts: BTreeMap<String, (u64, u64)>,
    /// function -> [start, end) in the ELF file.
    ranges: BTreeMap<String, (u64, u64)>,
}

fn build(dir: &TempDir, p: &Program) -> Result<Built, String> {
    let src = dir.path(&format!("gen{}.cc", p.seed));
    std::fs::write(&src, &p.source).unwrap();
    // (SUPERPROF_EXACT_DUMP=FOLDER keeps each program's source and flags there.)
    if let Some(keep) = std::env::var_os("SUPERPROF_EXACT_DUMP") {
        let keep = Path::new(&keep);
        std::fs::write(
            keep.join(format!("gen{}.cc", p.seed)),
            format!("// g++ {}\n{}", p.flags.join(" "), p.source),
        )
        .unwrap();
    }
    let exe = dir.path(&format!("gen{}", p.seed));
    let compile = |defines: &[String]| -> Result<(), String> {
        let out = Command::new("g++")
            .args(&p.flags)
            .args(defines)
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("g++ runs (scripts/test installs it)");
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "g++ failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    compile(&[])?;
    // Tail calls the compiler made calls: the program must count them as calls.
    let calls: Vec<String> = tail_calls_made_calls("objdump", &exe, &p.tail_calls)
        .into_iter()
        .map(|i| format!("-DCALL_TAIL_{i}"))
        .collect();
    if !calls.is_empty() {
        compile(&calls)?;
    }
    let out = Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "the program alone failed: {:?} {stdout}",
            out.status
        ));
    }
    let counts = parse_counts(&stdout);
    if counts.len() != p.functions.len() {
        return Err(format!("the program's counts are incomplete: {stdout}"));
    }
    Ok(Built {
        ranges: function_ranges(&exe, p.functions.len()),
        exe,
        stdout,
        counts,
    })
}

/// The generated functions' [start, end) from `nm -S` (not from superprof).
fn function_ranges(exe: &Path, functions: usize) -> BTreeMap<String, (u64, u64)> {
    (0..functions)
        .filter_map(|i| {
            let name = format!("gen_f{i}");
            Some((name.clone(), symbol_range(exe, &name)?))
        })
        .collect()
}

/// The program's output under superprof must be its output alone (superprof's own goes to
/// stderr and the -o file), and its exit status 0.
fn unharmed(what: &str, b: &Built, out: &Output) -> Result<(), String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{what}: exit {:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if stdout != b.stdout {
        return Err(format!(
            "{what}: the program's output changed:\n{stdout}\nalone:\n{}",
            b.stdout
        ));
    }
    Ok(())
}

fn regions(p: &Program) -> Vec<String> {
    p.functions
        .iter()
        .flat_map(|f| ["-r".to_owned(), f.clone()])
        .collect()
}

/// What an engine did with a program.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Every count equal to the program's.
    Agreed,
    /// It refused the program in one line that says why and what to use instead.
    Refused,
    /// Counts off, each within what it said it could not count exactly.
    Flagged,
}

/// A refusal: superprof failed before the program ran, saying which engine to use.
fn refused(out: &Output) -> bool {
    let stderr = String::from_utf8_lossy(&out.stderr);
    out.status.code() == Some(1) && stderr.contains("use --engine")
}

/// Runs `superprof SUBCOMMAND ARGS --format json -o FILE -r gen_f0 ... -- PROGRAM` (`what`
/// names it in messages): None when it refused the program in one line, else its document,
/// the program's output and status being those of the program alone.
fn run_json(
    dir: &TempDir,
    p: &Program,
    b: &Built,
    what: &str,
    args: &[&str],
) -> Result<Option<(Value, Output)>, String> {
    let json = dir.path(&format!("{}{}.json", what.replace(' ', "_"), p.seed));
    let out = superprof()
        .args(args)
        .args(["--format", "json", "-o"])
        .arg(&json)
        .args(regions(p))
        .arg("--")
        .arg(&b.exe)
        .output()
        .unwrap();
    if refused(&out) {
        return Ok(None);
    }
    unharmed(what, b, &out)?;
    let doc = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    Ok(Some((doc, out)))
}

/// `stat --engine ENGINE`: each function's calls are its outermost calls, or fewer by no more
/// than the calls it says are uncertain.
fn stat_on(p: &Program, b: &Built, dir: &TempDir, engine: &str) -> Result<Outcome, String> {
    let what = format!("stat --engine {engine}");
    let args = ["stat", "-e", "task-clock", "--engine", engine];
    let Some((doc, out)) = run_json(dir, p, b, &what, &args)? else {
        return Ok(Outcome::Refused);
    };
    if doc["engine"] != engine {
        return Err(format!("{what}: ran on {}", doc["engine"]));
    }
    let mut wrong = Vec::new();
    let mut flagged = false;
    for f in &p.functions {
        let region = doc["regions"]
            .as_array()
            .and_then(|rs| rs.iter().find(|r| r["region"] == f.as_str()));
        let calls = region.and_then(|r| r["calls"].as_u64());
        let uncertain = region
            .and_then(|r| r["uncertain_calls"].as_u64())
            .unwrap_or(0);
        let want = b.counts[f].0;
        match calls {
            Some(c) if c == want => {}
            Some(c) if c < want && want <= c + uncertain && doc["exact"] == false => flagged = true,
            _ => wrong.push(format!("{f}: {calls:?} for {want} ({uncertain} uncertain)")),
        }
    }
    if wrong.is_empty() {
        Ok(if flagged {
            Outcome::Flagged
        } else {
            Outcome::Agreed
        })
    } else {
        Err(format!(
            "{what}: {} ({})",
            wrong.join(", "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `blocks --engine ENGINE --analyzer ANALYZER`: every instruction of the functions ran as
/// often as callgrind counted it.
fn blocks_on(
    dir: &TempDir,
    p: &Program,
    b: &Built,
    truth: &BTreeMap<u64, u64>,
    engine: &str,
    analyzer: &str,
) -> Result<Outcome, String> {
    let what = format!("blocks --engine {engine} --analyzer {analyzer}");
    let args = ["blocks", "--engine", engine, "--analyzer", analyzer];
    let Some((doc, _)) = run_json(dir, p, b, &what, &args)? else {
        return Ok(Outcome::Refused);
    };
    let hex = |v: &Value| u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16);
    // Instruction -> executions, from the blocks (each instruction of a block ran as often as
    // the block).
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    for blk in doc["blocks"].as_array().unwrap() {
        let (start, end) = (hex(&blk["start"]).unwrap(), hex(&blk["end"]).unwrap());
        let n = blk["count"].as_u64().unwrap();
        for (&a, _) in truth.range(start..end) {
            *seen.entry(a).or_insert(0) += n;
        }
    }
    let mut wrong = Vec::new();
    for (f, &(lo, hi)) in &b.ranges {
        for (&a, &n) in truth.range(lo..hi) {
            let got = seen.get(&a).copied().unwrap_or(0);
            if got != n && wrong.len() < 6 {
                wrong.push(format!("{f}+{:#x}: {got} for {n}", a - lo));
            }
        }
    }
    if wrong.is_empty() {
        Ok(Outcome::Agreed)
    } else {
        Err(format!("{what}: {}", wrong.join(", ")))
    }
}

/// callgrind's count of each instruction of the program, whose count at each function's
/// entry must be the program's own count of entries.
fn callgrind_truth(p: &Program, b: &Built) -> Result<BTreeMap<u64, u64>, String> {
    let sub = TempDir::new(&format!("exact-cg{}", p.seed));
    let truth = callgrind_of(&sub, &b.exe, &[], &[], &b.exe);
    let mut wrong = Vec::new();
    for (f, &(lo, _)) in &b.ranges {
        let n = truth.get(&lo).copied().unwrap_or(0);
        if n != b.counts[f].1 {
            wrong.push(format!("{f}: {n} entries for {}", b.counts[f].1));
        }
    }
    if wrong.is_empty() {
        Ok(truth)
    } else {
        Err(format!("callgrind: {}", wrong.join(", ")))
    }
}

/// Tallies of outcomes.
#[derive(Default)]
struct Tally {
    agreed: usize,
    refused: Vec<String>,
    flagged: Vec<String>,
    errors: Vec<String>,
}

/// Every engine against one program.
fn check(dir: &TempDir, p: &Program, t: &mut Tally) {
    let b = match build(dir, p) {
        Ok(b) => b,
        Err(e) => return t.errors.push(e),
    };
    let mut note = |what: &str, r: Result<Outcome, String>| match r {
        Ok(Outcome::Agreed) => t.agreed += 1,
        Ok(Outcome::Refused) => t.refused.push(format!("seed {}: {what}", p.seed)),
        Ok(Outcome::Flagged) => t.flagged.push(format!("seed {}: {what}", p.seed)),
        Err(e) => t.errors.push(format!("seed {} ({}): {e}", p.seed, p.shape)),
    };
    for engine in ["in-process", "uprobe", "ptrace"] {
        note(&format!("stat {engine}"), stat_on(p, &b, dir, engine));
    }
    match callgrind_truth(p, &b) {
        Ok(truth) => {
            note("callgrind", Ok(Outcome::Agreed));
            for (engine, analyzer) in [
                ("in-process", "decode"),
                ("ptrace", "decode"),
                ("ptrace", "learn"),
            ] {
                let what = format!("blocks {engine} {analyzer}");
                note(&what, blocks_on(dir, p, &b, &truth, engine, analyzer));
            }
        }
        Err(e) => note("callgrind", Err(e)),
    }
}

#[test]
fn generated_programs_count_exactly_on_every_engine() {
    require_root("uprobes");
    let _cpu = cpu_share();
    let dir = TempDir::new("exact");
    let seeds = seeds();
    let mut t = Tally::default();
    for &seed in &seeds {
        check(&dir, &generate(seed), &mut t);
    }
    // (The soak's figures: scripts/soak-exact prints them.)
    eprintln!(
        "{} programs: {} runs agreed, {} refused in one line, {} said their counts were not \
         exact, {} disagreed\nrefused: {}\nnot exact: {}",
        seeds.len(),
        t.agreed,
        t.refused.len(),
        t.flagged.len(),
        t.errors.len(),
        t.refused.join("; "),
        t.flagged.join("; "),
    );
    assert!(t.errors.is_empty(), "{}", t.errors.join("\n"));
}
