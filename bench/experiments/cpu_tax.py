"""What the interposer costs a pod with one CPU: an eager PyTorch service and a trainer, each on
one CPU, with and without liborion_interpose.so (registered with a real orion-server), alternating
in every round so that host drift cancels.

  orion_bench.py cpu-tax --bundle DIR [--model resnet50] [--graph] [--nvtx] [--rounds 5]
      [--limit taskset|cgroup] [--requests 1000] [--load 0.5] [--train-model resnet50]
      [--train-steps 60] [--jobs service-closed,service-poisson,trainer]
      [--baseline-interposer LIB | --baseline-env KEY=VALUE ...]
      [--interleave N [--warm-up 300] [--in-process
      [--in-process-baseline NAME[,NAME...]] [--in-process-env KEY=VALUE ...]
      [--wrap 'CMD ...'] [--cpu-samples]]] [--out DIR]
  orion_bench.py cpu-tax --table results.jsonl ... [--interval]  (re-renders a run's table;
      several runs of one A/B pool their rounds; --interval adds the bootstrap 95% interval of
      each median ratio)
  orion_bench.py cpu-tax --table results.jsonl ... --split  (runs of several --in-process
      baselines: one table, each run's arms side by side, not pooled)

--limit taskset pins each job to one core (a cpuset); --limit cgroup runs it in a cgroup v2 with
cpu.max "100000 100000" (one CPU of quota, any core), as a pod with a 1-CPU limit is run.
Per round and for both (bare, interposer), in alternating order:
  service-closed   closed loop: service time and CPU per request (torch_models.py serve --rate 0)
  service-poisson  Poisson arrivals at --load of the bare closed-loop capacity of round 1 (with
                   several --in-process baselines: of the first one named)
                   (measured on one CPU): p50/p99 latency from the scheduled arrival, CPU/request
  trainer          --train-steps steps of training: step time p50/p99, CPU per step
The service runs high priority, the trainer best effort; neither has the other beside it, so the
gate holds nothing: the difference is what the interposer itself costs, timeline recording
included (launch events, sampled launches timed on the GPU; with --nvtx every request and step
is an NVTX range in both arms, recorded with GPU times under the interposer). --graph serves a
CUDA graph instead of the eager model.

--interleave N serves the two arms in turn instead: per round and job, one long-lived process
of each arm (on cores 2 and 3, --cpus, or in two cgroups of one CPU each; the arms swap them
every round), driven in blocks of N requests (--train-block steps; torch_models.py --driven),
the order alternating every block, --blocks blocks each after unrecorded ones (--warm-up
requests or steps, default 300, at least one block: past the interposer's learning of each
kernel, 1 in 8 of its first 256 launches timed). The host's
drift, which moves a whole run's service time by tens of percent within minutes, then falls on
both arms alike; each arm's figures pool its blocks, a Poisson block's arrivals are the same in
both arms. --in-process serves both arms from one interposed process (its core alternating
between rounds), the bare arm's blocks passing the interposer by (ORION_BENCH_SWITCH: the calls
go straight to the driver, nothing registers or is recorded): no difference between two
processes or two cores enters the A/B, only the hooks' entry and one check stay in the bare arm.
--in-process-baseline makes the baseline arm's blocks something else than the bypass: no-hold
(interposed, no timed launch held on its stream), no-timing (interposed, no launch timed),
no-launch-records (interposed, no launch counted or pushed to the event ring) or
no-ring-prefetch (interposed, the ring's next entry not prefetched for writing), so one process
resolves what the timing hold, the timed launches, the launch records or the prefetch cost or
save against this build; after-registration and before-clock cut each launch's path short (to
the driver once the registration is found; once the kernel's record is found and the slot's
words read, before the clock), no-clock keeps the thread's first clock reading (what reads the
launch's time stands still too: its busy period, the launch tally's timer, the heartbeat
check) and no-hp-notes publishes nothing to the high-priority gate entry and follows no launch:
diagnostic arms that split the path itself; as-usual is the interposed path again, the A/A
control of the others (how far two identical arms of one process read apart). Several names
(bypass,no-timing,...) make several baseline arms that take turns with the interposed one in the
same process, block by block, the order changing every block (the rows of a Williams square: over each square of blocks every arm
takes every place and follows every other arm equally often): one run then splits the
interposer's cost with every share measured over the same rounds, and the table has one A/B per
baseline (the interposed arm's figures in each). Each arm serves --warm-up requests unrecorded;
the interposer's learning counts the launches of every arm that reaches the clock (all but
bypass, after-registration and before-clock).
--in-process-env sets variables in that process (ORION_NO_TIMING=1: what the timed launches'
share is), --wrap puts a command before it (a profiler: `perf record -F 4999 -o FILE --`).
--cpu-samples splits each arm's serving-thread CPU by shared object inside that process
(cpu-samples.jsonl in --out; bench/diagnostics/cpu_samples.py renders it).
--control runs the same with neither arm interposed: the spread of its ratios is how
far two identical processes differ, the resolution of the A/B. Writes results.jsonl and
results.md (medians over the rounds of each round's interposer/bare ratio, with min and max) to
--out (default $OUT or a temp dir) and prints the table.
"""
import argparse
import contextlib
import json
import os
import statistics
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import harness
from diagnostics import cpu_samples
from harness import MODELS, parse_result, quantile

ANSWERS = ("what the interposer costs a job on one CPU (taskset or a cgroup cpu.max): "
           "an eager or graph service and a trainer, bare against interposed")
SERVER_CPU = "0"
CGROUPS = ("/sys/fs/cgroup/orion-bench-1cpu", "/sys/fs/cgroup/orion-bench-1cpu-b")


def setup_cgroup(cgroup):
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
    os.makedirs(cgroup, exist_ok=True)
    with open(os.path.join(cgroup, "cpu.max"), "w") as f:
        f.write("100000 100000")
    return open(os.path.join(cgroup, "cpu.max")).read().strip()


class Bench:
    def __init__(self, args):
        self.args = args
        self.bundle = os.path.abspath(args.bundle)
        self.out = args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="cpu-tax-")
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="orion-cpu-tax-")
        self.log = open(os.path.join(self.out, "bench.log"), "a")
        self.rows = open(os.path.join(self.out, "results.jsonl"), "a")
        # One CPU per arm's process: a core, or a cgroup with one CPU of quota. Served one after
        # the other, both arms use the first; served in turn (--interleave), one each.
        slots = CGROUPS if args.interleave else CGROUPS[:1]
        if args.limit == "cgroup":
            self.limit_note = f"cgroup cpu.max {[setup_cgroup(c) for c in slots][0]}"
            self.prefixes = [["sh", "-c", f'echo $$ > {c}/cgroup.procs && exec "$@"', "sh"]
                             for c in slots]
        else:
            cpus = args.cpus.split(",")[:len(slots)]
            self.limit_note = "taskset -c " + " / ".join(cpus)
            self.prefixes = [harness.taskset(c) for c in cpus]
        if args.interleave:
            arms = ("both arms" if len(args.in_process_baseline) == 1
                    else f"all {len(args.in_process_baseline) + 1} arms")
            who = (f"one process serving {arms}, its core alternating between rounds"
                   if args.in_process else "the arms swap them every round")
            self.limit_note += (f" ({who}), served in turn in blocks "
                                f"of {args.interleave} requests, {args.train_block} steps"
                                f", after {args.warm_up} unrecorded")
        if args.server_setting:
            self.limit_note += f"; orion-server with {', '.join(args.server_setting)}"
        self.server = None

    def start_server(self):
        # A node's server is usually free to run on any core, the pod's own included.
        cpus = self.args.server_cpus
        prefix = () if cpus == "any" else harness.taskset(cpus)
        extra = "".join(f"{line}\n" for line in self.args.server_setting)
        self.server = harness.Server(self.bundle, self.work, self.log, prefix=prefix,
                                     extra=extra).start()

    def server_cpu_ms(self):
        """CPU time orion-server has used so far (all threads), in ms."""
        try:
            fields = open(f"/proc/{self.server.proc.pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return float("nan")

    def command(self, argv, interposer, priority, slot=0, wrap=()):
        prefix = self.prefixes[slot] + list(wrap)
        lib = os.path.join(self.bundle, "liborion_interpose.so")
        env = []
        if not interposer and self.args.baseline_env:
            env = ["env", *self.args.baseline_env]  # A/B of one build: these variables set
        elif not interposer and self.args.baseline_interposer:
            lib = os.path.abspath(self.args.baseline_interposer)  # A/B of two builds
        elif not interposer or self.args.control:
            return prefix + argv
        return prefix + env + harness.orion_run(self.bundle, priority, lib) + argv

    def env(self):
        return dict(os.environ, ORION_SOCKET=self.server.socket,
                    PYTHONUNBUFFERED="1")

    def run(self, argv, interposer, priority, timeout=300):
        """The job's output. self.last_os holds what the OS saw of it: the whole process's
        voluntary and involuntary context switches (all its threads, from the children's rusage)
        and the server's CPU while it ran."""
        env = self.env()
        cmd = self.command(argv, interposer, priority)
        before, server_before = resource.getrusage(resource.RUSAGE_CHILDREN), self.server_cpu_ms()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        after, server_after = resource.getrusage(resource.RUSAGE_CHILDREN), self.server_cpu_ms()
        self.last_os = dict(nvcsw=after.ru_nvcsw - before.ru_nvcsw,
                            nivcsw=after.ru_nivcsw - before.ru_nivcsw,
                            server_cpu_ms=round(server_after - server_before, 1))
        self.log.write(f"$ {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}\n")
        self.log.flush()
        return p.stdout

    def model_label(self):
        return self.args.model + ("-graph" if self.args.graph else "") + \
            (" +nvtx" if self.args.nvtx else "")

    def record(self, row, baseline=None):
        """Writes one row; `baseline` names the A/B it belongs to (several --in-process
        baselines: the interposed arm's row is written once for each)."""
        row.update(limit=self.args.limit, limit_note=self.limit_note, time=time.time(),
                   server_cpus=self.args.server_cpus)
        if not self.args.interleave and getattr(self, "last_os", None):
            row.update(self.last_os)
        if self.args.baseline_interposer:
            row["baseline"] = os.path.basename(self.args.baseline_interposer)
        if self.args.baseline_env:
            row["baseline"] = " ".join(self.args.baseline_env)
        if self.args.control:
            row.update(baseline="control", control=True)
        if self.args.in_process:
            name = baseline or self.args.in_process_baseline[0]
            row["baseline"] = IN_PROCESS_BASELINES[name][1] + (
                f" ({' '.join(self.args.in_process_env)} in the process)"
                if self.args.in_process_env else "")
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
                             cpu_ms=r["cpu_ms"],
                             **{k: r[k] for k in THREAD_SPLIT if k in r}))
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

    @contextlib.contextmanager
    def arms(self, rnd, argv, priority):
        """Both arms' processes of a round (--interleave), started together and closed however
        the round ends; the bare arm takes slot 0 in odd rounds and slot 1 in even ones. With
        --in-process, one interposed process on the round's slot serves every arm: the
        interposed one (key True) and each baseline (keyed by its name), by the switch's word."""
        samples = None
        if self.args.in_process:
            switch = os.path.join(self.work, "bench-switch")
            word = IN_PROCESS_BASELINES[self.args.in_process_baseline[0]][0]
            with open(switch, "wb") as f:  # startup sampled under its own word (cpu_samples.py)
                f.write((cpu_samples.UNSAMPLED_WORD if self.args.cpu_samples else 0)
                        .to_bytes(4, "little"))
            env = dict(kv.split("=", 1) for kv in self.args.in_process_env)
            wrap = shlex.split(self.args.wrap or "")
            if self.args.cpu_samples:
                samples = os.path.join(self.work, f"cpu-samples-{rnd}")
                wrap = ["env", "LD_PRELOAD=" + os.path.join(self.bundle, "liborion_cpu_sampler.so"),
                        "ORION_CPU_SAMPLES=" + samples,
                        "ORION_CPU_SAMPLE_DETAIL=liborion_interpose.so"] + wrap
            one = DrivenArm(self, argv, True, priority, slot=int(rnd % 2 == 0),
                            extra_env={"ORION_BENCH_SWITCH": switch, **env}, wrap=wrap)
            arms = {True: SwitchedArm(one, 0, starts=True)}
            if len(self.args.in_process_baseline) == 1:  # the one baseline is the bare arm
                arms[False] = SwitchedArm(one, word)
            else:
                arms.update((name, SwitchedArm(one, IN_PROCESS_BASELINES[name][0]))
                            for name in self.args.in_process_baseline)
        else:
            arms = {interposer: DrivenArm(self, argv, interposer, priority,
                                          slot=int(interposer) ^ (rnd % 2 == 0))
                    for interposer in (False, True)}
        try:
            for arm in arms.values():
                arm.wait_ready()
            yield arms
        finally:
            if samples:  # the process's teardown is neither arm's
                with open(switch, "r+b") as f:
                    f.write(cpu_samples.UNSAMPLED_WORD.to_bytes(4, "little"))
            for arm in arms.values():
                arm.close()
            if samples:  # the process has exited: its sampler wrote its file
                cpu_samples.collect(samples, rnd, {word: "baseline", 0: "interposed"},
                                    (self.args.blocks + self.unrecorded_blocks())
                                    * self.args.interleave,
                                    os.path.join(self.out, "cpu-samples.jsonl"))

    def unrecorded_blocks(self):
        """Blocks each arm serves before its recorded ones: at least --warm-up requests (steps),
        so that the recorded blocks see neither a cold model nor the interposer's learning (a
        kernel's first 256 launches are timed 1 in 8 instead of 1 in 256: kernel_registry.h;
        a kernel launched once a request learns for 256 requests), which a service that runs
        for hours leaves behind in its first seconds."""
        return max(1, -(-self.args.warm_up // self.args.interleave))

    def interleaved(self, rnd, arms, role, block_command, rate=None):
        """One job of a round with its arms served in turn: their pooled figures, one row per
        arm (the interposed arm's once per baseline). block_command(i) is the command of block
        i; the unrecorded blocks before block 0 (unrecorded_blocks) bring the clocks up. The
        order changes every block (turn_order; two arms alternate)."""
        keys = [True] + [k for k in arms if k is not True]
        lat = {k: [] for k in keys}
        # Per arm, each per-request figure of the block answers (cpu_ms, the thread split and
        # the phases) summed over the requests of its blocks.
        sums = {k: {} for k in keys}
        throttled = {k: [0, 0.0] for k in keys}  # periods, ms (cgroup only)
        for i in range(-self.unrecorded_blocks(), self.args.blocks):
            for interposer in turn_order(keys, i):
                before = arms[interposer].throttled()
                ms, figures = arms[interposer].block(block_command(max(i, 0)))
                after = arms[interposer].throttled()
                if i >= 0:
                    lat[interposer] += ms
                    for k, v in figures.items():
                        sums[interposer][k] = sums[interposer].get(k, 0.0) + v * len(ms)
                    if before and after:
                        throttled[interposer][0] += after[0] - before[0]
                        throttled[interposer][1] += (after[1] - before[1]) / 1e3
        for key in keys:
            ms = sorted(lat[key])
            row = dict(round=rnd, role=role, interposer=key is True, blocks=self.args.blocks,
                       block=len(ms) // self.args.blocks, n=len(ms),
                       mean_ms=sum(ms) / len(ms),
                       **{k: v / len(ms) for k, v in sums[key].items()})
            if self.args.limit == "cgroup":  # the quota's stalls over the recorded blocks
                row.update(nr_throttled=throttled[key][0],
                           throttled_ms=round(throttled[key][1], 3))
            if role == "trainer":
                row.update(model=self.args.train_model + (" +nvtx" if self.args.nvtx else ""),
                           step_p50_ms=quantile(ms, 0.5), step_p99_ms=quantile(ms, 0.99),
                           steps_per_s=1e3 * len(ms) / sum(ms))
            elif role == "service-closed":
                row.update(model=self.model_label(), svc_p50_ms=quantile(ms, 0.5),
                           svc_p99_ms=quantile(ms, 0.99), capacity_rps=1e3 * len(ms) / sum(ms))
            else:
                row.update(model=self.model_label(), rate=rate, p50_ms=quantile(ms, 0.5),
                           p99_ms=quantile(ms, 0.99))
            named = [k for k in keys if isinstance(k, str)]  # several baselines
            if key is True and named:  # the interposed arm, in each baseline's A/B
                for name in named:
                    self.record(dict(row), name)
            else:
                self.record(row, key if isinstance(key, str) else None)
        return {k: sum(lat[k]) / len(lat[k]) for k in keys}

    def main_interleaved(self):
        n, jobs = self.args.interleave, self.args.jobs.split(",")
        serve = [sys.executable, MODELS, "serve", self.args.model, "--driven"] + \
            self.extra("serve")
        train = [sys.executable, MODELS, "train", self.args.train_model, "--driven"] + \
            self.extra("train")
        rate = None
        for rnd in range(1, self.args.rounds + 1):
            with self.arms(rnd, serve, "high") as arms:
                mean = self.interleaved(rnd, arms, "service-closed", lambda i: f"closed {n}")
                if rate is None:
                    # of the (first) baseline arm, round 1
                    rate = self.args.load * 1e3 / mean[[k for k in mean if k is not True][0]]
                if "service-poisson" in jobs:
                    self.interleaved(rnd, arms, "service-poisson",
                                     lambda i: f"poisson {n} {rate:.2f} {rnd * 1000 + i}", rate)
            if "trainer" in jobs:
                with self.arms(rnd, train, "best-effort") as arms:
                    self.interleaved(rnd, arms, "trainer",
                                     lambda i: f"steps {self.args.train_block}")

    def main_in_sequence(self):
        """Each arm's jobs one after the other, the order alternating every round."""
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

    def main(self):
        self.start_server()
        try:
            if self.args.interleave:
                self.main_interleaved()
            else:
                self.main_in_sequence()
        finally:
            self.server.stop()
        print(render([os.path.join(self.out, "results.jsonl")]))


def turn_order(keys, i):
    """The order of the arms in block i: the rows of a Williams square taken in turn (with
    their mirror images where the arms are odd in number), so that over a whole square each arm
    takes each place and follows each other arm equally often. Two arms alternate."""
    n = len(keys)
    rows = n if n % 2 == 0 else 2 * n
    r = i % rows
    first, mirrored = r % n, r >= n
    # 0, 1, n-1, 2, n-2, ... from the row's first arm
    offsets = [0] + [(k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n)]
    order = [keys[(first + o) % n] for o in offsets]
    return order[::-1] if mirrored else order


class DrivenArm:
    """One arm's long-lived process (torch_models.py --driven), given blocks over its stdin."""

    def __init__(self, bench, argv, interposer, priority, slot, extra_env=None, wrap=()):
        self.bench = bench
        self.cmd = bench.command(argv, interposer, priority, slot, wrap)
        self.cgroup = CGROUPS[slot] if bench.args.limit == "cgroup" else None
        bench.log.write(f"$ {' '.join(self.cmd)}\n")
        bench.log.flush()
        self.p = subprocess.Popen(self.cmd, env=dict(bench.env(), **(extra_env or {})),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=bench.log, text=True)
        self.closed = False

    def line(self):
        out = self.p.stdout.readline()
        if not out:
            raise SystemExit(f"{' '.join(self.cmd)} ended (exit {self.p.wait()}); see bench.log")
        return out.strip()

    def throttled(self):
        """(nr_throttled, throttled_usec) of this arm's cgroup, or None (taskset, no file)."""
        if not self.cgroup:
            return None
        try:
            stat = dict(l.split() for l in open(os.path.join(self.cgroup, "cpu.stat")))
            return int(stat["nr_throttled"]), int(stat["throttled_usec"])
        except (OSError, KeyError, ValueError):
            return None

    def wait_ready(self):
        while self.line() != "ready":
            pass

    def block(self, command):
        """The latencies (ms) of one block and its CPU time per request or step (ms)."""
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()
        out = self.line()
        if not out.startswith("block "):
            raise SystemExit(f"{' '.join(self.cmd)}: {command!r} answered {out!r}")
        fields = dict(kv.split("=", 1) for kv in out.split()[1:])
        return ([float(x) for x in fields.pop("lat_ms").split(",")],
                {k: float(v) for k, v in fields.items()})

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()


# --in-process-baseline: ORION_BENCH_SWITCH's word in the baseline arm's blocks and the rows'
# name for that arm (harness.BENCH_SWITCHES).
IN_PROCESS_BASELINES = harness.BENCH_SWITCHES


# Baselines whose launches never reach the launch index (the interposer's learning), and the
# launches of a kernel it learns over (kernel_registry.h).
CUT_BEFORE_THE_CLOCK = ("bypass", "after-registration", "before-clock")
LEARNING_LAUNCHES = 256


class SwitchedArm:
    """One arm of --in-process: the one interposed process with ORION_BENCH_SWITCH's word set to
    `word` for this arm's blocks (0: interposed as usual; the as-usual baseline's word too).
    `starts` marks the interposed arm, the one that waits for the shared process to be ready."""

    def __init__(self, arm, word, starts=False):
        self.arm, self.word, self.starts = arm, word, starts

    def wait_ready(self):
        if self.starts:  # one arm waits for the shared process: it says it is ready once
            self.arm.wait_ready()

    def throttled(self):
        return self.arm.throttled()

    def block(self, command):
        self.arm.p.stdin.write(f"switch {self.word}\n")
        self.arm.p.stdin.flush()
        if (out := self.arm.line()) != f"switched {self.word}":
            raise SystemExit(f"{' '.join(self.arm.cmd)}: switch {self.word} answered {out!r}")
        return self.arm.block(command)

    def close(self):
        self.arm.close()


# The closed loop's CPU per request split by thread (schedstat; torch_models.py): the serving
# thread, the interposer's threads, the rest, and the serving thread's wait for its core.
THREAD_SPLIT = ("main_cpu_ms", "orion_cpu_ms", "other_cpu_ms", "main_wait_ms")
# --interleave's requests split in time: the forward pass's launches on the CPU, then the wait
# for the GPU (torch_models.py --driven).
PHASES = ("launch_ms", "sync_ms")

METRICS = {
    "service-closed": ["svc_p50_ms", "svc_p99_ms", "cpu_ms", *THREAD_SPLIT, *PHASES],
    "service-poisson": ["p50_ms", "p99_ms", "cpu_ms"],
    "trainer": ["step_p50_ms", "step_p99_ms", "cpu_ms"],
}


def round_pairs(rows, role):
    """The rounds of one A/B's rows of `role` that have both arms: per round, {interposer: row}."""
    by_round = {}
    for r in rows:
        if r["role"] == role:
            by_round.setdefault(r["round"], {})[r["interposer"]] = r
    return [v for v in by_round.values() if True in v and False in v]


def render(paths, interval=False):
    """The tables of one or more runs' results.jsonl; several runs of one A/B pool their rounds
    (numbered on from the run before). `interval` adds the bootstrap 95% interval of each
    figure's median ratio."""
    rows = harness.read_runs(paths, "cpu-tax", lenient=True)  # a run cut short: its last line
    lines = []
    # One table per limit and baseline (an out dir may hold an A/B and its A/A control).
    for limit, base in sorted({(r["limit"], r.get("baseline", "")) for r in rows}):
        sub = [r for r in rows if r["limit"] == limit and r.get("baseline", "") == base]
        note = sub[0].get("limit_note", limit)
        # An A/B of two builds names the baseline library in its rows (--baseline-interposer).
        a, b = ("baseline", "this build") if base else ("bare", "interposer")
        against = f", this build against {base}" if base else ""
        if sub[0].get("control"):
            a, b = ("bare", "second bare process")
            against = ", A/A control: neither process interposed"
        lines += [f"**One CPU ({note}), {max(r['round'] for r in sub)} rounds{against}**", "",
                  f"| job | figure | {a}, median | {b}, median | {b} / {a}: median [min, max] |"
                  + (" 95% interval of the median (bootstrap) |" if interval else ""),
                  "|---|---|---|---|---|" + ("---|" if interval else "")]

        def cell(ratios):  # the interval's column, where there is one
            if not interval:
                return ""
            return f" {harness.median_interval(ratios)} |" if ratios else " - |"
        for role, metrics in METRICS.items():
            pairs = round_pairs(sub, role)
            if not pairs:
                continue
            model = pairs[0][False]["model"]
            for m in metrics:
                if not all(m in p[i] for p in pairs for i in (False, True)):
                    continue  # rows of a build before the figure
                bare = [p[False][m] for p in pairs]
                withi = [p[True][m] for p in pairs]
                ratios = [w / b for w, b in zip(withi, bare) if b > 0]
                lines.append(f"| {role} ({model}) | {m} | {statistics.median(bare):.3f} | "
                             f"{statistics.median(withi):.3f} | "
                             f"{harness.spread(ratios, 3, '')} |" + cell(ratios))
            # What the OS saw of each run (sequential runs): context switches of the whole
            # process, and the CPU orion-server used meanwhile.
            for m, label in (("nivcsw", "involuntary context switches"),
                             ("nvcsw", "voluntary context switches"),
                             ("server_cpu_ms", "orion-server CPU ms")):
                if all(m in p[i] for p in pairs for i in (False, True)):
                    bare = [p[False][m] for p in pairs]
                    withi = [p[True][m] for p in pairs]
                    ratios = [w / b for w, b in zip(withi, bare) if b > 0]
                    lines.append(f"| {role} ({model}) | {label} | {statistics.median(bare):.0f} | "
                                 f"{statistics.median(withi):.0f} | "
                                 f"{harness.spread(ratios, 3, '') if ratios else '-'} |"
                                 + cell([]))
            if "throttled_ms" in pairs[0][False]:  # a cgroup's quota stalls, summed
                sums = [sum(p[i]["throttled_ms"] for p in pairs) for i in (False, True)]
                periods = [sum(p[i]["nr_throttled"] for p in pairs) for i in (False, True)]
                lines.append(f"| {role} ({model}) | throttled by the quota, all rounds | "
                             f"{sums[0]:.1f} ms ({periods[0]} periods) | {sums[1]:.1f} ms "
                             f"({periods[1]} periods) | - |" + cell([]))
        lines.append("")
    return "\n".join(lines)


def render_split(paths):
    """One table for runs of several --in-process baselines (each file one run, not pooled): per
    run and baseline arm, the closed loop's CPU per request and service time of this build over
    that arm's (median over rounds [min, max], bootstrap 95% interval of the median), so the
    arms' shares of the interposer's cost sit side by side."""
    lines = ["| run | this build against | CPU per request: median [min, max] | 95% interval "
             "| service time: median [min, max] | 95% interval | rounds |",
             "|---|---|---|---|---|---|---|"]
    for path in paths:
        rows = harness.read_runs([path], "cpu-tax", lenient=True)
        run = os.path.basename(path).removesuffix(".jsonl")
        for base in sorted({r.get("baseline", "") for r in rows},
                           key=lambda b: (not b.startswith("in-process bypass"), b)):
            pairs = round_pairs([r for r in rows if r.get("baseline", "") == base],
                                "service-closed")
            if not pairs:  # a run cut short before this arm's first round ended
                continue
            cells = []
            for m in ("cpu_ms", "svc_p50_ms"):
                ratios = [p[True][m] / p[False][m] for p in pairs if p[False][m] > 0]
                cells += [harness.spread(ratios, 3, ""), harness.median_interval(ratios)]
            arm = base.removeprefix("in-process, ").removeprefix("in-process ") or "bare"
            lines.append(f"| {run} | {arm} | {' | '.join(cells)} | {len(pairs)} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--cpus", default="2,3",
                   help="--limit taskset: the jobs' core (the first), and the second arm's with "
                        "--interleave (orion-server runs on core 0)")
    p.add_argument("--server-cpus", default=SERVER_CPU,
                   help="cores orion-server is pinned to (default 0), or 'any': not pinned, as a "
                        "node's server usually is next to a pod")
    p.add_argument("--server-setting", action="append", default=[], metavar="'KEY: VALUE'",
                   help="a line added to orion-server's config (repeatable; e.g. "
                        "'timeline_spans_per_gpu: 5000'); the tables' heading names it")
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
    p.add_argument("--interleave", type=int, default=0, metavar="N",
                   help="serve both arms in turn, in blocks of N requests or steps (see above)")
    p.add_argument("--warm-up", type=int, default=300, metavar="N",
                   help="--interleave: requests (steps) each arm serves unrecorded first")
    p.add_argument("--blocks", type=int, default=20,
                   help="--interleave: recorded blocks per arm, round and job")
    p.add_argument("--train-block", type=int, default=4,
                   help="--interleave: training steps per block")
    p.add_argument("--in-process", action="store_true",
                   help="--interleave in one interposed process: the bare arm's blocks pass the "
                        "interposer by (ORION_BENCH_SWITCH), so no two processes' or cores' "
                        "difference enters the A/B")
    p.add_argument("--in-process-baseline", default="bypass", metavar="NAME[,NAME...]",
                   help="--in-process: what the baseline arm's blocks are, one of "
                        f"{', '.join(sorted(IN_PROCESS_BASELINES))}; several, comma-separated: "
                        "several baseline arms in turn (see above)")
    p.add_argument("--in-process-env", action="append", default=[], metavar="KEY=VALUE",
                   help="--in-process: set in the one process (repeatable; e.g. ORION_NO_TIMING=1)")
    p.add_argument("--wrap", help="--in-process: a command put before the process (quoted)")
    p.add_argument("--cpu-samples", action="store_true",
                   help="--in-process: sample the serving thread's CPU by object in each arm "
                        "(cpu-samples.jsonl; bench/diagnostics/cpu_samples.py)")
    p.add_argument("--control", action="store_true",
                   help="A/A: the interposer arm runs without it too (the A/B's resolution)")
    p.add_argument("--interval", action="store_true",
                   help="with --table: add the bootstrap 95%% interval of each median ratio")
    p.add_argument("--split", action="store_true",
                   help="with --table: runs of several --in-process baselines in one table, "
                        "each run's arms side by side (CPU per request, service time)")
    p.add_argument("--table", nargs="+", metavar="RESULTS_JSONL",
                   help="print the table of a results.jsonl and exit; several runs of one A/B "
                        "pool their rounds")
    args = p.parse_args(argv)
    for kv in args.baseline_env:
        if "=" not in kv or not kv.partition("=")[0].startswith("ORION_"):
            p.error(f"--baseline-env {kv!r}: expected ORION_NAME=VALUE")
    if args.control and (args.baseline_env or args.baseline_interposer):
        p.error("--control compares no interposer with no interposer: no other baseline")
    if args.warm_up < 0:
        p.error("--warm-up wants 0 or more requests")
    if args.in_process and (not args.interleave or args.control or args.baseline_env
                            or args.baseline_interposer):
        p.error("--in-process needs --interleave, and its baseline is --in-process-baseline: "
                "not --baseline-env, --baseline-interposer or --control")
    names = args.in_process_baseline.split(",")
    for name in names:
        if name not in IN_PROCESS_BASELINES:
            p.error(f"--in-process-baseline {args.in_process_baseline!r}: {name!r} is none of "
                    f"{', '.join(sorted(IN_PROCESS_BASELINES))}")
    if len(set(names)) != len(names):
        p.error(f"--in-process-baseline {args.in_process_baseline!r}: a name given twice")
    if len(names) > 1 and args.cpu_samples:
        p.error("--cpu-samples folds its samples into two arms: one --in-process-baseline")
    if "as-usual" in names and args.cpu_samples:
        p.error("--cpu-samples tells the arms apart by the switch's word: the as-usual "
                "baseline's is the interposed arm's")
    if (args.in_process_env or args.wrap or args.cpu_samples
            or names != ["bypass"]) and not args.in_process:
        p.error("--in-process-baseline, --in-process-env, --wrap and --cpu-samples go with "
                "--in-process")
    for kv in args.in_process_env:
        if "=" not in kv or not kv.partition("=")[0].startswith("ORION_"):
            p.error(f"--in-process-env {kv!r}: expected ORION_NAME=VALUE")
    for line in args.server_setting:
        key, colon, value = line.partition(":")
        if not colon or not key or key != key.strip() or not value.strip() or "\n" in line:
            p.error(f"--server-setting {line!r}: expected one 'KEY: VALUE' line of "
                    "orion-server's config")
        if key in harness.SERVER_WRITES:
            p.error(f"--server-setting {line!r}: the bench sets {key} itself")
    if args.baseline_env and args.baseline_interposer:
        p.error("--baseline-env and --baseline-interposer: one baseline at a time")
    args.in_process_baseline = names
    cpus = args.cpus.split(",")
    if len(cpus) != 2 or not all(c.isdigit() for c in cpus) or cpus[0] == cpus[1]:
        p.error(f"--cpus {args.cpus!r}: expected two different core numbers, e.g. 2,3")
    if args.split and not args.table:
        p.error("--split goes with --table")
    if args.split:
        print(render_split(args.table))
        return
    if args.table:
        table = render(args.table, args.interval)
        if len(args.table) == 1:  # a run's own table, beside its rows
            with open(os.path.join(os.path.dirname(args.table[0]) or ".", "results.md"), "w") as f:
                f.write(table + "\n")
        print(table)
        return
    if not args.bundle:
        p.error("--bundle is required")
    if args.in_process:
        # The interposer learns a kernel over its first 256 launches (1 in 8 timed): only the
        # arms that reach the clock count them.
        learning = args.warm_up * (1 + sum(1 for b in args.in_process_baseline
                                           if b not in CUT_BEFORE_THE_CLOCK))
        if learning < LEARNING_LAUNCHES:
            print(f"cpu-tax: note: --warm-up {args.warm_up} leaves {learning} unrecorded requests "
                  f"to the arms that reach the clock; a kernel launched once a request learns "
                  f"over {LEARNING_LAUNCHES}, so the first recorded blocks may still be learning",
                  file=sys.stderr)
    bench = Bench(args)
    bench.main()
    with open(os.path.join(bench.out, "results.md"), "w") as f:
        f.write(render([os.path.join(bench.out, "results.jsonl")]) + "\n")
