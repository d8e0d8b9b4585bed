"""The CPU cost of a driver launch on a GPU, with and without the interposer (C level).

  orion_bench.py launch-cost --bundle DIR [--cpus 2,3] [--runs 3]

orion-bench-launch (bench/launch_cost.cc, in the bundle) times an empty kernel's launch and
each driver call a tracked launch adds (best of 5 batches, ns per launch), pinned to --cpus:
once with no interposer and once under orion-run registered high priority with an
orion-server on cores 0 and 1, --runs times in turn.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import harness

ANSWERS = ("what a driver launch costs on the CPU with and without the interposer "
           "(orion-bench-launch, ns per launch)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", required=True)
    p.add_argument("--cpus", default="2,3")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--admin-port", type=int, default=50063)
    args = p.parse_args(argv)
    b = os.path.abspath(args.bundle)
    bench = os.path.join(b, "orion-bench-launch")
    if not os.access(bench, os.X_OK):
        sys.exit(f"launch-cost: {bench} missing; build it (bench/CMakeLists.txt, needs the CUDA "
                 f"driver headers) and bundle again: tools/bundle.sh build .bundle")
    work = tempfile.mkdtemp(prefix="orion-launch-")
    log = open(os.path.join(work, "server.log"), "a")
    server = harness.Server(b, work, log, admin_port=args.admin_port,
                            prefix=harness.taskset("0,1")).start()
    env = dict(os.environ, ORION_SOCKET=server.socket)
    try:
        for run in range(1, args.runs + 1):
            for label, wrap in (("no interposer", []),
                                ("high priority", harness.orion_run(b, "high"))):
                print(f"== run {run}, {label}", flush=True)
                subprocess.run(harness.taskset(args.cpus) + wrap + [bench], env=env, check=True)
    finally:
        server.stop()
