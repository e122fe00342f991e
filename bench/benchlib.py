"""What the benchmarks share: tools installed on demand, and samply's perf_event_paranoid."""
import contextlib
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")
TOOLS = os.path.join(OUT, "tools")
PARANOID = "/proc/sys/kernel/perf_event_paranoid"


def tool(name, crate):
    """The path of `name`, installed from `crate` with cargo into bench/out/tools if missing."""
    path = shutil.which(name) or os.path.join(TOOLS, "bin", name)
    if not os.path.exists(path):
        print(f"installing {crate} with cargo (once) ...", flush=True)
        subprocess.run(
            f"cargo install --quiet --locked --root {TOOLS} {crate}", shell=True, check=True
        )
    return path


@contextlib.contextmanager
def paranoid_for_samply():
    """samply refuses to start at perf_event_paranoid 2, even as root (superprof and perf do
    not): 1 while the block runs, then what it was."""
    old = open(PARANOID).read().strip()
    if int(old) > 1:
        with open(PARANOID, "w") as f:
            f.write("1")
    try:
        yield
    finally:
        with open(PARANOID, "w") as f:
            f.write(old)


def superprof_and_split():
    """superprof built (release) and tests/fixtures/split.c compiled into bench/out: their
    paths."""
    os.makedirs(OUT, exist_ok=True)
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--manifest-path", f"{ROOT}/Cargo.toml"],
        check=True,
    )
    fixture = os.path.join(OUT, "split")
    subprocess.run(
        ["gcc", "-O2", "-g", f"-I{ROOT}/tests/fixtures", "-o", fixture,
         f"{ROOT}/tests/fixtures/split.c"],
        check=True,
    )
    return os.path.join(ROOT, "target", "release", "superprof"), fixture
