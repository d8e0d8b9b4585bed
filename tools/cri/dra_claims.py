"""The DRA path of the test kubelet (tools/cri/kubelet.py): the agent's DRA kubelet plugin
(driver gpu-share.orion.io) registered the way the kubelet's plugin watcher does it, its
ResourceSlice read from the test API server, a ResourceClaim allocated as the scheduler would
(the GPU's high device, with an opaque config) prepared over the real DRA v1 gRPC API, the CDI
spec the agent wrote applied to a sharing pod's container, the pod run and found at
orion-server with the claim's priority and limits, then the claim unprepared (twice: the second
is a no-op) and its CDI spec gone; last, a claim mixing the GPU's high device with a share is
refused at prepare.

containerd 1.6 (Debian 12) has no CDI support, so the test kubelet applies the spec's
containerEdits (env, mounts) to the container config itself, as a CDI-aware runtime
(containerd >= 1.7, CRI-O) does for the CDI device IDs the kubelet passes it; it says so."""
import copy
import json
import os
import time
import uuid

from checks import INFER, prio_word
from common import CheckFailed, log, step, wait_for
from translate import translate_pod

DRIVER = "gpu-share.orion.io"


def applied_edits(spec_path, device):
    """env (dict) and mounts [(container, host, read-only)] of `device` in a CDI spec file."""
    with open(spec_path) as f:
        spec = json.load(f)
    if spec.get("kind") != f"{DRIVER}/claim" or not spec.get("cdiVersion"):
        raise CheckFailed(f"{spec_path}: kind {spec.get('kind')!r}, cdiVersion "
                          f"{spec.get('cdiVersion')!r}")
    found = [d for d in spec.get("devices", []) if d.get("name") == device]
    if len(found) != 1:
        raise CheckFailed(f"{spec_path}: no device {device!r} among "
                          f"{[d.get('name') for d in spec.get('devices', [])]}")
    edits = found[0]["containerEdits"]
    env = dict(e.split("=", 1) for e in edits.get("env", []))
    mounts = [(m["containerPath"], m["hostPath"], "ro" in m.get("options", []))
              for m in edits.get("mounts", [])]
    return spec, env, mounts


def dra_claim(node):
    step("DRA: plugin registration, ResourceSlice, NodePrepareResources, CDI spec -> CRI, "
         "NodeUnprepareResources")
    k, api, dra = node.kubelet, node.api, node.dra
    t = time.monotonic()
    path, info = dra.register()
    log(f"plugins_registry: {os.path.basename(path)}: GetInfo type {info.type}, name "
        f"{info.name}, endpoint {info.endpoint}, versions {list(info.supported_versions)}; "
        f"NotifyRegistrationStatus(registered) sent ({time.monotonic() - t:.2f} s)")
    if info.name != DRIVER:
        raise CheckFailed(f"DRA plugin name {info.name}, expected {DRIVER}")

    def published():
        return [s for s in api.resource_slices() if s["spec"]["driver"] == DRIVER and
                s["spec"]["nodeName"] == k.node] or None
    slices = wait_for("the agent's ResourceSlice in the API server", published, 20, 0.1)
    owners = [s["metadata"].get("ownerReferences") for s in slices]
    want_owner = [{"apiVersion": "v1", "kind": "Node", "name": k.node, "uid": api.node_uid,
                   "controller": True}]
    if any(o != want_owner for o in owners):
        raise CheckFailed(f"ResourceSlice owners {owners}, expected the Node {want_owner}")
    devices = [d for s in slices for d in s["spec"]["devices"]]
    highs = [d for d in devices if d["attributes"]["high"]["bool"]]
    shares = [d for d in devices if not d["attributes"]["high"]["bool"]]
    log(f"ResourceSlice {slices[0]['metadata']['name']}: pool {slices[0]['spec']['pool']}, "
        f"owned by Node {k.node}, {len(shares)} share devices and {len(highs)} high devices, e.g. "
        f"{json.dumps(highs[0])}")
    if not highs or not shares:
        raise CheckFailed(f"ResourceSlice devices {[d['name'] for d in devices]}: no high or "
                          f"no share devices")
    device = min(highs, key=lambda d: d["attributes"]["index"]["int"])
    gpu = device["attributes"]["uuid"]["string"]

    # The pod asks for the claim (no orion/* annotation: the claim's config is its setting).
    spec = node.sharing_pod_spec("serve-dra-7h2kq", {}, node.args.sample_image, INFER)
    meta = spec["metadata"]
    claim_name, claim_uid = "serve-dra-gpu", str(uuid.uuid4())
    spec["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    spec["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    spec["spec"]["nodeName"] = k.node
    spec["status"] = {"phase": "Running"}
    params = {"apiVersion": "gpu-share.orion.io/v1alpha1", "kind": "GpuShareConfig",
              "priority": "high", "memoryLimit": "512Mi", "latencyTargetMs": 20}
    api.put_claim({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": claim_name, "namespace": meta["namespace"], "uid": claim_uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu-high.orion.io"}}]}},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": k.node,
                             "device": device["name"]}],
                "config": [{"source": "FromClaim", "requests": ["gpu"],
                            "opaque": {"driver": DRIVER, "parameters": params}}]}},
            "reservedFor": [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}]}})
    api.add_pod(spec)
    log(f"claim {meta['namespace']}/{claim_name} (uid {claim_uid}) allocated {device['name']} "
        f"(GPU {gpu}) with config {params}, reserved for pod {meta['name']}")

    t = time.monotonic()
    resp = dra.prepare([(meta["namespace"], claim_uid, claim_name)])
    r = resp.claims[claim_uid]
    if r.error:
        raise CheckFailed(f"NodePrepareResources: claim error: {r.error}")
    ids = [i for d in r.devices for i in d.cdi_device_ids]
    log(f"NodePrepareResources ({time.monotonic() - t:.2f} s): devices "
        f"{[(d.pool_name, d.device_name, list(d.request_names)) for d in r.devices]}, "
        f"CDI device IDs {ids}")
    want_id = f"{DRIVER}/claim={claim_uid}"
    if ids[:1] != [want_id]:
        raise CheckFailed(f"CDI device IDs {ids}, expected {want_id} first")
    cdi_path = os.path.join(node.args.node_root, "var/run/cdi",
                            f"{DRIVER}-claim_{claim_uid}.json")
    _, env, mounts = applied_edits(cdi_path, claim_uid)
    log(f"CDI spec {cdi_path}: env {env}; mounts (container, host, ro) {mounts}")
    log("containerd 1.6 has no CDI: the test kubelet applies these containerEdits to the "
        "container config itself, as a CDI-aware runtime does for the CDI device IDs above")
    for key, want in (("NVIDIA_VISIBLE_DEVICES", gpu), ("ORION_PRIORITY", "high"),
                      ("ORION_MEMORY_LIMIT", str(512 << 20)), ("ORION_LATENCY_TARGET_MS", "20")):
        if env.get(key) != want:
            raise CheckFailed(f"CDI spec env {key}={env.get(key)!r}, expected {want!r}")
    if not env.get("LD_PRELOAD", "").endswith("liborion_interpose.so"):
        raise CheckFailed(f"CDI spec env LD_PRELOAD={env.get('LD_PRELOAD')!r}")

    # The claim fields are the kubelet's DRA manager's input, not the runtime's.
    cri_spec = copy.deepcopy(spec["spec"])
    cri_spec.pop("resourceClaims")
    cri_spec.pop("nodeName")
    cri_spec["containers"][0].pop("resources")
    pod = translate_pod(cri_spec, meta["name"], meta["namespace"], meta["uid"], node.args.work,
                        api, k.node)
    pod.update(spec=spec, annotations={}, name=meta["name"], namespace=meta["namespace"],
               uid=meta["uid"])
    pod["sid"], pod["sconf"] = k.run_sandbox(meta["name"], meta["namespace"], meta["uid"],
                                             "besteffort", False, {}, seccomp=pod["seccomp"])
    pod["alloc"] = {"env": env, "mounts": mounts, "devices": []}
    pod["attempt"] = 0
    node._create(pod)
    pod["pid"] = k.running_pid(f"pod {meta['name']}", pod["cid"])
    node.check_confined(pod, spec["spec"]["containers"][0]["image"])
    t = time.monotonic()

    def at_claim_settings():
        found = node.ctl.of_pod(meta["uid"])
        if not found:
            return None
        c = found[0]
        ok = prio_word(c) == "high" and int(c.get("memory_limit_bytes", 0)) == 512 << 20 and \
            int(c.get("latency_target_us", 0)) == 20000
        return c if ok else None
    try:
        c = wait_for("the DRA pod at orion-server with its claim's priority and limits",
                     at_claim_settings, 15, 0.1)
    except CheckFailed:
        raise CheckFailed(f"the DRA pod at orion-server: {node.ctl.of_pod(meta['uid'])}") from None
    log(f"{meta['name']}: client {c.get('client_id')}, priority {c.get('priority')} "
        f"({c.get('priority_source')}), memory limit {c.get('memory_limit_bytes')}, latency "
        f"target {c.get('latency_target_us')} us, registered {time.monotonic() - t:.2f} s after "
        f"its container was running; the pod has no orion/* annotation")
    with open(f"/proc/{pod['pid']}/maps") as f:
        if "liborion_interpose" not in f.read():
            raise CheckFailed(f"{meta['name']}: the interposer from the CDI spec is not loaded")

    node.remove_pod(pod)
    t = time.monotonic()
    for attempt in (1, 2):
        resp = dra.unprepare([(meta["namespace"], claim_uid, claim_name)])
        if claim_uid not in resp.claims or resp.claims[claim_uid].error:
            raise CheckFailed(f"NodeUnprepareResources #{attempt}: {resp}")
        if os.path.exists(cdi_path):
            raise CheckFailed(f"{cdi_path} is still there after NodeUnprepareResources")
    log(f"pod removed; NodeUnprepareResources twice ({time.monotonic() - t:.2f} s): no error, "
        f"the CDI spec is gone")

    # A hostile claim: the GPU's high device and a share in one claim (high priority on the GPU
    # of the share too) is refused at prepare, naming its devices; nothing is written for it.
    share = min(shares, key=lambda d: d["attributes"]["index"]["int"])
    mixed_name, mixed_uid = "mixed-dra-gpu", str(uuid.uuid4())
    mixed_pod = {"name": "mixed-dra-4kq8x", "uid": str(uuid.uuid4())}
    api.put_claim({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": mixed_name, "namespace": meta["namespace"], "uid": mixed_uid},
        "spec": {"devices": {"requests": [
            {"name": "high", "exactly": {"deviceClassName": "gpu-high.orion.io"}},
            {"name": "share", "exactly": {"deviceClassName": "gpu-share.orion.io"}}]}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "high", "driver": DRIVER, "pool": k.node, "device": device["name"]},
                {"request": "share", "driver": DRIVER, "pool": k.node, "device": share["name"]}]}},
            "reservedFor": [{"resource": "pods", "name": mixed_pod["name"],
                             "uid": mixed_pod["uid"]}]}})
    resp = dra.prepare([(meta["namespace"], mixed_uid, mixed_name)])
    error = resp.claims[mixed_uid].error if mixed_uid in resp.claims else "(no answer)"
    mixed_cdi = os.path.join(node.args.node_root, "var/run/cdi", f"{DRIVER}-claim_{mixed_uid}.json")
    if not error or device["name"] not in error or share["name"] not in error or \
            os.path.exists(mixed_cdi):
        raise CheckFailed(f"a claim mixing {device['name']} and {share['name']}: error "
                          f"{error!r}, CDI spec written: {os.path.exists(mixed_cdi)}")
    log(f"mixed claim refused at prepare: {error}")
    node.figures.append(
        f"DRA: plugin registered (GetInfo {info.type} {info.name}, "
        f"{'/'.join(info.supported_versions)}); ResourceSlice with {len(shares)} share and "
        f"{len(highs)} high devices; claim prepared over gRPC to {ids[0]}, its CDI edits applied "
        f"by the test kubelet (containerd 1.6 has no CDI); the pod, without annotations, "
        f"registered as high with 512Mi and 20 ms from the claim's config; unprepared twice, spec "
        f"gone; a claim mixing a high device and a share refused at prepare")
