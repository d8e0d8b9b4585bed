"""A timeline export of a sample service beside a sample trainer on a GPU, for a picture.

  orion_bench.py timeline-export --bundle DIR [--out DIR]      (default out: ./timeline-out)

orion-server in priority mode; a high-priority orion-sample-infer (100 requests/s, 4 x 250 us
kernels) beside a best-effort orion-sample-train (20 x 1 ms kernels per step) for 4 s; then the
last 10 s of the timeline exported as Chrome trace JSON (OUT/h100.json) and as the HTML page
(OUT/h100.html). The README's timeline picture is a headless Chromium screenshot of it:
  chromium --headless --window-size=1250,200 --screenshot=shot.png file://OUT/h100.html
"""
import argparse
import os
import subprocess
import tempfile
import time

import harness

ANSWERS = ("a timeline export (trace JSON and HTML) of a sample service beside a sample "
           "trainer on the GPU: the README's picture")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default=".bundle")
    p.add_argument("--out", default=os.environ.get("OUT") or os.path.abspath("timeline-out"))
    p.add_argument("--admin-port", type=int, default=50071)
    args = p.parse_args(argv)
    b = os.path.abspath(args.bundle)
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="orion-export-")
    log = open(os.path.join(args.out, "server.log"), "a")
    server = harness.Server(b, work, log, admin_port=args.admin_port, mode="priority").start()
    env = dict(os.environ, ORION_SOCKET=server.socket, ORION_ADMIN=server.admin,
               LD_PRELOAD=os.path.join(b, "liborion_interpose.so"))
    try:
        with open(os.path.join(args.out, "train.txt"), "w") as t_out, \
                open(os.path.join(args.out, "infer.txt"), "w") as i_out:
            trainer = subprocess.Popen(
                [os.path.join(b, "orion-sample-train"), "--seconds", "4", "--kernels", "20",
                 "--kernel-us", "1000"], env=dict(env, ORION_PRIORITY="best-effort"),
                stdout=t_out, stderr=subprocess.STDOUT)
            time.sleep(0.5)
            subprocess.run([os.path.join(b, "orion-sample-infer"), "--rate", "100", "--requests",
                            "250", "--kernels", "4", "--kernel-us", "250"],
                           env=dict(env, ORION_PRIORITY="high"), stdout=i_out,
                           stderr=subprocess.STDOUT)
            trainer.wait()
        server.ctl("timeline", "--last-ms", "10000", "--trace",
                   os.path.join(args.out, "h100.json"), "--html", os.path.join(args.out, "h100.html"))
    finally:
        server.stop()
    for name in ("infer.txt", "train.txt"):
        with open(os.path.join(args.out, name)) as f:
            print(f"== {name}\n" + "".join(f.readlines()[-3:]), end="")
