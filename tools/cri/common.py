"""Shared helpers of the test kubelet (tools/cri/kubelet.py and its modules): the check's failure
type, its log lines, waiting for a condition, and the tail of a log file."""
import time


class CheckFailed(Exception):
    pass


def log(msg):
    print(msg, flush=True)


def step(msg):
    log(f"== {msg}")


def wait_for(what, pred, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "\n" + "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"
