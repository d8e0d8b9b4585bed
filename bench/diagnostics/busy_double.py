"""Busy seconds against the truth, on the CUDA driver test double (CPU only, no GPU).

  orion_bench.py busy-double [BUILD_DIR]        (default: build)

The double knows exactly how long every kernel ran (its busy_ns_total), so the server's
per-client busy seconds can be held against it. An eager-like service (5 us kernels, 20 us of
CPU before each, the GPU idle before each kernel) and a queued one (the same kernels back to
back) run registered high priority with every launch the pool of timing events allows timed
(ORION_PROFILE=1) and the timing diagnostic on; prints for each the ratio busy seconds / true
kernel time, then the timing log's summary. The double starts a kernel inside the launch call,
with no start latency beyond an event's: ORION_KERNEL_START_NS, ORION_QUEUED_START_NS,
ORION_HELD_START_NS and ORION_HELD_COMPUTE_START_NS are 0 here (interpose/sample_timing.h; the
defaults were measured on H100 and H200 hosts).
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

import harness

ANSWERS = ("busy seconds against the true kernel time on the CUDA test double (CPU only): an "
           "eager-like service and a queued one, every launch timed")

SHAPES = {"eager": ["--kernels", "40", "--kernel-us", "5", "--cpu-us", "20"],
          "queued": ["--kernels", "40", "--kernel-us", "5", "--cpu-us", "0"]}


def true_ns(work):
    """The double's busy_ns_total (SimGpuFile: 4 x uint32, 2 x uint64, then it)."""
    path = os.path.join(work, "gpu0")
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        return struct.unpack_from("<Q", f.read(40), 32)[0]


def metrics(server):
    with urllib.request.urlopen(server.metrics_url, timeout=5) as r:
        return r.read().decode()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("build", nargs="?", default=os.path.join(harness.ROOT, "build"))
    p.add_argument("--admin-port", type=int, default=50095)
    args = p.parse_args(argv)
    b = os.path.abspath(args.build)
    programs = {"server": "server/orion-server", "run": "tools/orion-run",
                "lib": "interpose/liborion_interpose.so", "infer": "samples/orion-sample-infer",
                "double": "tests/cuda_double/lib"}
    paths = {k: os.path.join(b, v) for k, v in programs.items()}
    missing = [v for v in paths.values() if not os.path.exists(v)]
    if missing:
        sys.exit(f"busy-double: {', '.join(missing)} missing; build first "
                 f"(cmake --build {args.build})")
    print("| service | kernels | true kernel time (s) | busy seconds | ratio |\n"
          "|---|---|---|---|---|")
    timing, events = [], []
    for name, shape in SHAPES.items():
        work = tempfile.mkdtemp(prefix=f"orion-busy-{name}-")
        log = open(os.path.join(work, "server.log"), "a")
        server = harness.Server(b, work, log, admin_port=args.admin_port, mode="priority",
                                program=paths["server"]).start()
        try:
            tdir = os.path.join(work, f"timing-{name}")
            os.makedirs(tdir)
            timing.append(tdir)
            env = dict(os.environ, ORION_SIM_DIR=work, ORION_SIM_MEMORY="4Gi",
                       LD_LIBRARY_PATH=paths["double"], ORION_SOCKET=server.socket,
                       ORION_PROFILE="1", ORION_KERNEL_START_NS="0", ORION_QUEUED_START_NS="0",
                       ORION_HELD_START_NS="0", ORION_HELD_COMPUTE_START_NS="0",
                       ORION_TIMING_LOG=tdir)
            r = subprocess.run([paths["run"], "--interposer", paths["lib"], "--priority", "high",
                                "--", paths["infer"], "--rate", "0", "--requests", "200",
                                "--warmup", "5", *shape], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"busy-double: {name}: exit {r.returncode}\n{r.stdout}{r.stderr}")
            time.sleep(1.2)  # the server drains the ring and the metrics catch up
            text = metrics(server)
            busy = sum(float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith("orion_gpu_busy_seconds_total")
                       and 'priority="high"' in line)
            events += [f"{name}: {line}" for line in text.splitlines() if line.startswith((
                "orion_events_dropped", "orion_events_skipped", "orion_events_ingested",
                "orion_events_written"))]
            t = true_ns(work) / 1e9
            print(f"| {name} | 205 x 40 x 5 us | {t:.4f} | {busy:.4f} | "
                  f"{busy / t if t else float('nan'):.3f} |", flush=True)
        finally:
            server.stop()
    print()
    sys.stdout.flush()
    subprocess.run(harness.experiment_command("timing-log", *timing))
    print("\n".join(events))
