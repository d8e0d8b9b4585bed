#!/usr/bin/env python3
"""bench/orion_bench.py as one tool: --help lists every module of bench/experiments/, then every
one of bench/diagnostics/ apart, each with what it answers, and each runs by its name (a diagnostic
also as `diagnostics NAME`); an experiment that does not exist exits 2 naming it and the ones that do; a JSONL
row that does not parse stops with its file and line and the command to run once it is mended;
a generated table out of date fails with its file and the command that renders it again."""
import json
import os
import re
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


def folder_modules(folder):
    return sorted(f[:-3].replace("_", "-") for f in os.listdir(os.path.join(ROOT, "bench", folder))
                  if f.endswith(".py") and not f.startswith("_"))


def listed_under(text, heading):
    """{name: answers} of the lines under `heading:` up to the next blank line."""
    listed = {}
    for line in text.split(f"\n{heading}:\n", 1)[-1].split("\n\n", 1)[0].splitlines():
        words = line.split(None, 1)
        if len(words) == 2:
            listed[words[0]] = words[1]
    return listed


def main():
    user = folder_modules("experiments")
    diagnostics = folder_modules("diagnostics")
    modules = sorted(user + diagnostics)
    check(len(user) >= 5, f"too few experiment modules: {user}")
    h = run("--help")
    check(h.returncode == 0, f"--help exit {h.returncode}: {h.stderr}")
    check(h.stdout.find("\nexperiments:\n") < h.stdout.find("\ndiagnostics:\n"),
          f"--help lists the experiments first, the diagnostics apart: {h.stdout!r}")
    for heading, names in (("experiments", user), ("diagnostics", diagnostics)):
        listed = listed_under(h.stdout, heading)
        check(sorted(listed) == names, f"--help lists {sorted(listed)} under {heading}, the "
                                       f"modules are {names}")
        for name in names:
            check(len(listed[name]) > 20, f"{name}: no line on what it answers: {listed[name]!r}")
            r = run(name, "--help")
            check(r.returncode == 0 and "usage:" in r.stdout, f"{name} --help: {r.stderr}")
    for name in diagnostics[:1]:
        r = run("diagnostics", name, "--help")
        check(r.returncode == 0 and "usage:" in r.stdout, f"diagnostics {name} --help: {r.stderr}")

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

        # A generated table out of date: the first table of docs/benchmarks.md rendered from one
        # file with no options, one figure changed.
        with open(os.path.join(ROOT, "docs", "benchmarks.md")) as f:
            markers = re.findall(r"<!-- generated: python3 bench/orion_bench\.py ([a-z-]+) "
                                 r"--table ((?:docs/data/\S+ ?)+?)( --[^>]*)? -->", f.read())
        first = next(((e, d.split()) for e, d, o in markers if len(d.split()) == 1 and not o),
                     None)
        check(first is not None, "docs/benchmarks.md has no table rendered from one file")
        experiment, (rel,) = first
        source = os.path.join(ROOT, rel)
        marker = f"<!-- generated: python3 bench/orion_bench.py {experiment} --table {rel} -->"
        good = run(experiment, "--table", source).stdout.strip("\n")
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
        one = next((d.split()[0] for e, d, o in markers if e == "cpu-tax"), None)
        check(one is not None, "docs/benchmarks.md has no cpu-tax table to pool")
        run_rows = os.path.join(ROOT, one)
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
