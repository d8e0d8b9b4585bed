#!/usr/bin/env bash
# Every orion-ctl message a new user meets names the fix: an unreachable server (the address
# tried, --server, $ORION_ADMIN), a bad flag value (the value and the form expected), an unknown
# knob (the knobs), no GPU yet (they appear when a process registers), `policy` in the KEY=VALUE
# form it accepts, an empty or truncated timeline (which flag gets the rest); and a process
# outside Kubernetes is named by process and PID in `clients`, timeline rows (followed ones too)
# and the server's log.
#   orion_ctl_messages_test.sh ORION_SERVER ORION_CTL ORION_RUN TRAIN_SAMPLE INTERPOSER DOUBLE_DIR
set -euo pipefail
SERVER="$1"; CTL="$2"; RUN="$3"; TRAIN="$4"; LIB="$5"; DOUBLE="$6"
source "$(dirname "$0")/server_lib.sh"

# Unreachable: the address tried and where it came from, and both ways to name another.
out="$("$CTL" --server 127.0.0.1:1 gpus 2>&1)" && fail "gpus against no server succeeded"
expect "$out" "cannot reach orion-server's admin API at 127.0.0.1:1 (from --server)" \
  "start orion-server" "--server HOST:PORT" '$ORION_ADMIN'
out="$(ORION_ADMIN=127.0.0.1:1 "$CTL" clients 2>&1)" && fail "clients against no server succeeded"
expect "$out" 'at 127.0.0.1:1 (from $ORION_ADMIN)'

start_server "$SERVER"
ctl() { "$CTL" --server "127.0.0.1:$ADMIN_PORT" "$@"; }

# Bad values name the value and the form; a flag without one says so.
out="$(ctl timeline --last-ms abc 2>&1)" && fail "--last-ms abc was accepted"
expect "$out" "--last-ms: expected a whole number of milliseconds" "got 'abc'"
out="$(ctl timeline --since 2>&1)" && fail "--since without a value was accepted"
expect "$out" "--since needs a value: Unix milliseconds"
out="$(ctl clients --gpu x 2>&1)" && fail "clients --gpu x was accepted"
expect "$out" "--gpu: expected a GPU index" "got 'x'"
out="$(ctl policy mode=fast 2>&1)" && fail "mode=fast was accepted"
expect "$out" "mode: expected pass-through, priority or mps, got 'fast'"
# An unknown knob lists the knobs.
out="$(ctl policy be_budget=500 2>&1)" && fail "an unknown knob was accepted"
expect "$out" "unknown knob 'be_budget'" "be_budget_us" "hp_grace_us" "adapt_budget" \
  "gpu_hold_max_ms" "gpu_hold_release_ms"

# No GPU yet: it appears when the first process registers.
out="$(ctl policy 2>&1)" && fail "policy with no GPU succeeded"
expect "$out" "a GPU appears when the first process using it registers"
out="$(ctl timeline 2>&1)" && fail "timeline with no GPU succeeded"
expect "$out" "a GPU appears when the first process using it registers"
out="$(ctl clients)"
expect "$out" "(no clients: a process appears here when it registers"

# A process outside Kubernetes, 20,000 and more short kernels.
client --priority best-effort -- "$TRAIN" --seconds 3 --kernels 20 --kernel-us 20 \
  > "$W/train.out" 2>&1 &
JOB=$!
PIDS+=($JOB)
for _ in $(seq 100); do ctl clients | grep -q orion-sample && break; sleep 0.05; done
out="$(ctl clients)"
TRAIN_PID="$(awk '/orion-sample/ {print $3}' <<< "$out")"  # the process, not the subshell
[[ -n "$TRAIN_PID" ]] || fail "the trainer did not register: $out"
expect "$out" "standalone/orion-sample-"
# Followed spans name the process and its PID too.
out="$(timeout 1 "$CTL" --server "127.0.0.1:$ADMIN_PORT" timeline --follow 2>&1)" || true
expect "$out" "orion-sample-tr($TRAIN_PID)"
# `policy` prints the KEY=VALUE form it takes: the output is accepted back as it is.
out="$(ctl policy)"
expect "$out" "mode=priority" "be_budget_us=500" "adapt_budget=true" "gpu_hold_max_ms=100" \
  "gpu_hold_release_ms=30000"
keys="$(cut -d= -f1 <<< "$out" | tr '\n' ' ')"
[[ "$keys" == "mode be_budget_us sm_threshold spin_us hp_stale_ms hp_grace_us adapt_budget gpu_hold gpu_hold_max_ms gpu_hold_release_ms " ]] ||
  fail "policy's knobs, in admin.proto's order: $keys"
ctl policy $out > /dev/null || fail "policy does not take its own output: $out"
wait "$JOB" || fail "the trainer failed: $(cat "$W/train.out")"

# Timeline rows name the process and its PID, after it exited too; a full screen says how to get
# the rest; an empty window says so.
out="$(ctl timeline --last-ms 60000)"
expect "$(head -1 <<< "$out")" "orion-sample-tr($TRAIN_PID),exited"
expect "$(tail -1 <<< "$out")" "(truncated: the newest 10000 spans in the last 60000 ms are shown" \
  "--trace F.json exports the whole window"
sleep 0.2
out="$(ctl timeline --last-ms 5)"
expect "$out" "(no spans on GPU 0 in the last 5 ms: widen it with --last-ms N or --since MS)"
out="$(ctl clients --exited)"
expect "$out" "$TRAIN_PID" "exited"

# The server's log: one line per registration and exit, naming the process and PID.
log="$(cat "$W/server.log")"
expect "$log" "registered: orion-sample-tr (pid $TRAIN_PID)" \
  "exited: orion-sample-tr (pid $TRAIN_PID)"
echo "orion-ctl messages: ok"
