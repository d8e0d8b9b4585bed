#!/usr/bin/env python3
"""bench/orion_bench.py thread-cpu on a process whose threads do known things: one named "sleeper" wakes
every 10 ms (as a completion poller on a timer would) and two named "spinner" burn CPU on one
core. The reading must put the wake-ups on the sleeper (about 100 a second), the CPU on the
spinners, and about half a second a second of waiting for that core on each spinner,
the --json line must carry its --tag fields, --table must render them, and a malformed JSONL
line must be refused with its file and line."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "orion_bench.py")
EXPERIMENT = "thread-cpu"

# The spinner is a child process (thread_cpu.py reads descendants too), so that it does not
# hold the sleeper's interpreter lock and add wake-ups of its own.
WORKLOAD = r"""
import ctypes, os, subprocess, sys, threading, time
libc = ctypes.CDLL(None)
spin = "import ctypes\nctypes.CDLL(None).prctl(15, b'spinner', 0, 0, 0)\nwhile True: pass"
cpu = sorted(os.sched_getaffinity(0))[0]
children = [subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", spin]) for _ in range(2)]
def sleep():
    libc.prctl(15, b"sleeper", 0, 0, 0)  # PR_SET_NAME
    while True:
        time.sleep(0.01)
threading.Thread(target=sleep, daemon=True).start()
time.sleep(3600)
"""


def check(cond, message):
    if not cond:
        sys.exit(f"FAIL: {message}")


def main():
    work = tempfile.mkdtemp(prefix="thread-cpu-")
    out = subprocess.run([sys.executable, SCRIPT, EXPERIMENT, "--after", "0.5", "--window", "2", "--json",
                          "--tag", "job=double", "--tag", "arm=a", "--", sys.executable, "-c",
                          WORKLOAD], capture_output=True, text=True, timeout=60)
    check(out.returncode == 0, f"thread_cpu.py failed: {out.stderr}")
    run = json.loads(out.stdout)
    check(run["job"] == "double" and run["arm"] == "a", f"tags missing: {run}")
    rows = {r["name"]: r for r in run["threads"]}
    check("sleeper" in rows and "spinner" in rows, f"threads not found by name: {sorted(rows)}")
    sleeper, spinner = rows["sleeper"], rows["spinner"]
    # A 10 ms sleep loop: about 100 wake-ups a second (fewer when the host is loaded, never 5x).
    check(40 <= sleeper["wakes_per_s"] <= 110, f"sleeper wake-ups {sleeper['wakes_per_s']:.0f}/s")
    check(spinner["wakes_per_s"] < 20, f"spinner wake-ups {spinner['wakes_per_s']:.0f}/s")
    check(spinner["cpu_ms_per_s"] > 100, f"spinner CPU {spinner['cpu_ms_per_s']:.0f} ms/s")
    # Two spinners on one core: each runs about half the time and waits the other half.
    check(spinner["count"] == 2, f"spinners: {spinner}")
    check(spinner["run_queue_ms_per_s"] > 600, f"spinners waited {spinner['run_queue_ms_per_s']:.0f} "
          f"ms/s for their core (two on one core: about 1000)")
    check(sleeper["run_queue_ms_per_s"] < 200, f"sleeper waited {sleeper['run_queue_ms_per_s']:.0f} ms/s")
    check(sleeper["cpu_ms_per_s"] < spinner["cpu_ms_per_s"] / 4,
          f"sleeper CPU {sleeper['cpu_ms_per_s']:.1f} against spinner {spinner['cpu_ms_per_s']:.1f}")

    # Two rounds of arm b (one row, median [min, max]) and arm a's real run (one row).
    path = os.path.join(work, "runs.jsonl")
    with open(path, "w") as f:
        f.write(out.stdout.strip() + "\n")
        for rnd, (cpu, wakes) in enumerate(((1.5, 20.0), (2.5, 30.0)), 1):
            f.write(json.dumps({"job": "double", "arm": "b", "round": rnd, "wall_s": 1.0,
                                "threads": [{"name": "sleeper", "count": 1, "cpu_ms_per_s": cpu,
                                             "wakes_per_s": wakes, "preempted_per_s": 0.0},
                                            {"name": "main", "count": 1, "cpu_ms_per_s": 10.0,
                                             "wakes_per_s": 5.0, "preempted_per_s": 1.0}]})
                    + "\n")
    table = subprocess.run([sys.executable, SCRIPT, EXPERIMENT, "--table", path, "--threads", "sleeper,poller"],
                           capture_output=True, text=True, check=True).stdout
    lines = table.splitlines()
    check(lines[0].startswith("| job | arm | runs | sleeper CPU (ms per s) |"),
          f"table header: {lines[0]}")
    check(len(lines) == 4, f"one row per arm:\n{table}")
    # Arm b's rows carry no run-queue time (recorded before it was read): "-" there.
    check("| double | b | 2 | 2.0 [1.5, 2.5] | 25 [20, 30] | 0 [0, 0] | - | - | - | - | - | "
          "12.0 [11.5, 12.5] | 30 [25, 35] | 1 [1, 1] | - |" in lines,
          f"arm b's row (medians over its rounds, poller missing, all threads summed):\n{table}")

    with open(path, "a") as f:
        f.write("{not json\n")
    bad = subprocess.run([sys.executable, SCRIPT, EXPERIMENT, "--table", path], capture_output=True, text=True)
    check(bad.returncode != 0 and f"{path}:4" in bad.stderr,
          f"a malformed line must name file and line: {bad.stderr!r}")
    print("ok: wake-ups and CPU land on the thread that made them; tags, table and errors")


if __name__ == "__main__":
    main()
