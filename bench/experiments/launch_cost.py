"""The CPU cost of a driver launch on a GPU, with and without the interposer (C level).

  orion_bench.py launch-cost --bundle DIR [--cpus 2] [--runs 12] [--launches 5000] [--pairs 3000]
                             [--pollute KB] [--kernels N] [--baseline-interposer LIB] [--timed]
                             [--split SWITCH,...] [--paired-split SWITCH,...]
                             [--fixed-layout] [--out DIR]
  orion_bench.py launch-cost --table ROWS.jsonl

orion-bench-launch (bench/launch_cost.cc, in the bundle) times an empty kernel's launch and
each driver call a tracked launch adds (best of 5 batches, ns per launch), pinned to --cpus,
as three arms, one process each: no interposer, under orion-run registered high priority, and
registered best effort (alone on the GPU: the gate lets it through, never held), with an
orion-server on cores 0 and 1. The arms take turns --runs times, each run starting one arm later;
what the interposer adds is each arm minus the no-interposer arm of the same run, reported as
the median over runs with [min, max]: a host that drifts by hundreds of ns between minutes
moves both arms of a run alike. Rows go to launch-cost.jsonl in --out.

The paired figure resolves what a process of one core can: inside each process, groups of 64
launches through the interposer's cuLaunchKernel and through the driver's own entry point take
turns --pairs times (bench/launch_cost.cc), so both paths see the same host state; each run gives
the median difference per launch with its 95% interval. In the no-interposer arm both paths are
the driver's: its figure is the A/A control, the resolution itself. --baseline-interposer adds
two arms, high priority and best effort under that build of liborion_interpose.so, so that two
builds are compared on the same host in the same turns. --pollute KB runs the paired figure
with the caches cold: KB of memory written before every launch (untimed), each launch timed
alone, as a launch finds its caches between a framework's own work. --kernels N launches N
distinct kernels in turn, as a framework's forward pass launches each of its kernels once, so
the interposer finds each kernel's record as cold as that. --timed adds two arms,
high priority with every launch timed on the GPU (ORION_SAMPLE_EVERY_HIGH=1), held on its stream
and not (ORION_TIMING_HOLD=0): less the high-priority arm, what one timed launch costs the CPU
of the launching thread (its two event records, the hold's stream wait), past 1 in 64.
--split SWITCH,... adds a high-priority arm per switch (ORION_BENCH_SWITCH: after-registration,
before-clock, no-clock, no-launch-records, no-hp-notes, no-timing, ...): its launches cut short
or leaving one part out, so that the high-priority arm less it, in the same run, is what that
part of the path costs on this host. Each such arm is a process of its own, and a process keeps
an offset of its own for its whole run (tens to a hundred ns), so parts under about 40 ns do
not resolve that way. --paired-split SWITCH,... resolves them inside one process instead: per
switch a high-priority arm whose paired figure takes the interposer's cuLaunchKernel as usual
and with the switch set in turn (orion-bench-launch --pair-switch), so its difference is what
the part the switch leaves out costs, against the same process's state.
--fixed-layout adds the no-interposer and high-priority arms again with the address space's
randomization off (setarch -R: every process of the arm maps its libraries, stack and heap at
the same addresses): where one run of an arm reads far from another, these arms say whether the
process's layout is what moves it.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

import harness

ANSWERS = ("what a driver launch costs on the CPU with and without the interposer "
           "(orion-bench-launch, ns per launch, arms taking turns)")
ARMS = ("no interposer", "high priority", "best effort")
BASELINE_ARMS = ("high priority, baseline", "best effort, baseline")
TIMED_ARMS = ("high priority, every launch timed", "high priority, every launch timed, not held")
SPLIT_ARM = "high priority, "  # + harness.bench_switch_part(name): a --split arm
FIXED_LAYOUT_ARMS = ("no interposer, fixed layout", "high priority, fixed layout")
PAIRED_SPLIT_ARM = "high priority against itself without "  # + bench_switch_part(name)


def split_arms(rows):
    """The --split arms in `rows` (their rows name the switch), in the order they first appear."""
    return list(dict.fromkeys(r["arm"] for r in rows if "switch" in r))


def caches_label(kb, kernels):
    """How a paired figure found its caches: warm, or cold after KB written; the kernels taken
    in turn."""
    label = f"cold ({kb} KB written before each launch)" if kb else "warm"
    return label + (f", {kernels} kernels in turn" if kernels > 1 else "")


def paired_table(rows):
    """Per arm (and caches warm or cold): what the interposer's launch adds inside one process,
    median over runs."""
    out = []
    shapes = sorted({(r.get("pollute_kb", 0), r.get("kernels", 1)) for r in rows})
    for kb, kernels in shapes:
        for arm in ARMS + BASELINE_ARMS + TIMED_ARMS + FIXED_LAYOUT_ARMS + tuple(split_arms(rows)):
            mine = [r for r in rows if r["arm"] == arm and r.get("pollute_kb", 0) == kb
                    and r.get("kernels", 1) == kernels]
            if not mine:
                continue
            out.append([arm, caches_label(kb, kernels),
                        f"{statistics.median(r['driver_ns'] for r in mine):.0f} ns"]
                       + over_runs(mine))
    return harness.markdown_table(
        ["arm", "caches", "driver entry (median)", "interposer adds: median [min, max] over runs"]
        + OVER_RUNS_HEADINGS, out)


# The columns over_runs fills, after the figure's own.
OVER_RUNS_HEADINGS = ["95% interval of the median over runs (bootstrap)",
                      "95% interval of one run (median)", "pairs a run", "runs"]


def over_runs(mine):
    """One arm's paired rows over its runs: the addition's median [min, max], then the
    OVER_RUNS_HEADINGS columns."""
    halves = [(r["ci_high"] - r["ci_low"]) / 2 for r in mine]
    return [harness.spread([r["adds_ns"] for r in mine], digits=0, suffix=" ns"),
            harness.median_interval([r["adds_ns"] for r in mine], digits=0) + " ns",
            f"+-{statistics.median(halves):.0f} ns", str(mine[0]["pairs"]), str(len(mine))]


def against_baseline_table(rows):
    """With --baseline-interposer: per arm, this build's addition less the baseline build's in
    the same run (the two builds met the same host state), median over runs; "" without."""
    return same_run_table(rows, list(zip(ARMS[1:], BASELINE_ARMS)),
                          "this build less the baseline, same run: median [min, max]")


def split_table(rows):
    """With --split: per switch, the high-priority arm less the arm that cuts that part out in the
    same run: the part's cost, median over runs; "" without."""
    return same_run_table(rows, [(ARMS[1], a) for a in split_arms(rows)],
                          "high priority less this arm, same run: median [min, max]",
                          first="the path without")


def same_run_table(rows, pairs, heading, first="arm"):
    """Per (arm, other) of `pairs` and caches: arm's paired addition less other's in the same
    run, median over runs (the first column names arm, or with first= the other); "" if no
    run has both."""
    out = []
    shapes = sorted({(r.get("pollute_kb", 0), r.get("kernels", 1)) for r in rows})
    for kb, kernels in shapes:
        others = {other for _, other in pairs}
        mine = [r for r in rows if r.get("pollute_kb", 0) == kb and r.get("kernels", 1) == kernels
                and r["arm"] in others.union(arm for arm, _ in pairs)]
        if not any(r["arm"] in others for r in mine):
            continue  # none of the other arms ran with these caches
        by_run = {}
        for r in mine:
            arms = by_run.setdefault(r["run"], {})
            if r["arm"] in arms:  # two invocations' rows in one file: runs would mix
                sys.exit(f"launch-cost: run {r['run']} has two rows of {r['arm']!r}; "
                         "keep each invocation's rows in a file of its own")
            arms[r["arm"]] = r["adds_ns"]
        for arm, base in pairs:
            diffs = [a[arm] - a[base] for a in by_run.values() if arm in a and base in a]
            if not diffs:
                continue
            name = arm if first == "arm" else base.removeprefix(SPLIT_ARM)
            out.append([name, caches_label(kb, kernels), harness.spread(diffs, digits=0, suffix=" ns"),
                        harness.median_interval(diffs, digits=0) + " ns", str(len(diffs))])
    if not out:
        return ""
    return harness.markdown_table(
        [first, "caches", heading, "95% interval of the median (bootstrap)", "runs"], out)


def paired_split_table(rows):
    """With --paired-split: per switch and caches, the part's cost inside one process (the
    interposer as usual less the interposer with the switch set, group by group), median over
    runs; "" without."""
    out = []
    shapes = sorted({(r.get("pollute_kb", 0), r.get("kernels", 1)) for r in rows})
    for kb, kernels in shapes:
        for name in dict.fromkeys(r["pair_switch"] for r in rows if "pair_switch" in r):
            mine = [r for r in rows if r.get("pair_switch") == name
                    and r.get("pollute_kb", 0) == kb and r.get("kernels", 1) == kernels]
            if not mine:
                continue
            out.append([harness.bench_switch_part(name), caches_label(kb, kernels)]
                       + over_runs(mine))
    if not out:
        return ""
    return harness.markdown_table(
        ["the path without", "caches",
         "high priority less this, inside one process: median [min, max] over runs"]
        + OVER_RUNS_HEADINGS, out)


def table(rows):
    """Per variant: the no-interposer cost and each interposed arm's paired difference; then the
    paired figure, this build against the baseline build where one ran, and the parts."""
    paired = [r for r in rows if r["variant"] == "paired"]
    rows = [r for r in rows if r["variant"] != "paired"]
    text = paired_table(paired) if paired else ""
    for extra in (against_baseline_table(paired), split_table(paired),
                  paired_split_table(paired)):
        if extra:
            text += "\n\n" + extra
    if not rows:
        return text
    return table_of_variants(rows) + ("\n\n" + text if text else "")


def table_of_variants(rows):
    runs = {}
    for r in rows:
        runs.setdefault((r["run"], r["variant"]), {})[r["arm"]] = r["ns"]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    out = []
    for v in variants:
        paired = [arms for (run, var), arms in runs.items() if var == v and ARMS[0] in arms]
        cells = [v, f"{statistics.median(a[ARMS[0]] for a in paired):.0f} ns"]
        for arm in ARMS[1:]:
            diffs = [a[arm] - a[ARMS[0]] for a in paired if arm in a]
            cells.append(harness.spread(diffs, digits=0, suffix=" ns") if diffs else "-")
        cells.append(str(len(paired)))
        out.append(cells)
    return harness.markdown_table(
        ["variant", "no interposer (median)", "high priority adds", "best effort adds", "runs"],
        out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle")
    p.add_argument("--cpus", default="2")
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--launches", type=int, default=5000)
    p.add_argument("--pairs", type=int, default=3000)
    p.add_argument("--pollute", type=int, default=0, metavar="KB",
                   help="the paired figure with KB of memory written before every launch")
    p.add_argument("--kernels", type=int, default=1, metavar="N",
                   help="the paired figure launching N distinct kernels in turn")
    p.add_argument("--baseline-interposer", metavar="LIB",
                   help="another build of liborion_interpose.so, as two more arms")
    p.add_argument("--timed", action="store_true",
                   help="two more arms: high priority with every launch timed, held and not")
    p.add_argument("--split", metavar="SWITCH,...", default="",
                   help="a high-priority arm per ORION_BENCH_SWITCH name (e.g. after-registration,"
                        "before-clock,no-clock): what each part of the path costs")
    p.add_argument("--paired-split", metavar="SWITCH,...", default="",
                   help="a high-priority arm per ORION_BENCH_SWITCH name whose paired figure "
                        "is the interposer less itself with that switch: each part inside one "
                        "process")
    p.add_argument("--fixed-layout", action="store_true",
                   help="two more arms, no interposer and high priority, with the address space's "
                        "randomization off (setarch -R)")
    p.add_argument("--admin-port", type=int, default=50063)
    p.add_argument("--out")
    p.add_argument("--table", metavar="ROWS_JSONL")
    args = p.parse_args(argv)
    if args.table:
        print(table(harness.read_rows(args.table, "launch-cost")))
        return
    if not args.bundle:
        p.error("--bundle is required")
    split = harness.bench_switch_names(args.split, "launch-cost --split")
    paired_split = harness.bench_switch_names(args.paired_split, "launch-cost --paired-split")
    b = os.path.abspath(args.bundle)
    bench = os.path.join(b, "orion-bench-launch")
    if not os.access(bench, os.X_OK):
        sys.exit(f"launch-cost: {bench} missing; build it (bench/CMakeLists.txt, needs the CUDA "
                 f"driver headers) and bundle again: tools/bundle.sh build .bundle")
    work = tempfile.mkdtemp(prefix="orion-launch-")
    out = args.out or os.environ.get("OUT") or work
    os.makedirs(out, exist_ok=True)
    rows_path = os.path.join(out, "launch-cost.jsonl")
    log = open(os.path.join(work, "server.log"), "a")
    server = harness.Server(b, work, log, admin_port=args.admin_port,
                            prefix=harness.taskset("0,1")).start()
    env = dict(os.environ, ORION_SOCKET=server.socket)
    wraps = {ARMS[0]: [], ARMS[1]: harness.orion_run(b, "high"),
             ARMS[2]: harness.orion_run(b, "best-effort")}
    if args.baseline_interposer:
        lib = os.path.abspath(args.baseline_interposer)
        wraps[BASELINE_ARMS[0]] = harness.orion_run(b, "high", interposer=lib)
        wraps[BASELINE_ARMS[1]] = harness.orion_run(b, "best-effort", interposer=lib)
    if args.timed:
        every = ["env", "ORION_SAMPLE_EVERY_HIGH=1"]
        wraps[TIMED_ARMS[0]] = every + harness.orion_run(b, "high")
        wraps[TIMED_ARMS[1]] = every + ["ORION_TIMING_HOLD=0"] + harness.orion_run(b, "high")
    if args.fixed_layout:
        fixed = ["setarch", "-R"]
        if subprocess.run(fixed + ["true"], capture_output=True).returncode != 0:
            sys.exit("launch-cost: --fixed-layout: setarch -R failed here (the randomization "
                     "cannot be turned off for a process on this host)")
        wraps[FIXED_LAYOUT_ARMS[0]] = fixed
        wraps[FIXED_LAYOUT_ARMS[1]] = fixed + harness.orion_run(b, "high")
    switch_of = {}
    for name in split:
        arm = SPLIT_ARM + harness.bench_switch_part(name)
        switch_of[arm] = name
        word = harness.write_bench_switch(os.path.join(work, f"switch-{name}"), name)
        wraps[arm] = ["env", f"ORION_BENCH_SWITCH={word}"] + harness.orion_run(b, "high")
    pair_switch_of, bench_args = {}, {}
    for name in paired_split:
        arm = PAIRED_SPLIT_ARM + harness.bench_switch_part(name)
        pair_switch_of[arm] = name
        word = os.path.join(work, f"pair-switch-{name}")
        with open(word, "wb") as f:
            f.write(bytes(4))  # as usual until orion-bench-launch sets it for a group
        wraps[arm] = ["env", f"ORION_BENCH_SWITCH={word}"] + harness.orion_run(b, "high")
        bench_args[arm] = ["--pair-switch", str(harness.BENCH_SWITCHES[name][0])]
    rows = []
    try:
        for run in range(1, args.runs + 1):
            for arm in harness.rotated(tuple(wraps), run - 1):
                text = subprocess.run(
                    harness.taskset(args.cpus) + wraps[arm] + [
                        bench, "--launches", str(args.launches), "--pairs", str(args.pairs),
                        "--pollute", str(args.pollute), "--kernels", str(args.kernels)]
                    + bench_args.get(arm, []),
                    env=env, check=True, capture_output=True, text=True).stdout
                for m in re.finditer(r"^(.+?)\s+ns_per_(?:launch|call)=(\d+)", text, re.M):
                    row = {"run": run, "arm": arm, "variant": m.group(1).strip(),
                           "ns": int(m.group(2)), "cpus": args.cpus}
                    rows.append(row)
                    harness.append_row(rows_path, row)
                m = re.search(r"^paired (.+)$", text, re.M)
                if m:
                    fields = dict(kv.split("=") for kv in m.group(1).split())
                    row = {"run": run, "arm": arm, "variant": "paired", "cpus": args.cpus,
                           **({"switch": switch_of[arm]} if arm in switch_of else {}),
                           **({"pair_switch": pair_switch_of[arm]}
                              if arm in pair_switch_of else {}),
                           **{k: float(v) for k, v in fields.items()
                              if k not in ("pairs", "pollute_kb", "kernels", "pair_switch")},
                           "pairs": int(fields["pairs"]),
                           "pollute_kb": int(fields.get("pollute_kb", 0)),
                           "kernels": int(fields.get("kernels", 1))}
                    rows.append(row)
                    harness.append_row(rows_path, row)
            print(f"run {run} of {args.runs} done", flush=True)
    finally:
        server.stop()
    print(table(rows))
