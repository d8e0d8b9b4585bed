"""What the bench tests that run this build's binaries share: bench/harness.py on the path, a
check that ends the test naming what failed, a wait for a condition, and a bundle folder of
symbolic links to this build's binaries (what bench/orion_bench.py --bundle takes)."""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import harness  # noqa: E402,F401  (the tests' harness)

# Where each binary a bundle may hold is built.
BUILT_IN = {"orion-server": "server", "orion-run": "tools", "orion-ctl": "tools"}


def check(ok, msg):
    if not ok:
        print("FAIL:", msg)
        sys.exit(1)


def wait_for(what, seconds):
    """what() until it is true or `seconds` pass; its last value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    return what()


def make_bundle(build, work, *programs):
    """WORK/bundle holding links to `programs` (orion-server, orion-run, orion-ctl) of BUILD."""
    bundle = os.path.join(work, "bundle")
    os.mkdir(bundle)
    for name in programs:
        os.symlink(os.path.join(build, BUILT_IN[name], name), os.path.join(bundle, name))
    return bundle
