#!/usr/bin/env bash
# A best-effort job of two ranks on two simulated GPUs, each GPU with a high-priority service of
# another job (the case where a rank's collective spins while its peer is held): the real
# orion-server counts the job's GPUs beside services, and `orion-ctl jobs` notes it and what
# helps; with the service on one GPU only there is no note.
#   jobs_beside_services_test.sh ORION_SERVER ORION_CTL ORION_RUN TRAIN_SAMPLE INFER_SAMPLE INTERPOSER DOUBLE_DIR
set -euo pipefail
SERVER="$1"; CTL="$2"; RUN="$3"; TRAIN="$4"; INFER="$5"; LIB="$6"; DOUBLE="$7"
source "$(dirname "$0")/server_lib.sh"
export ORION_SIM_DEVICES=2

start_server "$SERVER"
ctl() { "$CTL" --server "127.0.0.1:$ADMIN_PORT" "$@"; }
service() {  # GPU: a high-priority graph service on that GPU (the double's UUID), its own job
  NVIDIA_VISIBLE_DEVICES="GPU-6f72696f-6e2d-7369-6d00-00000000000$1" client --priority high --job "serve-$1" -- "$INFER" --graph \
    --rate 200 --requests 100000 --kernels 2 --kernel-us 200 > "$W/serve-$1.out" 2>&1 &
  PIDS+=($!)
}
rank() {  # DEVICE: a rank of the best-effort job "train"
  client --priority best-effort --job train -- "$TRAIN" --device "$1" --seconds 30 --kernels 4 \
    --kernel-us 200 > "$W/rank-$1.out" 2>&1 &
  PIDS+=($!)
}
# Waits until OUTPUT of `orion-ctl ARGS...` has TEXT: until TEXT ARGS...
until_has() {
  local want="$1"; shift
  for _ in $(seq 200); do
    ctl "$@" 2>/dev/null | grep -qF -- "$want" && return 0
    sleep 0.05
  done
  fail "orion-ctl $* never said '$want': $(ctl "$@" 2>&1)"
}

service 0
rank 0
rank 1
# The job's two ranks, one GPU of them beside a service: counted, no note.
until_has '"ranks": 2' --json jobs
until_has '"gpus_beside_services": 1' --json jobs
out="$(ctl jobs)"
expect "$out" "serve-0" "train"
grep -q "^note:" <<< "$out" && fail "a note with a service on one GPU of the job: $out"

# A service on its other GPU too: the note says what it costs and what helps, and the metric.
service 1
until_has "note: train has best-effort ranks beside high-priority services on 2 GPUs" jobs
expect "$(ctl jobs)" "give it at most one GPU with a service, or run the GPUs in mps mode"
curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" > "$W/metrics.txt" || fail "no /metrics"
grep -q '^orion_job_gpus_beside_services{.*orion_job="train"} 2$' "$W/metrics.txt" ||
  fail "no orion_job_gpus_beside_services 2 for train: $(grep orion_job_gpus "$W/metrics.txt")"
echo "jobs beside services: ok"
