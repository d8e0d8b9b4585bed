#!/usr/bin/env python3
"""bench/orion_bench.py timeline --starts without a GPU: kept same-start runs read back from their
folders (the service's result line, each trainer's most releases over snapshots.txt, or in
metrics.txt, never the service's; the arm named by an `arm` file or the folder; the run's path
from the repository's root), one JSONL row each, and --table (over one file or several)
grouping them by arm with each run's releases and p99 and the medians; a folder without the
service's result line is refused with its name."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "orion_bench.py")


def check(cond, what):
    if not cond:
        sys.exit(f"timeline_starts_test: {what}")


def release(client, n, priority="best-effort"):
    return (f'orion_client_gpu_hold_releases_total{{node="vm",gpu="0",priority="{priority}",'
            f'client="{client}"}} {n}\n')


def run_folder(base, name, p99, releases, arm=None, metrics=False, gone=0):
    """A kept run; `gone`: the releases of a third trainer seen only in an earlier snapshot."""
    folder = os.path.join(base, name)
    os.makedirs(folder)
    with open(os.path.join(folder, "log.txt"), "w") as f:
        f.write("orion-server: client 1 registered\n[service] serving\n"
                f"[service] result requests=1000 rate=531.0 graph=1 p50_ms=2.0 p99_ms={p99} "
                f"p999_ms={p99 * 2} mean_ms=3.0\n")
    if arm:
        with open(os.path.join(folder, "arm"), "w") as f:
            f.write(arm + "\n")
    counts = "".join(release(c, n) for c, n in enumerate(releases or [], 1))
    counts += release(9, 99, "high")
    if metrics:
        with open(os.path.join(folder, "metrics.txt"), "w") as f:
            f.write(counts)
    elif releases is not None:
        with open(os.path.join(folder, "snapshots.txt"), "w") as f:
            # an earlier snapshot with fewer releases, and a trainer missing from the last one:
            # each trainer's most counts
            f.write("== t=10.0\n" + "".join(release(c, 0) for c in (1, 2)) + release(3, gone) +
                    "== t=20.0\n" + counts)
    return folder


with tempfile.TemporaryDirectory() as tmp:
    folders = [run_folder(tmp, "a1", 200.0, [3, 3], arm="bound 500 ms", gone=4),
               run_folder(tmp, "a2", 100.0, [1, 2], arm="bound 500 ms", metrics=True),
               run_folder(tmp, "b1", 20.0, [1, 1], arm="bound 100 ms"),
               run_folder(tmp, "b2", 30.0, [], arm="bound 100 ms")]
    out = subprocess.run([sys.executable, SCRIPT, "timeline", "--starts", *folders],
                         capture_output=True, text=True)
    check(out.returncode == 0, f"--starts failed: {out.stderr}")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    check(len(rows) == 4, f"one row a folder: {out.stdout}")
    check(rows[0]["arm"] == "bound 500 ms" and rows[0]["releases"] == 4,
          f"each trainer's most (one seen only in an earlier snapshot), the high-priority "
          f"client's left out: {rows[0]}")
    check(rows[1]["releases"] == 2, f"metrics.txt read: {rows[1]}")
    check(rows[3]["releases"] == 0, f"no trainer's count in the last snapshot: {rows[3]}")
    check(rows[0]["run"] == os.path.relpath(folders[0], ROOT), f"the run, from the root: {rows[0]}")
    check(rows[0]["p99_ms"] == 200.0 and rows[0]["p999_ms"] == 400.0 and
          rows[0]["requests"] == 1000, f"the result line's figures: {rows[0]}")
    path = os.path.join(tmp, "runs.jsonl")
    with open(path, "w") as f:
        f.write(out.stdout)
    table = subprocess.run([sys.executable, SCRIPT, "timeline", "--table", path],
                           capture_output=True, text=True)
    check(table.returncode == 0, f"--table failed: {table.stderr}")
    lines = table.stdout.splitlines()
    check(lines[2] == "| bound 500 ms | 2 | 4, 2 | 200, 100 ms | 2.0, 150.0, 300.0 ms |",
          f"the 500 ms arm: {table.stdout}")
    check(lines[3] == "| bound 100 ms | 2 | 1, 0 | 20, 30 ms | 2.0, 25.0, 50.0 ms |",
          f"the 100 ms arm: {table.stdout}")
    # Runs kept in two files are pooled by arm, in the files' order.
    later = subprocess.run([sys.executable, SCRIPT, "timeline", "--starts",
                            run_folder(tmp, "b3", 10.0, [2, 0], arm="bound 100 ms")],
                           capture_output=True, text=True)
    path2 = os.path.join(tmp, "runs2.jsonl")
    with open(path2, "w") as f:
        f.write(later.stdout)
    pooled = subprocess.run([sys.executable, SCRIPT, "timeline", "--table", path, path2],
                            capture_output=True, text=True)
    check(pooled.returncode == 0, f"--table over two files failed: {pooled.stderr}")
    check(pooled.stdout.splitlines()[3] ==
          "| bound 100 ms | 3 | 1, 0, 2 | 20, 30, 10 ms | 2.0, 20.0, 40.0 ms |",
          f"the 100 ms arm over two files: {pooled.stdout}")
    # No arm file: the folder's name is the arm; a folder without the result line is refused.
    bare = os.path.join(tmp, "bare")
    os.makedirs(bare)
    with open(os.path.join(bare, "log.txt"), "w") as f:
        f.write("[service] serving\n")
    named = run_folder(tmp, "named-run", 10.0, None)
    out = subprocess.run([sys.executable, SCRIPT, "timeline", "--starts", named],
                         capture_output=True, text=True)
    check(json.loads(out.stdout)["releases"] is None, f"no count kept: {out.stdout}")
    out = subprocess.run([sys.executable, SCRIPT, "timeline", "--starts", named],
                         capture_output=True, text=True)
    check(json.loads(out.stdout)["arm"] == "named-run", f"the folder as the arm: {out.stdout}")
    out = subprocess.run([sys.executable, SCRIPT, "timeline", "--starts", named, bare],
                         capture_output=True, text=True)
    check(out.returncode != 0 and "bare: no '[service] result' line in log.txt" in out.stderr,
          f"a folder without a result line: {out.returncode} {out.stderr}")
print("timeline_starts_test: ok")
