#!/usr/bin/env bash
# On a GPU machine: PyTorch under a 2 GiB orion quota with the three allocator configurations,
# and the per-launch cost without the interposer, with it unregistered (no server: pass-through),
# and registered (recording events) in best-effort and high-priority modes.
#   bench/gpu_quota_overhead.sh BUNDLE_DIR
set -uo pipefail
B="$(cd "$1" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/bench/server.sh"
start_server "$B" 50062 9475 || exit 1
RUN() { ORION_SOCKET="$W/orion.sock" "$B/orion-run" --interposer "$B/liborion_interpose.so" "$@"; }
echo "== quota 2Gi"
for conf in "" "expandable_segments:True" "backend:cudaMallocAsync"; do
  PYTORCH_CUDA_ALLOC_CONF="$conf" RUN --memory-limit 2Gi -- python3 "$ROOT/bench/torch_quota.py" 2>&1 | grep '^result'
done
echo "== launch cost"
echo "no interposer:      $(python3 "$ROOT/bench/launch_rate.py" | grep ^result)"
echo "no server:          $(ORION_QUIET=1 ORION_SOCKET=/nonexistent LD_PRELOAD=$B/liborion_interpose.so python3 "$ROOT/bench/launch_rate.py" | grep ^result)"
echo "registered, BE:     $(RUN --priority best-effort -- python3 "$ROOT/bench/launch_rate.py" | grep ^result)"
echo "registered, HP:     $(RUN --priority high -- python3 "$ROOT/bench/launch_rate.py" | grep ^result)"
echo "no interposer again: $(python3 "$ROOT/bench/launch_rate.py" | grep ^result)"
