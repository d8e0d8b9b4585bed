# Sourced by the shell tests that run a real orion-server and sample clients on the CUDA driver
# test double. Gives them:
#   W          a fresh work folder, removed at exit with every process started through PIDS
#              (only pids that were started: kill 0 would signal the whole process group,
#              ctest included)
#   fail MSG   prints MSG and the server log's tail, exits 1
#   expect OUTPUT TEXT...   fails unless every TEXT appears in OUTPUT (fixed strings)
#   start_server ORION_SERVER [MODE]   orion-server in MODE (priority unless given) on loopback
#              ports (0: the kernel picks) with its socket in $W; sets ADMIN_PORT and
#              METRICS_PORT from its log
#   client ARGS...   orion-run ARGS on the double, talking to that server (needs RUN, LIB and
#              DOUBLE: orion-run, the interposer and the double's folder)
W="$(mktemp -d /tmp/orion-test.XXXXXX)"
PIDS=()
# A pid of `client ... &` is the subshell that runs the function: its child (orion-run's
# program) goes too.
trap 'for p in "${PIDS[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$W"' EXIT

fail() {
  echo "FAIL: $*"
  [[ -f "$W/server.log" ]] && tail -20 "$W/server.log"
  exit 1
}

expect() {
  local out="$1"; shift
  for want in "$@"; do grep -qF -- "$want" <<< "$out" || fail "no '$want' in: $out"; done
}

start_server() {
  printf 'socket_path: %s/orion.sock\nadmin_address: 127.0.0.1:0\nmetrics_address: 127.0.0.1:0\nmode: %s\n' \
    "$W" "${2:-priority}" > "$W/s.yaml"
  "$1" --config "$W/s.yaml" > "$W/server.log" 2>&1 &
  PIDS+=($!)
  ADMIN_PORT=""; METRICS_PORT=""
  for _ in $(seq 200); do
    ADMIN_PORT="$(sed -n 's/.*(port \([0-9]*\); gRPC health.*/\1/p' "$W/server.log")"
    METRICS_PORT="$(sed -n 's|.*/metrics (port \([0-9]*\)).*|\1|p' "$W/server.log")"
    [[ -n "$ADMIN_PORT" && -n "$METRICS_PORT" ]] && return 0
    sleep 0.05
  done
  fail "orion-server named no admin or metrics port"
}

client() {
  env ORION_SIM_DIR="$W" ORION_SIM_MEMORY=4Gi LD_LIBRARY_PATH="$DOUBLE" ORION_SOCKET="$W/orion.sock" \
    "$RUN" --interposer "$LIB" "$@"
}
