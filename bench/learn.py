#!/usr/bin/env python3
"""The learning analyzer against the decoder on a hot loop (issue 21): stops and single steps
per block execution, and how they fall as the learner warms up.

Runs `superprof blocks --engine ptrace` on tests/fixtures/learn_o3.c (built at -O3) for a
growing number of rounds, with `--analyzer decode`, `--analyzer learn` (with its lab), and
`--analyzer learn` without a lab (SUPERPROF_TEST_NO_LAB, read by a build with the
`test-switches` feature, as scripts/test builds: the fallback that learns from single
steps and training alone), and prints per run the block executions, the stops (breakpoint
stops and single steps), learn's single steps inside the regions and outside them (training),
the instructions it ran in the lab and the lab's runs, and, between successive round counts,
the marginal stops per block execution: what a warmed-up learner costs against the decoder.

Usage: python3 bench/learn.py [ROUNDS,ROUNDS,...]   (default 10,100,1000,4000)
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPERPROF = os.path.join(ROOT, "target/release/superprof")
REGIONS = ["run", "finish", "clamp", "mix", "rare_error"]


def blocks(exe, rounds, analyzer, out):
    env = dict(os.environ)
    if analyzer == "learn, no lab":
        env["SUPERPROF_TEST_NO_LAB"] = "1"
    args = [SUPERPROF, "blocks", "--engine", "ptrace", "--analyzer", analyzer.split(",")[0],
            "--format", "json", "-o", out]
    for r in REGIONS:
        args += ["-r", r]
    t0 = time.monotonic()
    subprocess.run(args + ["--", exe, str(rounds)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    secs = time.monotonic() - t0
    with open(out) as f:
        doc = json.load(f)
    execs = sum(b["count"] for b in doc["blocks"])
    a = doc.get("analyzer", {})
    return {"secs": secs, "execs": execs, "stops": doc["stops"],
            "steps": a.get("single_steps", 0), "training": a.get("training_steps", 0),
            "predictions": a.get("predictions", 0), "right": a.get("predictions_right"),
            "mispredicted": a.get("mispredicted", 0), "probed": a.get("probed", 0),
            "lab_runs": a.get("lab_runs", 0)}


def main():
    rounds = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "10,100,1000,4000").split(",")]
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "learn_o3")
        subprocess.run(["gcc", "-O3", "-g", "-o", exe,
                        os.path.join(ROOT, "tests/fixtures/learn_o3.c")], check=True)
        out = os.path.join(d, "b.json")
        print("| rounds | analyzer | block executions | stops | stops per execution | "
              "single steps in regions | training steps | probed in the lab (runs) | "
              "predictions (agree) | mispredicted | seconds |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        prev = {}
        marginal = []
        for n in rounds:
            for analyzer in ["decode", "learn", "learn, no lab"]:
                r = blocks(exe, n, analyzer, out)
                agree = "" if r["right"] is None else f" ({r['right']})"
                print(f"| {n} | {analyzer} | {r['execs']:,} | {r['stops']:,} | "
                      f"{r['stops'] / max(r['execs'], 1):.3f} | {r['steps']:,} | "
                      f"{r['training']:,} | {r['probed']:,} ({r['lab_runs']:,}) | "
                      f"{r['predictions']:,}{agree} | "
                      f"{r['mispredicted']} | {r['secs']:.2f} |")
                if analyzer in prev:
                    p = prev[analyzer]
                    de = r["execs"] - p["execs"]
                    if de > 0:
                        marginal.append((p["n"], n, analyzer, (r["stops"] - p["stops"]) / de,
                                         (r["steps"] - p["steps"]) / de))
                prev[analyzer] = dict(r, n=n)
        print()
        print("| rounds | analyzer | marginal stops per execution | marginal single steps per execution |")
        print("| --- | --- | --- | --- |")
        for a, b, analyzer, stops, steps in marginal:
            print(f"| {a} → {b} | {analyzer} | {stops:.3f} | {steps:.4f} |")


if __name__ == "__main__":
    main()
