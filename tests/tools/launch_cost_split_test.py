#!/usr/bin/env python3
"""launch-cost's tables of one invocation's rows: with --split arms, each part's cost is the
high-priority arm less that arm in the same run (median over runs, the runs paired, not the
medians subtracted); with --baseline-interposer, this build less the baseline alike. An unknown
--split name exits naming the known ones, before any GPU work.

With BUILD (launch_cost_split_test.py --paired BUILD): launch-cost --paired-split end to end on
the CUDA test double (no GPU): per switch, orion-bench-launch pairs the interposer with itself
inside one process, setting the benchmark switch for every other group (--pair-switch). A bundle
of this build's orion-server, orion-run, orion-bench-launch and interposer, with the test double
as libcuda, runs the as-usual (A/A), bypass and no-notes switches; checked: the rows carry each
switch, the table lists the parts, the bypass part (the whole path past the hook's entry) reads
above the noise of one run (the switch reached the interposer) and above the A/A control;
orion-bench-launch refuses --pair-switch without ORION_BENCH_SWITCH, and launch-cost refuses an
unknown --paired-split name before any work. The same run measures each paired figure twice in
a row (--segments 2), has each process time its loads (--memory-latency) and adds the arms
beside a memory-streaming neighbor on another core (--neighbor): checked, every paired row
carries its segment and its loads, and each neighbor arm what its neighbor streamed. Without
BUILD also: the neighbor's arms less their alone arms, paired by run, --by-driver-time pooling
two files by the process's own driver launch, and --segments' table of how far a process moves
within its life against between processes."""
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


def paired(run, arm, adds, **extra):
    return {"run": run, "arm": arm, "variant": "paired", "cpus": "2", "adds_ns": adds,
            "driver_ns": 4000.0, "ci_low": adds - 30, "ci_high": adds + 30, "pairs": 300,
            "pollute_kb": 0, "kernels": 128, **extra}


def main():
    rows = []
    # Run 2's host is 100 ns slower on every interposed arm: paired by run, the parts do not move.
    for run, drift in ((1, 0), (2, 100), (3, 0)):
        rows += [paired(run, "no interposer", 5),
                 paired(run, "high priority", 200 + drift),
                 paired(run, "best effort", 190 + drift),
                 paired(run, "high priority, baseline", 230 + drift),
                 paired(run, "high priority, launches cut short after the registration",
                        60 + drift, switch="after-registration"),
                 paired(run, "high priority, no clock read (the thread's first reading kept)",
                        150 + drift + run, switch="no-clock"),
                 # Beside the neighbor: no interposer 10 more, high priority 40 + run more.
                 paired(run, "no interposer, beside a memory-streaming neighbor", 15,
                        neighbor="4,5", neighbor_gb_per_s=40.0 + run),
                 paired(run, "high priority, beside a memory-streaming neighbor",
                        240 + drift + run, neighbor="4,5", neighbor_gb_per_s=41.0)]
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "rows.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        r = subprocess.run([sys.executable, ENTRY, "launch-cost", "--table", path],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"--table exit {r.returncode}: {r.stderr}")
        lines = r.stdout.splitlines()

        def row(first, heading):
            block = r.stdout.split(heading, 1)
            check(len(block) == 2, f"no table headed {heading!r}:\n{r.stdout}")
            hit = [l for l in block[1].splitlines() if l.startswith(f"| {first} |")]
            check(hit, f"no row {first!r} under {heading!r}:\n{r.stdout}")
            return hit[0]

        split = "high priority less this arm, same run"
        check("140 ns [140, 140]" in row("launches cut short after the registration", split),
              f"after the registration: 200 - 60 in every run:\n{r.stdout}")
        check("48 ns [47, 49]" in row("no clock read (the thread's first reading kept)", split),
              f"the clock: 50 less the run's number, median 48:\n{r.stdout}")
        check("-30 ns [-30, -30]" in row("high priority", "this build less the baseline"),
              f"against the baseline: 200 - 230 in every run:\n{r.stdout}")
        check(any(l.startswith("| high priority, no clock read") for l in lines),
              f"the split arms' own additions are listed:\n{r.stdout}")
        beside = "beside the neighbor less alone, same run"
        check("42 ns [41, 43]" in row("high priority, beside a memory-streaming neighbor",
                                      beside),
              f"beside the neighbor, paired by run: 40 + the run's number:\n{r.stdout}")
        check("10 ns [10, 10]" in row("no interposer, beside a memory-streaming neighbor",
                                      beside),
              f"the no-interposer arm beside the neighbor: 15 - 5:\n{r.stdout}")
        check("The neighbor streamed 41.0 GB/s [41.0, 43.0]" in r.stdout,
              f"the neighbor's rate over its arms' processes:\n{r.stdout}")

        # --by-driver-time: two hosts' rows pooled by the process's own driver launch.
        hosts = []
        for host, arms in enumerate(([("high priority", 3100, 80), ("high priority", 3150, 60),
                                      ("no interposer", 3100, 4)],
                                     [("high priority", 3900, 220), ("high priority", 3100, 70),
                                      ("best effort", 4500, 250)])):
            hosts.append(os.path.join(work, f"host{host}.jsonl"))
            with open(hosts[-1], "w") as f:
                f.writelines(json.dumps(dict(paired(1, arm, adds), driver_ns=float(ns))) + "\n"
                             for arm, ns, adds in arms)
        r = subprocess.run([sys.executable, ENTRY, "launch-cost", "--table", *hosts,
                            "--by-driver-time"], capture_output=True, text=True)
        check(r.returncode == 0, f"--by-driver-time exit {r.returncode}: {r.stderr}")
        check("| high priority | warm, 128 kernels in turn | under 3.2 us | 3 | 2 | "
              "70 ns [60, 80] | 2.3% |" in r.stdout,
              f"three fast high-priority processes of two hosts:\n{r.stdout}")
        check("| high priority | warm, 128 kernels in turn | 3.8 to 4.0 us | 1 | 1 | "
              "220 ns [220, 220] | 5.6% |" in r.stdout, f"one slow one:\n{r.stdout}")
        check("| best effort | warm, 128 kernels in turn | 4.0 us or more | 1 | 1 |" in r.stdout,
              f"the open last bin:\n{r.stdout}")
        # --segments: two processes of high priority, three segments each; the first moves
        # 100 ns over its life with its driver launch, the second stays put 50 ns higher.
        seg = os.path.join(work, "segments.jsonl")
        with open(seg, "w") as f:
            for run, lives in ((1, ((3500, 100), (3550, 150), (3600, 200))),
                               (2, ((3600, 150), (3600, 150), (3600, 150)))):
                for i, (ns, adds) in enumerate(lives, 1):
                    f.write(json.dumps(dict(paired(run, "high priority", adds), driver_ns=float(ns),
                                            segment=i)) + "\n")
        r = subprocess.run([sys.executable, ENTRY, "launch-cost", "--table", seg],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"--segments table exit {r.returncode}: {r.stderr}")
        # Within: the middle half of each life (100 and 0 ns), median 50; between: the lives'
        # medians; the second life's adds never move, so only the first has a correlation.
        check("| high priority | 2 | 3 | 50 ns | 50 ns [3550, 3600] | 50 ns | 0 ns [150, 150] | "
              "1.00 [1.00, 1.00] |" in r.stdout, f"segments:\n{r.stdout}")
        check("| 125 ns [100, 150] |" in r.stdout,
              f"the other tables take each process's first segment:\n{r.stdout}")
        two = subprocess.run([sys.executable, ENTRY, "launch-cost", "--table", *hosts],
                             capture_output=True, text=True)
        check(two.returncode != 0 and "--by-driver-time" in two.stderr,
              f"two files without --by-driver-time must be refused: {two.stderr!r}")

    for option, value, said in (("--segments", "0", "expected 1 to 10000"),
                                ("--memory-latency", "99999", "expected 0 to 16384 MB"),
                                ("--neighbor", "2", "not the arms'")):
        refused = subprocess.run([sys.executable, ENTRY, "launch-cost", "--bundle", "/nonexistent",
                                  "--cpus", "2-3", option, value], capture_output=True, text=True)
        check(refused.returncode != 0 and said in refused.stderr,
              f"{option} {value} must be refused before any work: {refused.stderr!r}")

    bad = subprocess.run([sys.executable, ENTRY, "launch-cost", "--bundle", "/nonexistent",
                          "--split", "after-registration,no-such-part"],
                         capture_output=True, text=True)
    check(bad.returncode != 0 and "'no-such-part'" in bad.stderr and "after-registration"
          in bad.stderr and "no-clock" in bad.stderr,
          f"an unknown --split name must be refused naming the known ones: {bad.stderr!r}")
    print("ok")



def check_paired_split(build):
    """--paired-split end to end on the CUDA test double (see the module's docstring)."""
    build = os.path.abspath(build)
    double = os.path.join(build, "tests", "cuda_double", "lib")
    cores = sorted(os.sched_getaffinity(0))
    cpu = str(cores[0])
    neighbor = str(cores[-1] if len(cores) > 1 else cores[0] + 1)  # one core: refused below
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
             "--paired-split", "as-usual,bypass,no-hp-notes", "--memory-latency", "8",
             "--neighbor", neighbor, "--neighbor-mb", "8", "--segments", "2", "--out", out],
            env=env, capture_output=True, text=True, timeout=240)
        if len(cores) == 1:
            check(r.returncode != 0, "a neighbor on a core this test may not use must fail")
            print("only one core here: the neighbor's arms are not run")
            return
        check(r.returncode == 0, f"launch-cost exit {r.returncode}:\n{r.stdout}\n{r.stderr}")
        with open(os.path.join(out, "launch-cost.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        # --memory-latency: every paired row carries its process's loads; --neighbor: three
        # arms more, each with what its neighbor streamed.
        for row in (row for row in rows if row["variant"] == "paired"):
            check(all(row.get(f"memory_{k}_ns", 0) > 0 for k in ("l2_before", "l2", "far")),
                  f"a paired row without its process's loads: {row}")
        beside = [row for row in rows if row["variant"] == "paired" and "neighbor" in row
                  and row.get("segment") == 1]
        check(len(beside) == 3 and all(row["neighbor_gb_per_s"] > 0 for row in beside)
              and all(row["neighbor"] == neighbor for row in beside),
              f"the neighbor's arms: {beside}")
        check("beside the neighbor less alone" in r.stdout, f"no neighbor table:\n{r.stdout}")
        # --segments 2: every process's paired figure twice, numbered.
        segments = {}
        for row in (row for row in rows if row["variant"] == "paired"):
            segments.setdefault(row["arm"], []).append(row.get("segment"))
        check(all(s == [1, 2] for s in segments.values()), f"segments by arm: {segments}")
        check("moves within a process" in r.stdout, f"no segments table:\n{r.stdout}")
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

if __name__ == "__main__":
    if sys.argv[1:2] == ["--paired"]:
        check_paired_split(sys.argv[2])
        print("ok")
    else:
        main()
