#!/usr/bin/env python3
"""The priority and matrix experiments' configuration specs (bench/experiments/priority.py
parse_config): server knobs stay knobs, the trainer's knobs go to its environment (gemm_split,
timing_hold, gemm_split_ns, be_env=ORION_NAME=VALUE), and a bad one ends the run with a message
that names the spec before anything starts; trainers run together (--be A+B) are keyed, summed
and harvested as one; --table's --services and --trainers keep those rows and the alone rows."""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from experiments import priority  # noqa: E402


def main():
    args = argparse.Namespace(alt_interposer="/some/liborion_interpose.so", mps_be_percent=50)
    failures = []
    good = {
        "orion": ([], {}, False),
        "orion:hp_grace_us=1000": (["hp_grace_us=1000"], {}, False),
        "orion@alt:timing_hold=0": ([], {"ORION_TIMING_HOLD": "0"}, True),
        "orion:gemm_split=0+gemm_split_ns=100000": (
            [], {"ORION_GEMM_SPLIT": "0", "ORION_GEMM_SPLIT_NS": "100000"}, False),
        "orion@alt:be_env=ORION_NO_TIMING=1+be_env=ORION_X_Y=a=b+gpu_hold=false": (
            ["gpu_hold=false"], {"ORION_NO_TIMING": "1", "ORION_X_Y": "a=b"}, True),
    }
    for spec, (knobs, env, alt) in good.items():
        c = priority.parse_config(spec, args)
        if (c.knobs, c.be_env, c.alt) != (knobs, env, alt):
            failures.append(f"{spec}: knobs {c.knobs}, env {c.be_env}, alt {c.alt} "
                            f"(want {knobs}, {env}, {alt})")
    bad = {
        "orion:timing_hold=2": "timing_hold wants 0 or 1",
        "orion:gemm_split_ns=5": "gemm_split_ns wants nanoseconds",
        "orion:gemm_split_ns=1e6": "gemm_split_ns wants nanoseconds",
        "orion:be_env=PATH=/tmp": "be_env wants ORION_NAME=VALUE",
        "orion:be_env=ORION_X": "be_env wants ORION_NAME=VALUE",
        "orion:be_env=orion_x=1": "be_env wants ORION_NAME=VALUE",
        "mps-cap:timing_hold=0": "wants an orion configuration",
        "orion:gemm_split": "is not knob=value",
    }
    for spec, why in bad.items():
        try:
            priority.parse_config(spec, args)
            failures.append(f"{spec}: accepted")
        except SystemExit as e:
            if spec not in str(e) or why not in str(e):
                failures.append(f"{spec}: {e} (want it named, with '{why}')")
    # Trainers together: each keyed once, their ratios summed into the group's, and the harvest
    # of the group is the GPU time both got over what the service leaves idle.
    groups = {"llm": ["llm"], "llm+resnet50": ["llm", "resnet50"],
              "sample+sample+sample": ["sample", "sample#2", "sample#3"]}
    for be, keys in groups.items():
        if priority.trainer_group(be) != keys:
            failures.append(f"--be {be}: keys {priority.trainer_group(be)} (want {keys})")
    for be in ("llm+", "+llm", "llm++resnet50", "sample#2+sample+sample", "llm#2"):
        try:
            priority.trainer_group(be)
            failures.append(f"--be {be}: accepted")
        except SystemExit as e:
            if be not in str(e):
                failures.append(f"--be {be}: {e} (want it named)")
    total, parts = priority.group_ratio({"sample": 3.0, "sample#2": 1.0}, {"sample": 10.0})
    if (total, parts) != (0.4, {"sample": 0.3, "sample#2": 0.1}):
        failures.append(f"two samples at 3 and 1 of 10 steps/s: {total}, {parts}")
    if priority.group_ratio({"llm": 1.0, "resnet50": 2.0}, {"llm": 2.0}) != (None, None):
        failures.append("a trainer with no speed alone still gave the group a ratio")
    row = {"config": "orion", "hp": "bert8-graph", "be": "llm+resnet50", "be_x": 0.4,
           "be_parts": {"llm": 0.3, "resnet50": 0.1}}
    if priority.harvest_of(row, 0.5) != 0.8:
        failures.append(f"harvest of the group {priority.harvest_of(row, 0.5)} (want 0.8)")
    if priority.trainer_ratio(row) != "0.40x (llm 0.30x + resnet50 0.10x)":
        failures.append(f"trainer column {priority.trainer_ratio(row)!r}")
    rows = [{"config": "alone", "hp": "bert8-graph", "be": None},
            {"config": "alone", "hp": None, "be": "llm"},
            {"config": "orion", "hp": "bert8-graph", "be": "llm"},
            {"config": "orion", "hp": "bert8-graph", "be": "llm+resnet50"},
            {"config": "orion", "hp": "resnet50-graph", "be": "llm+resnet50"}]
    kept = [(r["hp"], r["be"]) for r in priority.table_rows(rows, None, "llm+resnet50")]
    if kept != [("bert8-graph", None), ("bert8-graph", "llm+resnet50"),
                ("resnet50-graph", "llm+resnet50")]:
        failures.append(f"--trainers llm+resnet50 kept {kept}")
    kept = [(r["hp"], r["be"]) for r in priority.table_rows(rows, "bert8-graph", "llm")]
    if kept != [("bert8-graph", None), (None, "llm"), ("bert8-graph", "llm")]:
        failures.append(f"--services bert8-graph --trainers llm kept {kept}")
    if priority.table_rows(rows) != rows:
        failures.append("no filter dropped rows")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
