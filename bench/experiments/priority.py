"""The priority benchmark: high-priority services next to best-effort trainers on one GPU, under
each sharing configuration, side by side in one run.

For every trainer (BE) and configuration it starts the trainer, waits until it is warm, then runs
each service (HP) in turn with Poisson arrivals at --load (default 0.5) of the service's capacity
alone, and measures the service's latency percentiles (from the scheduled arrival), the fraction
of the time it was serving ("busy"), and the trainer's steps per second inside the service's
window. Every figure is reported relative to the job alone.

Configurations (NAME, or NAME:knob=value+knob=value to set orion-ctl policy knobs for that run):
  timeslice   no orion, no MPS: the GPU's default time-slicing between processes
  mps         the MPS daemon, no orion
  mps-alone   the MPS daemon and the service alone, no trainer: what MPS itself costs it
  mps-prio    MPS with the trainer at CUDA_MPS_CLIENT_PRIORITY=1 (below normal)
  orion-pass  both under orion-run, gate in pass-through mode (observe only)
  orion       both under orion-run, gate in priority mode
  mps-cap     mps-prio with the trainer's SMs capped: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
              (--mps-be-percent)
  orion-mps   MPS daemon + orion gate in mps mode; the trainer gets CUDA_MPS_CLIENT_PRIORITY=1
              and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (--mps-be-percent)
  The knob be_percent=N (mps-cap, orion-mps) sets the trainer's SM percentage for that run.
  The knob gemm_split=0 (orion configurations) runs the trainer with ORION_GEMM_SPLIT=0: its
  long GEMMs go whole (the arm without the split, in the same run); timing_hold=0 runs it with
  ORION_TIMING_HOLD=0, gemm_split_ns=N with ORION_GEMM_SPLIT_NS=N (pieces of at most N ns);
  be_env=ORION_NAME=VALUE sets any ORION_ variable in its environment (another build's knob,
  with @alt).
  The knob target_x=F (orion, orion-mps) gives each service a latency target of F times its p99
  alone in this run (orion-run --latency-target-ms, whole ms): the server adapts the budget to it.
  Every orion configuration starts from its mode's default budget unless be_budget_us is given.
  NAME@alt[:knobs] (with --alt-interposer PATH): the orion configuration with that interposer
  instead of the bundle's, to compare two builds of the gate in one run.
A trainer A+B runs A and B together beside each service (two best-effort pods on the GPU, say one
that cuts its GEMMs and one held on the GPU alone): each is measured alone on its own, the row's
trainer ratio is the sum of theirs (the GPU time both got), and be_parts keeps each one's.

  orion_bench.py priority --bundle DIR [--hp resnet50,resnet50-graph,bert] [--be resnet50]
      [--configs timeslice,orion] [--requests 2000] [--repeat N] [--closed-loop] [--out DIR]
  orion_bench.py priority --bundle DIR --split paired [--hp-cores 1] [--first-round 3 --repeat 2]
  orion_bench.py priority --table results.jsonl      (re-renders a run's table)
--traces marks every request with an NVTX range (all configurations) and, after each orion
configuration's service run, exports the last --trace-ms of the server's timeline to
trace-CONFIG-SERVICE-rN.json in --out, for orion_bench.py request-trace (what ran on the GPU during
the slowest requests).
--paired-alone runs each service alone again right before every configuration and compares the
configuration with that run, not the round's first: the host's speed drifts within minutes, and
a pair a minute apart cancels most of it.
--closed-loop runs each service back to back instead of with Poisson arrivals: no queueing, so
the service time beside each trainer (what a configuration costs the service) is compared with
far less noise than a p99 of queued requests; the trainer's ratio is measured the same way.
DIR (tools/bundle.sh) holds orion-server, orion-ctl, orion-run, liborion_interpose.so, the
samples and lib/. Services/trainers "sample" are the driver-API samples (no PyTorch needed).
Writes results.jsonl and results.md to --out (default $OUT or a temp dir) and prints the table.
"""
import argparse
import collections
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import harness
from harness import MODELS, read_rows

ANSWERS = ("a latency-critical service beside a trainer on one GPU under each sharing "
           "configuration (time-slicing, MPS, orion's modes): latency and trainer throughput "
           "against each alone")
STALL_MS = 100  # a single service time above this (and 10x the p99) marks a stalled run


def hp_command(name, bundle):
    py = [sys.executable, MODELS, "serve"]
    return {
        "resnet50": py + ["resnet50"],
        "resnet50-graph": py + ["resnet50", "--graph"],
        "bert": py + ["bert"],
        "bert-graph": py + ["bert", "--graph"],
        "bert8-graph": py + ["bert8", "--graph"],
        "gpt2-decode": py + ["gpt2-decode"],
        "sample": [os.path.join(bundle, "orion-sample-infer"), "--kernels", "4",
                   "--kernel-us", "250"],
    }[name]


def be_command(name, bundle):
    if name == "sample":
        return [os.path.join(bundle, "orion-sample-train"), "--seconds", "100000", "--kernels",
                "20", "--kernel-us", "1000", "--progress"]
    return [sys.executable, MODELS, "train", name]


def parse_result(line):
    fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    out = {}
    for key, value in fields.items():
        try:
            v = float(value)
        except ValueError:
            continue
        if key.endswith("_us"):  # the samples report microseconds
            out[key[:-3] + "_ms"] = v / 1e3
        else:
            out[key] = v
    if "throughput_rps" in out and "capacity_rps" not in out:
        out["capacity_rps"] = out["throughput_rps"]
    return out


CONFIGS = ("timeslice", "mps", "mps-alone", "mps-prio", "mps-cap", "orion-pass", "orion",
           "orion-mps")
MPS_CONFIGS = ("mps", "mps-alone", "mps-prio", "mps-cap", "orion-mps")
MODES = {"orion": "priority", "orion-pass": "pass-through", "orion-mps": "mps"}

# The runs behind the published tables (each fits a 10-minute slot of GPU time), by name:
# --split NAME puts these options first; options given after them override them (--repeat,
# --first-round, --hp-cores, --configs, --requests, --hp, --be).
SPLITS = {
    # ResNet50 b4 eager beside ResNet50 b64 training: time-slicing, MPS with the trainer at
    # client priority 1 and 50% of the SMs, orion's MPS mode (the same plus the gate), orion's
    # priority mode on the time-sliced GPU.
    "headline": ["--hp", "resnet50", "--be", "resnet50", "--requests", "5000",
                 "--configs", "timeslice,mps-cap,orion-mps,orion"],
    # The same pair under plain MPS, MPS with client priority, and orion pass-through.
    "mps": ["--hp", "resnet50", "--be", "resnet50", "--requests", "2000",
            "--configs", "mps,mps-prio,orion-pass"],
    # The headline pair in rounds, each against its own round's alone run.
    "spread": ["--hp", "resnet50", "--be", "resnet50", "--requests", "2000", "--repeat", "3",
               "--configs", "orion-mps,orion"],
    # The eager service at 0.3 of its capacity beside the trainer, each configuration against
    # the service alone right before it; 5 rounds in two commands (--first-round 0 --repeat 3,
    # then --first-round 3 --repeat 2: their results.jsonl concatenate); --hp-cores 1 for a
    # one-CPU pod. Each orion run's timeline is kept for request-trace.
    "paired": ["--hp", "resnet50", "--be", "resnet50", "--load", "0.3", "--requests", "1000",
               "--paired-alone", "--request-logs", "--traces", "--settle-seconds", "2",
               "--be-alone-seconds", "8", "--hp-cores", "2", "--repeat", "3",
               "--configs", "mps-cap,orion-mps"],
    # Service times beside the trainer without queueing (closed loop), in rounds.
    "closed": ["--hp", "resnet50,bert", "--be", "resnet50", "--closed-loop", "--repeat", "2",
               "--configs", "mps-cap,orion-mps,orion"],
    # The matrix: every service beside one trainer (--be resnet50, bert or gpt2-large).
    "pairs": ["--hp", "resnet50,resnet50-graph,bert", "--be", "bert", "--requests", "2000",
              "--be-alone-seconds", "10", "--configs", "timeslice,mps-cap,orion-mps,orion"],
    # The workload matrix (orion_bench.py matrix): three services (a CUDA-graph CNN, a
    # short-request transformer graph, an eager token-by-token decoder) beside one trainer
    # (--be resnet50 or gptlm), every configuration in rotating order, each service run about
    # --run-seconds long; one round fits a 9-minute command (--first-round K --repeat 1, the
    # results.jsonl files concatenate). orion runs with its defaults (the budget sized to the
    # service); orion:be_budget_us=500 is the fixed budget it replaces.
    "matrix": ["--hp", "resnet50-graph,bert8-graph,gpt2-decode", "--be", "gptlm",
               "--run-seconds", "4", "--min-requests", "100", "--be-alone-seconds", "8",
               "--settle-seconds", "2",
               "--repeat", "1", "--configs", "orion,orion:be_budget_us=500,orion-mps,mps-cap"],
    # The driver-API samples (no PyTorch).
    "samples": ["--hp", "sample", "--be", "sample", "--requests", "4000",
                "--configs", "timeslice,orion-pass,orion"],
}

def host_shares(before, after):
    """What the service's cores did over its run: steal (the hypervisor ran something else on
    them: a virtual machine's CPU time taken away) and irq (interrupts), as fractions."""
    if not before or not after:
        return {}
    d = [b - a for a, b in zip(before, after)]
    total = sum(d)
    if total <= 0:
        return {}
    return {"steal": round(d[7] / total, 4), "irq": round((d[5] + d[6]) / total, 4)}


def file_tag(text):
    """`text` made safe for a file name (letters, digits, '-' and '.'; the rest '_')."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in text)


def against_alone(row, alone):
    """Adds to a service's row its latencies over the same service's alone run (NAME_x)."""
    for q in ("p50_ms", "p99_ms", "p999_ms", "mean_ms", "svc_p50_ms"):
        if q in row and alone.get(q):
            row[q.replace("_ms", "_x")] = round(row[q] / alone[q], 3)
    return row


def trainer_group(be):
    """The trainers of a --be entry, each with its own key: "llm+resnet50" runs both together,
    "llm" one, "sample+sample" two of the same (keys sample, sample#2)."""
    names = be.split("+")
    if not all(names) or any("#" in n for n in names):
        raise SystemExit(f"--be {be}: trainers together are NAME+NAME (names without '#')")
    seen = collections.Counter()
    keys = []
    for name in names:
        seen[name] += 1
        keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return keys


def trainer_name(key):
    """The trainer a trainer_group key runs ("sample#2" -> "sample")."""
    return key.partition("#")[0]


def group_ratio(rates, alone):
    """Each trainer's speed (by its key) against its trainer's speed alone, and their sum (the
    share of a GPU the group got); (None, None) where a trainer has no speed alone."""
    if not all(alone.get(trainer_name(k)) for k in rates):
        return None, None
    parts = {k: r / alone[trainer_name(k)] for k, r in rates.items()}
    return round(sum(parts.values()), 3), {k: round(x, 3) for k, x in parts.items()}


def harvest_of(row, alone_busy):
    """Harvest efficiency: the trainer's throughput against its alone speed, over the share of the
    GPU the service leaves idle alone (1 - its busy fraction alone). 1.0: the trainer got all of
    the idle GPU time-sharing can give it."""
    if "be_x" not in row or alone_busy is None or not 0 <= alone_busy < 1:
        return None
    return round(row["be_x"] / (1 - alone_busy), 3)


def with_harvest(results):
    """Rows with "harvest" filled in where a row has a trainer ratio: from the row, or from the
    service's latest alone run before it (older runs' JSONL has no such field)."""
    alone_busy, out = {}, []
    for r in results:
        if r.get("config") == "alone" and r.get("hp") and "busy" in r:
            alone_busy[r["hp"]] = r["busy"]
        elif "be_x" in r and "harvest" not in r:
            h = harvest_of(r, alone_busy.get(r.get("hp")))
            r = dict(r, harvest=h) if h is not None else r
        out.append(r)
    return out


# One configuration of a run: name, whether it uses --alt-interposer, the orion-ctl policy knobs
# (a list of knob=value), the trainer's MPS SM percentage, the services' latency target as a
# multiple of their p99 alone (0: none).
Config = collections.namedtuple("Config", "name alt knobs be_percent target_x be_env")
BOOL_KNOBS = ("adapt_budget", "gpu_hold")
# Knobs of the trainer's interposer, set in its environment: knob -> (variable, check, wanted).
TRAINER_ENV_KNOBS = {
    "gemm_split": ("ORION_GEMM_SPLIT", lambda v: v in ("0", "1"), "0 or 1"),
    "timing_hold": ("ORION_TIMING_HOLD", lambda v: v in ("0", "1"), "0 or 1"),
    "gemm_split_ns": ("ORION_GEMM_SPLIT_NS",
                      lambda v: v.isdigit() and 10_000 <= int(v) <= 100_000_000,
                      "nanoseconds in 10000..100000000"),
}


def parse_config(spec, args):
    """NAME[@alt][:knob=v+knob=v] -> Config; a bad one ends the run before anything starts."""
    head, _, knobs = spec.partition(":")
    cfg, at, build = head.partition("@")
    if cfg not in CONFIGS:
        raise SystemExit(f"{spec}: unknown configuration '{cfg}' (one of {', '.join(CONFIGS)})")
    if at and (build != "alt" or not args.alt_interposer or not cfg.startswith("orion")):
        raise SystemExit(f"{spec}: '@alt' wants --alt-interposer and an orion configuration")
    be_percent, knob_list, target_x, be_env = args.mps_be_percent, [], 0.0, {}
    for kv in (k for k in knobs.split("+") if k):
        key, eq, value = kv.partition("=")
        if not eq or not value:
            raise SystemExit(f"{spec}: '{kv}' is not knob=value")
        if key == "be_percent":
            if not value.isdigit() or not 1 <= int(value) <= 100 or cfg not in ("mps-cap",
                                                                               "orion-mps"):
                raise SystemExit(f"{spec}: be_percent wants 1..100 and an mps-cap or orion-mps "
                                 f"configuration")
            be_percent = int(value)
        elif key == "target_x":
            try:
                target_x = float(value)
            except ValueError:
                target_x = 0.0
            if not 0 < target_x <= 100 or cfg not in ("orion", "orion-mps"):
                raise SystemExit(f"{spec}: target_x wants a number in (0, 100] and an orion or "
                                 f"orion-mps configuration")
        elif not cfg.startswith("orion"):
            raise SystemExit(f"{spec}: knob '{key}' wants an orion configuration")
        elif key == "be_env":
            variable, eq2, setting = value.partition("=")
            if not eq2 or not re.fullmatch(r"ORION_[A-Z0-9_]+", variable):
                raise SystemExit(f"{spec}: be_env wants ORION_NAME=VALUE")
            be_env[variable] = setting
        elif key in TRAINER_ENV_KNOBS:  # the trainer's environment, not a server knob
            variable, valid, wants = TRAINER_ENV_KNOBS[key]
            if not valid(value):
                raise SystemExit(f"{spec}: {key} wants {wants}")
            be_env[variable] = value
        else:
            knob_list.append(kv)
    return Config(cfg, bool(build), knob_list, be_percent, target_x, be_env)


class Bench:
    def __init__(self, args):
        self.args = args
        self.bundle = os.path.abspath(args.bundle)
        self.work = tempfile.mkdtemp(prefix="orion-bench.")
        self.out = args.out or os.environ.get("OUT") or self.work
        os.makedirs(self.out, exist_ok=True)
        self.lib_env = {"LD_LIBRARY_PATH": os.path.join(self.bundle, "lib")}
        self.server = None
        self.mps_env = None
        self.results = []
        self.round = args.first_round
        self.allowed_cpus = sorted(os.sched_getaffinity(0))
        self.log = open(os.path.join(self.out, "bench.log"), "a")
        self.began = time.monotonic()
        self.bundle_interposer = os.path.join(self.bundle, "liborion_interpose.so")
        self.interposer = self.bundle_interposer  # the current configuration's (NAME@alt)

    # ---- orion-server, orion-ctl, MPS -------------------------------------------------------
    def start_server(self):
        self.server = harness.Server(
            self.bundle, self.work, self.log, admin_port=self.args.admin_port, mode="priority",
            popen=lambda argv, **kw: self.popen(argv, "server", **kw)).start()

    def ctl(self, *argv):
        return self.server.ctl(*argv)

    def start_mps(self):
        # On every core this script may use, not its own pinned ones.
        self.mps_env, why = harness.start_mps_daemon(self.work, set(self.allowed_cpus))
        return why

    def stop_mps(self):
        if self.mps_env is None:
            return
        harness.stop_mps_daemon(self.mps_env)
        self.mps_env = None

    # ---- processes ---------------------------------------------------------------------------
    def cpus(self, role):
        """The cores of a role when --pin is on (as a latency-critical pod gets exclusive cores
        from the kubelet's static CPU manager), from the cores this script may use at start: the
        server and this script the first two, the service the next --hp-cores (2), the trainer
        the rest.
        None: no pinning (fewer than 8 cores)."""
        cores = self.allowed_cpus
        if not self.args.pin or len(cores) < 8:
            return None
        hp = self.args.hp_cores
        return set({"server": cores[0:2], "hp": cores[2:2 + hp], "be": cores[2 + hp:]}[role])

    def popen(self, argv, role, **kw):
        p = subprocess.Popen(argv, **kw)
        cpus = self.cpus(role)
        if cpus:
            harness.pin(p.pid, cpus, role)
        return p

    def wrap(self, argv, cfg, role, extra_env, run_args=()):
        env = dict(os.environ)
        if self.mps_env:
            env.update(self.mps_env)
        env.update(extra_env)
        if cfg.startswith("orion"):
            env["ORION_SOCKET"] = self.server.socket
            prio = "high" if role == "hp" else "best-effort"
            argv = harness.orion_run(self.bundle, prio, self.interposer, run_args) + argv
        return argv, env

    def run_hp(self, name, rate, requests, cfg="alone", extra_env=None, run_args=(), spec=None):
        if self.args.run_seconds and rate > 0:  # about that long at this rate
            requests = max(self.args.min_requests, round(rate * self.args.run_seconds))
        argv = hp_command(name, self.bundle) + ["--rate", str(rate), "--requests", str(requests)]
        if self.args.request_logs and rate > 0 and name != "sample":
            tag = file_tag(f"{spec or cfg}-{name}")
            argv += ["--request-log", os.path.join(self.out, f"requests-{tag}-r{self.round}.jsonl")]
        if self.args.traces and rate > 0:
            argv += ["--nvtx"]
        if rate == 0 and self.args.closed_loop and name != "sample":
            argv += ["--seconds", str(self.args.closed_loop_seconds)]
        argv, env = self.wrap(argv, cfg, "hp", extra_env or {}, run_args)
        p = self.popen(argv, "hp", env=env, stdout=subprocess.PIPE, stderr=self.log, text=True)
        start = end = None
        result = None
        cores = self.cpus("hp") or self.allowed_cpus
        for line in p.stdout:
            self.log.write(f"[hp {name} {cfg}] {line}")
            if start is None and (line.startswith("serving") or line.startswith("orion-sample-infer:")):
                start = time.monotonic()
                ticks0 = harness.cpu_ticks(cores)
            if line.startswith("result"):
                end = time.monotonic()
                result = parse_result(line)
                result.update(host_shares(ticks0, harness.cpu_ticks(cores)) if start else {})
        p.wait()
        if result is None:
            raise RuntimeError(f"service {name} under {cfg} gave no result (exit {p.returncode})")
        stall = result.get("svc_max_ms", 0)
        if stall > max(STALL_MS, 10 * result.get("svc_p99_ms", 0)):
            # One request took many times the service's p99: the host stopped the service (seen
            # on virtual machines: 500 ms), and the requests queued behind it own the tail.
            result["stall_ms"] = stall
            print(f"warning: {name} under {cfg}: one request took {stall:.0f} ms (service time p99 "
                  f"{result.get('svc_p99_ms', 0):.1f} ms), a stall of the host: this run's "
                  f"latency percentiles are not comparable", file=sys.stderr)
        return result, start, end

    def start_be(self, name, cfg, extra_env):
        argv, env = self.wrap(be_command(name, self.bundle), cfg, "be", extra_env)
        p = self.popen(argv, "be", env=env, stdout=subprocess.PIPE, stderr=self.log, text=True,
                       start_new_session=True)
        steps = []
        ready = threading.Event()
        said_ready = []

        def reader():
            for line in p.stdout:
                if line.startswith("step "):
                    steps.append(float(line.split()[1]))
                elif line.startswith("ready"):
                    said_ready.append(True)
                    ready.set()
                else:
                    self.log.write(f"[be {name} {cfg}] {line}")
            ready.set()  # its output closed: it exited (said_ready tells whether it got ready)

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        if not ready.wait(timeout=300) or not said_ready or p.poll() is not None:
            self.stop_be(p, t)
            raise RuntimeError(f"trainer {name} under {cfg} did not get ready (its log: bench.log)")
        return p, steps, t

    def start_trainers(self, be, cfg, spec, be_env):
        """Starts the trainers of `be` (trainer_group), each warm before the next starts; key ->
        (process, steps, reader), or None when one did not get ready (recorded; the others
        stopped)."""
        started = {}
        for key in trainer_group(be):
            name = trainer_name(key)
            try:
                try:
                    started[key] = self.start_be(name, cfg, be_env)
                except RuntimeError as e:
                    # Once more: under MPS a client started right after the last one exited
                    # can find the device "busy or unavailable" while the daemon tears down.
                    self.log.write(f"[be {name} {cfg}] {e}; starting it once more in 5 s\n")
                    time.sleep(5)
                    started[key] = self.start_be(name, cfg, be_env)
            except BaseException as e:  # the others stop too: ended by a signal, say
                for tp, _, tt in started.values():
                    self.stop_be(tp, tt)
                if not isinstance(e, RuntimeError):
                    raise
                self.record({"config": spec, "be": be, "error": str(e)})
                return None
        return started

    @staticmethod
    def stop_be(proc, thread):
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        thread.join(timeout=5)

    @staticmethod
    def rate_in(steps, start, end):
        """Steps per second inside [start, end], counting the partial steps at both edges."""
        done = 0.0
        prev = None
        for t in list(steps):
            if prev is not None and t > start and prev < end:
                lo, hi = max(prev, start), min(t, end)
                done += (hi - lo) / (t - prev)
            prev = t
        return done / (end - start) if end > start else 0.0

    def snapshot_during(self, label):
        """Every 5 s until the returned event is set: orion-ctl policy/clients and /metrics,
        appended to snapshot-LABEL.txt (what the gate saw while the service ran)."""
        return harness.snapshot_every(os.path.join(self.out, f"snapshot-{file_tag(label)}.txt"),
                                      self.server)

    # ---- the run -----------------------------------------------------------------------------
    def record(self, row):
        row["t_s"] = round(time.monotonic() - self.began, 1)  # when it ended, from the start
        for role, key in (("hp", "hp_cpus"), ("be", "be_cpus")):
            if row.get(role) and self.cpus(role):
                row[key] = sorted(self.cpus(role))  # the pinning, recorded
        self.results.append(row)
        with open(os.path.join(self.out, "results.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    def run(self):
        a = self.args
        if self.cpus("server"):
            os.sched_setaffinity(0, self.cpus("server"))
        self.start_server()
        try:
            # The server's knobs as configured (and a check that it answers): what a
            # configuration's knobs go back to after it.
            self.defaults = json.loads(self.ctl("--json", "policy", "--all", "mode=priority"))
            capacity, alone_hp, alone_be = {}, {}, {}
            for hp in a.hp:
                closed = self.run_hp(hp, 0, 200)[0]
                capacity[hp] = closed["capacity_rps"]
                rate = self.rate(capacity, hp)
                alone_hp[hp] = self.run_hp(hp, rate, a.requests)[0] if rate else closed
                if alone_hp[hp].get("busy", 0) > a.load * 1.25:
                    print(f"warning: {hp} alone was busy {alone_hp[hp]['busy']:.2f} of the time at "
                          f"{rate}/s, not {a.load}: the capacity measurement overestimates it",
                          file=sys.stderr)
                self.record({"config": "alone", "hp": hp, "be": None, "rate": rate,
                             "round": self.round, "capacity_rps": capacity[hp], **alone_hp[hp]})
            trainers = dict.fromkeys(trainer_name(k) for be in a.be for k in trainer_group(be))
            for name in trainers:
                alone_be[name] = self.measure_be_alone(name)
            for self.round in range(a.first_round, a.first_round + a.repeat):
                if self.round > a.first_round:  # a fresh baseline each round: the machine drifts
                    for hp in a.hp if not a.paired_alone else ():
                        rate = self.rate(capacity, hp)
                        alone_hp[hp] = self.run_hp(hp, rate, a.requests)[0]
                        self.record({"config": "alone", "hp": hp, "be": None, "rate": rate,
                                     "round": self.round, **alone_hp[hp]})
                    for name in trainers:
                        alone_be[name] = self.measure_be_alone(name)
                # Each round starts one configuration later: the host drifts within a round
                # too, and a fixed order would hand that drift to the same configurations.
                for spec in harness.rotated(a.configs, self.round - a.first_round):
                    self.run_config(spec, capacity, alone_hp, alone_be)
        finally:
            if self.server:
                self.server.stop()
            self.stop_mps()
        self.write_table()

    def rate(self, capacity, hp):
        """The service's Poisson arrival rate; 0 (closed loop) with --closed-loop."""
        return 0 if self.args.closed_loop else round(capacity[hp] * self.args.load, 1)

    def export_trace(self, label, last_ms):
        """The server's timeline of the run just ended (its last `last_ms`), as a Chrome trace."""
        path = os.path.join(self.out, f"trace-{file_tag(label)}-r{self.round}.json")
        try:
            self.ctl("timeline", "--last-ms", str(int(last_ms)), "--trace", path)
        except SystemExit as e:  # a trace is a diagnostic: the run goes on without it
            print(f"warning: no trace for {label}: {e}", file=sys.stderr)

    def measure_be_alone(self, be):
        p, steps, t = self.start_be(be, "alone", {})
        t0 = time.monotonic()
        time.sleep(self.args.be_alone_seconds)
        rate = self.rate_in(steps, t0, time.monotonic())
        self.stop_be(p, t)
        self.record({"config": "alone", "hp": None, "be": be, "round": self.round,
                     "steps_per_s": rate})
        return rate

    def run_config(self, spec, capacity, alone_hp, alone_be):
        a = self.args
        c = parse_config(spec, a)
        cfg = c.name
        if a.paired_alone:  # this configuration's own baseline, a minute before it
            for hp in a.hp:
                rate = self.rate(capacity, hp)
                alone_hp[hp] = self.run_hp(hp, rate, a.requests, spec=f"alone-before-{spec}")[0]
                self.record({"config": "alone", "hp": hp, "be": None, "rate": rate,
                             "round": self.round, "before": spec, **alone_hp[hp]})
        self.interposer = os.path.abspath(a.alt_interposer) if c.alt else self.bundle_interposer
        be_env = dict(c.be_env)
        if cfg in MPS_CONFIGS:
            why = self.start_mps()
            if why:
                self.record({"config": spec, "error": why})
                return
        if cfg == "mps-alone":
            try:
                for hp in a.hp:
                    rate = self.rate(capacity, hp)
                    try:
                        r, _, _ = self.run_hp(hp, rate, a.requests, cfg, spec=spec)
                    except RuntimeError as e:
                        self.record({"config": spec, "hp": hp, "error": str(e)})
                        continue
                    self.record(against_alone({"config": spec, "hp": hp, "be": None, "rate": rate,
                                               "round": self.round, **r}, alone_hp[hp]))
            finally:
                self.stop_mps()
            return
        if cfg in ("mps-prio", "mps-cap", "orion-mps"):
            be_env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
        if cfg in ("mps-cap", "orion-mps"):
            be_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(c.be_percent)
        start_budget = None
        if cfg.startswith("orion"):
            mode = MODES[cfg]
            given = [k.partition("=")[2] for k in c.knobs if k.startswith("be_budget_us=")]
            # No budget given: the server's own (adapt_budget=true hands it back to the server,
            # which starts from the mode's default and sizes it to the service).
            start_budget = f"be_budget_us={given[-1]}" if given else "adapt_budget=true"
            self.ctl("policy", "--all", f"mode={mode}", start_budget,
                     *[k for k in c.knobs if not k.startswith("be_budget_us=")])
        try:
            for be in a.be:
                trainers = self.start_trainers(be, cfg, spec, be_env)
                if trainers is None:
                    continue
                try:  # every trainer stops, whatever ends the service's runs
                    time.sleep(a.settle_seconds)
                    for hp in a.hp:
                        self.run_beside(hp, be, trainers, spec, c, start_budget, capacity,
                                        alone_hp, alone_be)
                finally:
                    for tp, _, tt in trainers.values():
                        self.stop_be(tp, tt)
        finally:
            if cfg.startswith("orion") and c.knobs:  # back to the defaults for the next config
                restore = ["mode=priority"]
                for kv in c.knobs:
                    key = kv.partition("=")[0]
                    # orion-ctl's JSON leaves zero and false values out
                    value = self.defaults.get(key, False if key in BOOL_KNOBS else 0)
                    if key == "mode":  # "GATE_MODE_PASS_THROUGH" -> "pass-through"
                        value = str(value).removeprefix("GATE_MODE_").replace("_", "-")
                    restore.append(f"{key}={str(value).lower()}")
                self.ctl("policy", "--all", *restore)
            if cfg in MPS_CONFIGS:
                self.stop_mps()

    def run_beside(self, hp, be, trainers, spec, c, start_budget, capacity, alone_hp, alone_be):
        """One run of service `hp` beside the running `trainers` (start_trainers) of `be`, under
        configuration `c` (`spec`): its row, against the service alone and the trainers alone."""
        a = self.args
        cfg = c.name
        rate = self.rate(capacity, hp)
        snap = self.snapshot_during(f"{spec}-{hp}-{be}") if cfg.startswith("orion") else None
        target = []
        if c.target_x:
            target_ms = max(1, round(alone_hp[hp]["p99_ms"] * c.target_x))
            target = ["--latency-target-ms", str(target_ms)]
            self.ctl("policy", "--all", start_budget)  # a fresh search per service
        try:
            r, start, end = self.run_hp(hp, rate, a.requests, cfg, run_args=target, spec=spec)
            if a.traces and cfg.startswith("orion") and rate > 0:
                self.export_trace(f"{spec}-{hp}", min(a.trace_ms, (end - start) * 1e3))
            if target:
                r["target_ms"] = int(target[1])
            if cfg.startswith("orion"):  # the budget the run ended with
                r["budget_us_end"] = int(json.loads(self.ctl("--json", "policy"))
                                         .get("be_budget_us", 0))
        except RuntimeError as e:
            self.record({"config": spec, "hp": hp, "be": be, "error": str(e)})
            return
        finally:
            if snap:
                snap.set()
        died = [f"trainer {n} exited (code {tp.returncode})"
                for n, (tp, _, _) in trainers.items() if tp.poll() is not None]
        if died:  # a trainer that died gives no harvest of 0
            self.record({"config": spec, "hp": hp, "be": be,
                         "error": f"{', '.join(died)} during the service's run; its log: "
                                  "bench.log"})
            return
        rates = {n: self.rate_in(steps, start, end) for n, (_, steps, _) in trainers.items()}
        row = against_alone({"config": spec, "hp": hp, "be": be, "rate": rate,
                             "round": self.round, **r}, alone_hp[hp])
        if len(rates) == 1:
            row["be_steps_per_s"] = next(iter(rates.values()))
        else:
            row["be_steps_per_s"] = rates
        be_x, parts = group_ratio(rates, alone_be)
        if be_x is not None:
            row["be_x"] = be_x
            if len(parts) > 1:
                row["be_parts"] = parts
            h = harvest_of(row, alone_hp[hp].get("busy"))
            if h is not None:
                row["harvest"] = h
        if "stall_ms" in alone_hp[hp]:
            row["baseline_stall_ms"] = alone_hp[hp]["stall_ms"]
        self.record(row)

    def write_table(self):
        text = render_table(self.results, self.args.repeat)
        with open(os.path.join(self.out, "results.md"), "w") as f:
            f.write(text)
        print(text)


def trainer_ratio(row):
    """The trainer column of a row: its ratio, and each trainer's where several ran together."""
    if "be_x" not in row:
        return "-"
    parts = row.get("be_parts")
    return f"{row['be_x']:.2f}x" + (
        f" ({' + '.join(f'{k} {x:.2f}x' for k, x in parts.items())})" if parts else "")


def render_table(results, repeat, summary=False):
    """The markdown table of a run's rows (and, over several rounds, the median summary); with
    `summary`, the median summary alone."""
    results = with_harvest(results)
    if summary:
        return "\n".join(summary_lines(results, repeat)[3:]) + "\n"
    lines = ["| service | trainer | config | p50 | p99 | p99.9 | mean | service time p50 | busy "
             "| p50 / p99 / p99.9 / service time vs alone | trainer vs alone "
             "| harvest efficiency |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ms = lambda r, k: f"{r[k]:.2f} ms" if k in r else "-"
    for r in results:
        if r.get("error") or r["config"] == "alone" and r.get("hp") is None:
            continue
        ratios = "1.00x" if r["config"] == "alone" else " / ".join(
            f"{r[k]:.2f}x" if k in r else "-"
            for k in ("p50_x", "p99_x", "p999_x", "svc_p50_x"))
        cfg = r["config"] + (f" (before {r['before']})" if "before" in r else "") + (
            f" (stall {r['stall_ms']:.0f} ms)" if "stall_ms" in r else "") + (
            " (its alone run stalled)" if "baseline_stall_ms" in r else "") + (
            f" (target {r['target_ms']} ms)" if "target_ms" in r else "") + (
            f" (budget {r['budget_us_end']} µs at the end)" if "budget_us_end" in r else "")
        lines.append(" | ".join([
            f"| {r['hp']}", r["be"] or "-", cfg, ms(r, "p50_ms"), ms(r, "p99_ms"),
            ms(r, "p999_ms"), ms(r, "mean_ms"), ms(r, "svc_p50_ms"),
            f"{r['busy']:.2f}" if "busy" in r else "-", ratios,
            trainer_ratio(r),
            f"{r['harvest']:.2f} |" if "harvest" in r else "- |"]))
    for r in results:
        if r["config"] == "alone" and r.get("be"):
            label = "alone" + (f" (round {r.get('round', 0) + 1})" if repeat > 1 else "")
            lines.append(f"| - | {r['be']} | {label} | | | | | | | | "
                         f"{r['steps_per_s']:.2f} steps/s | |")
        if r.get("error"):
            lines.append(f"| {r.get('hp', '-')} | {r.get('be', '-')} | {r['config']} | "
                         f"error: {r['error']} | | | | | | | | |")
    if repeat > 1:
        lines += summary_lines(results, repeat)
    return "\n".join(lines) + "\n"


def table_rows(rows, services=None, trainers=None):
    """The rows a --table keeps: with services (HP,...) those services' rows, with trainers
    (BE,...) those trainers', each with the alone rows of the other side (a trainer's alone row
    has no service, a service's no trainer)."""
    for key, names in (("hp", services), ("be", trainers)):
        if names:
            keep = names.split(",")
            rows = [r for r in rows if r.get(key) in keep or r.get(key) is None]
    return rows


def summary_lines(results, repeat):
    """The median summary over rounds: a heading, then its table (from the fourth line)."""
    lines = []
    paired = any("before" in r for r in results)
    lines += ["", f"Over {repeat} rounds (each against its own " +
              ("alone run right before it" if paired else "round's alone run") +
              "): median [min, max]", "",
              "| service | trainer | config | p50 vs alone | p99 vs alone | mean vs alone "
              "| service time vs alone | trainer vs alone | harvest efficiency |",
              "|---|---|---|---|---|---|---|---|---|"]
    groups = {}
    for r in results:
        if r.get("error") or r["config"] == "alone":
            continue
        groups.setdefault((r["hp"], r["be"], r["config"]), []).append(r)

    def spread(rows, key, suffix="x"):
        return harness.spread((r[key] for r in rows if key in r), suffix=suffix)
    for (hp, be, cfg), every in groups.items():
        # Rounds where the service or its alone baseline stalled compare nothing.
        rows = [r for r in every if "stall_ms" not in r and "baseline_stall_ms" not in r]
        if len(rows) < len(every):
            cfg += f" ({len(rows)} of {len(every)} rounds: the others stalled)"
        elif len(rows) < repeat:
            cfg += f" ({len(rows)} rounds)"  # a run cut short before its last rounds
        lines.append(f"| {hp} | {be or '-'} | {cfg} | {spread(rows, 'p50_x')} | "
                     f"{spread(rows, 'p99_x')} | {spread(rows, 'mean_x')} | "
                     f"{spread(rows, 'svc_p50_x')} | {spread(rows, 'be_x')} | "
                     f"{spread(rows, 'harvest', '')} |")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle")
    p.add_argument("--table", metavar="RESULTS_JSONL", nargs="+",
                   help="print the table of an earlier run's results.jsonl (one cut short before "
                        "its table, say; several runs' files together) and exit")
    p.add_argument("--summary", action="store_true",
                   help="with --table: the medians over rounds alone")
    p.add_argument("--services", metavar="HP,...",
                   help="with --table: these services' rows alone")
    p.add_argument("--trainers", metavar="BE,...",
                   help="with --table: these trainers' rows alone (a group as written: llm+resnet50)")
    p.add_argument("--hp", default="resnet50")
    p.add_argument("--be", default="resnet50")
    p.add_argument("--configs", default="timeslice,orion-pass,orion")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of every configuration, each with a fresh alone baseline; the "
                        "table adds median [min, max] of each ratio")
    p.add_argument("--first-round", type=int, default=0,
                   help="number this run's rounds from here, so that the results.jsonl of runs "
                        "split over several commands concatenate into one table")
    p.add_argument("--request-logs", action="store_true",
                   help="each Poisson run of a service also writes requests-CONFIG-SERVICE-rN.jsonl "
                        "(one line per request) to --out, for orion_bench.py slow-requests")
    p.add_argument("--traces", action="store_true",
                   help="an NVTX range per request, and each orion run's timeline exported to "
                        "trace-CONFIG-SERVICE-rN.json in --out (orion_bench.py request-trace)")
    p.add_argument("--trace-ms", type=float, default=5000,
                   help="--traces: the last this many ms of each run (5000)")
    p.add_argument("--paired-alone", action="store_true",
                   help="run each service alone right before every configuration, and compare "
                        "the configuration with that run (instead of the round's first)")
    p.add_argument("--load", type=float, default=0.5,
                   help="the service's arrival rate as a fraction of its capacity alone")
    p.add_argument("--closed-loop", action="store_true",
                   help="run each service as a closed loop (back-to-back requests, no queueing) "
                        "instead of Poisson arrivals: compares service times with little noise")
    p.add_argument("--closed-loop-seconds", type=float, default=10,
                   help="--closed-loop: seconds measured per run")
    p.add_argument("--run-seconds", type=float, default=0,
                   help="each Poisson run of a service gets rate x this many requests (at least "
                        "--min-requests) instead of --requests: services of different speeds run "
                        "alike")
    p.add_argument("--min-requests", type=int, default=200,
                   help="--run-seconds: the fewest requests of a run (200)")
    p.add_argument("--be-alone-seconds", type=float, default=15)
    p.add_argument("--settle-seconds", type=float, default=3)
    p.add_argument("--mps-be-percent", type=int, default=50)
    p.add_argument("--alt-interposer",
                   help="another build of liborion_interpose.so, for configurations NAME@alt")
    p.add_argument("--admin-port", type=int, default=50071)
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                   help="give the service, the trainer and the server their own cores "
                        "(machines with 8 or more)")
    p.add_argument("--hp-cores", type=int, default=2, choices=range(1, 5),
                   help="--pin: cores of the service (1: a pod with a one-CPU limit)")
    p.add_argument("--out")
    p.add_argument("--split", choices=sorted(SPLITS),
                   help="the options of a published run (see SPLITS in this file); options "
                        "after it override them")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if args.split:
        args = p.parse_args(SPLITS[args.split] + argv)
    if args.table:
        rows = [r for path in args.table  # a run killed mid-write: lenient
                for r in read_rows(path, "priority", lenient=True)]
        rows = table_rows(rows, args.services, args.trainers)
        print(render_table(rows, len({r.get("round", 0) for r in rows}), args.summary), end="")
        return
    if not args.bundle:
        p.error("--bundle is required")
    if args.alt_interposer and not os.path.isfile(args.alt_interposer):
        p.error(f"--alt-interposer {args.alt_interposer}: no such file")
    args.hp = [x for x in args.hp.split(",") if x]
    args.be = [x for x in args.be.split(",") if x]
    for be in args.be:
        trainer_group(be)  # a bad group ends the run here, before anything starts
    args.configs = [x for x in args.configs.split(",") if x]
    if args.repeat < 1 or args.first_round < 0:
        raise SystemExit("--repeat wants 1 or more rounds, --first-round 0 or more")
    for spec in args.configs:
        parse_config(spec, args)
    Bench(args).run()
