#!/usr/bin/env bash
# Log mode on a GPU: a small PyTorch training loop runs under the interposer with ORION_LOG_DIR
# and no server. Prints what the call log holds next to what torch.profiler (CUPTI) saw in the
# same loop: kernel launches, and host-to-device / device-to-host copies with their direction.
# Writes the logs, the converted trace and a JSON summary to $OUT.
#   bench/call_log_gpu.sh BUNDLE_DIR
set -euo pipefail
B="$(cd "$1" && pwd)"
OUT="${OUT:-$(mktemp -d /tmp/orion-call-log-gpu.XXXXXX)}"
W="$(mktemp -d /tmp/orion-call-log-job.XXXXXX)"
cat > "$W/job.py" <<'PY'
import json, sys, torch
from torch.profiler import profile, ProfilerActivity
m = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                        torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(64, 1024)
def step():
    y = m(x.cuda())
    y.sum().backward()
    opt.step()
    opt.zero_grad()
    return y.cpu()
for _ in range(5):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(50):
        step()
    torch.cuda.synchronize()
kinds = {"kernel": 0, "h2d": 0, "d2h": 0}
for e in p.events():
    if e.device_type != torch.autograd.DeviceType.CUDA:
        continue
    n = e.name
    if "Memcpy HtoD" in n: kinds["h2d"] += 1
    elif "Memcpy DtoH" in n: kinds["d2h"] += 1
    elif "Memcpy" in n or "Memset" in n: pass
    else: kinds["kernel"] += 1
json.dump(kinds, open(sys.argv[1], "w"))
PY
env LD_PRELOAD="$B/liborion_interpose.so" ORION_SOCKET="$W/nobody.sock" ORION_LOG_DIR="$OUT/logs" \
  python3 "$W/job.py" "$OUT/profiler.json" 2> "$OUT/job.err"
LD_LIBRARY_PATH="$B/lib" "$B/orion-ctl" timeline --from-log "$OUT/logs" --trace "$OUT/trace.json"
python3 - "$OUT" <<'PY'
import glob, json, sys, collections
out = sys.argv[1]
prof = json.load(open(out + "/profiler.json"))
calls = collections.Counter()
for f in glob.glob(out + "/logs/timeline.*.log"):
    for line in open(f):
        if line.startswith("#"): continue
        start, dur, call, name, nbytes, kind = line.rstrip("\n").split("\t")
        calls["kernel" if call == "cuLaunchKernel" else kind if kind in ("h2d", "d2h", "d2d", "h2h") else call] += 1
summary = {"profiler_in_window_(55_steps_less_5_warmup)": prof, "call_log_whole_run_(55_steps)": dict(calls)}
# The log covers 55 steps (5 warm-up + 50 profiled); per step it should hold what CUPTI saw.
per_step = {k: calls.get(k, 0) / 55 for k in ("kernel", "h2d", "d2h")}
cupti_per_step = {k: prof[k] / 50 for k in ("kernel", "h2d", "d2h")}
summary["per_step"] = {"call_log": per_step, "cupti": cupti_per_step}
json.dump(summary, open(out + "/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
