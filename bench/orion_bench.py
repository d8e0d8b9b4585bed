#!/usr/bin/env python3
"""orion-gpu-share's benchmarks, one entry point.

  python3 bench/orion_bench.py EXPERIMENT [ARGS...]     (EXPERIMENT --help: its options)
  python3 bench/orion_bench.py --help                   (the experiments, what each answers)

Each experiment is a module of bench/experiments/ (its name with '-' for '_') with a one-line
ANSWERS and a main(argv); what they share (orion-server from a bundle, the MPS daemon, arms,
rounds in rotating order, CPU pinning, JSONL, tables) is bench/harness.py. The GPU experiments
run on a machine with an NVIDIA GPU from a bundle of the built binaries (tools/bundle.sh build
.bundle); the rest run anywhere. Their current results are in docs/benchmarks.md.
"""
import importlib
import os
import pkgutil
import signal
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)


def experiments():
    """{name: module name} of every module in bench/experiments/, sorted by name."""
    found = pkgutil.iter_modules([os.path.join(BENCH, "experiments")])
    return {m.name.replace("_", "-"): m.name for m in sorted(found, key=lambda m: m.name)
            if not m.name.startswith("_")}


def load(module):
    return importlib.import_module(f"experiments.{module}")


def usage(known):
    width = max(len(n) for n in known)
    lines = [__doc__.strip(), "", "experiments:"]
    for name, module in known.items():
        lines.append(f"  {name.ljust(width)}  {load(module).ANSWERS}")
    return "\n".join(lines)


def main(argv):
    known = experiments()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(known))
        return 0 if argv else 2
    name = argv[0]
    if name not in known and name.replace("_", "-") in known:
        name = name.replace("_", "-")
    if name not in known:
        print(f"orion_bench: no experiment '{argv[0]}' (bench/experiments/ has: "
              f"{', '.join(known)}); run: python3 bench/orion_bench.py --help", file=sys.stderr)
        return 2
    sys.argv = [f"orion_bench.py {name}", *argv[1:]]
    return load(known[name]).main(argv[1:]) or 0


def end_on_terminate(signum, frame):
    """SIGTERM (a `timeout` around a run) ends the experiment as an error would, so that what it
    started is stopped (its `finally` blocks, and the harness's orion-server at exit): a server
    left running holds its metrics port, and the next run's server cannot start
    ("metrics_address: cannot listen")."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, end_on_terminate)
    sys.exit(main(sys.argv[1:]))
