#!/usr/bin/env bash
# Priority benchmark on a machine with an NVIDIA GPU. For each pair (high-priority service +
# best-effort trainer) it measures, in one run: the service alone, the trainer alone, both under
# default time-slicing without orion, both under orion in pass-through mode, and both under orion
# enforcing priority. Prints one line per configuration; copies raw outputs to $OUT if set.
#   bench/gpu_priority.sh BUNDLE_DIR [samples|torch|all]
# BUNDLE_DIR holds orion-server, orion-ctl, orion-run, liborion_interpose.so, the samples and the
# server's shared libraries in lib/ (tools/bundle.sh makes it).
set -uo pipefail
B="$(cd "$1" && pwd)"
WHICH="${2:-all}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
W="$(mktemp -d /tmp/orion-bench.XXXXXX)"
OUTDIR="${OUT:-$W}"
cat > "$W/server.yaml" <<YAML
socket_path: $W/orion.sock
board_path: $W/board
admin_address: 127.0.0.1:50061
metrics_address: 127.0.0.1:9474
mode: priority
YAML
LD_LIBRARY_PATH="$B/lib" "$B/orion-server" --config "$W/server.yaml" 2> "$W/server.log" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 100); do [[ -S "$W/orion.sock" ]] && break; sleep 0.05; done
export ORION_SOCKET="$W/orion.sock"
CTL() { LD_LIBRARY_PATH="$B/lib" "$B/orion-ctl" --server 127.0.0.1:50061 "$@"; }
RUN() { "$B/orion-run" --interposer "$B/liborion_interpose.so" "$@"; }

# pair NAME "SERVE CMD" "TRAIN CMD"
pair() {
  local name="$1" serve="$2" train="$3" r t
  echo "== $name"
  r=$(eval "$serve" 2>&1 | grep '^result' | tail -1); echo "alone-hp        $r"
  t=$(eval "${train}" 2>&1 | grep '^result' | tail -1); echo "alone-be        $t"
  for cfg in timeslice orion-passthrough orion-priority; do
    local pre=""
    case $cfg in
      timeslice) pre="" ;;
      orion-passthrough) CTL policy --all mode=pass-through > /dev/null; pre="RUN --priority" ;;
      orion-priority) CTL policy --all mode=priority > /dev/null; pre="RUN --priority" ;;
    esac
    if [[ -n "$pre" ]]; then
      eval "$pre best-effort -- $train" > "$W/$name-$cfg-be.txt" 2>&1 &
    else
      eval "$train" > "$W/$name-$cfg-be.txt" 2>&1 &
    fi
    local tp=$!
    sleep "${WARM:-8}"
    if [[ -n "$pre" ]]; then
      r=$(eval "$pre high -- $serve" 2>&1 | tee "$W/$name-$cfg-hp.txt" | grep '^result' | tail -1)
    else
      r=$(eval "$serve" 2>&1 | tee "$W/$name-$cfg-hp.txt" | grep '^result' | tail -1)
    fi
    [[ "$cfg" == orion-priority ]] && CTL clients > "$W/$name-clients.txt" 2>&1
    wait $tp
    t=$(grep '^result' "$W/$name-$cfg-be.txt" | tail -1)
    echo "$cfg  hp: $r"
    echo "$cfg  be: $t"
  done
}

if [[ "$WHICH" == samples || "$WHICH" == all ]]; then
  WARM=1 pair samples \
    "$B/orion-sample-infer --rate 400 --requests 4000 --kernels 4 --kernel-us 250" \
    "$B/orion-sample-train --seconds 13 --kernels 20 --kernel-us 1000"
fi
if [[ "$WHICH" == torch || "$WHICH" == all ]]; then
  cap=$(python3 "$ROOT/bench/torch_pair.py" serve --rate 0 2>&1 | grep '^result')
  echo "== resnet50 b4 capacity alone: $cap"
  rate=$(echo "$cap" | sed -E 's/.*capacity_rps=([0-9.]+).*/\1/')
  half=$(python3 -c "print(round($rate / 2, 1))")
  WARM=10 pair resnet50-eager \
    "python3 $ROOT/bench/torch_pair.py serve --rate $half --requests ${REQS:-3000}" \
    "python3 $ROOT/bench/torch_pair.py train --seconds $(python3 -c "print(int(${REQS:-3000} / $half + 14))")"
fi
CTL gpus
cp "$W"/*.txt "$W/server.log" "$OUTDIR/" 2>/dev/null || true
