#!/usr/bin/env python3
"""The priority experiment (bench/orion_bench.py priority) end to end on the CUDA driver test
double, so that the harness a GPU run depends on is exercised before GPU time is spent on it: the
real orion-server, orion-ctl, orion-run and interposer, the driver-API samples as service and
trainers, one trainer alone and two together (--be sample,sample+sample).

Checks: every row of results.jsonl is there without an error (the service alone, the trainer
alone, the service beside each trainer group); the group's row keys both trainers, both made
progress, and its trainer ratio is the sum of theirs; the table re-rendered from results.jsonl
shows the group's parts.

Usage: priority_on_double_test.py SERVER CTL RUN INTERPOSER SAMPLE_INFER SAMPLE_TRAIN DOUBLE_DIR
"""
import json
import os
import random
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port_pair():
    """An even port below the kernel's ephemeral range (where other tests' port-0 listeners land)
    that, with the next one, nobody listens on now: the admin API's and /metrics'."""
    for _ in range(50):
        port = random.randrange(20000, 32000, 2)
        try:
            for p in (port, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise SystemExit("no free port pair found")


def main():
    if len(sys.argv) != 8:
        print(__doc__, file=sys.stderr)
        return 2
    server, ctl, run, interposer, infer, train, double_dir = sys.argv[1:]
    failures = []
    with tempfile.TemporaryDirectory(prefix="orion-priority-double-") as tmp:
        # The bundle's layout (tools/bundle.sh), linked to the build's files.
        bundle = os.path.join(tmp, "bundle")
        os.makedirs(os.path.join(bundle, "lib"))
        for path, name in ((server, "orion-server"), (ctl, "orion-ctl"), (run, "orion-run"),
                           (interposer, "liborion_interpose.so"),
                           (infer, "orion-sample-infer"), (train, "orion-sample-train")):
            os.symlink(os.path.abspath(path), os.path.join(bundle, name))
        # The bench's own work folder (the server's socket, its log) inside this one too.
        env = dict(os.environ, ORION_SIM_DIR=os.path.join(tmp, "sim"), ORION_SIM_MEMORY="8Gi",
                   TMPDIR=tmp,
                   LD_LIBRARY_PATH=double_dir + (":" + os.environ["LD_LIBRARY_PATH"]
                                                 if os.environ.get("LD_LIBRARY_PATH") else ""))
        os.makedirs(env["ORION_SIM_DIR"])
        out = os.path.join(tmp, "out")
        argv = [sys.executable, os.path.join(ROOT, "bench", "orion_bench.py"), "priority",
                "--bundle", bundle, "--hp", "sample", "--be", "sample,sample+sample",
                "--configs", "orion", "--requests", "300", "--be-alone-seconds", "2",
                "--settle-seconds", "1", "--no-pin", "--admin-port", str(free_port_pair()),
                "--out", out]
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        try:
            output, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            p.terminate()  # the bench stops its trainers and server on SIGTERM
            try:
                output, _ = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                output, _ = p.communicate()
            print(output)
            print("FAIL: the run took over 240 s")
            return 1
        if p.returncode != 0:
            print(output)
            print(f"FAIL: the run exited {p.returncode}")
            return 1
        rows = [json.loads(line) for line in open(os.path.join(out, "results.jsonl"))]
        errors = [r for r in rows if r.get("error")]
        if errors:
            failures.append(f"rows with errors: {errors}")
        by = {(r["config"], r.get("hp"), r.get("be")): r for r in rows}
        for key in (("alone", "sample", None), ("alone", None, "sample"),
                    ("orion", "sample", "sample"), ("orion", "sample", "sample+sample")):
            if key not in by:
                failures.append(f"no row {key}")
        group = by.get(("orion", "sample", "sample+sample"), {})
        parts = group.get("be_parts", {})
        if sorted(parts) != ["sample", "sample#2"]:
            failures.append(f"the group's parts {parts} (want sample and sample#2)")
        elif min(parts.values()) <= 0:
            failures.append(f"a trainer of the group made no progress: {parts}")
        elif abs(group.get("be_x", 0) - sum(parts.values())) > 0.002:
            failures.append(f"the group's ratio {group.get('be_x')} is not the sum of {parts}")
        steps = group.get("be_steps_per_s")
        if not isinstance(steps, dict) or sorted(steps) != ["sample", "sample#2"]:
            failures.append(f"the group's steps per second {steps} (want one per trainer)")
        single = by.get(("orion", "sample", "sample"), {})
        if ("be_parts" in single or not isinstance(single.get("be_steps_per_s"), float)
                or not single.get("be_x", 0) > 0):
            failures.append(f"one trainer's row reads as a group: {single}")
        table = subprocess.run(
            [sys.executable, os.path.join(ROOT, "bench", "orion_bench.py"), "priority",
             "--table", os.path.join(out, "results.jsonl")],
            capture_output=True, text=True, check=True).stdout
        if "(sample " not in table or "sample#2 " not in table:
            failures.append(f"the table does not show the group's parts:\n{table}")
        print(table)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
