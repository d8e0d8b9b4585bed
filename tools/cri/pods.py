"""The node as the test kubelet (tools/cri/kubelet.py) runs it: the chart's pods (the DaemonSet's
node pod, the webhook Deployment's pod) translated into CRI calls, and sharing pods made the way
they are in a cluster: a pod spec that carries only the orion/priority annotation is admitted
through the chart's webhook (its JSON patch applied), stored in the test API server, and run with
what the device plugin's Allocate answers for each container that asks for one of its resources
(orion.io/gpu shares, orion.io/gpu-high slots). Before that the test kubelet plays the
scheduler's resource fit: a pod asking for more of a resource than is free is refused (Unfit)."""
import os
import signal
import time
import uuid

from common import CheckFailed, log, tail, wait_for
from kube_doubles import pod_object
from translate import quantity, translate_pod


class Unfit(CheckFailed):
    """The scheduler's resource fit refused the pod (the test kubelet plays it)."""


SHARING_NAMESPACE = "ml"


def proc_status(pid):
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}


class Node:
    def __init__(self, args, kubelet, api, plugins, ctl, objects):
        self.args, self.kubelet, self.api, self.plugins, self.ctl = args, kubelet, api, plugins, ctl
        self.objects = objects
        self.webhook = None
        self.figures = []  # one line per assertion, for the summary
        self.free = {}  # resource -> the kubelet's bookkeeping of unallocated device IDs
        self.sim = os.path.join(args.work, "sim")
        os.makedirs(self.sim, exist_ok=True)
        os.chmod(self.sim, 0o1777)

    # -- the chart's pods ----------------------------------------------------------------------
    def start_chart_pod(self, workload, suffix, qos):
        """Runs the pod template of a rendered DaemonSet or Deployment; returns the pod."""
        k = self.kubelet
        tmpl = workload["spec"]["template"]
        name = workload["metadata"]["name"] + suffix
        namespace = workload["metadata"].get("namespace", "default")
        pod = translate_pod(tmpl["spec"], name, namespace, str(uuid.uuid4()), self.args.work,
                            self.api, k.node, self.objects)
        pod["kind"] = workload["kind"]
        self.api.add_pod(pod_object(name, namespace, pod["uid"], k.node, {},
                                    [{"name": c["name"]} for c in pod["containers"]]))
        for c in pod["containers"]:
            image = k.image_present(c["image"])
            log(f"image {c['image']} present: {image.id[:19]}, {image.size >> 20} MiB")
        pod["sid"], pod["sconf"] = k.run_sandbox(name, namespace, pod["uid"], qos,
                                                 pod["host_pid"], {}, pod["runtime_handler"],
                                                 seccomp=pod["seccomp"])
        pod["cids"], pod["pids"], pod["attempts"] = {}, {}, {}
        for c in pod["containers"]:
            pod["cids"][c["name"]] = k.create_start(pod["sid"], pod["sconf"], c)
            pod["attempts"][c["name"]] = 0
            pid = k.running_pid(f"{name} container {c['name']}", pod["cids"][c["name"]])
            pod["pids"][c["name"]] = pid
            st = proc_status(pid)
            log(f"{c['name']}: container {pod['cids'][c['name']][:12]} host pid {pid}, "
                f"uid {os.stat(f'/proc/{pid}').st_uid}, readOnlyRootFilesystem {c['ro_root']}, "
                f"capabilities dropped {c['drop']}, Seccomp {st.get('Seccomp')} "
                f"(seccompProfile {c['seccomp'] or 'unset'})")
            if c["seccomp"] == "RuntimeDefault" and st.get("Seccomp") != "2":
                raise CheckFailed(f"{name} {c['name']}: seccompProfile RuntimeDefault, but "
                                  f"Seccomp is {st.get('Seccomp')} in /proc/{pid}/status")
            if c["run_as_non_root"] and os.stat(f"/proc/{pid}").st_uid == 0:
                raise CheckFailed(f"{name} {c['name']}: runAsNonRoot, but it runs as root")
        return pod

    def restart_container(self, pod, name, kill=True):
        """SIGKILL of a chart pod's container, then the kubelet's restart (a new container of
        the next attempt). Returns the seconds CreateContainer+StartContainer took and the
        monotonic time StartContainer returned."""
        k, pb = self.kubelet, self.kubelet.pb
        cid = pod["cids"][name]
        _, pid = k.status(cid)
        if kill:
            os.kill(pid, signal.SIGKILL)
        t = time.monotonic()
        wait_for(f"the {name} container to exit",
                 lambda: k.status(cid)[0].state == pb.CONTAINER_EXITED, 10)
        st, _ = k.status(cid)
        log(f"{name} container exited: code {st.exit_code}, reason {st.reason} "
            f"({time.monotonic() - t:.2f} s)")
        k.cri("RemoveContainer", k.rt, pb.RemoveContainerRequest(container_id=cid))
        c = [x for x in pod["containers"] if x["name"] == name][0]
        pod["attempts"][name] += 1
        t = time.monotonic()
        pod["cids"][name] = k.create_start(pod["sid"], pod["sconf"], c,
                                           attempt=pod["attempts"][name])
        started = time.monotonic()
        pod["pids"][name] = k.running_pid(f"{pod['name']} container {name}", pod["cids"][name])
        return started - t, started

    # -- sharing pods -------------------------------------------------------------------------
    def sharing_pod_spec(self, name, annotations, image, command, limits=None, extra_mounts=(),
                         sim=None):
        """A pod as its owner writes it: uid 1000, read-only root, no capabilities, no privilege
        escalation, the runtime's default seccomp profile; the samples and the CUDA driver test
        double from the host (its simulated GPU's state in `sim`, default the shared one). It
        asks for no share itself unless `limits` says so."""
        sim = sim or self.sim
        mounts = [("samples", "/opt/orion-samples", os.path.join(self.args.build, "samples")),
                  ("cuda-double", "/opt/cuda-double",
                   os.path.join(self.args.build, "tests/cuda_double/lib"))]
        mounts += list(extra_mounts)
        container = {
            "name": "main", "image": image, "command": command,
            "env": [{"name": "LD_LIBRARY_PATH", "value": "/opt/cuda-double"},
                    {"name": "ORION_SIM_DIR", "value": "/var/run/orion-sim"}],
            "securityContext": {"allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": v, "mountPath": p, "readOnly": True} for v, p, _ in mounts] +
                            [{"name": "sim", "mountPath": "/var/run/orion-sim"}]}
        if limits:
            container["resources"] = {"limits": dict(limits)}
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": SHARING_NAMESPACE, "uid": str(uuid.uuid4()),
                         "annotations": dict(annotations), "labels": {"app": name.rsplit("-", 1)[0]}},
            "spec": {
                "automountServiceAccountToken": False,
                "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container],
                "volumes": [{"name": v, "hostPath": {"path": h, "type": "Directory"}}
                            for v, _, h in mounts] +
                           [{"name": "sim", "hostPath": {"path": sim, "type": "Directory"}}]}}

    def admit(self, spec):
        """The webhook's answer applied: the pod as the API server stores it."""
        admitted, ops, warnings = self.webhook.admit(spec)
        name = spec["metadata"]["name"]
        asked = {c["name"]: {r: v for r, v in c.get("resources", {}).get("limits", {}).items()
                             if r in self.plugins.resources()}
                 for c in admitted["spec"]["containers"]}
        log(f"{name}: webhook {'patched ' + str(len(ops)) + ' op(s): ' if ops else 'no patch'}"
            f"{', '.join(o['op'] + ' ' + o['path'] for o in ops)}; device-plugin limits {asked}"
            f"{'; warnings ' + str(warnings) if warnings else ''}")
        return admitted, ops

    def resource(self):
        """The share resource (orion.io/gpu): the agent registers it first."""
        return self.plugins.resources()[0]

    def high_resource(self):
        """The high-priority slot resource (orion.io/gpu-high), registered second."""
        return self.plugins.resources()[1]

    def start_sharing_pod(self, spec, want_share, runs=True):
        """Admission, the API server's record, Allocate per container asking for the resource,
        then CRI. want_share: whether the admitted pod must ask for the resource; runs: wait
        for its process (else the caller waits for whatever it expects)."""
        k = self.kubelet
        resources = self.plugins.resources()
        admitted, ops = self.admit(spec)
        meta = admitted["metadata"]
        asks = [c for c in admitted["spec"]["containers"]
                if any(c.get("resources", {}).get("limits", {}).get(r) for r in resources)]
        if want_share and not asks:
            raise CheckFailed(f"{meta['name']}: after admission no container asks for any of "
                              f"{resources}: {admitted['spec']['containers']}")
        # The scheduler's resource fit, before the pod is bound to this node.
        for c in admitted["spec"]["containers"]:
            for r, v in c.get("resources", {}).get("limits", {}).items():
                if r in resources and int(quantity(v)) > len(self.free.get(r, [])):
                    raise Unfit(f"{meta['name']}: 0/1 nodes are available: 1 Insufficient {r} "
                                f"(asks {int(quantity(v))}, {len(self.free.get(r, []))} free)")
        if not want_share and (asks or ops):
            raise CheckFailed(f"{meta['name']}: the webhook changed a pod that asks for no "
                              f"sharing: {ops}")
        admitted["spec"]["nodeName"] = k.node  # the scheduler's binding
        admitted["status"] = {"phase": "Running"}
        self.api.add_pod(admitted)
        pod = translate_pod(admitted["spec"], meta["name"], meta["namespace"], meta["uid"],
                            self.args.work, self.api, k.node)
        pod.update(spec=admitted, patch=ops, annotations=meta.get("annotations", {}))
        pod["sid"], pod["sconf"] = k.run_sandbox(meta["name"], meta["namespace"], meta["uid"],
                                                 "besteffort", False, meta.get("annotations", {}),
                                                 seccomp=pod["seccomp"])
        c = pod["containers"][0]
        if len(pod["containers"]) != 1:
            raise CheckFailed("translator: sharing pods with several containers not handled")
        pod["alloc"] = {"env": {}, "mounts": [], "devices": []}
        pod["device_ids"] = {}
        for resource in resources:
            n = int(quantity(c["limits"].get(resource, 0)))
            if not n:
                continue
            free = self.free[resource]
            # The kubelet's device manager: the plugin's preferred devices among the free ones.
            ids = [d for d in self.plugins.preferred(resource, free, n) if d in free][:n]
            ids += [d for d in free if d not in ids][:n - len(ids)]
            self.free[resource] = [d for d in free if d not in ids]
            pod["device_ids"][resource] = ids
            alloc = self.plugins.allocate(resource, ids)
            if alloc.annotations or len(getattr(alloc, "cdi_devices", [])):
                raise CheckFailed(f"translator: Allocate answer with annotations/CDI devices "
                                  f"not handled: {alloc}")
            pod["alloc"]["env"].update(dict(alloc.envs))
            pod["alloc"]["mounts"] += [(m.container_path, m.host_path, m.read_only)
                                       for m in alloc.mounts]
            pod["alloc"]["devices"] += [(d.container_path, d.host_path, d.permissions)
                                        for d in alloc.devices]
            log(f"{meta['name']}: Allocate({resource} {ids}) envs "
                f"{dict(sorted(alloc.envs.items()))}; mounts (host, container, ro) "
                f"{[(m.host_path, m.container_path, m.read_only) for m in alloc.mounts]}; "
                f"{len(alloc.devices)} device nodes")
        pod["attempt"] = 0
        self._create(pod)
        if runs:
            pod["pid"] = k.running_pid(f"pod {meta['name']}", pod["cid"])
        return pod

    def _create(self, pod, command=None):
        k = self.kubelet
        c = pod["containers"][0]
        a = pod["alloc"]
        pod["cid"] = k.create_start(pod["sid"], pod["sconf"], c, attempt=pod["attempt"],
                                    command=command, env=a["env"], mounts=a["mounts"],
                                    devices=a["devices"])
        pod["started"] = time.monotonic()

    def check_confined(self, pod, image):
        """uid 1000, no capabilities, no_new_privs, seccomp filter, read-only root."""
        pid = pod["pid"]
        st = os.stat(f"/proc/{pid}")
        status = proc_status(pid)
        log(f"{pod['name']}: image {image}, container {pod['cid'][:12]}, host pid {pid}, uid "
            f"{st.st_uid}, CapEff {status['CapEff']}, NoNewPrivs {status['NoNewPrivs']}, "
            f"Seccomp {status.get('Seccomp')} (RuntimeDefault), read-only root")
        if st.st_uid != 1000 or int(status["CapEff"], 16) != 0 or status["NoNewPrivs"] != "1":
            raise CheckFailed(f"{pod['name']}: not uid 1000 / no capabilities / no_new_privs")
        if status.get("Seccomp") != "2":
            raise CheckFailed(f"{pod['name']}: Seccomp {status.get('Seccomp')} in "
                              f"/proc/{pid}/status, expected 2 (filter: containerd's default "
                              f"profile, asked for with seccompProfile RuntimeDefault)")
        try:
            with open(f"/proc/{pid}/root/.orion-check-write", "w"):
                pass
            raise CheckFailed(f"{pod['name']}: its root file system is writable")
        except OSError:
            pass

    def run_once(self, pod, command, timeout):
        """The kubelet restarts the pod's container with `command` (same allocation, as for
        any container restart) and waits for it to exit. Returns its CRI log path."""
        k, pb = self.kubelet, self.kubelet.pb
        self.stop_container(pod)
        pod["attempt"] += 1
        self._create(pod, command=command)
        cid = pod["cid"]
        wait_for(f"{pod['name']} attempt {pod['attempt']} to finish",
                 lambda: k.status(cid)[0].state == pb.CONTAINER_EXITED, timeout, 0.1)
        st, _ = k.status(cid)
        if st.exit_code != 0:
            raise CheckFailed(f"{pod['name']} attempt {pod['attempt']} exited with "
                              f"{st.exit_code} ({st.reason}): {tail(st.log_path)}")
        return st.log_path

    def stop_container(self, pod):
        k, pb = self.kubelet, self.kubelet.pb
        k.cri("StopContainer", k.rt, pb.StopContainerRequest(container_id=pod["cid"], timeout=2))
        k.cri("RemoveContainer", k.rt, pb.RemoveContainerRequest(container_id=pod["cid"]))

    def remove_pod(self, pod):
        """StopPodSandbox + RemovePodSandbox, the API server's DELETED event, and the kubelet's
        bookkeeping: the pod's shares are free again. Once per pod."""
        if pod.get("removed"):
            return
        pod["removed"] = True
        self.kubelet.remove_sandbox(pod["sid"])
        self.api.delete_pod(pod["uid"])
        for resource, ids in pod.get("device_ids", {}).items():
            self.free[resource] = ids + self.free.get(resource, [])

