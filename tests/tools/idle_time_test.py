#!/usr/bin/env python3
"""bench/orion_bench.py idle-time on a made-up timeline export with known shares: 100 requests
every 20 ms, each one 1 ms graph of the service; a trainer kernel of 12 ms in each gap (so 12 of
the 19 idle ms run best effort), the trainer held at the gate for 4 ms after each of them, and
3 ms of nothing. Ten requests arrive while a trainer kernel still runs and wait 2 ms for it.
The split, the harvest efficiency and the waits must come out as made; a trace without request
spans is refused with the file."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "orion_bench.py")
MS = 1000.0


def span(cat, name, client, ts_ms, dur_ms, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": client, "ts": ts_ms * MS,
            "dur": dur_ms * MS, "args": {"client": client, "measured": cat == "kernel", **args}}


def trace():
    events = []
    t0 = 1_700_000_000_000.0
    for i in range(100):
        t = t0 + 20 * i
        late = i % 10 == 0 and i > 0  # the trainer's kernel of the gap before runs 2 ms into it
        start = t + (2 if late else 0)
        events.append(span("graph", "forward", 1, start, 1))
        events.append(span("step", "request", 1, start, 1, cpu_start_us=t * MS,
                           cpu_dur_us=(start + 1 - t) * MS, depth=0))
        if i < 99:
            be_start = start + 1
            be_len = 12 if (i + 1) % 10 else (t + 22) - be_start  # runs 2 ms into the next
            events.append(span("kernel", "train_gemm", 2, be_start, be_len))
            if (i + 1) % 10:
                events.append(span("throttled", "held", 2, be_start + be_len, 4))
    return {"traceEvents": events}


def run(*argv):
    return subprocess.run([sys.executable, SCRIPT, "idle-time", *argv], capture_output=True,
                          text=True)


def main():
    work = tempfile.mkdtemp(prefix="idle-time-")
    path, out = os.path.join(work, "t.json"), os.path.join(work, "rows.jsonl")
    json.dump(trace(), open(path, "w"))
    r = run(path, "--out", out)
    assert r.returncode == 0, r.stderr
    row = [json.loads(line) for line in open(out)][0]
    assert row["requests"] == 100, row
    window = row["window_ms"]
    # The service's own graphs: 100 ms of the window; the window ends with the last request.
    assert abs(row["service_busy"] - 100 / window) < 2e-3, row
    # Shares of the window add up to one.
    total = row["service_busy"] + row["be_running"] + row["be_held"] + row["gpu_idle"]
    assert abs(total - 1) < 3e-3, row
    assert row["be_held"] > 0.15 and row["gpu_idle"] > 0.05, row
    assert 0.55 < row["harvest_efficiency"] < 0.75, row
    # 9 of the 99 later requests wait 2 ms behind a trainer kernel, the rest not at all.
    assert abs(row["behind_be"] - 0.09) < 0.011, row
    assert abs(row["behind_be_wait_p50_us"] - 2000) < 1, row
    assert row["wait_p50_us"] == 0, row
    r = run("--table", out)
    assert r.returncode == 0 and "t.json" in r.stdout and "arrived behind BE" in r.stdout, r
    json.dump({"traceEvents": [span("kernel", "conv", 1, 0, 1)]}, open(path, "w"))
    r = run(path)
    assert r.returncode != 0 and "no request spans" in r.stderr and path in r.stderr, r.stderr
    print("idle_time: ok")


if __name__ == "__main__":
    main()
