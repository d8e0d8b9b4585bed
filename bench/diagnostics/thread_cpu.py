"""Where a job's CPU goes, thread by thread: runs a command, and after --after seconds reads the
CPU time (user + system) and the context switches of every thread of it and of its child
processes from /proc, again --window seconds later, and prints what each thread name used in
between (CPU in ms per second of wall time; wake-ups, the voluntary context switches, and
preemptions, the involuntary ones, per second; and the time it was runnable but waited for a
CPU, from /proc/.../schedstat, in ms per second: what other threads on its core took from it),
then stops the command. Threads are grouped by
name (`comm`): the interposer's completion thread is "orion-poller"; PyTorch's are "python3",
"pt_*", "cuda-EvtHandlr"...

  orion_bench.py thread-cpu [--after 8] [--window 10] [--json] [--tag KEY=VALUE]... -- COMMAND...
  orion_bench.py thread-cpu --table runs.jsonl [--threads orion-poller,python3]

For a one-CPU pod: run the command inside its limit (taskset -c N, or a cgroup), once bare and
once under orion-run, and compare the rows. --json prints one line (JSONL when appended to a
file), with the --tag pairs as its fields; --table renders such lines: one row per arm (the runs
with the same tags but "round"), with the threads named by --threads (default orion-poller) and
the whole process, median [min, max] over the arm's rounds.
"""
import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from harness import read_rows

ANSWERS = ("where a job's CPU goes, thread by thread (the interposer's orion-poller apart): "
           "CPU and wake-ups per second of each thread name, from /proc")

TICK = os.sysconf("SC_CLK_TCK")


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def context_switches(path):
    """(voluntary, involuntary) context switches from a /proc .../status file."""
    vol = invol = 0
    with open(path) as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                invol = int(line.split()[1])
    return vol, invol


def run_queue_seconds(path):
    """Seconds a thread waited on a run queue (runnable, not running), from its schedstat
    ("on-CPU ns, run-queue ns, timeslices"); 0 where the kernel keeps no schedstats."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def thread_cpu(pid):
    """{(pid, tid): (name, cpu_seconds, voluntary, involuntary, run_queue_seconds)} for every
    thread of pid and its descendants."""
    out = {}
    for p in descendants(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/stat") as f:
                    stat = f.read()
                vol, invol = context_switches(f"/proc/{p}/task/{tid}/status")
            except OSError:
                continue
            # comm is in parentheses and may hold spaces: split after the last ')'.
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[(p, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / TICK, vol, invol,
                                  run_queue_seconds(f"/proc/{p}/task/{tid}/schedstat"))
    return out


def per_name(first, second, wall):
    """[{name, count, cpu_ms_per_s, wakes_per_s, preempted_per_s, run_queue_ms_per_s}] between
    two readings, the busiest first. A thread that is in the second reading only counts from
    zero."""
    sums = collections.defaultdict(lambda: [0.0, 0, 0, 0, 0.0])
    for key, (name, cpu, vol, invol, runq) in second.items():
        _, cpu0, vol0, invol0, runq0 = first.get(key, (name, 0.0, 0, 0, 0.0))
        row = sums[name]
        row[0] += cpu - cpu0
        row[1] += vol - vol0
        row[2] += invol - invol0
        row[3] += 1
        row[4] += runq - runq0
    rows = [{"name": n, "count": c, "cpu_ms_per_s": cpu / wall * 1e3, "wakes_per_s": vol / wall,
             "preempted_per_s": invol / wall, "run_queue_ms_per_s": runq / wall * 1e3}
            for n, (cpu, vol, invol, c, runq) in sums.items()]
    return sorted(rows, key=lambda r: -r["cpu_ms_per_s"])


def spread(values, fmt):
    """median [min, max] of a group's runs; the value alone for one run."""
    if len(values) == 1:
        return fmt.format(values[0])
    return (fmt.format(statistics.median(values)) + " [" + fmt.format(min(values)) + ", "
            + fmt.format(max(values)) + "]")


def render_table(runs, names):
    """One row per group of runs with the same tags but "round" (the repeats of one arm): for
    each thread name in `names` and for the whole process ("all"), its CPU, wake-ups and
    preemptions per second, median [min, max] over the group's runs ("-": no such thread)."""
    tags = []
    for run in runs:
        tags += [k for k in run if k not in ("wall_s", "threads", "round") and k not in tags]
    groups = {}
    for run in runs:
        groups.setdefault(tuple(str(run.get(t, "")) for t in tags), []).append(run)
    head = tags + ["runs"]
    metrics = [("cpu_ms_per_s", "{:.1f}", "CPU (ms per s)"), ("wakes_per_s", "{:.0f}", "wake-ups per s"),
               ("preempted_per_s", "{:.0f}", "preempted per s")]
    # Runs recorded before the run-queue time was read have no such column.
    if any("run_queue_ms_per_s" in r for run in runs for r in run["threads"]):
        metrics.append(("run_queue_ms_per_s", "{:.2f}", "waited for a CPU (ms per s)"))
    for name in names + ["all"]:
        head += [f"{name} {label}" for _, _, label in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, group in groups.items():
        cells = list(key) + [str(len(group))]
        for name in names + ["all"]:
            for metric, fmt, _ in metrics:
                values = []
                for run in group:
                    rows = [r for r in run["threads"] if (name == "all" or r["name"] == name)
                            and metric in r]
                    if rows:
                        values.append(sum(r[metric] for r in rows))
                cells.append(spread(values, fmt) if values else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--after", type=float, default=8.0, help="seconds before the first reading")
    ap.add_argument("--window", type=float, default=10.0, help="seconds between the readings")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                    help="a field of the --json line (repeatable)")
    ap.add_argument("--table", metavar="JSONL", help="render the --json lines of a file")
    ap.add_argument("--threads", default="orion-poller",
                    help="thread names that get a row in --table (comma-separated)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.table:
        runs = read_rows(args.table, "thread-cpu", check=lambda run: None if isinstance(
            run.get("threads"), list) else 'no "threads" list')
        print(render_table(runs, [n for n in args.threads.split(",") if n]))
        return
    tags = {}
    for tag in args.tag:
        key, eq, value = tag.partition("=")
        if not eq or not key or key in ("wall_s", "threads"):
            ap.error(f"--tag {tag!r}: expected KEY=VALUE (not wall_s or threads)")
        tags[key] = value
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("a command to run is required (after --)")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(args.after)
        if proc.poll() is not None:
            sys.exit(f"thread_cpu: the command ended (exit {proc.returncode}) before the first reading")
        t0, first = time.monotonic(), thread_cpu(proc.pid)
        time.sleep(args.window)
        t1, second = time.monotonic(), thread_cpu(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    wall = t1 - t0
    rows = per_name(first, second, wall)
    if args.json:
        print(json.dumps({**tags, "wall_s": wall, "threads": rows}))
        return
    print(f"| thread | threads | CPU (ms per s, over {wall:.1f} s) | wake-ups per s | "
          "preempted per s |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['count']} | {r['cpu_ms_per_s']:.1f} | {r['wakes_per_s']:.0f} | "
              f"{r['preempted_per_s']:.0f} |")
    print(f"| all | {sum(r['count'] for r in rows)} | {sum(r['cpu_ms_per_s'] for r in rows):.1f} | "
          f"{sum(r['wakes_per_s'] for r in rows):.0f} | "
          f"{sum(r['preempted_per_s'] for r in rows):.0f} |")
