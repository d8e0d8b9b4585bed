#!/usr/bin/env bash
# The priority benchmark on a machine with an NVIDIA GPU, in the splits used for the published
# results (each fits one 10-minute slot of GPU time). Results go to $OUT (results.md/.jsonl).
#   bench/gpu_priority.sh BUNDLE_DIR [headline|mps|mps-gpt2|spread|paired|closed|pairs|samples]
# BUNDLE_DIR: tools/bundle.sh output. See bench/priority_bench.py for what each figure means.
set -euo pipefail
B="$1"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PB=(python3 "$ROOT/bench/priority_bench.py" --bundle "$B")
nvidia-smi -L || true
case "${2:-headline}" in
  # ResNet50 b4 eager beside ResNet50 b64 training, 5,000 requests per configuration: time-slicing,
  # MPS with the trainer at client priority 1 and 50% of the SMs, orion's MPS mode (the same MPS
  # settings plus the gate), orion's priority mode on the time-sliced GPU.
  headline) "${PB[@]}" --hp resnet50 --be resnet50 --requests "${REQS:-5000}" \
              --configs timeslice,mps-cap,orion-mps,orion ;;
  # The same pair under plain MPS, MPS with client priority, and orion pass-through.
  mps) "${PB[@]}" --hp resnet50 --be resnet50 --requests "${REQS:-2000}" \
         --configs mps,mps-prio,orion-pass ;;
  # The headline pair in rounds, each against its own alone run, for the spread of every ratio
  # (the eager service's own p99 moves about 40% between runs on a noisy host).
  spread) "${PB[@]}" --hp resnet50 --be resnet50 --requests "${REQS:-2000}" \
            --repeat "${ROUNDS:-3}" --configs "${CONFIGS:-orion-mps,orion}" ;;
  # Issue 13's eager goal as it is judged: the eager service at 0.3 of its capacity beside the
  # trainer in MPS mode against MPS with the cap, each configuration against the service alone
  # right before it, 5 rounds in two commands (FIRST=0 ROUNDS=3, then FIRST=3 ROUNDS=2; their
  # results.jsonl concatenate). HP_CORES=1 for a one-CPU pod. Each orion run's timeline is kept
  # (trace-*.json: bench/request_trace.py names what ran on the GPU in the slowest requests).
  paired) "${PB[@]}" --hp resnet50 --be resnet50 --load 0.3 --requests "${REQS:-1000}" \
            --paired-alone --request-logs --traces --settle-seconds 2 --be-alone-seconds 8 \
            --hp-cores "${HP_CORES:-2}" --repeat "${ROUNDS:-3}" --first-round "${FIRST:-0}" \
            --configs "${CONFIGS:-mps-cap,orion-mps}" ;;
  # Service times beside the trainer without queueing (closed loop), in rounds.
  closed) "${PB[@]}" --hp resnet50,bert --be resnet50 --closed-loop --repeat "${ROUNDS:-2}" \
            --configs "${CONFIGS:-mps-cap,orion-mps,orion}" ;;
  # The other services beside the long-kernel trainer, under orion's MPS mode.
  mps-gpt2) "${PB[@]}" --hp resnet50-graph,bert --be gpt2-large --requests "${REQS:-2000}" \
              --configs timeslice,mps-cap,orion-mps ;;
  # The matrix: every service beside one trainer (BE: resnet50, bert or gpt2-large), 2,000
  # requests each. Four configurations fit one 10-minute slot; the rest go in a second command
  # (CONFIGS=orion-pass,mps,mps-prio,...).
  pairs) "${PB[@]}" --hp "${HP:-resnet50,resnet50-graph,bert}" --be "${BE:-bert}" \
           --requests "${REQS:-2000}" --be-alone-seconds 10 \
           --configs "${CONFIGS:-timeslice,mps-cap,orion-mps,orion}" ;;
  # The driver-API samples (no PyTorch).
  samples) "${PB[@]}" --hp sample --be sample --requests "${REQS:-4000}" \
             --configs timeslice,orion-pass,orion ;;
  *) echo "unknown split '$2'" >&2; exit 2 ;;
esac
