"""The steps of the test kubelet (tools/cri/kubelet.py) on the node's pods: the chart's pods up,
sharing pods admitted and run, what the server names them, the plain pod left alone, metrics and
timelines naming pods, restarts of the server and of the agent, and what removing a pod frees
(its slot, its memory accounting). Each step prints its figures and raises CheckFailed with what
failed; node.figures collects one line per assertion for the summary."""
import os
import time

from admission import Webhook
from common import CheckFailed, log, step, wait_for
from observe import memory_by_gpu, scrape, trace_rows
from pods import Unfit
from translate import workload

TRAIN = ["/opt/orion-samples/orion-sample-train", "--seconds", "3600", "--kernels", "20",
         "--kernel-us", "1000"]
INFER = ["/opt/orion-samples/orion-sample-infer", "--rate", "200", "--requests", "100000000",
         "--kernel-us", "100"]
ALLOC_CHUNKS, ALLOC_CHUNK = 4, 64 << 20
ALLOC = ["/opt/orion-samples/orion-sample-alloc", "--chunk", f"{ALLOC_CHUNK >> 20}Mi",
         "--max", f"{ALLOC_CHUNKS * ALLOC_CHUNK >> 20}Mi", "--hold", "3600"]


def prio_word(client):
    p = str(client.get("priority", "")).upper()
    return "high" if "HIGH" in p else "best-effort"


def registered(node, keys):
    """{key: client} once every pod of `keys` is a client of the server, else None."""
    clients = node.ctl.clients()
    if clients is None:
        return None
    found = {}
    for key in keys:
        match = node.ctl.of_pod(node.pods[key]["uid"], clients)
        if not match:
            return None
        found[key] = match[0]
    return found


def chart_pods(node, docs, probe):
    """The DaemonSet's node pod, its device plugin registration, then the webhook's pod."""
    k, plugins = node.kubelet, node.plugins
    step("node pod from the chart (DaemonSet pod template -> CRI)")
    ds = workload(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    pod = node.start_chart_pod(ds, "-x7k2p", "burstable")
    log(f"pod spec: {', '.join(pod['fields'])} translated; "
        f"{', '.join(pod['scheduling'])} are the scheduler's (this node is chosen)")
    log("volumes: " + ", ".join(f"{n} ({v})" for n, v in pod["volumes"].items()) +
        "; plus the kubelet's service account volume and in-cluster environment")
    node.node_pod = pod
    t = time.monotonic()
    with plugins.cv:
        # Two resources, each its own endpoint: shares and high-priority slots.
        if not plugins.cv.wait_for(lambda: len(plugins.resources()) >= 2 and
                                   all(plugins.devices.get(r) for r in plugins.resources()), 20):
            raise CheckFailed("the agent did not register both device plugin resources with "
                              f"the test kubelet within 20 s (registered: {plugins.resources()})")
    for reg in plugins.registered:
        log(f"device plugin registered: resource {reg.resource_name}, endpoint {reg.endpoint}, "
            f"{len(plugins.devices[reg.resource_name])} devices "
            f"({time.monotonic() - t:.2f} s after start)")
    for c in pod["containers"]:
        t = time.monotonic()
        probe(k, c, 30)
        log(f"{c['name']}: ready ({time.monotonic() - t:.2f} s; agent /readyz needs the pods "
            f"synced from the API server to orion-server)")
    node.free = {r: [d.ID for d in devs if d.health == "Healthy"]
                 for r, devs in plugins.devices.items()}
    node.figures.append(f"node pod: {len(spec['containers'])} containers ready, each Seccomp 2 "
                        f"(seccompProfile RuntimeDefault), device plugin "
                        "registered " + " and ".join(f"{r} with {len(plugins.devices[r])} devices"
                                                     for r in plugins.resources()))

    step("webhook pod from the chart (Deployment pod template -> CRI)")
    dep = workload(docs, "Deployment", "webhook")
    wpod = node.start_chart_pod(dep, "-6d9f7c8b4-q4m2x", "burstable")
    node.webhook_pod = wpod
    for c in wpod["containers"]:
        t = time.monotonic()
        probe(k, c, 30)
        log(f"{c['name']}: ready ({time.monotonic() - t:.2f} s, HTTPS /readyz)")
    config = workload(docs, "MutatingWebhookConfiguration")
    node.webhook = Webhook(config, node.args.webhook_port)
    hook = node.webhook.hook
    log(f"MutatingWebhookConfiguration {config['metadata']['name']}: {hook['name']}, "
        f"https://{node.webhook.dns}{node.webhook.path} (TLS checked against its caBundle and "
        f"that name), failurePolicy {hook.get('failurePolicy')}, rules "
        f"{[r['operations'] for r in hook.get('rules', [])]}")
    wc = wpod["containers"][0]
    node.figures.append(f"webhook pod: uid {wc['run_as'][0]}, runAsNonRoot, Seccomp 2 "
                        f"(its seccompProfile RuntimeDefault), ready over HTTPS")


def sharing_pods(node):
    """Pods written with only the annotation, admitted by the webhook, given their shares by
    Allocate, and run by CRI with the runtime's default seccomp profile."""
    step("sharing pods: webhook admission -> API server -> Allocate -> CRI")
    image = node.node_pod["containers"][0]["image"]
    specs = {
        "infer": (node.sharing_pod_spec("infer-high-5f7d9", {"orion/priority": "high"},
                                        node.args.sample_image, INFER), True),
        "train": (node.sharing_pod_spec("train-be-8c2qz", {"orion/priority": "best-effort"},
                                        image, TRAIN), True),
        "alloc": (node.sharing_pod_spec("alloc-be-m7x2d", {"orion/priority": "best-effort",
                                                           "orion/memory-limit": "1Gi"},
                                        node.args.sample_image, ALLOC), True),
        "plain": (node.sharing_pod_spec("plain-cuda-4xw7t", {}, node.args.sample_image, TRAIN,
                                        sim=node.sim + "-plain"), False),
    }
    node.pods = {}
    resource = node.resource()
    # The plain pod runs its trainer on a simulated GPU of its own: on the shared one, work the
    # gate cannot hold would sit in front of every sharing pod's kernels.
    os.makedirs(node.sim + "-plain", exist_ok=True)
    os.chmod(node.sim + "-plain", 0o1777)
    for key, (spec, share) in specs.items():
        before = spec["spec"]["containers"][0].get("resources", {}).get("limits", {})
        if resource in before:
            raise CheckFailed(f"{spec['metadata']['name']}: the spec asks for {resource} itself")
        pod = node.start_sharing_pod(spec, share)
        node.check_confined(pod, spec["spec"]["containers"][0]["image"])
        node.pods[key] = pod
    with open(f"/proc/{node.pods['infer']['pid']}/cgroup") as f:
        log("cgroup of the high-priority pod's process (as the server reads it):\n  " +
            f.read().strip().replace("\n", "\n  "))
    calls = node.webhook.calls
    high = node.high_resource()
    for key, want in (("infer", high), ("train", resource), ("alloc", resource)):
        got = node.pods[key]["device_ids"]
        if list(got) != [want]:
            raise CheckFailed(f"{node.pods[key]['name']}: allocated {got}, expected one {want}")
    # One high-priority slot per GPU: a second high-priority pod on this one-GPU node does not
    # fit (the scheduler's resource fit, which the test kubelet plays), and nothing of it runs.
    second = node.sharing_pod_spec("infer-high-2-k8d3w", {"orion/priority": "high"},
                                   node.args.sample_image, INFER)
    try:
        node.start_sharing_pod(second, True)
        raise CheckFailed(f"a second high-priority pod was placed beside "
                          f"{node.pods['infer']['name']} on the node's one GPU")
    except Unfit as e:
        if f"Insufficient {high}" not in str(e):
            raise
        log(f"second high-priority pod refused by resource fit: {e}")
    node.figures.append(f"one {high} per GPU: a second high-priority pod is refused by the "
                        f"scheduler's resource fit (Insufficient {high}), nothing of it started")
    # A pod outside highPriority.namespaces (the chart's: ml) asking for the high slot itself
    # gets a share instead, with a warning, and never both.
    outsider = node.sharing_pod_spec("grab-high-q2m9d", {"orion/priority": "best-effort"},
                                     node.args.sample_image, TRAIN, limits={high: "1"})
    outsider["metadata"]["namespace"] = "batch"
    admitted, _, warnings = node.webhook.admit(outsider)
    limits = admitted["spec"]["containers"][0].get("resources", {}).get("limits", {})
    if high in limits or limits.get(resource) != "1" or not warnings:
        raise CheckFailed(f"a pod of namespace batch asking for {high}: limits {limits}, "
                          f"warnings {warnings}")
    log(f"{high} asked for outside the allowed namespaces: limits {limits}, warning {warnings[0]!r}")
    node.figures.append(f"{high} asked for by a pod of a namespace not allowed high priority: "
                        f"turned into {resource}: \"1\" with an admission warning")
    node.figures.append(
        f"webhook admission: {len(calls)} AdmissionReviews over HTTPS "
        f"({min(calls) * 1e3:.1f} to {max(calls) * 1e3:.1f} ms); the 3 annotated pods came back "
        f"with limits {high}: \"1\" (the high-priority one) and {resource}: \"1\" (JSON patch "
        f"applied), the plain pod unchanged")
    node.figures.append("seccomp RuntimeDefault: Seccomp 2 in /proc/PID/status of all 4 sharing "
                        "pods (uid 1000, CapEff 0, NoNewPrivs 1, read-only root)")


def named_by_server(node):
    step("the server names the sharing pods by pod UID and container id")
    keys = ("infer", "train", "alloc")
    found = wait_for("the sharing pods in orion-ctl clients", lambda: registered(node, keys),
                     30, 0.2)
    for key in keys:
        p, c = node.pods[key], found[key]
        cid = c.get("container_id", "")
        pid = int(c.get("host_pid") or 0)
        log(f"{p['name']}: client {c.get('client_id')} pod {c.get('namespace')}/{c.get('pod')} "
            f"uid {p['uid']}, container {cid[:12]}, host pid {pid}, priority "
            f"{c.get('priority')} ({c.get('priority_source')})")
        if cid != p["cid"]:
            raise CheckFailed(f"{p['name']}: server names container {cid}, CRI says {p['cid']}")
        if pid != p["pid"]:
            raise CheckFailed(f"{p['name']}: server names host pid {pid}, CRI says {p['pid']}")
        if c.get("pod") != p["name"] or c.get("namespace") != p["namespace"]:
            raise CheckFailed(f"{p['name']}: server names pod {c.get('namespace')}/{c.get('pod')}")
        if prio_word(c) != p["annotations"]["orion/priority"]:
            raise CheckFailed(f"{p['name']}: priority {c.get('priority')}, the pod's annotation "
                              f"says {p['annotations']['orion/priority']}")
    last = max(node.pods[k]["started"] for k in keys)
    log(f"all registered and named by the server {time.monotonic() - last:.2f} s after the "
        f"last one was seen running (at most)")
    node.found = found
    node.figures.append("server names infer (high), train and alloc (best-effort) by pod "
                        "UID, namespace/name, container id and host pid, priority from the "
                        "annotation")


def plain_untouched(node):
    step("the pod without orion.io/gpu runs untouched")
    plain = node.pods["plain"]
    with open(f"/proc/{plain['pid']}/maps") as f:
        maps = f.read()
    if "liborion_interpose" in maps:
        raise CheckFailed(f"{plain['name']}: liborion_interpose is loaded")
    if "libcuda.so.1" not in maps:
        raise CheckFailed(f"{plain['name']}: libcuda (the test double) is not loaded")
    with open(f"/proc/{plain['pid']}/environ", "rb") as f:
        environ = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    given = sorted(k.decode() for k in environ if k in (b"LD_PRELOAD", b"ORION_SOCKET",
                                                         b"NVTX_INJECTION64_PATH"))
    if given:
        raise CheckFailed(f"{plain['name']}: its environment has {given}")
    if node.ctl.of_pod(plain["uid"]):
        raise CheckFailed(f"{plain['name']}: the server lists it as a client")
    log(f"{plain['name']}: pid {plain['pid']} maps libcuda.so.1 (double), no "
        f"liborion_interpose, no LD_PRELOAD/ORION_SOCKET; not a client of the server")
    for key in ("infer", "train", "alloc"):
        p = node.pods[key]
        with open(f"/proc/{p['pid']}/maps") as f:
            if "liborion_interpose" not in f.read():
                raise CheckFailed(f"{p['name']}: interposer not loaded")


def metrics_and_timeline(node):
    """/metrics labels and an exported timeline name the pods (namespace and name)."""
    step("/metrics and an exported timeline name the pods")
    keys = ("infer", "train", "alloc")
    port = node.args.metrics_port

    def labelled():
        m = scrape(port)
        series = {}
        for key in keys:
            p = node.pods[key]
            series[key] = [(fam, labels) for fam, samples in m.items() for labels, _ in samples
                           if labels.get("pod") == p["name"] and
                           labels.get("namespace") == p["namespace"]]
            if not any(f == "orion_client_kernels_launched_total" for f, _ in series[key]) and \
                    key != "alloc":
                return None
            if not any(f == "orion_client_memory_used_bytes" for f, _ in series[key]):
                return None
        return series
    series = wait_for(f"pod-labelled series on :{port}/metrics", labelled, 10, 0.2)
    for key in keys:
        fams = sorted({f for f, _ in series[key]})
        labels = [lab for f, lab in series[key] if f == "orion_client_memory_used_bytes"][0]
        log(f"{node.pods[key]['name']}: {len(series[key])} series in {len(fams)} families, e.g. "
            f"orion_client_memory_used_bytes{{{', '.join(f'{a}={b!r}' for a, b in sorted(labels.items()))}}}")
    path = os.path.join(node.args.work, "timeline.json")
    out = node.ctl.run("timeline", "--last-ms", "5000", "--trace", path)
    rows = trace_rows(path)
    log(out.stdout.strip())
    spans = {}
    for key in ("infer", "train"):
        p = node.pods[key]
        want = f"{p['namespace']}/{p['name']} "
        spans[key] = sum(n for row, n in rows.items() if row.startswith(want))
        log(f"timeline rows of {p['namespace']}/{p['name']}: "
            f"{[row for row in rows if row.startswith(want)]}, {spans[key]} spans")
        if spans[key] == 0:
            raise CheckFailed(f"the exported timeline has no spans on a row named {want!r}: "
                              f"rows {sorted(rows)}")
    node.figures.append(
        f"/metrics: every client series carries pod and namespace ({len(series['infer'])} series "
        f"for ml/infer-high-5f7d9); timeline export: {spans['infer']} spans on ml/infer-high-5f7d9 "
        f"rows, {spans['train']} on ml/train-be-8c2qz rows in 5 s")


def server_restart(node):
    step("SIGKILL of the server container, then the kubelet's restart")
    keys = ("infer", "train")
    took, started = node.restart_container(node.node_pod, "server", kill=True)
    t_reg = wait_for("the sharing pods to register with the restarted server",
                     lambda: registered(node, keys), 10, 0.02)
    again = time.monotonic() - started
    log(f"restarted server (CreateContainer+StartContainer {took:.2f} s): the sharing pods "
        f"registered again {again:.2f} s after StartContainer returned")
    for key in keys:
        p = node.pods[key]
        st, pid = node.kubelet.status(p["cid"])
        if st.state != node.kubelet.pb.CONTAINER_RUNNING or pid != p["pid"]:
            raise CheckFailed(f"{p['name']}: not running the same process after the restart")
    # The new server knows no pods: the agent finds that out (it asks every 250 ms how many
    # pods the server knows) and sends them all again, so the annotated priorities come back.
    want = {k: node.pods[k]["annotations"]["orion/priority"] for k in keys}

    def as_annotated():
        now = registered(node, keys)
        return now if now and all(prio_word(now[k]) == want[k] for k in keys) else None
    now = wait_for("the restarted server to have the pods' annotated priorities", as_annotated,
                   5, 0.02)
    prio_after = time.monotonic() - started
    node.after_server_restart = {node.pods[k]["name"]: f"{prio_word(now[k])} "
                                 f"({now[k].get('priority_source')})" for k in keys}
    log(f"the sharing pods kept running (same host pids); {prio_after:.2f} s after StartContainer "
        f"the server has them as {node.after_server_restart} (annotations: "
        f"{ {node.pods[k]['name']: want[k] for k in keys} })")
    launched = still_launching(node, ("infer", "train"), t_reg)
    if again > 2.0:
        raise CheckFailed(f"re-registration took {again:.2f} s (limit 2 s)")
    if prio_after > 2.0:
        raise CheckFailed(f"the annotated priorities came back {prio_after:.2f} s after the "
                          f"server's restart (limit 2 s)")
    node.found = t_reg
    node.figures.append(f"server SIGKILL + restart: re-registered {again:.2f} s after "
                        f"StartContainer (limit 2 s), annotated priorities back after "
                        f"{prio_after:.2f} s: {node.after_server_restart}; kernels in the next "
                        f"0.5 s: {launched}")


def still_launching(node, keys, before, window=0.5, limit=0.5):
    """Kernels each pod launched `window` s after `before` (clients); if one launched none, it
    is given until `limit` s. Returns {pod name: kernels in the window}."""
    base = {k: int(before[k].get("kernels_launched", 0)) for k in keys}
    t0 = time.monotonic()
    time.sleep(window)
    now = registered(node, keys) or {}
    launched = {node.pods[k]["name"]: int(now.get(k, {}).get("kernels_launched", 0)) - base[k]
                for k in keys}
    log(f"kernels launched in the next {window:g} s: {launched}")
    while any(v <= 0 for v in launched.values()):
        if time.monotonic() - t0 > limit:
            raise CheckFailed(f"a sharing pod launched no kernels in {limit:g} s: {launched}")
        time.sleep(0.1)
        now = registered(node, keys) or {}
        launched = {node.pods[k]["name"]: int(now.get(k, {}).get("kernels_launched", 0)) -
                    base[k] for k in keys}
    if time.monotonic() - t0 > window + 0.05:
        log(f"all launching {time.monotonic() - t0:.2f} s after: {launched}")
    return launched


def agent_restart(node, probe):
    """The agent container killed and restarted: the device plugin registers again with the
    kubelet, running pods keep their allocations, priorities and registrations."""
    step("SIGKILL of the agent container, then the kubelet's restart")
    plugins = node.plugins
    keys = ("infer", "train")
    before = registered(node, keys)
    if before is None:
        raise CheckFailed("the sharing pods are not all registered before the agent's restart")
    n_reg = len(plugins.registered)
    took, started = node.restart_container(node.node_pod, "agent", kill=True)
    with plugins.cv:
        # Both resources again, each with a ListAndWatch answer.
        if not plugins.cv.wait_for(lambda: len(plugins.registered) >= n_reg + 2 and
                                   all(plugins.streams[n_reg:n_reg + 2]), 20):
            raise CheckFailed("the restarted agent did not register its device plugin again "
                              "(Register and a ListAndWatch answer) within 20 s")
    again = time.monotonic() - started
    reg = plugins.registered[-1]
    log(f"restarted agent (CreateContainer+StartContainer {took:.2f} s): device plugin "
        f"registered again {again:.2f} s after StartContainer returned (registration "
        f"{len(plugins.registered)}, resource {reg.resource_name}, "
        f"{len(plugins.devices[reg.resource_name])} devices)")
    agent = [c for c in node.node_pod["containers"] if c["name"] == "agent"][0]
    t = time.monotonic()
    probe(node.kubelet, agent, 30)
    log(f"agent: ready again ({time.monotonic() - t:.2f} s)")

    def as_annotated():
        now = registered(node, keys)
        return now if now and all(prio_word(now[k]) == node.pods[k]["annotations"][
            "orion/priority"] and now[k].get("priority_source") == "pod-annotation"
            for k in keys) else None
    try:
        after = wait_for("the annotations' priorities after the agent's restart", as_annotated,
                         5, 0.05)
    except CheckFailed:
        raise CheckFailed(f"priorities not as annotated 5 s after the agent's restart: "
                          f"{registered(node, keys)}") from None
    settled = time.monotonic() - started
    for key in keys:
        p, b, a = node.pods[key], before[key], after[key]
        if a.get("client_id") != b.get("client_id") or a.get("paused"):
            raise CheckFailed(f"{p['name']}: client {b.get('client_id')} before the agent's "
                              f"restart, {a.get('client_id')} paused={a.get('paused', False)} "
                              f"after")
        for cp, host, _ in p["alloc"]["mounts"]:
            if not os.path.exists(host):
                raise CheckFailed(f"{p['name']}: its allocated mount {host} -> {cp} is gone "
                                  f"after the agent's restart")
    log(f"the sharing pods keep their clients and allocated mounts; priorities as annotated "
        f"(pod-annotation) {settled:.2f} s after StartContainer: "
        f"{ {node.pods[k]['name']: prio_word(after[k]) for k in keys} }")
    launched = still_launching(node, ("infer", "train"), after, window=2.0, limit=10)
    node.figures.append(f"agent SIGKILL + restart: device plugin registered again {again:.2f} s "
                        f"after StartContainer; pods kept client ids and mounts, priorities as "
                        f"annotated after {settled:.2f} s; kernels in the next 2 s: {launched}")


def slot_freed(node):
    step("removing a pod frees its slot")
    p = node.pods["train"]
    found = wait_for("the sharing pods in orion-ctl clients",
                     lambda: registered(node, ("infer", "train")), 10, 0.1)
    slot = int(found["train"].get("slot", 0))
    others = {int(c.get("slot", 0)) for k, c in found.items() if k != "train"}
    t = time.monotonic()
    node.remove_pod(p)
    wait_for("the removed pod to leave the server's clients",
             lambda: node.ctl.clients() is not None and not node.ctl.of_pod(p["uid"]), 10, 0.05)
    gone_s = time.monotonic() - t
    if os.path.exists(f"/proc/{p['pid']}"):
        raise CheckFailed(f"{p['name']}: its process {p['pid']} is still there after "
                          f"RemovePodSandbox")
    log(f"{p['name']} (server slot {slot}, device {p['device_ids']}): StopPodSandbox+"
        f"RemovePodSandbox, its process gone and the server dropped it {gone_s:.2f} s later")
    # The freed share and slot go to the next pod: a new best-effort pod, admitted and
    # allocated the same way (after the agent's restart: the new agent's Allocate).
    spec = node.sharing_pod_spec("train-be-2-q9m4d", {"orion/priority": "best-effort"},
                                 p["containers"][0]["image"], TRAIN)
    nxt = node.start_sharing_pod(spec, True)
    t = time.monotonic()
    c = wait_for("the next pod to register", lambda: node.ctl.of_pod(nxt["uid"]), 15, 0.05)[0]
    new_slot = int(c.get("slot", 0))
    log(f"{nxt['name']}: Allocate got device {nxt['device_ids']}, registered in "
        f"{time.monotonic() - t:.2f} s with server slot {new_slot} (slots in use by others: "
        f"{sorted(others)})")
    if new_slot != slot or nxt["device_ids"] != p["device_ids"]:
        raise CheckFailed(f"the next pod got slot {new_slot} / device {nxt['device_ids']}, "
                          f"not the freed slot {slot} / device {p['device_ids']}")
    if nxt["alloc"]["mounts"] != p["alloc"]["mounts"]:
        raise CheckFailed(f"the restarted agent's Allocate mounts {nxt['alloc']['mounts']}, "
                          f"before its restart {p['alloc']['mounts']}")
    node.pods["train"] = nxt  # the trainer from now on
    node.figures.append(f"pod removed: the server dropped it {gone_s:.2f} s after "
                        f"RemovePodSandbox; the next pod got its device and slot {slot} (the "
                        f"restarted agent's Allocate: the same interposer folder)")


def memory_freed(node):
    """The allocating pod's bytes leave the per-GPU total when it is removed."""
    step("removing a pod frees its memory accounting")
    p = node.pods["alloc"]
    want = ALLOC_CHUNKS * ALLOC_CHUNK

    def holding():
        c = node.ctl.of_pod(p["uid"])
        return c[0] if c and int(c[0].get("memory_used_bytes", 0)) == want else None
    c = wait_for(f"{p['name']} to report {want >> 20} MiB in use", holding, 15, 0.1)
    gpu = str(c.get("gpu", 0))
    limit = int(c.get("memory_limit_bytes", 0))
    log(f"{p['name']}: client {c.get('client_id')} on GPU {gpu}, memory_used_bytes "
        f"{int(c['memory_used_bytes']) >> 20} MiB, memory_limit_bytes {limit >> 20} MiB "
        f"(orion/memory-limit: 1Gi)")
    if limit != 1 << 30:
        raise CheckFailed(f"{p['name']}: memory limit {limit}, its annotation says 1Gi")

    def totals():
        clients = node.ctl.clients() or []
        by_ctl = sum(int(x.get("memory_used_bytes", 0)) for x in clients
                     if str(x.get("gpu", 0)) == gpu)
        return by_ctl, memory_by_gpu(scrape(node.args.metrics_port)).get(gpu, 0)
    ctl_before, metrics_before = totals()
    t = time.monotonic()
    node.remove_pod(p)
    wait_for("the removed pod to leave the server's clients",
             lambda: node.ctl.clients() is not None and not node.ctl.of_pod(p["uid"]), 10, 0.05)

    def dropped():
        ctl_after, metrics_after = totals()
        return (ctl_after, metrics_after) if ctl_before - ctl_after == want and \
            metrics_before - metrics_after == want else None
    try:
        ctl_after, metrics_after = wait_for("the GPU's memory total to drop by the pod's bytes",
                                            dropped, 5, 0.1)
    except CheckFailed:
        ctl_after, metrics_after = totals()
        raise CheckFailed(f"GPU {gpu} memory in use: orion-ctl {ctl_before} -> {ctl_after}, "
                          f"/metrics sum by gpu {metrics_before:.0f} -> {metrics_after:.0f}; the "
                          f"removed pod held {want}") from None
    left = [lab for lab, _ in scrape(node.args.metrics_port).get(
        "orion_client_memory_used_bytes", []) if lab.get("pod") == p["name"]]
    if left:
        raise CheckFailed(f"/metrics still has memory series of the removed pod: {left}")
    log(f"GPU {gpu} memory in use: orion-ctl clients {ctl_before >> 20} -> {ctl_after >> 20} MiB, "
        f"/metrics sum by (gpu) {int(metrics_before) >> 20} -> {int(metrics_after) >> 20} MiB, "
        f"{time.monotonic() - t:.2f} s after RemovePodSandbox; no series of the pod left")
    del node.pods["alloc"]
    node.figures.append(f"pod removed: GPU {gpu} memory total {int(metrics_before) >> 20} -> "
                        f"{int(metrics_after) >> 20} MiB (its {want >> 20} MiB left, /metrics and "
                        f"orion-ctl agree)")


GPU0 = "GPU-6f72696f-6e2d-7369-6d00-000000000000"
GPU1 = "GPU-6f72696f-6e2d-7369-6d00-000000000001"


def placement_two_gpus(node, probe):
    """The node gets a second GPU (the CUDA driver test double's device 1: the agent's --gpus and
    the server's gpus, both containers restarted by the kubelet); 2 high-priority and 2
    best-effort pods are admitted and placed by the device plugin, their processes on the GPU
    their Allocate answer names (the double shows a process only the GPUs of its
    NVIDIA_VISIBLE_DEVICES, as the NVIDIA runtime does). One high-priority pod lands on each GPU,
    the server counts one high-priority pod per GPU, and a third is refused by the resource fit."""
    step("placement on 2 GPUs: one high-priority pod per GPU, a third refused by resource fit")
    plugins = node.plugins
    for p in list(node.pods.values()):
        node.remove_pod(p)
    config = os.path.join(node.args.work, "pods", node.node_pod["uid"], "volumes", "config",
                          "server.yaml")
    with open(config) as f:
        text = f.read()
    if f'gpus: ["{GPU0}"]' not in text:
        raise CheckFailed(f"{config}: no gpus: [\"{GPU0}\"] to add the second GPU to")
    with open(config, "w") as f:
        f.write(text.replace(f'gpus: ["{GPU0}"]', f'gpus: ["{GPU0}","{GPU1}"]'))
    agent = [c for c in node.node_pod["containers"] if c["name"] == "agent"][0]
    if f"--gpus={GPU0}" not in agent["args"]:
        raise CheckFailed(f"agent args {agent['args']} lack --gpus={GPU0}")
    agent["args"] = [f"--gpus={GPU0},{GPU1}" if a == f"--gpus={GPU0}" else a
                     for a in agent["args"]]
    n_reg = len(plugins.registered)
    node.restart_container(node.node_pod, "server", kill=True)
    node.restart_container(node.node_pod, "agent", kill=True)
    with plugins.cv:
        if not plugins.cv.wait_for(lambda: len(plugins.registered) >= n_reg + 2 and
                                   all(plugins.streams[n_reg:n_reg + 2]), 20):
            raise CheckFailed("the agent with 2 GPUs did not register both resources again")
    for c in node.node_pod["containers"]:
        probe(node.kubelet, c, 30)
    share, high = node.resource(), node.high_resource()
    counts = {r: len(plugins.devices[r]) for r in (share, high)}
    if counts != {share: 16, high: 2}:  # the chart's sharesPerGpu 8 and highPriorityPerGpu 1
        raise CheckFailed(f"with 2 GPUs the plugin lists {counts}, expected 16 shares, 2 slots")
    node.free = {r: [d.ID for d in devs if d.health == "Healthy"]
                 for r, devs in plugins.devices.items()}
    log(f"node with 2 GPUs: {counts[share]} x {share}, {counts[high]} x {high}")
    image = node.node_pod["containers"][0]["image"]
    placed = {}
    for name, prio, command in (("infer-a-h7k2p", "high", INFER), ("train-a-b6x9q", "best-effort", TRAIN),
                                ("infer-b-n3c8d", "high", INFER), ("train-b-r4t1m", "best-effort", TRAIN)):
        spec = node.sharing_pod_spec(name, {"orion/priority": prio}, image, command)
        pod = node.start_sharing_pod(spec, True)
        node.pods[name] = pod
        gpu = pod["alloc"]["env"].get("NVIDIA_VISIBLE_DEVICES")
        placed[name] = (prio, gpu, list(pod["device_ids"]))
        log(f"{name} ({prio}): {pod['device_ids']} -> GPU {gpu}")
    highs = [gpu for prio, gpu, _ in placed.values() if prio == "high"]
    if sorted(highs) != sorted([GPU0, GPU1]):
        raise CheckFailed(f"the two high-priority pods are on GPUs {highs}, not one on each")
    for name, (prio, gpu, ids) in placed.items():
        want = high if prio == "high" else share
        if ids != [want]:
            raise CheckFailed(f"{name} ({prio}) was allocated {ids}, not one {want}")
    # The server sees each process on the GPU its Allocate answer names.
    uuids = {}

    def on_gpus():
        clients = node.ctl.clients()
        gpus = {int(g.get("index", 0)): g.get("uuid") for g in node.ctl.gpus()}
        for name in placed:
            mine = node.ctl.of_pod(node.pods[name]["uid"], clients)
            if not mine:
                return None
            uuids[name] = gpus.get(int(mine[0].get("gpu", 0)))
        return uuids
    wait_for("the 4 pods registered with the server", on_gpus, 15, 0.1)
    for name, (prio, gpu, _) in placed.items():
        if uuids[name] != gpu:
            raise CheckFailed(f"{name}: the server has it on {uuids[name]}, its Allocate said {gpu}")

    def one_each():
        g = node.ctl.gpus()
        return g if len(g) == 2 and all(int(x.get("high_priority_pods", 0)) == 1 and
                                        not x.get("high_priority_overcommitted") for x in g) else None
    g = wait_for("one high-priority pod per GPU in orion-ctl gpus", one_each, 10, 0.1)
    log("orion-ctl gpus: " + "; ".join(
        f"{x.get('uuid')}: {x.get('clients')} clients, {x.get('high_priority_pods')} "
        f"high-priority pod(s) of {x.get('high_priority_pods_allowed')} allowed" for x in g))
    third = node.sharing_pod_spec("infer-c-w2v5z", {"orion/priority": "high"}, image, INFER)
    try:
        node.start_sharing_pod(third, True)
        raise CheckFailed("a third high-priority pod was placed on the 2-GPU node")
    except Unfit as e:
        if f"Insufficient {high}" not in str(e):
            raise
        log(f"third high-priority pod refused by resource fit: {e}")
    be = {name: gpu for name, (prio, gpu, _) in placed.items() if prio != "high"}
    node.figures.append(
        f"2 GPUs: the high-priority pods on {GPU0[-2:]} and {GPU1[-2:]} (one each, the server "
        f"counts 1 high-priority pod per GPU), best-effort on "
        f"{', '.join(g[-2:] for g in be.values())} (idlest GPU, else spread); a third "
        f"high-priority pod refused: Insufficient {high}")
    two_ranks(node, image, share)


def two_ranks(node, image, share):
    """A best-effort job of 2 ranks (as torchrun --nproc_per_node=2 starts them: one process per
    GPU, rank r on cuda:r) asks for orion.io/gpu: 2 in its one container: one share on each GPU,
    NVIDIA_VISIBLE_DEVICES listing both once in the node's order, and the server has rank 0 on
    GPU 0 and rank 1 on GPU 1, the GPUs the container sees (the double numbers the container's
    devices in the order of its NVIDIA_VISIBLE_DEVICES)."""
    step("a pod of 2 ranks: orion.io/gpu: 2, one share on each GPU")
    rank = " ".join(TRAIN)
    command = ["/bin/sh", "-c", f"{rank} --device 0 & {rank} --device 1 & wait"]
    spec = node.sharing_pod_spec("ddp-a-k5m2x", {"orion/priority": "best-effort"}, image, command,
                                 limits={share: "2"})
    pod = node.start_sharing_pod(spec, True)
    node.pods["ddp"] = pod
    ids = pod["device_ids"].get(share, [])
    gpus = [i.rsplit("::", 1)[0] for i in ids]
    visible = pod["alloc"]["env"].get("NVIDIA_VISIBLE_DEVICES")
    log(f"{pod['name']}: {share} {ids} -> NVIDIA_VISIBLE_DEVICES={visible}")
    if len(ids) != 2 or sorted(gpus) != sorted([GPU0, GPU1]):
        raise CheckFailed(f"{pod['name']} asked for {share}: 2 and was allocated {ids}, not one "
                          f"share on each of {GPU0} and {GPU1}")
    if visible != f"{GPU0},{GPU1}":
        raise CheckFailed(f"{pod['name']}: NVIDIA_VISIBLE_DEVICES={visible}, expected "
                          f"{GPU0},{GPU1} (each GPU once, in the node's order)")

    def both_ranks():
        clients = node.ctl.of_pod(pod["uid"], node.ctl.clients())
        if not clients or len(clients) < 2:
            return None
        by_index = {int(g.get("index", 0)): g.get("uuid") for g in node.ctl.gpus()}
        found = {}
        for c in clients:
            found.setdefault(by_index.get(int(c.get("gpu", 0))), []).append(c.get("host_pid"))
        return found
    uuids = wait_for(f"both ranks of {pod['name']} registered with the server", both_ranks, 15,
                     0.1)
    if sorted(uuids) != sorted([GPU0, GPU1]) or any(len(p) != 1 for p in uuids.values()):
        raise CheckFailed(f"{pod['name']}: the server has its ranks on {uuids}, expected one on "
                          f"each of {GPU0} and {GPU1}")
    log(f"{pod['name']}: the server has one rank on each GPU: "
        + "; ".join(f"{g}: pid {p[0]}" for g, p in sorted(uuids.items())))
    node.figures.append(f"a pod of 2 ranks (orion.io/gpu: 2): one share on each GPU, "
                        f"NVIDIA_VISIBLE_DEVICES {GPU0[-2:]},{GPU1[-2:]}, the server has one rank "
                        f"on each")
