#!/usr/bin/env python3
"""bench/orion_bench.py request-trace on a made-up timeline export whose one slow request has a known cause:
100 requests of 5 ms (three 1 ms kernels of the service, 2 ms with nothing on the GPU), the
trainer's kernels between them, and one request that waited 8 ms behind a trainer kernel before
its own. The slowest request must be that one, split into its own 3 ms, the others' 8 ms
(naming the kernel) and 0.5 ms idle; time held at the gate is not GPU work; a trace without
request spans, or with a request span missing its CPU range, is refused with the file and the
event."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "orion_bench.py")
EXPERIMENT = "request-trace"
MS = 1000.0  # the trace's unit is the microsecond


def span(cat, name, client, ts_ms, dur_ms, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": client, "ts": ts_ms * MS,
            "dur": dur_ms * MS, "args": {"client": client, "measured": False, **args}}


def trace():
    events = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    t0 = 1_700_000_000_000.0  # ms, as a wall clock
    for i in range(100):
        t = t0 + 20 * i
        if i == 42:  # 8 ms behind a trainer kernel, then its own three
            events.append(span("kernel", "big_sgemm", 2, t, 8))
            own = [t + 8, t + 9, t + 10]
            cpu_dur = 11.5
        else:
            own = [t + 0.5, t + 2, t + 3.5]
            cpu_dur = 5
        events += [span("kernel", "conv", 1, k, 1) for k in own]
        events.append(span("step", "request", 1, own[0], own[-1] + 1 - own[0],
                           cpu_start_us=t * MS, cpu_dur_us=cpu_dur * MS, depth=0))
        events.append(span("kernel", "train_gemm", 2, t + 12, 6))
        if i == 10:  # the trainer held at the gate during a request: not GPU work
            events.append(span("throttled", "held", 2, t, 5))
    return {"traceEvents": events}


def run(*argv):
    return subprocess.run([sys.executable, SCRIPT, EXPERIMENT, *argv], capture_output=True, text=True)


def main():
    work = tempfile.mkdtemp(prefix="request-trace-")
    path, out = os.path.join(work, "t.json"), os.path.join(work, "slow.jsonl")
    json.dump(trace(), open(path, "w"))
    summary = os.path.join(work, "summary.jsonl")
    r = run(path, "--slowest", "0.02", "--out", out, "--summary", summary)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in open(out)]
    assert len(rows) == 2, rows
    slow, next_ = rows
    assert abs(slow["wall_ms"] - 11.5) < 1e-6, slow
    assert abs(slow["own_ms"] - 3.0) < 1e-6 and abs(slow["others_ms"] - 8.0) < 1e-6, slow
    assert abs(slow["idle_ms"] - 0.5) < 1e-6, slow
    assert slow["top_others"][0] == ["big_sgemm (client 2)", 8.0], slow
    # Every other request: 5 ms, 3 of them its own kernels, 2 with nothing on the GPU (the held
    # trainer of request 10 included).
    assert abs(next_["wall_ms"] - 5.0) < 1e-6 and abs(next_["idle_ms"] - 2.0) < 1e-6, next_
    assert next_["others_ms"] == 0 and next_["top_others"] == [], next_
    assert "| all | 100 | 5.07 | 3.00 | 0.08 | 1.99 |" in r.stdout, r.stdout
    # One summary row per trace, and its table: all requests, then the slowest 2% (two).
    r = run("--table", summary)
    assert r.returncode == 0, r.stderr
    assert "| t.json | 100 | 5.07 / 3.00 / 0.08 / 1.99 | 2 | 8.25 / 3.00 / 4.00 / 1.25 |" \
        in r.stdout, r.stdout
    # Bad input: refused with what and where.
    json.dump({"traceEvents": [span("kernel", "conv", 1, 0, 1)]}, open(path, "w"))
    r = run(path)
    assert r.returncode != 0 and "no request spans" in r.stderr and path in r.stderr, r.stderr
    bad = trace()
    del bad["traceEvents"][4]["args"]["cpu_start_us"]  # the first request span
    json.dump(bad, open(path, "w"))
    r = run(path)
    assert r.returncode != 0 and "traceEvents[4]" in r.stderr and "cpu_start_us" in r.stderr, \
        r.stderr
    print("request_trace: ok")


if __name__ == "__main__":
    main()
