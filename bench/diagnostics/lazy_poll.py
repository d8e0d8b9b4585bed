"""What the completion poller's lazy period costs a one-CPU pod (GPU machine): how often the
interposer's thread wakes, and the CPU it and the process use, against the lazy period.

  orion_bench.py lazy-poll --bundle DIR [--rounds 2] [--periods 10,50,100]
      [--jobs trainer,service] [--rate 58] [--core 2] [--window 10] [--out DIR]
  orion_bench.py thread-cpu --table OUT/lazy-poll.jsonl      (the table again)

A job pinned to one core (taskset -c --core) registers with a real orion-server (priority mode,
nobody else on the GPU, so the gate never holds it and its timing samples are all left to the
lazy period) and is read by the thread-cpu experiment, in these arms:
  bare        no interposer
  lazy-N      under orion-run with ORION_LAZY_POLL_MS=N, for each N in --periods
Jobs: trainer (ResNet50 batch 64 training, best effort) and service (ResNet50 batch 4 eager,
high priority, Poisson arrivals at --rate a second). The arms' order rotates every round.
Writes OUT/lazy-poll.jsonl (one thread-cpu --json line per run, tagged job, arm, lazy_ms,
round, core) and OUT/lazy-poll.md.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import harness

ANSWERS = ("what the completion poller's lazy period costs a job pinned to one core: the "
           "poller's wake-ups and CPU at each period, against no interposer")

JOBS = {"trainer": (["train", "resnet50"], "best-effort"),
        "service": (["serve", "resnet50", "--rate", "{rate}", "--requests", "1000000"], "high")}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", required=True)
    p.add_argument("--out")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--periods", default="10,50,100", help="ORION_LAZY_POLL_MS of each arm")
    p.add_argument("--jobs", default="trainer,service")
    p.add_argument("--rate", type=float, default=58, help="the service's requests per second")
    p.add_argument("--core", default="2")
    p.add_argument("--window", type=float, default=10, help="seconds read per run")
    p.add_argument("--admin-port", type=int, default=50083)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="also set this in every interposed arm (repeatable; e.g. "
                        "ORION_POLLER_IDLE=0); the rows carry it as their 'env' tag")
    args = p.parse_args(argv)
    jobs = [j for j in args.jobs.split(",") if j]
    for job in jobs:
        if job not in JOBS:
            p.error(f"--jobs: unknown job '{job}' (trainer or service)")
    bundle = os.path.abspath(args.bundle)
    out = args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="orion-lazy-poll-")
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="orion-lazy-")
    log = open(os.path.join(work, "server.log"), "a")
    rows = os.path.join(out, "lazy-poll.jsonl")
    arms = ["bare"] + [f"lazy-{n}" for n in args.periods.split(",") if n]
    server = harness.Server(bundle, work, log, admin_port=args.admin_port,
                            prefix=harness.taskset("0")).start()
    env = dict(os.environ, ORION_SOCKET=server.socket)
    try:
        for rnd in range(1, args.rounds + 1):
            for job in jobs:
                model, priority = JOBS[job]
                model = [a.format(rate=f"{args.rate:g}") for a in model]
                for arm in harness.rotated(arms, rnd - 1):
                    lazy = "" if arm == "bare" else arm.partition("-")[2]
                    wrap = [] if arm == "bare" else (
                        ["env", f"ORION_LAZY_POLL_MS={lazy}", *args.env]
                        + harness.orion_run(bundle, priority))
                    print(f"lazy-poll: round {rnd}, {job}, {arm}", file=sys.stderr)
                    r = subprocess.run(harness.experiment_command(
                        "thread-cpu", "--after", "12", "--window", f"{args.window:g}", "--json",
                        "--tag", f"job={job}", "--tag", f"arm={arm}", "--tag", f"lazy_ms={lazy}",
                        "--tag", f"round={rnd}", "--tag", f"core={args.core}",
                        "--tag", f"env={' '.join(args.env)}", "--",
                        *harness.taskset(args.core), *wrap, sys.executable, harness.MODELS,
                        *model), env=env, stdout=subprocess.PIPE, text=True)
                    if r.returncode != 0:
                        sys.exit(f"lazy-poll: thread-cpu failed for {job}, {arm} "
                                 f"(exit {r.returncode})")
                    with open(rows, "a") as f:
                        f.write(r.stdout)
    finally:
        server.stop()
        log.close()
        shutil.copy(log.name, out)
    table = subprocess.run(harness.experiment_command(
        "thread-cpu", "--table", rows, "--threads", "orion-poller,cuda-EvtHandlr"),
        capture_output=True, text=True)
    with open(os.path.join(out, "lazy-poll.md"), "w") as f:
        f.write(table.stdout)
    print(table.stdout + table.stderr, end="")
