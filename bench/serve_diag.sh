#!/usr/bin/env bash
# What a service's latency alone is made of on this machine: the CPU limits the process runs
# under (cgroup quota, throttling), the GPU clocks, the closed-loop capacity, and the service's
# latency vs its service time (queueing excluded) at several fractions of that capacity, polling
# and sleeping between arrivals. Run it before trusting "alone" baselines of the priority benchmark.
#   bench/serve_diag.sh [MODEL] [--graph]      (MODEL: resnet50 (default) or bert)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
M="${1:-resnet50}"; shift || true
TM=(python3 "$ROOT/bench/torch_models.py" serve "$M" "$@")
echo "== cpus: nproc=$(nproc) cpu.max=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo n/a)"
grep -E 'throttled' /sys/fs/cgroup/cpu.stat 2>/dev/null || true
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,pstate --format=csv || true
cap=$("${TM[@]}" --rate 0 | sed -n 's/.*capacity_rps=\([0-9.]*\).*/\1/p')
echo "== capacity alone (closed loop): ${cap} requests/s"
for frac in 0.5 0.35 0.2; do
  rate=$(python3 -c "print(round($cap * $frac, 1))")
  for wait in poll sleep; do
    echo "== rate=$rate ($frac of capacity) wait=$wait"
    "${TM[@]}" --rate "$rate" --requests "${REQS:-1500}" --wait "$wait" | grep '^result'
  done
done
grep -E 'throttled' /sys/fs/cgroup/cpu.stat 2>/dev/null || true
nvidia-smi --query-gpu=clocks.sm,clocks.mem,pstate --format=csv || true
