#!/usr/bin/env bash
# What following a high-priority service's launches costs its CPU, thread by thread (GPU machine).
# A high-priority eager ResNet50 service (Poisson arrivals, pinned to one core) runs under the
# interposer, registered with a real orion-server, in three arms:
#   alone        no best-effort client: its launches are not followed
#   beside       a ResNet50 trainer registered best effort (other cores), gate in priority mode:
#                every launch of the service is followed to completion (FollowHighPriority)
#   beside-pass  the same trainer, gate in pass-through mode: not followed, the GPU shared alike
# For each arm, bench/thread_cpu.py reads the CPU of every thread of the service (the driver's
# event thread is "cuda-EvtHandlr", the interposer's poller "orion-poller").
#   bash bench/follow_cost.sh BUNDLE [OUT]        (RATE=100 WINDOW=10 by default)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="$(cd "${1:?bundle folder}" && pwd)"
OUT="${2:-${OUT:-$(mktemp -d)}}"
RATE="${RATE:-100}"
WINDOW="${WINDOW:-10}"
mkdir -p "$OUT"
source "$ROOT/bench/server.sh"
start_server "$B" 50081 50082 taskset -c 0  # priority mode (the default)
trap 'kill $SERVER ${TRAINER:-} 2>/dev/null; wait $SERVER 2>/dev/null; cp "$W/server.log" "$OUT/" 2>/dev/null' EXIT
export ORION_SOCKET="$W/orion.sock"
export LD_LIBRARY_PATH="$B/lib"
ctl() { "$B/orion-ctl" --server 127.0.0.1:50081 "$@" > /dev/null; }
run="$B/orion-run --interposer $B/liborion_interpose.so"
for arm in alone beside beside-pass; do
  TRAINER=""
  if [[ "$arm" != alone ]]; then
    ctl policy --all mode=$([[ "$arm" == beside ]] && echo priority || echo pass-through)
    taskset -c 4-7 $run --priority best-effort -- python3 "$ROOT/bench/torch_models.py" train \
      resnet50 > "$OUT/trainer-$arm.log" 2>&1 &
    TRAINER=$!
    for _ in $(seq 300); do grep -q '^ready' "$OUT/trainer-$arm.log" 2>/dev/null && break; sleep 0.2; done
  fi
  echo "## $arm" | tee -a "$OUT/threads.md"
  python3 "$ROOT/bench/thread_cpu.py" --after 10 --window "$WINDOW" -- \
    taskset -c 2 $run --priority high -- python3 "$ROOT/bench/torch_models.py" serve resnet50 \
    --rate "$RATE" --requests 100000 | tee -a "$OUT/threads.md"
  if [[ -n "$TRAINER" ]]; then kill "$TRAINER" 2>/dev/null || true; wait "$TRAINER" 2>/dev/null || true; fi
done
ctl policy --all mode=priority
