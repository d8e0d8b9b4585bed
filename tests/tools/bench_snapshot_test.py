#!/usr/bin/env python3
"""The benchmarks' snapshots (bench/harness.py snapshot_every, the matrix's snapshot-*.txt and
timeline's snapshots.txt): against this build's real orion-server, each snapshot holds the
server's clients (orion-ctl), its orion_ series from /metrics, and the threads of the processes
named (state, user and system ticks). A part that fails is written down in its place and the
rest is kept: `orion-ctl policy` before the server knows a GPU, every remote part once the
server is gone (the threads still shown); nothing raises into the run, and the loop ends when
its event is set.

  bench_snapshot_test.py BUILD
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

from bench_test_lib import check, harness, make_bundle, wait_for


def free_port_pair():
    """A port whose next one is free too (the server's admin port, then its metrics port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    sys.exit("FAIL: no two free ports in a row")


def main():
    build = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="orion-bench-snap-") as work:
        bundle = make_bundle(build, work, "orion-server", "orion-ctl")
        log = open(os.path.join(work, "server.log"), "w")
        server = harness.Server(bundle, work, log, admin_port=free_port_pair(),
                                mode="priority").start()
        sleeper = subprocess.Popen(["sleep", "30"])
        path = os.path.join(work, "snapshots.txt")
        try:
            stop = harness.snapshot_every(path, server, 0.2, pids=lambda: [sleeper.pid])
            two = wait_for(lambda: os.path.exists(path) and
                           open(path).read().count("== t=") >= 2, 20)
            text = open(path).read() if os.path.exists(path) else ""
            check(two, f"two snapshots in 20 s; got:\n{text}")
            first = text[:text.index("== t=", 1)]
            check("orion-ctl policy failed: " in first and "no GPU" in first,
                  f"policy, with no GPU known yet, fails in its place:\n{first}")
            check("(no clients: a process appears here when it registers" in first,
                  f"orion-ctl clients kept beside it:\n{first}")
            series = [l for l in first.splitlines() if l.startswith("orion_")]
            check(series, f"the orion_ series of /metrics kept:\n{first}")
            check(not any("_bucket" in l for l in series), "histogram buckets left out")
            check(f"-- pid {sleeper.pid}\n{sleeper.pid} sleep S " in first,
                  f"the named process's thread: tid, name, state (sleeping):\n{first}")
            server.stop()
            gone = lambda: open(path).read().split("== t=")[-1]  # noqa: E731
            check(wait_for(lambda: "orion-ctl clients failed" in gone() and
                           "/metrics failed" in gone(), 10),
                  f"without a server each remote part says it failed:\n{gone()}")
            check(f"{sleeper.pid} sleep S " in gone(), "the threads still shown")
            stop.set()
            time.sleep(0.5)
            settled = open(path).read()
            time.sleep(0.6)
            check(open(path).read() == settled, "the loop ends once its event is set")
        finally:
            sleeper.kill()
            sleeper.wait()
            server.stop()
    print("OK: snapshots hold clients, /metrics and threads; a part that fails is written in its "
          "place")


if __name__ == "__main__":
    main()
