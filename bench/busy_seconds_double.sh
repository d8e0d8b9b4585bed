#!/usr/bin/env bash
# Busy seconds against the truth, on the CUDA driver test double (CPU only): the double knows
# exactly how long every kernel ran (its busy_ns_total), so the server's per-client busy seconds
# can be held against it. An eager-like service (short kernels, CPU time between launches, the
# GPU idle before each kernel) and a queued one (the same kernels back to back) run registered
# high priority with every launch the pool of timing events allows timed (ORION_PROFILE=1) and
# the timing diagnostic on; prints for each the ratio busy seconds / true kernel time and the
# timing log's summary.
#   bash bench/busy_seconds_double.sh [BUILD_DIR]        (default build)
# The double starts a kernel inside the launch call, as a GPU starts one once the driver has
# handed it over, and with no start latency beyond an event's: ORION_KERNEL_START_NS=0 and
# ORION_QUEUED_START_NS=0 here (interpose/sample_timing.h; 1 and 2.4 us, the defaults, were
# measured on an H100).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="$(cd "${1:-$ROOT/build}" && pwd)"
SERVER="$B/server/orion-server"; RUN="$B/tools/orion-run"; LIB="$B/interpose/liborion_interpose.so"
INFER="$B/samples/orion-sample-infer"; DOUBLE="$B/tests/cuda_double/lib"
source "$ROOT/tests/tools/server_lib.sh"
start_server "$SERVER"
true_ns() {  # the double's busy_ns_total (SimGpuFile: 4 x uint32, 2 x uint64, then it)
  python3 -c 'import struct,sys; d=open(sys.argv[1],"rb").read(40); print(struct.unpack_from("<Q",d,32)[0])' "$W/gpu0"
}
busy_s() {  # the server's high-priority busy seconds of GPU 0 (they outlive the client)
  curl -s "http://127.0.0.1:$METRICS_PORT/metrics" |
    awk '$1 ~ /^orion_gpu_busy_seconds_total/ && $1 ~ /priority="high"/ { v += $2 } END { print v + 0 }'
}
printf '| service | kernels | true kernel time (s) | busy seconds | ratio |\n|---|---|---|---|---|\n'
for shape in "eager:--kernels 40 --kernel-us 5 --cpu-us 20" "queued:--kernels 40 --kernel-us 5 --cpu-us 0"; do
  name="${shape%%:*}"; args="${shape#*:}"
  mkdir -p "$W/timing-$name"
  before="$( [[ -f "$W/gpu0" ]] && true_ns || echo 0)"
  # shellcheck disable=SC2086
  ORION_PROFILE=1 ORION_KERNEL_START_NS=0 ORION_QUEUED_START_NS=0 ORION_TIMING_LOG="$W/timing-$name" client --priority high -- \
    "$INFER" --rate 0 --requests 200 --warmup 5 $args > "$W/$name.out" 2>&1 || fail "$name: $(cat "$W/$name.out")"
  sleep 1.2  # the server drains the ring and the metrics catch up
  after="$(true_ns)"
  curl -s "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E "^orion_(events_dropped|events_skipped|events_ingested|events_written)" >> "$W/events.txt" || true
  busy="$(busy_s)"
  python3 -c 'import sys; t=(int(sys.argv[2])-int(sys.argv[1]))/1e9; b=float(sys.argv[3]); print(f"| {sys.argv[4]} | 205 x 40 x 5 us | {t:.4f} | {b:.4f} | {b/t:.3f} |")' \
    "$before" "$after" "$busy" "$name"
  # The next run is a new client with its own counter: restart it from zero.
  kill "${PIDS[0]}"; wait "${PIDS[0]}" 2>/dev/null || true; PIDS=(); start_server "$SERVER"
done
echo
python3 "$ROOT/bench/timing_log_summary.py" "$W"/timing-eager "$W"/timing-queued
cat "$W/events.txt"
