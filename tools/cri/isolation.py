"""A hostile pod, for the test kubelet (tools/cri/kubelet.py): a sharing pod like any other (uid
1000, the Allocate answer's mounts and environment, no capabilities, the runtime's default
seccomp profile) that runs orion-hostile (tools/cri/hostile_pod.cc, mounted from the host) against
the high-priority pod: change its priority, pause it, read or write its shared memory. The step
asserts that every attempt was refused and that the victim's priority, pause and launches are
as before."""
import os
import time

from common import CheckFailed, log, step, wait_for
from observe import log_lines

ATTEMPTS_AT_LEAST = 22  # what orion-hostile tries (tools/cri/hostile_pod.cc): all must print


def hostile_pod(node):
    step("a hostile pod against the high-priority pod")
    k, pb = node.kubelet, node.kubelet.pb
    victim = node.pods["infer"]
    vc = node.ctl.of_pod(victim["uid"])
    if not vc:
        raise CheckFailed(f"{victim['name']} is not a client before the attack")
    vc = vc[0]
    gpu = int(vc.get("gpu", 0))
    uuids = {int(g.get("index", 0)): g.get("uuid") for g in node.ctl.gpus()}
    socket_path = victim["alloc"]["env"].get("ORION_SOCKET")
    if not socket_path:
        raise CheckFailed(f"{victim['name']}: no ORION_SOCKET in its Allocate answer")
    bindir = os.path.dirname(node.args.hostile)
    command = ["/opt/orion-hostile/" + os.path.basename(node.args.hostile),
               "--socket", socket_path, "--gpu-uuid", uuids[gpu],
               "--victim-pid", str(victim["pid"]), "--victim-client", str(vc.get("client_id")),
               "--victim-pod", victim["uid"], "--admin", f"127.0.0.1:{node.args.admin_port}",
               "--ctl", "/usr/local/bin/orion-ctl"]
    # It asks for a share itself (no annotation: the webhook leaves it as it is) and runs in the
    # project's image, which has orion-ctl.
    spec = node.sharing_pod_spec("hostile-x9z7k", {},
                                 node.node_pod["containers"][0]["image"], command,
                                 limits={node.resource(): "1"},
                                 extra_mounts=[("hostile", "/opt/orion-hostile", bindir)])
    before_kernels = int(vc.get("kernels_launched", 0))
    t = time.monotonic()
    pod = node.start_sharing_pod(spec, True, runs=False)
    wait_for("orion-hostile to finish", lambda: k.status(pod["cid"])[0].state ==
             pb.CONTAINER_EXITED, 60, 0.1)
    st, _ = k.status(pod["cid"])
    lines = log_lines(st.log_path)
    for line in lines:
        log(f"  | {line}")
    if st.exit_code != 0:
        raise CheckFailed(f"orion-hostile exited with {st.exit_code}: {lines[-3:]}")
    attempts = [line for line in lines if line.startswith("attempt ")]
    succeeded = [line for line in attempts if ": refused: " not in line]
    summary = [line for line in lines if line.startswith("hostile attempts=")]
    if succeeded:
        raise CheckFailed(f"attempts of the hostile pod not refused: {succeeded}")
    if len(attempts) < ATTEMPTS_AT_LEAST or not summary or \
            summary[0] != f"hostile attempts={len(attempts)} refused={len(attempts)}":
        raise CheckFailed(f"orion-hostile printed {len(attempts)} attempts (at least "
                          f"{ATTEMPTS_AT_LEAST} expected) and {summary}")
    confined = [line for line in lines if line.startswith("hostile: status ")]
    if not confined or "uid 1000" not in confined[0] or "Seccomp 2" not in confined[0] or \
            "CapEff 0000000000000000" not in confined[0]:
        raise CheckFailed(f"the hostile pod did not run confined as the others: {confined}")
    board = [line for line in lines if line.startswith("victim on the board after:")]
    if not board:
        raise CheckFailed("orion-hostile did not report the victim's board slot after the attack")

    # The victim as the server and its own counters see it afterwards.
    after = node.ctl.of_pod(victim["uid"])
    if not after:
        raise CheckFailed(f"{victim['name']} is no longer a client after the attack")
    after = after[0]
    mode = {int(g.get("index", 0)): g.get("mode") for g in node.ctl.gpus()}.get(gpu)
    if after.get("client_id") != vc.get("client_id") or after.get("priority") != vc.get("priority") \
            or after.get("paused"):
        raise CheckFailed(f"{victim['name']}: client {vc.get('client_id')} {vc.get('priority')} "
                          f"before, {after.get('client_id')} {after.get('priority')} paused="
                          f"{after.get('paused', False)} after the attack")
    if mode != "GATE_MODE_PRIORITY":
        raise CheckFailed(f"GPU {gpu}'s gate mode is {mode} after the attack")
    time.sleep(0.3)
    now = node.ctl.of_pod(victim["uid"])[0]
    launched = int(now.get("kernels_launched", 0)) - before_kernels
    if int(now.get("kernels_launched", 0)) <= int(after.get("kernels_launched", 0)):
        raise CheckFailed(f"{victim['name']} stopped launching after the attack")
    log(f"{victim['name']}: client {after.get('client_id')}, priority {after.get('priority')}, "
        f"not paused, {launched} kernels launched since the attack began; GPU {gpu} still "
        f"{mode}")
    node.remove_pod(pod)
    names = sorted({a.split(":")[0][len("attempt "):].split(" ")[0] for a in attempts})
    log(f"hostile pod: {len(attempts)} attempts, all refused ({time.monotonic() - t:.1f} s): "
        f"{', '.join(names)}")
    vmm_past_the_limit(node)
    node.figures.append(f"hostile pod (uid 1000, Seccomp 2, the Allocate answer's mounts): "
                        f"{len(attempts)} of {len(attempts)} attempts refused (board writes, "
                        f"/proc memfds, process_vm_readv, ptrace, SIGSTOP, socket folder, "
                        f"AgentSync, admin API without or with a made-up token); the victim "
                        f"kept priority {after.get('priority')}, unpaused, launching")


def vmm_past_the_limit(node):
    """A pod under orion/memory-limit 256Mi maps VMM handles and releases each at once (the
    driver frees such memory only at its unmap): the quota still counts it, so the fifth 64 MiB
    chunk is refused with CUDA_ERROR_OUT_OF_MEMORY."""
    k, pb = node.kubelet, node.kubelet.pb
    command = ["/opt/orion-samples/orion-sample-alloc", "--vmm", "--release-mapped", "--chunk",
               "64Mi", "--max", "1Gi"]
    spec = node.sharing_pod_spec("vmm-release-p3c8n", {"orion/priority": "best-effort",
                                                       "orion/memory-limit": "256Mi"},
                                 node.args.sample_image, command)
    pod = node.start_sharing_pod(spec, True, runs=False)
    wait_for("the VMM pod to finish", lambda: k.status(pod["cid"])[0].state ==
             pb.CONTAINER_EXITED, 60, 0.1)
    st, _ = k.status(pod["cid"])
    lines = log_lines(st.log_path)
    result = [line for line in lines if line.startswith("result ")]
    node.remove_pod(pod)
    if st.exit_code != 0 or not result:
        raise CheckFailed(f"orion-sample-alloc --vmm --release-mapped exited {st.exit_code}: "
                          f"{lines[-3:]}")
    fields = dict(kv.split("=", 1) for kv in result[0].split()[1:] if "=" in kv)
    if fields.get("chunks") != "4" or fields.get("failure") != "CUDA_ERROR_OUT_OF_MEMORY":
        raise CheckFailed(f"VMM handles released once mapped under 256Mi: {result[0]}")
    log(f"VMM handles released once mapped, under 256Mi: {result[0]}")
    node.figures.append("VMM handles mapped and released at once under orion/memory-limit "
                        "256Mi: 4 chunks of 64 MiB held, the fifth refused (out of memory)")
