#!/usr/bin/env python3
"""launch-cost --paired-split on the CUDA test double (no GPU): per switch, orion-bench-launch
pairs the interposer with itself inside one process, setting the benchmark switch for every
other group (--pair-switch), and the table gives each part's cost.

Runs launch-cost from a bundle made of this build's orion-server, orion-run, orion-bench-launch
and interposer, with the test double as libcuda, for the as-usual (A/A), bypass and no-notes
switches, and checks: each arm's paired line names its switch, the rows carry it, the table
lists the parts, the bypass part (the whole path past the hook's entry) reads above the noise of
one run (the switch reached the interposer: set for no group, both halves would be alike) and
above the A/A control. Then checks that
orion-bench-launch refuses --pair-switch without ORION_BENCH_SWITCH, and that launch-cost refuses
an unknown --paired-split name before any work.

  launch_cost_paired_split_test.py BUILD
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY = os.path.join(ROOT, "bench", "orion_bench.py")


def check(ok, msg):
    if not ok:
        print("FAIL:", msg)
        sys.exit(1)


def main():
    build = os.path.abspath(sys.argv[1])
    double = os.path.join(build, "tests", "cuda_double", "lib")
    cpu = str(min(os.sched_getaffinity(0)))
    with tempfile.TemporaryDirectory(prefix="orion-paired-split-") as work:
        bundle = os.path.join(work, "bundle")
        os.mkdir(bundle)
        for name, path in (("orion-server", "server/orion-server"),
                           ("orion-run", "tools/orion-run"),
                           ("orion-bench-launch", "bench/orion-bench-launch"),
                           ("liborion_interpose.so", "interpose/liborion_interpose.so")):
            os.symlink(os.path.join(build, path), os.path.join(bundle, name))
        out = os.path.join(work, "out")
        env = dict(os.environ, LD_LIBRARY_PATH=double)
        r = subprocess.run(
            [sys.executable, ENTRY, "launch-cost", "--bundle", bundle, "--runs", "1", "--cpus",
             cpu, "--admin-port", "0", "--launches", "100", "--pairs", "200", "--kernels", "8",
             "--paired-split", "as-usual,bypass,no-hp-notes", "--out", out],
            env=env, capture_output=True, text=True, timeout=240)
        check(r.returncode == 0, f"launch-cost exit {r.returncode}:\n{r.stdout}\n{r.stderr}")
        with open(os.path.join(out, "launch-cost.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        parts = {row["pair_switch"]: row for row in rows
                 if row["variant"] == "paired" and "pair_switch" in row}
        check(sorted(parts) == ["as-usual", "bypass", "no-hp-notes"],
              f"paired-split rows: {sorted(parts)}")
        bypass = parts["bypass"]
        half = (bypass["ci_high"] - bypass["ci_low"]) / 2
        check(bypass["adds_ns"] > 2 * half + 5,
              f"the bypass part reads {bypass['adds_ns']} ns, within its run's interval "
              f"+-{half}: did the switch reach the interposer?")
        # The A/A control: both halves take the same path, so it reads less than the bypass.
        check(abs(parts["as-usual"]["adds_ns"]) < bypass["adds_ns"],
              f"as usual against itself reads {parts['as-usual']['adds_ns']} ns, the bypass "
              f"part {bypass['adds_ns']} ns")
        heading = "high priority less this, inside one process"
        check(heading in r.stdout, f"no paired-split table:\n{r.stdout}")
        table = r.stdout.split(heading, 1)[1]
        for part in ("| bypass |", "| nothing published to the high-priority gate entry |"):
            check(part in table, f"no row {part} in the paired-split table:\n{r.stdout}")

        no_word = subprocess.run([os.path.join(bundle, "orion-bench-launch"), "--pair-switch",
                                  "1", "--launches", "10", "--pairs", "1"],
                                 env={k: v for k, v in env.items() if k != "ORION_BENCH_SWITCH"},
                                 capture_output=True, text=True, timeout=60)
        check(no_word.returncode != 0 and "ORION_BENCH_SWITCH" in no_word.stderr,
              f"--pair-switch without a switch file: exit {no_word.returncode}, "
              f"{no_word.stderr!r}")

    bad = subprocess.run([sys.executable, ENTRY, "launch-cost", "--bundle", "/nonexistent",
                          "--paired-split", "bypass,no-such-part"], capture_output=True, text=True)
    check(bad.returncode != 0 and "'no-such-part'" in bad.stderr and "no-hp-notes" in bad.stderr,
          f"an unknown --paired-split name must be refused naming the known ones: {bad.stderr!r}")
    print("ok")


if __name__ == "__main__":
    main()
