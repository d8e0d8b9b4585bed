#!/usr/bin/env python3
"""launch-cost's tables of one invocation's rows: with --split arms, each part's cost is the
high-priority arm less that arm in the same run (median over runs, the runs paired, not the
medians subtracted); with --baseline-interposer, this build less the baseline alike; a
--fixed-layout arm is listed with the others. An unknown
--split name exits naming the known ones, before any GPU work."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY = os.path.join(ROOT, "bench", "orion_bench.py")


def check(ok, msg):
    if not ok:
        print("FAIL:", msg)
        sys.exit(1)


def paired(run, arm, adds, **extra):
    return {"run": run, "arm": arm, "variant": "paired", "cpus": "2", "adds_ns": adds,
            "driver_ns": 4000.0, "ci_low": adds - 30, "ci_high": adds + 30, "pairs": 300,
            "pollute_kb": 0, "kernels": 128, **extra}


def main():
    rows = []
    # Run 2's host is 100 ns slower on every interposed arm: paired by run, the parts do not move.
    for run, drift in ((1, 0), (2, 100), (3, 0)):
        rows += [paired(run, "no interposer", 5),
                 paired(run, "high priority", 200 + drift),
                 paired(run, "best effort", 190 + drift),
                 paired(run, "high priority, baseline", 230 + drift),
                 paired(run, "high priority, launches cut short after the registration",
                        60 + drift, switch="after-registration"),
                 paired(run, "high priority, no clock read (the thread's first reading kept)",
                        150 + drift + run, switch="no-clock"),
                 paired(run, "high priority, fixed layout", 170 + run)]
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "rows.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        r = subprocess.run([sys.executable, ENTRY, "launch-cost", "--table", path],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"--table exit {r.returncode}: {r.stderr}")
        lines = r.stdout.splitlines()

        def row(first, heading):
            block = r.stdout.split(heading, 1)
            check(len(block) == 2, f"no table headed {heading!r}:\n{r.stdout}")
            hit = [l for l in block[1].splitlines() if l.startswith(f"| {first} |")]
            check(hit, f"no row {first!r} under {heading!r}:\n{r.stdout}")
            return hit[0]

        split = "high priority less this arm, same run"
        check("140 ns [140, 140]" in row("launches cut short after the registration", split),
              f"after the registration: 200 - 60 in every run:\n{r.stdout}")
        check("48 ns [47, 49]" in row("no clock read (the thread's first reading kept)", split),
              f"the clock: 50 less the run's number, median 48:\n{r.stdout}")
        check("-30 ns [-30, -30]" in row("high priority", "this build less the baseline"),
              f"against the baseline: 200 - 230 in every run:\n{r.stdout}")
        check(any(l.startswith("| high priority, no clock read") for l in lines),
              f"the split arms' own additions are listed:\n{r.stdout}")
        check("172 ns [171, 173]" in row("high priority, fixed layout", "interposer adds"),
              f"the fixed-layout arm is listed with its runs' spread:\n{r.stdout}")

    bad = subprocess.run([sys.executable, ENTRY, "launch-cost", "--bundle", "/nonexistent",
                          "--split", "after-registration,no-such-part"],
                         capture_output=True, text=True)
    check(bad.returncode != 0 and "'no-such-part'" in bad.stderr and "after-registration"
          in bad.stderr and "no-clock" in bad.stderr,
          f"an unknown --split name must be refused naming the known ones: {bad.stderr!r}")
    print("ok")


if __name__ == "__main__":
    main()
