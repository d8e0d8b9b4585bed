#!/usr/bin/python3
"""Plays the kubelet for tools/check-pods.sh: runs the chart's pods (the node DaemonSet's, the
webhook Deployment's) and sharing pods in real containers through containerd's CRI server
(runtime.v1 over gRPC, stubs generated at run time from proto/k8s/cri/runtime/v1/api.proto),
serves the device plugin Registration socket (v1beta1, from
proto/k8s/deviceplugin/v1beta1/api.proto) and a test API server (HTTPS, in-cluster style) listing
the pods, admits sharing pods through the chart's webhook, and asserts what the server and the
containers show. Every figure is printed; any failure raises CheckFailed with what failed.
Modules beside it: common (helpers), kube_doubles (API server, device plugin registration, the
kubelet's DRA side),
translate (pod spec -> CRI settings), admission (AdmissionReview, JSON patch), pods (the node's
pods), observe (orion-ctl, /metrics, timelines, logs), checks, isolation, latency and dra_claims (the
steps).

  kubelet.py --cri SOCKET --work DIR --root REPO --build BUILD --rendered CHART.yaml
             --sample-image REF --node-root DIR --run-dir DIR --lib-dir DIR --dp-dir DIR
             --admin-port N --metrics-port N --webhook-port N --hostile BINARY
"""
import argparse
import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checks  # noqa: E402
import dra_claims  # noqa: E402
import isolation  # noqa: E402
import latency  # noqa: E402
from common import CheckFailed, log, tail, wait_for  # noqa: E402
from kube_doubles import ApiServer, DevicePlugins, DraKubelet  # noqa: E402
from observe import Ctl  # noqa: E402
from pods import Node  # noqa: E402
from translate import chart_objects  # noqa: E402


def gen_stubs(root, tmp):
    """Python stubs for the CRI, device plugin, DRA and plugin registration protos, generated
    into tmp."""
    from grpc_tools import protoc  # python3-grpc-tools
    import grpc_tools
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    health = os.path.join(tmp, "health.proto")
    with open(health, "w") as f:  # grpc.health.v1, for the chart's gRPC probes
        f.write('syntax = "proto3"; package grpc.health.v1;\n'
                'message HealthCheckRequest { string service = 1; }\n'
                'message HealthCheckResponse { enum ServingStatus { UNKNOWN = 0; SERVING = 1;'
                ' NOT_SERVING = 2; SERVICE_UNKNOWN = 3; } ServingStatus status = 1; }\n'
                'service Health { rpc Check(HealthCheckRequest) returns (HealthCheckResponse); }\n')
    for inc, proto in ((os.path.join(root, "proto/k8s/cri"), "runtime/v1/api.proto"),
                       (os.path.join(root, "proto/k8s"), "deviceplugin/v1beta1/api.proto"),
                       (os.path.join(root, "proto/k8s"), "dra/v1/api.proto"),
                       (os.path.join(root, "proto/k8s"), "pluginregistration/v1/api.proto"),
                       (tmp, "health.proto")):
        rc = protoc.main(["protoc", f"-I{inc}", f"-I{well_known}", f"--python_out={tmp}",
                          f"--grpc_python_out={tmp}", os.path.join(inc, proto)])
        if rc != 0:
            raise CheckFailed(f"protoc failed on {proto}")
    sys.path.insert(0, tmp)
    import importlib
    mods = {}
    for name in ("runtime.v1.api_pb2", "runtime.v1.api_pb2_grpc",
                 "deviceplugin.v1beta1.api_pb2", "deviceplugin.v1beta1.api_pb2_grpc",
                 "dra.v1.api_pb2", "dra.v1.api_pb2_grpc",
                 "pluginregistration.v1.api_pb2", "pluginregistration.v1.api_pb2_grpc",
                 "health_pb2", "health_pb2_grpc"):
        mods[name] = importlib.import_module(name)
    return mods


class Kubelet:
    def __init__(self, args, mods):
        self.args = args
        self.pb = mods["runtime.v1.api_pb2"]
        self.rpc = mods["runtime.v1.api_pb2_grpc"]
        self.health_pb = mods["health_pb2"]
        self.health_rpc = mods["health_pb2_grpc"]
        self.mods = mods
        channel = grpc.insecure_channel(f"unix://{args.cri}")
        self.rt = self.rpc.RuntimeServiceStub(channel)
        self.img = self.rpc.ImageServiceStub(channel)
        self.sandboxes = []  # (id, uid, cgroup parent)
        self.node = "orion-check-node"

    def cri(self, name, stub, request, timeout=60):
        try:
            return getattr(stub, name)(request, timeout=timeout)
        except grpc.RpcError as e:
            raise CheckFailed(f"CRI {name} failed: {e.code().name}: {e.details()}") from None

    def profile(self, kind):
        """seccompProfile type -> CRI SecurityProfile (None: unset)."""
        if kind is None:
            return None
        return self.pb.SecurityProfile(profile_type=getattr(self.pb.SecurityProfile, kind))

    # -- sandboxes and containers
    def run_sandbox(self, name, namespace, uid, qos, host_pid, annotations, handler="",
                    seccomp=None):
        pb = self.pb
        parent = "/kubepods" + ("" if qos == "guaranteed" else f"/{qos}") + f"/pod{uid}"
        # check-pods.sh's cleanup removes the cgroups of these pods, and of no others.
        with open(os.path.join(self.args.work, "pod-cgroups"), "a") as f:
            f.write(parent + "\n")
        logdir = os.path.join(self.args.work, "logs", f"{namespace}_{name}_{uid}")
        os.makedirs(logdir, exist_ok=True)
        security = pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(
                network=pb.NODE, pid=pb.NODE if host_pid else pb.POD, ipc=pb.POD))
        if seccomp:
            security.seccomp.CopyFrom(self.profile(seccomp))
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            log_directory=logdir, annotations=annotations,  # host network: no hostname
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                    "io.kubernetes.pod.uid": uid},
            linux=pb.LinuxPodSandboxConfig(cgroup_parent=parent, security_context=security))
        sid = self.cri("RunPodSandbox", self.rt, pb.RunPodSandboxRequest(
            config=config, runtime_handler=handler)).pod_sandbox_id
        self.sandboxes.append((sid, uid, parent))
        return sid, config

    def create_start(self, sid, sandbox_config, c, attempt=0, command=None, env=None, mounts=(),
                     devices=()):
        """Creates and starts container `c` (as tools/cri/translate.py gives it), with the
        environment, mounts and device nodes a device plugin's Allocate answer adds."""
        pb = self.pb
        sc = pb.LinuxContainerSecurityContext(
            capabilities=pb.Capability(drop_capabilities=list(c["drop"])),
            readonly_rootfs=c["ro_root"], no_new_privs=c["no_new_privs"],
            namespace_options=sandbox_config.linux.security_context.namespace_options)
        if c["run_as"] is not None:
            sc.run_as_user.value = c["run_as"][0]
            if c["run_as"][1] is not None:
                sc.run_as_group.value = c["run_as"][1]
        if c["seccomp"]:
            sc.seccomp.CopyFrom(self.profile(c["seccomp"]))
        envs = dict(c["env"])
        envs.update(env or {})  # the device plugin's variables come last, as the kubelet adds them
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=c["name"], attempt=attempt),
            image=pb.ImageSpec(image=c["image"]),
            command=c["command"] if command is None else command,
            args=c["args"] if command is None else [],
            envs=[pb.KeyValue(key=k, value=v) for k, v in envs.items()],
            mounts=[pb.Mount(container_path=cp, host_path=h, readonly=ro)
                    for cp, h, ro in list(c["mounts"]) + list(mounts)],
            devices=[pb.Device(container_path=cp, host_path=h, permissions=p)
                     for cp, h, p in devices],
            log_path=f"{c['name']}/{attempt}.log",
            linux=pb.LinuxContainerConfig(
                resources=pb.LinuxContainerResources(memory_limit_in_bytes=c["memory"],
                                                     cpu_shares=c["cpu_shares"]),
                security_context=sc))
        cid = self.cri("CreateContainer", self.rt, pb.CreateContainerRequest(
            pod_sandbox_id=sid, config=config, sandbox_config=sandbox_config)).container_id
        self.cri("StartContainer", self.rt, pb.StartContainerRequest(container_id=cid))
        return cid

    def status(self, cid):
        resp = self.cri("ContainerStatus", self.rt,
                        self.pb.ContainerStatusRequest(container_id=cid, verbose=True))
        info = json.loads(resp.info.get("info", "{}"))
        return resp.status, info.get("pid", 0)

    def running_pid(self, what, cid, timeout=20):
        def ok():
            st, pid = self.status(cid)
            if st.state == self.pb.CONTAINER_EXITED:
                raise CheckFailed(f"{what} exited with {st.exit_code} ({st.reason}): "
                                  f"{tail(st.log_path)}")
            return pid if st.state == self.pb.CONTAINER_RUNNING and pid else 0
        return wait_for(f"{what} running", ok, timeout)

    def remove_sandbox(self, sid):
        self.cri("StopPodSandbox", self.rt, self.pb.StopPodSandboxRequest(pod_sandbox_id=sid))
        self.cri("RemovePodSandbox", self.rt, self.pb.RemovePodSandboxRequest(pod_sandbox_id=sid))
        for entry in list(self.sandboxes):
            if entry[0] == sid:
                self.sandboxes.remove(entry)
                remove_cgroup(entry[2])

    def cleanup(self):
        for sid, _, parent in list(self.sandboxes):
            try:
                self.remove_sandbox(sid)
            except Exception as e:  # keep cleaning
                log(f"cleanup: {e}")

    def image_present(self, ref):
        resp = self.cri("ImageStatus", self.img,
                        self.pb.ImageStatusRequest(image=self.pb.ImageSpec(image=ref)))
        if not resp.image.id:
            raise CheckFailed(f"image {ref} is not in containerd (nothing can be pulled here)")
        return resp.image


def remove_cgroup(parent):
    """The kubelet removes a pod's cgroup folders once its containers are gone."""
    roots = ["/sys/fs/cgroup"] + [f"/sys/fs/cgroup/{c}" for c in os.listdir("/sys/fs/cgroup")]
    for root in roots:  # cgroup v2 only: the root itself; v1: one folder per controller
        path = f"{root}{parent}"
        if os.path.isdir(path):
            try:
                os.rmdir(path)
            except OSError:
                pass


def probe(kubelet, container, timeout):
    """Waits for a container's readiness probe (gRPC health, or HTTP(S) GET: the kubelet does
    not verify an HTTPS probe's certificate)."""
    p = container["readiness"]
    if not p:
        return

    def port(v):
        return container["ports"][v] if isinstance(v, str) else v
    if "grpc" in p:
        port_n = port(p["grpc"]["port"])
        stub = kubelet.health_rpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port_n}"))

        def ok():
            try:
                return stub.Check(kubelet.health_pb.HealthCheckRequest(), timeout=1).status == 1
            except grpc.RpcError:
                return False
        wait_for(f"{container['name']} readiness (gRPC health :{port_n})", ok, timeout, 0.1)
    else:
        get = p["httpGet"]
        scheme = get.get("scheme", "HTTP").lower()
        url = f"{scheme}://127.0.0.1:{port(get['port'])}{get['path']}"
        ctx = ssl._create_unverified_context() if scheme == "https" else None

        def ok():
            try:
                return urllib.request.urlopen(url, timeout=1, context=ctx).status == 200
            except Exception:
                return False
        wait_for(f"{container['name']} readiness ({url})", ok, timeout, 0.1)


def main():
    ap = argparse.ArgumentParser()
    for a in ("--cri", "--work", "--root", "--build", "--rendered", "--sample-image",
              "--node-root", "--run-dir", "--lib-dir", "--dp-dir", "--hostile"):
        ap.add_argument(a, required=True)
    for a in ("--admin-port", "--metrics-port", "--webhook-port"):
        ap.add_argument(a, required=True, type=int)
    args = ap.parse_args()
    # Stopped by check-pods.sh's cleanup: remove the pods on the way out (finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("check-pods: test kubelet stopped (SIGTERM)"))
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="orion-cri-stubs-")
    mods = gen_stubs(args.root, tmp)
    kubelet = Kubelet(args, mods)
    pb = kubelet.pb
    v = kubelet.cri("Version", kubelet.rt, pb.VersionRequest(version="v1"))
    log(f"CRI: {v.runtime_name} {v.runtime_version}, API {v.runtime_api_version}")
    api = ApiServer(args.work, kubelet.node)
    plugins = DevicePlugins(mods, args.dp_dir)
    try:
        figures = run(args, kubelet, api, plugins)
        log("== figures")
        for line in figures:
            log(f"  {line}")
        log(f"check-pods: all assertions passed in {time.monotonic() - t0:.1f} s (kubelet part)")
    finally:
        kubelet.cleanup()
        plugins.stop()
        api.stop()
        subprocess.run(["rm", "-rf", tmp])


def run(args, kubelet, api, plugins):
    docs = list(yaml.safe_load_all(open(args.rendered)))
    secret = [d for d in docs if d and d.get("kind") == "Secret" and "tokens" in d.get("data", {})]
    if not secret:
        raise CheckFailed("the chart rendered no admin tokens Secret")
    tokens = base64.b64decode(secret[0]["data"]["tokens"]).decode().split("\n")
    ctl = Ctl(args.build, args.admin_port, args.work, tokens)
    node = Node(args, kubelet, api, plugins, ctl, chart_objects(docs))
    node.dra = DraKubelet(kubelet.mods, os.path.join(args.node_root,
                                                     "var/lib/kubelet/plugins_registry"))
    checks.chart_pods(node, docs, probe)
    checks.sharing_pods(node)
    checks.named_by_server(node)
    checks.plain_untouched(node)
    checks.metrics_and_timeline(node)
    isolation.hostile_pod(node)
    checks.memory_freed(node)
    checks.server_restart(node)
    checks.agent_restart(node, probe)
    checks.slot_freed(node)
    latency.p99_arms(node)
    dra_claims.dra_claim(node)
    checks.placement_two_gpus(node, probe)
    return node.figures


if __name__ == "__main__":
    try:
        main()
    except CheckFailed as e:
        print(f"check-pods: FAILED: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
