"""How often SIGKILL of superprof harms the program it probes (issue 31, item 3).

superprof is started on a fixture whose probed function runs most of the time (split.c's
work_alpha, 50% of its CPU time), killed with SIGKILL at a random moment of the program's run,
and the program's fate is read by this script, made a child subreaper so that the orphaned
program is reparented to it: harmed means killed by a signal (SIGTRAP: a breakpoint's trap
delivered once its tracer died) or a nonzero status.

    python3 bench/kill_window.py SUPERPROF EXE RUNS [ARGS...]
    e.g. python3 bench/kill_window.py target/release/superprof /tmp/split 40 blocks -r work_alpha

EXE runs with the argument in $EXE_ARG (default 1: split.c's seconds).
"""
import ctypes
import os
import random
import signal
import subprocess
import sys
import time

superprof, exe, runs, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_CHILD_SUBREAPER = 36
assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0

harmed, killed_in_run, fates = 0, 0, {}
for i in range(runs):
    sp = subprocess.Popen([superprof, *args, "--", exe, os.environ.get("EXE_ARG", "1")], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    time.sleep(random.uniform(0.3, 0.9))
    sp.send_signal(signal.SIGKILL)
    sp.wait()
    # Reap whatever else ends: the orphaned program (and a janitor or lab, if any).
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.02)
            continue
        if os.WIFSIGNALED(status) or (os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0):
            fate = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else \
                f"status {os.WEXITSTATUS(status)}"
            fates[fate] = fates.get(fate, 0) + 1
            harmed += 1
        killed_in_run += 1
print(f"{' '.join(args)}: {harmed} harmed of {runs} kills ({killed_in_run} processes reaped); {fates}")
