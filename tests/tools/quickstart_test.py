#!/usr/bin/env python3
"""Runs README.md's quick start as written: the lines between its quick-start-test markers, in
order, in a fresh folder beside the build. Adapted only where a test must be: the server's socket
folder, admin and metrics ports are a temporary folder and free ports (written into the printed
orion.yaml and given to orion-run and orion-ctl by $ORION_SOCKET and $ORION_ADMIN), `sudo -b`
runs the server as this user in the background with its log kept, and the test waits for its
socket. Fails when a line fails or its output is not what the README says it shows.

  quickstart_test.py README.md BUILD_DIR SOURCE_DIR
"""
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile

BEGIN, END = "<!-- quick-start-test: begin -->", "<!-- quick-start-test: end -->"


def fail(msg, output=""):
    print("FAIL:", msg)
    if output:
        print(output[-6000:])
    sys.exit(1)


def quick_start_lines(readme):
    lines, inside = [], False
    for line in open(readme, encoding="utf-8").read().splitlines():
        if line.strip() == BEGIN:
            inside = True
        elif line.strip() == END:
            inside = False
        elif inside and line.strip():
            if not line.startswith("    "):
                fail(f"not a 4-space indented command between the markers: {line!r}")
            lines.append(line[4:])
    return lines


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    readme, build, source = sys.argv[1:4]
    lines = quick_start_lines(readme)
    text = "\n".join(lines)
    for must in ("source tools/simulated-gpu.sh", "--print-default-config > orion.yaml",
                 "sudo -b build/server/orion-server --config orion.yaml", "orion-run",
                 "orion-ctl clients", "localhost:9464"):
        if must not in text:
            fail(f"the quick start between the markers has no '{must}'", text)
    work = tempfile.mkdtemp(prefix="orion-quickstart.")
    os.symlink(os.path.abspath(build), os.path.join(work, "build"))
    os.symlink(os.path.join(os.path.abspath(source), "tools"), os.path.join(work, "tools"))
    sock = os.path.join(work, "run", "orion", "orion.sock")
    admin, metrics = free_port(), free_port()
    script = ["set -euo pipefail", f"cd {work}",
              f"export ORION_SIM_DIR={work}/sim ORION_SOCKET={sock} ORION_ADMIN=127.0.0.1:{admin}"]
    for line in lines:
        line = line.replace("localhost:9464", f"localhost:{metrics}")
        m = re.match(r"sudo -b ([^;#]*?)\s*(;.*)?$", line)
        if m:
            script.append(f"{m.group(1)} > {work}/server.log 2>&1 &")
            script.append(f"for _ in $(seq 400); do [[ -S {sock} ]] && break; sleep 0.05; done")
            script.append(f"[[ -S {sock} ]] || {{ cat {work}/server.log; exit 1; }}")
            continue
        script.append(line)
        if "--print-default-config > orion.yaml" in line:
            # The printed defaults must hold the keys the test moves, as the README relies on.
            script.append("grep -q '^socket_path: /run/orion/orion.sock ' orion.yaml")
            script.append("grep -q '^admin_address: 127.0.0.1:50051 ' orion.yaml")
            script.append("grep -q '^metrics_address: 0.0.0.0:9464 ' orion.yaml")
            script.append(f"sed -i 's|/run/orion/orion.sock|{sock}|; "
                          f"s|127.0.0.1:50051|127.0.0.1:{admin}|; "
                          f"s|0.0.0.0:9464|127.0.0.1:{metrics}|' orion.yaml")
    with open(os.path.join(work, "quickstart.sh"), "w") as f:
        f.write("\n".join(script) + "\n")
    proc = subprocess.Popen(["bash", os.path.join(work, "quickstart.sh")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        fail("the quick start took over 180 s", proc.communicate()[0])
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the trainer it left running
        except ProcessLookupError:
            pass
    log = open(os.path.join(work, "server.log")).read() if os.path.exists(
        os.path.join(work, "server.log")) else ""
    if proc.returncode != 0:
        fail(f"the quick start failed (exit {proc.returncode})", out + "\n-- server log:\n" + log)
    for want in (r"^simulated-gpu\.sh: programs started from this shell now run on a simulated",
                 r"^SERVING: \d+ GPU\(s\), \d+ client\(s\)$",
                 r"^result requests=2000 ",
                 r"standalone/orion-sample-\s+best-effort",
                 r"^orion_clients\{"):
        if not re.search(want, out, re.M):
            fail(f"the quick start's output has no line like {want!r}", out)
    folder = os.stat(os.path.dirname(sock))
    if stat.S_IMODE(folder.st_mode) != 0o755 or folder.st_uid != os.getuid():
        fail(f"the socket folder is mode {stat.S_IMODE(folder.st_mode):o}, uid {folder.st_uid}")
    for want in ("created " + os.path.dirname(sock), "registered: orion-sample-in",
                 "exited: orion-sample-in", "registered: orion-sample-tr"):
        if want not in log:
            fail(f"the server's log has no '{want}'", log)
    subprocess.run(["rm", "-rf", work], check=False)
    print("quick start: ok")


if __name__ == "__main__":
    main()
