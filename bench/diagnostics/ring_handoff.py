"""What a launch event's push into the event ring costs the launching thread where the ring's
reader (orion-server's drain loop) runs on another core, with and without the next entry
prefetched for writing (CPU only: orion-bench-ring, bench/ring_handoff.cc).

  orion_bench.py ring-handoff [--bundle .bundle | --build build] [--rounds 5]
                              [--producer-cpu 2] [--consumer-cpus 3,8] [--gap-us 4]
                              [--label L] [--out ROWS.jsonl]
  orion_bench.py ring-handoff --table ROWS.jsonl...

Each round runs orion-bench-ring once per consumer CPU (one process a run, its three arms
taking turns in blocks of 256 pushes). A row is one arm of one run: the push and the next locked
instruction after it, in ns (p50, p90, p99, mean), and the mean over the run's no-push arm (the
timer's and the locked instruction's own cost; a mean, so one interrupt in an arm moves it by
about a nanosecond). The table gives, per consumer CPU, the median over rounds of that excess for
the push alone and with the prefetch, and their difference with its bootstrap interval.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

import harness

ANSWERS = ("what a launch event's push costs its thread with the ring's reader on another core, "
           "with and without the next entry prefetched (CPU only)")

PUSH, PREFETCHED = "push", "push, next entry prefetched"


def table(rows):
    out = []
    keys = sorted({(r.get("label", ""), r["consumer_cpu"]) for r in rows})
    for label, cpu in keys:
        runs = {}
        for r in rows:
            if (r.get("label", ""), r["consumer_cpu"]) == (label, cpu):
                runs.setdefault(r["round"], {})[r["arm"]] = r
        full = [v for v in runs.values() if PUSH in v and PREFETCHED in v]
        if not full:
            continue
        push = [v[PUSH]["mean_over_no_push_ns"] for v in full]
        pre = [v[PREFETCHED]["mean_over_no_push_ns"] for v in full]
        diff = [b - a for a, b in zip(push, pre)]
        p99 = [v[PUSH]["p99_ns"] for v in full], [v[PREFETCHED]["p99_ns"] for v in full]
        out.append([label, f"{full[0][PUSH]['producer_cpu']} -> {cpu}", len(full),
                    harness.spread(push, 1, " ns"), harness.spread(pre, 1, " ns"),
                    harness.spread(diff, 1, " ns"), harness.median_interval(diff, digits=1),
                    f"{statistics.median(p99[0]):.0f} / {statistics.median(p99[1]):.0f} ns"])
    return harness.markdown_table(
        ["machine", "producer -> reader CPU", "runs", "push adds (mean): median [min, max]",
         "prefetched push adds", "prefetch changes it by", "95% interval (bootstrap)",
         "p99 push / prefetched (median)"], out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", help="a bundle (tools/bundle.sh) holding orion-bench-ring")
    p.add_argument("--build", default=os.path.join(harness.ROOT, "build"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pushes", type=int, default=60000)
    p.add_argument("--gap-us", type=float, default=4.0)
    p.add_argument("--producer-cpu", type=int, default=2)
    p.add_argument("--consumer-cpus", default="3",
                   help="comma-separated CPUs for the reader, one run each a round")
    p.add_argument("--label", default=platform.node())
    p.add_argument("--out", help="append the rows to this JSONL file")
    p.add_argument("--table", nargs="+", metavar="ROWS_JSONL",
                   help="print the table of rows files (machines side by side) and exit")
    args = p.parse_args(argv)
    if args.table:
        print(table([r for path in args.table for r in harness.read_rows(path, "ring-handoff")]))
        return 0
    binary = (os.path.join(args.bundle, "orion-bench-ring") if args.bundle
              else os.path.join(args.build, "bench/orion-bench-ring"))
    if not os.path.exists(binary):
        sys.exit(f"ring-handoff: missing {binary} (cmake --build, tools/bundle.sh)")
    try:
        cpus = [int(c) for c in args.consumer_cpus.split(",")]
    except ValueError:
        sys.exit(f"ring-handoff: --consumer-cpus {args.consumer_cpus!r}: CPUs separated by commas")
    rows = []
    for rnd in range(1, args.rounds + 1):
        for cpu in harness.rotated(cpus, rnd):
            r = subprocess.run([binary, "--pushes", str(args.pushes), "--gap-us", str(args.gap_us),
                                "--producer-cpu", str(args.producer_cpu),
                                "--consumer-cpu", str(cpu)], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"ring-handoff: {binary} exit {r.returncode}: {r.stderr.strip()}"
                         + (" (--producer-cpu and --consumer-cpus name CPUs this process may "
                            "use)" if r.returncode == 2 else ""))
            for line in r.stdout.splitlines():
                row = dict(json.loads(line), round=rnd, label=args.label)
                rows.append(row)
                if args.out:
                    harness.append_row(args.out, row)
    print(table(rows))
    return 0
