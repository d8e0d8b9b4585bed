#!/usr/bin/env bash
# Collectives are never held at the gate, on the CUDA driver test double with the real server:
# beside a high-priority service that keeps the GPU busy, a best-effort trainer whose kernels
# are named like NCCL's (ncclDevKernel_...) is never held (it launches hundreds of kernels, none
# of them waits), while the same trainer with ordinary kernel names is held (nearly all the time
# in priority mode, half of it and more in mps mode).
# A held collective would leave its peers on other GPUs spinning until it ran. MODE is the
# gate's mode (priority unless given; mps: the gate admits against the work in flight).
#   collectives_test.sh ORION_SERVER ORION_RUN SAMPLE_TRAIN SAMPLE_INFER INTERPOSER CUDA_DOUBLE_DIR [MODE]
set -euo pipefail
SERVER="$1"; RUN="$2"; TRAIN="$3"; INFER="$4"; LIB="$5"; DOUBLE="$6"; MODE="${7:-priority}"
source "$(dirname "$0")/server_lib.sh"
start_server "$SERVER" "$MODE"
mport="$METRICS_PORT"
# The service: back to back, 4 x 2 ms per request; the gate holds best-effort work meanwhile.
client --priority high -- "$INFER" --rate 0 --requests 100000 --kernels 4 --kernel-us 2000 \
  > "$W/infer.out" 2>&1 &
PIDS+=($!)
sleep 0.5
# Seconds the best-effort client was held, and kernels it launched, while it runs 1.5 s.
held_and_launched() {
  client --priority best-effort -- "$TRAIN" --seconds 30 --kernels 4 --kernel-us 1000 "$@" \
    > "$W/train.out" 2>&1 &
  TPID=$!
  sleep 1.5
  curl -sf "http://127.0.0.1:$mport/metrics" > "$W/metrics.txt" || fail "no /metrics"
  pkill -P "$TPID" 2>/dev/null || true; kill "$TPID"; wait "$TPID" 2>/dev/null || true
  sleep 0.3  # the server sees it leave
  awk '/^orion_client_throttled_seconds_total\{.*priority="best-effort"/ { h = $2 }
       /^orion_client_kernels_launched_total\{.*priority="best-effort"/ { k = $2 }
       END { print h + 0, k + 0 }' "$W/metrics.txt"
}
read -r held_plain launched_plain <<< "$(held_and_launched)"
read -r held_nccl launched_nccl <<< "$(held_and_launched --kernel-prefix ncclDevKernel_)"
echo "$MODE mode: ordinary kernels: held ${held_plain} s, ${launched_plain} launched;" \
     "collectives: held ${held_nccl} s, ${launched_nccl} launched"
python3 - "$held_plain" "$launched_plain" "$held_nccl" "$launched_nccl" <<'PY' || fail "see above"
import sys
held_plain, launched_plain, held_nccl, launched_nccl = map(float, sys.argv[1:])
# The ordinary trainer is judged by how little it launched, or by how long it was held, a wait
# in progress included (in mps mode the gate admits part of its work against what is in flight:
# 150 to 250 launches, held 0.7 to 1.0 s of the 1.5).
assert launched_nccl > 100, f"the collective trainer launched only {launched_nccl} kernels"
assert launched_plain < 0.2 * launched_nccl or held_plain >= 0.3, \
    f"ordinary kernels were not held: {launched_plain} launched against {launched_nccl}, " \
    f"held {held_plain} s"
assert held_nccl == 0, f"collectives were held {held_nccl} s at the gate"
PY
echo "collectives: ok"
