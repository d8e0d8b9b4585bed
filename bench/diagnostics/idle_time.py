"""Where a high-priority service's idle GPU time goes, and what its requests wait for, from an
orion timeline export.

  orion_bench.py idle-time TRACE.json [TRACE.json ...] [--out ROWS.jsonl]
  orion_bench.py idle-time --table ROWS.jsonl

TRACE.json: `orion-ctl timeline --trace` of a window with one high-priority service that marks
each request with an NVTX range "request" and best-effort clients beside it (`orion_bench.py
priority --traces` exports one per orion run). Over the window from the service's first to its
last request, the time the service has no work on the GPU is split into
  be-running   best-effort kernels on the GPU (the harvest);
  be-held      no best-effort kernel on the GPU while a best-effort launch waits at the gate
               (held by the policy: grace after a request, budget reached);
  gpu-idle     neither: nothing queued and nobody held (the trainer's CPU between launches, its
               queue refilling after a release, the service's CPU before its next request).
The harvest efficiency is be-running over the service's idle time.

Per request, the wait from its NVTX push on the CPU to the start of its first GPU span, and
whether best-effort work was on the GPU when it arrived ("behind best effort"): the median
penalty a request pays. Spans are the timeline's: best-effort kernels are mostly placed from
their learned means (not measured) and a placed span is placed behind its own stream only, so
the split is as good as that placement; the trace says how much was measured.
"""
import argparse
import bisect
import json
import sys
from harness import markdown_table, quantile, read_rows
from diagnostics.request_trace import length, load, subtract, union

ANSWERS = ("where a service's idle GPU time goes (best effort running, held at the gate, GPU "
           "idle) and what its requests wait for, from a timeline export")


def held_spans(path):
    """[start, end) of every throttled (held at the gate) span of the trace."""
    with open(path) as f:
        trace = json.load(f)
    out = []
    for e in trace.get("traceEvents", []):
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") == "throttled":
            out.append([float(e["ts"]), float(e["ts"]) + float(e["dur"])])
    return union(out)


def analyse(path):
    requests, work = load(path)
    service = requests[0]["client"]
    lo = min(r["start_us"] for r in requests)
    hi = max(r["end_us"] for r in requests)

    def clip(merged):
        return [[max(s, lo), min(e, hi)] for s, e in merged if e > lo and s < hi]

    own = clip(union([w["start_us"], w["end_us"]] for w in work if w["client"] == service))
    be_work = [w for w in work if w["client"] != service]
    be = clip(union([w["start_us"], w["end_us"]] for w in be_work))
    held = clip(held_spans(path))
    idle = subtract([[lo, hi]], own)
    be_running = subtract(idle, subtract(idle, be))  # idle ∩ be
    not_running = subtract(idle, be)
    be_held = subtract(not_running, subtract(not_running, held))
    window, idle_us = hi - lo, length(idle)

    # Per request: from its push to its first own GPU span; behind best effort if a best-effort
    # span covered its push.
    own_starts = sorted(w["start_us"] for w in work if w["client"] == service)
    be_merged = union([w["start_us"], w["end_us"]] for w in be_work)
    be_ends = [e for _, e in be_merged]
    waits, behind = [], []
    for r in requests:
        i = bisect.bisect_left(own_starts, r["start_us"])
        if i == len(own_starts):
            continue
        wait = own_starts[i] - r["start_us"]
        j = bisect.bisect_right(be_ends, r["start_us"])
        covered = j < len(be_merged) and be_merged[j][0] <= r["start_us"]
        waits.append(wait)
        if covered:
            behind.append(wait)
    waits.sort()
    behind.sort()
    measured = sum(w["measured"] for w in be_work)
    return {
        "trace": path, "requests": len(requests), "window_ms": round(window / 1e3, 1),
        "service_busy": round(1 - idle_us / window, 3),
        "be_running": round(length(be_running) / window, 3),
        "be_held": round(length(be_held) / window, 3),
        "gpu_idle": round(length(not_running) / window - length(be_held) / window, 3),
        "harvest_efficiency": round(length(be_running) / idle_us, 3) if idle_us else None,
        "wait_p50_us": round(quantile(waits, 0.5), 1) if waits else None,
        "wait_p99_us": round(quantile(waits, 0.99), 1) if waits else None,
        "behind_be": round(len(behind) / len(waits), 3) if waits else None,
        "behind_be_wait_p50_us": round(quantile(behind, 0.5), 1) if behind else None,
        "behind_be_wait_p99_us": round(quantile(behind, 0.99), 1) if behind else None,
        "be_spans_measured": round(measured / len(be_work), 3) if be_work else None,
    }


COLUMNS = [("trace", "trace"), ("requests", "requests"), ("service_busy", "service busy"),
           ("be_running", "BE running"), ("be_held", "BE held"), ("gpu_idle", "GPU idle"),
           ("harvest_efficiency", "BE running / service idle"),
           ("wait_p50_us", "push to GPU p50 us"), ("wait_p99_us", "p99 us"),
           ("behind_be", "arrived behind BE"), ("behind_be_wait_p50_us", "those: p50 us"),
           ("behind_be_wait_p99_us", "p99 us"), ("be_spans_measured", "BE spans measured")]


def table(rows):
    return markdown_table([c[1] for c in COLUMNS],
                          [["-" if r.get(k) is None else r[k] for k, _ in COLUMNS] for r in rows])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="*")
    p.add_argument("--out", help="append one JSON row per trace")
    p.add_argument("--table", help="print the table of an --out file and exit")
    args = p.parse_args(argv)
    if args.table:
        print(table(read_rows(args.table, "idle-time")))
        return 0
    if not args.traces:
        p.error("name at least one TRACE.json (or --table ROWS.jsonl)")
    rows = [analyse(t) for t in args.traces]
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(table(rows))
    return 0
