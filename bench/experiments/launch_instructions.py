"""Instructions the interposer's own launch path executes, counted by valgrind's callgrind on
the CUDA driver test double (CPU only, no GPU; the count repeats within a few instructions:
what a launch does moves only with the time between launches).

  orion_bench.py launch-instructions [BUILD] [--interposer LIB]... [--launches 4000]
                                     [--label L] [--out ROWS.jsonl]
  orion_bench.py launch-instructions --table ROWS.jsonl

For each interposer library (default: BUILD's; several compare builds) and each priority (high,
best effort: alone on the GPU, so never held), BUILD's orion-bench-launch runs registered with
BUILD's orion-server, under callgrind. A row's figure is the instructions of the hook's
cuLaunchKernel, inclusive, less those of the double's own cuLaunchKernel and cuCtxGetCurrent
(the driver's work, which a real driver does instead), per launch. The clock the interposer
reads is a system call under callgrind, not the vDSO, so its count is not a host's. Not a time:
a host's caches and branch predictors decide what an instruction costs (launch-cost measures the
time on a GPU host), but instructions the path no longer runs cost nothing anywhere.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import harness

ANSWERS = ("instructions per launch of the interposer's own path, by callgrind on the CUDA test "
           "double (CPU only): builds compared exactly")

PRIORITIES = ("high", "best-effort")


def inclusive(annotated, pattern):
    """The inclusive instruction count of the function whose line matches `pattern`."""
    for line in annotated.splitlines():
        if re.search(pattern, line):
            return int(line.split()[0].replace(",", ""))
    return None


def count(paths, lib, priority, launches, work):
    """(instructions a launch, launches) of `lib` at `priority`: one callgrind run."""
    out = os.path.join(work, f"callgrind.{priority}.out")
    with open(os.path.join(work, "server.log"), "a") as log:
        server = harness.Server(paths["build"], work, log, program=paths["server"]).start()
        try:
            env = dict(os.environ, LD_LIBRARY_PATH=paths["double"], ORION_SOCKET=server.socket)
            r = subprocess.run([paths["run"], "--interposer", lib, "--priority", priority, "--",
                                "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                                paths["bench"], "--launches", str(launches), "--pairs", "0"],
                               env=env, capture_output=True, text=True)
        finally:
            server.stop()
    if r.returncode != 0:
        sys.exit(f"launch-instructions: {priority}: exit {r.returncode}\n{r.stderr[-2000:]}")
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", out],
                               capture_output=True, text=True, check=True).stdout
    hook = inclusive(annotated, r"interpose/hooks_launch\.cc:cuLaunchKernel \[")
    driver = inclusive(annotated, r"cuda_double\.cc:cuLaunchKernel \[")
    ctx = inclusive(annotated, r"cuda_double\.cc:cuCtxGetCurrent \[")
    calls = re.search(r"=> \S*hooks_launch\.cc:cuLaunchKernel \(([\d,]+)x\)", annotated)
    if None in (hook, driver, ctx) or calls is None:
        sys.exit(f"launch-instructions: {priority}: the hook, the double's launch or its "
                 f"cuCtxGetCurrent is missing from {out} (was the process registered?)")
    n = int(calls.group(1).replace(",", ""))
    return (hook - driver - ctx) / n, n


def table(rows):
    return harness.markdown_table(
        ["build", "interposer", "priority", "launches", "instructions a launch"],
        [[r["label"], r["interposer"], r["priority"], r["launches"], f"{r['instructions']:.1f}"]
         for r in rows])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("build", nargs="?", default=os.path.join(harness.ROOT, "build"))
    p.add_argument("--interposer", action="append", default=[],
                   help="a liborion_interpose.so to count (repeatable; default: BUILD's)")
    p.add_argument("--launches", type=int, default=4000, help="launches a batch (5 batches a "
                   "variant, 6 variants: orion-bench-launch)")
    p.add_argument("--label", default="", help="the build's name in the rows")
    p.add_argument("--out", help="append the rows to this JSONL file")
    p.add_argument("--table", help="print the table of a rows file and exit")
    args = p.parse_args(argv)
    if args.table:
        print(table(harness.read_rows(args.table, "launch-instructions")))
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        sys.exit("launch-instructions: needs valgrind (apt install valgrind)")
    b = os.path.abspath(args.build)
    paths = {"build": b, "server": os.path.join(b, "server/orion-server"),
             "run": os.path.join(b, "tools/orion-run"),
             "bench": os.path.join(b, "bench/orion-bench-launch"),
             "double": os.path.join(b, "tests/cuda_double/lib")}
    libs = args.interposer or [os.path.join(b, "interpose/liborion_interpose.so")]
    missing = [v for v in list(paths.values()) + libs if not os.path.exists(v)]
    if missing:
        sys.exit(f"launch-instructions: missing {', '.join(missing)} (cmake --build {b})")
    rows = []
    for lib in libs:
        for priority in PRIORITIES:
            with tempfile.TemporaryDirectory(prefix="orion-instructions-") as work:
                per_launch, n = count(paths, os.path.abspath(lib), priority, args.launches, work)
            shown = os.path.relpath(os.path.abspath(lib), harness.ROOT)
            row = {"label": args.label or os.path.basename(b),
                   "interposer": os.path.abspath(lib) if shown.startswith("..") else shown,
                   "priority": priority, "launches": n, "instructions": per_launch}
            rows.append(row)
            if args.out:
                harness.append_row(args.out, row)
    print(table(rows))
    return 0
