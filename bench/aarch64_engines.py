#!/usr/bin/env python3
"""The probe engines on AArch64, side by side in one boot of the arm64 guest that tests/aarch64.rs
uses (Debian's arm64 kernel under qemu-system-aarch64 -M virt -cpu max, TCG: an emulated CPU,
so absolute times are not a machine's; the ratios between engines are what this measures).

- stat: cost per call of a tiny function (`s += x; return x + 1`), per engine (in-process,
  uprobe, ptrace): the slope between runs of CALLS and CALLS/10 calls, less the bare run's.
- blocks count: branches.c's pick, zigzag and sum_picks with N calls, in-process and ptrace,
  against the bare run.

Times come from the guest's own clock (/proc/uptime, centiseconds), medians of ROUNDS.
Needs scripts/aarch64-build first (the cross-built superprof, the kernel and busybox packages).

Usage: bench/aarch64_engines.py [ROUNDS]
"""
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
DEPS = os.path.join(ROOT, "target", "test-deps", "aarch64")
SP = os.path.join(ROOT, "target", "aarch64", "aarch64-unknown-linux-gnu", "release", "superprof")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
CALLS = 20_000
N = 2_000

TINY = ("#include <stdlib.h>\nvolatile long s;\n"
        "__attribute__((noinline)) long tiny(long x) { s += x; return x + 1; }\n"
        "int main(int c, char **v) { long n = atol(v[1]); for (long i = 0; i < n; i++) tiny(i); return 0; }\n")


def main():
    if not os.path.exists(SP):
        sys.exit("run scripts/aarch64-build first")
    work = tempfile.mkdtemp(prefix="superprof-a64-bench-")
    try:
        root = os.path.join(work, "root")
        for d in ["bin", "lib", "proc", "sys", "dev", "tmp", "t"]:
            os.makedirs(os.path.join(root, d))
        pkg = os.path.join(work, "pkg")
        kernel = [p for p in glob.glob(os.path.join(DEPS, "linux-image-*.deb"))
                  if re.match(r"linux-image-\d", os.path.basename(p))][0]
        for deb in [kernel, glob.glob(os.path.join(DEPS, "busybox-static_*.deb"))[0]]:
            subprocess.run(["dpkg-deb", "-x", deb, pkg], check=True)
        shutil.copy(os.path.join(pkg, "bin", "busybox"), os.path.join(root, "bin"))
        for lib in ["ld-linux-aarch64.so.1", "libc.so.6", "libm.so.6", "libgcc_s.so.1"]:
            shutil.copy(os.path.join("/usr/aarch64-linux-gnu/lib", lib), os.path.join(root, "lib"))
        subprocess.run(["aarch64-linux-gnu-strip", "--strip-debug", "-o",
                        os.path.join(root, "bin", "superprof"), SP], check=True)
        with open(os.path.join(work, "tiny.c"), "w") as f:
            f.write(TINY)
        cc = ["aarch64-linux-gnu-gcc", "-O2", "-g", "-I", FIX, "-o"]
        subprocess.run(cc + [os.path.join(root, "t", "tiny"), os.path.join(work, "tiny.c")], check=True)
        subprocess.run(cc + [os.path.join(root, "t", "branches"), os.path.join(FIX, "branches.c")],
                       check=True)
        runs = []
        stat = "superprof stat -e task-clock -r tiny --format json -o /tmp/s.json --engine"
        for _ in range(ROUNDS):
            for engine in ["bare", "in-process", "uprobe", "ptrace"]:
                for n in [CALLS // 10, CALLS] if engine != "ptrace" else [CALLS // 100, CALLS // 10]:
                    cmd = f"./tiny {n}" if engine == "bare" else f"{stat} {engine} -- ./tiny {n}"
                    runs.append((f"stat {engine} {n}", cmd))
            for engine in ["bare", "in-process", "ptrace"]:
                cmd = f"./branches {N}" if engine == "bare" else (
                    f"superprof blocks --engine {engine} -r pick -r zigzag -r sum_picks "
                    f"--format json -o /tmp/b.json -- ./branches {N}")
                runs.append((f"blocks {engine}", cmd))
        script = "cd /t\nt() { read a b < /proc/uptime; echo ${a%.*}${a#*.}; }\n"
        for name, cmd in runs:
            script += f"s=$(t); {cmd} >/dev/null 2>&1; e=$(t); echo \"@@ {name} $((e-s))\"\n"
        with open(os.path.join(root, "t", "run.sh"), "w") as f:
            f.write(script)
        with open(os.path.join(root, "init"), "w") as f:
            f.write("#!/bin/busybox sh\n/bin/busybox --install -s /bin\nmount -t proc proc /proc\n"
                    "mount -t sysfs sys /sys\nmount -t devtmpfs dev /dev\n"
                    "mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null\nsh /t/run.sh\npoweroff -f\n")
        os.chmod(os.path.join(root, "init"), 0o755)
        initrd = os.path.join(work, "initrd.gz")
        subprocess.run(f"cd {root} && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 2>/dev/null"
                       f" | gzip -1 > {initrd}", shell=True, check=True)
        vmlinuz = glob.glob(os.path.join(pkg, "boot", "vmlinuz-*"))[0]
        out = subprocess.run(["qemu-system-aarch64", "-M", "virt", "-cpu", "max", "-smp", "2", "-m", "1G",
                              "-nographic", "-no-reboot", "-kernel", vmlinuz, "-initrd", initrd,
                              "-append", "console=ttyAMA0 quiet panic=-1"],
                             capture_output=True, text=True, timeout=3000).stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)
    times = {}
    for m in re.finditer(r"@@ (.+) (\d+)\r?$", out, re.M):
        times.setdefault(m.group(1), []).append(int(m.group(2)) / 100)
    med = {k: statistics.median(v) for k, v in times.items()}

    def slope(engine, lo, hi):
        return (med[f"stat {engine} {hi}"] - med[f"stat {engine} {lo}"]) / (hi - lo)

    bare = slope("bare", CALLS // 10, CALLS)
    print(f"AArch64 guest (TCG), {ROUNDS} rounds, medians")
    for engine in ["in-process", "uprobe", "ptrace"]:
        lo, hi = (CALLS // 10, CALLS) if engine != "ptrace" else (CALLS // 100, CALLS // 10)
        print(f"  stat --engine {engine:<11} {(slope(engine, lo, hi) - bare) * 1e6:9.1f} us per call")
    b = med["blocks bare"]
    for engine in ["in-process", "ptrace"]:
        print(f"  blocks --engine {engine:<11} {med[f'blocks {engine}']:7.2f} s ({med[f'blocks {engine}'] / b:.1f}x bare {b:.2f} s)")


if __name__ == "__main__":
    main()
