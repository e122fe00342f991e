#!/usr/bin/env python3
"""superprof's fixed cost and its cost on a short program, beside perf and samply (issue 34).

Two sets, each N alternating rounds, medians:
  fixed cost  `CMD -- true` for superprof record -q -o x.folded, samply record --save-only,
              perf record --call-graph dwarf (what each costs when there is nothing to profile)
  split 0.26  tests/fixtures/split.c for 0.26 s of CPU: bare, then each recorder writing its
              own format (superprof: a folded file, symbolized; samply: its unsymbolized
              profile; perf: perf.data)
and the ratio of each recorded run to the bare one.

Each set twice: warm (runs back to back) and cold (each run after 1.1 s without a perf event
open). Before the first per-task or cgroup perf event of a machine the kernel switches its
context-switch hooks on and waits out an RCU grace period (6-20 ms here), and keeps them on for
a second after the last one closes: a profiler started by hand meets the cold case, one run
right after another the warm one. Every recorder here pays it (perf, samply, superprof).

Usage: bench/startup.py [ROUNDS]   (samply from bench/out/tools, as record_vs_perf.py installs it)
"""
import os
import statistics
import subprocess
import sys
import time

from benchlib import OUT, paranoid_for_samply, superprof_and_split, tool

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 11


def sh(cmd):
    return subprocess.run(cmd, shell=True, check=True)


def medians(cmds, cold=False):
    times = {k: [] for k in cmds}
    for _ in range(ROUNDS):
        for name, cmd in cmds.items():
            if cold:
                time.sleep(1.1)
            t0 = time.perf_counter()
            sh(cmd)
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    with paranoid_for_samply():
        run_all()


def run_all():
    superprof, fixture = superprof_and_split()
    samply = tool("samply", "samply")

    def recorders(run):
        return {
            "superprof": f"{superprof} record -q -o {OUT}/startup.folded -- {run} 2>/dev/null",
            "samply": f"{samply} record --save-only -r 999 -o {OUT}/startup.json.gz -- {run} 2>/dev/null",
            "perf": f"perf record -q -F 999 --call-graph dwarf -o {OUT}/startup.data -- {run} 2>/dev/null",
        }

    run = f"{fixture} 0.26 > /dev/null"
    for cold in (False, True):
        how = "cold (1.1 s idle before each run)" if cold else "warm (back to back)"
        fixed = medians(recorders("true"), cold)
        print(f"{how}: fixed cost, `-- true`, medians of {ROUNDS} alternating rounds:")
        for k, v in fixed.items():
            print(f"  {k:<10} {v:6.3f} s")
        split = medians({"bare": run, **recorders(run)}, cold)
        bare = split["bare"]
        print(f"{how}: split 0.26 s, medians of {ROUNDS} alternating rounds:")
        for k, v in split.items():
            print(f"  {k:<10} {v:6.3f} s   {v / bare:6.3f}x bare")
        print()


if __name__ == "__main__":
    main()
