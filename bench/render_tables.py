#!/usr/bin/env python3
"""Keeps the result tables of the docs generated from their data, never edited by hand.

  bench/render_tables.py [--check] [FILE.md ...]      (default: README.md docs/results.md)

A table in a Markdown file is generated when it stands between

  <!-- generated: python3 bench/SCRIPT.py --table docs/data/ROUND/FILE.jsonl -->
  ...
  <!-- end generated -->

This script runs each such command on a copy of the data file (the benchmarks' --table also
writes a results.md beside its input) and puts its output between the markers. With --check it
changes nothing and exits 1, printing a diff, where a table differs from what its data renders
(CI runs it so). Only `python3 bench/*.py --table docs/data/...` commands are run.
"""
import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"(<!-- generated: (?P<cmd>[^\n]*?) -->\n)(?P<body>.*?)(<!-- end generated -->)",
                   re.S)
COMMAND = re.compile(r"^python3 (?P<script>bench/[a-z_]+\.py) --table (?P<data>docs/data/[\w./-]+)$")


def render(command, where):
    m = COMMAND.match(command)
    if not m:
        sys.exit(f"render_tables: {where}: '{command}' is not 'python3 bench/SCRIPT.py --table "
                 f"docs/data/FILE'")
    data = os.path.join(ROOT, m["data"])
    if not os.path.isfile(data):
        sys.exit(f"render_tables: {where}: {m['data']} does not exist")
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, os.path.basename(data))
        shutil.copyfile(data, copy)
        out = subprocess.run([sys.executable, os.path.join(ROOT, m["script"]), "--table", copy],
                             capture_output=True, text=True, cwd=tmp)
    if out.returncode != 0:
        sys.exit(f"render_tables: {where}: '{command}' failed:\n{out.stderr}")
    return out.stdout.strip("\n") + "\n"


def process(path, check):
    with open(path) as f:
        text = f.read()
    blocks = 0

    def replace(m):
        nonlocal blocks
        blocks += 1
        line = text.count("\n", 0, m.start()) + 1
        return m.group(1) + render(m["cmd"], f"{os.path.relpath(path, ROOT)}:{line}") + m.group(4)

    new = BLOCK.sub(replace, text)
    if new == text:
        return blocks, True
    if check:
        rel = os.path.relpath(path, ROOT)
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                   rel, rel + " (from its data)"))
        return blocks, False
    with open(path, "w") as f:
        f.write(new)
    return blocks, True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 where a table differs from its data")
    p.add_argument("files", nargs="*",
                   default=[os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs/results.md")])
    args = p.parse_args()
    ok = True
    total = 0
    for path in args.files:
        blocks, same = process(path, args.check)
        total += blocks
        ok = ok and same
    verb = "checked" if args.check else "rendered"
    print(f"render_tables: {total} generated tables {verb} in {len(args.files)} files"
          + ("" if ok else "; some differ from their data (run bench/render_tables.py)"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
