"""A best-effort pipeline-parallel training job across two GPUs beside a high-priority service.

  orion_bench.py pipeline --bundle DIR [--configs timeslice,mps-cap,orion-pass,orion,orion-mps]
      [--steps 200] [--micro 4] [--rate 40] [--repeat N] [--first-round K]
      [--backend nccl|gloo] [--timeout 240] [--out DIR]
  orion_bench.py pipeline --table results.jsonl        (re-renders a run's table)

The job: two processes, one per GPU (rank r on cuda:r; with one GPU both share cuda:0), each one
stage of an MLP (8 layers of 4096 per stage), GPipe schedule: each step runs --micro
micro-batches forward (stage 0 sends each activation to stage 1 with torch.distributed
send/recv), then backward (stage 1 sends each activation's gradient back), then both stages
step their optimizer. With the NCCL backend every transfer is an NCCL kernel on each GPU: a
kernel held at one GPU's gate while its peer already runs leaves the peer spinning, which the
gate must never do (collectives are never held: interpose/README.md). --backend gloo passes the
tensors through host memory instead (no NCCL kernels): it checks the harness on one GPU.

The service: ResNet50 batch 4 (bench/workloads/torch_models.py serve), Poisson arrivals at --rate, on
GPU 0, high priority. Configurations, each a fresh set of processes:
  alone       the service alone, then the job alone (no interposer): the baselines; every round
              starts with it (given or not), and each configuration is compared with its round's
  timeslice   both at once, no interposer
  mps-cap     both under the MPS daemon (one for both GPUs), no interposer; the job's ranks at
              CUDA_MPS_CLIENT_PRIORITY=1 and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
  orion-pass  both under orion-run (service high priority, both job ranks best effort),
              orion-server in pass-through mode: observed, nothing held
  orion       the same in priority mode (time-sliced GPU)
  orion-mps   mps-cap plus orion-run, orion-server in mps mode
With --repeat N, N rounds, the configurations' order rotating by one each round (the host
drifts), and the table adds each ratio's median [min, max] over the rounds. A job that does not
finish its --steps within --timeout seconds is reported as hung (its ranks are killed). Prints
and writes (to --out, default $OUT or a temp dir) results.jsonl, one line per configuration and
round (the service's p50/p99 and their ratio to alone, the job's steps/s and its ratio to alone,
whether it hung), and results.md.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import harness
from harness import MODELS, parse_result, read_rows

ANSWERS = ("whether a best-effort pipeline job on two GPUs (NCCL send/recv) runs beside a "
           "high-priority service without hanging, and what each configuration costs both")
# Each configuration's orion-server mode (None: no interposer) and whether it runs under MPS.
CONFIGS = {"alone": (None, False), "timeslice": (None, False), "mps-cap": (None, True),
           "orion-pass": ("pass-through", False), "orion": ("priority", False),
           "orion-mps": ("mps", True)}


# --- the job (one rank) ---------------------------------------------------------------------

def run_rank(args):
    import torch
    import torch.distributed as dist

    rank = args.rank
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}")
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=rank, world_size=2)
    width, layers, micro_batch = 4096, 8, 256
    stage = torch.nn.Sequential(*[m for _ in range(layers)
                                  for m in (torch.nn.Linear(width, width), torch.nn.ReLU())])
    stage = stage.to(device)
    opt = torch.optim.SGD(stage.parameters(), lr=1e-4)
    on_host = args.backend == "gloo"  # gloo moves host tensors only

    def send(t, to):
        dist.send(t.detach().cpu() if on_host else t.detach().contiguous(), to)

    def recv(frm):
        buf = torch.empty(micro_batch, width, device="cpu" if on_host else device)
        dist.recv(buf, frm)
        return buf.to(device) if on_host else buf

    def step():
        opt.zero_grad(set_to_none=True)
        kept = []
        for _ in range(args.micro):  # forward of every micro-batch (GPipe)
            if rank == 0:
                out = stage(torch.randn(micro_batch, width, device=device))
                send(out, 1)
                kept.append(out)
            else:
                act = recv(0).requires_grad_()
                kept.append((act, stage(act).square().mean()))
        for item in kept:  # then backward, in the same order on both stages
            if rank == 0:
                item.backward(recv(1))
            else:
                act, loss = item
                loss.backward()
                send(act.grad, 0)
        opt.step()
        torch.cuda.synchronize()

    for _ in range(3):  # warm-up: kernels loaded, NCCL channels set up
        step()
    dist.barrier()
    start = time.monotonic()
    for _ in range(args.steps):
        step()
    elapsed = time.monotonic() - start
    if rank == 0:
        print(f"result steps={args.steps} seconds={elapsed:.3f} steps_per_s={args.steps / elapsed:.3f}",
              flush=True)
    dist.destroy_process_group()


# --- the harness ----------------------------------------------------------------------------

def render_table(rows):
    lines = ["| config | backend | service p50 | service p99 | p50 / p99 vs alone | job steps/s | "
             "job vs alone | job |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        svc = r.get("service") or {}
        ratio = (f"{r['p50_vs_alone']:.2f}x / {r['p99_vs_alone']:.2f}x"
                 if r.get("p99_vs_alone") else "-")
        job = r.get("job") or {}
        lines.append(
            f"| {r['config']} | {r['backend']} | "
            f"{svc.get('p50_ms', '-') if svc else '-'} ms | {svc.get('p99_ms', '-') if svc else '-'} ms | "
            f"{ratio} | {job.get('steps_per_s', '-') if job else '-'} | "
            f"{'%.2fx' % r['job_vs_alone'] if r.get('job_vs_alone') else '-'} | "
            f"{'error: ' + r['error'] if r.get('error') else 'hung' if r.get('hung') else 'finished'} |")
    rounds = sorted({r.get("round", 0) for r in rows})
    if len(rounds) > 1:
        lines += ["", f"Over {len(rounds)} rounds (each against its own round's alone run): "
                  "median [min, max]", "",
                  "| config | rounds | service p50 vs alone | service p99 vs alone | "
                  "job vs alone | job finished |", "|---|---|---|---|---|---|"]
        groups = {}
        for r in rows:
            if r["config"] != "alone":
                groups.setdefault(r["config"], []).append(r)

        def spread(every, key):
            return harness.spread(r[key] for r in every if r.get(key))
        for config, every in groups.items():
            done = sum(1 for r in every if r.get("job") and not r.get("hung"))
            lines.append(f"| {config} | {len(every)} | {spread(every, 'p50_vs_alone')} | "
                         f"{spread(every, 'p99_vs_alone')} | {spread(every, 'job_vs_alone')} | "
                         f"{done} of {len(every)} |")
    return "\n".join(lines)


class Run:
    """The server, the MPS daemon and each configuration's processes."""

    def __init__(self, args, out):
        self.args, self.out = args, out
        self.bundle = os.path.abspath(args.bundle)
        self.work = tempfile.mkdtemp(prefix="orion-pipeline-")
        self.log = open(os.path.join(out, "pipeline-bench.log"), "a")
        self.server = None
        self.mps_env = {}

    def start_server(self):
        self.server = harness.Server(self.bundle, self.work, self.log, admin_port=50093,
                                     mode="priority").start()

    def set_mode(self, mode):
        self.server.ctl("policy", "--all", f"mode={mode}")

    def start_mps(self):
        """The MPS control daemon for every GPU; its clients find it through mps_env."""
        env, why = harness.start_mps_daemon(self.work)
        self.mps_env = env or {}
        return why

    def stop_mps(self):
        if self.mps_env:
            harness.stop_mps_daemon(self.mps_env)
        self.mps_env = {}

    def prefix(self, orion, priority):
        env = dict(self.mps_env)
        if self.mps_env and priority == "best-effort":
            env.update(harness.mps_best_effort_env(50))
        if not orion:
            return [], env
        env["ORION_SOCKET"] = self.server.socket
        return harness.orion_run(self.bundle, priority), env

    def service(self, orion, requests):
        pre, env = self.prefix(orion, "high")
        return subprocess.Popen(
            pre + [sys.executable, MODELS, "serve", "resnet50", "--rate", str(self.args.rate),
                   "--requests", str(requests)],
            env=dict(os.environ, CUDA_VISIBLE_DEVICES=self.args.service_gpu, **env),
            stdout=subprocess.PIPE, stderr=self.log, text=True)

    def job(self, orion, port):
        pre, env = self.prefix(orion, "best-effort")
        return [subprocess.Popen(
            pre + harness.experiment_command("pipeline", "rank", "--rank", str(r),
                   "--port", str(port), "--steps", str(self.args.steps), "--micro",
                   str(self.args.micro), "--backend", self.args.backend),
            env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=self.log, text=True,
            start_new_session=True) for r in (0, 1)]

    def wait_job(self, ranks):
        """The job's result, or None if it did not finish within --timeout (ranks killed)."""
        deadline = time.monotonic() + self.args.timeout
        outs = []
        for p in ranks:
            try:
                outs.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                for q in ranks:
                    if q.poll() is None:
                        os.killpg(q.pid, signal.SIGKILL)
                return None
        return parse_result(outs[0] or "")

    def wait_service(self, svc):
        try:
            out = svc.communicate(timeout=self.args.timeout)[0]
        except subprocess.TimeoutExpired:
            svc.kill()
            return None
        return parse_result(out or "")

    def run(self, config, port, round_):
        mode, mps = CONFIGS[config]
        row = {"config": config, "backend": self.args.backend, "round": round_,
               "rate": self.args.rate}
        if mode:
            self.set_mode(mode)
        if mps:
            why = self.start_mps()
            if why:
                row["error"] = why
                return row
        try:
            orion = mode is not None
            if config == "alone":
                row["service"] = self.wait_service(self.service(False, self.args.alone_requests))
                job = self.wait_job(self.job(False, port))
            else:
                svc = self.service(orion, self.args.requests)
                time.sleep(5)  # the service is serving before the job starts
                job = self.wait_job(self.job(orion, port))
                if svc.poll() is None:
                    svc.send_signal(signal.SIGTERM)  # the service's window is the job's
                row["service"] = self.wait_service(svc)
        finally:
            if mps:
                self.stop_mps()
        row["job"], row["hung"] = job, job is None
        return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("role", nargs="?", choices=["rank"], help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=29611, help=argparse.SUPPRESS)
    p.add_argument("--bundle")
    p.add_argument("--configs", default="timeslice,orion",
                   help="compared with the alone run each round starts with: " +
                        ", ".join(c for c in CONFIGS if c != "alone"))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--rate", type=float, default=40)
    p.add_argument("--requests", type=int, default=100000,
                   help="the service's requests beside the job (it is stopped when the job ends)")
    p.add_argument("--alone-requests", type=int, default=1200,
                   help="the service's requests alone (its baseline)")
    p.add_argument("--service-gpu", default="0")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--repeat", type=int, default=1, help="rounds (each with its own alone run)")
    p.add_argument("--first-round", type=int, default=0,
                   help="number this run's rounds from here, so that the results.jsonl of runs "
                        "split over several commands concatenate into one table")
    p.add_argument("--out")
    p.add_argument("--table")
    args = p.parse_args(argv)
    if args.role == "rank":
        run_rank(args)
        return
    if args.table:
        print(render_table(read_rows(args.table, "pipeline", lenient=True)))
        return
    if not args.bundle:
        p.error("--bundle is required")
    out = args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="orion-pipeline-out-")
    os.makedirs(out, exist_ok=True)
    configs = [c for c in args.configs.split(",") if c and c != "alone"]
    for config in configs:
        if config not in CONFIGS:
            raise SystemExit(f"unknown configuration '{config}' (known: {', '.join(CONFIGS)})")
    if args.repeat < 1 or args.first_round < 0:
        raise SystemExit("--repeat wants 1 or more rounds, --first-round 0 or more")
    h = Run(args, out)
    h.start_server()
    rows, port = [], args.port
    try:
        for round_ in range(args.first_round, args.first_round + args.repeat):
            alone = None
            for config in ["alone"] + harness.rotated(configs, round_ - args.first_round):
                port += 1  # a fresh rendezvous port for every job
                row = h.run(config, port, round_)
                if config == "alone":
                    alone = row
                elif alone and row.get("service") and alone.get("service"):
                    row["p50_vs_alone"] = row["service"]["p50_ms"] / alone["service"]["p50_ms"]
                    row["p99_vs_alone"] = row["service"]["p99_ms"] / alone["service"]["p99_ms"]
                if config != "alone" and alone and alone.get("job") and row.get("job"):
                    row["job_vs_alone"] = row["job"]["steps_per_s"] / alone["job"]["steps_per_s"]
                rows.append(row)
                print(json.dumps(row), flush=True)
                harness.append_row(os.path.join(out, "results.jsonl"), row)
    finally:
        h.stop_mps()
        h.server.stop()
    table = render_table(rows)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(table + "\n")
    print(table)
