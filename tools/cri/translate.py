"""Pod specs -> CRI settings, for tools/cri/kubelet.py: what a kubelet makes of a pod's spec
(volumes, containers, environment, probes, security contexts) before it calls the runtime. Used
for the chart's pods (the DaemonSet's node pod, the webhook Deployment's pod) and for the
sharing pods the check writes itself. A field it does not handle fails the check with its name.
"""
import base64
import os
import subprocess

from common import CheckFailed

# The scheduler's fields (nodeName: its binding); this node is the one chosen.
POD_FIELDS_SCHEDULING = {"nodeSelector", "tolerations", "priorityClassName", "affinity",
                         "nodeName"}
POD_FIELDS = {"containers", "volumes", "hostPID", "hostNetwork", "serviceAccountName",
              "imagePullSecrets", "runtimeClassName", "securityContext",
              "automountServiceAccountToken"} | POD_FIELDS_SCHEDULING
POD_SECURITY_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile"}
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "ports",
                    "livenessProbe", "readinessProbe", "securityContext", "resources",
                    "volumeMounts"}
SECURITY_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "allowPrivilegeEscalation",
                   "readOnlyRootFilesystem", "capabilities", "privileged", "seccompProfile"}
SECCOMP_TYPES = {"RuntimeDefault", "Unconfined"}


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


def seccomp_of(where, sc):
    """A securityContext's seccompProfile -> "RuntimeDefault", "Unconfined" or None (unset)."""
    prof = sc.get("seccompProfile")
    if prof is None:
        return None
    unknown(f"{where} seccompProfile", prof, {"type"})
    if prof.get("type") not in SECCOMP_TYPES:
        raise CheckFailed(f"translator: {where}: seccompProfile type {prof.get('type')} not handled")
    return prof["type"]


def chart_objects(docs):
    """ConfigMaps and Secrets of a rendered chart, by name."""
    return ({d["metadata"]["name"]: d for d in docs if d and d.get("kind") == "ConfigMap"},
            {d["metadata"]["name"]: d for d in docs if d and d.get("kind") == "Secret"})


def workload(docs, kind, component=None):
    """The one rendered object of `kind` (with label app.kubernetes.io/component, if given)."""
    found = [d for d in docs if d and d.get("kind") == kind and
             (component is None or
              d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component)]
    if len(found) != 1:
        raise CheckFailed(f"the chart rendered {len(found)} {kind}s"
                          f"{f' of component {component}' if component else ''}, expected 1")
    return found[0]


# A configMap or secret volume's source: the field naming the object, its kind, how its data
# becomes file contents.
PROJECTED = {"configMap": ("name", "ConfigMap", str.encode),
             "secret": ("secretName", "Secret", base64.b64decode)}


def project_volume(vname, kind, src, rendered, d):
    """Writes the rendered ConfigMap's or Secret's data into folder d, a file a key."""
    ref, what, decode = PROJECTED[kind]
    unknown(f"volume {vname}.{kind}", src, {ref, "defaultMode", "items"})
    obj = rendered.get(src[ref])
    if obj is None:
        raise CheckFailed(f"volume {vname}: {what} {src[ref]} not rendered")
    os.makedirs(d, exist_ok=True)
    for k, val in obj.get("data", {}).items():
        path = os.path.join(d, k)
        with open(path, "wb") as f:
            f.write(decode(val))
        os.chmod(path, src.get("defaultMode", 0o644))


def translate_pod(spec, name, namespace, uid, work, api, node, objects=({}, {})):
    """A pod spec -> its sandbox settings and per-container CRI settings. `objects`: the
    ConfigMaps and Secrets its volumes may name."""
    configmaps, secrets = objects
    unknown(f"pod {name} spec", spec, POD_FIELDS)
    psc = spec.get("securityContext", {})
    unknown(f"pod {name} securityContext", psc, POD_SECURITY_FIELDS)
    pod_seccomp = seccomp_of(f"pod {name}", psc)
    vol_root = os.path.join(work, "pods", uid, "volumes")
    volumes = {}
    for v in spec.get("volumes", []):
        vname = v["name"]
        kinds = set(v) - {"name"}
        d = os.path.join(vol_root, vname)
        if kinds in ({"configMap"}, {"secret"}):
            kind = next(iter(kinds))
            project_volume(vname, kind, v[kind], configmaps if kind == "configMap" else secrets, d)
            volumes[vname] = (d, True)
        elif kinds == {"emptyDir"}:
            unknown(f"volume {vname}.emptyDir", v["emptyDir"], {"medium", "sizeLimit"})
            os.makedirs(d, exist_ok=True)
            volumes[vname] = (d, False)
        elif kinds == {"hostPath"}:
            unknown(f"volume {vname}.hostPath", v["hostPath"], {"path", "type"})
            path, kind = v["hostPath"]["path"], v["hostPath"].get("type", "")
            if kind == "DirectoryOrCreate":
                os.makedirs(path, exist_ok=True)
            elif kind == "Directory":
                if not os.path.isdir(path):
                    raise CheckFailed(f"volume {vname}: hostPath {path} (type Directory) missing")
            elif kind:
                raise CheckFailed(f"translator: volume {vname}: hostPath type {kind} not handled")
            volumes[vname] = (path, False)
        else:
            raise CheckFailed(f"translator: volume {vname}: kind {', '.join(sorted(kinds))} "
                              f"not handled")
    # The kubelet's service account volume (automountServiceAccountToken) and in-cluster env.
    sa = None
    if spec.get("automountServiceAccountToken", True):
        sa = os.path.join(vol_root, "kube-api-access")
        os.makedirs(sa, exist_ok=True)
        with open(os.path.join(sa, "token"), "w") as f:
            f.write(api.token)
        with open(os.path.join(sa, "namespace"), "w") as f:
            f.write(namespace)
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
                fields = {"spec.nodeName": node, "metadata.namespace": namespace}
                if ref not in fields:
                    raise CheckFailed(f"translator: env {e['name']}: valueFrom {e['valueFrom']} "
                                      f"not handled")
                env[e["name"]] = fields[ref]
        mounts = [("/var/run/secrets/kubernetes.io/serviceaccount", sa, True)] if sa else []
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
                if "httpGet" in p:
                    unknown(f"container {c['name']} {probe_name}.httpGet", p["httpGet"],
                            {"path", "port", "scheme"})
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        user = sc.get("runAsUser", psc.get("runAsUser"))
        group = sc.get("runAsGroup", psc.get("runAsGroup"))
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) and user == 0:
            raise CheckFailed(f"container {c['name']}: runAsNonRoot with runAsUser 0 (the kubelet "
                              f"refuses to start it)")
        containers.append({
            "name": c["name"], "image": c["image"], "command": c.get("command", []),
            "args": [expand(a, env) for a in c.get("args", [])], "env": env, "mounts": mounts,
            "run_as": (user, group) if user is not None else None,
            "run_as_non_root": bool(sc.get("runAsNonRoot", psc.get("runAsNonRoot"))),
            "ro_root": bool(sc.get("readOnlyRootFilesystem")),
            "drop": caps.get("drop", []),
            "no_new_privs": sc.get("allowPrivilegeEscalation") is False,
            "seccomp": seccomp_of(f"container {c['name']}", sc) or pod_seccomp,
            "memory": int(quantity(res.get("limits", {}).get("memory", 0))),
            "cpu_shares": max(2, int(quantity(res.get("requests", {}).get("cpu", 0)) * 1024)),
            "limits": dict(res.get("limits", {})),
            "readiness": c.get("readinessProbe"), "ports": ports})
    return {"uid": uid, "name": name, "namespace": namespace,
            "host_pid": bool(spec.get("hostPID")), "containers": containers,
            "runtime_handler": spec.get("runtimeClassName", ""), "seccomp": pod_seccomp,
            "fields": sorted(set(spec) - POD_FIELDS_SCHEDULING),
            "scheduling": sorted(set(spec) & POD_FIELDS_SCHEDULING),
            "volumes": {v["name"]: (set(v) - {"name"}).pop() for v in spec.get("volumes", [])}}
