#!/usr/bin/env bash
# The main job: installs dependencies, builds, starts orion-server with its default policy, and
# runs a latency-critical service (high priority) next to a trainer (best effort) through
# orion-run, first alone, then with the trainer in pass-through (today's time-slicing), then with
# orion-gpu-share enforcing priority. Prints each phase's latency, then where the metrics and the
# timeline are, and what it printed from each. Without an NVIDIA GPU it runs on the CUDA driver
# test double (a simulated GPU, through tools/simulated-gpu.sh) and says so. The server stops when
# the script ends, unless ORION_DEMO_KEEP=1 keeps it up for the commands printed (Ctrl-C stops it).
#   ORION_DEMO_SECONDS (default 6)  length of each phase
#   ORION_DEMO_KEEP (default 0)     1: keep the server up at the end until Ctrl-C
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECONDS_PER_PHASE="${ORION_DEMO_SECONDS:-6}"

bash tools/setup-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build -j "$(nproc)"

BIN="$ROOT/build"
RUN_DIR="$(mktemp -d /tmp/orion-demo.XXXXXX)"
ADMIN_PORT="${ORION_DEMO_ADMIN_PORT:-50051}"
METRICS_PORT="${ORION_DEMO_METRICS_PORT:-9464}"

if [[ -e /proc/driver/nvidia/gpus ]] && ls /proc/driver/nvidia/gpus/* > /dev/null 2>&1; then
  MODE="NVIDIA GPU"
  KERNEL_US=200
else
  MODE="CUDA driver test double (simulated GPU; no NVIDIA GPU on this machine)"
  source tools/simulated-gpu.sh > /dev/null
  export ORION_SIM_DIR="$RUN_DIR/sim"
  KERNEL_US=200
fi
echo "== orion-gpu-share demo on: $MODE"

cat > "$RUN_DIR/server.yaml" <<YAML
socket_path: $RUN_DIR/orion.sock
admin_address: 127.0.0.1:$ADMIN_PORT
metrics_address: 127.0.0.1:$METRICS_PORT
mode: priority
YAML
"$BIN/server/orion-server" --config "$RUN_DIR/server.yaml" 2> "$RUN_DIR/server.log" &
SERVER_PID=$!
cleanup() { kill "$SERVER_PID" 2> /dev/null || true; wait "$SERVER_PID" 2> /dev/null || true; }
trap cleanup EXIT
for _ in $(seq 100); do [[ -S "$RUN_DIR/orion.sock" ]] && break; sleep 0.05; done
[[ -S "$RUN_DIR/orion.sock" ]] || { cat "$RUN_DIR/server.log"; exit 1; }
export ORION_SOCKET="$RUN_DIR/orion.sock" ORION_ADMIN="127.0.0.1:$ADMIN_PORT"
RUN="$BIN/tools/orion-run --interposer $BIN/interpose/liborion_interpose.so"

# A service with 4 kernels per request, Poisson arrivals at ~40% of its capacity alone.
REQUESTS=$((SECONDS_PER_PHASE * 400))
INFER=("$BIN/samples/orion-sample-infer" --rate 400 --requests "$REQUESTS" --kernels 4
       --kernel-us "$KERNEL_US")
TRAIN=("$BIN/samples/orion-sample-train" --seconds $((SECONDS_PER_PHASE + 2)) --kernels 20
       --kernel-us 1000)

phase() {  # name, gate mode, with_trainer
  "$BIN/tools/orion-ctl" policy --all "mode=$2" > /dev/null
  local train_pid=""
  if [[ "$3" == yes ]]; then
    $RUN --priority best-effort -- "${TRAIN[@]}" > "$RUN_DIR/train-$1.txt" 2>&1 &
    train_pid=$!
    sleep 0.5
  fi
  $RUN --priority high -- "${INFER[@]}" > "$RUN_DIR/infer-$1.txt" 2>&1
  if [[ "$1" == enforced ]]; then "$BIN/tools/orion-ctl" clients; fi
  [[ -n "$train_pid" ]] && wait "$train_pid"
  local r t
  r=$(grep '^result' "$RUN_DIR/infer-$1.txt" | tail -1)
  t=$( [[ -n "$train_pid" ]] && grep '^result' "$RUN_DIR/train-$1.txt" | tail -1 || echo "-")
  printf '%-12s %s\n%-12s trainer: %s\n' "$1" "$r" "" "$t"
}

echo "== high-priority service: ${INFER[*]##*/}"
phase alone pass-through no
phase shared pass-through yes
phase enforced priority yes

cat <<MSG

== where to look (the server stops when this script ends: rerun with ORION_DEMO_KEEP=1 to keep
   it up for these commands, ORION_DEMO_SECONDS=60 for longer phases; below, what they print now)
  metrics:   curl http://127.0.0.1:$METRICS_PORT/metrics | grep ^orion_
  timeline:  $BIN/tools/orion-ctl --server 127.0.0.1:$ADMIN_PORT timeline --last-ms 1000
  clients:   $BIN/tools/orion-ctl --server 127.0.0.1:$ADMIN_PORT clients
  server log and phase outputs: $RUN_DIR
MSG
echo "== last spans of the timeline:"
"$BIN/tools/orion-ctl" timeline --last-ms 100000 | tail -5
echo "== the whole run as a trace (open the .json in https://ui.perfetto.dev, the .html anywhere):"
"$BIN/tools/orion-ctl" timeline --last-ms 100000 --trace "$RUN_DIR/timeline.json" \
  --html "$RUN_DIR/timeline.html"
echo "== orion_ metrics (sample):"
curl -s "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^orion_(clients|registrations_total|events_ingested_total|client_throttled)' | head -8
if [[ "${ORION_DEMO_KEEP:-0}" == 1 ]]; then
  echo "== orion-server stays up (admin 127.0.0.1:$ADMIN_PORT); Ctrl-C stops it"
  wait "$SERVER_PID" || true
fi
