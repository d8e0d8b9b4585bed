"""A best-effort multi-GPU training job (two ranks over NCCL) beside high-priority services.

  orion_bench.py multigpu --bundle DIR [--jobs ddp,fsdp,pipeline] [--service resnet50-graph]
      [--service-gpus 0 | 0,1] [--configs orion,orion:gpu_hold=false,timeslice,orion@alt,
      orion-mps,mps-cap]
      [--seconds 20] [--load 0.5] [--repeat N] [--first-round K] [--bare-rank R]
      [--alt-interposer LIB] [--out DIR]
  orion_bench.py multigpu --table results.jsonl ... [--summary]   (re-renders the table)

The job: two ranks, one process per GPU (rank r on cuda:r), NCCL between them, as torchrun
starts them:
  ddp       ResNet50 batch 64 per GPU under DistributedDataParallel (all-reduce), SGD
  fsdp      a transformer (6 layers, d 1024, 8 x 512 tokens a rank, bf16 autocast) sharded with
            FSDP (all-gather before each layer, reduce-scatter of its gradients), AdamW
  pipeline  two stages of an MLP (8 layers of 4096 each), GPipe schedule with NCCL send/recv
--bare-rank R runs rank R without the interposer: a peer the node does not control (a rank on
another node).

The services: --service (a CUDA-graph service of bench/workloads/torch_models.py) on each GPU of
--service-gpus, high priority, Poisson arrivals at --load of its capacity alone (measured closed
loop in the first round), latency from the scheduled arrival.

Each round measures the services alone and the job alone (no interposer), then each
configuration with a fresh orion-server: the job warms up, the services start, the job runs
--seconds of steps and the services stop with it, so the services' window is the job's.
  orion               priority mode, the defaults
  orion:KEY=VALUE     the same with a policy setting of the server's config (gpu_hold=false);
                      more joined by '+'; be_env=ORION_NAME=VALUE among them sets a variable in
                      the job's ranks
  orion@alt        the defaults with the interposer of --alt-interposer (another build)
  timeslice           no interposer
  orion-mps           the MPS daemon and orion in mps mode; the ranks at MPS client priority 1
                      with 50% of the SMs (orion-run's best-effort defaults)
  mps-cap             the MPS daemon, no orion, the ranks' MPS settings as in orion-mps
Reported per configuration: each service's p50 and p99 against alone, the job's speed in the
window against alone, and the job's longest gap between steps in the window against its median
step alone ("stalled": a gap of 1 s and 20 steps or more). Order rotates between rounds; the
table adds medians [min, max] over rounds. Writes results.jsonl (one line per configuration and
round) and results.md to --out (default $OUT or a temp dir).
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import harness
from harness import MODELS, parse_result

ANSWERS = ("whether a best-effort multi-GPU job (DDP, FSDP, pipeline over NCCL) beside "
           "high-priority services inverts priority or stalls, per configuration")
JOBS = ("ddp", "fsdp", "pipeline")
SERVICES = {"resnet50-graph": ["resnet50", "--graph"], "bert8-graph": ["bert8", "--graph"]}
STALL_S, STALL_STEPS = 1.0, 20
MPS_CONFIGS = ("orion-mps", "mps-cap")


# --- the job (one rank) ---------------------------------------------------------------------

def ddp_step(device):
    import torch
    import torchvision
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(torchvision.models.resnet50().to(device).train(),
                                    device_ids=[device.index])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(64, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (64,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def fsdp_step(device):
    import torch
    layers = [torch.nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, dropout=0.0)
              for _ in range(6)]
    model = torch.nn.Sequential(*layers).to(device)
    try:  # FSDP2: each layer a unit (all-gather before it, reduce-scatter after its backward)
        from torch.distributed.fsdp import fully_shard
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
    except ImportError:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FullyShardedDataParallel(
            model, auto_wrap_policy=ModuleWrapPolicy({torch.nn.TransformerEncoderLayer}),
            device_id=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 512, 1024, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
    return step


def pipeline_step(device, rank, micro=4):
    import torch
    import torch.distributed as dist
    width, layers, micro_batch = 4096, 8, 256
    stage = torch.nn.Sequential(*[m for _ in range(layers)
                                  for m in (torch.nn.Linear(width, width), torch.nn.ReLU())])
    stage = stage.to(device)
    opt = torch.optim.SGD(stage.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        kept = []
        for _ in range(micro):  # forward of every micro-batch (GPipe)
            if rank == 0:
                out = stage(torch.randn(micro_batch, width, device=device))
                dist.send(out.detach().contiguous(), 1)
                kept.append(out)
            else:
                act = torch.empty(micro_batch, width, device=device)
                dist.recv(act, 0)
                act.requires_grad_()
                kept.append((act, stage(act).square().mean()))
        for item in kept:  # then backward, in the same order on both stages
            if rank == 0:
                grad = torch.empty(micro_batch, width, device=device)
                dist.recv(grad, 1)
                item.backward(grad)
            else:
                act, loss = item
                loss.backward()
                dist.send(act.grad.contiguous(), 0)
        opt.step()
    return step


def run_rank(args):
    """One rank: warm up, say "ready", wait for the go file, then --seconds of steps, each
    printed as "step <monotonic>" (rank 0)."""
    import torch
    import torch.distributed as dist
    rank = args.rank
    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=2, device_id=device)
    step = {"ddp": lambda: ddp_step(device), "fsdp": lambda: fsdp_step(device),
            "pipeline": lambda: pipeline_step(device, rank)}[args.job]()

    def synced_step():
        step()
        torch.cuda.synchronize()
    for _ in range(5):  # warm-up: kernels loaded, NCCL channels set up
        synced_step()
    dist.barrier()
    print("ready", flush=True)
    while args.go and not os.path.exists(args.go):
        time.sleep(0.01)
    # Rank 0's clock ends the window for both ranks (each rank's own clock could end it a step
    # apart: the rank with a step more then waits in its collectives forever).
    steps, start, go_on = 0, time.monotonic(), torch.ones(1, device=device)
    while True:
        if rank == 0:
            go_on.fill_(1.0 if time.monotonic() - start < args.seconds else 0.0)
        dist.broadcast(go_on, 0)
        if go_on.item() == 0.0:
            break
        synced_step()
        steps += 1
        if rank == 0:
            print(f"step {time.monotonic():.6f}", flush=True)
    dist.barrier()
    if rank == 0:
        elapsed = time.monotonic() - start
        print(f"result steps={steps} seconds={elapsed:.3f} steps_per_s={steps / elapsed:.3f}",
              flush=True)
    dist.destroy_process_group()


# --- the harness ----------------------------------------------------------------------------

def job_figures(steps, start, end):
    """The job's steps inside [start, end]: their rate and the longest gap (the window's ends
    count as steps, so a job that never stepped has the window as its gap)."""
    inside = [t for t in steps if start <= t <= end]
    marks = [start, *inside, end]
    gaps = [b - a for a, b in zip(marks, marks[1:])]
    return {"steps": len(inside), "window_s": end - start,
            "steps_per_s": len(inside) / (end - start) if end > start else 0.0,
            "max_gap_s": max(gaps) if gaps else 0.0}


class Run:
    """The server and each configuration's processes."""

    def __init__(self, args, out):
        self.args, self.out = args, out
        self.bundle = os.path.abspath(args.bundle)
        self.work = tempfile.mkdtemp(prefix="orion-multigpu-")
        self.log = open(os.path.join(out, "multigpu-bench.log"), "a")
        self.gpus = [g for g in args.service_gpus.split(",") if g]
        self.capacity = {}
        self.mps_env = None  # the running MPS daemon's client environment

    def prefix(self, config, priority, server):
        """The command prefix of a process of `config` at `priority`, and its environment."""
        mps = dict(self.mps_env or {}) if config in MPS_CONFIGS else {}
        if config == "mps-cap" and priority == "best-effort":
            mps.update(harness.mps_best_effort_env())
        if server is None:
            return [], mps
        if priority == "best-effort":
            mps.update(be_env(config))
        interposer = self.args.alt_interposer if config == "orion@alt" else None
        return (harness.orion_run(self.bundle, priority, interposer),
                dict(mps, ORION_SOCKET=server.socket))

    def service(self, gpu, config, server, rate, requests):
        pre, env = self.prefix(config, "high", server)
        cpus = harness.taskset(self.args.service_cpus.split(";")[self.gpus.index(gpu)])
        return subprocess.Popen(
            cpus + pre + [sys.executable, MODELS, "serve", *SERVICES[self.args.service],
                          "--rate", str(rate), "--requests", str(requests)],
            env=dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, **env), stdout=subprocess.PIPE,
            stderr=self.log, text=True)

    def job(self, kind, config, server, port, go):
        ranks = []
        for r in (0, 1):
            pre, env = self.prefix(config, "best-effort", server)
            if r == self.args.bare_rank:  # no interposer, the configuration's MPS settings
                pre = []
                env = {k: v for k, v in env.items() if k != "ORION_SOCKET"}
                if config == "orion-mps":
                    env.update(harness.mps_best_effort_env())
            cpus = harness.taskset(self.args.job_cpus.split(";")[r])
            ranks.append(subprocess.Popen(
                cpus + pre + harness.experiment_command(
                    "multigpu", "rank", "--job", kind, "--rank", str(r), "--port", str(port),
                    "--seconds", str(self.args.seconds), "--go", go),
                env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=self.log,
                text=True, start_new_session=True))
        return ranks

    @staticmethod
    def read_lines(proc, sink, ready=None):
        """A thread that files each output line of `proc`: steps (timestamps), ready, result."""
        def loop():
            for line in proc.stdout:
                if line.startswith("step "):
                    sink["steps"].append(float(line.split()[1]))
                elif line.startswith("ready") and ready is not None:
                    ready.set()
                elif line.startswith("result"):
                    sink["result"] = parse_result(line)
                elif line.startswith("serving") and ready is not None:
                    ready.set()
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        return t

    def stop_all(self, procs):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL) if p.pid == os.getpgid(p.pid) else p.kill()
                except (ProcessLookupError, PermissionError):
                    pass

    def measure_capacity(self, gpu):
        r = subprocess.run([sys.executable, MODELS, "serve", *SERVICES[self.args.service]],
                           env=dict(os.environ, CUDA_VISIBLE_DEVICES=gpu), capture_output=True,
                           text=True, timeout=120)
        for line in r.stdout.splitlines():
            if line.startswith("result"):
                return parse_result(line)["capacity_rps"]
        raise SystemExit(f"the service's capacity on GPU {gpu} was not measured: {r.stderr[-400:]}")

    def rate(self, gpu):
        return round(self.capacity[gpu] * self.args.load, 1)

    def arm(self, kind, config, port):
        """One configuration (or `alone`, where the services and the job run apart)."""
        server = None
        row = {"job": kind, "config": config, "service": self.args.service,
               "service_gpus": self.gpus, "bare_rank": self.args.bare_rank,
               "seconds": self.args.seconds}
        if config in MPS_CONFIGS:
            self.mps_env, why = harness.start_mps_daemon(self.work)
            if why:
                row["error"] = why
                return row
        if config.startswith("orion"):
            extra = server_policy(config)
            server = harness.Server(self.bundle, self.work, self.log, admin_port=0,
                                    mode="mps" if config == "orion-mps" else "priority",
                                    extra=extra)
            if os.path.exists(server.socket):  # the last arm's server's
                os.remove(server.socket)
            server.start()
        go = os.path.join(self.work, f"go-{port}")
        services, ranks = [], []
        try:
            if config == "alone":  # the services apart, then the job apart
                row["services"] = []
                for gpu in self.gpus:
                    svc = self.service(gpu, config, None, self.rate(gpu), self.args.alone_requests)
                    out = svc.communicate(timeout=self.args.timeout)[0]
                    row["services"].append(next((parse_result(l) for l in out.splitlines()
                                                 if l.startswith("result")), None))
            job_out, ready = {"steps": []}, threading.Event()
            ranks = self.job(kind, config, server, port, go)
            reader = self.read_lines(ranks[0], job_out, ready)
            if not ready.wait(self.args.timeout):
                row["error"] = "the job did not warm up"
                return row
            svc_outs = []
            if config != "alone":
                for gpu in self.gpus:
                    s_out, s_ready = {"steps": []}, threading.Event()
                    svc = self.service(gpu, config, server, self.rate(gpu), 10 ** 6)
                    services.append(svc)
                    svc_outs.append((s_out, self.read_lines(svc, s_out, s_ready), s_ready))
                for _, _, s_ready in svc_outs:
                    s_ready.wait(self.args.timeout)
            start = time.monotonic()
            open(go, "w").close()
            # The window: --seconds (a stalled job stays stalled until the services stop).
            while ranks[0].poll() is None and time.monotonic() < start + self.args.seconds:
                time.sleep(0.05)
            end = min(time.monotonic(), start + self.args.seconds)
            for svc in services:
                if svc.poll() is None:
                    svc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self.args.timeout
            while ranks[0].poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            for svc, (s_out, t, _) in zip(services, svc_outs):
                try:
                    svc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    svc.kill()
                t.join(5)
            if config != "alone":
                row["services"] = [s_out.get("result") for s_out, _, _ in svc_outs]
            row["hung"] = ranks[0].poll() is None
            reader.join(1)
            row["job_window"] = job_figures(job_out["steps"], start, end)
            steps = job_out["steps"]
            if len(steps) > 2:
                row["job_step_ms"] = statistics.median(b - a for a, b in zip(steps, steps[1:])) * 1e3
        finally:
            self.stop_all(ranks + services)
            if server is not None:
                server.stop()
            if self.mps_env is not None:
                harness.stop_mps_daemon(self.mps_env)
                self.mps_env = None
        return row


def config_parts(config):
    """A configuration's settings after its name: orion:KEY=VALUE+KEY=VALUE+be_env=NAME=VALUE."""
    return [p for p in config.split(":", 1)[1].split("+") if p] if ":" in config else []


def server_policy(config):
    """The server config's policy lines of a configuration (its KEY=VALUE settings), '' for none."""
    knobs = [p.split("=", 1) for p in config_parts(config) if not p.startswith("be_env=")]
    return "policy:\n" + "".join(f"  {k}: {v}\n" for k, v in knobs) if knobs else ""


def be_env(config):
    """The ORION_ variables a configuration sets in the job's ranks: each be_env=NAME=VALUE
    (orion:gpu_hold_max_ms=500+be_env=ORION_GEMM_SPLIT=0)."""
    return dict(p[len("be_env="):].split("=", 1) for p in config_parts(config)
                if p.startswith("be_env="))


def compare(row, alone):
    """The row's ratios against its round's alone row."""
    if not alone or row.get("error"):
        return row
    row["p50_vs_alone"], row["p99_vs_alone"] = [], []
    for s, a in zip(row.get("services") or [], alone.get("services") or []):
        ok = s and a and s.get("p50_ms") and a.get("p50_ms")
        row["p50_vs_alone"].append(s["p50_ms"] / a["p50_ms"] if ok else None)
        row["p99_vs_alone"].append(s["p99_ms"] / a["p99_ms"] if ok else None)
    w, aw = row.get("job_window") or {}, alone.get("job_window") or {}
    if aw.get("steps_per_s"):
        row["job_vs_alone"] = w.get("steps_per_s", 0) / aw["steps_per_s"]
    step_s = (alone.get("job_step_ms") or 0) / 1e3
    row["stalled"] = bool(w) and w.get("max_gap_s", 0) >= max(STALL_S, STALL_STEPS * step_s)
    return row


def render_table(rows, summary_only=False):
    def ratios(values):
        return " / ".join(f"{v:.2f}x" if v else "-" for v in values or []) or "-"
    lines = ["| job | config | round | service p50 vs alone | service p99 vs alone | "
             "job in the window | longest gap | stalled |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["config"] == "alone" or summary_only:
            continue
        w = r.get("job_window") or {}
        lines.append(
            f"| {r['job']}{' (rank %d bare)' % r['bare_rank'] if r.get('bare_rank') is not None else ''} "
            f"| {r['config']} | {r.get('round', 0)} | {ratios(r.get('p50_vs_alone'))} | "
            f"{ratios(r.get('p99_vs_alone'))} | "
            f"{'%.2f' % r['job_vs_alone'] if r.get('job_vs_alone') is not None else '-'} | "
            f"{'%.2f s' % w['max_gap_s'] if w else '-'} | "
            f"{'error: ' + r['error'] if r.get('error') else 'yes' if r.get('stalled') else 'no'} |")
    groups = {}
    for r in rows:
        if r["config"] != "alone" and not r.get("error"):
            groups.setdefault((r["job"], r["config"], r.get("service", "?"),
                               len(r.get("service_gpus") or []), r.get("bare_rank")),
                              []).append(r)
    if summary_only:
        lines = []
    if summary_only or any(len(g) > 1 for g in groups.values()):
        lines += [] if summary_only else [
            "", "Over rounds, each against its own round's alone run: median [min, max] "
            "(with services on two GPUs, every service's ratio counts)", ""]
        lines += ["| job | services | config | rounds | service p50 | service p99 | "
                  "job in the window | rounds stalled |", "|---|---|---|---|---|---|---|---|"]
        for (job, config, service, n, bare), every in groups.items():
            def spread(key):
                vals = [v for r in every for v in (r.get(key) if isinstance(r.get(key), list)
                                                   else [r.get(key)]) if v]
                return harness.spread(vals) if vals else "-"
            where = f"{service} on GPU 0" if n == 1 else f"{service} on each of {n} GPUs"
            lines.append(f"| {job}{' (rank %d bare)' % bare if bare is not None else ''} | {where} | "
                         f"{config} | {len(every)} | {spread('p50_vs_alone')} | "
                         f"{spread('p99_vs_alone')} | {spread('job_vs_alone')} | "
                         f"{sum(1 for r in every if r.get('stalled'))} of {len(every)} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", nargs="?", choices=["rank"], help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--job", choices=JOBS, help=argparse.SUPPRESS)
    p.add_argument("--go", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=29711, help=argparse.SUPPRESS)
    p.add_argument("--bundle")
    p.add_argument("--jobs", default="ddp", help="comma-separated: " + ", ".join(JOBS))
    p.add_argument("--service", choices=sorted(SERVICES), default="resnet50-graph")
    p.add_argument("--service-gpus", default="0", help="a service on each of these GPUs")
    p.add_argument("--configs", default="orion,orion:gpu_hold=false,timeslice")
    p.add_argument("--seconds", type=float, default=20, help="the job's (and services') window")
    p.add_argument("--load", type=float, default=0.5, help="arrivals, of the service's capacity")
    p.add_argument("--alone-requests", type=int, default=2000)
    p.add_argument("--bare-rank", type=int, choices=[0, 1],
                   help="run this rank without the interposer (a peer outside the node)")
    p.add_argument("--alt-interposer", help="the interposer of the orion@alt arm")
    p.add_argument("--service-cpus", default="2-3;4-5", help="cores of each GPU's service (;)")
    p.add_argument("--job-cpus", default="8-11;12-15", help="cores of each rank (;)")
    p.add_argument("--timeout", type=float, default=90)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--first-round", type=int, default=0)
    p.add_argument("--out")
    p.add_argument("--table", nargs="+", help="re-render the table of these results.jsonl "
                   "(several runs pooled, their rounds numbered on)")
    p.add_argument("--summary", action="store_true",
                   help="--table: only the medians over rounds, one line per job and configuration")
    args = p.parse_args(argv)
    if args.role == "rank":
        run_rank(args)
        return
    if args.table:
        print(render_table(harness.read_runs(args.table, "multigpu", lenient=True),
                           summary_only=args.summary))
        return
    if not args.bundle:
        p.error("--bundle is required")
    jobs = [j for j in args.jobs.split(",") if j]
    configs = [c for c in args.configs.split(",") if c and c != "alone"]
    for j in jobs:
        if j not in JOBS:
            p.error(f"unknown job '{j}' (known: {', '.join(JOBS)})")
    for c in configs:
        if not (c in ("orion", "timeslice", "orion@alt", *MPS_CONFIGS) or
                (c.startswith("orion:") and "=" in c)):
            p.error(f"unknown configuration '{c}' (orion, orion:KEY=VALUE, orion@alt, "
                    "timeslice, orion-mps, mps-cap)")
        for part in config_parts(c):
            if not re.fullmatch(r"be_env=ORION_[A-Z0-9_]+=\S*|[a-z_]+=[A-Za-z0-9_.-]+", part):
                p.error(f"configuration '{c}': '{part}' is neither KEY=VALUE nor "
                        "be_env=ORION_NAME=VALUE")
        if c == "orion@alt" and not args.alt_interposer:
            p.error("orion@alt needs --alt-interposer")
    if args.repeat < 1 or args.first_round < 0:
        p.error("--repeat wants 1 or more rounds, --first-round 0 or more")
    out = args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="orion-multigpu-out-")
    os.makedirs(out, exist_ok=True)
    h = Run(args, out)
    for gpu in h.gpus:
        h.capacity[gpu] = h.measure_capacity(gpu)
    rows, port = [], args.port
    for round_ in range(args.first_round, args.first_round + args.repeat):
        for kind in jobs:
            alone = None
            for config in ["alone"] + harness.rotated(configs, round_ - args.first_round):
                port += 1  # a fresh rendezvous port for every job
                row = h.arm(kind, config, port)
                row["round"], row["capacity_rps"] = round_, [h.capacity[g] for g in h.gpus]
                if config == "alone":
                    alone = row
                else:
                    compare(row, alone)
                rows.append(row)
                print(json.dumps(row), flush=True)
                harness.append_row(os.path.join(out, "results.jsonl"), row)
    table = render_table(rows)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(table + "\n")
    print(table)
