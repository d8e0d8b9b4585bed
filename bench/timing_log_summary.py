#!/usr/bin/env python3
"""Summarises the GPU timing diagnostic (ORION_TIMING_LOG=DIR, interpose/timing_log.h).

  bench/timing_log_summary.py DIR_OR_FILES... [--json] [--check]

For each process's timing.<pid>.log: how many timed launches were clamped to start at the launch
call's return (their stream was idle, the start event ran before the kernel was handed over),
what the clamp took off them (the GPU's own elapsed time minus the reported duration), how
early the start event was placed before the call's return, and how the anchors that place GPU
times on the host clock moved at each renewal (where the chain from the previous anchor put the
new one, against where it was placed, and against the midpoint of its record and first seen
times). An eager service whose busy seconds come out short shows here whether its samples were
cut by the clamp, and by how much. --check exits 1 where a line breaks the log's own rules
(a duration longer than the GPU's elapsed time beyond 2 us, an unclamped sample that differs
from it beyond 2 us), which is what CI checks on the CUDA test double.
"""
import argparse
import glob
import json
import os
import statistics
import sys

SLACK_NS = 2000  # float milliseconds from cuEventElapsedTime and rounding in the placement


def read(path):
    samples, anchors, bad = [], [], []
    with open(path) as f:
        header = f.readline()
        if not header.startswith("# orion-timing-log 1 "):
            bad.append(f"{path}: header {header.strip()!r}")
        for n, line in enumerate(f, 2):
            parts = line.rstrip("\n").split("\t")
            try:
                if parts[0] == "sample" and len(parts) == 9:
                    s = {"func": parts[1]}
                    (s["elapsed"], s["start"], s["end"], s["launched"], s["dur"], s["clamped"],
                     s["warmup"]) = map(int, parts[2:])
                    samples.append(s)
                elif parts[0] == "anchor" and len(parts) == 6:
                    a = {"ctx": parts[1]}
                    a["recorded"], a["seen"], a["chained"], a["host"] = map(int, parts[2:])
                    anchors.append(a)
                else:
                    bad.append(f"{path}:{n}: {line.strip()!r}")
            except ValueError:
                bad.append(f"{path}:{n}: {line.strip()!r}")
    for s in samples:
        if s["start"] == 0:
            continue  # not placed on the host clock: the GPU's elapsed time was reported
        if s["dur"] > s["elapsed"] + SLACK_NS:
            bad.append(f"{path}: a sample's duration {s['dur']} exceeds its GPU time {s['elapsed']}")
        if not s["clamped"] and abs(s["dur"] - s["elapsed"]) > SLACK_NS:
            bad.append(f"{path}: an unclamped sample's duration {s['dur']} is not its GPU time "
                       f"{s['elapsed']}")
        if s["clamped"] != (s["start"] < s["launched"]):
            bad.append(f"{path}: clamped={s['clamped']} but start {s['start']} vs launched "
                       f"{s['launched']}")
    return samples, anchors, bad


def med(values):
    return statistics.median(values) if values else None


def summarise(path, samples, anchors):
    placed = [s for s in samples if s["start"] != 0]
    clamped = [s for s in placed if s["clamped"]]
    chained = [a for a in anchors if a["chained"]]
    polled = [a for a in anchors if a["seen"]]
    return {
        "file": os.path.basename(path),
        "samples": len(samples),
        "placed": len(placed),
        "clamped": len(clamped),
        "clamped_fraction": len(clamped) / len(placed) if placed else None,
        "gpu_ns_sum": sum(s["elapsed"] for s in placed),
        "reported_ns_sum": sum(s["dur"] for s in placed),
        "clamp_cut_ns_median": med([s["elapsed"] - s["dur"] for s in clamped]),
        "start_before_return_ns_median": med([s["launched"] - s["start"] for s in clamped]),
        "anchors": len(anchors),
        "anchors_polled": len(polled),
        # Positive: the placement moved the new anchor later than the chain from the previous one.
        "anchor_host_minus_chained_ns_median": med([a["host"] - a["chained"] for a in chained]),
        "anchor_midpoint_minus_chained_ns": [
            a["recorded"] + (a["seen"] - a["recorded"]) // 2 - a["chained"]
            for a in chained if a["seen"]][:50],
    }


def fmt(v, scale=1.0, digits=2):
    return "-" if v is None else f"{v / scale:.{digits}f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", help="folders (their timing.*.log) or files")
    p.add_argument("--json", action="store_true", help="one JSON line per file")
    p.add_argument("--check", action="store_true", help="exit 1 on a line that breaks the rules")
    args = p.parse_args()
    files = []
    for path in args.paths:
        files += sorted(glob.glob(os.path.join(path, "timing.*.log"))) if os.path.isdir(path) \
            else [path]
    if not files:
        sys.exit("timing_log_summary: no timing.*.log found")
    problems = []
    rows = []
    for path in files:
        samples, anchors, bad = read(path)
        problems += bad
        rows.append(summarise(path, samples, anchors))
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print("| file | timed launches | clamped | GPU time / reported (ms) | clamp cut (median us) "
              "| start event before the call's return (median us) | anchors (polled) "
              "| anchor placed minus chained (median us) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['file']} | {r['samples']} | {r['clamped']} "
                  f"({fmt(r['clamped_fraction'], 0.01, 0)}%) | "
                  f"{fmt(r['gpu_ns_sum'], 1e6, 3)} / {fmt(r['reported_ns_sum'], 1e6, 3)} | "
                  f"{fmt(r['clamp_cut_ns_median'], 1e3)} | "
                  f"{fmt(r['start_before_return_ns_median'], 1e3)} | "
                  f"{r['anchors']} ({r['anchors_polled']}) | "
                  f"{fmt(r['anchor_host_minus_chained_ns_median'], 1e3)} |")
    for line in problems[:20]:
        print("problem:", line, file=sys.stderr)
    if args.check and problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
