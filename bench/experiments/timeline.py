"""The timeline against torch.profiler on a GPU: NVTX steps and per-pod busy seconds.

  orion_bench.py timeline --bundle DIR [--service resnet50|resnet50-graph|bert8|bert8-graph]
      [--rate 40]
      [--service-window 300] [--train-window 20[,20]] [--warm-seconds 5] [--together] [--out DIR]
      [--timing-log] [--label TEXT] [--trainer-joins] [--trainer MODEL[+MODEL]] [--keep-profiles]
      [--policy KEY=VALUE ...]
  orion_bench.py timeline --table results.jsonl      (re-renders a run's table)
  orion_bench.py timeline --starts RUN_DIR ... > runs.jsonl   (kept same-start runs: releases,
                                                               latency; --table renders them)

A trainer (ResNet50 at batch 64 unless --trainer, best effort, an NVTX range "step" per step)
and a ResNet50 service (batch 4, high priority, an NVTX range "request" per request, Poisson
arrivals at --rate; eager, or a CUDA graph with resnet50-graph; bert8: a BERT-base-sized fp16
encoder at 8 x 128 tokens instead) run under orion-run beside each other, orion-server in
priority mode. Each in turn runs a window under torch.profiler while the other goes on (the
service's window: --service-window requests back to back; the trainer's: --train-window steps).
For each window the server's timeline is exported (orion-ctl timeline --since/--until --trace)
and compared with what the profiler recorded in the same process:
  - every NVTX range's span against the profiler's step (ProfilerStep#k) for the same iteration:
    its duration on the GPU (first kernel start to last kernel end, measured through the
    interposer's timing events) and on the CPU (push to pop) against the profiler's step time
    and the profiler's GPU window (first kernel start to last kernel end of the step, CUPTI);
    the start of the span against the profiler's first kernel start (the clocks aligned by the
    pushes);
  - the client's orion_client_gpu_busy_seconds_total over the window against the sum of the
    profiler's kernel durations.
--together profiles both processes in the same window instead: both start their windows at once,
the service's requests keeping their Poisson arrivals (torch_models.py --profile-at-arrivals).
--trainer-joins (with --together) pauses the trainer (orion-ctl pause) once it is ready (its
model built, its warm-up steps run) until the windows start: through the warm-up the service
runs without it, then the trainer joins, a change every kernel of the service shares, which the
server's draw for untimed launches must follow within the window.
--trainer names another trainer of torch_models.py (default resnet50), or A+B, trainers together
(with --together; --train-window then takes one number or one for each: 8,100); --keep-profiles
copies each window's profiler summary and kernels to profiles/ in --out (for orion_bench.py
wait-behind, with --together: what each request waited behind; a group's second trainer as
trainer2, profiles/trainers.json naming them). A group's trainers are profiled, not compared
with the timeline: their busy seconds in /metrics are the group's.
Writes results.jsonl (one line per window) and results.md to --out (default $OUT or a temp dir),
and snapshots.txt: every 10 s, orion-ctl policy and clients, /metrics' orion_ series and each
client process's threads (state, user and system ticks).
"""
import argparse
import json
import os
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

ANSWERS = ("the timeline against torch.profiler on a GPU: NVTX step spans, and busy seconds "
           "against the profiler's kernel sum, for a service beside a trainer")


def render_table(rows):
    """One row per window; a "build" column where the rows say which build ran (an A/B)."""
    build = any("build" in r for r in rows)
    lines = [
        ("| build " if build else "") + "| window | beside | ranges matched | GPU span / profiler step (median, max dev) | "
        "GPU span / profiler GPU window (median, max dev) | CPU span / profiler step (median) | "
        "start vs profiler's first kernel (median, max) | busy seconds / profiler kernel sum |",
        ("|---" if build else "") + "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            (f"| {r.get('build', '')} " if build else "") + f"| {r['role']} {r['model']} | {r['beside']} | {r['matched']}/{r['ranges']} | "
            f"{r['gpu_vs_step']:.4f} ({r['gpu_vs_step_maxdev'] * 100:.2f}%) | "
            f"{r['gpu_vs_gpu']:.4f} ({r['gpu_vs_gpu_maxdev'] * 100:.2f}%) | "
            f"{r['cpu_vs_step']:.4f} | {r['start_diff_us']:.0f} us ({r['start_diff_max_us']:.0f} us) | "
            f"{r['busy_ratio']:.3f} ({r['busy_s']:.3f} / {r['torch_kernel_s']:.3f} s) |")
    return "\n".join(lines)


def compare(summary, trace, role, model, beside):
    """One window: the workload's profiler summary against the exported trace."""
    label = "request" if role == "service" else "step"
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "step"
             and e.get("name") == label and e["args"].get("priority") == summary["priority"]]
    off = summary["torch_clock_offset_us"]
    rows = []
    for st in summary["steps"]:
        push_us = st["push_ns"] / 1e3
        best = min(spans, key=lambda e: abs(e["args"]["cpu_start_us"] - push_us), default=None)
        if best is None or abs(best["args"]["cpu_start_us"] - push_us) > 2000:
            continue
        if not best["args"].get("measured") or st["torch_gpu_start_us"] is None:
            continue
        torch_gpu = st["torch_gpu_end_us"] - st["torch_gpu_start_us"]
        rows.append({
            "gpu_vs_step": best["dur"] / st["torch_dur_us"],
            "gpu_vs_gpu": best["dur"] / torch_gpu,
            "cpu_vs_step": best["args"]["cpu_dur_us"] / st["torch_dur_us"],
            "start_diff_us": best["ts"] - (st["torch_gpu_start_us"] + off),
        })
    if not rows:
        raise SystemExit(f"{role}: no NVTX span matched the profiler's steps")
    med = lambda k: statistics.median(r[k] for r in rows)
    maxdev = lambda k: max(abs(r[k] - 1) for r in rows)
    busy = (summary["busy_after_s"] or 0) - (summary["busy_before_s"] or 0)
    torch_s = summary["torch_kernel_sum_us"] / 1e6
    return {
        "role": role, "model": model, "beside": beside, "ranges": len(summary["steps"]),
        "matched": len(rows),
        "gpu_vs_step": med("gpu_vs_step"), "gpu_vs_step_maxdev": maxdev("gpu_vs_step"),
        "gpu_vs_gpu": med("gpu_vs_gpu"), "gpu_vs_gpu_maxdev": maxdev("gpu_vs_gpu"),
        "cpu_vs_step": med("cpu_vs_step"),
        "start_diff_us": med("start_diff_us"),
        "start_diff_max_us": max(abs(r["start_diff_us"]) for r in rows),
        "busy_s": busy, "torch_kernel_s": torch_s, "busy_ratio": busy / torch_s if torch_s else 0,
        "torch_kernels": summary["torch_kernels"],
    }


def best_effort_client(server, timeout_s=30):
    """The id of the one live best-effort client (the trainer) in `orion-ctl --json clients`,
    once it has registered (its first CUDA call)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        clients = json.loads(server.ctl("--json", "clients") or "{}").get("clients", [])
        found = [c for c in clients if c.get("priority") == "PRIORITY_BEST_EFFORT"
                 and not c.get("exited")]
        if len(found) > 1:
            raise SystemExit(f"--trainer-joins: {len(found)} best-effort clients, expected one")
        if found:
            return str(found[0]["client_id"])
        time.sleep(0.2)
    raise SystemExit("--trainer-joins: no best-effort client registered")


def start_run(folder):
    """One kept run of the same-start window: its arm (the folder's `arm` file, else its name),
    the releases of the hold (the most of any trainer's orion_client_gpu_hold_releases_total
    over the run's snapshots, else in metrics.txt), and the service's latency over the whole
    run (its result line in log.txt, else timeline-bench.log)."""
    def read(name):
        path = os.path.join(folder, name)
        return open(path).read() if os.path.exists(path) else ""
    arm = read("arm").strip() or os.path.basename(os.path.normpath(folder))
    counts = {}  # client -> its most (a counter: the last snapshot that has it)
    for line in (read("snapshots.txt") + "\n" + read("metrics.txt")).splitlines():
        if (line.startswith("orion_client_gpu_hold_releases_total{")
                and 'priority="best-effort"' in line):
            labels, _, value = line.rpartition("} ")
            client = labels.split('client="', 1)[-1]
            counts[client] = max(counts.get(client, 0), int(float(value)))
    log, text = "log.txt", read("log.txt")
    if not text:
        log, text = "timeline-bench.log", read("timeline-bench.log")
    result = next((line for line in text.splitlines()
                   if line.startswith("[service] result")), None)
    if result is None:
        raise SystemExit(f"{folder}: no '[service] result' line in {log}")
    fields = dict(kv.split("=", 1) for kv in result.split()[2:] if "=" in kv)
    try:
        figures = {k: float(fields[k]) for k in ("p50_ms", "p99_ms", "p999_ms")}
        requests = int(fields["requests"])
    except (KeyError, ValueError) as e:
        raise SystemExit(f"{folder}: {log}: the service's result line lacks {e}: {result}")
    return {"kind": "start-run", "run": os.path.relpath(os.path.abspath(folder), harness.ROOT),
            "arm": arm, "releases": max(counts.values()) if counts else None,
            "requests": requests, **figures}


def starts_table(runs):
    """Runs of the same-start window (start_run's rows) by arm: each run's releases and p99,
    the medians."""
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    out = ["| arm | runs | releases per run (a trainer's most) | service p99 per run | "
           "p50, p99, p99.9: median |",
           "|---|---|---|---|---|"]
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm]
        rel = ", ".join("-" if r["releases"] is None else str(r["releases"]) for r in rs)
        p99 = ", ".join(f"{r['p99_ms']:.0f}" for r in rs)
        med = ", ".join(f"{statistics.median(r[k] for r in rs):.1f}"
                        for k in ("p50_ms", "p99_ms", "p999_ms"))
        out.append(f"| {arm} | {len(rs)} | {rel} | {p99} ms | {med} ms |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle")
    p.add_argument("--service", default="resnet50",
                   choices=["resnet50", "resnet50-graph", "bert8", "bert8-graph"])
    p.add_argument("--rate", type=float, default=40)
    p.add_argument("--service-window", type=int, default=300)
    p.add_argument("--train-window", default="20",
                   help="steps under the profiler: one number, or one for each trainer of a group")
    p.add_argument("--warm-seconds", type=float, default=5,
                   help="both run this long before the first window (the kernels' durations "
                        "are learned from launches sampled 1 in 64)")
    p.add_argument("--admin-port", type=int, default=50091)
    p.add_argument("--together", action="store_true",
                   help="both processes under the profiler in the same window")
    p.add_argument("--out")
    p.add_argument("--table", nargs="+", metavar="RESULTS_JSONL",
                   help="renders the rows of these files, pooled (same-start runs by arm)")
    p.add_argument("--starts", nargs="+", metavar="RUN_DIR",
                   help="kept same-start runs as JSONL rows, one a folder (its log.txt, "
                        "snapshots.txt or metrics.txt, and an optional `arm` file naming its "
                        "arm): --table renders them by arm")
    p.add_argument("--label", help="the rows' build column (an A/B: say what this run is)")
    p.add_argument("--timing-log", action="store_true",
                   help="both processes write the GPU timing diagnostic (ORION_TIMING_LOG) to "
                        "OUT/timing; its summary (orion_bench.py timing-log) is printed and "
                        "kept as OUT/timing.md")
    p.add_argument("--trainer", default="resnet50",
                   help="the best-effort trainer (a train model of torch_models.py), or A+B: "
                        "trainers together (with --together)")
    p.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE",
                   help="a policy setting of orion-server's config (e.g. be_budget_us=100); "
                        "repeatable")
    p.add_argument("--keep-profiles", action="store_true",
                   help="copy the profiler summaries and kernels to profiles/ in --out")
    p.add_argument("--trainer-joins", action="store_true",
                   help="with --together: the trainer paused through the warm-up, resumed as "
                        "the windows start")
    args = p.parse_args(argv)
    if args.starts:
        for folder in args.starts:
            print(json.dumps(start_run(folder)))
        return
    if args.trainer_joins and not args.together:
        p.error("--trainer-joins goes with --together")
    trainers = args.trainer.split("+")
    if "" in trainers:
        p.error(f"--trainer {args.trainer}: an empty name in the group")
    try:
        train_windows = [int(w) for w in args.train_window.split(",")]
    except ValueError:
        p.error(f"--train-window {args.train_window}: whole numbers of steps, comma-separated")
    if len(train_windows) == 1:
        train_windows *= len(trainers)
    if len(train_windows) != len(trainers) or min(train_windows) < 1:
        p.error(f"--train-window {args.train_window}: one number of steps (at least 1), or one "
                f"for each of the {len(trainers)} trainers")
    if len(trainers) > 1 and (args.trainer_joins or not args.together):
        p.error("--trainer A+B goes with --together, without --trainer-joins")
    if args.table:
        rows = [r for path in args.table for r in read_rows(path, "timeline")]
        starts = [r for r in rows if r.get("kind") == "start-run"]
        if starts and len(starts) != len(rows):
            raise SystemExit(f"timeline: {' '.join(args.table)}: same-start runs (--starts) and "
                             f"windows mixed: render them apart")
        print(starts_table(starts) if starts else render_table(rows))
        return
    if not args.bundle:
        p.error("--bundle is required")
    bundle = os.path.abspath(args.bundle)
    out = args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="orion-timeline-")
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="orion-tl-")
    log = open(os.path.join(out, "timeline-bench.log"), "a")
    server = harness.Server(bundle, work, log, admin_port=args.admin_port, mode="priority",
                            extra="timeline_spans_per_gpu: 4000000\n" + (
                                "policy:\n" + "".join(
                                    f"  {kv.split('=', 1)[0]}: {kv.split('=', 1)[1]}\n"
                                    for kv in args.policy) if args.policy else "")).start()
    procs = [server.proc]
    metrics = server.metrics_url

    def client(role, argv):
        prio = "high" if role == "service" else "best-effort"
        env = dict(os.environ, ORION_SOCKET=server.socket)
        if args.timing_log:
            os.makedirs(os.path.join(out, "timing"), exist_ok=True)
            env["ORION_TIMING_LOG"] = os.path.join(out, "timing")
        cmd = harness.orion_run(bundle, prio) + [
               sys.executable, MODELS, *argv, "--nvtx", "--metrics", metrics,
               "--priority-label", prio, "--profile-out", os.path.join(work, f"{role}.json"),
               "--profile-when", os.path.join(work, f"{role}.go")]
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        procs.append(p)
        threading.Thread(target=read, args=(p, role), daemon=True).start()
        return p

    # Each process's output read all along by a thread of its own (a trainer prints a line a
    # step: unread, its pipe would fill and stop it mid-window), its lines' first words kept.
    seen, said = threading.Condition(), {}

    def read(p, what):
        for line in p.stdout:
            log.write(f"[{what}] {line}")
            log.flush()
            with seen:
                said.setdefault(p.pid, set()).add(line.split(" ", 1)[0].strip())
                seen.notify_all()
        with seen:
            said.setdefault(p.pid, set()).add(None)  # ended
            seen.notify_all()

    def wait_for(p, word, what):
        with seen:
            seen.wait_for(lambda: word in said.get(p.pid, ()) or None in said.get(p.pid, ()))
            if word in said[p.pid]:
                return
        raise SystemExit(f"{what} ended before '{word}' (exit {p.wait()}); see timeline-bench.log")

    def export(summary, name):
        first = min(s["push_ns"] for s in summary["steps"]) // 1_000_000 - 1000
        last = max(s["pop_ns"] for s in summary["steps"]) // 1_000_000 + 1000
        path = os.path.join(out, name)
        log.write(server.ctl("timeline", "--since", str(first), "--until", str(last),
                             "--trace", path))
        return json.load(open(path))

    rows, snapshots = [], None
    try:
        # What the gate and the processes do meanwhile, every 10 s (a stall shows there).
        snapshots = harness.snapshot_every(os.path.join(out, "snapshots.txt"), server, 10,
                                           pids=lambda: [p.pid for p in procs[1:]])
        graph = args.service.endswith("-graph")
        svc = client("service", ["serve", args.service.removesuffix("-graph"), "--rate",
                                 str(args.rate), "--requests", "1000000",
                                 "--profile", str(args.service_window)]
                     + (["--graph"] if graph else [])
                     + (["--profile-at-arrivals"] if args.together else []))
        # The group's trainers: roles trainer, trainer2, ... (their profiles' names).
        roles = ["trainer"] + [f"trainer{i}" for i in range(2, len(trainers) + 1)]
        trainer_procs = [client(role, ["train", name, "--profile", str(window)])
                         for role, name, window in zip(roles, trainers, train_windows)]
        wait_for(svc, "serving", "service")
        for role, proc in zip(roles, trainer_procs):
            wait_for(proc, "ready", role)
        trainer_id = best_effort_client(server) if args.trainer_joins else None
        if trainer_id is not None:
            log.write(server.ctl("pause", trainer_id))
        time.sleep(args.warm_seconds)
        windows = (("service", svc, args.service_window), *zip(roles, trainer_procs, train_windows))
        if args.keep_profiles:
            os.makedirs(os.path.join(out, "profiles"), exist_ok=True)
            with open(os.path.join(out, "profiles", "trainers.json"), "w") as f:
                json.dump(dict(zip(roles, trainers)), f)
        if trainer_id is not None:
            log.write(server.ctl("resume", trainer_id))
        if args.together:
            for role, _, _ in windows:
                open(os.path.join(work, f"{role}.go"), "w").close()
        for role, p, window in windows:
            if not args.together:
                open(os.path.join(work, f"{role}.go"), "w").close()
            wait_for(p, "profiled", role)
            summary = json.load(open(os.path.join(work, f"{role}.json")))
            if args.keep_profiles:  # (profiles/ made with trainers.json)
                shutil.copy(os.path.join(work, f"{role}.json"),
                            os.path.join(out, "profiles", f"{role}.json"))
                shutil.copy(os.path.join(work, f"{role}.json.kernels.json"),
                            os.path.join(out, "profiles", f"{role}.kernels.json"))
            if args.timing_log:
                os.replace(os.path.join(work, f"{role}.json.kernels.json"),
                           os.path.join(out, "timing", f"profile-{role}.kernels.json"))
            if role != "service" and len(trainers) > 1:
                continue  # profiled for wait-behind; busy seconds by priority are the group's
            trace = export(summary, f"timeline-{role}-{args.service}.json")
            beside = f"{args.trainer} training" if role == "service" else f"{args.service} service at {args.rate:g}/s"
            if args.together:
                beside += ", both profiled"
            if args.trainer_joins:
                beside += ", the trainer joining as the window starts"
            model = (f"{args.service} at {args.rate:g}/s" if role == "service"
                     else args.trainer)
            row = compare(summary, trace, role, model, beside)
            row["bundle_interposer"] = "liborion_interpose.so"
            if args.label:
                row["build"] = args.label
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if snapshots:
            snapshots.set()
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    for r in rows:
        harness.append_row(os.path.join(out, "results.jsonl"), r)
    table = render_table(rows)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    if args.timing_log:
        tdir = os.path.join(out, "timing")
        profiles = [a for f in sorted(os.listdir(tdir)) if f.endswith(".kernels.json")
                    for a in ("--profile", os.path.join(tdir, f))]
        summary = subprocess.run(harness.experiment_command("timing-log", tdir, *profiles),
                                 capture_output=True, text=True)
        with open(os.path.join(out, "timing.md"), "w") as f:
            f.write(summary.stdout + summary.stderr)
        print(summary.stdout + summary.stderr)
