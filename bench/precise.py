#!/usr/bin/env python3
"""The cost of `record --precise` (issue 35): a program that calls a ~2 ns function 60 million
times (tests/fixtures/hot_calls.c), run bare, under `superprof record --precise step`, under
`superprof record` alone, and under what perf needs for the same answer: `perf stat` of a
uprobe on `step` around `perf record -F 999 -g`. N alternating rounds, medians, and each
run's ratio to the bare one (perf's, at about 2.5 µs a uprobe hit, two minutes a run: once);
the calls each counted, beside the program's own count.

Usage: bench/precise.py [ROUNDS]   (root: perf probe defines the uprobe)
"""
import os
import statistics
import subprocess
import sys
import time

from benchlib import OUT, ROOT

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 7


def sh(cmd):
    return subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", f"{ROOT}/Cargo.toml"],
        check=True,
    )
    superprof = os.path.join(ROOT, "target", "release", "superprof")
    exe = os.path.join(OUT, "hot_calls")
    subprocess.run(["gcc", "-O2", "-g", "-o", exe, f"{ROOT}/tests/fixtures/hot_calls.c"], check=True)
    sh(f"perf probe -q -d 'probe_hot_calls:*' 2>/dev/null || true")
    sh(f"perf probe -q -x {exe} step")
    try:
        run_all(superprof, exe)
    finally:
        sh("perf probe -q -d 'probe_hot_calls:*' || true")


def run_all(superprof, exe):
    cmds = {
        "bare": f"{exe}",
        "superprof --precise": f"{superprof} record -q --precise step -o {OUT}/precise.parquet -- {exe}",
        "superprof record": f"{superprof} record -q -o {OUT}/precise-plain.parquet -- {exe}",
        "perf stat uprobe + perf record": (
            f"perf stat -x, -e probe_hot_calls:step -o {OUT}/precise-stat.csv -- "
            f"perf record -q -F 999 -g -o {OUT}/precise-perf.data -- {exe}"
        ),
    }
    times = {k: [] for k in cmds}
    for r in range(ROUNDS):
        for name, cmd in cmds.items():
            if name.startswith("perf") and r > 0:
                continue
            t0 = time.perf_counter()
            sh(cmd)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    bare = med["bare"]
    print(f"hot_calls: step() 60,000,000 times; medians of {ROUNDS} alternating rounds (perf: 1)")
    for k, v in med.items():
        print(f"  {k:<32} {v:7.3f} s   {v / bare:6.2f}x bare")
    # The calls each counted.
    own = sh(exe).stdout.split()[0]
    ours = sh(f"{superprof} report {OUT}/precise.parquet --calls --format json").stdout
    import json

    step = next(f for f in json.loads(ours)["functions"] if f["name"] == "step")
    perf = open(f"{OUT}/precise-stat.csv").read().strip().splitlines()[-1].split(",")[0]
    print(f"calls: the program's own {own}; superprof {step['calls']} "
          f"({step['ns_per_call']:.2f} ns/call ± {step['ns_per_call_error']:.2f}); "
          f"perf's uprobe {perf}")


if __name__ == "__main__":
    main()
