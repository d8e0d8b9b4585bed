"""What the GPU did during a service's slowest requests, from an orion timeline export.

  orion_bench.py request-trace TRACE.json [TRACE.json ...] [--slowest 0.01] [--out ROWS.jsonl]
      [--summary SUMMARY.jsonl]
  orion_bench.py request-trace --table SUMMARY.jsonl    (one line per trace, from --summary)

TRACE.json: `orion-ctl timeline --trace` of a window in which the high-priority service marks
each request with an NVTX range "request" (`torch_models.py serve --nvtx`, `orion-sample-infer
--nvtx`). A request lasts from its push to its pop on the CPU (cpu_start_us, cpu_dur_us of its
span on the service's steps row), or to the end of its last kernel if that is later. Its time is
split into
  own      the service's own GPU work (kernels, graphs, copies) running;
  others   other clients' GPU work running while none of the service's does: what ran on the
           GPU before (or between) the request's kernels;
  idle     nothing on the GPU: the request was on the CPU (an eager model launching), or
           waiting for the GPU to notice it;
and the other clients' work overlapping it is named. Kernel spans are the timeline's: measured
on the GPU for a sample of launches (1 in 64), placed from the learned means for the rest (the
per-window busy seconds are within 5% of the profiler's, round 11). A placed span starts at its
launch or at the end of its own stream's work, not behind another process's kernel: a wait
behind another client shows as idle where the service's kernels were placed, not measured. Each
slow request says how many of its spans were measured.

Prints, per trace, all requests and the slowest --slowest fraction (means), then one line per
slow request; --out writes one JSON row per slow request, --summary one row per trace (the
means of all its requests and of the slowest).
"""
import argparse
import bisect
import json
import os
import statistics
import sys
from harness import read_rows

ANSWERS = ("what ran on the GPU during a service's slowest requests (its own work, other "
           "clients' work, idle), from a timeline export")

GPU_WORK = ("kernel", "graph", "memcpy", "memset")


def union(intervals):
    """Sorted, merged copy of [start, end) intervals."""
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


class Spans:
    """One client's (or several clients') GPU work on one GPU, sorted by start: the spans
    overlapping a window, and the time they cover in it, in O(log n + hits)."""

    def __init__(self, work):
        self.spans = sorted(work, key=lambda w: w["start_us"])
        self.starts = [w["start_us"] for w in self.spans]
        self.longest = max((w["end_us"] - w["start_us"] for w in self.spans), default=0.0)
        self.merged = union([w["start_us"], w["end_us"]] for w in self.spans)
        self.merged_ends = [e for _, e in self.merged]

    def overlapping(self, lo, hi):
        for w in self.spans[bisect.bisect_left(self.starts, lo - self.longest):]:
            if w["start_us"] >= hi:
                break
            if w["end_us"] > lo:
                yield w

    def covered(self, lo, hi):
        """The merged intervals of the spans, clipped to [lo, hi)."""
        out = []
        for s, e in self.merged[bisect.bisect_right(self.merged_ends, lo):]:
            if s >= hi:
                break
            out.append([max(s, lo), min(e, hi)])
        return out


def length(merged):
    return sum(e - s for s, e in merged)


def subtract(a, b):
    """a minus b, both merged interval lists."""
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append([cur, b[k][0]])
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append([cur, e])
    return out


def load(path):
    """(requests, gpu work) of a trace; exits with the file and the event's index on bad input."""
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"{path}: not a readable JSON trace ({e})")
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        sys.exit(f"{path}: no traceEvents list (expected orion-ctl timeline --trace output)")
    requests, work = [], []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, args = e.get("cat"), e.get("args") or {}
        try:
            if cat == "step" and e.get("name") == "request":
                start = float(args["cpu_start_us"])
                cpu_end = start + float(args["cpu_dur_us"])
                gpu_end = float(e["ts"]) + float(e["dur"])
                requests.append({"pid": e["pid"], "client": int(args["client"]),
                                 "start_us": start, "end_us": max(cpu_end, gpu_end),
                                 "cpu_ms": (cpu_end - start) / 1e3})
            elif cat in GPU_WORK:
                ts = float(e["ts"])
                work.append({"pid": e["pid"], "client": int(args["client"]), "name": e["name"],
                             "start_us": ts, "end_us": ts + float(e["dur"]),
                             "measured": bool(args.get("measured"))})
        except (KeyError, TypeError, ValueError) as err:
            sys.exit(f"{path}: traceEvents[{i}] ({cat} span): missing or bad field {err}")
    if not requests:
        sys.exit(f"{path}: no request spans (run the service with --nvtx: an NVTX range "
                 "\"request\" per request)")
    return requests, work


def split(requests, work):
    """Each request with its own / others / idle milliseconds and the others' top kernels."""
    by_gpu = {}
    for w in work:
        by_gpu.setdefault(w["pid"], []).append(w)
    views = {}
    for r in requests:
        key = (r["pid"], r["client"])
        if key not in views:
            on_gpu = by_gpu.get(r["pid"], [])
            views[key] = (Spans(w for w in on_gpu if w["client"] == r["client"]),
                          Spans(w for w in on_gpu if w["client"] != r["client"]))
        own, others = views[key]
        lo, hi = r["start_us"], r["end_us"]
        mine = list(own.overlapping(lo, hi))
        own_in = own.covered(lo, hi)
        others_in = others.covered(lo, hi)
        busy = union(own_in + others_in)
        top = {}
        for w in others.overlapping(lo, hi):
            name = f"{w['name']} (client {w['client']})"
            top[name] = top.get(name, 0.0) + min(w["end_us"], hi) - max(w["start_us"], lo)
        r.update(kernels=len(mine), measured=sum(1 for w in mine if w["measured"]),
                 wall_ms=(hi - lo) / 1e3, own_ms=length(own_in) / 1e3,
                 others_ms=length(subtract(others_in, own_in)) / 1e3,
                 idle_ms=(hi - lo - length(busy)) / 1e3,
                 top_others=[[n, round(us / 1e3, 3)] for n, us in
                             sorted(top.items(), key=lambda kv: -kv[1])[:3]])
    return requests


PARTS = ("wall_ms", "own_ms", "others_ms", "idle_ms")


def report(path, requests, fraction):
    """The trace's text report, its slow requests, and its summary row (--summary): the means
    of all its requests and of the slow ones."""
    rows = sorted(requests, key=lambda r: -r["wall_ms"])
    slow = rows[:max(1, int(len(rows) * fraction + 0.5))]
    means = {group: {k: statistics.fmean(r[k] for r in rs) for k in PARTS}
             for group, rs in (("all", rows), ("slow", slow))}
    lines = [f"{path}: {len(rows)} requests", "",
             "| requests | n | wall (ms) | own GPU work (ms) | others' GPU work (ms) | "
             "GPU idle (ms) |", "|---|---|---|---|---|---|"]
    for label, group, rs in (("all", "all", rows), (f"slowest {fraction:.0%}", "slow", slow)):
        lines.append(f"| {label} | {len(rs)} | " +
                     " | ".join(f"{means[group][k]:.2f}" for k in PARTS) + " |")
    lines += ["", "| slow request at (us) | wall (ms) | own | others | idle | its GPU work "
              "measured | others' work overlapping it, most first (ms) |",
              "|---|---|---|---|---|---|---|"]
    for r in slow:
        names = "; ".join(f"{n}: {ms}" for n, ms in r["top_others"]) or "-"
        lines.append(f"| {r['start_us']:.0f} | {r['wall_ms']:.2f} | {r['own_ms']:.2f} | "
                     f"{r['others_ms']:.2f} | {r['idle_ms']:.2f} | {r['measured']} of "
                     f"{r['kernels']} | {names} |")
    summary = {"trace": os.path.basename(path), "requests": len(rows), "slowest": len(slow),
               **{group: {k: round(v, 3) for k, v in m.items()} for group, m in means.items()}}
    return "\n".join(lines) + "\n", slow, summary


def table(path):
    rows = read_rows(path, "request-trace")
    lines = ["| trace | requests | all: wall / own / others / idle (ms) | slowest | slowest: "
             "wall / own / others / idle (ms) |", "|---|---|---|---|---|"]
    for r in rows:
        cells = [" / ".join(f"{r[g][k]:.2f}" for k in PARTS) for g in ("all", "slow")]
        lines.append(f"| {r['trace']} | {r['requests']} | {cells[0]} | {r['slowest']} | "
                     f"{cells[1]} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="*")
    p.add_argument("--slowest", type=float, default=0.01,
                   help="the fraction of requests, slowest first, to take apart (0.01)")
    p.add_argument("--out", help="one JSON row per slow request")
    p.add_argument("--summary", help="one JSON row per trace (means of all and of the slowest)")
    p.add_argument("--table", help="print the table of a --summary file and exit")
    a = p.parse_args(argv)
    if a.table:
        print(table(a.table))
        return
    if not a.traces:
        p.error("no trace given")
    if not 0 < a.slowest <= 1:
        p.error("--slowest wants a fraction in (0, 1]")
    out = open(a.out, "w") if a.out else None
    sums = open(a.summary, "w") if a.summary else None
    for path in a.traces:
        text, slow, summary = report(path, split(*load(path)), a.slowest)
        print(text)
        if sums:
            sums.write(json.dumps(summary) + "\n")
        for r in slow if out else ():
            out.write(json.dumps({"trace": os.path.basename(path), **{k: r[k] for k in (
                "client", "start_us", "wall_ms", "cpu_ms", "own_ms", "others_ms", "idle_ms",
                "kernels", "measured", "top_others")}}) + "\n")
    for f in (out, sums):
        if f:
            f.close()
