#!/usr/bin/env python3
"""Replays a profiled window's busy time under several ways of drawing untimed launches.

  bench/busy_replay.py TIMING_LOG --profile F.kernels.json [--json]

The server counts a client's busy time as the sum of its launches' GPU time: a timed launch
(1 in 64) at its measurement, the others drawn at an estimate made from the measurements that
had arrived before them (server/kernel_profile.h). Given one process's timing log (every timed
launch of the run: kernel, grid, block, duration, when it ran; interpose/timing_log.h) and the
kernels torch.profiler recorded in a window of the same process (bench/torch_models.py
--profile-out F writes F.kernels.json; the kernel names come with it), this replays the window:
each of the profiler's kernels is either one of the timed launches (matched by
bench/timing_log_summary.py's rules: it counts at its measurement) or drawn by an estimator from
the samples measured before its launch call returned. Printed per estimator: the window's
replayed busy time over the profiler's kernel sum, and the kernel names that make most of the
difference. That decides an estimator from one GPU run instead of one GPU run per estimator.

Estimators (the weight w: a new measurement counts 1/w of a recency-weighted mean):
  kernel-recent-w   the kernel's recent mean (the server's rule, w = 4)
  kernel-recent-4-clipC  that, a sample counting at most C times the mean (outliers: a timed
                    launch that waited for another context's time slice)
  shape-recent-w    the mean of the kernel at that grid and block, else the kernel's
  shape-scaled-w    the shape's mean over the run, else the kernel's, times a factor that
                    all the client's samples keep up to date (each sample over its shape's mean),
                    recent at weight w: what shares the GPU moves every kernel of a client at once
"""
import argparse
import bisect
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing_log_summary import match_profile, read  # noqa: E402

# A measurement reaches the server after its end event completes and the poller sees it.
ARRIVAL_NS = 500_000


class Recent:
    """MeasuredMean's recent mean: the plain mean of the first w samples, then 1/w each."""

    def __init__(self, w):
        self.w, self.n, self.sum, self.value = w, 0, 0.0, 0.0

    def add(self, x):
        self.n += 1
        self.sum += x
        self.value = self.sum / self.n if self.n <= self.w else self.value + (x - self.value) / self.w

    def mean(self):
        return self.sum / self.n if self.n else 0.0


class KernelRecent:
    def __init__(self, w):
        self.w, self.kernel = w, collections.defaultdict(lambda: Recent(w))

    def add(self, func, shape, ns):
        self.kernel[func].add(ns)

    def draw(self, func, shape):
        return self.kernel[func].value if func in self.kernel else None


class ShapeRecent(KernelRecent):
    def __init__(self, w):
        super().__init__(w)
        self.shape = collections.defaultdict(lambda: Recent(w))

    def add(self, func, shape, ns):
        super().add(func, shape, ns)
        self.shape[(func, shape)].add(ns)

    def draw(self, func, shape):
        s = self.shape.get((func, shape))
        return s.value if s else super().draw(func, shape)


class ShapeScaled(ShapeRecent):
    def __init__(self, w):
        super().__init__(w)
        self.factor = Recent(w)

    def base(self, func, shape):
        s = self.shape.get((func, shape))
        if s:
            return s.mean()
        k = self.kernel.get(func)
        return k.mean() if k else None

    def add(self, func, shape, ns):
        base = self.base(func, shape)
        if base:
            self.factor.add(ns / base)
        super().add(func, shape, ns)

    def draw(self, func, shape):
        base = self.base(func, shape)
        if base is None:
            return None
        return base * (self.factor.value if self.factor.n else 1.0)


class KernelRecentClipped(KernelRecent):
    """The kernel's recent mean, a sample counting at most `clip` times that mean: a timed
    launch that waited for another context's time slice does not move it."""

    def __init__(self, w, clip):
        super().__init__(w)
        self.clip = clip

    def add(self, func, shape, ns):
        k = self.kernel.get(func)
        if k and k.n >= k.w:
            ns = min(ns, self.clip * k.value)
        super().add(func, shape, ns)


class KernelRecentMedian(KernelRecent):
    """The kernel's recent mean of samples each clipped at `clip` times the median of the
    kernel's last `n` samples."""

    def __init__(self, w, clip, n=5):
        super().__init__(w)
        self.clip, self.n, self.last = clip, n, collections.defaultdict(collections.deque)

    def add(self, func, shape, ns):
        last = self.last[func]
        clipped = ns
        if len(last) >= 3:
            clipped = min(ns, self.clip * sorted(last)[len(last) // 2])
        last.append(ns)
        if len(last) > self.n:
            last.popleft()
        super().add(func, shape, clipped)


ESTIMATORS = {
    "kernel-recent-4-median3": lambda: KernelRecentMedian(4, 3),
    "kernel-recent-4-median5": lambda: KernelRecentMedian(4, 5),
    "kernel-recent-2-median3": lambda: KernelRecentMedian(2, 3),
    "kernel-recent-4-clip4": lambda: KernelRecentClipped(4, 4),
    "kernel-recent-4-clip2": lambda: KernelRecentClipped(4, 2),
    "kernel-recent-4": lambda: KernelRecent(4),
    "kernel-recent-2": lambda: KernelRecent(2),
    "shape-recent-4": lambda: ShapeRecent(4),
    "shape-recent-2": lambda: ShapeRecent(2),
    "shape-scaled-16": lambda: ShapeScaled(16),
    "shape-scaled-64": lambda: ShapeScaled(64),
}


def replay(samples, prof, queued_start_ns=0):
    if queued_start_ns:
        samples = [dict(s, dur=max(0, s["dur"] - queued_start_ns))
                   if s["start"] and not s["clamped"] else s for s in samples]
    matched, off = match_profile(samples, prof)
    if not matched:
        return None
    # The profiler's kernel names -> the interposer's function handles, from the matches.
    votes = collections.defaultdict(collections.Counter)
    for s, _, _, k in matched:
        if len(k) > 9:
            votes[k[9]][s["func"]] += 1
    # Names the window never timed: by the grid and block their kernels ran with, against the
    # functions the whole log timed with that grid and block (where one function had it).
    funcs_of_shape = collections.defaultdict(set)
    for s in samples:
        if s["grid"]:
            funcs_of_shape[(s["grid"], s["block"])].add(s["func"])
    for k in prof["kernels"]:
        name = k[9] if len(k) > 9 else ""
        funcs = funcs_of_shape.get((tuple(k[2:5]), tuple(k[5:8])), ())
        if name not in votes and len(funcs) == 1:
            votes.setdefault(name, collections.Counter())
        if name in votes and len(funcs) == 1 and not any(
                s["func"] for s, _, _, m in matched if m is k):
            votes[name][next(iter(funcs))] += 0.01  # weaker than a match of the window
    func_of = {name: c.most_common(1)[0][0] for name, c in votes.items() if c}
    timed = {k[8]: s for s, _, _, k in matched}
    call_end = {c[2]: c[0] + c[1] for c in prof["launches"]}
    # (host ns, 0 = a measurement arrives / 1 = a launch is drawn, payload)
    timeline = [(s["launched"] + max(0, s["end"] - s["launched"]) + ARRIVAL_NS, 0, s)
                for s in samples if not s["warmup"] and s["grid"]]
    window_kernels = 0
    for k in prof["kernels"]:
        if k[8] in call_end:
            timeline.append((int((call_end[k[8]] + off) * 1e3), 1, k))
            window_kernels += 1
    timeline.sort(key=lambda e: (e[0], e[1]))
    truth = sum(k[1] for k in prof["kernels"] if k[8] in call_end) * 1e3
    results = {}
    for name, make in ESTIMATORS.items():
        est = make()
        total, unmapped = 0.0, 0.0
        per_name = collections.defaultdict(lambda: [0.0, 0.0])  # replayed, profiler
        for _, kind, x in timeline:
            if kind == 0:
                est.add(x["func"], (x["grid"], x["block"]), x["dur"])
                continue
            k = x
            kname = k[9] if len(k) > 9 else ""
            if k[8] in timed:
                ns = timed[k[8]]["dur"]
            else:
                func = func_of.get(kname)
                ns = est.draw(func, (tuple(k[2:5]), tuple(k[5:8]))) if func else None
                if ns is None:  # a kernel the log never timed: counted as the profiler saw it
                    ns = k[1] * 1e3
                    unmapped += ns
            total += ns
            per_name[kname][0] += ns
            per_name[kname][1] += k[1] * 1e3
        worst = sorted(per_name.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1]))[:3]
        results[name] = {"ratio": total / truth, "unmapped_fraction": unmapped / truth,
                         "largest_differences_us": [[n[:60], round((a - b) / 1e3, 1)]
                                                    for n, (a, b) in worst]}
    return {"kernels": window_kernels, "timed": len(timed), "profiler_ms": truth / 1e6,
            "estimators": results}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log", help="one process's timing.<pid>.log")
    p.add_argument("--profile", required=True, help="that process's F.kernels.json")
    p.add_argument("--json", action="store_true")
    p.add_argument("--queued-start-ns", type=int, default=0,
                   help="take this off every queued-stream sample first (what a rule that does so "
                        "would report)")
    args = p.parse_args()
    samples, _, _ = read(args.log)
    samples.sort(key=lambda s: s["launched"])
    out = replay(samples, json.load(open(args.profile)), args.queued_start_ns)
    if out is None:
        sys.exit(f"busy_replay: no timed launch of {args.log} matched {args.profile}")
    if args.json:
        print(json.dumps(out))
        return
    print(f"{out['kernels']} kernels in the window, {out['timed']} of them timed, "
          f"{out['profiler_ms']:.2f} ms by the profiler\n")
    print("| estimator | replayed / profiler | not drawn (never timed) | largest differences (us) |")
    print("|---|---|---|---|")
    for name, r in out["estimators"].items():
        diffs = ", ".join(f"{n} {d:+.1f}" for n, d in r["largest_differences_us"])
        print(f"| {name} | {r['ratio']:.3f} | {100 * r['unmapped_fraction']:.1f}% | {diffs} |")


if __name__ == "__main__":
    main()
