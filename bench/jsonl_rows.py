"""Reads the benchmarks' JSONL files (one JSON object a line), one way for every script.

  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from jsonl_rows import read_rows
  rows = read_rows(path, "slow_requests")                  # a bad line stops: TOOL: PATH:LINE: why
  rows = read_rows(path, "priority_bench", lenient=True)   # a bad line is left out, with a note
  rows = read_rows(path, "thread_cpu", check=lambda row: None if "threads" in row else "no threads")

Blank lines are skipped. `lenient` is for a run's own results, whose last line is half written
when the run was cut short. `check(row)` returns what is wrong with a parsed row, or None.
"""
import json
import sys


def read_rows(path, tool, lenient=False, check=None):
    try:
        f = open(path)
    except OSError as e:
        sys.exit(f"{tool}: {path}: cannot read ({e.strerror})")
    rows = []
    with f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                problem = None if isinstance(row, dict) else "not a JSON object"
            except json.JSONDecodeError as e:
                problem = f"not JSON ({e.msg})"
            if problem is None and check is not None:
                problem = check(row)
            if problem is None:
                rows.append(row)
            elif lenient:
                print(f"{tool}: {path}:{number}: {problem}; left out", file=sys.stderr)
            else:
                sys.exit(f"{tool}: {path}:{number}: {problem}")
    return rows
