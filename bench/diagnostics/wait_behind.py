"""What each request of a service waited behind on the GPU: the trainer's kernel running when it
was launched, the trainer's kernels that started after it, and the GPU idle between them.

  orion_bench.py wait-behind PROFILES_DIR [PROFILES_DIR ...] [--labels A,B,..] [--out ROWS.jsonl]
  orion_bench.py wait-behind --table ROWS.jsonl

PROFILES_DIR: profiles/ of `orion_bench.py timeline --together --keep-profiles` (service.json,
service.kernels.json, trainer.json, trainer.kernels.json: both processes under torch.profiler in
the same window, the service's requests at their Poisson arrivals). Per request, from the
service's own profile: L, its first launch (the first launch call inside its ProfilerStep), and
S, the start of its first kernel; the wait is S - L. The trainer's kernels are placed on the
service's clock through the system clock: each process's offset is the median, over its
iterations, of the previous iteration's end (time.time_ns, right before prof.step()) against
the profiler's start of the next ProfilerStep, the same small lag in both processes, so it
cancels (two processes on one host read about 30 us apart). A process with one iteration in the
window (a trainer that stalled) is placed through its NVTX pushes instead (mono_offset_us of
the kernels' summary: the host clock less the profiler's), to within tens of microseconds. The
wait is split into
  running  what was left of the trainer kernel running at L;
  queued   the trainer's kernels that started after L and before S (work already queued, or
           admitted, when the request came);
  idle     the rest: nothing of the trainer's on the GPU, the request still not started (the
           GPU's switch between contexts, the launch's own latency).
One JSON row per directory: the medians and p90s of each part, the share of requests that found
a trainer kernel running, and the trainer's kernels that took the most of the waits, by name.
"""
import argparse
import bisect
import json
import os
import statistics
import sys

from harness import append_row, markdown_table, quantile, read_rows

ANSWERS = ("what each request waited behind on the GPU (the trainer's running kernel, its "
           "queued kernels, the switch), from two profiles of one window")


def load(directory):
    with open(os.path.join(directory, "service.json")) as f:
        summary = json.load(f)
    with open(os.path.join(directory, "service.kernels.json")) as f:
        service = json.load(f)
    with open(os.path.join(directory, "trainer.kernels.json")) as f:
        trainer = json.load(f)
    with open(os.path.join(directory, "trainer.json")) as f:
        trainer_summary = json.load(f)
    return summary, service, trainer, trainer_summary


def clock_offset(summary):
    """The process's system clock minus its profiler clock (us), from step ends and starts;
    None for a profile of fewer than two iterations."""
    steps = summary["steps"]
    if len(steps) < 2:
        return None
    return statistics.median(steps[i - 1]["pop_ns"] / 1e3 - steps[i]["torch_ts_us"]
                             for i in range(1, len(steps)))


def requests(summary, service):
    """[(L, S)] of each request on the service's profiler clock."""
    launches = sorted(l[0] for l in service["launches"])
    out = []
    for st in summary["steps"]:
        if st.get("torch_gpu_start_us") is None:
            continue
        i = bisect.bisect_left(launches, st["torch_ts_us"])
        if i == len(launches) or launches[i] > st["torch_ts_us"] + st["torch_dur_us"]:
            continue
        out.append((launches[i], st["torch_gpu_start_us"]))
    if not out:
        raise SystemExit("wait-behind: no request of the service's profile has a launch and a "
                         "kernel")
    return out


def split(directory):
    summary, service, trainer, trainer_summary = load(directory)
    reqs = requests(summary, service)
    # The trainer's kernels on the service's clock: through the step ends where both have two
    # iterations or more, else through the NVTX pushes (the monotonic clock).
    ends = clock_offset(trainer_summary), clock_offset(summary)
    if None not in ends:
        shift, clock = ends[0] - ends[1], "step ends"
    elif "mono_offset_us" in trainer and "mono_offset_us" in service:
        shift, clock = trainer["mono_offset_us"] - service["mono_offset_us"], "pushes"
    else:
        raise SystemExit(f"wait-behind: {directory}: a profile of fewer than two iterations "
                         "and no push offsets")
    kernels = sorted((k[0] + shift, k[0] + shift + k[1], k[9]) for k in trainer["kernels"])
    starts = [k[0] for k in kernels]
    lo, hi = starts[0], max(k[1] for k in kernels)
    rows, by_name = [], {}
    for launch, start in reqs:
        if not lo <= launch <= hi:
            continue  # outside the trainer's window
        wait = max(0.0, start - launch)
        running = queued = 0.0
        found = False
        j = bisect.bisect_right(starts, launch)
        # The kernel running at L: the latest that started before it and had not ended (one
        # stream's kernels do not overlap; look back a few in case of several streams).
        for k in kernels[max(0, j - 4):j]:
            if k[1] > launch:
                part = min(k[1], start) - launch
                running = max(running, part)
                found = True
                by_name[k[2]] = by_name.get(k[2], 0.0) + max(0.0, part)
        covered = running
        while j < len(kernels) and kernels[j][0] < start:
            k = kernels[j]
            part = min(k[1], start) - max(k[0], launch + covered)
            if part > 0:
                queued += part
                covered += part
                by_name[k[2]] = by_name.get(k[2], 0.0) + part
            j += 1
        running, queued = min(running, wait), min(queued, max(0.0, wait - running))
        rows.append((wait, running, queued, max(0.0, wait - running - queued), found))
    if not rows:
        raise SystemExit(f"wait-behind: {directory}: no request inside the trainer's window")

    def q(values, p):
        return round(quantile(sorted(values), p), 1)
    out = {"dir": directory, "requests": len(rows),
           "found_running": round(sum(r[4] for r in rows) / len(rows), 3),
           "clock_shift_us": round(shift, 1), "clock": clock}
    for i, name in enumerate(("wait", "running", "queued", "idle")):
        vals = [r[i] for r in rows]
        out[f"{name}_mean_us"] = round(statistics.fmean(vals), 1)
        out[f"{name}_p50_us"] = q(vals, 0.5)
        out[f"{name}_p90_us"] = q(vals, 0.9)
    total = sum(r[0] for r in rows) or 1.0
    out["top"] = [{"name": n[:120], "share_of_wait": round(t / total, 3)}
                  for n, t in sorted(by_name.items(), key=lambda kv: -kv[1])[:8]]
    return out


def table(rows):
    header = ["window", "requests", "found running", "wait: mean", "p50", "p90",
              "running: mean", "queued: mean", "idle: mean", "idle p50"]
    lines = [markdown_table(header, [[
        r.get("label", r["dir"]), r["requests"], f"{r['found_running']:.2f}",
        f"{r['wait_mean_us']:.0f} us", f"{r['wait_p50_us']:.0f} us", f"{r['wait_p90_us']:.0f} us",
        f"{r['running_mean_us']:.0f} us", f"{r['queued_mean_us']:.0f} us",
        f"{r['idle_mean_us']:.0f} us", f"{r['idle_p50_us']:.0f} us"] for r in rows])]
    for r in rows:
        lines += ["", f"{r.get('label', r['dir'])}: the trainer's kernels by their share of the "
                  "waits", "", markdown_table(["kernel", "share"], [
                      [f"`{t['name']}`", f"{t['share_of_wait']:.3f}"] for t in r["top"]])]
    return "\n".join(lines)


def main(argv):
    p = argparse.ArgumentParser(prog="orion_bench.py wait-behind")
    p.add_argument("dirs", nargs="*")
    p.add_argument("--labels", help="a name for each directory's row, comma-separated")
    p.add_argument("--out")
    p.add_argument("--table")
    args = p.parse_args(argv)
    if args.table:
        print(table(read_rows(args.table, "wait-behind")))
        return 0
    if not args.dirs:
        p.error("give profile directories, or --table")
    rows = [split(d) for d in args.dirs]
    labels = args.labels.split(",") if args.labels else []
    if labels and len(labels) != len(rows):
        p.error("--labels: one name for each directory")
    for row, label in zip(rows, labels):
        row["label"] = label
    for row in rows if args.out else ():
        append_row(args.out, row)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
