"""Long GEMMs in pieces (interpose/gemm_split.h): are the pieces exact, does training see them,
what do they cost a trainer. The service beside a trainer is the priority experiment's
(`orion_bench.py priority --configs orion,orion:gemm_split=0`); this one needs no server.

  orion_bench.py gemm-split --bundle DIR [--parts exact,loss,cost] [--loss-steps 200]
                            [--trainers gptlm,llm] [--seconds 10] [--rounds 3] [--bound-us 250]
                            [--out DIR]
  orion_bench.py gemm-split --table results.jsonl

Every process runs under the bundle's interposer with no server (its hooks pass through) and
ORION_GEMM_SPLIT_NS forcing the pieces' bound whatever shares the GPU:
  exact  bench/workloads/gemm_split_check.py exact at a 20 us bound: each case's whole call
         against its call in pieces (GEMM kernels of each, bit-equal share, largest difference);
  loss   the gptlm trainer from one seed for --loss-steps steps, whole (ORION_GEMM_SPLIT=0),
         in pieces (--bound-us), and whole again (the run-to-run noise to compare with);
  cost   each trainer's steps/s over --seconds, whole against in pieces at --bound-us, arms
         alternating over --rounds rounds. With nothing to protect the split is off: this is what
         it costs while it is on.
Rows go to results.jsonl in --out (default $OUT); the table follows.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import harness

ANSWERS = ("long GEMMs in pieces: exact against the whole call (fp32, tf32, bf16, fp16, "
           "transposes, batched, bias and GELU epilogues), a trainer's loss over 200 steps, "
           "what the pieces cost a trainer alone")
BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(BENCH, "workloads", "gemm_split_check.py")
MODELS = os.path.join(BENCH, "workloads", "torch_models.py")


def env_for(bundle, bound_ns):
    env = dict(os.environ, LD_PRELOAD=os.path.join(bundle, "liborion_interpose.so"),
               ORION_SOCKET="/nonexistent/orion.sock", ORION_QUIET="1",
               ORION_GEMM_SPLIT_REPORT="1")
    env.pop("ORION_GEMM_SPLIT_NS", None)
    if bound_ns:
        env["ORION_GEMM_SPLIT_NS"] = str(bound_ns)
    else:
        env["ORION_GEMM_SPLIT"] = "0"
    return env


def run_json(argv, env, timeout):
    r = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                       timeout=timeout)
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    report = [line for line in r.stderr.splitlines() if "gemm split:" in line]
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-3000:])
    return rows, (report[-1] if report else ""), r.returncode


def trainer_speed(bundle, model, bound_ns, seconds):
    p = subprocess.Popen([sys.executable, MODELS, "train", model], env=env_for(bundle, bound_ns),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    times, report = [], ""
    try:
        for line in p.stdout:
            if line.startswith("step "):
                times.append(float(line.split()[1]))
                if times[-1] - times[0] >= seconds:
                    break
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            _, err = p.communicate(timeout=60)
            report = next((x for x in err.splitlines() if "gemm split:" in x), "")
        except subprocess.TimeoutExpired:
            p.kill()
    if len(times) < 3:
        return None, report
    return (len(times) - 1) / (times[-1] - times[0]), report


def measure(args):
    out = args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="orion-gemm-split-")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "results.jsonl")
    parts = args.parts.split(",")
    bound = args.bound_us * 1000
    if "exact" in parts:
        rows, report, rc = run_json([CHECK, "exact"], env_for(args.bundle, 20_000), 400)
        for row in rows:
            harness.append_row(path, {"part": "exact", **row})
        harness.append_row(path, {"part": "exact-report", "report": report, "rc": rc})
    if "loss" in parts:
        for arm, b in (("whole", 0), ("pieces", bound), ("whole-again", 0)):
            rows, report, rc = run_json([CHECK, "loss", str(args.loss_steps)],
                                        env_for(args.bundle, b), 400)
            harness.append_row(path, {"part": "loss", "arm": arm, "bound_us": b // 1000,
                                      "losses": rows[0]["losses"] if rows else None,
                                      "report": report, "rc": rc})
    if "cost" in parts:
        for r in range(args.rounds):
            for model in args.trainers.split(","):
                for arm, b in harness.rotated([("whole", 0), ("pieces", bound)], r):
                    speed, report = trainer_speed(args.bundle, model, b, args.seconds)
                    harness.append_row(path, {"part": "cost", "trainer": model, "arm": arm,
                                              "bound_us": b // 1000, "round": r + 1,
                                              "steps_per_s": speed, "report": report})
    print(table(harness.read_rows(path, "gemm-split", lenient=True)))


def table(rows):
    lines = []
    exact = [r for r in rows if r.get("part") == "exact"]
    if exact:
        lines.append(harness.markdown_table(
            ["case", "output", "GEMM kernels whole / in pieces", "bit-equal", "largest difference"],
            [[r["case"], "x".join(map(str, r["shape"])), f"{r['kernels'][0]} / {r['kernels'][1]}",
              f"{r['bitwise']:.3f}", f"{r['max_rel']:.2e}"] for r in exact]))
        for r in rows:
            if r.get("part") == "exact-report":
                lines.append(f"\ninterposer: {r['report'] or '(no report)'}")
    loss = {r["arm"]: r for r in rows if r.get("part") == "loss" and r.get("losses")}
    if {"whole", "pieces", "whole-again"} <= set(loss):
        def gap(x, y):
            return max(abs(a - b) for a, b in zip(loss[x]["losses"], loss[y]["losses"]))
        w, p, a = (loss[k]["losses"] for k in ("whole", "pieces", "whole-again"))
        lines.append("")
        lines.append(harness.markdown_table(
            ["steps", "final loss whole / in pieces / whole again",
             "largest step gap: pieces vs whole", "whole vs whole again", "split"],
            [[len(w), f"{w[-1]:.4f} / {p[-1]:.4f} / {a[-1]:.4f}",
              f"{gap('pieces', 'whole'):.4f}", f"{gap('whole-again', 'whole'):.4f}",
              loss["pieces"]["report"].replace("orion: gemm split: ", "")]]))
    cost = [r for r in rows if r.get("part") == "cost" and r.get("steps_per_s")]
    if cost:
        out = []
        for model in sorted({r["trainer"] for r in cost}):
            by_round = {}
            for r in cost:
                if r["trainer"] == model:
                    by_round.setdefault(r["round"], {})[r["arm"]] = r["steps_per_s"]
            ratios = [v["pieces"] / v["whole"] for v in by_round.values()
                      if "pieces" in v and "whole" in v]
            whole = statistics.median(v["whole"] for v in by_round.values() if "whole" in v)
            pieces = [r for r in cost if r["trainer"] == model and r["arm"] == "pieces"]
            out.append([model, len(ratios), f"{whole:.2f}", harness.spread(ratios, 3),
                        pieces[-1]["report"].replace("orion: gemm split: ", "") if pieces
                        else ""])
        lines.append("")
        lines.append(harness.markdown_table(
            ["trainer", "rounds", "steps/s whole", "in pieces / whole", "split (last run)"], out))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="orion_bench.py gemm-split", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle")
    p.add_argument("--parts", default="exact,loss,cost")
    p.add_argument("--loss-steps", type=int, default=200)
    p.add_argument("--trainers", default="gptlm,llm")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bound-us", type=int, default=250)
    p.add_argument("--out")
    p.add_argument("--table")
    args = p.parse_args(argv)
    if args.table:
        print(table(harness.read_rows(args.table, "gemm-split")))
        return 0
    if not args.bundle:
        p.error("--bundle DIR (tools/bundle.sh) or --table FILE")
    measure(args)
    return 0
