#!/usr/bin/env python3
"""Where a job's CPU goes, thread by thread: runs a command, and after --after seconds reads the
CPU time (user + system) of every thread of it and of its child processes from /proc, again
--window seconds later, and prints the CPU each thread name used in between (ms per second of
wall time), then stops the command. Threads are grouped by name (`comm`): the interposer's
completion thread is "orion-poller"; PyTorch's are "python3", "pt_*", "cuda-EvtHandlr"...

  bench/thread_cpu.py [--after 8] [--window 10] [--json] -- COMMAND...

For a one-CPU pod: run the command inside its limit (taskset -c N, or a cgroup), once bare and
once under orion-run, and compare the rows.
"""
import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import time

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


def thread_cpu(pid):
    """{(pid, tid): (name, cpu_seconds)} for every thread of pid and its descendants."""
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
            except OSError:
                continue
            # comm is in parentheses and may hold spaces: split after the last ')'.
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[(p, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--after", type=float, default=8.0, help="seconds before the first reading")
    ap.add_argument("--window", type=float, default=10.0, help="seconds between the readings")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
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
    used = collections.defaultdict(float)
    threads = collections.Counter()
    for key, (name, cpu) in second.items():
        used[name] += cpu - first.get(key, (name, 0.0))[1]
        threads[name] += 1
    wall = t1 - t0
    rows = sorted(((name, used[name] / wall * 1e3, threads[name]) for name in used),
                  key=lambda r: -r[1])
    if args.json:
        print(json.dumps({"wall_s": wall, "threads": [
            {"name": n, "cpu_ms_per_s": ms, "count": c} for n, ms, c in rows]}))
        return
    print(f"| thread | threads | CPU (ms per s, over {wall:.1f} s) |\n|---|---|---|")
    for name, ms, count in rows:
        print(f"| {name} | {count} | {ms:.1f} |")
    print(f"| all | {sum(threads.values())} | {sum(r[1] for r in rows):.1f} |")


if __name__ == "__main__":
    main()
