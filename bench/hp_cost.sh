#!/usr/bin/env bash
# What the interposer costs a high-priority service on the GPU: closed-loop service time
# (latency_ms) and CPU time of all the service's threads per request (cpu_ms), without the
# interposer and registered high-priority, alternating ROUNDS times (the service runs on two cores
# of its own, as in the priority benchmark). ALT=path/to/liborion_interpose.so adds a third row per
# round for another build of the interposer (A/B of a change). First, the same comparison at the C
# level: orion-bench-launch's cost per launch and of each driver call a tracked launch adds.
#   bench/hp_cost.sh BUNDLE_DIR [MODEL] [--graph]      (MODEL: resnet50 (default) or bert)
set -uo pipefail
B="$(cd "$1" && pwd)"; shift
M="${1:-resnet50}"; shift || true
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PIN=(); command -v taskset >/dev/null && [[ $(nproc) -ge 8 ]] && PIN=(taskset -c)
on() { local cpus="$1"; shift; if ((${#PIN[@]})); then "${PIN[@]}" "$cpus" "$@"; else "$@"; fi; }
source "$ROOT/bench/server.sh"
# The prefix must be a program (not the function `on`): the trap kills the pid it starts.
start_server "$B" 50063 9476 ${PIN[@]:+"${PIN[@]}" 0,1} || exit 1
SERVE=(python3 "$ROOT/bench/torch_models.py" serve "$M" "$@")
ROWS="$W/rows.txt"
row() {  # label, then what runs the service (env: no interposer)
  local label="$1"; shift
  printf '%-22s %s\n' "$label" "$(on 2,3 "$@" "${SERVE[@]}" 2>&1 | grep '^result' || echo failed)" \
    | tee -a "$ROWS"
}
RUN=(env ORION_SOCKET="$W/orion.sock" "$B/orion-run" --priority high --interposer)
if [[ -x "$B/orion-bench-launch" ]]; then
  echo "== C-level launch cost, no interposer"; on 2,3 "$B/orion-bench-launch"
  echo "== C-level launch cost, high priority"; on 2,3 "${RUN[@]}" "$B/liborion_interpose.so" -- "$B/orion-bench-launch"
  if [[ -n "${ALT:-}" ]]; then
    echo "== C-level launch cost, high priority (ALT)"; on 2,3 "${RUN[@]}" "$ALT" -- "$B/orion-bench-launch"
  fi
fi
for round in $(seq "${ROUNDS:-3}"); do
  echo "== round $round ($M $*)"
  row "no interposer" env
  row "high priority" "${RUN[@]}" "$B/liborion_interpose.so" --
  [[ -n "${ALT:-}" ]] && row "high priority (ALT)" "${RUN[@]}" "$ALT" --
done
# Mean over the rounds of each row: the host drifts between rounds, so only these compare.
echo "== mean of ${ROUNDS:-3} rounds"
awk '{ label = substr($0, 1, 22); sub(/ +$/, "", label)
       for (i = 1; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
       if ("latency_ms" in v) { n[label]++; lat[label] += v["latency_ms"]; cpu[label] += v["cpu_ms"] }
       if (!(label in seen)) { seen[label] = 1; order[++k] = label } delete v }
     END { for (i = 1; i <= k; ++i) { l = order[i]; if (n[l])
             printf "%-22s latency_ms=%.3f cpu_ms=%.3f (%d rounds)\n", l, lat[l] / n[l], cpu[l] / n[l], n[l] } }' "$ROWS"
