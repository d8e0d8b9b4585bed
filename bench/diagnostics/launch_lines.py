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
them); an instruction or access that crosses a line counts both. A row's figures are the median
over the 48 launches before the run's last (its window runs to the exit), in the paired phase,
each kernel already launched 1024 times before. Not a time: which of those lines are still
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

STEADY_LAUNCHES = 48
BENCH_ARGS = ["--launches", "8", "--pairs", "1", "--no-polled"]


def load_range(paths, lib, env):
    """Where the dynamic loader maps `lib` in a process run under valgrind, as (base, end):
    LD_DEBUG=files names each object's base and mapped size; the last one named for this path
    is valgrind's client (valgrind places it alike in every run of the same command)."""
    r = subprocess.run([paths["run"], "--interposer", lib, "--priority", "high", "--",
                        "valgrind", "--tool=none", paths["bench"]] + BENCH_ARGS,
                       env=dict(env, LD_DEBUG="files"), capture_output=True, text=True)
    found = re.findall(rf"file={re.escape(lib)} \[0\];  generating link map\n"
                       r".*?base: 0x([0-9a-f]+)\s+size: 0x([0-9a-f]+)", r.stderr, re.S)
    if not found:
        sys.exit(f"launch-lines: the loader never named {lib} (exit {r.returncode})\n"
                 f"{r.stderr[-1500:]}")
    base, size = (int(x, 16) for x in found[-1])
    return base, base + size


def hook_offset(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"^([0-9a-f]+) T cuLaunchKernel$", out, re.M)
    if m is None:
        sys.exit(f"launch-lines: {lib} exports no cuLaunchKernel")
    return int(m.group(1), 16)


def lines_of(entry):
    """The 64-byte lines a lackey entry ("I  addr,size" or " L addr,size") spans."""
    addr, size = entry[3:].split(",")
    first = int(addr, 16)
    return range(first >> 6, ((first + max(int(size), 1) - 1) >> 6) + 1), first


def trace(paths, lib, priority, work):
    """The median figures of the run's last steady launches."""
    launches, cur, mine = [], None, False
    errors = os.path.join(work, f"lackey.{priority}.stderr")
    with open(os.path.join(work, "server.log"), "a") as log:
        server = harness.Server(paths["build"], work, log, program=paths["server"]).start()
        try:
            env = dict(os.environ, LD_LIBRARY_PATH=paths["double"], ORION_SOCKET=server.socket)
            base, end = load_range(paths, lib, env)
            hook = base + hook_offset(lib)
            read_end, write_end = os.pipe()  # lackey's trace, read as it is written
            with open(errors, "w") as err:
                proc = subprocess.Popen(
                    [paths["run"], "--interposer", lib, "--priority", priority, "--", "valgrind",
                     "--tool=lackey", "--trace-mem=yes", f"--log-fd={write_end}", paths["bench"]]
                    + BENCH_ARGS, env=env, stdout=subprocess.DEVNULL, stderr=err,
                    pass_fds=(write_end,))
            os.close(write_end)
            read_all = False
            try:
                with os.fdopen(read_end, "r", buffering=1 << 20) as lines:
                    for line in lines:
                        if line[0] == "I":
                            spans, ip = lines_of(line)
                            if ip == hook:
                                cur = [0, set(), set()]
                                launches.append(cur)
                                if len(launches) > 4 * STEADY_LAUNCHES:
                                    del launches[:-STEADY_LAUNCHES - 8]
                            mine = cur is not None and base <= ip < end
                            if mine:
                                cur[0] += 1
                                cur[1].update(spans)
                        elif mine and line[0] == " ":
                            cur[2].update(lines_of(line)[0])
                read_all = True
            finally:
                if not read_all and proc.poll() is None:
                    proc.kill()  # the trace could not be read: do not leave valgrind running
                rc = proc.wait()
        finally:
            server.stop()
    stderr = open(errors).read()
    why = ""
    if "passing CUDA calls through unchanged" in stderr:
        why = "the interposer passed through (not registered): "
    elif rc == 0 and not launches:
        why = ("no launch entered the hook at the address the loader gave under valgrind's "
               "other tool (did lackey place the library elsewhere?): ")
    if why or rc != 0 or len(launches) < STEADY_LAUNCHES + 1:
        sys.exit(f"launch-lines: {priority}: {why}exit {rc}, {len(launches)} launches through "
                 f"the hook\n{stderr[-1500:]}")
    # The last launch's window runs to the process's exit: left out. The 48 before it are all
    # past the steady launches (1024 of each kernel) that precede the paired phase.
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
    with tempfile.TemporaryDirectory(prefix="orion-lines-") as work:
        rows = harness.double_bench_rows(
            args, paths, libs, lambda lib, priority: trace(paths, lib, priority, work))
    print(table(rows))
    return 0
