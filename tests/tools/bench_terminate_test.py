#!/usr/bin/env python3
"""A benchmark's orion-server does not outlive its run: bench/orion_bench.py ended by SIGTERM (a
`timeout` around it) stops the server it started, and a server that cannot start is reported
with the end of its log (the log's folder is the run's, often removed with it).

Runs launch-cost from a bundle made of this build's orion-server and orion-run, with a stand-in
for orion-bench-launch (a script that sleeps: no GPU here), sends SIGTERM to the benchmark alone
once its server is up, and checks that the server is gone. Then starts the harness's Server with
a program that writes a line and exits, and checks the error quotes that line.

  bench_terminate_test.py BUILD
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

from bench_test_lib import ROOT, check, harness, make_bundle, wait_for


def servers_of(bundle):
    """Pids of the processes running `bundle`'s orion-server."""
    program = os.path.join(bundle, "orion-server").encode()
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[0] == program:
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def main():
    build = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="orion-bench-term-") as work:
        bundle = make_bundle(build, work, "orion-server", "orion-run")
        stand_in = os.path.join(bundle, "orion-bench-launch")
        with open(stand_in, "w") as f:
            f.write("#!/bin/sh\nexec sleep 60\n")
        os.chmod(stand_in, 0o755)

        bench = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "bench", "orion_bench.py"), "launch-cost",
             "--bundle", bundle, "--runs", "1", "--cpus", "0", "--admin-port", "0",
             "--out", os.path.join(work, "out")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)  # its own group: the signal below reaches the benchmark alone
        try:
            up = wait_for(lambda: servers_of(bundle), 20)
            check(up, "launch-cost never started its orion-server")
            time.sleep(0.5)  # into its first arm (the stand-in sleeping)
            bench.send_signal(signal.SIGTERM)
            _, err = bench.communicate(timeout=30)
            check(bench.returncode == 128 + signal.SIGTERM,
                  f"a terminated benchmark exits {bench.returncode}, not 143: {err[-800:]}")
            # The benchmark waits for its server to exit before it exits itself.
            left = [p for p in up if p in servers_of(bundle)]
            check(not left, f"orion-server {left} outlived the terminated benchmark")
        finally:
            for pid in servers_of(bundle):
                os.kill(pid, signal.SIGKILL)
            if bench.poll() is None:
                os.killpg(bench.pid, signal.SIGKILL)

        failing = os.path.join(work, "failing-server")
        with open(failing, "w") as f:
            f.write("#!/bin/sh\necho 'orion-server: config: admin_address: port taken' >&2\n"
                    "exit 1\n")
        os.chmod(failing, 0o755)
        with open(os.path.join(work, "server.log"), "a") as log:
            try:
                harness.Server(bundle, work, log, program=failing).start()
            except SystemExit as e:
                check("did not start" in str(e) and "admin_address: port taken" in str(e),
                      f"the error must quote the server's log: {e}")
            else:
                check(False, "a server that exits at once was taken as started")
    print("OK")


if __name__ == "__main__":
    main()
