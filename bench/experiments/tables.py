"""Keeps the result tables of the docs generated from their data, never edited by hand.

  orion_bench.py tables [--check] [FILE.md ...]      (default: docs/benchmarks.md README.md)

A table in a Markdown file is generated when it stands between

  <!-- generated: python3 bench/orion_bench.py EXPERIMENT --table docs/data/FILE.jsonl[.gz] -->
  ...
  <!-- end generated -->

This runs each such command on a copy of the data file (an experiment's --table may also write
a results.md beside its input) and puts its output between the markers. With --check it changes
nothing and exits 1 where a table differs from what its data renders, printing the diff, the
file and the command that renders it again (CTest ResultTablesMatchTheirData runs it so). Only
`python3 bench/orion_bench.py EXPERIMENT --table docs/data/...` commands are run.
"""
import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile

import harness

ANSWERS = ("keeps the docs' result tables equal to what their JSONL in docs/data renders; "
           "--check fails on a table edited by hand or out of date")

BLOCK = re.compile(r"(<!-- generated: (?P<cmd>[^\n]*?) -->\n)(?P<body>.*?)(<!-- end generated -->)",
                   re.S)
COMMAND = re.compile(r"^python3 bench/orion_bench\.py (?P<experiment>[a-z][a-z-]*) "
                     r"--table (?P<data>docs/data/[\w./-]+\.jsonl(?:\.gz)?"
                     r"( docs/data/[\w./-]+\.jsonl(?:\.gz)?)*)"
                     r"(?P<options>( --[a-z][a-z-]*( [\w.,=+-]+)?)*)$")  # + : a trainer group
DEFAULT = ("docs/benchmarks.md", "README.md")


def render(command, where):
    m = COMMAND.match(command)
    if not m:
        sys.exit(f"tables: {where}: '{command}' is not 'python3 bench/orion_bench.py EXPERIMENT "
                 f"--table docs/data/FILE.jsonl[.gz] [--OPTION [VALUE]]...'; mend the marker, then run: "
                 f"python3 bench/orion_bench.py tables")
    names = m["data"].split()  # several runs of one A/B where the experiment pools them
    for name in names:
        if not os.path.isfile(os.path.join(harness.ROOT, name)):
            sys.exit(f"tables: {where}: {name} does not exist; restore it or point the marker at "
                     f"the table's data, then run: python3 bench/orion_bench.py tables")
    with tempfile.TemporaryDirectory() as tmp:
        # Copies, each in a folder of its own: whatever the experiment writes beside its data
        # stays out of docs/data.
        copies = []
        for i, name in enumerate(names):
            os.makedirs(os.path.join(tmp, str(i)))
            copies.append(os.path.join(tmp, str(i), os.path.basename(name)))
            shutil.copyfile(os.path.join(harness.ROOT, name), copies[-1])
        options = m["options"].split()
        out = subprocess.run(harness.experiment_command(m["experiment"], "--table", *copies,
                                                        *options),
                             capture_output=True, text=True, cwd=tmp)
    if out.returncode != 0:
        # The data files' own names in the message, not the copies'.
        err = out.stderr
        for copy, name in zip(copies, names):
            err = err.replace(copy, name)
        sys.exit(f"tables: {where}: '{command}' failed:\n" + err)
    return out.stdout.strip("\n") + "\n"


def process(path, check):
    """(generated tables in the file, how many differ from their data)."""
    with open(path) as f:
        text = f.read()
    rel = os.path.relpath(path, harness.ROOT)
    blocks = differ = 0

    def replace(m):
        nonlocal blocks, differ
        blocks += 1
        line = text.count("\n", 0, m.start()) + 1
        body = render(m["cmd"], f"{rel}:{line}")
        if body != m["body"]:
            differ += 1
            if check:
                print(f"tables: {rel}:{line}: the table differs from what "
                      f"'{m['cmd']}' renders", file=sys.stderr)
        return m.group(1) + body + m.group(4)

    new = BLOCK.sub(replace, text)
    if new != text and check:
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                   rel, rel + " (from its data)"))
    elif new != text:
        with open(path, "w") as f:
            f.write(new)
    return blocks, differ


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 where a table differs from its data")
    p.add_argument("files", nargs="*", help=f"Markdown files (default: {' '.join(DEFAULT)})")
    args = p.parse_args(argv)
    files = args.files or [os.path.join(harness.ROOT, f) for f in DEFAULT
                           if os.path.isfile(os.path.join(harness.ROOT, f))]
    total, stale = 0, []
    for path in files:
        if not os.path.isfile(path):
            sys.exit(f"tables: {path}: no such file")
        blocks, differ = process(path, args.check)
        total += blocks
        if differ:
            stale.append(os.path.relpath(path, harness.ROOT))
    verb = "checked" if args.check else "rendered"
    print(f"tables: {total} generated tables {verb} in {len(files)} files")
    if args.check and stale:
        print(f"tables: out of date in {', '.join(stale)}; run: python3 bench/orion_bench.py "
              f"tables {' '.join(stale)}", file=sys.stderr)
        return 1
    return 0
