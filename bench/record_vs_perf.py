#!/usr/bin/env python3
"""Time from launch to a finished flamegraph: superprof vs the perf pipeline vs samply.

For one CPU-bound fixture (tests/fixtures/split.c, about 1 s bare) this runs, alternating,
N rounds of:
  bare        ./split 1.0
  superprof   superprof record -q -o x.svg -- ./split 1.0
  perf        perf record -F 999 --call-graph dwarf -o perf.data -- ./split 1.0
              && perf script | inferno-collapse-perf | inferno-flamegraph > x.svg
  samply      samply record --save-only -r 999 -o x.json.gz -- ./split 1.0
and prints medians, ratios, overhead over the bare run, and superprof's peak RSS.

Usage: bench/record_vs_perf.py [ROUNDS]   (installs samply and inferno with cargo if missing)
"""
import os
import statistics
import subprocess
import sys
import time

from benchlib import OUT, paranoid_for_samply, superprof_and_split, tool

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, check=True, **kw)


def main():
    with paranoid_for_samply():
        run_all()


def run_all():
    superprof, fixture = superprof_and_split()
    samply = tool("samply", "samply")
    collapse = tool("inferno-collapse-perf", "inferno")
    flamegraph = tool("inferno-flamegraph", "inferno")
    run = f"{fixture} 1.0 > /dev/null"
    cmds = {
        "bare": run,
        "superprof": f"{superprof} record -q -o {OUT}/superprof.svg -- {run} 2>/dev/null",
        "perf pipeline": (
            f"perf record -q -F 999 --call-graph dwarf -o {OUT}/perf.data -- {run} 2>/dev/null && "
            f"perf script -i {OUT}/perf.data 2>/dev/null | {collapse} | {flamegraph} > {OUT}/perf.svg"
        ),
        "samply": f"{samply} record --save-only -r 999 -o {OUT}/samply.json.gz -- {run} 2>/dev/null",
    }
    times = {k: [] for k in cmds}
    for r in range(ROUNDS):
        for name, cmd in cmds.items():
            t0 = time.perf_counter()
            sh(cmd)
            times[name].append(time.perf_counter() - t0)
        print(f"round {r + 1}/{ROUNDS}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    rss = subprocess.run(
        f"/usr/bin/time -f %M {superprof} record -q -o {OUT}/superprof.svg -- {run}",
        shell=True, capture_output=True, text=True, check=True,
    ).stderr.strip().splitlines()[-1]
    med = {k: statistics.median(v) for k, v in times.items()}
    bare = med["bare"]
    print(f"\nmedians of {ROUNDS} alternating rounds (launch to finished flamegraph):")
    for k, v in med.items():
        print(f"  {k:<14} {v:6.2f} s   overhead over bare {v - bare:+6.2f} s")
    print(f"  superprof / perf pipeline = {med['superprof'] / med['perf pipeline']:.2f}  (target <= 0.5)")
    print(f"  superprof / samply        = {med['superprof'] / med['samply']:.2f}  (target <= 1.0)")
    print(f"  overhead superprof / samply = {(med['superprof'] - bare) / max(med['samply'] - bare, 1e-9):.2f}  (target < 1.0)")
    print(f"  superprof peak RSS: {int(rss) / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
