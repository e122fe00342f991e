#!/usr/bin/env python3
"""Cost per call of `superprof stat` on a tiny function called 100,000 times, per probe engine
(in-process, uprobe, ptrace),
beside `perf stat` counting the same function's entry and return uprobes (perf probe): (wall time
- bare wall time) / calls, medians of ROUNDS alternating runs. Also what stat reports for the
function (its per-call time-elapsed and task-clock, after taking off the engine's own cost).

The fixed cost of a run (launch, measuring the engine's own cost on an empty region when calls
were measured, removing probes) is in the wall time too: the cost per call is the slope between
a run of CALLS calls and one of CALLS/10.

Usage: bench/stat_cost.py [ROUNDS]   (root: uprobes and perf probe need it)
"""
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
CALLS = 100_000


def timed(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main():
    os.makedirs(OUT, exist_ok=True)
    subprocess.run(f"cargo build --release --quiet --manifest-path {ROOT}/Cargo.toml", shell=True, check=True)
    sp = os.path.join(ROOT, "target", "release", "superprof")
    src = os.path.join(OUT, "tiny.c")
    exe = os.path.join(OUT, "tiny")
    with open(src, "w") as f:
        # movpush: a register move, then a push (which the kernel emulates): the uprobe engine
        # probes its entry at the push.
        f.write("#include <stdlib.h>\nvolatile long s;\n"
                "__attribute__((noinline)) long tiny(long x) { s += x; return x + 1; }\n"
                "__attribute__((naked, noinline)) long movpush(long x) {\n"
                "  __asm__(\"mov %rdi, %rax\\n push %rbx\\n add $1, %rax\\n pop %rbx\\n ret\"); }\n"
                "int main(int c, char **v) { long n = atol(v[1]); long (*f)(long) = c > 2 ? movpush : tiny;\n"
                "  for (long i = 0; i < n; i++) f(i); return 0; }\n")
    subprocess.run(["gcc", "-O2", "-g", "-o", exe, src], check=True)
    # perf's uprobes on the same function: entry and return.
    subprocess.run(["perf", "probe", "-q", "-d", "probe_tiny:*"], stderr=subprocess.DEVNULL)
    subprocess.run(["perf", "probe", "-q", "-x", exe, "tiny"], check=True)
    subprocess.run(["perf", "probe", "-q", "-x", exe, "tiny%return"], check=True)
    report = os.path.join(OUT, "tiny.json")

    def stat(engine, n, region="tiny"):
        return [sp, "stat", "--engine", engine, "-r", region, "-e", "task-clock", "--format", "json",
                "-o", report, "--", exe, str(n)] + (["m"] if region != "tiny" else [])

    cmds = {
        "bare": lambda n: [exe, str(n)],
        "in-process": lambda n: stat("in-process", n),
        "uprobe": lambda n: stat("uprobe", n),
        "uprobe, mov then push": lambda n: stat("uprobe", n, "movpush"),
        "ptrace": lambda n: stat("ptrace", n),
        "perf stat (uprobes)": lambda n: ["perf", "stat", "-e", "probe_tiny:tiny,probe_tiny:tiny__return",
                                          "--", exe, str(n)],
    }
    per_call = {k: [] for k in cmds}
    fixed = {k: [] for k in cmds}
    figures = {}
    for _ in range(ROUNDS):
        for k, c in cmds.items():
            n = CALLS if k != "ptrace" else CALLS // 10
            fixed[k].append((timed(c(n // 10)), n // 10))
            per_call[k].append((timed(c(n)), n))
            if k in ("in-process", "uprobe", "ptrace", "uprobe, mov then push"):
                d = json.load(open(report))
                ev = d["regions"][0]["events"]
                figures.setdefault(k, []).append((ev["time-elapsed-ns"]["mean"], ev["task-clock"]["mean"]))
    subprocess.run(["perf", "probe", "-q", "-d", "probe_tiny:*"], stderr=subprocess.DEVNULL)
    def slope(k):
        return [(t - t0) / (n - n0) for (t, n), (t0, n0) in zip(per_call[k], fixed[k])]

    bare = statistics.median(slope("bare"))
    print(f"{CALLS} calls of tiny (ptrace: {CALLS // 10}), {ROUNDS} rounds, medians")
    for k in cmds:
        us = statistics.median(x - bare for x in slope(k)) * 1e6
        f = statistics.median(t0 - s * n0 for (t0, n0), s in zip(fixed[k], slope(k)))
        line = f"  {k:<22} {us:8.2f} us per call (fixed cost of a run {f:.2f} s)"
        if k in figures:
            el = statistics.median(x[0] for x in figures[k])
            tc = statistics.median(x[1] for x in figures[k])
            line += f"; reports tiny at {el:.0f} ns elapsed, {tc:.0f} ns task-clock a call"
        print(line)


if __name__ == "__main__":
    main()
