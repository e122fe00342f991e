#!/usr/bin/env python3
"""`superprof qemu`: samples per second and mean time per sample, per backend, side by side
with the original design's approach (QMP, one HMP `x` round trip per 8-byte stack word), on
the same guest: the test kernels of tests/fixtures/qemu under TCG, linked low and in the
upper half like real kernels ("-hh": x86_64 at 0xffffffff80000000 without frame pointers,
AArch64 in TTBR1's half), as fast as possible (--interval 0) for DURATION seconds. "fully
unwound" samples per second are samples/s times the share unwound to the stack's root.

Usage: bench/qemu.py [DURATION]
"""
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out", "qemu")
Q = os.path.join(ROOT, "tests", "fixtures", "qemu")
DURATION = sys.argv[1] if len(sys.argv) > 1 else "3"
CFLAGS = ["-g", "-O1", "-ffreestanding", "-nostdlib", "-fno-omit-frame-pointer",
          "-fasynchronous-unwind-tables", "-fno-stack-protector", "-mgeneral-regs-only",
          "-static", "-no-pie", "-fno-pic", "-Wl,--build-id=none"]


HH_FLAGS = {"x86_64": ["-mcmodel=kernel", "-fomit-frame-pointer"], "aarch64": ["-fomit-frame-pointer"]}


def build(arch, variant):
    cc, extra = ("gcc", ["-mno-red-zone"]) if arch == "x86_64" else ("aarch64-linux-gnu-gcc", ["-mstrict-align"])
    k = os.path.join(OUT, f"{arch}{variant}-kernel.elf")
    u = os.path.join(OUT, f"{arch}-user.elf")
    flags = HH_FLAGS[arch] if variant else []
    subprocess.run([cc, *CFLAGS, *extra, *flags, "-T", f"{Q}/{arch}{variant}.ld", "-o", k, f"{Q}/{arch}-start.S", f"{Q}/{arch}-kernel.c"], check=True, stderr=subprocess.DEVNULL)
    subprocess.run([cc, *CFLAGS, *extra, "-T", f"{Q}/{arch}-user.ld", "-o", u, f"{Q}/{arch}-user-start.S", f"{Q}/user.c"], check=True, stderr=subprocess.DEVNULL)
    return k, u


def main():
    os.makedirs(OUT, exist_ok=True)
    subprocess.run(f"cargo build --release --quiet --manifest-path {ROOT}/Cargo.toml", shell=True, check=True)
    sp = os.environ.get("SUPERPROF", os.path.join(ROOT, "target", "release", "superprof"))
    print(f"{'guest':11} {'backend':34} {'samples/s':>10} {'us/sample':>10} {'unwound':>8} {'unwound/s':>10}")
    for arch, variant in [("x86_64", ""), ("x86_64", "-hh"), ("aarch64", ""), ("aarch64", "-hh")]:
        k, u = build(arch, variant)
        gdb, qmp = os.path.join(OUT, "gdb.sock"), os.path.join(OUT, "qmp.sock")
        for s in (gdb, qmp):
            if os.path.exists(s):
                os.remove(s)
        machine = ["qemu-system-x86_64", "-M", "pc"] if arch == "x86_64" else ["qemu-system-aarch64", "-M", "virt", "-cpu", "cortex-a57"]
        qemu = subprocess.Popen(machine + ["-m", "128M", "-display", "none", "-serial", "none", "-monitor", "none",
                                           "-kernel", k, "-device", f"loader,file={u}",
                                           "-gdb", f"unix:{gdb},server=on,wait=off", "-qmp", f"unix:{qmp},server=on,wait=off"])
        while not (os.path.exists(gdb) and os.path.exists(qmp)):
            time.sleep(0.05)
        time.sleep(1)  # past the boot code, into the kernel's work
        runs = [
            ("gdbstub", ["--gdb", gdb]),
            ("QMP, memsave bulk reads", ["--qmp", qmp]),
            ("QMP, one HMP x per word (design)", ["--qmp", qmp, "--qmp-word-reads"]),
        ]
        for name, args in runs:
            r = subprocess.run([sp, "qemu", "--kernel", k, "--user", u, *args, "--interval", "0",
                                "--duration", DURATION, "-o", os.path.join(OUT, "q.folded")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            m = re.search(r"(\d+) samples in ([\d.]+) s \((\d+) samples/s\), (\d+) µs per sample, ([\d.]+)% fully unwound", r.stderr)
            if not m:
                print(arch + variant, name, "failed:", r.stderr.strip()[-300:])
                continue
            full = int(m.group(1)) * float(m.group(5)) / 100 / float(m.group(2))
            print(f"{arch + variant:11} {name:34} {m.group(3):>10} {m.group(4):>10} {m.group(5):>7}% {full:>10.0f}")
        qemu.kill()
        qemu.wait()


if __name__ == "__main__":
    main()
