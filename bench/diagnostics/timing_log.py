"""Summarises the GPU timing diagnostic (ORION_TIMING_LOG=DIR, interpose/timing_log.h).

  orion_bench.py timing-log DIR_OR_FILES... [--json] [--check] [--profile SUMMARY.kernels.json[.gz|.xz]]
  orion_bench.py timing-log DIR_OR_FILES... --split-by-call US [--json]
  orion_bench.py timing-log DIR_OR_FILES... --profile F --replay-weights W,W,...
      [--replay-out ROWS.jsonl --label WINDOW]
  orion_bench.py timing-log DIR_OR_FILES... --profile F (--split-by-name P,P | --held-by-class NS,NS)
      [--json --label WINDOW]
  orion_bench.py timing-log --table ROWS.jsonl [--split-by-call US]   (re-renders rows)

For each process's timing.<pid>.log: how many timed launches were taken to run on an idle
stream (the start event ran before the kernel was handed over; the log's "clamped" column),
what that took off them (the GPU's own elapsed time minus the reported duration: the host time
from the start event's record to the call's return, and the kernel's start latency), how
early the start event was placed before the call's return, and how the anchors that place GPU
times on the host clock moved at each renewal (where the chain from the previous anchor put the
new one, against where it was placed, and against the midpoint of its record and first seen
times). An eager service whose busy seconds come out short shows here whether its samples were
cut short, and by how much. --check exits 1 where a line breaks the log's own rules
(a duration longer than the GPU's elapsed time beyond 2 us, a queued-stream sample that differs
from it less the queued start latency in the log's header beyond 2 us, a launch time before its
start event's record), which is what CI checks on the CUDA test double.

--profile takes the kernels a torch.profiler window recorded in the same process
(bench/workloads/torch_models.py --profile-out F writes them to F.kernels.json) and matches each timed
launch of the window to the profiler's kernel (the launch call's return against the runtime
call's end, the clocks aligned by the matches themselves, the grid and block equal). For the
matched samples it prints the profiler's own kernel time against what each way of reading the
events gives: the reported duration, the GPU's elapsed time between the events, and that elapsed
time less the host time between the start event's record and the launch call's return; and,
per sample, where the kernel really started against the call's return, and how far the anchors
placed the end event from the profiler's kernel end. That tells an anchor error from a wrong
model of an idle stream.
"""
import argparse
import bisect
import collections
import glob
import gzip
import json
import lzma
import os
import re
import statistics
import sys

import harness

ANSWERS = ("what the GPU timing diagnostic (ORION_TIMING_LOG) recorded, per process; matched "
           "to torch.profiler's kernels with --profile; --check holds each line to the log's rules")

SLACK_NS = 2000  # float milliseconds from cuEventElapsedTime and rounding in the placement
IDLE_MARGIN_NS = 20000  # interpose/sample_timing.h kIdleMarginNs
MIN_MATCHED = 20  # samples matched to a profiler window for it to be this process's


def open_text(path):
    """A log or a profile, plain or kept compressed in docs/data (.gz, .xz)."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt")
    return lzma.open(path, "rt") if path.endswith(".xz") else open(path)


def read(path):
    samples, anchors, bad = [], [], []
    with open_text(path) as f:
        header = f.readline()
        if not header.startswith(("# orion-timing-log 1 ", "# orion-timing-log 2 ")):
            bad.append(f"{path}: header {header.strip()!r}")
        # The queued start latency the samples were reported with (logs before it: none).
        fields = dict(f.split("=", 1) for f in header.split() if "=" in f)
        queued_start = int(fields.get("queued_start_ns", 0))
        held_start = int(fields.get("held_start_ns", queued_start))
        held_compute_start = int(fields.get("held_compute_start_ns", held_start))
        for n, line in enumerate(f, 2):
            parts = line.rstrip("\n").split("\t")
            try:
                if parts[0] == "sample" and len(parts) in (9, 12, 13, 14, 15):
                    s = {"func": parts[1]}
                    (s["elapsed"], s["start"], s["end"], s["launched"], s["dur"], s["clamped"],
                     s["warmup"]) = map(int, parts[2:9])
                    long = len(parts) >= 12
                    s["recorded"] = int(parts[9]) if long else 0
                    s["grid"] = tuple(map(int, parts[10].split(","))) if long else None
                    s["block"] = tuple(map(int, parts[11].split(","))) if long else None
                    s["contended"] = int(parts[12]) if len(parts) >= 13 else 0
                    s["held"] = int(parts[13]) if len(parts) >= 14 else 0
                    # The interposer's word on the kernel's class (None: a log before it)
                    s["compute"] = int(parts[14]) if len(parts) >= 15 else None
                    s["held_start"] = held_start
                    samples.append(s)
                elif parts[0] == "anchor" and len(parts) in (6, 7):
                    a = {"ctx": parts[1]}
                    a["recorded"], a["seen"], a["chained"], a["host"] = map(int, parts[2:6])
                    a["rate_ppm"] = float(parts[6]) if len(parts) == 7 else None
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
        latency = (queued_start if not s["held"] else
                   held_compute_start if s["compute"] else held_start)
        if not s["clamped"] and abs(s["dur"] - max(0, s["elapsed"] - latency)) > SLACK_NS:
            bad.append(f"{path}: a queued-stream sample's duration {s['dur']} is not its GPU time "
                       f"{s['elapsed']} less the {'held' if s['held'] else 'queued'} start "
                       f"latency {latency}")
        if s["recorded"] and s["launched"] < s["recorded"]:
            # The launch returns after its start event was recorded; a launch time taken before
            # the record would leave the driver's handover in the kernel's duration.
            bad.append(f"{path}: launched {s['launched']} before its start event was recorded "
                       f"({s['recorded']})")
        if s["held"] and s["clamped"]:
            bad.append(f"{path}: a sample held on its stream was taken as an idle-stream one")
        if not s["held"] and s["clamped"] != (s["start"] < s["launched"] + IDLE_MARGIN_NS):
            bad.append(f"{path}: idle={s['clamped']} but start {s['start']} vs launched "
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
        # The host clock's rate against the GPU's as learned at the last renewal (ppm from 1).
        "rate_ppm_last": next((a["rate_ppm"] for a in reversed(anchors)
                               if a.get("rate_ppm") is not None), None),
        "anchor_midpoint_minus_chained_ns": [
            a["recorded"] + (a["seen"] - a["recorded"]) // 2 - a["chained"]
            for a in chained if a["seen"]][:50],
    }


def match_profile(samples, prof, other_offsets=()):
    """The samples launched inside the profiler's window, each with the profiler's kernel for
    it: ([(sample, start_ns, end_ns, kernel)] on the host clock (CLOCK_MONOTONIC), the offset
    in us from the profiler's clock to the host's)."""
    # ts, dur, grid x3, block x3, correlation[, name]
    kernels = {k[8]: k for k in prof["kernels"]}
    calls = sorted((c[0] + c[1], kernels[c[2]]) for c in prof["launches"] if c[2] in kernels)
    ends = [c[0] for c in calls]
    if not ends:
        return [], None
    lo, hi = ends[0] - 100, ends[-1] + 100
    off = prof["mono_offset_us"]  # host-clock us minus profiler us, from the NVTX pushes

    def alike(t, s, tol_us):
        """The launch calls of the sample's grid and block ending within tol_us of t."""
        for i in range(bisect.bisect_left(ends, t - tol_us), bisect.bisect_right(ends, t + tol_us)):
            k = calls[i][1]
            if tuple(k[2:5]) == s["grid"] and tuple(k[5:8]) == s["block"]:
                yield ends[i], k

    def nearest(s, off, tol_us):
        t = s["launched"] / 1e3 - off
        best = None
        for end, k in alike(t, s, tol_us):
            if best is None or abs(end - t) < abs(best[0] - t):
                best = (end, k)
        return best, t

    # The pushes place the window within a few hundred us, or, for a service whose profiler
    # steps begin before their requests arrive, some ms: a coarse match moves the offset so that
    # the launch calls' ends meet the calls' returns, then a close one keeps the matches; the
    # coarse tolerance that keeps the most wins.
    def matches(o):
        out = []
        for s in samples:
            if s["grid"] and lo - 50_000 <= s["launched"] / 1e3 - o <= hi + 50_000:
                best, _ = nearest(s, o, 3)
                if best:
                    k = best[1]
                    out.append((s, int((k[0] + o) * 1e3), int((k[0] + k[1] + o) * 1e3), k))
        return out

    best_out, best_off = [], None
    for o in other_offsets:  # another process's window: one host clock, one profiler clock
        out = matches(o)
        if len(out) > len(best_out):
            best_out, best_off = out, o
    for tol_us in (300, 3_000, 30_000):
        # Every launch of the same grid and block within the tolerance votes for an offset (in
        # 20 us bins): the true one gathers a vote from nearly every sample, the others scatter.
        votes = collections.Counter()
        for s in samples:
            t = s["launched"] / 1e3 - off
            if not s["grid"] or not lo - tol_us <= t <= hi + tol_us:
                continue
            for end, _ in alike(t, s, tol_us):
                votes[round((end - t) / 20)] += 1
        candidates = [off - b * 20 for b, _ in votes.most_common(3)]
        # and the median of each sample's nearest launch (right where the pushes are close)
        deltas = [b[0] - t for b, t in (nearest(s, off, tol_us) for s in samples
                                        if s["grid"] and lo <= s["launched"] / 1e3 - off <= hi) if b]
        if deltas:
            candidates.append(off - statistics.median(deltas))
        for o in candidates:
            out = matches(o)
            if len(out) > len(best_out):
                best_out, best_off = out, o
    return best_out, best_off


def compare_profile(matched):
    """Sums and medians over the matched samples (see the module's help)."""
    if not matched:
        return None
    def est_gap(s):  # elapsed less the host time from the start event's record to the return
        gap = s["launched"] - s["recorded"] if s["recorded"] else 0
        return max(0, s["elapsed"] - gap)
    rows = {}
    for name, pick in (("all", lambda s: True), ("idle stream", lambda s: s["clamped"]),
                       ("queued", lambda s: not s["clamped"]),
                       ("held on its stream", lambda s: s["held"]),
                       ("queued, not held", lambda s: not s["clamped"] and not s["held"]),
                       ("contended", lambda s: s["contended"]),
                       ("uncontended", lambda s: not s["contended"])):
        m = [(s, a, b) for s, a, b, _ in matched if pick(s) and s["start"]]
        if not m:
            continue
        true = sum(b - a for _, a, b in m)
        rows[name] = {
            "samples": len(m),
            "profiler_us_mean": true / len(m) / 1e3,
            "reported_over_profiler": sum(s["dur"] for s, _, _ in m) / true,
            "elapsed_over_profiler": sum(s["elapsed"] for s, _, _ in m) / true,
            "elapsed_less_gap_over_profiler": sum(est_gap(s) for s, _, _ in m) / true,
            "kernel_start_after_return_us_median": med([(a - s["launched"]) / 1e3 for s, a, _ in m]),
            "start_event_record_to_return_us_median": med(
                [(s["launched"] - s["recorded"]) / 1e3 for s, _, _ in m if s["recorded"]]),
            "placed_end_minus_profiler_end_us_median": med([(s["end"] - b) / 1e3 for s, _, b in m]),
            "placed_end_minus_profiler_end_us_p10_p90": (
                statistics.quantiles([(s["end"] - b) / 1e3 for s, _, b in m], n=10)[0::8]
                if len(m) >= 10 else None),
        }
    return rows


# The server's draw for an untimed launch: the kernel's mean times the client's pace over 32
# samples (server/kernel_profile.h MeasuredMean, ClientPace::kWeight). Until 2026-11-26 it was
# a recent mean of the kernel's own samples, each new one weighing a quarter (weight 4).
SERVER_ESTIMATOR = "p32"


class RecentMean:
    """A kernel's mean for a replay: the mean of the first `weight` measured samples past the
    warm-up, then each new one weighing 1/`weight`; weight 0: the mean of all of them (what the
    server keeps, server/kernel_profile.h MeasuredMean)."""
    def __init__(self, weight=0):
        self.weight, self.n, self.total, self.recent = weight, 0, 0, 0.0

    def add(self, ns):
        self.n += 1
        self.total += ns
        self.recent = (self.total / self.n if self.weight == 0 or self.n <= self.weight
                       else self.recent + (ns - self.recent) / self.weight)


class ClientPace:
    """The client's recent pace (server/kernel_profile.h ClientPace): over its recent samples,
    what they measured against what their kernels' means said before them (a new sample weighs
    1/`weight` in both sums, starting from 1), counted only for kernels with `min_samples`
    samples already, a sample clamped to within `max_ratio` of its mean."""
    min_samples, max_ratio = 4, 4.0

    def __init__(self, weight):
        self.weight, self.n, self.measured, self.expected = weight, 0, 0.0, 0.0

    def add(self, ns, expected_ns):
        if expected_ns <= 0:
            return
        ns = min(max(ns, expected_ns / self.max_ratio), expected_ns * self.max_ratio)
        if self.n == 0:
            self.measured = self.expected = expected_ns
        self.n += 1
        self.measured += (ns - self.measured) / self.weight
        self.expected += (expected_ns - self.expected) / self.weight

    def factor(self):
        return self.measured / self.expected if self.expected > 0 else 1.0


def scaled(mean, per, shape):
    """`mean` scaled to `shape` by its samples' mean over the function's (ScaledToShape); per:
    shape -> (samples, sum)."""
    mine = per.get(shape)
    if len(per) < 2 or mine is None:
        return mean
    n_all = sum(n for n, _ in per.values())
    ns_all = sum(t for _, t in per.values())
    return mean * (mine[1] / mine[0]) / (ns_all / n_all)


def reported_contended(s):
    """What the interposer reports contended (interpose/sample_timing.h ReportedContended):
    another process's work was in flight, and the start event ran on an idle stream or was not
    placed. The server counts those at the mean and learns nothing from them."""
    return bool(s["contended"]) and (bool(s["clamped"]) or s["start"] == 0)


def estimate_window(samples, prof, matched, off, weight=SERVER_ESTIMATOR):
    """Where a process's busy seconds over the profiler's window come from, against the
    profiler's kernel time, in three steps (each kernel's function taken from the samples the
    window matched, by name):
      - per_sample: the matched samples' reported durations against the profiler's kernels;
      - selection: each kernel drawn at the mean of its function's matched samples that are not
        reported contended (reported_contended),
        as the profiler measured them (which launches are timed and kept, with no error of
        their own);
      - server: the server's own arithmetic (timed launches at their reported duration,
        untimed ones at the mean of the samples not reported contended before them, the log's
        samples from before the window included) over the profiler's kernels, by function alone
        and scaled to each launch's shape (grid and block). `weight` picks the mean: "p<N>" the
        function's mean times the client's pace over N samples (ClientPace; the server's is
        SERVER_ESTIMATOR), a number the function's own recent mean (RecentMean).
    Kernels whose name no sample matched are left out of all three (`covered` says how much of
    the profiler's time is in)."""
    if not matched or off is None:
        return None
    names = {}  # func -> name, from the matches
    for s, _, _, k in matched:
        if len(k) > 9:
            names.setdefault(s["func"], k[9])
    func_of = {}
    for func, name in names.items():
        func_of.setdefault(name, func)
    kernels = [k for k in prof["kernels"] if len(k) > 9]
    total = sum(k[1] for k in kernels) * 1e3
    inside = [k for k in kernels if k[9] in func_of]
    covered = sum(k[1] for k in inside) * 1e3
    if not covered:
        return None
    timed = {id(k): s for s, _, _, k in matched}
    # selection: the profiler's durations of each function's kept samples
    kept = {}
    for s, a, b, k in matched:
        if not reported_contended(s) and not s["warmup"] and len(k) > 9:
            kept.setdefault(k[9], []).append(b - a)
    selection = sum(statistics.fmean(kept[k[9]]) if k[9] in kept else k[1] * 1e3 for k in inside)
    # server: walk samples (by when the launch returned) and kernels (by start) in time order;
    # by_shape: the same, each untimed launch scaled by its shape's mean over its function's
    # (server/kernel_profile.h ScaledToShape)
    # every sample teaches its function's mean and the client's pace, as in the server; only
    # the matched functions' kernels are drawn
    events = [(s["launched"], 0, s) for s in samples
              if not reported_contended(s) and not s["warmup"]]
    events += [(int((k[0] + off) * 1e3), 1, k) for k in inside]
    events.sort(key=lambda e: (e[0], e[1]))
    pace = ClientPace(int(str(weight)[1:])) if str(weight).startswith("p") else None
    means, shapes = {}, {}
    server = by_shape = 0.0
    drawn_at_zero = 0
    for _, kind, x in events:
        if kind == 0:
            m = means.setdefault(x["func"], RecentMean(0 if pace else weight))
            if pace is not None and m.n >= pace.min_samples:
                pace.add(x["dur"], scaled(m.recent, shapes.get(x["func"], {}),
                                          (x["grid"], x["block"])))
            m.add(x["dur"])
            per = shapes.setdefault(x["func"], {})
            n, total_ns = per.get((x["grid"], x["block"]), (0, 0))
            per[(x["grid"], x["block"])] = (n + 1, total_ns + x["dur"])
            continue
        s = timed.get(id(x))
        if s is not None:
            server += s["dur"]
            by_shape += s["dur"]
            continue
        func = func_of[x[9]]
        m = means.get(func)
        if m is None:
            drawn_at_zero += 1
            continue
        factor = pace.factor() if pace is not None else 1.0
        server += m.recent * factor
        by_shape += scaled(m.recent, shapes.get(func, {}),
                           (tuple(x[2:5]), tuple(x[5:8]))) * factor
    reported = sum(s["dur"] for s, _, _, _ in matched)
    truth = sum(b - a for _, a, b, _ in matched)
    return {"kernels": len(kernels), "covered": covered / total if total else None,
            "per_sample": reported / truth if truth else None,
            "selection": selection / covered, "server": server / covered,
            "server_by_shape": by_shape / covered,
            "drawn_before_any_sample": drawn_at_zero,
            "contended_samples": sum(1 for s, _, _, _ in matched if reported_contended(s)),
            "matched": len(matched)}


def estimate_table(rows):
    """The windows' busy seconds against the profiler, each step of estimate_window beside what
    the server counted (rows: JSONL of window, role, busy_ratio and the steps where the
    window's timing log was kept)."""
    def cell(r, k):
        return f"{r[k]:.3f}" if r.get(k) is not None else "-"
    return harness.markdown_table(
        ["window", "client", "samples matched", "per sample", "kept samples' own kernels",
         "server's arithmetic by function", "by launch shape", "server's busy seconds"],
        [[r["window"], r["role"], r.get("matched", "-"), cell(r, "per_sample"),
          cell(r, "selection"), cell(r, "server_by_function"), cell(r, "server_by_shape"),
          f"**{r['busy_ratio']:.3f}**"] for r in rows])


def replay_table(rows):
    """The server's arithmetic, scaled to each launch's shape as the server does, replayed with
    several means (rows: window, weight (a number: the function's recent mean at that weight,
    0: the mean of every sample before; "p<N>": that mean times the client's pace over N
    samples), server_by_shape, selection, per_sample), a window a line."""
    def order(w):
        return (1, int(w[1:])) if isinstance(w, str) else (0, w == 0, w)
    weights = sorted({r["weight"] for r in rows}, key=order)
    windows = list(dict.fromkeys(r["window"] for r in rows))
    at = {(r["window"], r["weight"]): r for r in rows}
    def name(w):
        if isinstance(w, str):
            return (f"mean x client's pace over {w[1:]}"
                    + (" (server)" if w == SERVER_ESTIMATOR else ""))
        if w == 0:
            return "mean of all before"
        return f"weight {w}" + (" (server until 2026-11-26)" if w == 4 else "")
    out = []
    for win in windows:
        first = next(r for r in rows if r["window"] == win)
        out.append([win, first["matched"], f"{first['per_sample']:.3f}",
                    f"{first['selection']:.3f}"]
                   + [f"{at[(win, w)]['server_by_shape']:.3f}" if (win, w) in at else "-"
                      for w in weights])
    return harness.markdown_table(["window", "samples matched", "per sample",
                                   "kept samples' own kernels"] + [name(w) for w in weights], out)


def split_by_call(samples, call_ns, min_samples=100):
    """Per function with at least `min_samples` samples past the warm-up: the median span of its
    uncontended queued samples and the median elapsed time of its idle ones,
    for launches whose call (start event's record to the call's return) took at most
    `call_ns` and for the longer ones. A profiler (CUPTI) slows the launch call several
    times over, so this tells its window from the rest in a log that has no window marks."""
    by_func = collections.defaultdict(list)
    for s in samples:
        if not s["warmup"] and s["recorded"] and s["start"]:  # placed: dur is the kernel's
            by_func[s["func"]].append(s)
    rows = []
    for func, ss in sorted(by_func.items(), key=lambda kv: -len(kv[1])):
        if len(ss) < min_samples:
            continue
        for name, pick in (("short", lambda s: s["launched"] - s["recorded"] <= call_ns),
                           ("long", lambda s: s["launched"] - s["recorded"] > call_ns)):
            part = [s for s in ss if pick(s)]
            queued = [s["dur"] for s in part if not s["clamped"] and not s["contended"]]
            idle = [s["elapsed"] for s in part if s["clamped"]]
            def us(values):
                return med(values) / 1e3 if values else None
            rows.append({"func": func, "call": name, "samples": len(part),
                         "queued": len(queued), "queued_span_us_median": us(queued),
                         "idle": len(idle), "idle_elapsed_us_median": us(idle)})
    return rows


def split_table(rows):
    return harness.markdown_table(
        ["file", "function", "launch call", "samples", "queued, uncontended",
         "their span (median us)", "idle", "their elapsed (median us)"],
        [[r["file"], r["func"], f"{'<=' if r['call'] == 'short' else '>'} {r['call_us']:g} us",
          r["samples"], r["queued"], fmt(r["queued_span_us_median"], 1, 1), r["idle"],
          fmt(r["idle_elapsed_us_median"], 1, 1)] for r in rows])


def split_held(matched, group_of):
    """The held samples of a window grouped by `group_of` (the profiler's name of their kernel
    to a group's label, in the order the labels first come). Per group: the reported time
    against the profiler's, and what the GPU's elapsed time holds beyond the profiler's kernel
    (the start latency after the hold that the interposer takes off: ORION_HELD_START_NS, and
    ORION_HELD_COMPUTE_START_NS for a compute kernel's)."""
    groups = {}
    for s, a, b, k in matched:
        if s["held"] and s["start"]:
            groups.setdefault(group_of(str(k[9]) if len(k) > 9 else ""), []).append((s, b - a))
    return [split_group(group, m) for group, m in groups.items()]


def split_group(group, m):
    """One group's row of split_held: `m` its (sample, profiler's kernel time) pairs."""
    over = [s["elapsed"] - d for s, d in m]
    return {"kernels": group, "samples": len(m),
            "profiler_us_mean": sum(d for _, d in m) / len(m) / 1e3,
            "reported_over_profiler": sum(s["dur"] for s, _ in m) / sum(d for _, d in m),
            "over_ns_median": med(over), "over_ns_mean": statistics.mean(over),
            "over_ns_p90": statistics.quantiles(over, n=10)[8] if len(over) >= 10 else None}


def split_by_name(matched, prefixes):
    """split_held: the kernels whose name starts with one of `prefixes`, then the others."""
    rows = split_held(matched, lambda name: ",".join(prefixes) if name.startswith(prefixes)
                      else "the others")
    return sorted(rows, key=lambda r: r["kernels"] == "the others")


def kernel_class_patterns():
    """The words that make a kernel's name compute or memory (contract/kernel_class.h, the
    interposer's own ClassifyKernelName, read from its source)."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "contract", "kernel_class.h")) as f:
        text = f.read()
    def words(array):
        found = re.search(array + r"\[\]\s*=?\s*\{(.*?)\}", text, re.S)
        if not found:
            sys.exit(f"timing-log: no {array}[] word list in contract/kernel_class.h")
        return re.findall(r'"([^"]*)"', found.group(1))
    return words("kCompute"), words("kMemory")


def kernel_class(name, patterns):
    low = name.lower()
    for label, words in zip(("compute", "memory"), patterns):
        if any(w.lower() in low for w in words):
            return label
    return "unknown"


CLASS_ORDER = ("compute", "memory", "unknown")


def held_by_class(matched, compute_ns):
    """The held samples by the interposer's class of each kernel (the log's compute column
    where it has one, the kernel's name for the rest), then all of them against the profiler's
    kernels with each compute start latency in `compute_ns` taken off the compute kernels' GPU
    time and the log's held start latency off the others'."""
    patterns = kernel_class_patterns()
    def class_of(s, k):
        by_name = kernel_class(str(k[9]) if len(k) > 9 else "", patterns)
        if s["compute"] is None:
            return by_name
        return "compute" if s["compute"] else ("unknown" if by_name == "compute" else by_name)
    held = [(s, b - a, class_of(s, k)) for s, a, b, k in matched if s["held"] and s["start"]]
    groups = {}
    for s, d, c in held:
        groups.setdefault(c, []).append((s, d))
    rows = [split_group(c, groups[c]) for c in CLASS_ORDER if c in groups]
    profiler = sum(d for _, d, _ in held)
    for ns in compute_ns:
        reported = sum(max(0, s["elapsed"] - (ns if c == "compute" else s["held_start"]))
                       for s, _, c in held)
        rows.append({"held_compute_ns": ns, "samples": len(held),
                     "reported_over_profiler": reported / profiler if profiler else None})
    return rows


def what_if_table(rows):
    """held_by_class's last rows: per window, the held samples against the profiler at each
    compute start latency."""
    windows = list(dict.fromkeys(r["window"] for r in rows))
    latencies = sorted({r["held_compute_ns"] for r in rows})
    at = {(r["window"], r["held_compute_ns"]): r for r in rows}
    def cell(w, ns):
        r = at.get((w, ns))
        return fmt(r["reported_over_profiler"], 1, 3) if r else "-"
    return harness.markdown_table(
        ["window", "held samples"] + [f"compute kernels' start {ns / 1e3:g} us" for ns in latencies],
        [[w, next(r["samples"] for r in rows if r["window"] == w)]
         + [cell(w, ns) for ns in latencies] for w in windows])


def held_split_tables(rows):
    """--split-by-name's and --held-by-class's rows: the groups' table, then the what-if one."""
    groups = [r for r in rows if "kernels" in r]
    what_if = [r for r in rows if "held_compute_ns" in r]
    return "\n\n".join(([name_split_table(groups)] if groups else []) +
                       ([what_if_table(what_if)] if what_if else []))


def name_split_table(rows):
    return harness.markdown_table(
        ["window", "kernels (by the profiler's name)", "held samples", "profiler kernel (mean us)",
         "reported / profiler", "elapsed beyond the profiler's kernel: median / mean / p90 (us)"],
        [[r["window"], r["kernels"], r["samples"], fmt(r["profiler_us_mean"]),
          fmt(r["reported_over_profiler"], 1, 3),
          f"{fmt(r['over_ns_median'], 1e3)} / {fmt(r['over_ns_mean'], 1e3)} / "
          f"{fmt(r['over_ns_p90'], 1e3)}"] for r in rows])


def fmt(v, scale=1.0, digits=2):
    return "-" if v is None else f"{v / scale:.{digits}f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", help="folders (their timing.*.log) or files")
    p.add_argument("--json", action="store_true", help="one JSON line per file")
    p.add_argument("--check", action="store_true", help="exit 1 on a line that breaks the rules")
    p.add_argument("--profile", action="append", default=[],
                   help="a torch.profiler window's kernels (F.kernels.json from torch_models.py "
                        "--profile-out F) to match the samples against; repeatable")
    p.add_argument("--split-by-call", type=float, metavar="US",
                   help="per function of 100 samples or more: median spans of launches whose "
                        "call took at most US microseconds and of the longer ones (a profiler "
                        "slows the call: its window against the rest)")
    p.add_argument("--replay-weights", metavar="W,W,...",
                   help="also replay the server's arithmetic with these means: a number W, the "
                        "function's recent mean (a new sample weighs 1/W; 0: the mean of all "
                        "samples); p<N>, the mean of all times the client's pace over N samples "
                        "(the server's: p32), e.g. 4,0,p32")
    p.add_argument("--replay-out", metavar="ROWS_JSONL",
                   help="with --replay-weights: append one row per window and weight to this file "
                        "(rendered by --table)")
    p.add_argument("--label", help="with --replay-out: the rows' window (default: the log's name)")
    p.add_argument("--held-by-class", metavar="NS,NS",
                   help="with --profile: the held samples split by the interposer's class of "
                        "their kernel's name (compute, memory, unknown), then against the "
                        "profiler with each of these start latencies taken off the compute "
                        "kernels' (ORION_HELD_COMPUTE_START_NS) and the log's off the others'")
    p.add_argument("--split-by-name", metavar="PREFIX,PREFIX",
                   help="with --profile: the held samples split by whether the profiler's name of "
                        "their kernel begins with one of these (e.g. nvjet,cudnn_generated): a "
                        "table, or JSON lines with --json (rendered by --table)")
    p.add_argument("--table", metavar="ROWS_JSONL",
                   help="render windows' busy seconds and estimate steps (JSONL) and exit")
    args = p.parse_args(argv)
    weights = args.replay_weights.split(",") if args.replay_weights else []
    if not all(w.isdigit() or (w[:1] == "p" and w[1:].isdigit() and int(w[1:]) > 0)
               for w in weights):
        p.error(f"--replay-weights {args.replay_weights!r}: expected whole numbers >= 0 or "
                f"p<N> (the client's pace over N samples), e.g. 4,8,16,0,p32")
    weights = [w if w.startswith("p") else int(w) for w in weights]
    compute_ns = args.held_by_class.split(",") if args.held_by_class else []
    if not all(ns.isdigit() for ns in compute_ns):
        p.error(f"--held-by-class {args.held_by_class!r}: expected nanoseconds, e.g. 2500,2750")
    compute_ns = [int(ns) for ns in compute_ns]
    if args.held_by_class and args.split_by_name:
        p.error("--held-by-class and --split-by-name split the same samples: one at a time")
    if (args.held_by_class or args.split_by_name) and not args.profile:
        p.error("--held-by-class and --split-by-name set samples against a profile: give --profile")
    if args.replay_out and not weights:
        p.error("--replay-out goes with --replay-weights")
    if args.table:
        rows = harness.read_rows(args.table, "timing-log")
        if args.split_by_call is not None:
            print(split_table(rows))
        elif rows and ("kernels" in rows[0] or "held_compute_ns" in rows[0]):
            print(held_split_tables(rows))
        else:
            print(replay_table(rows) if rows and "weight" in rows[0] else estimate_table(rows))
        return
    files = []
    for path in args.paths:
        files += sorted(glob.glob(os.path.join(path, "timing.*.log")) +
                        glob.glob(os.path.join(path, "timing.*.log.gz"))) \
            if os.path.isdir(path) else [path]
    if not files:
        sys.exit(f"timing-log: no timing.*.log in {', '.join(args.paths)}")
    problems = []
    rows = []
    profiles = []
    for path in args.profile:
        with open_text(path) as f:
            profiles.append(json.load(f))
    comparisons = []
    logs = []
    for path in files:
        samples, anchors, bad = read(path)
        problems += bad
        rows.append(summarise(path, samples, anchors))
        logs.append((path, samples))
    if args.split_by_call is not None:
        split = [dict(r, file=os.path.basename(path)) for path, samples in logs
                 for r in split_by_call(samples, args.split_by_call * 1e3)]
        for r in split:
            r["call_us"] = args.split_by_call
        if args.json:
            for r in split:
                print(json.dumps(r))
        else:
            print(split_table(split))
        if args.check and problems:
            sys.exit("\n".join(problems))
        return
    # Each log against each window; the offsets found by one pair are tried by the others.
    found = [off for _, samples in logs for prof in profiles
             for off in [match_profile(samples, prof)[1]] if off is not None]
    name_rows = []  # --split-by-name, --held-by-class
    for path, samples in logs:
        for prof, name in zip(profiles, args.profile):
            matched, off = match_profile(samples, prof, found)
            if len(matched) >= MIN_MATCHED and (args.split_by_name or args.held_by_class):
                rows_of = (split_by_name(matched, tuple(args.split_by_name.split(",")))
                           if args.split_by_name else held_by_class(matched, compute_ns))
                name_rows += [dict(r, window=args.label or os.path.basename(path))
                              for r in rows_of]
                continue
            if len(matched) >= MIN_MATCHED:  # fewer: another process's window
                comparisons.append({"file": os.path.basename(path),
                                    "profile": os.path.basename(name),
                                    "by_class": compare_profile(matched),
                                    "estimate": estimate_window(samples, prof, matched, off),
                                    "replays": {w: estimate_window(samples, prof, matched, off, w)
                                                for w in weights}})
    if args.split_by_name or args.held_by_class:
        print("\n".join(map(json.dumps, name_rows)) if args.json else held_split_tables(name_rows))
        return
    if args.replay_out:
        for c in comparisons:
            for w, r in c["replays"].items():
                if r:
                    harness.append_row(args.replay_out, {
                        "window": args.label or c["file"], "weight": w,
                        **{k: r[k] for k in ("server", "server_by_shape", "selection",
                                             "per_sample", "matched")}})
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print("| file | timed launches | idle stream | GPU time / reported (ms) | handover taken off (median us) "
              "| start event before the call's return (median us) | anchors (polled) "
              "| anchor placed minus chained (median us) | clock rate learned (ppm) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['file']} | {r['samples']} | {r['clamped']} "
                  f"({fmt(r['clamped_fraction'], 0.01, 0)}%) | "
                  f"{fmt(r['gpu_ns_sum'], 1e6, 3)} / {fmt(r['reported_ns_sum'], 1e6, 3)} | "
                  f"{fmt(r['clamp_cut_ns_median'], 1e3)} | "
                  f"{fmt(r['start_before_return_ns_median'], 1e3)} | "
                  f"{r['anchors']} ({r['anchors_polled']}) | "
                  f"{fmt(r['anchor_host_minus_chained_ns_median'], 1e3)} | "
                  f"{fmt(r['rate_ppm_last'])} |")
    for c in comparisons:
        if args.json:
            print(json.dumps(c))
            continue
        print(f"\nAgainst the profiler ({c['file']}, {c['profile']}):\n")
        print("| samples | n | profiler kernel (mean us) | reported / profiler | elapsed / profiler "
              "| elapsed less record-to-return gap / profiler | kernel start after call return "
              "(median us) | start record to return (median us) | placed end minus profiler end "
              "(median us, p10 / p90) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, r in c["by_class"].items():
            spread = r["placed_end_minus_profiler_end_us_p10_p90"]
            print(f"| {name} | {r['samples']} | {r['profiler_us_mean']:.2f} | "
                  f"{r['reported_over_profiler']:.3f} | {r['elapsed_over_profiler']:.3f} | "
                  f"{r['elapsed_less_gap_over_profiler']:.3f} | "
                  f"{fmt(r['kernel_start_after_return_us_median'])} | "
                  f"{fmt(r['start_event_record_to_return_us_median'])} | "
                  f"{fmt(r['placed_end_minus_profiler_end_us_median'])}"
                  + (f" ({spread[0]:.2f} / {spread[1]:.2f})" if spread else "") + " |")
        e = c.get("estimate")
        if e:
            print(f"\nBusy time over the window against the profiler's kernel time "
                  f"({e['covered']:.1%} of it covered by the samples' functions, "
                  f"{e['matched']} samples matched, {e['contended_samples']} of them reported contended): "
                  f"per sample {e['per_sample']:.3f}, by the kept samples' own kernels "
                  f"{e['selection']:.3f}, the server's arithmetic by function {e['server']:.3f} "
                  f"and by launch shape {e['server_by_shape']:.3f} "
                  f"({e['drawn_before_any_sample']} kernels drawn before any sample)")
        for w, r in c.get("replays", {}).items():
            if r:
                print(f"- recency weight {w if w else 'none (mean of all)'}: by function "
                      f"{r['server']:.3f}, by launch shape {r['server_by_shape']:.3f}")
    for line in problems[:20]:
        print("problem:", line, file=sys.stderr)
    if args.check and problems:
        sys.exit(1)
