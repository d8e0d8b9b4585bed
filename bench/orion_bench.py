#!/usr/bin/env python3
"""orion-gpu-share's benchmarks, one entry point.

  python3 bench/orion_bench.py EXPERIMENT [ARGS...]     (EXPERIMENT --help: its options)
  python3 bench/orion_bench.py --help                   (the experiments, what each answers)

The experiments (bench/experiments/) answer a user's questions; their results are in
docs/benchmarks.md. The diagnostics (bench/diagnostics/) took one question apart once (where a
launch's CPU goes, what the GPU's switch costs, how a timing log reads); each runs by its name
as an experiment does. A module's name is its name with '-' for '_', with a one-line ANSWERS
and a main(argv); what they share (orion-server from a bundle, the MPS daemon, arms, rounds in
rotating order, CPU pinning, JSONL, tables) is bench/harness.py. The GPU experiments run on a
machine with an NVIDIA GPU from a bundle of the built binaries (tools/bundle.sh build .bundle);
the rest run anywhere.
"""
import importlib
import os
import pkgutil
import signal
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
FOLDERS = ("experiments", "diagnostics")


def modules(folder):
    """{name: 'folder.module'} of every module in bench/FOLDER/, sorted by name."""
    found = pkgutil.iter_modules([os.path.join(BENCH, folder)])
    return {m.name.replace("_", "-"): f"{folder}.{m.name}"
            for m in sorted(found, key=lambda m: m.name) if not m.name.startswith("_")}


def experiments():
    """{name: 'folder.module'} of the experiments, then the diagnostics."""
    known = {}
    for folder in FOLDERS:
        known.update(modules(folder))
    return known


def load(module):
    return importlib.import_module(module)


def usage():
    groups = [(folder, modules(folder)) for folder in FOLDERS]
    width = max(len(n) for _, known in groups for n in known)
    lines = [__doc__.strip()]
    for folder, known in groups:
        lines += ["", f"{folder}:"]
        for name, module in known.items():
            lines.append(f"  {name.ljust(width)}  {load(module).ANSWERS}")
    return "\n".join(lines)


def main(argv):
    known = experiments()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "diagnostics" and len(argv) > 1:  # `diagnostics NAME` runs NAME as well
        argv = argv[1:]
    name = argv[0]
    if name not in known and name.replace("_", "-") in known:
        name = name.replace("_", "-")
    if name not in known:
        print(f"orion_bench: no experiment '{argv[0]}' (bench/experiments/ and "
              f"bench/diagnostics/ have: {', '.join(known)}); run: "
              f"python3 bench/orion_bench.py --help", file=sys.stderr)
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
