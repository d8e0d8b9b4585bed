#!/usr/bin/env python3
"""bench/orion_bench.py ring-handoff with BUILD's orion-bench-ring (CPU only): two rounds write
three arms each (no push, push, push with the next entry prefetched), nothing is dropped though
the pushes go round the ring (the reader keeps up), a push with its locked instruction costs
more at the median than the locked instruction alone, --table renders the rounds of two files
side by side, and malformed options and a CPU that cannot be used are refused with what to give
instead. Skipped (exit 77) on a CPU without PREFETCHW.
  ring_handoff_test.py BUILD"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "orion_bench.py")
ARMS = {"no push", "push", "push, next entry prefetched"}


def check(cond, message):
    if not cond:
        sys.exit(f"FAIL: {message}")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, "ring-handoff", *args],
                          capture_output=True, text=True)


def main():
    build = os.path.abspath(sys.argv[1])
    binary = os.path.join(build, "bench", "orion-bench-ring")
    probe = subprocess.run([binary, "--pushes", "768", "--gap-us", "0"], capture_output=True,
                           text=True)
    if probe.returncode == 77:
        print(f"SKIP: {probe.stderr.strip()}")
        sys.exit(77)
    cpus = sorted(os.sched_getaffinity(0))
    producer, reader = cpus[0], cpus[-1]
    with tempfile.TemporaryDirectory() as tmp:
        tables = []
        for label in ("first", "second"):
            out = os.path.join(tmp, f"{label}.jsonl")
            r = run("--build", build, "--rounds", "2", "--pushes", "6000",
                    "--producer-cpu", str(producer), "--consumer-cpus", str(reader),
                    "--label", label, "--out", out)
            check(r.returncode == 0, f"ring-handoff exit {r.returncode}: {r.stderr}")
            rows = [json.loads(line) for line in open(out)]
            check(len(rows) == 6, f"6 rows (2 rounds x 3 arms), got {len(rows)}")
            for rnd in (1, 2):
                arms = {row["arm"]: row for row in rows if row["round"] == rnd}
                check(set(arms) == ARMS, f"round {rnd}: arms {sorted(arms)}")
                check(arms["no push"]["mean_over_no_push_ns"] == 0.0, "no push is the zero")
                check(arms["push"]["p50_ns"] > arms["no push"]["p50_ns"],
                      f"round {rnd}: a push's median {arms['push']['p50_ns']} ns is not above "
                      f"the locked instruction's alone ({arms['no push']['p50_ns']} ns)")
                check(all(row["dropped"] == 0 for row in arms.values()), "events dropped")
            tables.append(out)
        r = run("--table", *tables)
        check(r.returncode == 0, f"--table exit {r.returncode}: {r.stderr}")
        body = [line for line in r.stdout.splitlines() if line.startswith("| first")
                or line.startswith("| second")]
        check(len(body) == 2, f"one table row per file's reader CPU:\n{r.stdout}")
        r = run("--build", build, "--consumer-cpus", "one,two")
        check(r.returncode != 0 and "CPUs separated by commas" in r.stderr,
              f"a malformed --consumer-cpus is refused: {r.stderr}")
        r = subprocess.run([binary, "--gap-us", "-1"], capture_output=True, text=True)
        check(r.returncode == 2 and "--gap-us" in r.stderr, f"a negative gap: {r.stderr}")
        r = subprocess.run([binary, "--consumer-cpu", "100000"], capture_output=True, text=True)
        check(r.returncode == 2 and "--consumer-cpu" in r.stderr, f"an unusable CPU: {r.stderr}")
    print("ring-handoff: OK")


if __name__ == "__main__":
    main()
