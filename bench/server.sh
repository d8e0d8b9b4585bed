# Sourced by the GPU bench scripts: starts orion-server from a bundle in a fresh work folder and
# stops it when the script exits.
#   source bench/server.sh; start_server BUNDLE_DIR ADMIN_PORT METRICS_PORT [PREFIX...]
# Sets W (work folder: orion.sock, board, s.yaml, server.log) and SERVER (its pid). PREFIX is a
# program that execs the server (e.g. taskset -c 0,1), not a shell function: the exit trap kills
# the pid it starts. The server's output goes to server.log, never to the script's pipe.
start_server() {
  local bundle="$1" admin="$2" metrics="$3"; shift 3
  W="$(mktemp -d /tmp/orion-bench.XXXXXX)"
  printf 'socket_path: %s/orion.sock\nadmin_address: 127.0.0.1:%s\nmetrics_address: 127.0.0.1:%s\n' \
    "$W" "$admin" "$metrics" > "$W/s.yaml"
  LD_LIBRARY_PATH="$bundle/lib" "$@" "$bundle/orion-server" --config "$W/s.yaml" \
    > "$W/server.log" 2>&1 &
  SERVER=$!
  trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
  for _ in $(seq 100); do [[ -S "$W/orion.sock" ]] && return 0; sleep 0.05; done
  echo "orion-server did not start; see $W/server.log" >&2
  return 1
}
