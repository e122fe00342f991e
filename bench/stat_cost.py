#!/usr/bin/env python3
"""Cost per call of `superprof stat` on a tiny function called 100,000 times: (wall time under
stat - bare wall time) / calls, medians of ROUNDS alternating runs. Two ptrace stops per call
(entry and return breakpoints, each with a step over the lifted breakpoint) is the floor of
this design.

Usage: bench/stat_cost.py [ROUNDS]
"""
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
CALLS = 100_000


def main():
    os.makedirs(OUT, exist_ok=True)
    subprocess.run(f"cargo build --release --quiet --manifest-path {ROOT}/Cargo.toml", shell=True, check=True)
    sp = os.path.join(ROOT, "target", "release", "superprof")
    src = os.path.join(OUT, "tiny.c")
    exe = os.path.join(OUT, "tiny")
    with open(src, "w") as f:
        f.write("volatile long s;\n__attribute__((noinline)) long tiny(long x) { s += x; return x + 1; }\n"
                f"int main(void) {{ for (long i = 0; i < {CALLS}; i++) tiny(i); return 0; }}\n")
    subprocess.run(["gcc", "-O2", "-o", exe, src], check=True)
    cmds = {"bare": [exe], "stat": [sp, "stat", "-r", "tiny", "-e", "task-clock", "-o", os.path.join(OUT, "tiny.txt"), "--", exe]}
    times = {k: [] for k in cmds}
    for _ in range(ROUNDS):
        for k, c in cmds.items():
            t = time.perf_counter()
            subprocess.run(c, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[k].append(time.perf_counter() - t)
    bare = statistics.median(times["bare"])
    stat = statistics.median(times["stat"])
    print(f"bare {bare:.3f} s, stat {stat:.3f} s, {CALLS} calls: {(stat - bare) / CALLS * 1e6:.1f} us per call")


if __name__ == "__main__":
    main()
