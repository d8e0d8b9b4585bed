"""Log mode on a GPU against torch.profiler: a small PyTorch training loop
(bench/workloads/call_log_job.py) runs under the interposer with ORION_LOG_DIR and no server.

  orion_bench.py call-log --bundle DIR [--out DIR]

Prints what the call log holds per step next to what torch.profiler (CUPTI) saw in the same
loop: kernel launches, and host-to-device / device-to-host copies with their direction. Writes
the logs, the converted trace (orion-ctl timeline --from-log) and summary.json to --out.
"""
import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile

import harness

ANSWERS = ("whether log mode (no server) records what torch.profiler sees on the GPU: kernel "
           "launches and copies per training step")
JOB = os.path.join(harness.BENCH, "workloads", "call_log_job.py")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", required=True)
    p.add_argument("--out")
    args = p.parse_args(argv)
    b = os.path.abspath(args.bundle)
    out = args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="orion-call-log-gpu.")
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="orion-call-log-job.")
    with open(os.path.join(out, "job.err"), "w") as err:
        r = subprocess.run([sys.executable, JOB, os.path.join(out, "profiler.json")],
                           env=dict(os.environ, LD_PRELOAD=os.path.join(b, "liborion_interpose.so"),
                                    ORION_SOCKET=os.path.join(work, "nobody.sock"),
                                    ORION_LOG_DIR=os.path.join(out, "logs")), stderr=err)
    if r.returncode != 0:
        sys.exit(f"call-log: the job failed (exit {r.returncode}); see {out}/job.err")
    subprocess.run([os.path.join(b, "orion-ctl"), "timeline", "--from-log",
                    os.path.join(out, "logs"), "--trace", os.path.join(out, "trace.json")],
                   env=dict(os.environ, **harness.lib_env(b)), check=True)
    with open(os.path.join(out, "profiler.json")) as f:
        prof = json.load(f)
    calls = collections.Counter()
    for path in glob.glob(os.path.join(out, "logs", "timeline.*.log")):
        with open(path) as f:
            for line in f:
                if line.startswith("#"):
                    continue
                _, _, call, _, _, kind = line.rstrip("\n").split("\t")
                calls["kernel" if call == "cuLaunchKernel" else
                      kind if kind in ("h2d", "d2h", "d2d", "h2h") else call] += 1
    # The log covers 55 steps (5 warm-up + 50 profiled); per step it should hold what CUPTI saw.
    summary = {"profiler_in_window_(55_steps_less_5_warmup)": prof,
               "call_log_whole_run_(55_steps)": dict(calls),
               "per_step": {"call_log": {k: calls.get(k, 0) / 55 for k in ("kernel", "h2d", "d2h")},
                            "cupti": {k: prof[k] / 50 for k in ("kernel", "h2d", "d2h")}}}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
