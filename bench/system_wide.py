#!/usr/bin/env python3
"""record -a against perf record -a on a busy machine (issue 34): overhead, samples, lost.

The machine is kept busy by one split fixture per CPU (tests/fixtures/split.c, SECS of CPU
each). Each round runs, alternating: the workload bare; under `superprof record -a`; under
`perf record -a --call-graph dwarf` (the same stacks: a copy of the user stack per sample)
and `perf record -a -g` (frame pointers). Each recorder runs from before the workload
starts until it ends (SIGINT), at 999 Hz. Reported per recorder (medians): the workload's
wall time and its ratio to bare, samples, lost samples, and the recorder's own CPU time
(its rusage, including the time it takes to write its file after the SIGINT).

Usage: bench/system_wide.py [ROUNDS] [SECS]   (root)
"""
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import time

from benchlib import OUT, superprof_and_split

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
SECS = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
CPUS = os.cpu_count() or 1


def workload(fixture):
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen([fixture, str(SECS)], stdout=subprocess.DEVNULL) for _ in range(CPUS)
    ]
    for p in procs:
        p.wait()
    return time.perf_counter() - t0


def recorded(cmd, fixture, counts):
    """The workload's wall time under `cmd` (started first, stopped with SIGINT after), the
    recorder's CPU seconds, and what `counts(stderr)` finds in its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # (both recorders are sampling by then)
    wall = workload(fixture)
    rec.send_signal(signal.SIGINT)
    _, err = rec.communicate()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # (The workload's children are in the same rusage: take them out with a bare estimate
    # below; here the difference is the recorder's and the workload's together.)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, counts(err)


def superprof_counts(err):
    m = re.search(r"superprof: (\d+) samples .*?; (\d+) lost", err)
    return (int(m.group(1)), int(m.group(2))) if m else (0, -1)


def perf_counts(data):
    def counts(err):
        m = re.search(r"\((\d+) samples\)", err)
        samples = int(m.group(1)) if m else 0
        stats = subprocess.run(
            ["perf", "report", "-i", data, "--stats"], capture_output=True, text=True
        ).stdout
        lost = 0
        for line in stats.splitlines():
            if line.strip().startswith("LOST_SAMPLES") or line.strip().startswith("LOST "):
                lost += int(re.findall(r"\d+", line.split(":")[-1])[0])
        return samples, lost

    return counts


def main():
    superprof, fixture = superprof_and_split()
    pdata = os.path.join(OUT, "sys.perf.data")
    recorders = {
        "superprof -a": (
            [superprof, "record", "-a", "-q", "-o", os.path.join(OUT, "sys.parquet")],
            superprof_counts,
        ),
        "perf -a dwarf": (
            ["perf", "record", "-a", "-F", "999", "--call-graph", "dwarf", "-o", pdata],
            perf_counts(pdata),
        ),
        "perf -a -g": (
            ["perf", "record", "-a", "-F", "999", "-g", "-o", pdata],
            perf_counts(pdata),
        ),
    }
    bare = []
    runs = {k: [] for k in recorders}
    for r in range(ROUNDS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        bare.append(workload(fixture))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        bare_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        for name, (cmd, counts) in recorders.items():
            wall, cpu, (samples, lost) = recorded(cmd, fixture, counts)
            runs[name].append((wall, cpu - bare_cpu, samples, lost))
        print(
            f"round {r + 1}/{ROUNDS}: bare {bare[-1]:.2f}s, "
            + ", ".join(f"{k} {v[-1][0]:.2f}s" for k, v in runs.items()),
            flush=True,
        )
    b = statistics.median(bare)
    print(f"\n{CPUS} x split {SECS} s, medians of {ROUNDS} alternating rounds:")
    print(f"  {'bare':<14} {b:6.2f} s")
    for k, v in runs.items():
        med = lambda i: statistics.median(x[i] for x in v)
        print(
            f"  {k:<14} {med(0):6.2f} s  {med(0) / b:5.3f}x bare  samples {med(2):8.0f}  "
            f"lost {med(3):6.0f}  recorder CPU {med(1):5.2f} s"
        )


if __name__ == "__main__":
    main()
