"""Takes a service's slow requests apart: where did the time of its slowest requests go?

  orion_bench.py slow-requests --out SUMMARY.jsonl DIR     (DIR: a priority --request-logs run)
  orion_bench.py slow-requests --table SUMMARY.jsonl       (per configuration, over its runs)

Reads every requests-CONFIG-SERVICE-rN.jsonl in DIR (one line per request, written by
`torch_models.py serve --request-log`) and writes one summary row per run: for all its requests,
for the 1% slowest by latency (arrival to completion) and for the 1% slowest by service time
(start to completion), the mean of
  queue      scheduled arrival to start (waiting behind earlier requests);
  launch     the forward pass on the CPU (an eager model's kernel launches);
  sync       then until the GPU finished the request;
  on-CPU     the serving thread's CPU time over launch and sync;
  off-CPU    launch + sync - on-CPU: the serving thread preempted, or asleep in the driver;
  nivcsw     the serving thread's involuntary context switches (another thread took its core);
  others     CPU time of the process's other threads over the request (the interposer's
             poller, the driver's threads, PyTorch's).
A slow request whose launch is long with on-CPU time to match was slowed on the CPU by its own
work (a slower core, cache); long with off-CPU time, by another thread or the driver; a long
sync, by the GPU (work of another process ahead of its kernels).
"""
import argparse
import glob
import os
import re
import statistics
import sys
import harness
from harness import read_rows

ANSWERS = ("where a service's slowest requests lost their time (queue, launch on the CPU, GPU, "
           "off-CPU, other threads), from priority --request-logs")

NAME = re.compile(r"requests-(?P<config>.+)-(?P<hp>resnet50-graph|resnet50|bert-graph|bert)"
                  r"-r(?P<round>\d+)\.jsonl$")
PARTS = ("queue_ms", "launch_ms", "sync_ms", "thread_cpu_ms", "off_cpu_ms", "nivcsw",
         "others_cpu_ms")


def load(path):
    def derive(r):
        """Adds the request's service time and its parts; what is missing, if anything."""
        try:
            svc = r["launch_ms"] + r["sync_ms"]
            r["svc_ms"] = svc
            r["latency_ms"] = r["queue_ms"] + svc
            r["off_cpu_ms"] = max(0.0, svc - r["thread_cpu_ms"])
            r["others_cpu_ms"] = max(0.0, r["process_cpu_ms"] - r["thread_cpu_ms"])
        except (KeyError, TypeError) as e:
            return f"not a request line ({type(e).__name__}: {e})"
        return None

    return read_rows(path, "slow-requests", check=derive,
                     rerun=f"python3 bench/orion_bench.py slow-requests {os.path.dirname(path) or '.'}")


def means(rows):
    return {k: round(statistics.fmean(r[k] for r in rows), 3) for k in PARTS + ("svc_ms",
                                                                                  "latency_ms")}


def summarize(path):
    m = NAME.search(os.path.basename(path))
    if not m:
        sys.exit(f"{path}: not named requests-CONFIG-SERVICE-rN.jsonl")
    rows = load(path)
    if len(rows) < 100:
        sys.exit(f"{path}: {len(rows)} requests, too few for a slowest 1%")
    k = max(1, len(rows) // 100)
    by_latency = sorted(rows, key=lambda r: r["latency_ms"])[-k:]
    by_service = sorted(rows, key=lambda r: r["svc_ms"])[-k:]
    return {"config": m["config"], "hp": m["hp"], "round": int(m["round"]),
            "requests": len(rows), "slowest": k,
            "all": means(rows), "slow_latency": means(by_latency),
            "slow_service": means(by_service)}


def render(rows):
    lines = ["| config | round | requests | which | latency | queue | launch | sync | on-CPU "
             "| off-CPU | nivcsw | other threads' CPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["round"], r["config"])):
        for which, label in (("all", "all (mean)"),
                             ("slow_latency", f"slowest {r['slowest']} by latency"),
                             ("slow_service", f"slowest {r['slowest']} by service time")):
            s = r[which]
            lines.append(" | ".join([
                f"| {r['config']}", str(r["round"] + 1), str(r["requests"]), label,
                *(f"{s[k]:.2f} ms" for k in ("latency_ms", "queue_ms", "launch_ms", "sync_ms",
                                             "thread_cpu_ms", "off_cpu_ms")),
                f"{s['nivcsw']:.1f}", f"{s['others_cpu_ms']:.2f} ms |"]))
    return "\n".join(lines) + "\n"


def render_summary(rows):
    """Per configuration, over its runs (rounds): median [min, max] of each run's figures."""
    def spread(xs, fmt):
        xs = sorted(xs)
        return f"{fmt(statistics.median(xs))} [{fmt(xs[0])}, {fmt(xs[-1])}]"
    ms = lambda x: f"{x:.2f}"
    lines = ["| config | runs | service time, mean (ms) | serving thread off-CPU per request (ms) "
             "| its involuntary switches per request | other threads' CPU per request (ms) "
             "| slowest 1% by service time: service time (ms) | of which off-CPU (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    configs = {}
    for r in rows:
        configs.setdefault(r["config"], []).append(r)
    for cfg, runs in configs.items():
        col = lambda which, key: [r[which][key] for r in runs]
        lines.append(" | ".join([
            f"| {cfg}", str(len(runs)), spread(col("all", "svc_ms"), ms),
            spread(col("all", "off_cpu_ms"), ms), spread(col("all", "nivcsw"), lambda x: f"{x:.1f}"),
            spread(col("all", "others_cpu_ms"), ms), spread(col("slow_service", "svc_ms"), ms),
            spread(col("slow_service", "off_cpu_ms"), ms) + " |"]))
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?")
    p.add_argument("--out", help="write the summary rows (JSONL) here")
    p.add_argument("--table", metavar="SUMMARY_JSONL")
    a = p.parse_args(argv)
    if a.table:
        print(render_summary(read_rows(a.table, "slow-requests")), end="")
        return
    if not a.dir:
        p.error("give a run's directory, or --table")
    paths = sorted(glob.glob(os.path.join(a.dir, "requests-*.jsonl")))
    if not paths:
        sys.exit(f"{a.dir}: no requests-*.jsonl")
    rows = [summarize(x) for x in paths]
    if a.out:
        open(a.out, "w").close()
        for r in rows:
            harness.append_row(a.out, r)
    print(render(rows) + "\n" + render_summary(rows), end="")
