#!/usr/bin/env python3
"""superprof agent's own cost (issue 18): its CPU time and peak memory while it profiles a busy
machine at its default rate (19 Hz per CPU, a profile per process every 15 s), and the bytes it
pushes per interval; beside perf record -a -g at the same rate for the same time, the tool a
user would otherwise leave running (it writes a file instead of pushing).

The machine is kept busy by one CPU hog per core and a shell that starts a short process every
10 ms (so that new processes, mappings and names keep coming). The server is a local HTTP one
that takes Pyroscope's ingest requests and counts their bytes.

Usage: bench/agent.py [SECONDS]   (default 60: four intervals)
"""
import http.server
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXE = os.path.join(ROOT, "target", "release", "superprof")

received = []


class Ingest(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        self.rfile.read(n)
        received.append((time.monotonic(), n))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def measure(cmd, seconds):
    """Runs cmd for `seconds` (then SIGTERM); returns (cpu seconds, peak RSS in MiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(seconds)
    peak = 0
    with open(f"/proc/{p.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    p.terminate()
    _, err = p.communicate(timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, peak, err.decode(errors="replace")


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ingest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    ncpu = os.cpu_count()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(ncpu)]
    churn = subprocess.Popen(["sh", "-c", "while :; do /bin/true; sleep 0.01; done"])
    try:
        time.sleep(1)
        cpu, rss, err = measure([EXE, "agent", "--push", f"pyroscope:http://127.0.0.1:{port}"],
                                seconds)
        intervals = max(1, round(seconds / 15))
        total = sum(n for _, n in received)
        print(f"busy machine: {ncpu} CPU hogs and a process started every 10 ms, {seconds:.0f} s")
        print(f"superprof agent (19 Hz, 15 s intervals): {cpu:.2f} s of CPU "
              f"({100 * cpu / seconds:.2f}% of one CPU), peak RSS {rss:.1f} MiB")
        print(f"  pushed {len(received)} profiles, {total} bytes: {total / intervals:.0f} bytes "
              f"per interval ({len(received) / intervals:.1f} profiles per interval)")
        print("  " + (err.strip().splitlines() or ["?"])[-1])
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "perf.data")
            pcpu, prss, _ = measure(["perf", "record", "-a", "-g", "-F", "19", "-o", out, "-q"],
                                    seconds)
            size = os.path.getsize(out) if os.path.exists(out) else 0
        print(f"perf record -a -g -F 19: {pcpu:.2f} s of CPU ({100 * pcpu / seconds:.2f}% of one "
              f"CPU), peak RSS {prss:.1f} MiB, {size} bytes written")
        print(f"ratios superprof / perf: CPU {cpu / max(pcpu, 1e-9):.2f}, "
              f"memory {rss / max(prss, 1e-9):.2f}")
    finally:
        for h in hogs:
            h.kill()
        churn.kill()
        server.shutdown()


if __name__ == "__main__":
    main()
