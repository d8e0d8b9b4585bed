#!/usr/bin/env python3
"""What the interposer costs a pod with one CPU: an eager PyTorch service and a trainer, each on
one CPU, with and without liborion_interpose.so (registered with a real orion-server), alternating
in every round so that host drift cancels.

  bench/cpu_tax_bench.py --bundle DIR [--model resnet50] [--graph] [--nvtx] [--rounds 5]
      [--limit taskset|cgroup] [--requests 1000] [--load 0.5] [--train-model resnet50]
      [--train-steps 60] [--jobs service-closed,service-poisson,trainer]
      [--baseline-interposer LIB | --baseline-env KEY=VALUE ...] [--out DIR]
  bench/cpu_tax_bench.py --table results.jsonl      (re-renders a run's table)

--limit taskset pins each job to one core (a cpuset); --limit cgroup runs it in a cgroup v2 with
cpu.max "100000 100000" (one CPU of quota, any core), as a pod with a 1-CPU limit is run.
Per round and for both (bare, interposer), in alternating order:
  service-closed   closed loop: service time and CPU per request (torch_models.py serve --rate 0)
  service-poisson  Poisson arrivals at --load of the bare closed-loop capacity of round 1
                   (measured on one CPU): p50/p99 latency from the scheduled arrival, CPU/request
  trainer          --train-steps steps of training: step time p50/p99, CPU per step
The service runs high priority, the trainer best effort; neither has the other beside it, so the
gate holds nothing: the difference is what the interposer itself costs, timeline recording
included (launch events, sampled launches timed on the GPU; with --nvtx every request and step
is an NVTX range in both arms, recorded with GPU times under the interposer). --graph serves a
CUDA graph instead of the eager model. Writes results.jsonl and
results.md (medians over the rounds of each round's interposer/bare ratio, with min and max) to
--out (default $OUT or a temp dir) and prints the table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "bench", "torch_models.py")
SERVICE_CPU = "2"
SERVER_CPU = "0"
CGROUP = "/sys/fs/cgroup/orion-bench-1cpu"


def parse_result(text):
    for line in text.splitlines():
        if line.startswith("result "):
            out = {}
            for kv in line.split()[1:]:
                k, _, v = kv.partition("=")
                try:
                    out[k] = float(v)
                except ValueError:
                    out[k] = v
            return out
    return None


def quantile(sorted_values, p):
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def setup_cgroup():
    """A cgroup v2 child with one CPU of quota (cpu.max). Other processes are left where they are:
    where the cpu controller cannot be enabled for children, this says why and stops."""
    root = "/sys/fs/cgroup"
    if not os.path.exists(os.path.join(root, "cgroup.controllers")):
        raise SystemExit("cgroup v2 is not mounted at /sys/fs/cgroup")
    if "cpu" not in open(os.path.join(root, "cgroup.controllers")).read().split():
        raise SystemExit("the cpu controller is not available in /sys/fs/cgroup")
    if "cpu" not in open(os.path.join(root, "cgroup.subtree_control")).read().split():
        try:
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
        except OSError as e:
            raise SystemExit(f"cannot enable the cpu controller for child cgroups: {e}")
    os.makedirs(CGROUP, exist_ok=True)
    with open(os.path.join(CGROUP, "cpu.max"), "w") as f:
        f.write("100000 100000")
    return open(os.path.join(CGROUP, "cpu.max")).read().strip()


class Bench:
    def __init__(self, args):
        self.args = args
        self.bundle = os.path.abspath(args.bundle)
        self.out = args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="cpu-tax-")
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="orion-cpu-tax-")
        self.log = open(os.path.join(self.out, "bench.log"), "a")
        self.rows = open(os.path.join(self.out, "results.jsonl"), "a")
        if args.limit == "cgroup":
            self.limit_note = f"cgroup cpu.max {setup_cgroup()}"
            self.prefix = ["sh", "-c", f'echo $$ > {CGROUP}/cgroup.procs && exec "$@"', "sh"]
        else:
            self.limit_note = f"taskset -c {SERVICE_CPU}"
            self.prefix = ["taskset", "-c", SERVICE_CPU]
        self.server = None

    def start_server(self):
        cfg = os.path.join(self.work, "s.yaml")
        with open(cfg, "w") as f:
            f.write(f"socket_path: {self.work}/orion.sock\n"
                    "admin_address: 127.0.0.1:0\nmetrics_address: 127.0.0.1:0\n")
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(self.bundle, "lib"))
        self.server = subprocess.Popen(
            ["taskset", "-c", SERVER_CPU, os.path.join(self.bundle, "orion-server"), "--config",
             cfg], env=env, stdout=self.log, stderr=self.log)
        for _ in range(200):
            if os.path.exists(os.path.join(self.work, "orion.sock")):
                return
            time.sleep(0.05)
        raise SystemExit("orion-server did not start; see bench.log")

    def command(self, argv, interposer, priority):
        lib = os.path.join(self.bundle, "liborion_interpose.so")
        env = []
        if not interposer and self.args.baseline_env:
            env = ["env", *self.args.baseline_env]  # A/B of one build: these variables set
        elif not interposer and self.args.baseline_interposer:
            lib = os.path.abspath(self.args.baseline_interposer)  # A/B of two builds
        elif not interposer:
            return self.prefix + argv
        return self.prefix + env + [os.path.join(self.bundle, "orion-run"), "--priority",
                                    priority, "--interposer", lib, "--"] + argv

    def run(self, argv, interposer, priority, timeout=300):
        env = dict(os.environ, ORION_SOCKET=os.path.join(self.work, "orion.sock"),
                   PYTHONUNBUFFERED="1")
        cmd = self.command(argv, interposer, priority)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        self.log.write(f"$ {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}\n")
        self.log.flush()
        return p.stdout

    def model_label(self):
        return self.args.model + ("-graph" if self.args.graph else "") + \
            (" +nvtx" if self.args.nvtx else "")

    def record(self, row):
        row.update(limit=self.args.limit, limit_note=self.limit_note, time=time.time())
        if self.args.baseline_interposer:
            row["baseline"] = os.path.basename(self.args.baseline_interposer)
        if self.args.baseline_env:
            row["baseline"] = " ".join(self.args.baseline_env)
        self.rows.write(json.dumps(row) + "\n")
        self.rows.flush()
        print(json.dumps(row), flush=True)

    def extra(self, role):
        """Workload flags both arms share."""
        flags = ["--nvtx"] if self.args.nvtx else []
        return flags + (["--graph"] if self.args.graph and role == "serve" else [])

    def service_closed(self, rnd, interposer):
        r = parse_result(self.run([sys.executable, MODELS, "serve", self.args.model, "--rate", "0",
                                   "--seconds", "3"] + self.extra("serve"), interposer, "high"))
        if r:
            self.record(dict(round=rnd, role="service-closed", model=self.model_label(),
                             interposer=interposer, capacity_rps=r["capacity_rps"],
                             svc_p50_ms=r["svc_p50_ms"], svc_p99_ms=r["svc_p99_ms"],
                             cpu_ms=r["cpu_ms"]))
        return r

    def service_poisson(self, rnd, interposer, rate):
        r = parse_result(self.run([sys.executable, MODELS, "serve", self.args.model, "--rate",
                                   f"{rate:.2f}", "--requests", str(self.args.requests)]
                                  + self.extra("serve"), interposer, "high"))
        if r:
            self.record(dict(round=rnd, role="service-poisson", model=self.model_label(),
                             interposer=interposer, rate=rate, p50_ms=r["p50_ms"],
                             p99_ms=r["p99_ms"], svc_p50_ms=r["svc_p50_ms"],
                             cpu_ms=r["cpu_ms"]))

    def trainer(self, rnd, interposer):
        out = self.run([sys.executable, MODELS, "train", self.args.train_model, "--steps",
                        str(self.args.train_steps)] + self.extra("train"), interposer,
                       "best-effort")
        stamps = [float(l.split()[1]) for l in out.splitlines() if l.startswith("step ")]
        r = parse_result(out)
        if len(stamps) < 3 or not r:
            return
        steps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
        self.record(dict(round=rnd, role="trainer", model=self.args.train_model + (" +nvtx" if self.args.nvtx else ""),
                         interposer=interposer, step_p50_ms=quantile(steps, 0.5) * 1e3,
                         step_p99_ms=quantile(steps, 0.99) * 1e3,
                         steps_per_s=(len(stamps) - 1) / (stamps[-1] - stamps[0]),
                         cpu_ms=r["cpu_ms"]))

    def main(self):
        self.start_server()
        try:
            rate = None
            for rnd in range(1, self.args.rounds + 1):
                order = [False, True] if rnd % 2 else [True, False]
                jobs = self.args.jobs.split(",")
                for interposer in order:
                    r = self.service_closed(rnd, interposer)
                    if rate is None and not interposer and r:
                        rate = r["capacity_rps"] * self.args.load
                if rate is None:
                    raise SystemExit("no capacity measured; see bench.log")
                if "service-poisson" in jobs:
                    for interposer in order:
                        self.service_poisson(rnd, interposer, rate)
                if "trainer" in jobs:
                    for interposer in order:
                        self.trainer(rnd, interposer)
        finally:
            self.server.terminate()
            self.server.wait()
        print(render(os.path.join(self.out, "results.jsonl")))


METRICS = {
    "service-closed": ["svc_p50_ms", "svc_p99_ms", "cpu_ms"],
    "service-poisson": ["p50_ms", "p99_ms", "cpu_ms"],
    "trainer": ["step_p50_ms", "step_p99_ms", "cpu_ms"],
}


def render(path):
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a half-written last line of a run cut short
    lines = []
    for limit in sorted({r["limit"] for r in rows}):
        sub = [r for r in rows if r["limit"] == limit]
        note = sub[0].get("limit_note", limit)
        # An A/B of two builds names the baseline library in its rows (--baseline-interposer).
        base = sub[0].get("baseline")
        a, b = ("baseline", "this build") if base else ("bare", "interposer")
        against = f", this build against {base}" if base else ""
        lines += [f"**One CPU ({note}), {max(r['round'] for r in sub)} rounds{against}**", "",
                  f"| job | figure | {a}, median | {b}, median | {b} / {a}: median [min, max] |",
                  "|---|---|---|---|---|"]
        for role, metrics in METRICS.items():
            by_round = {}
            for r in sub:
                if r["role"] == role:
                    by_round.setdefault(r["round"], {})[r["interposer"]] = r
            pairs = [v for v in by_round.values() if True in v and False in v]
            if not pairs:
                continue
            model = pairs[0][False]["model"]
            for m in metrics:
                bare = [p[False][m] for p in pairs]
                withi = [p[True][m] for p in pairs]
                ratios = [w / b for w, b in zip(withi, bare) if b > 0]
                lines.append(f"| {role} ({model}) | {m} | {statistics.median(bare):.3f} | "
                             f"{statistics.median(withi):.3f} | "
                             f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, "
                             f"{max(ratios):.3f}] |")
        lines.append("")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--train-model", default="resnet50")
    p.add_argument("--graph", action="store_true", help="serve a CUDA graph of the model")
    p.add_argument("--jobs", default="service-closed,service-poisson,trainer",
                   help="which jobs to run each round (service-closed always runs: it sets "
                        "the Poisson rate)")
    p.add_argument("--nvtx", action="store_true",
                   help="NVTX range per request and step (both arms)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--limit", choices=["taskset", "cgroup"], default="taskset")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--load", type=float, default=0.5)
    p.add_argument("--train-steps", type=int, default=60)
    p.add_argument("--out")
    p.add_argument("--baseline-interposer",
                   help="compare against this liborion_interpose.so (another build) instead of "
                        "no interposer: the table's 'bare' column is then that build")
    p.add_argument("--baseline-env", action="append", default=[], metavar="KEY=VALUE",
                   help="compare against this build with these variables set (repeatable; e.g. "
                        "ORION_NO_TIMING=1 ORION_NVTX_DEPTH=0: what the timeline's recording "
                        "costs): the table's 'bare' column is then that arm")
    p.add_argument("--table", help="print the table of a results.jsonl and exit")
    args = p.parse_args()
    for kv in args.baseline_env:
        if "=" not in kv or not kv.partition("=")[0].startswith("ORION_"):
            p.error(f"--baseline-env {kv!r}: expected ORION_NAME=VALUE")
    if args.baseline_env and args.baseline_interposer:
        p.error("--baseline-env and --baseline-interposer: one baseline at a time")
    if args.table:
        table = render(args.table)
        with open(os.path.join(os.path.dirname(args.table) or ".", "results.md"), "w") as f:
            f.write(table + "\n")
        print(table)
        return
    if not args.bundle:
        p.error("--bundle is required")
    bench = Bench(args)
    bench.main()
    with open(os.path.join(bench.out, "results.md"), "w") as f:
        f.write(render(os.path.join(bench.out, "results.jsonl")) + "\n")


if __name__ == "__main__":
    main()
