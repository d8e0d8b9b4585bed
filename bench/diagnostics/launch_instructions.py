"""Instructions the interposer adds to a launch, counted by valgrind's callgrind on the CUDA driver
test double (CPU only, no GPU). orion-bench-launch runs without its polled variant (a thread
querying events every 20 us does work by the run's time, not by its launches); the timed
launches' share and the completion poller's still depend a little on the time a run takes under
callgrind.

  orion_bench.py launch-instructions [BUILD] [--interposer LIB]... [--launches 4000]
                                     [--label L] [--out ROWS.jsonl]
  orion_bench.py launch-instructions --table ROWS.jsonl

For each interposer library (default: BUILD's; several compare builds) and each priority (high,
best effort: alone on the GPU, so never held), BUILD's orion-bench-launch runs registered with
BUILD's orion-server under callgrind twice, with --launches N and 2N, and once more each without
any interposer. A row's figure is the whole process's instructions per launch between the two
runs (the slope: start-up and registration cancel out), less the same slope without the
interposer. So it holds everything the interposer makes the process do for a launch, wherever
the compiler put it (inlined header code included) and on any thread (the completion poller's
share of the timed launches), and the double's work for the interposer's own driver calls: its
cuCtxGetCurrent (a locked map lookup, where a real driver reads a thread-local) and the timed
launches' event records. Rows of the earlier method (the hook's own lines only, inclusive, less
the double's launch and cuCtxGetCurrent; it left out code inlined from headers) say so in the
table's method column. The clock the interposer reads is a system call under callgrind, not the
vDSO, so its count is not a host's; and callgrind's CPU reports no PREFETCHW, so the ring's
prefetch (contract::EventRing::PrefetchNextEntry) is left out, its check counted. Not a time:
a host's caches and branch predictors decide what an instruction costs (launch-cost measures
the time on a GPU host), but instructions the path no longer runs cost nothing anywhere.
"""
import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile

import harness

ANSWERS = ("instructions the interposer adds to a launch, whole process, by callgrind on the CUDA "
           "test double (CPU only): builds compared exactly")


def launch_calls(out):
    """A callgrind output file's instructions, and the calls of each object's cuLaunchKernel by
    the object's real path, read from the file's own call records. (callgrind_annotate's listing
    leaves call edges out: with the hook's cold part also calling the driver, it showed only that
    part's one call for a whole run.) Names and objects are compressed: "(id) text" the first
    time, "(id)" after."""
    names = {"ob": {}, "fn": {}}
    total, calls = 0, collections.Counter()
    ob = cob = cfn = None

    def resolve(kind, value):
        ident, _, text = value.strip().partition(" ")
        if text:
            names[kind][ident] = text
        return names[kind].get(ident, ident)

    with open(out) as f:
        for line in f:
            if line.startswith("summary:"):
                total = int(line.split()[1])
            elif line.startswith("ob="):
                ob, cob = resolve("ob", line[3:]), None
            elif line.startswith("fn="):
                resolve("fn", line[3:])
                cob = None
            elif line.startswith("cob="):
                cob = resolve("ob", line[4:])
            elif line.startswith("cfn="):
                cfn = resolve("fn", line[4:])
            elif line.startswith("calls="):
                if cfn == "cuLaunchKernel":
                    calls[os.path.realpath(cob or ob)] += int(line[6:].split()[0])
                cob = None
    return total, calls


def slope(paths, lib, priority, launches, work):
    """Whole-process instructions per launch between runs of `launches` and 2 x `launches` (each
    run makes 5 batches a variant, 5 variants: the polled one, whose work follows the run's time,
    left out), with `lib` preloaded at `priority`, or with no
    interposer where `lib` is None."""
    counts = []
    for n in (launches, 2 * launches):
        out = os.path.join(work, f"callgrind.{priority}.{n}.out")
        bench = [paths["bench"], "--launches", str(n), "--pairs", "0", "--no-polled"]
        grind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        with open(os.path.join(work, "server.log"), "a") as log:
            server = harness.Server(paths["build"], work, log, program=paths["server"]).start()
            try:
                env = dict(os.environ, LD_LIBRARY_PATH=paths["double"],
                           ORION_SOCKET=server.socket)
                command = grind + bench if lib is None else \
                    [paths["run"], "--interposer", lib, "--priority", priority, "--"] + grind + bench
                r = subprocess.run(command, env=env, capture_output=True, text=True)
            finally:
                server.stop()
        if r.returncode != 0:
            sys.exit(f"launch-instructions: {priority}: exit {r.returncode}\n{r.stderr[-2000:]}")
        total, calls = launch_calls(out)
        double = sum(n for ob, n in calls.items()
                     if os.path.dirname(ob) == os.path.realpath(paths["double"]))
        hooked = lib is None or calls.get(os.path.realpath(lib), 0) > 0
        if total == 0 or double == 0 or not hooked:
            sys.exit(f"launch-instructions: {priority}: no program total, no launch of the double "
                     f"or no launch through the hook in {out} (was the process registered?)")
        counts.append((total, double))
    (t1, n1), (t2, n2) = counts
    return (t2 - t1) / (n2 - n1), n2 - n1


def table(rows):
    return harness.markdown_table(
        ["build", "interposer", "priority", "method", "launches", "instructions a launch"],
        [[r["label"], r["interposer"], r["priority"],
          "whole process, over no interposer" if r.get("method") == "slope"
          else "the hook's own lines (inlined headers left out)",
          r["launches"], f"{r['instructions']:.1f}"] for r in rows])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_double_bench_args(p, "count")
    p.add_argument("--launches", type=int, default=4000, help="launches a batch (5 batches a "
                   "variant, 5 variants: orion-bench-launch --no-polled)")
    args = p.parse_args(argv)
    if args.table:
        print(table(harness.read_rows(args.table, "launch-instructions")))
        return 0
    if shutil.which("valgrind") is None:
        sys.exit("launch-instructions: needs valgrind (apt install valgrind)")
    paths, libs = harness.double_bench_paths(args.build, args.interposer, "launch-instructions")
    with tempfile.TemporaryDirectory(prefix="orion-instructions-") as work:
        bare = slope(paths, None, "bare", args.launches, work)[0]  # the bench and the double

        def measure(lib, priority):
            per_launch, n = slope(paths, lib, priority, args.launches, work)
            return {"launches": n, "method": "slope", "instructions": per_launch - bare}

        rows = harness.double_bench_rows(args, paths, libs, measure)
    print(table(rows))
    return 0
