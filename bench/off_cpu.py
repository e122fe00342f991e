#!/usr/bin/env python3
"""Overhead of `record --off-cpu` on a switch-heavy program: two threads passing a byte back
and forth N times over two pipes (tests/fixtures/offcpu.c `pingpong`), so every round trip is
four context switches. Side by side, on the same machine in one run:

- the program alone;
- superprof record (on-CPU only);
- superprof record --off-cpu (root: sched:sched_switch with stacks);
- superprof record --off-cpu --sampler ptrace (the wall-clock mode an ordinary user gets);
- perf record -e sched:sched_switch -g (frame-pointer callchains, perf's own way to see
  switches), and perf record --call-graph dwarf on the same tracepoint (stacks copied, as
  superprof does).

For each: the program's wall time (it measures itself), the ratio to the program alone, the
CPU time of the whole run (recorder and program, from wait4), records lost, and how much
time the off-CPU profile adds up to (both threads: about twice the wall time). The program
runs on one CPU (taskset), the recorder on the other.

Usage: bench/off_cpu.py [N] [ROUNDS]   (root; default N=100000, ROUNDS=3: medians)
"""
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SP = os.path.join(ROOT, "target", "release", "superprof")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def run(cmd, cwd):
    """Runs cmd; returns (the program's own wall time, recorder CPU seconds, stderr)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"{cmd} failed: {p.stderr}")
    wall = float(re.search(r"wall=([\d.]+)", p.stdout).group(1))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, p.stderr


def folded_seconds(path, freq=999):
    total = 0
    with open(path) as f:
        for line in f:
            total += int(line.rsplit(" ", 1)[1])
    return total / freq


def main():
    if os.geteuid() != 0:
        sys.exit("run as root (sched:sched_switch needs it)")
    work = tempfile.mkdtemp(prefix="superprof-offcpu-bench-")
    exe = os.path.join(work, "offcpu")
    subprocess.run(["gcc", "-O1", "-g", "-pthread", "-o", exe,
                    os.path.join(ROOT, "tests", "fixtures", "offcpu.c")], check=True)
    # Both threads on one CPU (the recorder has the other): the same switches every run,
    # where two CPUs make a ping-pong's time vary threefold from run to run.
    prog = ["taskset", "-c", "1", exe, "pingpong", str(N)]
    folded = os.path.join(work, "p.folded")
    cases = [
        ("alone", prog),
        ("superprof record (on-CPU)", [SP, "record", "-q", "-o", folded, "--"] + prog),
        ("superprof record --off-cpu (sched_switch)",
         [SP, "record", "-q", "--off-cpu", "-o", folded, "--"] + prog),
        ("superprof record --off-cpu --stack-size 8192",
         [SP, "record", "-q", "--off-cpu", "--stack-size", "8192", "-o", folded, "--"] + prog),
        ("superprof record --off-cpu --sampler ptrace",
         [SP, "record", "-q", "--off-cpu", "--sampler", "ptrace", "-o", folded, "--"] + prog),
        ("perf record -e sched:sched_switch -g",
         ["perf", "record", "-q", "-o", os.path.join(work, "perf.data"), "-e",
          "sched:sched_switch", "-g", "--"] + prog),
        ("perf record -e sched:sched_switch --call-graph dwarf",
         ["perf", "record", "-q", "-o", os.path.join(work, "perf.data"), "-e",
          "sched:sched_switch", "--call-graph", "dwarf", "--"] + prog),
    ]
    base = None
    print(f"ping-pong, {N} round trips; medians of {ROUNDS}")
    print(f"{'recorder':<52} {'wall s':>8} {'ratio':>6} {'CPU s':>9} {'lost':>7} {'profile s':>9}")
    for name, cmd in cases:
        walls, cpus, lost, covered = [], [], [], []
        for _ in range(ROUNDS):
            if os.path.exists(folded):
                os.remove(folded)
            wall, cpu, err = run(cmd, work)
            walls.append(wall)
            cpus.append(cpu)
            m = re.search(r"(\d+) lost", err)
            lost.append(int(m.group(1)) if m else 0)
            if "--off-cpu" in cmd and os.path.exists(folded):
                covered.append(folded_seconds(folded))
        wall = statistics.median(walls)
        if base is None:
            base = wall
        # CPU time of the whole run: the recorder and the program (the program's own grows
        # with what the kernel does at each of its switches for the recorder).
        cpu = statistics.median(cpus)
        prof = f"{statistics.median(covered):.2f}" if covered else "-"
        print(f"{name:<52} {wall:8.3f} {wall / base:6.2f} {cpu:9.2f} {statistics.median(lost):7.0f} {prof:>9}")
    print("(profile s: the seconds the off-CPU profile adds up to, both threads: about 2 x wall)")


if __name__ == "__main__":
    main()
