#!/usr/bin/env python3
"""Profile file size and `superprof report` speed on a large recording.

Records tests/fixtures/threads.c with four busy threads at 999 Hz until about 240,000 samples
(four threads burning 24/48/72/96 s of CPU: about 60 s of 4-core time, 120 s on a 2-core
machine), then reports:
  - the Parquet file size per sample (target <= 20 bytes),
  - the time of `superprof report FILE -o x.svg` and `-o x.pb.gz` (target <= 2 s each),
    medians of ROUNDS runs, alternating, and the time of `--format folded` for reference.

Usage: bench/profile_files.py [ROUNDS] [UNIT_SECONDS]
"""
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
UNIT = sys.argv[2] if len(sys.argv) > 2 else "24"


def sh(cmd):
    subprocess.run(cmd, shell=True, check=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    sh(f"cargo build --release --quiet --manifest-path {ROOT}/Cargo.toml")
    sp = os.path.join(ROOT, "target", "release", "superprof")
    exe = os.path.join(OUT, "threads")
    sh(f"gcc -O2 -g -pthread -I{ROOT}/tests/fixtures -o {exe} {ROOT}/tests/fixtures/threads.c")
    pq = os.path.join(OUT, "big.parquet")
    t0 = time.perf_counter()
    sh(f"{sp} record -q -o {pq} -- {exe} {UNIT} > /dev/null")
    print(f"recorded in {time.perf_counter() - t0:.1f} s")
    samples = int(subprocess.run(
        ["python3", "-c", f"import pyarrow.parquet as p; print(p.read_metadata('{pq}').num_rows)"],
        capture_output=True, text=True, check=True).stdout)
    size = os.path.getsize(pq)
    cmds = {
        "report -> svg": f"{sp} report {pq} -o {OUT}/big.svg 2>/dev/null",
        "report -> pprof": f"{sp} report {pq} -o {OUT}/big.pb.gz 2>/dev/null",
        "report -> folded": f"{sp} report {pq} --format folded > {OUT}/big.folded",
    }
    times = {k: [] for k in cmds}
    for _ in range(ROUNDS):
        for k, c in cmds.items():
            t = time.perf_counter()
            sh(c)
            times[k].append(time.perf_counter() - t)
    print(f"samples: {samples}")
    print(f"parquet: {size} bytes = {size / samples:.2f} bytes/sample (target <= 20)")
    for k, v in times.items():
        print(f"{k:<18} median {statistics.median(v):.2f} s of {ROUNDS} (target <= 2 s)")


if __name__ == "__main__":
    main()
