#!/usr/bin/env python3
"""Overhead of the coordinator: the ptrace sampler against the perf sampler, and
`superprof syscalls` against `strace -f`, on the same machine in one run, alternating,
medians of ROUNDS.

  sampler:  a fixed amount of work (tests/fixtures/recurse.c, 200 rounds of recursion 30 deep
            with a busy leaf counted in loop iterations, not in time), bare / perf sampler /
            ptrace sampler, at 99 Hz and at 999 Hz (superprof record -q -o x.folded --sampler)
  syscalls: tests/fixtures/sysheavy.c 20000 (140,000 syscalls), bare / strace -f -o FILE /
            superprof syscalls -o FILE

Usage: bench/coordinator.py [ROUNDS]
"""
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def sh(cmd):
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def bench(cmds):
    times = {k: [] for k in cmds}
    for _ in range(ROUNDS):
        for k, c in cmds.items():
            t = time.perf_counter()
            sh(c)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    os.makedirs(OUT, exist_ok=True)
    sh(f"cargo build --release --quiet --manifest-path {ROOT}/Cargo.toml")
    sp = os.path.join(ROOT, "target", "release", "superprof")
    work = os.path.join(OUT, "work")
    heavy = os.path.join(OUT, "sysheavy")
    # Fixed work: the sampled program must not stop on a clock, or overhead would hide.
    with open(os.path.join(OUT, "work.c"), "w") as f:
        f.write("volatile double s = 1;\n"
                "__attribute__((noinline)) double leaf(long n) { double x = s; for (long i = 0; i < n; i++) x = x * 1.0000001 + 0.1; return x; }\n"
                "__attribute__((noinline)) double rec(int d, long n) { if (!d) return leaf(n); double r = rec(d - 1, n); s = r; return r + 1; }\n"
                "int main(void) { for (int i = 0; i < 200; i++) rec(30, 2500000); return 0; }\n")
    sh(f"gcc -O2 -g -fomit-frame-pointer -o {work} {OUT}/work.c")
    sh(f"gcc -O2 -pthread -o {heavy} {ROOT}/tests/fixtures/sysheavy.c")
    for hz in (99, 999):
        m = bench({
            "bare": work,
            "perf": f"{sp} record -q -F {hz} --sampler perf -o {OUT}/p.folded -- {work}",
            "ptrace": f"{sp} record -q -F {hz} --sampler ptrace -o {OUT}/t.folded -- {work}",
        })
        b = m["bare"]
        print(f"sampler at {hz} Hz: bare {b:.3f} s, perf {m['perf']:.3f} s (+{100 * (m['perf'] / b - 1):.1f}%), "
              f"ptrace {m['ptrace']:.3f} s (+{100 * (m['ptrace'] / b - 1):.1f}%), ptrace/perf {m['ptrace'] / m['perf']:.2f}")
    m = bench({
        "bare": f"{heavy} 20000",
        "strace": f"strace -f -o {OUT}/strace.log {heavy} 20000",
        "superprof": f"{sp} syscalls -o {OUT}/syscalls.log -- {heavy} 20000",
    })
    print(f"syscalls: bare {m['bare']:.3f} s, strace -f {m['strace']:.3f} s, superprof syscalls {m['superprof']:.3f} s, "
          f"superprof/strace {m['superprof'] / m['strace']:.2f} (target <= 1.0)")


if __name__ == "__main__":
    main()
