#!/usr/bin/env python3
"""`superprof blocks` against the bare run and against callgrind (valgrind --tool=callgrind
--dump-instr=yes --collect-jumps=yes), side by side on the same fixtures; medians of ROUNDS.

Three workloads:
- branches.c with N calls (switch, loop, branches): count (in-process; decode and learn
  analyzers on ptrace; uprobes) on pick, zigzag and sum_picks, coverage and sample of the
  whole executable.
- branches.c with 20 million calls of pick (a hot function): count in-process against
  callgrind (ptrace would take hours: two stops per block execution).
- blocks_hot.c (two hot loops, about 0.6 s): count of the loops' function in-process, coverage
  and sample of the whole executable.

Usage: bench/blocks.py [ROUNDS] [N]
"""
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
FIX = os.path.join(ROOT, "tests", "fixtures")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
N = sys.argv[2] if len(sys.argv) > 2 else "20000"


def timed(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def run(title, cmds):
    times = {k: [] for k in cmds}
    for _ in range(ROUNDS):
        for k, c in cmds.items():
            times[k].append(timed(c))
    med = {k: statistics.median(v) for k, v in times.items()}
    bare, cg = med["bare"], med["callgrind"]
    print(f"\n{title}")
    print(f"{'':28} {'seconds':>9} {'x bare':>9} {'x callgrind':>12}")
    for k, t in med.items():
        print(f"{k:28} {t:9.3f} {t / bare:9.1f} {t / cg:12.3f}")
    return med


def main():
    os.makedirs(OUT, exist_ok=True)
    subprocess.run(f"cargo build --release --quiet --manifest-path {ROOT}/Cargo.toml", shell=True, check=True)
    sp = os.path.join(ROOT, "target", "release", "superprof")
    br = os.path.join(OUT, "branches")
    hot = os.path.join(OUT, "blocks_hot")
    subprocess.run(["gcc", "-O2", "-g", "-I", FIX, "-o", br, os.path.join(FIX, "branches.c")], check=True)
    subprocess.run(["gcc", "-O1", "-g", "-I", FIX, "-o", hot, os.path.join(FIX, "blocks_hot.c")], check=True)
    cg = ["valgrind", "--tool=callgrind", "--dump-instr=yes", "--collect-jumps=yes",
          f"--callgrind-out-file={OUT}/callgrind.out"]
    o = ["--format", "json", "-o", os.path.join(OUT, "blocks.json")]
    regions = ["-r", "pick", "-r", "zigzag", "-r", "sum_picks"]
    med = run(f"branches {N} (count regions: pick, zigzag, sum_picks)", {
        "bare": [br, N],
        "callgrind": cg + [br, N],
        "count (in-process)": [sp, "blocks", *regions, *o, "--", br, N],
        "count (ptrace, decode)": [sp, "blocks", *regions, "--engine", "ptrace", *o, "--", br, N],
        "count (ptrace, decode, stepped)": [sp, "blocks", *regions, "--step-branches", *o, "--", br, N],
        "count (ptrace, learn)": [sp, "blocks", *regions, "--analyzer", "learn", *o, "--", br, N],
        "count (uprobe)": [sp, "blocks", *regions, "--engine", "uprobe", *o, "--", br, N],
        "coverage (whole, in-process)": [sp, "blocks", "--mode", "coverage", *o, "--", br, N],
        "coverage (whole, ptrace)": [sp, "blocks", "--mode", "coverage", "--engine", "ptrace", *o,
                                     "--", br, N],
        "sample (whole executable)": [sp, "blocks", "--mode", "sample", *o, "--", br, N],
    })
    import json
    for engine in ["ptrace", "in-process"]:
        subprocess.run([sp, "blocks", *regions, "--engine", engine, *o, "--", br, N], check=True,
                       stdout=subprocess.DEVNULL)
        doc = json.load(open(os.path.join(OUT, "blocks.json")))
        execs, stops = doc["total"], doc["stops"]
        spent = med[f"count ({engine}" + (", decode)" if engine == "ptrace" else ")")] - med["bare"]
        print(f"count {engine}: {execs} block executions, {stops} stops: "
              f"{spent / execs * 1e6:.3f} us per block execution"
              + (f", {spent / stops * 1e6:.1f} us per stop" if stops else "")
              + (f"; {doc['patched_blocks']} blocks patched, {doc['breakpoint_blocks']} on breakpoints"
                 if engine == "in-process" else ""))
    big = "20000000"
    med = run(f"branches {big} (count regions: pick, zigzag, sum_picks)", {
        "bare": [br, big],
        "callgrind": cg + [br, big],
        "count (in-process)": [sp, "blocks", *regions, *o, "--", br, big],
    })
    doc = json.load(open(os.path.join(OUT, "blocks.json")))
    spent = med["count (in-process)"] - med["bare"]
    print(f"count in-process: {doc['total']} block executions, {doc['stops']} stops: "
          f"{spent / doc['total'] * 1e9:.2f} ns per block execution")
    run("blocks_hot 0.5 (0.6 s of two hot loops)", {
        "bare": [hot, "0.5"],
        "callgrind": cg + [hot, "0.5"],
        "count (in-process, two_loops)": [sp, "blocks", "-r", "two_loops", *o, "--", hot, "0.5"],
        "coverage (whole, in-process)": [sp, "blocks", "--mode", "coverage", *o, "--", hot, "0.5"],
        "coverage (whole, ptrace)": [sp, "blocks", "--mode", "coverage", "--engine", "ptrace", *o,
                                     "--", hot, "0.5"],
        "sample (whole executable)": [sp, "blocks", "--mode", "sample", *o, "--", hot, "0.5"],
    })


if __name__ == "__main__":
    main()
