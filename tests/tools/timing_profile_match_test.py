#!/usr/bin/env python3
"""bench/orion_bench.py timing-log --profile on made-up data whose truth is known: a timing log
(the interposer's format, version 2) and a profiler's kernels and launch calls, on clocks
offset by a known amount and with the profiler's first guess of that offset 150 us or 8 ms
off. The matching must find the samples' kernels (grid and block equal, the launch call's end
beside the call's return), recover where each kernel started against the call's return and
how far the anchors placed its end, report the reported duration against the kernel's own,
and follow the window's busy time from the samples to the server's arithmetic."""
import json
import lzma
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(work, kernels, launches, guessed_offset_us, extra=()):
    """timing-log --profile on the log in `work` against these kernels, the profiler's offset
    guessed as given: the matched samples' figures and the window's busy-time estimate."""
    prof = os.path.join(work, "p.kernels.json")
    with open(prof, "w") as f:
        json.dump({"mono_offset_us": guessed_offset_us, "kernels": kernels,
                   "launches": launches}, f)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "orion_bench.py"),
                          "timing-log", "--json", work, "--profile", prof, *extra],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
    match = [r for r in rows if "by_class" in r]
    assert len(match) == 1, rows
    return match[0]["by_class"]["all"], match[0]["estimate"], match[0]["replays"]


def check_split_by_name():
    """--split-by-name: held samples whose kernel's name begins with a prefix and the others,
    each group's elapsed time beyond the profiler's kernel as made (3.0 and 2.5 us), and the
    rows --table renders."""
    rng = random.Random(11)
    work = tempfile.mkdtemp(prefix="timing-split-")
    mono0, torch0 = 7_000_000_000_000, 1_700_000_000_000_000.0
    off = mono0 / 1e3 - torch0
    lines, kernels, launches = ["# orion-timing-log 2 pid=2 held_start_ns=2500\n"], [], []
    t = mono0
    for i in range(1000):
        t += rng.randint(8_000, 30_000)
        gemm = i % 2 == 0
        grid, block = (rng.randint(1, 64), 1, 1), (128 if gemm else 256, 1, 1)
        recorded, returned = t - 3_000, t
        start, dur = returned + 4_000, rng.randint(3_000, 8_000)
        end = start + dur
        launches.append([(returned - 2_500) / 1e3 - off, 2.5, i])
        kernels.append([start / 1e3 - off, dur / 1e3, *grid, *block, i,
                        "nvjet_sm90_tst" if gemm else "void k<float>(float*)"])
        if i % 5 == 0:
            elapsed = dur + (3_000 if gemm else 2_500)  # beyond the kernel: its start latency
            lines.append("sample\t0x%d\t%d\t%d\t%d\t%d\t%d\t0\t0\t%d\t%d,%d,%d\t%d,%d,%d\t0\t1\n" % (
                2 if gemm else 1, elapsed, end - dur, end, returned, elapsed - 2_500, recorded,
                *grid, *block))
    with open(os.path.join(work, "timing.2.log"), "w") as f:
        f.writelines(lines)
    prof = os.path.join(work, "p.kernels.json")
    with open(prof, "w") as f:
        json.dump({"mono_offset_us": off + 150, "kernels": kernels, "launches": launches}, f)
    bench = [sys.executable, os.path.join(ROOT, "bench", "orion_bench.py"), "timing-log"]
    out = subprocess.run(bench + [work, "--profile", prof, "--split-by-name", "nvjet,cudnn",
                                  "--json", "--label", "w2"],
                         capture_output=True, text=True, check=True).stdout
    rows = {r["kernels"]: r for r in map(json.loads, out.splitlines())}
    named, other = rows["nvjet,cudnn"], rows["the others"]
    assert named["samples"] == other["samples"] == 100, rows
    # (the profiler's times are microseconds in floats near 1.7e15: a tenth of a us is their grain)
    assert abs(named["over_ns_median"] - 3_000) < 150 and abs(other["over_ns_median"] - 2_500) < 150, \
        rows
    assert named["reported_over_profiler"] > 1.05 and abs(other["reported_over_profiler"] - 1) < 0.01, \
        rows
    rows_path = os.path.join(work, "split.jsonl")
    with open(rows_path, "w") as f:
        f.write(out)
    table = subprocess.run(bench + ["--table", rows_path], capture_output=True, text=True,
                           check=True).stdout
    assert "| w2 | nvjet,cudnn | 100 |" in table and "| w2 | the others | 100 |" in table, table
    # --held-by-class: the same samples by the interposer's class of the name (nvjet_sm90_*:
    # compute, contract/kernel_class.h; the other: unknown), then all of them against the
    # profiler with 2.5 and 3 us taken off the compute kernels: only 3 us reads them right.
    # (the profile kept as docs/data keeps it: xz-compressed)
    with open(prof, "rb") as f, lzma.open(prof + ".xz", "wb") as xz:
        xz.write(f.read())
    out = subprocess.run(bench + [work, "--profile", prof + ".xz", "--held-by-class", "2500,3000",
                                  "--json", "--label", "w2"],
                         capture_output=True, text=True, check=True).stdout
    rows = list(map(json.loads, out.splitlines()))
    groups = {r["kernels"]: r for r in rows if "kernels" in r}
    assert set(groups) == {"compute", "unknown"} and groups["compute"]["samples"] == 100, rows
    at = {r["held_compute_ns"]: r["reported_over_profiler"] for r in rows if "held_compute_ns" in r}
    assert at[2500] > 1.04 and abs(at[3000] - 1) < 0.01, at
    with open(rows_path, "w") as f:
        f.write(out)
    table = subprocess.run(bench + ["--table", rows_path], capture_output=True, text=True,
                           check=True).stdout
    assert "| w2 | compute | 100 |" in table and "compute kernels' start 3 us" in table, table


def check_compute_column():
    """--check holds a held sample to its class's start latency: a compute kernel's (the log's
    last column) to the header's held_compute_start_ns, the others to held_start_ns; a log
    whose header leaves the compute latency out is held to held_start_ns and breaks the rule."""
    bench = [sys.executable, os.path.join(ROOT, "bench", "orion_bench.py"), "timing-log", "--check"]
    def write(header):
        work = tempfile.mkdtemp(prefix="timing-compute-")
        lines, t = [header], 9_000_000_000
        for i in range(40):
            t += 50_000
            compute = i % 2
            elapsed = 20_000 + (8_000 if compute else 2_500)
            lines.append("sample\t0x%d\t%d\t%d\t%d\t%d\t%d\t0\t0\t%d\t1,1,1\t128,1,1\t0\t1\t%d\n" % (
                1 + compute, elapsed, t + 5_000, t + 5_000 + elapsed, t, 20_000, t - 3_000, compute))
        with open(os.path.join(work, "timing.3.log"), "w") as f:
            f.writelines(lines)
        return subprocess.run(bench + [work], capture_output=True, text=True)
    ok = write("# orion-timing-log 2 pid=3 queued_start_ns=2400 held_start_ns=2500 "
               "held_compute_start_ns=8000\n")
    assert ok.returncode == 0, ok.stderr
    bad = write("# orion-timing-log 2 pid=3 queued_start_ns=2400 held_start_ns=2500\n")
    assert bad.returncode != 0 and "held start latency 2500" in bad.stderr, bad.stderr


def main():
    rng = random.Random(7)
    work = tempfile.mkdtemp(prefix="timing-match-")
    mono0, torch0 = 5_000_000_000_000, 1_700_000_000_000_000.0  # ns, us
    off = mono0 / 1e3 - torch0
    lines, kernels, launches = ["# orion-timing-log 2 pid=1\n"], [], []
    t, sampled = mono0, 0
    for i in range(3000):
        t += rng.randint(8_000, 30_000)
        grid, block = (rng.randint(1, 64), rng.randint(1, 3), 1), (256, 1, 1)
        recorded, returned = t - 3_000, t
        start = returned + 1_500               # the kernel starts 1.5 us after the call's return
        dur = rng.randint(3_000, 8_000)
        end = start + dur
        launches.append([(returned - 2_500) / 1e3 - off, 2.5, i])  # the call ends at our return
        kernels.append([start / 1e3 - off, dur / 1e3, *grid, *block, i, "void k<float>(float*)"])
        if i % 10 == 0:
            sampled += 1
            placed_end = end - 2_000            # the anchors place the end 2 us early
            elapsed = end - (recorded + 500)
            reported = dur                       # what a right duration rule reports
            lines.append("sample\t0x1\t%d\t%d\t%d\t%d\t%d\t1\t0\t%d\t%d,%d,%d\t%d,%d,%d\n" % (
                elapsed, recorded + 500 - 2_000, placed_end, returned, reported, recorded,
                *grid, *block))
    with open(os.path.join(work, "timing.1.log"), "w") as f:
        f.writelines(lines)
    # The profiler's first guess 150 us off, and 8 ms off (a service's profiler steps that
    # begin before their requests arrive): both must be found.
    for guess_us in (150, 8_000):
        every, estimate, _ = run(work, kernels, launches, off + guess_us)
        assert every["samples"] >= 0.97 * sampled, (guess_us, every["samples"], sampled)
    # The window's busy time: every sample reports its kernel's own time, so the samples'
    # step reads 1, all of the profiler's time is covered, and drawing the untimed launches
    # at the samples' means times the client's pace lands near the truth.
    assert estimate["covered"] == 1.0, estimate
    assert abs(estimate["per_sample"] - 1.0) < 0.01, estimate
    assert abs(estimate["server"] - 1.0) < 0.1 and abs(estimate["server_by_shape"] - 1.0) < 0.1, \
        estimate
    # Replayed with the server's own estimator (the mean times the client's pace over 32
    # samples) the arithmetic is the server's; the old recent mean (weight 4) and the plain mean
    # of all samples are other draws, near the truth too.
    _, _, replays = run(work, kernels, launches, off + 150, ("--replay-weights", "p32,4,0"))
    assert replays["p32"]["server"] == estimate["server"], (replays, estimate)
    for other in ("4", "0"):
        assert abs(replays[other]["server"] - 1.0) < 0.1, replays
    assert replays["4"]["server"] != estimate["server"], replays
    # --replay-out keeps a row per window and weight, which --table renders a window a line.
    rows_path = os.path.join(work, "replays.jsonl")
    run(work, kernels, launches, off + 150,
        ("--replay-weights", "4,0,p32", "--replay-out", rows_path, "--label", "w1"))
    kept = [json.loads(l) for l in open(rows_path)]
    assert [(r["window"], r["weight"]) for r in kept] == [("w1", 4), ("w1", 0), ("w1", "p32")], \
        kept
    assert kept[2]["server"] == estimate["server"], (kept, estimate)
    table = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "orion_bench.py"),
                            "timing-log", "--table", rows_path],
                           capture_output=True, text=True, check=True).stdout
    assert ("| weight 4 (server until 2026-11-26) | mean of all before | "
            "mean x client's pace over 32 (server) |") in table and "| w1 | " in table, table
    # A pace over no samples is refused with a message.
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "orion_bench.py"),
                          "timing-log", work, "--replay-weights", "p0"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "p<N>" in bad.stderr, bad.stderr
    assert every["samples"] >= 0.97 * sampled, (every["samples"], sampled)
    assert abs(every["reported_over_profiler"] - 1.0) < 0.01, every
    assert abs(every["kernel_start_after_return_us_median"] - 1.5) < 0.3, every
    assert abs(every["placed_end_minus_profiler_end_us_median"] + 2.0) < 0.3, every
    check_split_by_name()
    check_compute_column()
    print(f"matched {every['samples']} of {sampled} samples; start after return "
          f"{every['kernel_start_after_return_us_median']:.2f} us, placed end "
          f"{every['placed_end_minus_profiler_end_us_median']:.2f} us")


if __name__ == "__main__":
    main()
