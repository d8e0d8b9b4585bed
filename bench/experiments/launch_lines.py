"""The code and data the interposer touches in one steady launch, traced by valgrind's lackey on the
CUDA driver test double (CPU only, no GPU): how many instructions of the interposer's library
run, in how many 64-byte code lines and 4 KiB pages, and how many 64-byte data lines those
instructions read or write.

  orion_bench.py launch-lines [BUILD] [--interposer LIB]... [--label L] [--out ROWS.jsonl]
  orion_bench.py launch-lines --table ROWS.jsonl

In an application the framework's own work between two launches (an eager PyTorch request runs
about 17 us of it between launches) pushes the launch path's lines out of the first-level caches,
so the lines a launch touches, not only its instructions, are what it pays for there. For each
library (default: BUILD's) and priority (high, best effort: alone on the GPU, never held),
BUILD's orion-bench-launch runs registered with BUILD's orion-server under lackey; every entry
into the library's cuLaunchKernel starts a launch, and everything the library's own code runs up
to the next one is that launch's (the interposer's other hooks included, whatever thread runs
them). A row's figures are the median over the last 48 launches of the run's paired phase
(each kernel already launched 1024 times before). Not a time: which of those lines are still
cached at the next launch is the host's and the application's affair (launch-cost measures the
time on a GPU host).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

import harness

ANSWERS = ("code lines, pages and data lines the interposer touches in one steady launch, traced "
           "by lackey on the CUDA test double (CPU only): builds compared exactly")

PRIORITIES = ("high", "best-effort")
STEADY_LAUNCHES = 48
BENCH_ARGS = ["--launches", "8", "--pairs", "1", "--no-polled"]


def load_base(paths, lib, env):
    """Where the dynamic loader maps `lib` in a process run under valgrind (LD_DEBUG=files names
    each object's base; the last one named for this path is valgrind's client)."""
    r = subprocess.run([paths["run"], "--interposer", lib, "--priority", "high", "--",
                        "valgrind", "--tool=none", paths["bench"]] + BENCH_ARGS,
                       env=dict(env, LD_DEBUG="files"), capture_output=True, text=True)
    bases = re.findall(rf"file={re.escape(lib)} \[0\];  generating link map\n.*?base: 0x([0-9a-f]+)",
                       r.stderr, re.S)
    if not bases:
        sys.exit(f"launch-lines: the loader never named {lib} (exit {r.returncode})\n"
                 f"{r.stderr[-1500:]}")
    return int(bases[-1], 16)


def hook_offset(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"^([0-9a-f]+) T cuLaunchKernel$", out, re.M)
    if m is None:
        sys.exit(f"launch-lines: {lib} exports no cuLaunchKernel")
    return int(m.group(1), 16)


def trace(paths, lib, priority, work):
    """The median figures of the run's last steady launches."""
    launches, cur, mine = [], None, False
    with open(os.path.join(work, "server.log"), "a") as log:
        server = harness.Server(paths["build"], work, log, program=paths["server"]).start()
        try:
            env = dict(os.environ, LD_LIBRARY_PATH=paths["double"], ORION_SOCKET=server.socket)
            base = load_base(paths, lib, env)
            end = base + os.path.getsize(lib)
            hook = base + hook_offset(lib)
            read_end, write_end = os.pipe()  # lackey's trace, read as it is written
            proc = subprocess.Popen(
                [paths["run"], "--interposer", lib, "--priority", priority, "--", "valgrind",
                 "--tool=lackey", "--trace-mem=yes", f"--log-fd={write_end}", paths["bench"]]
                + BENCH_ARGS, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(write_end,))
            os.close(write_end)
            with os.fdopen(read_end, "r", buffering=1 << 20) as lines:
                for line in lines:
                    if line[0] == "I":
                        ip = int(line[3:line.index(",")], 16)
                        if ip == hook:
                            cur = [0, set(), set()]
                            launches.append(cur)
                            if len(launches) > 4 * STEADY_LAUNCHES:
                                del launches[:-STEADY_LAUNCHES - 8]
                        mine = cur is not None and base <= ip < end
                        if mine:
                            cur[0] += 1
                            cur[1].add(ip >> 6)
                    elif mine and line[0] == " ":
                        cur[2].add(int(line[3:line.index(",")], 16) >> 6)
            rc = proc.wait()
        finally:
            server.stop()
    if rc != 0 or len(launches) < STEADY_LAUNCHES + 1:
        sys.exit(f"launch-lines: {priority}: exit {rc}, {len(launches)} launches through the hook "
                 f"(was the process registered?)")
    # The last launch's window runs to the process's exit: left out.
    steady = launches[-STEADY_LAUNCHES - 1:-1]
    med = statistics.median
    return {"launches": len(steady), "instructions": med([c[0] for c in steady]),
            "code_lines": med([len(c[1]) for c in steady]),
            "code_pages": med([len({x >> 6 for x in c[1]}) for c in steady]),
            "data_lines": med([len(c[2]) for c in steady])}


def table(rows):
    return harness.markdown_table(
        ["build", "interposer", "priority", "launches", "instructions a launch",
         "code lines (64 B)", "code pages (4 KiB)", "data lines (64 B)"],
        [[r["label"], r["interposer"], r["priority"], r["launches"], f"{r['instructions']:.0f}",
          f"{r['code_lines']:.0f}", f"{r['code_pages']:.0f}", f"{r['data_lines']:.0f}"]
         for r in rows])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_double_bench_args(p, "trace")
    args = p.parse_args(argv)
    if args.table:
        print(table(harness.read_rows(args.table, "launch-lines")))
        return 0
    if shutil.which("valgrind") is None or shutil.which("nm") is None:
        sys.exit("launch-lines: needs valgrind and nm (apt install valgrind binutils)")
    paths, libs = harness.double_bench_paths(args.build, args.interposer, "launch-lines")
    rows = []
    with tempfile.TemporaryDirectory(prefix="orion-lines-") as work:
        for lib in libs:
            for priority in PRIORITIES:
                row = {"label": args.label or os.path.basename(paths["build"]),
                       "interposer": harness.shown_path(lib),
                       "priority": priority, **trace(paths, lib, priority, work)}
                rows.append(row)
                if args.out:
                    harness.append_row(args.out, row)
    print(table(rows))
    return 0
