"""What the test kubelet (tools/cri/kubelet.py) reads of the node: orion-ctl against the server's
admin API (with the rendered Secret's reader or operator token), the server's /metrics in the
Prometheus text format, an exported timeline (Chrome trace JSON), and a container's CRI log."""
import json
import os
import re
import subprocess
import urllib.request

from common import CheckFailed


class Ctl:
    def __init__(self, build, admin_port, work, tokens):
        """tokens: the rendered Secret's `tokens` lines (ROLE NAME TOKEN)."""
        self.bin = os.path.join(build, "tools/orion-ctl")
        self.server = f"127.0.0.1:{admin_port}"
        self.files = {}
        for role in ("reader", "operator"):
            found = [line.split()[2] for line in tokens if line.startswith(role + " ")]
            if not found:
                raise CheckFailed(f"the rendered admin tokens Secret has no {role} token")
            self.files[role] = os.path.join(work, f"{role}-token")
            with open(self.files[role], "w") as f:
                f.write(found[0])
            os.chmod(self.files[role], 0o600)
        self.reader = self.files["reader"]

    def run(self, *args, role="reader", check=True, timeout=20):
        out = subprocess.run([self.bin, "--server", self.server, "--token-file", self.files[role],
                              *args], capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise CheckFailed(f"orion-ctl {' '.join(args)}: exit {out.returncode}: "
                              f"{out.stderr.strip() or out.stdout.strip()}")
        return out

    def clients(self):
        """The server's clients (JSON, proto field names), or None if it does not answer."""
        out = self.run("--json", "clients", check=False, timeout=10)
        if out.returncode != 0:
            return None
        data = json.loads(out.stdout or "{}")
        return data.get("clients", data if isinstance(data, list) else [])

    def gpus(self):
        return json.loads(self.run("--json", "gpus").stdout or "{}").get("gpus", [])

    def of_pod(self, uid, clients=None):
        clients = self.clients() if clients is None else clients
        return [c for c in clients or [] if c.get("pod_uid") == uid]


def scrape(port):
    """/metrics as {name: [(labels dict, value)]}."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError as e:
        raise CheckFailed(f"GET http://127.0.0.1:{port}/metrics: {e}") from None
    out = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        if not m:
            raise CheckFailed(f"/metrics: a line that is not a sample: {line!r}")
        labels = dict(label_re.findall(m.group(3) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(4))))
    return out


def memory_by_gpu(metrics):
    """sum by (gpu) (orion_client_memory_used_bytes), as a dashboard computes it."""
    total = {}
    for labels, v in metrics.get("orion_client_memory_used_bytes", []):
        total[labels.get("gpu")] = total.get(labels.get("gpu"), 0) + v
    return total


def trace_rows(path):
    """An exported Chrome trace: {row name: spans ('X' events) on that row}."""
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", "")
    rows = {}
    for e in events:
        if e.get("ph") == "X":
            name = names.get((e.get("pid"), e.get("tid")), "?")
            rows[name] = rows.get(name, 0) + 1
    return rows


def result_line(log_path, prefix="result "):
    """The last `result key=value ...` line a sample wrote to its CRI log, as a dict."""
    found = None
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                # CRI log format: TIMESTAMP STREAM TAG MESSAGE
                parts = line.rstrip("\n").split(" ", 3)
                msg = parts[3] if len(parts) == 4 else line
                if msg.startswith(prefix):
                    found = msg
    except OSError:
        return None
    if found is None:
        return None
    return dict(kv.split("=", 1) for kv in found[len(prefix):].split() if "=" in kv)


def log_lines(log_path):
    """A container's CRI log, the messages only."""
    with open(log_path, errors="replace") as f:
        return [(line.rstrip("\n").split(" ", 3) + [""] * 4)[3] for line in f]
