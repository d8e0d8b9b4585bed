"""The Kubernetes side the test kubelet (tools/cri/kubelet.py) stands on: a test API server
(HTTPS, in-cluster style, listing and watching the node's pods as the agent's pod watcher reads
them, taking Events, serving the ResourceClaims a step puts there and keeping the ResourceSlices
the agent's DRA plugin writes), the kubelet's device plugin Registration server (v1beta1:
Register, then ListAndWatch and Allocate against the plugin's socket), and the kubelet's DRA
side (the plugin watcher's registration calls, then NodePrepareResources and
NodeUnprepareResources over the DRA v1 gRPC API)."""
import http.server
import json
import os
import queue
import ssl
import subprocess
import threading
import time
import uuid
from concurrent import futures

import grpc

from common import CheckFailed


# ---------------------------------------------------------------------------------------------
# Test API server: HTTPS on 127.0.0.1 as a pod's in-cluster config reaches it.

class ApiServer:
    def __init__(self, work, node_name):
        self.node_name = node_name
        self.node_uid = str(uuid.uuid4())
        self.pods = {}  # uid -> pod object
        self.rv = 100
        self.lock = threading.Lock()
        self.watchers = []  # queues of watch lines
        self.events = []
        self.requests = []
        self.claims = {}  # (namespace, name) -> ResourceClaim
        self.slices = {}  # name -> ResourceSlice
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

            def _reply(self, status, obj):
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self):
                n = int(self.headers.get("Content-Length", "0"))
                return self.rfile.read(n)

            def _resource(self, method):
                """resource.k8s.io/v1: claims by namespace and name, slices as a real API
                server keeps them (409 on a stale resourceVersion or an existing name)."""
                path, _, query = self.path.partition("?")
                parts = path.split("/")  # ['', 'apis', 'resource.k8s.io', 'v1', ...]
                body = self._body() if method in ("POST", "PUT") else b""
                with outer.lock:
                    outer.requests.append(f"{method} {self.path}")
                    if len(parts) == 8 and parts[4] == "namespaces" and \
                            parts[6] == "resourceclaims" and method == "GET":
                        claim = outer.claims.get((parts[5], parts[7]))
                        return self._reply(200 if claim else 404,
                                           claim or {"kind": "Status", "code": 404})
                    if parts[4:] == ["resourceslices"] and method == "GET":
                        items = [s for s in outer.slices.values()
                                 if f"spec.nodeName%3D{s['spec']['nodeName']}%2C" in query]
                        return self._reply(200, {"kind": "ResourceSliceList", "items": items})
                    if parts[4:] == ["resourceslices"] and method == "POST":
                        obj = json.loads(body)
                        name = obj["metadata"]["name"]
                        if name in outer.slices:
                            return self._reply(409, {"kind": "Status", "code": 409})
                        outer.rv += 1
                        obj["metadata"]["resourceVersion"] = str(outer.rv)
                        outer.slices[name] = obj
                        return self._reply(201, obj)
                    if len(parts) == 6 and parts[4] == "resourceslices" and parts[5] in outer.slices:
                        name = parts[5]
                        if method == "DELETE":
                            del outer.slices[name]
                            return self._reply(200, {"kind": "Status", "code": 200})
                        if method == "PUT":
                            obj = json.loads(body)
                            if obj["metadata"].get("resourceVersion") != \
                                    outer.slices[name]["metadata"]["resourceVersion"]:
                                return self._reply(409, {"kind": "Status", "code": 409})
                            outer.rv += 1
                            obj["metadata"]["resourceVersion"] = str(outer.rv)
                            outer.slices[name] = obj
                            return self._reply(200, obj)
                return self._reply(404, {"kind": "Status", "code": 404})

            def do_PUT(self):
                if self._auth():
                    self._resource("PUT")

            def do_DELETE(self):
                if self._auth():
                    self._resource("DELETE")

            def do_GET(self):
                if self.path.startswith("/apis/resource.k8s.io/v1/"):
                    if self._auth():
                        self._resource("GET")
                    return
                with outer.lock:
                    outer.requests.append(self.path)
                if not self._auth():
                    return
                if self.path == f"/api/v1/nodes/{outer.node_name}":
                    return self._reply(200, {"kind": "Node", "apiVersion": "v1", "metadata": {
                        "name": outer.node_name, "uid": outer.node_uid}})
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
                if self.path.startswith("/apis/resource.k8s.io/v1/"):
                    if self._auth():
                        self._resource("POST")
                    return
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

    def put_claim(self, claim):
        with self.lock:
            self.rv += 1
            claim["metadata"]["resourceVersion"] = str(self.rv)
            self.claims[(claim["metadata"]["namespace"], claim["metadata"]["name"])] = claim

    def resource_slices(self):
        with self.lock:
            return json.loads(json.dumps(list(self.slices.values())))

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
        self.devices = {}  # resource -> its plugin's latest device list
        self.endpoints = {}  # resource -> the plugin socket it registered last
        self.streams = []  # per registration: ListAndWatch answers received so far
        self.cv = threading.Condition()
        outer = self

        class Registration(self.rpc.RegistrationServicer):
            def Register(self, request, context):
                with outer.cv:
                    outer.registered.append(request)
                    outer.endpoints[request.resource_name] = request.endpoint
                    outer.streams.append(0)
                    index = len(outer.streams) - 1
                    outer.cv.notify_all()
                threading.Thread(target=outer._watch,
                                 args=(request.endpoint, index, request.resource_name),
                                 daemon=True).start()
                return outer.pb.Empty()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.rpc.add_RegistrationServicer_to_server(Registration(), self.server)
        self.server.add_insecure_port(f"unix://{dp_dir}/kubelet.sock")
        self.server.start()

    def _watch(self, endpoint, index, resource):
        channel = grpc.insecure_channel(f"unix://{self.dir}/{endpoint}")
        stub = self.rpc.DevicePluginStub(channel)
        try:
            for resp in stub.ListAndWatch(self.pb.Empty()):
                with self.cv:
                    self.devices[resource] = list(resp.devices)
                    self.streams[index] += 1
                    self.cv.notify_all()
        except grpc.RpcError:
            pass

    def resources(self):
        """Registered resource names, in the order they first registered."""
        return list(dict.fromkeys(r.resource_name for r in self.registered))

    def _stub(self, resource):
        return self.rpc.DevicePluginStub(
            grpc.insecure_channel(f"unix://{self.dir}/{self.endpoints[resource]}"))

    def preferred(self, resource, available, size):
        """GetPreferredAllocation, as the kubelet's device manager asks it before Allocate."""
        resp = self._stub(resource).GetPreferredAllocation(self.pb.PreferredAllocationRequest(
            container_requests=[self.pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, allocation_size=size)]), timeout=10)
        return list(resp.container_responses[0].deviceIDs)

    def allocate(self, resource, device_ids):
        resp = self._stub(resource).Allocate(self.pb.AllocateRequest(container_requests=[
            self.pb.ContainerAllocateRequest(devices_ids=device_ids)]), timeout=10)
        return resp.container_responses[0]

    def stop(self):
        self.server.stop(0)


# ---------------------------------------------------------------------------------------------
# Test kubelet's DRA side: the plugin watcher's registration, then the DRA v1 calls.

class DraKubelet:
    """What the kubelet does with a DRA driver: finds its socket in plugins_registry, calls
    GetInfo, dials the endpoint it names if it speaks v1.DRAPlugin, tells the plugin with
    NotifyRegistrationStatus; then NodePrepareResources and NodeUnprepareResources."""

    def __init__(self, mods, registry_dir):
        self.reg_pb = mods["pluginregistration.v1.api_pb2"]
        self.reg_rpc = mods["pluginregistration.v1.api_pb2_grpc"]
        self.pb = mods["dra.v1.api_pb2"]
        self.rpc = mods["dra.v1.api_pb2_grpc"]
        self.registry_dir = registry_dir
        self.stub = None
        self.info = None

    def register(self, timeout=20):
        deadline = time.monotonic() + timeout
        while True:
            socks = [f for f in os.listdir(self.registry_dir) if f.endswith(".sock")] \
                if os.path.isdir(self.registry_dir) else []
            if socks:
                break
            if time.monotonic() > deadline:
                raise CheckFailed(f"no registration socket in {self.registry_dir} within "
                                       f"{timeout} s")
            time.sleep(0.1)
        path = os.path.join(self.registry_dir, sorted(socks)[0])
        reg = self.reg_rpc.RegistrationStub(grpc.insecure_channel(f"unix://{path}"))
        info = reg.GetInfo(self.reg_pb.InfoRequest(), timeout=10)
        ok = info.type == "DRAPlugin" and "v1.DRAPlugin" in info.supported_versions
        reg.NotifyRegistrationStatus(self.reg_pb.RegistrationStatus(
            plugin_registered=ok, error="" if ok else "no supported type/version"), timeout=10)
        if not ok:
            raise CheckFailed(f"{path}: GetInfo {info} is not a v1 DRA plugin")
        self.info = info
        self.stub = self.rpc.DRAPluginStub(grpc.insecure_channel(f"unix://{info.endpoint}"))
        return path, info

    def _claims(self, claims):
        return [self.pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]

    def prepare(self, claims):
        return self.stub.NodePrepareResources(
            self.pb.NodePrepareResourcesRequest(claims=self._claims(claims)), timeout=30)

    def unprepare(self, claims):
        return self.stub.NodeUnprepareResources(
            self.pb.NodeUnprepareResourcesRequest(claims=self._claims(claims)), timeout=30)
