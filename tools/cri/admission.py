"""The API server's part in admitting a pod, for tools/cri/kubelet.py: an AdmissionReview v1 sent
over HTTPS to the chart's mutating webhook, as the MutatingWebhookConfiguration says to reach it
(its caBundle, the service's DNS name for TLS verification, its path), and the answer's JSON
patch (RFC 6902) applied to the pod, as the API server stores it."""
import base64
import copy
import http.client
import json
import socket
import ssl
import tempfile
import time
import uuid

from common import CheckFailed


class Webhook:
    def __init__(self, config, port):
        """config: the rendered MutatingWebhookConfiguration; port: where the webhook's pod
        listens on this node (it runs with host network here, no Service routing)."""
        hooks = config.get("webhooks", [])
        if len(hooks) != 1:
            raise CheckFailed(f"MutatingWebhookConfiguration {config['metadata']['name']}: "
                              f"{len(hooks)} webhooks, expected 1")
        self.hook = hooks[0]
        cc = self.hook["clientConfig"]
        svc = cc.get("service")
        if not svc or "caBundle" not in cc:
            raise CheckFailed("translator: webhook clientConfig without service and caBundle "
                              "not handled")
        self.dns = f"{svc['name']}.{svc['namespace']}.svc"
        self.path = svc.get("path", "/")
        self.port = port
        with tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False) as f:
            f.write(base64.b64decode(cc["caBundle"]))
            self.ca_file = f.name
        self.ctx = ssl.create_default_context(cafile=self.ca_file)
        self.calls = []  # seconds per call

    def review(self, pod, timeout=10):
        """Sends `pod` (a Pod object, CREATE) and returns the AdmissionReview's response."""
        uid = str(uuid.uuid4())
        body = json.dumps({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": uid, "operation": "CREATE",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "name": pod["metadata"]["name"], "namespace": pod["metadata"]["namespace"],
                "userInfo": {"username": "system:serviceaccount:ml:deployer"},
                "object": pod, "oldObject": None, "dryRun": False,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}})
        t = time.monotonic()
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        conn = http.client.HTTPSConnection(self.dns, self.port, timeout=timeout,
                                           context=self.ctx)
        try:
            # TLS verified against the CA bundle and the service's DNS name, as the API server
            # does, while the bytes go to the pod on this node.
            conn.sock = self.ctx.wrap_socket(raw, server_hostname=self.dns)
            conn.request("POST", f"{self.path}?timeout={self.hook.get('timeoutSeconds', 10)}s",
                         body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, ssl.SSLError, http.client.HTTPException) as e:
            raise CheckFailed(f"webhook https://{self.dns}:{self.port}{self.path}: {e}") from None
        finally:
            conn.close()
        self.calls.append(time.monotonic() - t)
        if resp.status != 200:
            raise CheckFailed(f"webhook answered HTTP {resp.status}: {data[:300]!r}")
        review = json.loads(data)
        r = review.get("response", {})
        if review.get("kind") != "AdmissionReview" or r.get("uid") != uid:
            raise CheckFailed(f"webhook answer is not the review's response: {data[:300]!r}")
        return r

    def admit(self, pod):
        """The pod as the API server stores it after this webhook, and the patch applied."""
        r = self.review(pod)
        if not r.get("allowed"):
            raise CheckFailed(f"webhook refused pod {pod['metadata']['name']}: {r.get('status')}")
        if "patch" not in r:
            return copy.deepcopy(pod), [], r.get("warnings", [])
        if r.get("patchType") != "JSONPatch":
            raise CheckFailed(f"webhook patchType {r.get('patchType')}, expected JSONPatch")
        ops = json.loads(base64.b64decode(r["patch"]))
        return apply_patch(pod, ops), ops, r.get("warnings", [])


def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise CheckFailed(f"JSON patch path {path!r} is not a JSON pointer")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _parent(doc, tokens, path):
    cur = doc
    for t in tokens[:-1]:
        if isinstance(cur, list):
            cur = cur[int(t)]
        elif isinstance(cur, dict) and t in cur:
            cur = cur[t]
        else:
            raise CheckFailed(f"JSON patch: {path}: {t} does not exist")
    return cur


def _take(doc, path):
    """Removes and returns the value at `path` (RFC 6902 move's "from")."""
    tokens = _pointer(path)
    if not tokens:
        raise CheckFailed("JSON patch: move of the whole document not handled")
    parent, last = _parent(doc, tokens, path), tokens[-1]
    if isinstance(parent, list):
        return parent.pop(int(last))
    if last not in parent:
        raise CheckFailed(f"JSON patch: move from missing {path}")
    return parent.pop(last)


def apply_patch(doc, ops):
    """RFC 6902 add, remove, replace, move and test on a copy of doc."""
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        tokens = _pointer(path)
        if not tokens:
            raise CheckFailed(f"JSON patch: {kind} of the whole document not handled")
        if kind == "move":  # remove at "from", then add its value at "path"
            op = {"op": "add", "path": path, "value": _take(doc, op.get("from", ""))}
            kind = "add"
        parent, last = _parent(doc, tokens, path), tokens[-1]
        if kind == "add":
            if isinstance(parent, list):
                idx = len(parent) if last == "-" else int(last)
                parent.insert(idx, op["value"])
            else:
                parent[last] = op["value"]
        elif kind == "replace":
            if isinstance(parent, list):
                parent[int(last)] = op["value"]
            elif last in parent:
                parent[last] = op["value"]
            else:
                raise CheckFailed(f"JSON patch: replace of missing {path}")
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            elif last in parent:
                del parent[last]
            else:
                raise CheckFailed(f"JSON patch: remove of missing {path}")
        elif kind == "test":
            value = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if value != op["value"]:
                raise CheckFailed(f"JSON patch: test of {path} failed")
        else:
            raise CheckFailed(f"JSON patch: op {kind!r} not handled")
    return doc
