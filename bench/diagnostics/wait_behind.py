"""What each request of a service waited behind on the GPU: the trainers' kernels running when it
was launched, the trainers' kernels that started after it, and the GPU idle between them.

  orion_bench.py wait-behind PROFILES_DIR [PROFILES_DIR ...] [--labels A,B,..] [--out ROWS.jsonl]
  orion_bench.py wait-behind --table ROWS.jsonl

PROFILES_DIR: profiles/ of `orion_bench.py timeline --together --keep-profiles` (service.json,
service.kernels.json, trainer.json, trainer.kernels.json: both processes under torch.profiler in
the same window, the service's requests at their Poisson arrivals; with a trainer group,
`--trainer A+B`, also trainer2.json and trainer2.kernels.json, and trainers.json naming them).
Per request, from the service's own profile: L, its first launch (the first launch call inside
its ProfilerStep), and S, the start of its first kernel; the wait is S - L. A trainer's kernels
are placed on the service's clock through the system clock: each process's offset is the
median, over its iterations, of the previous iteration's end (time.time_ns, right before
prof.step()) against the profiler's start of the next ProfilerStep, the same small lag in both
processes, so it cancels (two processes on one host read about 30 us apart). A process with one
iteration in the window (a trainer that stalled) is placed through its NVTX pushes instead
(mono_offset_us of the kernels' summary: the host clock less the profiler's), to within tens
of microseconds. Only requests inside every trainer's window count. The wait is split into
  running  what was left of a trainer kernel running at L;
  queued   the trainers' kernels that started after L and before S (work already queued, or
           admitted, when the request came);
  idle     the rest: nothing of a trainer's on the GPU, the request still not started (the
           GPU's switch between contexts, the launch's own latency).
Where kernels overlap (several streams, or trainers), each moment of the wait counts once, for
the kernel that started first. One JSON row per directory: the means, medians and p90s of each
part, the share of requests that found a trainer kernel running, the trainers' kernels that took
the most of the waits, by name, and with a group each trainer's part and the share of requests
that waited behind work of two trainers or more.
"""
import argparse
import bisect
import json
import os
import re
import statistics
import sys

from harness import append_row, markdown_table, quantile, read_rows

ANSWERS = ("what each request waited behind on the GPU (the trainers' running kernels, their "
           "queued kernels, the switch), from profiles of one window")


def trainer_roles(directory):
    """The trainers' profile names in `directory` (trainer, trainer2, ...) and what each ran."""
    if not os.path.isdir(directory):
        raise SystemExit(f"wait-behind: {directory}: not a folder of profiles")
    roles = sorted((m.group(1) for f in os.listdir(directory)
                    if (m := re.fullmatch(r"(trainer\d*)\.kernels\.json", f))),
                   key=lambda r: int(r[len("trainer"):] or 1))
    if not roles:
        raise SystemExit(f"wait-behind: {directory}: no trainer.kernels.json")
    names = {}
    if os.path.exists(os.path.join(directory, "trainers.json")):
        with open(os.path.join(directory, "trainers.json")) as f:
            names = json.load(f)
    out, seen = [], {}
    for r in roles:  # a model named twice: resnet50, resnet50#2
        name = str(names.get(r, r))
        seen[name] = seen.get(name, 0) + 1
        out.append((r, name if seen[name] == 1 else f"{name}#{seen[name]}"))
    return out


def load(directory):
    """The service's summary and kernels, and [(name, kernels, summary)] of each trainer."""
    def read(name):
        with open(os.path.join(directory, name)) as f:
            return json.load(f)
    trainers = [(name, read(f"{role}.kernels.json"), read(f"{role}.json"))
                for role, name in trainer_roles(directory)]
    return read("service.json"), read("service.kernels.json"), trainers


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


def place(directory, name, trainer, trainer_summary, summary, service):
    """The trainer's shift onto the service's clock (us) and how it was found: through the step
    ends where both have two iterations or more, else through the NVTX pushes (monotonic)."""
    ends = clock_offset(trainer_summary), clock_offset(summary)
    if None not in ends:
        return ends[0] - ends[1], "step ends"
    if "mono_offset_us" in trainer and "mono_offset_us" in service:
        return trainer["mono_offset_us"] - service["mono_offset_us"], "pushes"
    raise SystemExit(f"wait-behind: {directory}: {name}: a profile of fewer than two iterations "
                     "and no push offsets")


def parts_of_wait(timelines, launch, start):
    """[(trainer, kernel name, running?, microseconds)] of the wait [launch, start), and whether
    a trainer kernel was running at the launch: each moment once, for the kernel that started
    first. `timelines`: each trainer's kernels (start, end, name, trainer) sorted by start, with
    their starts; a kernel that started at or before the launch is running, one after it queued.
    """
    pieces, found = [], False
    for kernels, starts in timelines:
        j = bisect.bisect_right(starts, launch)
        # Its kernels running at L started before it: look back a few (several streams).
        for k in kernels[max(0, j - 4):j]:
            if k[1] > launch:
                pieces.append(k)
                found = True
        while j < len(kernels) and kernels[j][0] < start:
            pieces.append(kernels[j])
            j += 1
    out, covered = [], launch
    for k0, k1, name, who in sorted(pieces):
        lo, hi = max(k0, covered), min(k1, start)
        if hi > lo:
            out.append((who, name, k0 <= launch, hi - lo))
            covered = hi
    return out, found


def split(directory):
    summary, service, trainers = load(directory)
    reqs = requests(summary, service)
    timelines, shifts, lo, hi = [], {}, float("-inf"), float("inf")
    for name, trainer, trainer_summary in trainers:
        shift, clock = place(directory, name, trainer, trainer_summary, summary, service)
        shifts[name] = (round(shift, 1), clock)
        mine = sorted((k[0] + shift, k[0] + shift + k[1], k[9], name) for k in trainer["kernels"])
        if not mine:
            raise SystemExit(f"wait-behind: {directory}: {name}: no kernel in its window")
        lo, hi = max(lo, mine[0][0]), min(hi, max(k[1] for k in mine))
        timelines.append((mine, [k[0] for k in mine]))
    names = [name for name, _, _ in trainers]
    rows, by_name = [], {}
    by_trainer = {n: [] for n in names}  # per request: (running, queued) of each trainer
    for launch, start in reqs:
        if not lo <= launch <= hi:
            continue  # outside a trainer's window
        wait = max(0.0, start - launch)
        each = {n: [0.0, 0.0] for n in names}  # this request's (running, queued) by trainer
        parts, found = parts_of_wait(timelines, launch, start)
        for who, kname, running, us in parts:
            each[who][0 if running else 1] += us
            key = f"{who}: {kname}" if len(names) > 1 else kname
            by_name[key] = by_name.get(key, 0.0) + us
        running = sum(m[0] for m in each.values())
        queued = sum(m[1] for m in each.values())
        behind = sum(1 for m in each.values() if m[0] + m[1] > 0)
        rows.append((wait, running, queued, max(0.0, wait - running - queued), found, behind))
        for n in names:
            by_trainer[n].append(each[n])
    if not rows:
        raise SystemExit(f"wait-behind: {directory}: no request inside the trainer's window")

    def q(values, p):
        return round(quantile(sorted(values), p), 1)
    first = shifts[names[0]]
    out = {"dir": directory, "requests": len(rows),
           "found_running": round(sum(r[4] for r in rows) / len(rows), 3),
           "clock_shift_us": first[0], "clock": first[1]}
    for i, name in enumerate(("wait", "running", "queued", "idle")):
        vals = [r[i] for r in rows]
        out[f"{name}_mean_us"] = round(statistics.fmean(vals), 1)
        out[f"{name}_p50_us"] = q(vals, 0.5)
        out[f"{name}_p90_us"] = q(vals, 0.9)
    out["wait_p99_us"] = q([r[0] for r in rows], 0.99)
    total = sum(r[0] for r in rows) or 1.0
    out["top"] = [{"name": n[:120], "share_of_wait": round(t / total, 3)}
                  for n, t in sorted(by_name.items(), key=lambda kv: -kv[1])[:8]]
    if len(names) > 1:
        out["behind_several"] = round(sum(r[5] > 1 for r in rows) / len(rows), 3)
        out["trainers"] = [{
            "name": n, "clock_shift_us": shifts[n][0], "clock": shifts[n][1],
            "running_mean_us": round(statistics.fmean(m[0] for m in by_trainer[n]), 1),
            "queued_mean_us": round(statistics.fmean(m[1] for m in by_trainer[n]), 1),
            "behind": round(sum(m[0] + m[1] > 0 for m in by_trainer[n]) / len(rows), 3),
        } for n in names]
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
        if r.get("trainers"):
            lines += ["", f"{r.get('label', r['dir'])}: each trainer's part of the waits "
                      f"({r['behind_several']:.2f} of the requests waited behind work of two "
                      "trainers or more)", "", markdown_table(
                          ["trainer", "running: mean", "queued: mean",
                           "requests with its work in the wait"],
                          [[t["name"], f"{t['running_mean_us']:.0f} us",
                            f"{t['queued_mean_us']:.0f} us", f"{t['behind']:.2f}"]
                           for t in r["trainers"]])]
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
