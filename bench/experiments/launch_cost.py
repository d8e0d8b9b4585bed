"""The CPU cost of a driver launch on a GPU, with and without the interposer (C level).

  orion_bench.py launch-cost --bundle DIR [--cpus 2] [--runs 12] [--launches 5000] [--pairs 3000]
                             [--pollute KB] [--kernels N] [--baseline-interposer LIB]
                             [--split SWITCH,...] [--paired-split SWITCH,...]
                             [--neighbor CPUS [--neighbor-mb MB]] [--out DIR]
  orion_bench.py launch-cost --table ROWS.jsonl
  orion_bench.py launch-cost --by-driver-time --table ROWS.jsonl...

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
the interposer finds each kernel's record as cold as that.
--split SWITCH,... adds a high-priority arm per switch (ORION_BENCH_SWITCH: after-registration,
before-clock, no-clock, no-launch-records, no-hp-notes, no-timing, ...): its launches cut short
or leaving one part out, so that the high-priority arm less it, in the same run, is what that
part of the path costs on this host. Each such arm is a process of its own, and the host's
speed moves over seconds (a process's figure by tens to a hundred ns between one run and the
next), so parts under about 40 ns do not resolve that way. --paired-split SWITCH,... resolves
them inside one process instead: per switch a high-priority arm whose paired figure takes the
interposer's cuLaunchKernel as usual and with the switch set in turn (orion-bench-launch
--pair-switch), so its difference is what the part the switch leaves out costs, against the
same process's state.
--segments K has each process measure its paired figure K times in a row: how far a process's
driver launch and what the interposer adds move within its life, against how far they lie apart
between processes (the table then takes each process's first segment for the others).
--memory-latency MB has each process time loads that miss after its paired figure (a chase
through 1 MB, 64 MB and MB of its own fresh memory): whether a process that launches slowly also
loads slowly.
--by-driver-time pools the paired rows of one or more runs (hosts) by the process's own driver
launch (its no-interposer path, in the same process): what the interposer adds where the driver is
fast and where it is slow (the host's state at the time, which moves over seconds: --segments).
--neighbor CPUS adds the three arms again, each beside a memory-streaming neighbor on every core of
CPUS (bench/workloads/memory_neighbor.py, two buffers of --neighbor-mb MB a core, started before
the arm's process and stopped after it), as a data loader or another tenant's job streams memory
beside a service: the arm less its alone arm, in the same run, is what the neighbor's pressure on
the shared cache and the memory adds to a launch, and whether the interposer's path pays more of
it than the driver's own.
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
SPLIT_ARM = "high priority, "  # + harness.bench_switch_part(name): a --split arm
PAIRED_SPLIT_ARM = "high priority against itself without "  # + bench_switch_part(name)
NEIGHBOR = ", beside a memory-streaming neighbor"  # ARMS[i] + NEIGHBOR: a --neighbor arm
NEIGHBOR_ARMS = tuple(arm + NEIGHBOR for arm in ARMS)
MEMORY_NEIGHBOR = os.path.join(harness.BENCH, "workloads", "memory_neighbor.py")
MAX_MEMORY_MB = 16384  # --memory-latency's largest chase (orion-bench-launch's own limit)


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
        for arm in (ARMS + BASELINE_ARMS + NEIGHBOR_ARMS
                    + tuple(split_arms(rows))):
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


def neighbor_table(rows):
    """With --neighbor: per arm, its paired figure beside the neighbor less alone in the same run
    (for the no-interposer arm, the A/A control's); "" without."""
    if not any(r["arm"] in NEIGHBOR_ARMS for r in rows):
        return ""
    rates = [r["neighbor_gb_per_s"] for r in rows if "neighbor_gb_per_s" in r]
    return same_run_table(rows, list(zip(NEIGHBOR_ARMS, ARMS)),
                          "beside the neighbor less alone, same run: median [min, max]") + (
        f"\n\nThe neighbor streamed {harness.spread(rates, digits=1, suffix=' GB/s')} on its "
        f"cores together (median [min, max] over its arms' processes)." if rates else "")


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
            out.append([name, caches_label(kb, kernels),
                        harness.spread(diffs, digits=0, suffix=" ns"),
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


# Upper edges (ns) of the driver launch bins of driver_time_table; the last bin is open.
DRIVER_TIME_EDGES = (3200, 3400, 3600, 3800, 4000)


def driver_time_bin(ns):
    """The bin's label of a driver launch of `ns`, e.g. "3.2 to 3.4 us"."""
    lower = 0
    for edge in DRIVER_TIME_EDGES:
        if ns < edge:
            return f"under {edge / 1000:.1f} us" if lower == 0 else \
                f"{lower / 1000:.1f} to {edge / 1000:.1f} us"
        lower = edge
    return f"{lower / 1000:.1f} us or more"


def driver_time_table(files):
    """--by-driver-time: per arm of ARMS and caches, the paired figures of every file in `files`
    ({path: rows}) by the process's own driver launch, binned: how many figures (a process's, or
    with --segments each segment's) and hosts, what the interposer adds (median [min, max]) and
    that as a share of the driver's launch; with rows of --memory-latency, its processes' loads
    too (the 1 MB chase after the pairs, and the one past the shared cache)."""
    rows = [dict(r, host=path) for path, mine in files.items() for r in mine
            if r.get("variant") == "paired" and r.get("arm") in ARMS]
    if not rows:
        sys.exit("launch-cost --by-driver-time: no paired rows of the three arms in "
                 + ", ".join(files))
    memory = any("memory_l2_ns" in r for r in rows)  # --memory-latency: two columns more
    bins = [driver_time_bin(edge - 1) for edge in DRIVER_TIME_EDGES]
    bins.append(driver_time_bin(DRIVER_TIME_EDGES[-1]))
    groups = {}  # (caches, arm, bin): the figures in it
    for r in rows:
        groups.setdefault((r.get("pollute_kb", 0), r.get("kernels", 1), r["arm"],
                           driver_time_bin(r["driver_ns"])), []).append(r)
    out = []
    shapes = sorted({(kb, kernels) for kb, kernels, _, _ in groups})
    for kb, kernels in shapes:
        for arm in ARMS:
            for label in bins:
                mine = groups.get((kb, kernels, arm, label))
                if not mine:
                    continue
                share = statistics.median(r["adds_ns"] / r["driver_ns"] for r in mine)
                loads = [r["memory_l2_ns"] for r in mine if "memory_l2_ns" in r]
                far = [r["memory_far_ns"] for r in mine if "memory_far_ns" in r]
                out.append([arm, caches_label(kb, kernels), label, str(len(mine)),
                            str(len({r["host"] for r in mine})),
                            harness.spread([r["adds_ns"] for r in mine], digits=0, suffix=" ns"),
                            f"{100 * share:.1f}%"]
                           + ([harness.spread(loads, digits=0, suffix=" ns") if loads else "-",
                               harness.spread(far, digits=0, suffix=" ns") if far else "-"]
                              if memory else []))
    return harness.markdown_table(
        ["arm", "caches", "the process's driver launch", "figures", "hosts",
         "interposer adds: median [min, max] over figures", "share of the driver's launch"]
        + (["a load in 1 MB (its core's cache)", "a load past the shared cache"]
           if memory else []), out)


def segments_table(rows):
    """With --segments: per arm, how far a process's driver launch and what the interposer adds
    move over its segments (the median over processes of each one's middle half: p75 - p25 of
    its segments) against how far they lie apart between processes (the range of the processes'
    medians), and how closely the two move together within a process."""
    out = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        processes = {}
        for r in rows:
            if r["arm"] == arm:
                processes.setdefault(r["run"], []).append(r)
        lives = list(processes.values())

        def moves(key):
            def middle_half(life):
                values = sorted(r[key] for r in life)
                return harness.quantile(values, 0.75) - harness.quantile(values, 0.25)
            medians = [statistics.median(r[key] for r in life) for life in lives]
            return [f"{statistics.median(middle_half(life) for life in lives):.0f} ns",
                    f"{max(medians) - min(medians):.0f} ns "
                    f"[{min(medians):.0f}, {max(medians):.0f}]"]

        together = [statistics.correlation([r["driver_ns"] for r in life],
                                           [r["adds_ns"] for r in life])
                    for life in lives if len(life) > 2 and len({r["adds_ns"] for r in life}) > 1
                    and len({r["driver_ns"] for r in life}) > 1]
        out.append([arm, str(len(lives)), str(int(statistics.median(len(l) for l in lives)))]
                   + moves("driver_ns") + moves("adds_ns")
                   + [harness.spread(together, digits=2, suffix="") if together else "-"])
    return harness.markdown_table(
        ["arm", "processes", "segments a process", "driver launch: moves within a process "
         "(median of p75 - p25 over its segments)", "between processes (range of their medians)",
         "interposer adds: moves within a process", "between processes",
         "within a process, adds and the driver's launch: correlation over its segments "
         "(median [min, max] over processes)"], out)


def table(rows):
    """Per variant: the no-interposer cost and each interposed arm's paired difference; then the
    paired figure, this build against the baseline build where one ran, and the parts."""
    paired = [r for r in rows if r["variant"] == "paired"]
    rows = [r for r in rows if r["variant"] != "paired"]
    # The --paired-split arms' "driver" half is the interposer with a switch set: not a driver's.
    segmented = [r for r in paired if "segment" in r and "pair_switch" not in r]
    paired = [r for r in paired if r.get("segment", 1) == 1]  # with --segments: the first
    text = paired_table(paired) if paired else ""
    if segmented:
        text += "\n\n" + segments_table(segmented)
    for extra in (against_baseline_table(paired), neighbor_table(paired), split_table(paired),
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


def steal_ms(cores):
    """The time (ms) the hypervisor ran something else on `cores` so far (the steal column of
    /proc/stat, summed), or None where it cannot be read."""
    ticks = harness.cpu_ticks(cores)
    return ticks[7] * 1000 // os.sysconf("SC_CLK_TCK") if ticks else None


def arm_cores(p, args):
    """--cpus as a list of cores; refused where it is not a taskset-style list."""
    try:
        return harness.cpu_list(args.cpus)
    except ValueError:
        p.error(f"--cpus {args.cpus!r}: expected cores, e.g. 2 or 2-3")


def neighbor_cores(p, args):
    """--neighbor's cores as a list (empty without), refused where one is the arms' core (the
    server's, 0 and 1, are allowed: a tenant may stream beside the server too)."""
    if not args.neighbor:
        return []
    try:
        cores = [int(c) for c in args.neighbor.split(",")]
    except ValueError:
        p.error(f"--neighbor {args.neighbor!r}: expected core numbers, e.g. 4,5,6,7")
    if set(arm_cores(p, args)).intersection(cores) or len(set(cores)) != len(cores):
        p.error(f"--neighbor {args.neighbor!r}: each core once, and not the arms' (--cpus "
                f"{args.cpus})")
    if args.neighbor_mb < 1:
        p.error(f"--neighbor-mb {args.neighbor_mb}: expected at least 1")
    return cores


def start_neighbors(cores, mb, work):
    """One memory_neighbor.py per core, each streaming before this returns."""
    procs = [subprocess.Popen(
        harness.taskset(str(core)) + [sys.executable, MEMORY_NEIGHBOR, "--mb", str(mb)],
        stdout=subprocess.PIPE, text=True, cwd=work) for core in cores]
    try:
        for core, proc in zip(cores, procs):
            if proc.stdout.readline().strip() != "ready":
                sys.exit(f"launch-cost: the memory neighbor on core {core} did not start "
                         f"(two buffers of {mb} MB)")
    except BaseException:  # interrupted or refused: none is left streaming
        stop_neighbors(procs)
        raise
    return procs


def stop_neighbors(procs):
    """Stops the neighbors; what they streamed together, GB/s (0.0 with none), and how many of
    them streamed to the end (a neighbor that died or hung says nothing)."""
    total, reported = 0.0, 0
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            out = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        m = re.search(r"gb_per_s=([0-9.]+)", out or "")
        if m:
            total += float(m.group(1))
            reported += 1
    return round(total, 1), reported


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
    p.add_argument("--split", metavar="SWITCH,...", default="",
                   help="a high-priority arm per ORION_BENCH_SWITCH name (e.g. after-registration,"
                        "before-clock,no-clock): what each part of the path costs")
    p.add_argument("--paired-split", metavar="SWITCH,...", default="",
                   help="a high-priority arm per ORION_BENCH_SWITCH name whose paired figure "
                        "is the interposer less itself with that switch: each part inside one "
                        "process")
    p.add_argument("--segments", type=int, default=1, metavar="K",
                   help="each process's paired figure K times in a row (--pairs pairs each): "
                        "how far a process's speed moves over its life")
    p.add_argument("--memory-latency", type=int, default=0, metavar="MB",
                   help="each process then times loads that miss (1 MB, 64 MB and MB): the "
                        "paired rows carry memory_l2_before_ns, memory_l2_ns, memory_shared_ns, "
                        "memory_far_ns")
    p.add_argument("--neighbor", metavar="CPUS", default="",
                   help="the three arms again beside a memory-streaming neighbor on each of "
                        "these cores (e.g. 4,5,6,7)")
    p.add_argument("--neighbor-mb", type=int, default=512, metavar="MB",
                   help="--neighbor: each of a neighbor's two buffers, in MB")
    p.add_argument("--admin-port", type=int, default=50063)
    p.add_argument("--out")
    p.add_argument("--table", metavar="ROWS_JSONL", nargs="+")
    p.add_argument("--by-driver-time", action="store_true",
                   help="with --table: the paired figures of every file pooled by the process's "
                        "own driver launch time")
    args = p.parse_args(argv)
    if args.table:
        if args.by_driver_time:
            print(driver_time_table(
                {path: harness.read_rows(path, "launch-cost") for path in args.table}))
        elif len(args.table) == 1:
            print(table(harness.read_rows(args.table[0], "launch-cost")))
        else:
            p.error("--table takes one file (runs of two files would mix), or several with "
                    "--by-driver-time")
        return
    if not args.bundle:
        p.error("--bundle is required")
    split = harness.bench_switch_names(args.split, "launch-cost --split")
    paired_split = harness.bench_switch_names(args.paired_split, "launch-cost --paired-split")
    if not 1 <= args.segments <= 10000:
        p.error(f"--segments {args.segments}: expected 1 to 10000")
    if not 0 <= args.memory_latency <= MAX_MEMORY_MB:
        p.error(f"--memory-latency {args.memory_latency}: expected 0 to {MAX_MEMORY_MB} MB")
    cores = arm_cores(p, args)
    neighbor_cpus = neighbor_cores(p, args)
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
    if neighbor_cpus:
        for arm, alone in zip(NEIGHBOR_ARMS, ARMS):
            wraps[arm] = wraps[alone]
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
                neighbors = start_neighbors(neighbor_cpus, args.neighbor_mb, work) \
                    if arm in NEIGHBOR_ARMS else []
                steal_before = steal_ms(cores)
                try:
                    text = subprocess.run(
                        harness.taskset(args.cpus) + wraps[arm] + [
                            bench, "--launches", str(args.launches), "--pairs", str(args.pairs),
                            "--pollute", str(args.pollute), "--kernels", str(args.kernels)]
                        + (["--memory-latency", str(args.memory_latency)]
                           if args.memory_latency else [])
                        + (["--segments", str(args.segments)] if args.segments > 1 else [])
                        + bench_args.get(arm, []),
                        env=env, check=True, capture_output=True, text=True).stdout
                finally:
                    streamed, reported = stop_neighbors(neighbors)
                if reported != len(neighbors):
                    print(f"warning: run {run}, {arm}: {len(neighbors) - reported} of the "
                          f"{len(neighbors)} memory neighbors stopped streaming early",
                          file=sys.stderr)
                beside = ({"neighbor": ",".join(map(str, neighbor_cpus)),
                           "neighbor_gb_per_s": streamed,
                           "neighbors_streaming": reported} if neighbors else {})
                steal = steal_ms(cores)
                if steal is not None and steal_before is not None:
                    beside["steal_ms"] = steal - steal_before
                for m in re.finditer(r"^(.+?)\s+ns_per_(?:launch|call)=(\d+)", text, re.M):
                    row = {"run": run, "arm": arm, "variant": m.group(1).strip(),
                           "ns": int(m.group(2)), "cpus": args.cpus, **beside}
                    rows.append(row)
                    harness.append_row(rows_path, row)
                m = re.search(r"^memory (.+)$", text, re.M)
                memory = {f"memory_{k}": float(v) for k, v in
                          (kv.split("=") for kv in m.group(1).split())} if m else {}
                for m in re.finditer(r"^paired (.+)$", text, re.M):
                    fields = dict(kv.split("=") for kv in m.group(1).split())
                    row = {"run": run, "arm": arm, "variant": "paired", "cpus": args.cpus,
                           **({"switch": switch_of[arm]} if arm in switch_of else {}),
                           **({"pair_switch": pair_switch_of[arm]}
                              if arm in pair_switch_of else {}),
                           **{k: float(v) for k, v in fields.items()
                              if k not in ("pairs", "pollute_kb", "kernels", "pair_switch",
                                           "segment")},
                           **({"segment": int(fields["segment"])} if "segment" in fields else {}),
                           **beside, **memory,
                           "pairs": int(fields["pairs"]),
                           "pollute_kb": int(fields.get("pollute_kb", 0)),
                           "kernels": int(fields.get("kernels", 1))}
                    rows.append(row)
                    harness.append_row(rows_path, row)
            print(f"run {run} of {args.runs} done", flush=True)
    finally:
        server.stop()
    print(table(rows))
