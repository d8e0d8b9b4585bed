#!/usr/bin/env python3
"""bench/orion_bench.py as one tool: --help lists every module of bench/experiments/ with what
it answers; an experiment that does not exist exits 2 naming it and the ones that do; a JSONL
row that does not parse stops with its file and line and the command to run once it is mended;
a generated table out of date fails with its file and the command that renders it again."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENTRY = os.path.join(ROOT, "bench", "orion_bench.py")


def run(*argv):
    return subprocess.run([sys.executable, ENTRY, *argv], capture_output=True, text=True)


def check(ok, msg):
    if not ok:
        print("FAIL:", msg)
        sys.exit(1)


def main():
    modules = sorted(f[:-3].replace("_", "-") for f in os.listdir(os.path.join(ROOT, "bench",
                                                                              "experiments"))
                     if f.endswith(".py") and not f.startswith("_"))
    check(len(modules) >= 5, f"too few experiment modules: {modules}")
    h = run("--help")
    check(h.returncode == 0, f"--help exit {h.returncode}: {h.stderr}")
    listed = {}
    for line in h.stdout.split("experiments:", 1)[-1].splitlines():
        words = line.split(None, 1)
        if len(words) == 2:
            listed[words[0]] = words[1]
    check(sorted(listed) == modules, f"--help lists {sorted(listed)}, the modules are {modules}")
    for name in modules:
        check(len(listed[name]) > 20, f"{name}: no line on what it answers: {listed[name]!r}")
        r = run(name, "--help")
        check(r.returncode == 0 and "usage:" in r.stdout, f"{name} --help: {r.stderr}")

    bad = run("no-such-experiment", "--table", "x.jsonl")
    check(bad.returncode == 2, f"an unknown experiment exits {bad.returncode}, not 2")
    check("'no-such-experiment'" in bad.stderr and all(m in bad.stderr for m in modules)
          and "orion_bench.py --help" in bad.stderr,
          f"the message must name the experiment and the valid ones: {bad.stderr!r}")

    work = tempfile.mkdtemp(prefix="orion-bench-cli-")
    try:
        rows = os.path.join(work, "rows.jsonl")
        with open(rows, "w") as f:
            f.write('{"threads": [], "wall_s": 1}\n{"threads": [\n')
        r = run("thread-cpu", "--table", rows)
        check(r.returncode != 0 and f"{rows}:2:" in r.stderr
              and f"python3 bench/orion_bench.py thread-cpu --table {rows}" in r.stderr,
              f"a bad row must name file, line and what to run: {r.stderr!r}")

        # A generated table out of date: the lazy-poll rows of thread-cpu, one figure changed.
        data = os.path.join(ROOT, "docs", "data")
        source = next((os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs
                       if f.endswith(".jsonl") and "thread-cpu" in f), None)
        check(source is not None, "docs/data holds no thread-cpu JSONL to render")
        rel = os.path.relpath(source, ROOT)
        marker = f"<!-- generated: python3 bench/orion_bench.py thread-cpu --table {rel} -->"
        good = run("thread-cpu", "--table", source).stdout.strip("\n")
        doc = os.path.join(work, "doc.md")
        with open(doc, "w") as f:
            f.write(f"# t\n\n{marker}\n{good}\n<!-- end generated -->\n")
        r = run("tables", "--check", doc)
        check(r.returncode == 0, f"a table equal to its data fails: {r.stdout}{r.stderr}")
        with open(doc, "w") as f:
            f.write(f"# t\n\n{marker}\n{good.replace('|', '| 1', 3)}\n<!-- end generated -->\n")
        r = run("tables", "--check", doc)
        check(r.returncode == 1 and f"{os.path.relpath(doc, ROOT)}:3" in r.stderr
              and "python3 bench/orion_bench.py tables" in r.stderr,
              f"a stale table must fail naming the file and the command: {r.stderr!r}")
        with open(doc, "w") as f:
            f.write("<!-- generated: python3 bench/orion_bench.py no-such --table "
                    "docs/data/none.jsonl -->\n|x|\n<!-- end generated -->\n")
        r = run("tables", "--check", doc)
        check(r.returncode != 0 and "docs/data/none.jsonl does not exist" in r.stderr,
              f"a marker without data must say so: {r.stderr!r}")

        # Several runs of one A/B in one marker: cpu-tax pools their rounds, and a missing one
        # is named.
        run_rows = next((os.path.join(d, f) for d, _, fs in os.walk(data) for f in fs
                         if f.startswith("in-process-h100-this-tree-against-bypass")), None)
        check(run_rows is not None, "docs/data holds no cpu-tax run to pool")
        one = os.path.relpath(run_rows, ROOT)
        rounds = len({json.loads(l)["round"] for l in open(run_rows) if l.strip()})
        pooled = run("cpu-tax", "--table", run_rows, run_rows).stdout.strip("\n")
        check(f"{2 * rounds} rounds" in pooled, f"two runs of {rounds} rounds: {pooled[:300]!r}")
        with open(doc, "w") as f:
            f.write(f"<!-- generated: python3 bench/orion_bench.py cpu-tax --table {one} {one} -->"
                    f"\n{pooled}\n<!-- end generated -->\n")
        r = run("tables", "--check", doc)
        check(r.returncode == 0, f"a pooled table equal to its data fails: {r.stdout}{r.stderr}")
        with open(doc, "w") as f:
            f.write(f"<!-- generated: python3 bench/orion_bench.py cpu-tax --table {one} "
                    f"docs/data/none.jsonl -->\n{pooled}\n<!-- end generated -->\n")
        r = run("tables", "--check", doc)
        check(r.returncode != 0 and "docs/data/none.jsonl does not exist" in r.stderr,
              f"a pooled marker with a missing run must say so: {r.stderr!r}")
    finally:
        shutil.rmtree(work)
    print(f"ok: {len(modules)} experiments listed; unknown experiment, bad row, stale table, "
          "pooled runs")


if __name__ == "__main__":
    main()
