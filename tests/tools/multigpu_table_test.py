#!/usr/bin/env python3
"""bench/orion_bench.py multigpu without a GPU: the job's figures inside the services' window
(steps, rate, the longest gap with the window's ends counted, so a job that never stepped has
the whole window as its gap), the ratios against the round's alone run and the stall rule, the
summary over two pooled result files (rounds of both counted, services told apart), where a
configuration's policy setting and be_env variables go, and the refusal of a configuration it
does not know before any work."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from experiments import multigpu  # noqa: E402

SCRIPT = os.path.join(ROOT, "bench", "orion_bench.py")


def check(cond, what):
    if not cond:
        sys.exit(f"multigpu_table_test: {what}")


# The window [10, 20]: steps every 0.5 s up to 15, then nothing: the gap is 15 -> 20.
w = multigpu.job_figures([9.0, *[10 + 0.5 * i for i in range(11)], 25.0], 10.0, 20.0)
check(w["steps"] == 11, f"steps in the window: {w}")
check(abs(w["steps_per_s"] - 1.1) < 1e-9, f"rate in the window: {w}")
check(abs(w["max_gap_s"] - 5.0) < 1e-9, f"longest gap: {w}")
stalled = multigpu.job_figures([], 0.0, 12.0)
check(stalled["steps"] == 0 and stalled["max_gap_s"] == 12.0, f"a job with no step: {stalled}")


def row(config, rnd, p50, p99, steps, gap, service="resnet50-graph", gpus=("0",)):
    return {"job": "ddp", "config": config, "round": rnd, "service": service,
            "service_gpus": list(gpus), "bare_rank": None,
            "services": [{"p50_ms": p50, "p99_ms": p99} for _ in gpus],
            "job_window": {"steps": steps, "window_s": 10.0, "steps_per_s": steps / 10.0,
                           "max_gap_s": gap}, "job_step_ms": 40.0}


alone = row("alone", 0, 1.0, 4.0, 250, 0.05)
ok = multigpu.compare(row("orion", 0, 1.5, 4.8, 80, 0.2), alone)
check(ok["p50_vs_alone"] == [1.5] and abs(ok["p99_vs_alone"][0] - 1.2) < 1e-9, f"ratios: {ok}")
check(abs(ok["job_vs_alone"] - 0.32) < 1e-9 and not ok["stalled"], f"job: {ok}")
# A gap of 0.9 s is under 1 s: not a stall; 10 s of nothing is.
check(not multigpu.compare(row("orion", 0, 1, 4, 200, 0.9), alone)["stalled"], "0.9 s gap")
bad = multigpu.compare(row("orion@alt", 0, 1600.0, 3000.0, 0, 10.0), alone)
check(bad["stalled"] and bad["job_vs_alone"] == 0, f"a stalled job: {bad}")

with tempfile.TemporaryDirectory() as tmp:
    files = []
    for rnd, p50 in ((0, 1.4), (1, 1.6)):
        path = os.path.join(tmp, f"run{rnd}.jsonl")
        a = row("alone", 0, 1.0, 4.0, 250, 0.05)
        rows = [a, multigpu.compare(row("orion", 0, p50, 4.4, 80, 0.2), a),
                multigpu.compare(row("orion", 0, 2.0, 20.0, 60, 0.3, service="bert8-graph",
                                     gpus=("0", "1")), a)]
        with open(path, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        files.append(path)
    out = subprocess.run([sys.executable, SCRIPT, "multigpu", "--table", *files, "--summary"],
                         capture_output=True, text=True)
    check(out.returncode == 0, f"--table --summary failed: {out.stderr}")
    lines = [l for l in out.stdout.splitlines() if l.startswith("| ddp")]
    check(len(lines) == 2, f"one line per job, service and configuration:\n{out.stdout}")
    check("resnet50-graph on GPU 0 | orion | 2 | 1.50x [1.40, 1.60]" in lines[0],
          f"two pooled rounds, median [min, max]:\n{out.stdout}")
    check("bert8-graph on each of 2 GPUs | orion | 2 | 2.00x [2.00, 2.00] | 5.00x" in lines[1],
          f"every service's ratio of both rounds:\n{out.stdout}")

bad_cfg = subprocess.run([sys.executable, SCRIPT, "multigpu", "--bundle", "/nonexistent",
                          "--configs", "orion,nonsense"], capture_output=True, text=True)
check(bad_cfg.returncode == 2 and "unknown configuration 'nonsense'" in bad_cfg.stderr,
      f"an unknown configuration: {bad_cfg.returncode} {bad_cfg.stderr}")
alt = subprocess.run([sys.executable, SCRIPT, "multigpu", "--bundle", "/nonexistent",
                      "--configs", "orion@alt"], capture_output=True, text=True)
check(alt.returncode == 2 and "orion@alt needs --alt-interposer" in alt.stderr,
      f"orion@alt without its build: {alt.returncode} {alt.stderr}")
# A configuration's policy setting goes to the server, its be_env variables to the ranks alone.
spec = "orion:gpu_hold_max_ms=500+gpu_hold_release_ms=0+be_env=ORION_GEMM_SPLIT=0"
check(multigpu.server_policy(spec) == "policy:\n  gpu_hold_max_ms: 500\n  gpu_hold_release_ms: 0\n",
      f"the server's policy: {multigpu.server_policy(spec)!r}")
check(multigpu.server_policy("orion") == "", "orion: no policy lines")
check(multigpu.server_policy("orion:be_env=ORION_GEMM_SPLIT=0") == "", "be_env alone: no policy")
check(multigpu.be_env(spec) == {"ORION_GEMM_SPLIT": "0"}, f"be_env: {multigpu.be_env(spec)}")
check(multigpu.be_env("orion:gpu_hold=false") == {}, "no be_env: no variables")


class Args:
    bundle, alt_interposer = "/b", None


class Server:
    socket = "/s"


run = multigpu.Run.__new__(multigpu.Run)
run.args, run.bundle, run.mps_env = Args(), "/b", None
_, rank_env = run.prefix(spec, "best-effort", Server())
_, service_env = run.prefix(spec, "high", Server())
check(rank_env.get("ORION_GEMM_SPLIT") == "0", f"a rank's environment: {rank_env}")
check("ORION_GEMM_SPLIT" not in service_env, f"a service's environment: {service_env}")
bad_env = subprocess.run([sys.executable, SCRIPT, "multigpu", "--bundle", "/nonexistent",
                          "--configs", "orion:gpu_hold=false+ORION_X=1"],
                         capture_output=True, text=True)
check(bad_env.returncode == 2 and "'ORION_X=1' is neither KEY=VALUE nor be_env" in bad_env.stderr,
      f"a malformed be_env: {bad_env.returncode} {bad_env.stderr}")
print("multigpu_table_test: passed")
