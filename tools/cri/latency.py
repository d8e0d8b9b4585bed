"""The high-priority pod's latency under enforcement, for the test kubelet (tools/cri/kubelet.py),
as tools/demo.sh measures it, on the CUDA driver test double: the service (orion-sample-infer,
Poisson arrivals, 4 kernels a request) restarted in the high-priority pod for a few seconds per
arm, beside the best-effort trainer pod with the gate in pass-through (time-slicing, today's
default), beside it with the priority gate on, and alone (the trainer pod removed). The gate mode
is switched with orion-ctl and the chart's operator token. Asserted: the enforced p99 is below
the time-sliced p99 (the trainer's kernels queue in front of the service's without the gate)."""
import time

from common import CheckFailed, log, step
from observe import result_line

# tools/demo.sh's service and trainer: 400 requests a second (Poisson) of 4 kernels of 200 us,
# beside steps of 20 kernels of 1 ms. Time-sliced, the service cannot keep up (each request
# waits behind a step's queued kernels): its queue grows, which the p99 from arrival shows, so
# the arm takes longer than REQUESTS / RATE.
RATE = 400
REQUESTS = 400
SERVICE = ["/opt/orion-samples/orion-sample-infer", "--rate", str(RATE),
           "--requests", str(REQUESTS), "--kernels", "4", "--kernel-us", "200"]


def set_mode(node, mode):
    node.ctl.run("policy", "--all", f"mode={mode}", role="operator")


def trainer_kernels(node):
    c = node.ctl.of_pod(node.pods["train"]["uid"])
    return int(c[0].get("kernels_launched", 0)) if c else 0


def arm(node, name, mode, trainer):
    t_arm = time.monotonic()
    set_mode(node, mode)
    k0, t0 = (trainer_kernels(node), time.monotonic()) if trainer else (0, 0)
    log_path = node.run_once(node.pods["infer"], SERVICE, timeout=90)
    r = result_line(log_path)
    if r is None:
        raise CheckFailed(f"arm {name}: no result line in {log_path}")
    rate = (trainer_kernels(node) - k0) / (time.monotonic() - t0) if trainer else None
    line = " ".join(f"{k}={r[k]}" for k in ("requests", "p50_us", "p99_us", "p999_us",
                                            "throughput_rps") if k in r)
    log(f"{name:<12} result {line}")
    log(f"{'':<12} trainer: {f'{rate:.0f} kernels/s' if trainer else '-'}, arm "
        f"{time.monotonic() - t_arm:.1f} s")
    return float(r["p99_us"]), rate


def p99_arms(node):
    step(f"the high-priority pod's p99 against alone and time-sliced "
         f"({' '.join(SERVICE[1:])} per arm)")
    t = time.monotonic()
    sliced, sliced_rate = arm(node, "time-sliced", "pass-through", True)
    enforced, enforced_rate = arm(node, "enforced", "priority", True)
    node.remove_pod(node.pods["train"])
    alone, _ = arm(node, "alone", "priority", False)
    log(f"p99: alone {alone / 1e3:.2f} ms, time-sliced {sliced / 1e3:.2f} ms "
        f"({sliced / alone:.2f}x alone), enforced {enforced / 1e3:.2f} ms "
        f"({enforced / alone:.2f}x alone); trainer {sliced_rate:.0f} -> {enforced_rate:.0f} "
        f"kernels/s under the gate ({time.monotonic() - t:.1f} s for the three arms)")
    if enforced >= sliced:
        raise CheckFailed(f"the enforced p99 ({enforced:.0f} us) is not below the time-sliced "
                          f"p99 ({sliced:.0f} us)")
    node.figures.append(f"high-priority pod p99 (double, {RATE} req/s x 4 x 200 us kernels, "
                        f"trainer 20 x 1 ms): alone {alone / 1e3:.2f} ms, time-sliced "
                        f"{sliced / 1e3:.2f} ms ({sliced / alone:.2f}x), enforced "
                        f"{enforced / 1e3:.2f} ms ({enforced / alone:.2f}x)")
