#!/usr/bin/env python3
"""liborion_cpu_sampler.so (bench/cpu_sampler.cc) and bench/diagnostics/cpu_samples.py, on this
machine's CPU (no GPU): a Python process with the real sampler preloaded serves two "arms" in
turn under a switch file, as cpu-tax --in-process does: the baseline arm runs a pure Python loop,
the other spends most of its CPU in libc (ctypes.memset over a large buffer), and startup is
sampled under the startup word. Checked: each arm's sampled CPU is near what it spent; libc's
share is large in the memset arm and small in the loop arm; startup is left out; the table
shows libc's excess; a hidden function's offset is named with its source line. Without
ORION_CPU_SAMPLES the sampler writes nothing; a bad
ORION_CPU_SAMPLE_US is refused with a message and samples nothing.
Usage: cpu_samples_test.py LIBORION_CPU_SAMPLER_SO"""
import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from diagnostics import cpu_samples  # noqa: E402

CHILD = r'''
import ctypes, os, sys, time
switch = sys.argv[1]
def word(w):
    with open(switch, "r+b") as f:
        f.write(w.to_bytes(4, "little"))
def burn(seconds, body):
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        body()
buf = ctypes.create_string_buffer(8 << 20)
def loop():
    s = 0
    for i in range(2000):
        s += i * i
def fill():
    ctypes.memset(buf, 7, len(buf))
burn(0.3, loop)          # startup: under the startup word
for _ in range(3):
    word(1); burn(0.2, loop)
    word(0); burn(0.2, fill)
'''

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(lib, work, env_extra):
    switch = os.path.join(work, "switch")
    with open(switch, "wb") as f:
        f.write(cpu_samples.UNSAMPLED_WORD.to_bytes(4, "little"))
    env = dict(os.environ, LD_PRELOAD=lib, ORION_BENCH_SWITCH=switch, **env_extra)
    return subprocess.run([sys.executable, "-c", CHILD, switch], env=env, capture_output=True,
                          text=True, timeout=60)


def main():
    lib = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="cpu-samples-test-")
    prefix = os.path.join(work, "samples")
    r = run(lib, work, {"ORION_CPU_SAMPLES": prefix})
    check(r.returncode == 0, f"the sampled child exits 0 ({r.returncode}: {r.stderr[-300:]})")
    rows_path = os.path.join(work, "rows.jsonl")
    rows = cpu_samples.collect(prefix, 1, {1: "baseline", 0: "interposed"}, 10, rows_path)
    check(not glob.glob(prefix + ".*"), "collect removes the sampler's files")
    cpu = {a: sum(x["cpu_ms"] for x in rows if x["arm"] == a) for a in ("baseline", "interposed")}
    libc = {a: sum(x["cpu_ms"] for x in rows if x["arm"] == a and x["object"].startswith("libc."))
            for a in cpu}
    print("sampled CPU ms", cpu, "in libc", libc)
    # Each arm spent 0.6 s of thread CPU; a tick-based timer may miss up to a tick per switch.
    for a in cpu:
        check(450 <= cpu[a] <= 750, f"{a}: sampled CPU {cpu[a]:.0f} ms, spent 600 ms")
    check(libc["interposed"] >= 0.5 * cpu["interposed"],
          f"memset arm: libc holds {libc['interposed']:.0f} of {cpu['interposed']:.0f} ms")
    check(libc["baseline"] <= 0.2 * cpu["baseline"],
          f"loop arm: libc holds {libc['baseline']:.0f} of {cpu['baseline']:.0f} ms")
    check(all(x["requests"] == 10 for x in rows), "rows carry the requests per arm")
    table = cpu_samples.render([rows_path])
    print(table)
    libc_rows = [line for line in table.splitlines() if line.startswith("| libc.")]
    check(len(libc_rows) == 1 and "| +" in libc_rows[0],
          f"the table shows libc's excess in the memset arm: {libc_rows}")
    check(table.splitlines()[-1].startswith("| all |"), "the table ends with the total")

    # A hidden function's offset is named from the build's debug info, and both spellings of a
    # sampled symbol split into name and offset.
    nm = subprocess.run(["nm", "-C", lib], capture_output=True, text=True).stdout
    at = [line.split()[0] for line in nm.splitlines() if line.endswith("::StartSampling()")]
    check(len(at) == 1, f"nm finds the sampler's StartSampling ({at})")
    if at:
        offset = int(at[0], 16) + 4
        place = cpu_samples.locate(lib, [offset]).get(offset)
        check(place is not None and "StartSampling" in place[0] and "cpu_sampler.cc:" in place[1],
              f"locate names StartSampling and its line ({place})")
    check(cpu_samples.split_symbol("cuLaunchKernel@0x1f0") == ("cuLaunchKernel", 0x1f0) and
          cpu_samples.split_symbol("?+0x10") == ("?", 0x10) and
          cpu_samples.split_symbol("memset") == ("memset", None), "split_symbol")

    # Without the variable: nothing written. A bad period: refused, nothing written.
    quiet = os.path.join(work, "quiet")
    r = run(lib, work, {})
    check(r.returncode == 0 and not glob.glob(quiet + "*"), "no ORION_CPU_SAMPLES: no file")
    r = run(lib, work, {"ORION_CPU_SAMPLES": quiet, "ORION_CPU_SAMPLE_US": "5x"})
    check(r.returncode == 0 and "ORION_CPU_SAMPLE_US=5x" in r.stderr,
          f"a bad period is named on stderr ({r.stderr.strip()!r})")
    check(not glob.glob(quiet + "*"), "a bad period samples nothing")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
