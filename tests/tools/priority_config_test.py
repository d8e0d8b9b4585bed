#!/usr/bin/env python3
"""The priority and matrix experiments' configuration specs (bench/experiments/priority.py
parse_config): server knobs stay knobs, the trainer's knobs go to its environment (gemm_split,
timing_hold, gemm_split_ns, be_env=ORION_NAME=VALUE), and a bad one ends the run with a message
that names the spec before anything starts."""
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
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
