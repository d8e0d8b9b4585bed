#!/bin/sh
# Client-side launch gate on a real GPU: p99 latency of orion-sample-infer (high priority) alone,
# beside orion-sample-train under plain time-slicing, and beside it with the interposer's gate
# on (orion_test_registrar --gate standing in for orion-server's knobs).
# Usage (repository root, build in $1, default build-interpose): tests/interpose/gpu/gate_check.sh
B=${1:-build-interpose}
L=$PWD/$B/interpose/liborion_interpose.so
R=$B/tests/interpose/orion_test_registrar
INFER="$B/samples/orion-sample-infer --rate 300 --requests 1500 --kernels 4 --kernel-us 200"
TRAIN="$B/samples/orion-sample-train --seconds 9 --kernels 20 --kernel-us 1000"
BUDGET_US=${BUDGET_US:-0}

echo "== infer alone"
$INFER | tail -1
echo "== infer + train, time-slicing"
$TRAIN > /tmp/train_plain.txt & sleep 1; $INFER | tail -1; wait; tail -1 /tmp/train_plain.txt
echo "== infer + train, interposer gate (BE budget ${BUDGET_US} us)"
LD_PRELOAD=$L $R --gate "$BUDGET_US" -- sh -c "
  ORION_PRIORITY=best-effort $TRAIN > /tmp/train_gate.txt & sleep 1
  ORION_PRIORITY=high $INFER | tail -1; wait; tail -1 /tmp/train_gate.txt"
