#!/usr/bin/python3
"""Plays the kubelet for tools/check-pods.sh: runs the chart's node pod and sharing pods in real
containers through containerd's CRI server (runtime.v1 over gRPC, stubs generated at run time from
proto/k8s/cri/runtime/v1/api.proto), serves the device plugin Registration socket (v1beta1, from
proto/k8s/deviceplugin/v1beta1/api.proto) and a test API server (HTTPS, in-cluster style) listing
the pods, and asserts what the server and the containers show. Every figure is printed; any failure
raises CheckFailed with what failed.

  kubelet.py --cri SOCKET --work DIR --root REPO --build BUILD --rendered CHART.yaml
             --sample-image REF --node-root DIR
"""
import argparse
import base64
import http.server
import json
import os
import queue
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent import futures

import grpc
import yaml


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


def gen_stubs(root, tmp):
    """Python stubs for the CRI and device plugin protos, generated into tmp."""
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
                 "health_pb2", "health_pb2_grpc"):
        mods[name] = importlib.import_module(name)
    return mods


# ---------------------------------------------------------------------------------------------
# Test API server: HTTPS on 127.0.0.1 as a pod's in-cluster config reaches it.

class ApiServer:
    def __init__(self, work, node_name):
        self.node_name = node_name
        self.pods = {}  # uid -> pod object
        self.rv = 100
        self.lock = threading.Lock()
        self.watchers = []  # queues of watch lines
        self.events = []
        self.requests = []
        d = os.path.join(work, "apiserver")
        os.makedirs(d, exist_ok=True)
        self.ca = os.path.join(d, "ca.crt")
        key = os.path.join(d, "tls.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-addext", "basicConstraints=critical,CA:TRUE",
                        "-keyout", key, "-out", self.ca], check=True, capture_output=True)
        self.token = uuid.uuid4().hex
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _auth(self):
                if self.headers.get("Authorization") != f"Bearer {outer.token}":
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return False
                return True

            def do_GET(self):
                with outer.lock:
                    outer.requests.append(self.path)
                if not self._auth():
                    return
                if not self.path.startswith("/api/v1/pods"):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if "watch=1" in self.path or "watch=true" in self.path:
                    q = queue.Queue()
                    with outer.lock:
                        outer.watchers.append(q)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    try:
                        self.wfile.flush()
                        while True:
                            try:
                                line = q.get(timeout=0.5)
                            except queue.Empty:
                                continue
                            if line is None:
                                break
                            data = (line + "\n").encode()
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                            self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")
                    except OSError:
                        pass
                    finally:
                        with outer.lock:
                            if q in outer.watchers:
                                outer.watchers.remove(q)
                    return
                with outer.lock:
                    body = json.dumps({"kind": "PodList", "apiVersion": "v1",
                                       "metadata": {"resourceVersion": str(outer.rv)},
                                       "items": list(outer.pods.values())}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                with outer.lock:
                    outer.events.append(body.decode(errors="replace"))
                self.send_response(201)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.ca, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def add_pod(self, pod):
        with self.lock:
            self.rv += 1
            pod["metadata"]["resourceVersion"] = str(self.rv)
            self.pods[pod["metadata"]["uid"]] = pod
            self._send("ADDED", pod)

    def delete_pod(self, uid):
        with self.lock:
            pod = self.pods.pop(uid, None)
            if pod is None:
                return
            self.rv += 1
            pod["metadata"]["resourceVersion"] = str(self.rv)
            self._send("DELETED", pod)

    def _send(self, kind, pod):
        line = json.dumps({"type": kind, "object": pod})
        for q in self.watchers:
            q.put(line)

    def stop(self):
        with self.lock:
            for q in self.watchers:
                q.put(None)
        self.httpd.shutdown()


def pod_object(name, namespace, uid, node, annotations, containers):
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "annotations": annotations, "labels": {}},
            "spec": {"nodeName": node, "containers": containers},
            "status": {"phase": "Running"}}


# ---------------------------------------------------------------------------------------------
# Test kubelet's device plugin side: Registration server, ListAndWatch, Allocate.

class DevicePlugins:
    def __init__(self, mods, dp_dir):
        self.pb = mods["deviceplugin.v1beta1.api_pb2"]
        self.rpc = mods["deviceplugin.v1beta1.api_pb2_grpc"]
        self.dir = dp_dir
        self.registered = []
        self.devices = []
        self.cv = threading.Condition()
        outer = self

        class Registration(self.rpc.RegistrationServicer):
            def Register(self, request, context):
                with outer.cv:
                    outer.registered.append(request)
                    outer.cv.notify_all()
                threading.Thread(target=outer._watch, args=(request.endpoint,),
                                 daemon=True).start()
                return outer.pb.Empty()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.rpc.add_RegistrationServicer_to_server(Registration(), self.server)
        self.server.add_insecure_port(f"unix://{dp_dir}/kubelet.sock")
        self.server.start()

    def _watch(self, endpoint):
        channel = grpc.insecure_channel(f"unix://{self.dir}/{endpoint}")
        stub = self.rpc.DevicePluginStub(channel)
        try:
            for resp in stub.ListAndWatch(self.pb.Empty()):
                with self.cv:
                    self.devices = list(resp.devices)
                    self.cv.notify_all()
        except grpc.RpcError:
            pass

    def allocate(self, device_ids):
        req = self.registered[-1]
        stub = self.rpc.DevicePluginStub(grpc.insecure_channel(f"unix://{self.dir}/{req.endpoint}"))
        resp = stub.Allocate(self.pb.AllocateRequest(container_requests=[
            self.pb.ContainerAllocateRequest(devices_ids=device_ids)]), timeout=10)
        return resp.container_responses[0]

    def stop(self):
        self.server.stop(0)


# ---------------------------------------------------------------------------------------------
# The chart's pod spec -> CRI configs.

POD_FIELDS_SCHEDULING = {"nodeSelector", "tolerations", "priorityClassName", "affinity"}
POD_FIELDS = {"containers", "volumes", "hostPID", "hostNetwork", "serviceAccountName",
              "imagePullSecrets", "runtimeClassName"} | POD_FIELDS_SCHEDULING
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "ports",
                    "livenessProbe", "readinessProbe", "securityContext", "resources",
                    "volumeMounts"}
SECURITY_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "allowPrivilegeEscalation",
                   "readOnlyRootFilesystem", "capabilities", "privileged"}


def unknown(where, obj, known):
    extra = sorted(set(obj) - known)
    if extra:
        raise CheckFailed(f"translator: {where}: field(s) not handled: {', '.join(extra)}")


def quantity(q):
    q = str(q)
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1000, "M": 10 ** 6, "G": 10 ** 9}
    for u, m in units.items():
        if q.endswith(u):
            return int(float(q[:-len(u)]) * m)
    if q.endswith("m"):
        return float(q[:-1]) / 1000
    return float(q)


def expand(s, env):
    for k, v in env.items():
        s = s.replace(f"$({k})", v)
    return s


class Kubelet:
    def __init__(self, args, mods):
        self.args = args
        self.pb = mods["runtime.v1.api_pb2"]
        self.rpc = mods["runtime.v1.api_pb2_grpc"]
        self.health_pb = mods["health_pb2"]
        self.health_rpc = mods["health_pb2_grpc"]
        channel = grpc.insecure_channel(f"unix://{args.cri}")
        self.rt = self.rpc.RuntimeServiceStub(channel)
        self.img = self.rpc.ImageServiceStub(channel)
        self.sandboxes = []  # (id, uid)
        self.node = "orion-check-node"

    def cri(self, name, stub, request, timeout=60):
        try:
            return getattr(stub, name)(request, timeout=timeout)
        except grpc.RpcError as e:
            raise CheckFailed(f"CRI {name} failed: {e.code().name}: {e.details()}") from None

    # -- sandboxes and containers
    def run_sandbox(self, name, namespace, uid, qos, host_pid, annotations, handler=""):
        pb = self.pb
        parent = "/kubepods" + ("" if qos == "guaranteed" else f"/{qos}") + f"/pod{uid}"
        # check-pods.sh's cleanup removes the cgroups of these pods, and of no others.
        with open(os.path.join(self.args.work, "pod-cgroups"), "a") as f:
            f.write(parent + "\n")
        logdir = os.path.join(self.args.work, "logs", f"{namespace}_{name}_{uid}")
        os.makedirs(logdir, exist_ok=True)
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            log_directory=logdir, annotations=annotations,  # host network: no hostname
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                    "io.kubernetes.pod.uid": uid},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(
                        network=pb.NODE, pid=pb.NODE if host_pid else pb.POD, ipc=pb.POD))))
        sid = self.cri("RunPodSandbox", self.rt, pb.RunPodSandboxRequest(
            config=config, runtime_handler=handler)).pod_sandbox_id
        self.sandboxes.append((sid, uid, parent))
        return sid, config

    def create_start(self, sid, sandbox_config, name, image, command, args, envs, mounts,
                     devices=(), run_as=None, ro_root=False, drop=(), no_new_privs=False,
                     memory=0, cpu_shares=0, attempt=0):
        pb = self.pb
        sc = pb.LinuxContainerSecurityContext(
            capabilities=pb.Capability(drop_capabilities=list(drop)),
            readonly_rootfs=ro_root, no_new_privs=no_new_privs,
            namespace_options=sandbox_config.linux.security_context.namespace_options)
        if run_as is not None:
            sc.run_as_user.value = run_as[0]
            if run_as[1] is not None:
                sc.run_as_group.value = run_as[1]
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=image), command=command, args=args,
            envs=[pb.KeyValue(key=k, value=v) for k, v in envs.items()],
            mounts=[pb.Mount(container_path=c, host_path=h, readonly=ro) for c, h, ro in mounts],
            devices=[pb.Device(container_path=c, host_path=h, permissions=p)
                     for c, h, p in devices],
            log_path=f"{name}/{attempt}.log",
            linux=pb.LinuxContainerConfig(
                resources=pb.LinuxContainerResources(memory_limit_in_bytes=memory,
                                                     cpu_shares=cpu_shares),
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


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "\n" + "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------------------------------------

def translate_node_pod(docs, node_root, work, api, kubelet):
    """The DaemonSet's pod template -> a sandbox and per-container CRI settings."""
    ds = [d for d in docs if d and d.get("kind") == "DaemonSet"]
    if len(ds) != 1:
        raise CheckFailed(f"the chart rendered {len(ds)} DaemonSets, expected 1")
    ds = ds[0]
    configmaps = {d["metadata"]["name"]: d for d in docs if d and d.get("kind") == "ConfigMap"}
    secrets = {d["metadata"]["name"]: d for d in docs if d and d.get("kind") == "Secret"}
    tmpl = ds["spec"]["template"]
    spec = tmpl["spec"]
    unknown("DaemonSet pod spec", spec, POD_FIELDS)
    if spec.get("hostNetwork") is False:
        pass
    uid = str(uuid.uuid4())
    vol_root = os.path.join(work, "pods", uid, "volumes")
    volumes = {}
    for v in spec.get("volumes", []):
        name = v["name"]
        kinds = set(v) - {"name"}
        d = os.path.join(vol_root, name)
        if kinds == {"configMap"}:
            unknown(f"volume {name}.configMap", v["configMap"], {"name", "defaultMode", "items"})
            cm = configmaps.get(v["configMap"]["name"])
            if cm is None:
                raise CheckFailed(f"volume {name}: ConfigMap {v['configMap']['name']} not rendered")
            os.makedirs(d, exist_ok=True)
            for k, val in cm.get("data", {}).items():
                with open(os.path.join(d, k), "w") as f:
                    f.write(val)
                os.chmod(os.path.join(d, k), v["configMap"].get("defaultMode", 0o644))
            volumes[name] = (d, True)
        elif kinds == {"secret"}:
            unknown(f"volume {name}.secret", v["secret"], {"secretName", "defaultMode", "items"})
            sec = secrets.get(v["secret"]["secretName"])
            if sec is None:
                raise CheckFailed(f"volume {name}: Secret {v['secret']['secretName']} not rendered")
            os.makedirs(d, exist_ok=True)
            for k, val in sec.get("data", {}).items():
                with open(os.path.join(d, k), "wb") as f:
                    f.write(base64.b64decode(val))
                os.chmod(os.path.join(d, k), v["secret"].get("defaultMode", 0o644))
            volumes[name] = (d, True)
        elif kinds == {"emptyDir"}:
            unknown(f"volume {name}.emptyDir", v["emptyDir"], {"medium", "sizeLimit"})
            os.makedirs(d, exist_ok=True)
            volumes[name] = (d, False)
        elif kinds == {"hostPath"}:
            unknown(f"volume {name}.hostPath", v["hostPath"], {"path", "type"})
            path, kind = v["hostPath"]["path"], v["hostPath"].get("type", "")
            if kind == "DirectoryOrCreate":
                os.makedirs(path, exist_ok=True)
            elif kind == "Directory":
                if not os.path.isdir(path):
                    raise CheckFailed(f"volume {name}: hostPath {path} (type Directory) missing")
            elif kind:
                raise CheckFailed(f"translator: volume {name}: hostPath type {kind} not handled")
            volumes[name] = (path, False)
        else:
            raise CheckFailed(f"translator: volume {name}: kind {', '.join(sorted(kinds))} not handled")
    # The kubelet's service account volume (automountServiceAccountToken) and in-cluster env.
    sa = os.path.join(vol_root, "kube-api-access")
    os.makedirs(sa, exist_ok=True)
    with open(os.path.join(sa, "token"), "w") as f:
        f.write(api.token)
    with open(os.path.join(sa, "namespace"), "w") as f:
        f.write(ds["metadata"].get("namespace", "default"))
    subprocess.run(["cp", api.ca, os.path.join(sa, "ca.crt")], check=True)

    containers = []
    for c in spec["containers"]:
        unknown(f"container {c['name']}", c, CONTAINER_FIELDS)
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port)}
        for e in c.get("env", []):
            unknown(f"container {c['name']} env {e['name']}", e, {"name", "value", "valueFrom"})
            if "value" in e:
                env[e["name"]] = expand(str(e["value"]), env)
            else:
                ref = e["valueFrom"].get("fieldRef", {}).get("fieldPath")
                fields = {"spec.nodeName": kubelet.node, "metadata.namespace":
                          ds["metadata"].get("namespace", "default")}
                if ref not in fields:
                    raise CheckFailed(f"translator: env {e['name']}: valueFrom {e['valueFrom']} not handled")
                env[e["name"]] = fields[ref]
        mounts = [("/var/run/secrets/kubernetes.io/serviceaccount", sa, True)]
        for m in c.get("volumeMounts", []):
            unknown(f"container {c['name']} volumeMount {m['name']}", m,
                    {"name", "mountPath", "readOnly"})
            host, volume_ro = volumes[m["name"]]
            mounts.append((m["mountPath"], host, volume_ro or bool(m.get("readOnly"))))
        # A mount point inside another read-only volume must exist in it (as the kubelet's
        # atomic writer leaves room for it in a configMap volume).
        for cp, host, _ in mounts:
            for cp2, host2, _ in mounts:
                if cp2 != cp and cp2.startswith(cp.rstrip("/") + "/"):
                    os.makedirs(os.path.join(host, os.path.relpath(cp2, cp)), exist_ok=True)
        sc = c.get("securityContext", {})
        unknown(f"container {c['name']} securityContext", sc, SECURITY_FIELDS)
        if sc.get("privileged"):
            raise CheckFailed(f"translator: container {c['name']}: privileged not handled")
        caps = sc.get("capabilities", {})
        unknown(f"container {c['name']} capabilities", caps, {"drop"})
        res = c.get("resources", {})
        unknown(f"container {c['name']} resources", res, {"limits", "requests"})
        for probe_name in ("livenessProbe", "readinessProbe"):
            p = c.get(probe_name)
            if p:
                unknown(f"container {c['name']} {probe_name}", p,
                        {"grpc", "httpGet", "initialDelaySeconds", "periodSeconds"})
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        containers.append({
            "name": c["name"], "image": c["image"], "command": c.get("command", []),
            "args": [expand(a, env) for a in c.get("args", [])], "env": env, "mounts": mounts,
            "run_as": (sc["runAsUser"], sc.get("runAsGroup")) if "runAsUser" in sc else None,
            "ro_root": bool(sc.get("readOnlyRootFilesystem")),
            "drop": caps.get("drop", []),
            "no_new_privs": sc.get("allowPrivilegeEscalation") is False,
            "memory": int(quantity(res.get("limits", {}).get("memory", 0))),
            "cpu_shares": max(2, int(quantity(res.get("requests", {}).get("cpu", 0)) * 1024)),
            "readiness": c.get("readinessProbe"), "ports": ports})
    return {"uid": uid, "name": ds["metadata"]["name"] + "-x7k2p",
            "namespace": ds["metadata"].get("namespace", "default"),
            "host_pid": bool(spec.get("hostPID")), "containers": containers,
            "runtime_handler": spec.get("runtimeClassName", ""),
            "fields": sorted(set(spec) - POD_FIELDS_SCHEDULING),
            "scheduling": sorted(set(spec) & POD_FIELDS_SCHEDULING),
            "volumes": {v["name"]: (set(v) - {"name"}).pop() for v in spec.get("volumes", [])}}


def probe(kubelet, container, timeout):
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
        import urllib.request
        url = f"http://127.0.0.1:{port(p['httpGet']['port'])}{p['httpGet']['path']}"
        def ok():
            try:
                return urllib.request.urlopen(url, timeout=1).status == 200
            except Exception:
                return False
        wait_for(f"{container['name']} readiness ({url})", ok, timeout, 0.1)


def ctl_clients(args, token_file):
    out = subprocess.run([os.path.join(args.build, "tools/orion-ctl"), "--server",
                          f"127.0.0.1:{args.admin_port}", "--token-file", token_file, "--json",
                          "clients"], capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        return None
    data = json.loads(out.stdout or "{}")
    return data.get("clients", data if isinstance(data, list) else [])


def main():
    ap = argparse.ArgumentParser()
    for a in ("--cri", "--work", "--root", "--build", "--rendered", "--sample-image",
              "--node-root", "--run-dir", "--lib-dir", "--dp-dir"):
        ap.add_argument(a, required=True)
    ap.add_argument("--admin-port", default="50051")
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
        run(args, kubelet, api, plugins, mods)
        log(f"check-pods: all assertions passed in {time.monotonic() - t0:.1f} s (kubelet part)")
    finally:
        kubelet.cleanup()
        plugins.stop()
        api.stop()
        subprocess.run(["rm", "-rf", tmp])


def run(args, kubelet, api, plugins, mods):
    pb = kubelet.pb
    docs = list(yaml.safe_load_all(open(args.rendered)))
    node_pod = translate_node_pod(docs, args.node_root, args.work, api, kubelet)
    secret = [d for d in docs if d and d.get("kind") == "Secret" and "tokens" in d.get("data", {})]
    tokens = base64.b64decode(secret[0]["data"]["tokens"]).decode().split("\n")
    reader = [line.split()[2] for line in tokens if line.startswith("reader ")][0]
    token_file = os.path.join(args.work, "reader-token")
    with open(token_file, "w") as f:
        f.write(reader)

    # The pods this node runs, as the API server lists them (bound before the kubelet starts
    # them, like a real API server's list).
    gpu_pods = {
        "infer": {"uid": str(uuid.uuid4()), "name": "infer-high-5f7d9", "priority": "high"},
        "train": {"uid": str(uuid.uuid4()), "name": "train-be-8c2qz", "priority": "best-effort"},
    }
    plain = {"uid": str(uuid.uuid4()), "name": "plain-cuda-4xw7t"}
    api.add_pod(pod_object(node_pod["name"], node_pod["namespace"], node_pod["uid"],
                           kubelet.node, {}, [{"name": c["name"]} for c in node_pod["containers"]]))
    for p in gpu_pods.values():
        api.add_pod(pod_object(p["name"], "ml", p["uid"], kubelet.node,
                               {"orion/priority": p["priority"]},
                               [{"name": "main", "resources": {"limits": {"orion.io/gpu": "1"}}}]))
    api.add_pod(pod_object(plain["name"], "ml", plain["uid"], kubelet.node, {},
                           [{"name": "main"}]))

    step("node pod from the chart (DaemonSet pod template -> CRI)")
    log(f"pod spec: {', '.join(node_pod['fields'])} translated; "
        f"{', '.join(node_pod['scheduling'])} are the scheduler's (this node is chosen)")
    log("volumes: " + ", ".join(f"{k} ({v})" for k, v in node_pod["volumes"].items()) +
        "; plus the kubelet's service account volume and in-cluster environment")
    for c in node_pod["containers"]:
        image = kubelet.image_present(c["image"])
        log(f"image {c['image']} present: {image.id[:19]}, {image.size >> 20} MiB")
    sid, sconf = kubelet.run_sandbox(node_pod["name"], node_pod["namespace"], node_pod["uid"],
                                     "burstable", node_pod["host_pid"], {},
                                     node_pod["runtime_handler"])
    node_pod["sid"], node_pod["sconf"] = sid, sconf
    cids = {}
    for c in node_pod["containers"]:
        cids[c["name"]] = kubelet.create_start(
            sid, sconf, c["name"], c["image"], c["command"], c["args"], c["env"], c["mounts"],
            run_as=c["run_as"], ro_root=c["ro_root"], drop=c["drop"],
            no_new_privs=c["no_new_privs"], memory=c["memory"], cpu_shares=c["cpu_shares"])
        pid = kubelet.running_pid(f"node pod container {c['name']}", cids[c["name"]])
        log(f"{c['name']}: container {cids[c['name']][:12]} host pid {pid}, "
            f"uid {os.stat(f'/proc/{pid}').st_uid}, readOnlyRootFilesystem {c['ro_root']}, "
            f"capabilities dropped {c['drop']}")
    t = time.monotonic()
    with plugins.cv:
        if not plugins.cv.wait_for(lambda: plugins.registered and plugins.devices, 20):
            raise CheckFailed("the agent did not register its device plugin with the test "
                              "kubelet within 20 s")
    reg = plugins.registered[-1]
    log(f"device plugin registered: resource {reg.resource_name}, endpoint {reg.endpoint}, "
        f"{len(plugins.devices)} devices ({time.monotonic() - t:.2f} s after start)")
    for c in node_pod["containers"]:
        t = time.monotonic()
        probe(kubelet, c, 30)
        log(f"{c['name']}: ready ({time.monotonic() - t:.2f} s; agent /readyz needs the pods "
            f"synced from the API server to orion-server)")

    step("sharing pods: Allocate answer -> mounts, environment, devices")
    sim = os.path.join(args.work, "sim")
    os.makedirs(sim, exist_ok=True)
    os.chmod(sim, 0o1777)
    common_mounts = [("/opt/orion-samples", os.path.join(args.build, "samples"), True),
                     ("/opt/cuda-double", os.path.join(args.build, "tests/cuda_double/lib"), True),
                     ("/var/run/orion-sim", sim, False)]
    common_env = {"LD_LIBRARY_PATH": "/opt/cuda-double", "ORION_SIM_DIR": "/var/run/orion-sim"}
    free = [d.ID for d in plugins.devices if d.health == "Healthy"]
    image_of = {"infer": args.sample_image, "train": node_pod["containers"][0]["image"],
                "plain": args.sample_image}
    commands = {
        "infer": ["/opt/orion-samples/orion-sample-infer", "--rate", "200",
                  "--requests", "100000000", "--kernel-us", "100"],
        "train": ["/opt/orion-samples/orion-sample-train", "--seconds", "3600",
                  "--kernel-us", "500"],
        "plain": ["/opt/orion-samples/orion-sample-train", "--seconds", "3600",
                  "--kernel-us", "500"],
    }
    def start_sharing_pod(key, p):
        ann = {"orion/priority": p["priority"]} if "priority" in p else {}
        p["sid"], p["sconf"] = kubelet.run_sandbox(p["name"], "ml", p["uid"], "besteffort",
                                                   False, ann)
        env, mounts, devices = dict(common_env), list(common_mounts), []
        if key != "plain":
            p["device"] = free.pop(0)
            alloc = plugins.allocate([p["device"]])
            if alloc.annotations or len(getattr(alloc, "cdi_devices", [])):
                raise CheckFailed(f"translator: Allocate answer with annotations/CDI devices "
                                  f"not handled: {alloc}")
            env.update(alloc.envs)
            mounts += [(m.container_path, m.host_path, m.read_only) for m in alloc.mounts]
            devices += [(d.container_path, d.host_path, d.permissions) for d in alloc.devices]
            log(f"{p['name']}: Allocate({p['device']}) envs {dict(sorted(alloc.envs.items()))}; "
                f"mounts (host, container, ro) "
                f"{[(m.host_path, m.container_path, m.read_only) for m in alloc.mounts]}; "
                f"{len(alloc.devices)} device nodes")
        p["cid"] = kubelet.create_start(
            p["sid"], p["sconf"], "main", image_of[key], commands[key], [], env, mounts,
            devices, run_as=(1000, 1000), ro_root=True, drop=["ALL"], no_new_privs=True)
        p["pid"] = kubelet.running_pid(f"pod {p['name']}", p["cid"])
        p["started"] = time.monotonic()
        st = os.stat(f"/proc/{p['pid']}")
        with open(f"/proc/{p['pid']}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        log(f"{p['name']}: image {image_of[key]}, container {p['cid'][:12]}, host pid "
            f"{p['pid']}, uid {st.st_uid}, CapEff {status['CapEff'].strip()}, NoNewPrivs "
            f"{status['NoNewPrivs'].strip()}, read-only root")
        if st.st_uid != 1000 or int(status["CapEff"].strip(), 16) != 0 or \
                status["NoNewPrivs"].strip() != "1":
            raise CheckFailed(f"{p['name']}: not uid 1000 / no capabilities / no_new_privs")
        try:
            with open(f"/proc/{p['pid']}/root/.orion-check-write", "w"):
                pass
            raise CheckFailed(f"{p['name']}: its root file system is writable")
        except OSError:
            pass

    for key, p in list(gpu_pods.items()) + [("plain", plain)]:
        start_sharing_pod(key, p)
    with open(f"/proc/{gpu_pods['infer']['pid']}/cgroup") as f:
        log("cgroup of the high-priority pod's process (as the server reads it):\n  " +
            f.read().strip().replace("\n", "\n  "))

    step("the server names both sharing pods by pod UID and container id")
    def registered():
        clients = ctl_clients(args, token_file) or []
        found = {}
        for key, p in gpu_pods.items():
            match = [c for c in clients if c.get("podUid") == p["uid"] or
                     c.get("pod_uid") == p["uid"]]
            if not match:
                return None
            found[key] = match[0]
        return found
    t = time.monotonic()
    found = wait_for("both sharing pods in orion-ctl clients", registered, 30, 0.2)
    for key, p in gpu_pods.items():
        c = found[key]
        cid = c.get("containerId") or c.get("container_id")
        pid = int(c.get("hostPid") or c.get("host_pid") or 0)
        prio = c.get("priority", "")
        log(f"{p['name']}: client {c.get('clientId', c.get('client_id'))} pod "
            f"{c.get('namespace')}/{c.get('pod')} uid {p['uid']}, container {cid[:12]}, host "
            f"pid {pid}, priority {prio} ({c.get('prioritySource', c.get('priority_source'))})")
        if cid != p["cid"]:
            raise CheckFailed(f"{p['name']}: server names container {cid}, CRI says {p['cid']}")
        if pid != p["pid"]:
            raise CheckFailed(f"{p['name']}: server names host pid {pid}, CRI says {p['pid']}")
        if c.get("pod") != p["name"]:
            raise CheckFailed(f"{p['name']}: server names pod {c.get('pod')}")
        want = "HIGH" if p["priority"] == "high" else "BEST_EFFORT"
        if want not in str(prio).upper().replace("-", "_"):
            raise CheckFailed(f"{p['name']}: priority {prio}, the pod's annotation says "
                              f"{p['priority']}")
    last = max(p["started"] for p in gpu_pods.values())
    log(f"both registered and named by the server {time.monotonic() - last:.2f} s after the "
        f"last one was seen running (at most)")

    step("the pod without orion.io/gpu runs untouched")
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
    clients = ctl_clients(args, token_file) or []
    if any(c.get("podUid", c.get("pod_uid")) == plain["uid"] for c in clients):
        raise CheckFailed(f"{plain['name']}: the server lists it as a client")
    log(f"{plain['name']}: pid {plain['pid']} maps libcuda.so.1 (double), no "
        f"liborion_interpose, no LD_PRELOAD/ORION_SOCKET; not a client of the server")
    for key, p in gpu_pods.items():
        with open(f"/proc/{p['pid']}/maps") as f:
            if "liborion_interpose" not in f.read():
                raise CheckFailed(f"{p['name']}: interposer not loaded")

    step("SIGKILL of the server container, then the kubelet's restart")
    server = node_pod["containers"][0]
    _, spid = kubelet.status(cids["server"])
    os.kill(spid, signal.SIGKILL)
    t = time.monotonic()
    wait_for("the server container to exit", lambda: kubelet.status(cids["server"])[0].state ==
             pb.CONTAINER_EXITED, 10)
    st, _ = kubelet.status(cids["server"])
    log(f"server container exited: code {st.exit_code}, reason {st.reason} "
        f"({time.monotonic() - t:.2f} s)")
    kubelet.cri("RemoveContainer", kubelet.rt, pb.RemoveContainerRequest(container_id=cids["server"]))
    t_start = time.monotonic()
    cids["server"] = kubelet.create_start(
        node_pod["sid"], node_pod["sconf"], server["name"], server["image"], server["command"],
        server["args"], server["env"], server["mounts"], run_as=server["run_as"],
        ro_root=server["ro_root"], drop=server["drop"], no_new_privs=server["no_new_privs"],
        memory=server["memory"], cpu_shares=server["cpu_shares"], attempt=1)
    started = time.monotonic()
    t_reg = wait_for("both sharing pods to register with the restarted server", registered, 10, 0.02)
    again = time.monotonic() - started
    log(f"restarted server (CreateContainer+StartContainer {started - t_start:.2f} s): both "
        f"sharing pods registered again {again:.2f} s after StartContainer returned")
    for key, p in gpu_pods.items():
        st, pid = kubelet.status(p["cid"])
        if st.state != pb.CONTAINER_RUNNING or pid != p["pid"]:
            raise CheckFailed(f"{p['name']}: not running the same process after the restart")
    log("both sharing pods kept running (same host pids)")
    before = {k: int(c.get("kernels_launched", 0)) for k, c in t_reg.items()}
    time.sleep(0.5)
    after = {k: int(c.get("kernels_launched", 0)) for k, c in registered().items()}
    log(f"kernels launched in the 0.5 s after re-registration: "
        f"{ {gpu_pods[k]['name']: after[k] - before[k] for k in after} }")
    if any(after[k] <= before[k] for k in after):
        raise CheckFailed("a sharing pod launched no kernels after the server's restart")
    if again > 2.0:
        raise CheckFailed(f"re-registration took {again:.2f} s (limit 2 s)")

    step("removing a pod frees its slot")
    p = gpu_pods["train"]
    slot = int(t_reg["train"].get("slot", 0))
    others = {int(c.get("slot", 0)) for k, c in t_reg.items() if k != "train"}
    t = time.monotonic()
    kubelet.remove_sandbox(p["sid"])
    api.delete_pod(p["uid"])
    free.insert(0, p["device"])  # the kubelet's own bookkeeping: the share is free again
    def gone():
        clients = ctl_clients(args, token_file)
        return clients is not None and not any(
            c.get("pod_uid") == p["uid"] for c in clients)
    wait_for("the removed pod to leave the server's clients", gone, 10, 0.05)
    gone_s = time.monotonic() - t
    if os.path.exists(f"/proc/{p['pid']}"):
        raise CheckFailed(f"{p['name']}: its process {p['pid']} is still there after RemovePodSandbox")
    log(f"{p['name']} (server slot {slot}, device {p['device']}): StopPodSandbox+RemovePodSandbox, "
        f"its process gone and the server dropped it {gone_s:.2f} s later")
    # The freed share and slot go to the next pod: a new best-effort pod on the same device.
    nxt = {"uid": str(uuid.uuid4()), "name": "train-be-2-q9m4d", "priority": "best-effort"}
    api.add_pod(pod_object(nxt["name"], "ml", nxt["uid"], kubelet.node,
                           {"orion/priority": "best-effort"},
                           [{"name": "main", "resources": {"limits": {"orion.io/gpu": "1"}}}]))
    start_sharing_pod("train", nxt)
    t = time.monotonic()
    def reg_next():
        clients = ctl_clients(args, token_file) or []
        return [c for c in clients if c.get("pod_uid") == nxt["uid"]]
    c = wait_for("the next pod to register", reg_next, 15, 0.05)[0]
    new_slot = int(c.get("slot", 0))
    log(f"{nxt['name']}: Allocate got device {nxt['device']}, registered in "
        f"{time.monotonic() - t:.2f} s with server slot {new_slot} (slots in use by others: "
        f"{sorted(others)})")
    if new_slot != slot or nxt["device"] != p["device"]:
        raise CheckFailed(f"the next pod got slot {new_slot} / device {nxt['device']}, "
                          f"not the freed slot {slot} / device {p['device']}")
    kubelet.remove_sandbox(nxt["sid"])
    api.delete_pod(nxt["uid"])

if __name__ == "__main__":
    try:
        main()
    except CheckFailed as e:
        print(f"check-pods: FAILED: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
