#!/usr/bin/env python3
"""The installed binary's size (issue 17: under 25 MB, still naming its demo's functions with
file:line), beside samply's when one is installed.

  superprof   cargo install --path crates/superprof --root TMP, then `superprof demo`
  samply      the samply on PATH (cargo install samply: bench/record_vs_perf.py installs it)

Usage: bench/binary_size.py [--reuse]   (--reuse builds in ./target instead of a fresh
target folder: quicker, the same profile and link flags)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    reuse = "--reuse" in sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="superprof-size-") as tmp:
        cmd = ["cargo", "install", "--quiet", "--path", os.path.join(ROOT, "crates/superprof"),
               "--root", tmp]
        cmd += ["--target-dir", os.path.join(ROOT, "target") if reuse else os.path.join(tmp, "target")]
        subprocess.run(cmd, cwd=tmp, check=True)
        exe = os.path.join(tmp, "bin", "superprof")
        size = os.path.getsize(exe)
        demo = subprocess.run([exe, "demo", "--seconds", "1"], cwd=tmp, capture_output=True,
                              text=True, check=True).stdout
        row = next((l for l in demo.splitlines() if "superprof::demo::crunch_numbers" in l), "")
        line = re.search(r"demo\.rs:\d+", row)
        print(f"superprof installed: {size / 1e6:.1f} MB ({size} bytes; target < 25 MB)")
        print(f"  demo names crunch_numbers with file:line: {line.group(0) if line else 'NO'}")
        samply = shutil.which("samply")
        if samply:
            s = os.path.getsize(samply)
            print(f"samply: {s / 1e6:.1f} MB; superprof / samply = {size / s:.2f}")
        else:
            print("samply: not installed (the issue gives 17 MB)")


if __name__ == "__main__":
    main()
