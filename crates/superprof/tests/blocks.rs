//! `superprof blocks` against ground truth: callgrind's exact per-instruction execution counts
//! (`valgrind --tool=callgrind --dump-instr=yes --collect-jumps=yes`), fixtures with a known
//! split of work, and the decoder against the learning analyzer.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

fn callgrind(dir: &TempDir, exe: &Path, args: &[&str]) -> BTreeMap<u64, u64> {
    callgrind_of(dir, exe, args, &[], exe)
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Blk {
    start: u64,
    end: u64,
    count: u64,
    instructions: u64,
}

fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// Runs `superprof blocks ARGS --format json -- CMD` and returns the document.
fn blocks_json(dir: &TempDir, args: &[&str], cmd: &[&std::ffi::OsStr]) -> Value {
    blocks_json_env(dir, args, cmd, &[])
}

/// [`blocks_json`] with the environment `env` (the program inherits it).
fn blocks_json_env(
    dir: &TempDir,
    args: &[&str],
    cmd: &[&std::ffi::OsStr],
    env: &[(&str, &str)],
) -> Value {
    let out_file = dir.path("blocks.json");
    let out = run_ok(
        superprof()
            .envs(env.iter().copied())
            .arg("blocks")
            .args(args)
            .args(["--format", "json", "-o"])
            .arg(&out_file)
            .arg("--")
            .args(cmd),
    );
    assert!(out.status.success());
    serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap()
}

fn blocks_of(doc: &Value) -> Vec<Blk> {
    let mut v: Vec<Blk> = doc["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| Blk {
            start: hex(&b["start"]),
            end: hex(&b["end"]),
            count: b["count"].as_u64().unwrap(),
            instructions: b["instructions"].as_u64().unwrap(),
        })
        .collect();
    v.sort();
    v
}

/// The regions' [start, end), not as superprof says but as asked (an address range) or as
/// `nm -S` gives the function (its file's symbols, else its dynamic ones); superprof's own
/// must be the same.
fn region_ranges(doc: &Value) -> Vec<(u64, u64)> {
    doc["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let name = r["name"].as_str().unwrap();
            let truth = match name.split_once('-') {
                Some((lo, hi)) if lo.starts_with("0x") => {
                    let h = |v: &str| u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap();
                    (h(lo), h(hi))
                }
                _ => {
                    let module = std::path::Path::new(r["module"].as_str().unwrap());
                    symbol_range(module, name)
                        .unwrap_or_else(|| panic!("nm knows no {name} in {}", module.display()))
                }
            };
            assert_eq!(
                (hex(&r["start"]), hex(&r["end"])),
                truth,
                "region {name}: superprof's range is not nm's (or the one asked)"
            );
            truth
        })
        .collect()
}

/// Each block's count is the execution count of its first instruction, every instruction of
/// a block ran as often as its first, and every instruction callgrind saw run in the regions
/// is inside a block.
fn assert_matches_callgrind(
    what: &str,
    blocks: &[Blk],
    ranges: &[(u64, u64)],
    truth: &BTreeMap<u64, u64>,
) {
    assert!(!blocks.is_empty(), "{what}: no blocks");
    for b in blocks {
        assert_eq!(
            truth.get(&b.start).copied().unwrap_or(0),
            b.count,
            "{what}: block {:#x}-{:#x}",
            b.start,
            b.end
        );
        for (&a, &n) in truth.range(b.start..b.end) {
            assert_eq!(
                n, b.count,
                "{what}: instruction {a:#x} inside block {:#x}",
                b.start
            );
        }
    }
    for (&a, &n) in truth {
        if n == 0 || !ranges.iter().any(|&(lo, hi)| (lo..hi).contains(&a)) {
            continue;
        }
        assert!(
            blocks.iter().any(|b| (b.start..b.end).contains(&a)),
            "{what}: callgrind ran {a:#x} ({n} times) but no block holds it"
        );
    }
}

/// Coverage against callgrind: a block is hit exactly when callgrind saw its first
/// instruction run, and every instruction callgrind saw run in the regions is in a hit block.
fn assert_coverage_matches_callgrind(what: &str, cov: &Value, truth: &BTreeMap<u64, u64>) {
    let blocks: Vec<(u64, u64, bool)> = cov["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (hex(&b["start"]), hex(&b["end"]), b["hit"] == true))
        .collect();
    assert!(blocks.iter().any(|b| b.2), "{what}: nothing hit: {cov}");
    for &(start, end, hit) in &blocks {
        let ran = truth.get(&start).is_some_and(|&n| n > 0);
        assert_eq!(
            hit, ran,
            "{what}: block {start:#x}-{end:#x} (callgrind: ran {ran})"
        );
    }
    let ranges = region_ranges(cov);
    for (&a, &n) in truth {
        if n > 0 && ranges.iter().any(|&(lo, hi)| (lo..hi).contains(&a)) {
            assert!(
                blocks.iter().any(|&(s, e, hit)| hit && (s..e).contains(&a)),
                "{what}: callgrind ran {a:#x} ({n} times) but no hit block holds it"
            );
        }
    }
}

#[test]
fn count_equals_callgrind_on_pie_and_non_pie_code() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-cg");
    for (name, flags) in [
        ("pie-O0", &["-O0", "-g", "-fpie", "-pie"][..]),
        ("nopie-O2", &["-O2", "-g", "-fno-pie", "-no-pie"][..]),
    ] {
        let exe = compile(&dir, name, &["branches.c"], flags);
        let truth = callgrind(&dir, &exe, &["300"]);
        let regions = [
            "-r",
            "pick",
            "-r",
            "zigzag",
            "-r",
            "sum_picks",
            "-r",
            "main",
            "--engine",
            "ptrace",
        ];
        let decode = blocks_json(&dir, &regions, &[exe.as_os_str(), "300".as_ref()]);
        let blocks = blocks_of(&decode);
        assert_matches_callgrind(name, &blocks, &region_ranges(&decode), &truth);
        // The switch's seven cases and its default ran: 300 calls in all.
        let pick = decode["regions"][0]["start"].clone();
        assert_eq!(
            decode["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["start"] == pick)
                .unwrap()["count"],
            300
        );
        assert!(decode["stops"].as_u64().unwrap() > 300);
        // Branches stepped instead of worked out from the registers: the same counts.
        let mut args = regions.to_vec();
        args.push("--step-branches");
        let stepped = blocks_json(&dir, &args, &[exe.as_os_str(), "300".as_ref()]);
        assert_eq!(blocks_of(&stepped), blocks, "{name}");
        assert!(stepped["stops"].as_u64() > decode["stops"].as_u64());
        assert!(decode["branches_emulated"].as_u64().unwrap() > 300);
        assert_eq!(stepped["branches_emulated"].as_u64(), Some(0));
        // The uprobe engine (a counting uprobe on every block) and the in-process one (a
        // jump to a counting trampoline), the program never stopped: callgrind's counts too,
        // and their coverage is the blocks with a count.
        for engine in ["uprobe", "in-process"] {
            let mut args = regions[..regions.len() - 2].to_vec();
            args.extend(["--engine", engine]);
            let probed = blocks_json(&dir, &args, &[exe.as_os_str(), "300".as_ref()]);
            assert_eq!(probed["engine"], engine);
            let what = format!("{name} {engine}");
            assert_matches_callgrind(&what, &blocks_of(&probed), &region_ranges(&probed), &truth);
            args.extend(["--mode", "coverage"]);
            let cov = blocks_json(&dir, &args, &[exe.as_os_str(), "300".as_ref()]);
            assert_coverage_matches_callgrind(&what, &cov, &truth);
            // Coverage stops at a block's breakpoint once at most.
            if engine == "in-process" {
                assert!(
                    cov["stops"].as_u64() <= cov["breakpoint_blocks"].as_u64(),
                    "{cov}"
                );
            }
        }
    }
}

#[test]
fn learn_finds_the_same_blocks_and_counts_as_decode() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-learn");
    // At -O0 every conditional branch of these functions is taken at some point; at -O2 the
    // guards `if (n <= 0)` before the loops never are: the learner knows them for branches
    // from their families, trained on the code around (before training it merged them into
    // the blocks after).
    for (name, flags) in [("O0", &["-O0", "-g"][..]), ("O2", &["-O2", "-g"][..])] {
        let exe = compile(&dir, name, &["branches.c"], flags);
        let cmd = [exe.as_os_str(), "300".as_ref()];
        let regions = [
            "-r",
            "pick",
            "-r",
            "zigzag",
            "-r",
            "sum_picks",
            "-r",
            "main",
            "--engine",
            "ptrace",
        ];
        let decode = blocks_json(&dir, &regions, &cmd);
        let mut args = regions.to_vec();
        args.extend(["--analyzer", "learn"]);
        let learn = blocks_json(&dir, &args, &cmd);
        assert_learn_is_decode(name, &learn, &decode);
        // The switch, whose every branch goes both ways: the same blocks.
        let pick_d = blocks_json(&dir, &["-r", "pick"], &cmd);
        let pick_l = blocks_json(&dir, &["-r", "pick", "--analyzer", "learn"], &cmd);
        assert_eq!(blocks_of(&pick_l), blocks_of(&pick_d), "{name} pick");
        let a = &learn["analyzer"];
        assert_eq!(a["name"], "learn");
        let steps = a["single_steps"].as_u64().unwrap();
        let predictions = a["predictions"].as_u64().unwrap();
        assert!(steps > 0, "{name}: {a}");
        assert!(predictions > 0, "{name}: {a}");
        // Every block end it predicted from its table is the decoder's.
        assert_eq!(
            a["predictions_right"].as_u64(),
            Some(predictions),
            "{name}: {a}"
        );
        // It leaves single-stepping: far fewer steps than instructions run.
        let executed: u64 = blocks_of(&decode)
            .iter()
            .map(|b| b.count * b.instructions)
            .sum();
        assert!(
            steps * 2 < executed,
            "{name}: {steps} steps for {executed} instructions"
        );
    }
}

/// learn against decode on the same program: the same blocks with the same counts (learn
/// may only stop more often), no run left its predicted path, and learn's own figures.
fn assert_learn_is_decode(what: &str, learn: &Value, decode: &Value) {
    assert_eq!(
        blocks_of(learn),
        blocks_of(decode),
        "{what}: learn, then decode"
    );
    let a = &learn["analyzer"];
    assert_eq!(a["name"], "learn", "{what}");
    assert_eq!(a["mispredicted"], 0, "{what}: {a}");
    assert!(a["predictions"].as_u64() > Some(0), "{what}: {a}");
    assert!(a["predictions_right"].as_u64() > Some(0), "{what}: {a}");
}

/// Runs blocks with `regions` on `cmd` with decode, then learn: decode's counts are
/// callgrind's (`truth`), learn's are decode's. Returns learn's document.
fn learn_decode_callgrind(
    what: &str,
    dir: &TempDir,
    regions: &[&str],
    cmd: &[&std::ffi::OsStr],
    env: &[(&str, &str)],
    truth: &BTreeMap<u64, u64>,
) -> Value {
    let decode = blocks_json_env(dir, regions, cmd, env);
    let (blocks, ranges) = (blocks_of(&decode), region_ranges(&decode));
    assert_matches_callgrind(&format!("{what} decode"), &blocks, &ranges, truth);
    let mut args = regions.to_vec();
    args.extend(["--analyzer", "learn"]);
    let learn = blocks_json_env(dir, &args, cmd, env);
    assert_learn_is_decode(what, &learn, &decode);
    learn
}

/// The learning analyzer on code as -O3 makes it (learn_o3.c: a jump table, conditional
/// moves, tail calls, a vectorized loop, an error path taken once at the end): learn's blocks
/// and counts are decode's, and decode's are callgrind's.
#[test]
fn learn_equals_decode_and_callgrind_at_o3() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-o3");
    let exe = compile(&dir, "o3", &["learn_o3.c"], &["-O3", "-g"]);
    let truth = callgrind(&dir, &exe, &["400"]);
    let regions = [
        "-r",
        "run",
        "-r",
        "finish",
        "-r",
        "clamp",
        "-r",
        "mix",
        "-r",
        "rare_error",
        "--engine",
        "ptrace",
    ];
    let cmd = [exe.as_os_str(), "400".as_ref()];
    let learn = learn_decode_callgrind("O3", &dir, &regions, &cmd, &[], &truth);
    // The error path ran once, at the end.
    let rare = blocks_of(&learn);
    assert!(rare.iter().any(|b| b.count == 1), "{rare:?}");
    // Without a lab (the fallback: patterns and training), the same blocks and counts.
    let mut args = regions.to_vec();
    args.extend(["--analyzer", "learn"]);
    let fallback = blocks_json_env(&dir, &args, &cmd, &[("SUPERPROF_TEST_NO_LAB", "1")]);
    assert_learn_is_decode("O3 without a lab", &fallback, &learn);
    let a = &fallback["analyzer"];
    assert_eq!(a["probed"], 0, "{a}");
    assert!(a["training_steps"].as_u64() > Some(0), "{a}");
}

/// The learning analyzer on code nobody here wrote: Debian's glibc string functions behind
/// IFUNCs (their names from libc6-dbg), against decode and callgrind. The AVX2 versions run
/// both natively and under valgrind (whose CPU has no AVX-512): the tunable takes AVX-512
/// and RTM away from the native run, so both choose the same implementation. And memcpy's
/// AVX2 version, which copies 2,048 bytes and more (the tunable's threshold) with `rep movsb`:
/// a string instruction that repeats itself, a block of its own run once per byte, as
/// decode (and callgrind) count it, and the lab sees it stay on itself; against decode only:
/// how much memcpy copies before its `rep movsb` depends on the CPU, and valgrind's is
/// another.
#[test]
fn learn_equals_decode_and_callgrind_on_glibcs_string_functions() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-libc");
    let exe = compile(&dir, "strings", &["strings.c"], &["-O1", "-g"]);
    let env = [(
        "GLIBC_TUNABLES",
        "glibc.cpu.hwcaps=-AVX512VL,-AVX512BW,-AVX512F,-RTM:\
         glibc.cpu.x86_rep_movsb_threshold=2048",
    )];
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let truth = callgrind_of(&dir, &exe, &["300"], &env, libc);
    let regions = [
        "-r",
        "__strlen_avx2",
        "-r",
        "__strchr_avx2",
        "-r",
        "__memchr_avx2",
        "--engine",
        "ptrace",
    ];
    let cmd = [exe.as_os_str(), "300".as_ref()];
    learn_decode_callgrind("libc", &dir, &regions, &cmd, &env, &truth);
    let memcpy = ["-r", "__memmove_avx_unaligned_erms", "--engine", "ptrace"];
    let decode = blocks_json_env(&dir, &memcpy, &cmd, &env);
    let mut args = memcpy.to_vec();
    args.extend(["--analyzer", "learn"]);
    let learn = blocks_json_env(&dir, &args, &cmd, &env);
    assert_learn_is_decode("memcpy", &learn, &decode);
    // The three copies (2,907, 3,007 and 2,907 bytes): `rep movsb` ran once per byte, less
    // the few vectors memcpy moves itself first.
    let rep = blocks_of(&learn).iter().map(|b| b.count).max();
    assert!(rep <= Some(8821) && rep >= Some(8821 - 3 * 256), "{learn}");
}

/// Debian's libpython3.11 as gdb embeds it, running a Python loop: learn's blocks and counts
/// of its exported functions are decode's.
#[test]
fn learn_equals_decode_on_libpython() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-libpython");
    let regions = [
        "-r",
        "PyFloat_FromDouble",
        "-r",
        "PyObject_Repr",
        "-r",
        "PyObject_Str",
        "-r",
        "PyUnicode_Concat",
        "-r",
        "PyLong_FromLong",
        "--engine",
        "ptrace",
    ];
    let script = "python exec(\"s = ''\\nfor i in range(300): s = repr(float(i) * 1.5) + str(i)\")";
    let cmd: [&std::ffi::OsStr; 5] = [
        "gdb".as_ref(),
        "-batch".as_ref(),
        "-nx".as_ref(),
        "-ex".as_ref(),
        script.as_ref(),
    ];
    let env = [("PYTHONHASHSEED", "0")];
    let decode = blocks_json_env(&dir, &regions, &cmd, &env);
    let mut args = regions.to_vec();
    args.extend(["--analyzer", "learn"]);
    let learn = blocks_json_env(&dir, &args, &cmd, &env);
    assert_learn_is_decode("libpython", &learn, &decode);
    // Each function ran at least as often as the loop calls it.
    assert!(
        blocks_of(&decode).iter().map(|b| b.count).max() >= Some(300),
        "{decode}"
    );
}

/// A conditional branch taken once in 301 calls, after going straight on at four places 300
/// times (mispredict.S: `jo` in times16, overflowing only on the last call). The lab runs
/// each `jo` under every condition before the learner answers, so it is a block end from
/// the start: learn's blocks and counts are decode's, the overflow's block counted once, and
/// no run ever leaves its predicted path. Without a lab and without training (test
/// switches), the learner predicts times16 as one block from the four `jo` seen going
/// straight; the call that overflows leaves it by a `jo`: its next stop is off the predicted
/// path, the run is counted as mispredicted, superprof says so, and the range is
/// single-stepped from then on (the 10 calls after it).
#[test]
fn a_branch_taken_once_is_known_from_the_lab_and_without_it_seen_said_and_stepped() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-mispredict");
    let exe = compile(&dir, "mp", &["mispredict.c", "mispredict.S"], &["-O2"]);
    let cmd = [exe.as_os_str(), "300".as_ref()];
    let decode = blocks_json(&dir, &["-r", "times16", "--engine", "ptrace"], &cmd);
    // The overflow's block ran once.
    assert_eq!(
        blocks_of(&decode).iter().filter(|b| b.count == 1).count(),
        1,
        "{decode}"
    );
    let learn = blocks_json(
        &dir,
        &["-r", "times16", "--engine", "ptrace", "--analyzer", "learn"],
        &cmd,
    );
    assert_learn_is_decode("mispredict", &learn, &decode);
    let a = &learn["analyzer"];
    assert_eq!(a["mispredicted"], 0, "{a}");
    assert_eq!(a["training_steps"], 0, "{a}");
    assert!(a["probed"].as_u64() >= Some(5), "{a}");

    let out_file = dir.path("mp.json");
    let out = run_ok(
        superprof()
            .env("SUPERPROF_TEST_NO_TRAINING", "1")
            .env("SUPERPROF_TEST_NO_LAB", "1")
            .args([
                "blocks",
                "-r",
                "times16",
                "--analyzer",
                "learn",
                "--format",
                "json",
            ])
            .arg("-o")
            .arg(&out_file)
            .arg("--")
            .arg(&exe)
            .arg("300"),
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    let a = &doc["analyzer"];
    assert_eq!(a["mispredicted"], 1, "{a}");
    assert_eq!(a["training_steps"], 0, "{a}");
    assert_eq!(a["probed"], 0, "{a}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("1 block runs left the path the learner predicted"),
        "{stderr}"
    );
    // The program unharmed, and the 10 calls after it stepped: 10 instructions each (the
    // first call was stepped to learn, 10 instructions too).
    assert!(String::from_utf8_lossy(&out.stdout).contains("sum=718319"));
    assert!(a["single_steps"].as_u64() >= Some(110), "{a}");
}

#[test]
fn count_is_exact_with_four_threads() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-mt");
    let exe = compile(&dir, "mt", &["blocks_mt.c"], &["-O1", "-g", "-pthread"]);
    let truth = callgrind(&dir, &exe, &["250"]);
    // (On uprobes, each thread gets its probes before its first instruction.)
    for (analyzer, engine) in [
        ("decode", "ptrace"),
        ("learn", "ptrace"),
        ("decode", "uprobe"),
        ("decode", "in-process"),
    ] {
        let doc = blocks_json(
            &dir,
            &["-r", "classify", "--analyzer", analyzer, "--engine", engine],
            &[exe.as_os_str(), "250".as_ref()],
        );
        assert_eq!(doc["engine"], engine);
        let blocks = blocks_of(&doc);
        assert_matches_callgrind(analyzer, &blocks, &region_ranges(&doc), &truth);
        assert_eq!(
            blocks.iter().map(|b| b.count).max(),
            Some(1000),
            "{analyzer} {engine}"
        );
    }
}

#[test]
fn a_blocking_syscall_in_the_region_and_a_wrapper_that_execs() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-sys");
    let exe = compile(&dir, "sys", &["blocks_sys.c"], &["-O2", "-g", "-pthread"]);
    let truth = callgrind(&dir, &exe, &["10"]);
    for engine in ["ptrace", "in-process"] {
        // Launched through env, which execs the program: the regions are placed in the
        // program.
        let started = std::time::Instant::now();
        let doc = blocks_json(
            &dir,
            &["-r", "napper", "--engine", engine],
            &["env".as_ref(), exe.as_os_str(), "10".as_ref()],
        );
        assert_matches_callgrind(engine, &blocks_of(&doc), &region_ranges(&doc), &truth);
        assert_eq!(blocks_of(&doc).iter().map(|b| b.count).max(), Some(20));
        // Ten 20 ms sleeps per thread, side by side: no step held the other thread meanwhile.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{engine}: {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn blocks_entered_from_a_cold_part_are_counted() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-cold");
    let exe = compile(&dir, "cold", &["blocks_cold.c"], &["-O2", "-g"]);
    // The compiler did split it (else this test would test nothing new).
    let nm = Command::new("nm").arg(&exe).output().unwrap();
    assert!(String::from_utf8_lossy(&nm.stdout).contains("rejoin.cold"));
    let truth = callgrind(&dir, &exe, &["200"]);
    // (The probes counting each block at one place split the blocks where the cold part
    // comes back.)
    for (analyzer, engine) in [
        ("decode", "ptrace"),
        ("learn", "ptrace"),
        ("decode", "uprobe"),
        ("decode", "in-process"),
    ] {
        let doc = blocks_json(
            &dir,
            &["-r", "rejoin", "--analyzer", analyzer, "--engine", engine],
            &[exe.as_os_str(), "200".as_ref()],
        );
        let what = format!("{analyzer} {engine}");
        assert_matches_callgrind(&what, &blocks_of(&doc), &region_ranges(&doc), &truth);
    }
}

/// A jump into the middle of a function from another (midjump.S: via_side jumps to mid's
/// second instruction; decoding mid alone sees one block): found by a sweep of all the code
/// (in Debian's python3.11, gcc's .cold parts, which have no symbol there, do this 3380
/// times). Before, the in-process engine put its jump over that address and the program died
/// of SIGSEGV.
#[test]
fn a_jump_into_a_functions_middle_from_elsewhere() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-midjump");
    let exe = compile(&dir, "midjump", &["midjump.c", "midjump.S"], &["-O2", "-g"]);
    let truth = callgrind(&dir, &exe, &["300"]);
    for engine in ["in-process", "uprobe", "ptrace"] {
        let out_file = dir.path("mid.json");
        let out = run_ok(
            superprof()
                .args([
                    "blocks", "-r", "mid", "--engine", engine, "--format", "json", "-o",
                ])
                .arg(&out_file)
                .arg("--")
                .arg(&exe)
                .arg("300"),
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "70900\n", "{engine}");
        let doc: Value =
            serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
        let blocks = blocks_of(&doc);
        assert_matches_callgrind(engine, &blocks, &region_ranges(&doc), &truth);
        // mid's first instruction 300 times, its second 400 (100 from via_side).
        let counts: Vec<u64> = blocks.iter().map(|b| b.count).collect();
        assert!(
            counts.contains(&300) && counts.contains(&400),
            "{engine}: {blocks:?}"
        );
    }
}

/// A stripped program (no symbol at all) counted over an address range, as objdump shows it:
/// its blocks are decoded from the range itself (ptrace: entered where any branch from outside
/// lands, such as main's calls of the functions in the middle of the range).
#[test]
fn a_stripped_program_is_counted_by_address_range() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-stripped");
    let exe = compile(&dir, "br", &["branches.c"], &["-O2", "-g"]);
    let nm = Command::new("nm").arg(&exe).output().unwrap();
    let text = String::from_utf8_lossy(&nm.stdout);
    let addr_of = |name: &str| {
        text.lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .map(|l| u64::from_str_radix(l.split_whitespace().next().unwrap(), 16).unwrap())
            .unwrap()
    };
    // From zigzag to the end of sum_picks (several functions, a loop, calls).
    let (lo, hi) = (addr_of("zigzag"), addr_of("apply"));
    let stripped = dir.path("br-stripped");
    std::fs::copy(&exe, &stripped).unwrap();
    assert!(Command::new("strip")
        .arg(&stripped)
        .status()
        .unwrap()
        .success());
    let truth = callgrind(&dir, &stripped, &["300"]);
    let range = format!("{lo:#x}-{hi:#x}");
    for engine in ["in-process", "uprobe", "ptrace"] {
        let doc = blocks_json(
            &dir,
            &["-r", &range, "--engine", engine],
            &[stripped.as_os_str(), "300".as_ref()],
        );
        let blocks = blocks_of(&doc);
        assert!(blocks.len() >= 5, "{engine}: {doc}");
        assert_matches_callgrind(engine, &blocks, &region_ranges(&doc), &truth);
    }
}

#[test]
fn a_range_must_start_on_an_instruction() {
    let dir = TempDir::new("blocks-range");
    let exe = compile(&dir, "br", &["branches.c"], &["-O2", "-g"]);
    let pick = std::process::Command::new("nm").arg(&exe).output().unwrap();
    let pick = String::from_utf8_lossy(&pick.stdout)
        .lines()
        .find(|l| l.ends_with(" T pick"))
        .map(|l| u64::from_str_radix(l.split_whitespace().next().unwrap(), 16).unwrap())
        .unwrap();
    // Inside pick's first instruction (a 4-byte endbr64 or a multi-byte mov).
    let range = format!("{:#x}-{:#x}", pick + 1, pick + 0x20);
    let out = superprof()
        .args(["blocks", "-r", &range, "--"])
        .arg(&exe)
        .output()
        .unwrap();
    assert_one_line_error(&out, "is not the start of an instruction");
}

/// The instruction addresses [start, end) ranges cover, merged.
fn merged(ranges: impl IntoIterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = ranges.into_iter().collect();
    v.sort();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in v {
        match out.last_mut() {
            Some(l) if l.1 >= s => l.1 = l.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

#[test]
fn coverage_equals_the_blocks_with_a_count() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-cov");
    let exe = compile(&dir, "br", &["branches.c"], &["-O2", "-g"]);
    // 3 calls: cases 0, 1 and 2 of the switch run, the others do not.
    let cmd = [exe.as_os_str(), "3".as_ref()];
    let regions = ["-r", "pick", "-r", "zigzag", "-r", "sum_picks"];
    let count = blocks_json(&dir, &regions, &cmd);
    let mut args = regions.to_vec();
    args.extend(["--mode", "coverage"]);
    let cov = blocks_json(&dir, &args, &cmd);
    let all = cov["blocks"].as_array().unwrap();
    assert!(all.iter().all(|b| b["hit"].is_boolean()));
    let hit = all.iter().filter(|b| b["hit"] == true);
    let not_hit = all.iter().filter(|b| b["hit"] == false).count();
    assert!(
        not_hit >= 4,
        "cases 3..6 and the default did not run: {not_hit} blocks not hit"
    );
    let covered = merged(hit.map(|b| (hex(&b["start"]), hex(&b["end"]))));
    let counted = merged(
        blocks_of(&count)
            .iter()
            .filter(|b| b.count > 0)
            .map(|b| (b.start, b.end)),
    );
    assert_eq!(covered, counted);
    // Whole executable by default: main and the fixture's functions ran.
    let whole = blocks_json(&dir, &["--mode", "coverage"], &cmd);
    let ran: BTreeSet<&str> = whole["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["hit"] == true)
        .filter_map(|b| b["function"].as_str())
        .collect();
    for f in ["main", "pick", "zigzag", "sum_picks", "apply", "_start"] {
        assert!(ran.contains(f), "{f} not covered: {ran:?}");
    }
    // The count said is the count of blocks marked hit.
    let hit = whole["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["hit"] == true)
        .count();
    assert_eq!(whole["blocks_hit"].as_u64(), Some(hit as u64));
}

#[test]
fn sample_finds_the_hot_loop_with_its_share() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-sample");
    let exe = compile(&dir, "hot", &["blocks_hot.c"], &["-O1", "-g"]);
    let out_file = dir.path("sample.json");
    let out = run_ok(
        superprof()
            .args(["blocks", "--mode", "sample", "--format", "json", "-o"])
            .arg(&out_file)
            .arg("--")
            .arg(&exe)
            .arg("0.6"),
    );
    // What each loop measured of its own CPU time.
    let truth = fixture_values(&String::from_utf8_lossy(&out.stdout));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    let blocks = doc["blocks"].as_array().unwrap();
    // The two loop blocks: the hottest two, both in two_loops, split as the loops measured.
    let (a, b) = (&blocks[0], &blocks[1]);
    assert_eq!(a["function"], "two_loops", "{doc}");
    assert_eq!(b["function"], "two_loops", "{doc}");
    let (na, nb) = (a["count"].as_f64().unwrap(), b["count"].as_f64().unwrap());
    assert!(na + nb > 300.0, "too few samples: {na} + {nb}");
    assert_share(
        "first loop's share",
        na / (na + nb),
        truth["loop1"],
        (na + nb) as u64,
    );
    assert!(
        hex(&a["start"]) < hex(&b["start"]),
        "the first loop is the hotter one"
    );
    // Each is a loop body: it ends with the branch back to its start.
    for blk in [a, b] {
        assert!(blk["instructions"].as_u64().unwrap() >= 5, "{blk}");
        assert!(blk["line"].is_u64(), "{blk}");
    }
}

#[test]
fn annotate_table_and_csv() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-annotate");
    let exe = compile(&dir, "br", &["branches.c"], &["-O2", "-g"]);
    let out = run_ok(
        superprof()
            .args(["blocks", "-r", "zigzag", "--annotate", "--"])
            .arg(&exe)
            .arg("100"),
    );
    // (On stderr: the program's output owns stdout.)
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("executions"), "{text}");
    // The loop's first instruction has 100 in the margin, and the disassembly shows its branch.
    let loop_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("100 "))
        .unwrap_or_else(|| panic!("no line with 100 in the margin:\n{text}"));
    assert!(loop_line.contains(':'), "{loop_line}");
    assert!(
        text.lines().any(|l| l.contains("jne") || l.contains("jl")),
        "{text}"
    );
    let csv_file = dir.path("b.csv");
    run_ok(
        superprof()
            .args(["blocks", "-r", "zigzag", "--format", "csv", "-o"])
            .arg(&csv_file)
            .arg("--")
            .arg(&exe)
            .arg("100"),
    );
    let csv = std::fs::read_to_string(&csv_file).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "start,end,function,file,line,instructions,count,share,module"
    );
    let first: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(first[2], "zigzag");
    assert_eq!(first[6], "100");
    assert!(first[3].ends_with("branches_core.h"), "{first:?}");
}

#[test]
fn attach_counts_and_leaves_no_breakpoint() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("blocks-attach");
    let exe = compile(&dir, "att", &["attach.c"], &["-O2", "-g", "-pthread"]);
    for engine in ["ptrace", "uprobe", "in-process"] {
        let (mut child, _stdout) = spawn_ready(&exe, &["30", "100"]);
        let pid = child.id();
        let before = code_bytes(pid, &exe);
        let out_file = dir.path("a.json");
        let out = superprof()
            .args([
                "blocks",
                "-r",
                "attached_spin",
                "--format",
                "json",
                "--duration",
                "1",
                "--engine",
                engine,
            ])
            .args(["-p", &pid.to_string(), "-o"])
            .arg(&out_file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(child.try_wait().unwrap().is_none(), "the process ended");
        assert_running_untraced(pid);
        assert_eq!(code_bytes(pid, &exe), before, "code changed after detach");
        let _ = child.kill();
        let _ = child.wait();
        let doc: Value =
            serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
        let entry = hex(&doc["regions"][0]["start"]);
        let calls = blocks_of(&doc)
            .iter()
            .find(|b| b.start == entry)
            .map(|b| b.count)
            .unwrap_or(0);
        // attached_spin(0.01) is called in a loop, and its inner loop is counted block by block
        // (two ptrace stops, or a uprobe hit, per block): at least one call in a second, at most
        // the untraced 100.
        assert!((1..=110).contains(&calls), "{calls} calls in 1 s");
    }
}

#[test]
fn bad_input_gives_one_line() {
    let dir = TempDir::new("blocks-bad");
    let exe = compile(&dir, "br", &["branches.c"], &["-O2", "-g"]);
    let out = superprof()
        .args(["blocks", "--"])
        .arg(&exe)
        .output()
        .unwrap();
    assert_one_line_error(&out, "needs a region");
    let out = superprof()
        .args(["blocks", "-r", "no_such_function", "--"])
        .arg(&exe)
        .output()
        .unwrap();
    // A region never found is said in one line; the command ran, and its status is
    // superprof's (issue 12).
    assert_one_line_notice(&out, "no function 'no_such_function'", 0);
    let out = superprof()
        .args(["blocks", "-r", "0x20-0x10", "--"])
        .arg(&exe)
        .output()
        .unwrap();
    assert_one_line_error(&out, "bad range");
    let out = superprof()
        .args(["blocks", "-r", "pick", "--mode", "everything", "--"])
        .arg(&exe)
        .output()
        .unwrap();
    assert_one_line_error(&out, "everything");
    let out = superprof()
        .args([
            "blocks",
            "-r",
            "pick",
            "-o",
            "/nonexistent/dir/x.json",
            "--",
        ])
        .arg(&exe)
        .output()
        .unwrap();
    assert_one_line_error(&out, "cannot write");
    let out = superprof()
        .args(["blocks", "-r", "pick", "--", "/no/such/program"])
        .output()
        .unwrap();
    assert_one_line_error(&out, "/no/such/program");
}

/// Issue 31, item 3: blocks too short for the in-process engine's jump, with no filler in
/// reach for a springboard (short_blocks.S), are counted by uprobes as root, not by
/// breakpoints: the program never stops, and the counts are exact, from threads started
/// after the probes went in too (held until theirs are open). Per call of tiny(i): its first
/// block and its `ret` once, the `lea` where i != 0.
#[test]
fn in_process_counts_blocks_too_short_for_a_jump_with_uprobes() {
    require_root("uprobes");
    let dir = TempDir::new("short-blocks");
    let exe = compile(
        &dir,
        "sb",
        &["short_blocks_main.c", "short_blocks.S"],
        &["-O2", "-g", "-pthread"],
    );
    const N: u64 = 20_000;
    for threads in [0u64, 3] {
        let (n, t) = (N.to_string(), threads.to_string());
        let cmd = [exe.as_os_str(), n.as_ref(), t.as_ref()];
        let doc = blocks_json(&dir, &["-r", "tiny"], &cmd);
        let what = format!("{threads} threads: {doc}");
        assert_eq!(doc["engine"], "in-process", "{what}");
        assert_eq!(doc["stops"], 0, "{what}");
        assert_eq!(doc["breakpoint_blocks"], 0, "{what}");
        assert!(doc["uprobe_blocks"].as_u64() >= Some(1), "{what}");
        let runs = threads.max(1);
        let counts: Vec<u64> = blocks_of(&doc).iter().map(|b| b.count).collect();
        assert_eq!(counts, [runs * N, runs * (N - 1), runs * N], "{what}");
    }
}
