#!/usr/bin/env python3
"""libsuperprof's overhead at 999 Hz (`superprof preload -F 999`) against the bare run and
against gperftools' CPU profiler on the same program (LD_PRELOAD=libprofiler.so
CPUPROFILE=... CPUPROFILE_FREQUENCY=999, from Debian's libgoogle-perftools-dev), medians of
ROUNDS alternating runs. Both sample on ITIMER_PROF; superprof keeps full stacks (frame
pointers) and symbolizes at exit, gperftools writes raw addresses.

Usage: bench/libsuperprof.py [ROUNDS]
"""
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
FIX = os.path.join(ROOT, "tests", "fixtures")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
GPERF = "/usr/lib/x86_64-linux-gnu/libprofiler.so"


def timed(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=e)
    return time.perf_counter() - t


def main():
    os.makedirs(OUT, exist_ok=True)
    subprocess.run(f"cargo build --release --quiet --manifest-path {ROOT}/Cargo.toml", shell=True, check=True)
    if not os.path.exists(GPERF):
        sys.exit("install libgoogle-perftools-dev for gperftools' libprofiler.so")
    sp = os.path.join(ROOT, "target", "release", "superprof")
    # Fixed work (not a CPU-time budget, which would hide the handler's cost).
    deep = os.path.join(OUT, "deep.c")
    with open(deep, "w") as f:
        f.write("volatile unsigned long sink;\n"
                "__attribute__((noinline)) unsigned long leaf(unsigned long n) { unsigned long a = 1;"
                " for (unsigned long i = 0; i < n; i++) { a = a * 6364136223846793005UL + 1; __asm__ volatile(\"\" : \"+r\"(a)); } return a; }\n"
                "__attribute__((noinline)) unsigned long down(int d, unsigned long n) { return d ? down(d - 1, n) + 1 : leaf(n); }\n"
                "int main(void) { for (int r = 0; r < 40; r++) sink += down(30, 50000000UL); return 0; }\n")
    for name, src, args in [("blocks_hot 2 (two loops)", os.path.join(FIX, "blocks_hot.c"), ["2"]),
                            ("30-deep recursion", deep, [])]:
        exe = os.path.join(OUT, os.path.basename(src)[:-2] + "-fp")
        subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-I", FIX, "-o", exe, src], check=True)
        runs = {
            "bare": ([exe, *args], None),
            "superprof preload -F 999": ([sp, "preload", "-q", "-F", "999", "-o", os.path.join(OUT, "preload.parquet"), "--", exe, *args], None),
            "gperftools 999 Hz": ([exe, *args], {"LD_PRELOAD": GPERF, "CPUPROFILE": os.path.join(OUT, "gperf.prof"), "CPUPROFILE_FREQUENCY": "999"}),
        }
        times = {k: [] for k in runs}
        for _ in range(ROUNDS):
            for k, (cmd, env) in runs.items():
                times[k].append(timed(cmd, env))
        med = {k: statistics.median(v) for k, v in times.items()}
        bare = med["bare"]
        gp = med["gperftools 999 Hz"] - bare
        print(f"\n{name}")
        for k, t in med.items():
            over = t - bare
            ratio = f"{over / gp:6.2f}" if k != "bare" and gp > 0 else "     -"
            print(f"  {k:28} {t:7.3f} s  overhead {100 * over / bare:6.2f}%  vs gperftools {ratio}")
        # The part that does not grow with the run: superprof's start, and at exit the
        # symbolization (DWARF of the program and libc) and the profile file; gperftools
        # writes raw addresses and symbolizes later, in pprof.
        tiny = [exe, "0.02"] if "blocks_hot" in exe else None
        if tiny:
            fixed = statistics.median(timed([sp, "preload", "-q", "-o", os.path.join(OUT, "preload.parquet"), "--", *tiny]) for _ in range(ROUNDS)) \
                - statistics.median(timed(tiny) for _ in range(ROUNDS))
            sampling = med["superprof preload -F 999"] - bare - fixed
            print(f"  superprof fixed cost (start, symbolize, write): {fixed:.3f} s; sampling itself: "
                  f"{100 * sampling / bare:.2f}% ({sampling / gp:.2f} of gperftools' overhead)")


if __name__ == "__main__":
    main()
