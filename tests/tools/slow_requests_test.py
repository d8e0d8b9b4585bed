#!/usr/bin/env python3
"""bench/orion_bench.py slow-requests on made-up request logs whose slow requests have known causes: in one
run the slowest 1% by service time are slowed off the CPU (the serving thread preempted), in the
other on the GPU (a long sync). The summary must find each cause where it was put, its latency
and service time add up, and a malformed line must be refused with its file and line."""
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "orion_bench.py")
EXPERIMENT = "slow-requests"


def write(path, slow):
    rng = random.Random(3)
    with open(path, "w") as f:
        for i in range(1000):
            launch, sync, cpu, nivcsw = 4.0 + rng.random() * 0.2, 0.3, 0.0, 0
            if i % 100 == 50:  # ten slow requests
                if slow == "cpu":
                    launch += 20.0  # off the CPU: thread CPU stays at the work's own
                    nivcsw = 40
                else:
                    sync += 20.0
            cpu = 4.0 + 0.3  # launch work plus spinning in sync, without the slowdown
            if slow == "gpu" and i % 100 == 50:
                cpu += 20.0  # the sync spins on the CPU
            f.write(json.dumps({"t_ms": i * 10.0, "queue_ms": 0.5, "launch_ms": launch,
                                "sync_ms": sync, "thread_cpu_ms": cpu, "nivcsw": nivcsw,
                                "process_cpu_ms": cpu + 0.1}) + "\n")


def main():
    work = tempfile.mkdtemp(prefix="slow-requests-")
    write(os.path.join(work, "requests-orion-mps-resnet50-r0.jsonl"), "cpu")
    write(os.path.join(work, "requests-mps-cap-resnet50-r0.jsonl"), "gpu")
    out = os.path.join(work, "summary.jsonl")
    r = subprocess.run([sys.executable, SCRIPT, EXPERIMENT, "--out", out, work], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    rows = {row["config"]: row for row in map(json.loads, open(out))}
    assert set(rows) == {"orion-mps", "mps-cap"}, rows.keys()
    cpu, gpu = rows["orion-mps"]["slow_service"], rows["mps-cap"]["slow_service"]
    assert rows["orion-mps"]["slowest"] == 10
    assert cpu["off_cpu_ms"] > 19 and cpu["nivcsw"] == 40 and cpu["sync_ms"] < 1, cpu
    assert gpu["sync_ms"] > 19 and gpu["off_cpu_ms"] < 1 and gpu["nivcsw"] == 0, gpu
    for row in rows.values():
        for which in ("all", "slow_latency", "slow_service"):
            s = row[which]
            assert abs(s["latency_ms"] - (s["queue_ms"] + s["launch_ms"] + s["sync_ms"])) < 0.01
    table = subprocess.run([sys.executable, SCRIPT, EXPERIMENT, "--table", out], capture_output=True,
                           text=True, check=True).stdout
    assert table.count("\n") == 2 + 2, table
    line = next(l for l in table.splitlines() if l.startswith("| orion-mps |"))
    assert line.endswith("| 20.09 [20.09, 20.09] |"), line  # the slowest were off the CPU
    detail = subprocess.run([sys.executable, SCRIPT, EXPERIMENT, work], capture_output=True, text=True,
                            check=True).stdout
    assert "slowest 10 by service time" in detail, detail
    bad = os.path.join(work, "bad")
    os.makedirs(bad)
    with open(os.path.join(bad, "requests-orion-resnet50-r1.jsonl"), "w") as f:
        f.write('{"queue_ms": 1}\n')
    r = subprocess.run([sys.executable, SCRIPT, EXPERIMENT, bad], capture_output=True, text=True)
    assert r.returncode != 0 and "requests-orion-resnet50-r1.jsonl:1:" in r.stderr, r.stderr
    print("ok")


if __name__ == "__main__":
    main()
