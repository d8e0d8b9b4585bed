#!/usr/bin/env bash
# What the completion poller's lazy period costs a one-CPU pod (GPU machine): how often the
# interposer's thread wakes, and the CPU it and the process use, against the lazy period.
# A job pinned to one core (taskset -c $CORE) registers with a real orion-server (priority mode,
# nobody else on the GPU, so the gate never holds it and its timing samples are all left to the
# lazy period) and is read by bench/thread_cpu.py, in these arms:
#   bare          no interposer
#   lazy-N        under orion-run with ORION_LAZY_POLL_MS=N, for each N in $PERIODS
# Jobs ($JOBS): trainer (ResNet50 batch 64 training, best effort) and service (ResNet50 batch 4
# eager, high priority, Poisson arrivals at $RATE a second). The arms take turns in every round.
#   bash bench/lazy_poll.sh BUNDLE [OUT]
#   (ROUNDS=2 PERIODS="10 50 100" JOBS="trainer service" RATE=58 CORE=2 WINDOW=10 by default)
# Writes OUT/lazy-poll.jsonl (one thread_cpu.py --json line per run, tagged job, arm, lazy_ms,
# round); the table: python3 bench/thread_cpu.py --table OUT/lazy-poll.jsonl
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
B="$(cd "${1:?bundle folder}" && pwd)"
OUT="${2:-${OUT:-$(mktemp -d)}}"
ROUNDS="${ROUNDS:-2}"
PERIODS="${PERIODS:-10 50 100}"
JOBS="${JOBS:-trainer service}"
RATE="${RATE:-58}"
CORE="${CORE:-2}"
WINDOW="${WINDOW:-10}"
mkdir -p "$OUT"
source "$ROOT/bench/server.sh"
start_server "$B" 50083 50084 taskset -c 0  # priority mode (the default)
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; cp "$W/server.log" "$OUT/" 2>/dev/null' EXIT
export ORION_SOCKET="$W/orion.sock"

arms=(bare)
for n in $PERIODS; do arms+=("lazy-$n"); done
for round in $(seq "$ROUNDS"); do
  # Rotate the order every round so that no arm always runs first.
  shift_by=$(( (round - 1) % ${#arms[@]} ))
  order=("${arms[@]:$shift_by}" "${arms[@]:0:$shift_by}")
  for job in $JOBS; do
    case "$job" in
      trainer) model=(train resnet50); priority=best-effort ;;
      service) model=(serve resnet50 --rate "$RATE" --requests 1000000); priority=high ;;
      *) echo "lazy_poll: unknown job '$job' (trainer or service)" >&2; exit 2 ;;
    esac
    for arm in "${order[@]}"; do
      if [[ "$arm" == bare ]]; then
        wrap=(); lazy=""
      else
        lazy="${arm#lazy-}"
        wrap=(env "ORION_LAZY_POLL_MS=$lazy" "$B/orion-run" --interposer "$B/liborion_interpose.so"
              --priority "$priority" --)
      fi
      echo "lazy_poll: round $round, $job, $arm" >&2
      python3 "$ROOT/bench/thread_cpu.py" --after 12 --window "$WINDOW" --json \
        --tag "job=$job" --tag "arm=$arm" --tag "lazy_ms=$lazy" --tag "round=$round" \
        --tag "core=$CORE" -- taskset -c "$CORE" "${wrap[@]}" python3 "$ROOT/bench/torch_models.py" \
        "${model[@]}" >> "$OUT/lazy-poll.jsonl"
    done
  done
done
python3 "$ROOT/bench/thread_cpu.py" --table "$OUT/lazy-poll.jsonl" \
  --threads orion-poller,cuda-EvtHandlr | tee "$OUT/lazy-poll.md"
