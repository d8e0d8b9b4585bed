"""What a request finds running: the trainers' kernel lengths, and the wait they put on a request
that arrives while one of them runs (no preemption inside a GPU time slice).

  orion_bench.py be-kernels [--models gptlm,resnet50] [--steps 20] [--cpus 2] [--out DIR]
  orion_bench.py be-kernels --table ROWS.jsonl

Each trainer runs alone (no orion), --steps steps under torch.profiler after warm-up
(bench/workloads/torch_models.py --profile); from the profiler's kernels: how many a step, the
share of the trainer's GPU time spent in kernels at least 0.1, 0.25, 0.5, 1 and 2 ms long, and
the residual wait: a request arriving at a random moment of the trainer's GPU time waits for the
kernel then running to end (length-biased: a kernel of length d is found with weight d, and has
d/2 left on average). Its mean is sum(d^2) / (2 sum(d)); the median and p90 come from the same
weighting. Whatever a policy does on the CPU, a request that finds the trainer running waits at
least this long, unless the GPU preempts the kernel (a time slice ends) or the request gets SMs
beside it (MPS); and which kernels of 1 ms or more take the time, by name. One JSON row per
model to be-kernels.jsonl in --out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import harness

ANSWERS = ("the trainers' kernel lengths and the wait a request finds behind a running "
           "best-effort kernel (torch.profiler, no orion)")
THRESHOLDS_MS = (0.1, 0.25, 0.5, 1.0, 2.0)


def summarize(durations_us):
    """The row's figures from the kernels' durations (us)."""
    d = sorted(x for x in durations_us if x > 0)
    total = sum(d)
    row = {"kernels": len(d), "gpu_ms": round(total / 1e3, 3),
           "kernel_p50_us": round(statistics.median(d), 1),
           "kernel_max_us": round(d[-1], 1)}
    for t in THRESHOLDS_MS:
        row[f"share_ge_{t}ms"] = round(sum(x for x in d if x >= t * 1e3) / total, 3)
    row["residual_mean_us"] = round(sum(x * x for x in d) / (2 * total), 1)
    # The residual's distribution: a kernel of length x is found with probability x / total and
    # leaves uniform(0, x); P(residual > r) = sum over kernels of max(0, x - r) / total.
    def above(r):
        return sum(x - r for x in d if x > r) / total
    for q, name in ((0.5, "residual_p50_us"), (0.1, "residual_p90_us")):
        lo, hi = 0.0, d[-1]
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if above(mid) > q else (lo, mid)
        row[name] = round(hi, 1)
    return row


def long_kernels(kernels, steps, at_least_us=1000, top=8):
    """The kernels of at least at_least_us, by name: how many a step, their mean and their share
    of the trainer's GPU time, the largest share first (the profiler's kernel rows: ts, dur, grid
    x3, block x3, correlation, name)."""
    total = sum(k[1] for k in kernels) or 1
    by_name = {}
    for k in kernels:
        if k[1] >= at_least_us:
            n, s = by_name.get(k[9], (0, 0.0))
            by_name[k[9]] = (n + 1, s + k[1])
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"name": name[:160], "per_step": round(n / steps, 2), "mean_us": round(s / n, 1),
             "share": round(s / total, 3)} for name, (n, s) in ranked]


def table(rows):
    header = ["trainer", "steps", "kernels a step", "kernel p50", "longest",
              *[f">= {t} ms" for t in THRESHOLDS_MS],
              "wait found: mean", "median", "p90"]
    out = []
    for r in rows:
        out.append([r["model"], r["steps"], f"{r['kernels'] / r['steps']:.0f}",
                    f"{r['kernel_p50_us']:.0f} us", f"{r['kernel_max_us'] / 1e3:.2f} ms",
                    *[f"{r[f'share_ge_{t}ms']:.2f}" for t in THRESHOLDS_MS],
                    f"{r['residual_mean_us']:.0f} us", f"{r['residual_p50_us']:.0f} us",
                    f"{r['residual_p90_us']:.0f} us"])
    text = ("Share of the trainer's GPU time in kernels at least this long, and the wait a "
            "request finds behind the kernel running when it arrives:\n\n" +
            harness.markdown_table(header, out))
    for r in rows:
        if r.get("long_kernels"):
            text += (f"\n\n{r['model']}: the kernels of 1 ms or more, by their share of its GPU "
                     "time:\n\n" + harness.markdown_table(
                         ["kernel", "a step", "mean", "share"],
                         [[f"`{k['name'][:90]}`", f"{k['per_step']:g}",
                           f"{k['mean_us'] / 1e3:.2f} ms", f"{k['share']:.3f}"]
                          for k in r["long_kernels"]]))
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="gptlm,resnet50")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cpus", default="2")
    p.add_argument("--out")
    p.add_argument("--table", metavar="ROWS_JSONL")
    args = p.parse_args(argv)
    if args.table:
        print(table(harness.read_rows(args.table, "be-kernels")))
        return
    work = tempfile.mkdtemp(prefix="orion-be-kernels-")
    out = args.out or os.environ.get("OUT") or work
    os.makedirs(out, exist_ok=True)
    rows = []
    for model in args.models.split(","):
        summary = os.path.join(work, f"{model}.json")
        proc = subprocess.run(
            harness.taskset(args.cpus) + [sys.executable, harness.MODELS, "train", model,
                                          "--steps", "1", "--profile", str(args.steps),
                                          "--profile-out", summary],
            capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"be-kernels: {model}: the trainer failed:\n{proc.stderr[-2000:]}")
        kernels = json.load(open(summary + ".kernels.json"))["kernels"]
        row = {"model": model, "steps": args.steps, "cpus": args.cpus,
               **summarize([k[1] for k in kernels]),
               "long_kernels": long_kernels(kernels, args.steps)}
        rows.append(row)
        harness.append_row(os.path.join(out, "be-kernels.jsonl"), row)
        print(json.dumps(row), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
