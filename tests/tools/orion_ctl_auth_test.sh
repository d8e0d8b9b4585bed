#!/usr/bin/env bash
# orion-ctl against a real orion-server with admin tokens: `health` and reads refuse a caller
# without a token, a reader token reads but cannot change the policy, an operator token can, and
# the server's log names who changed it.
#   orion_ctl_auth_test.sh ORION_SERVER ORION_CTL
set -euo pipefail
SERVER="$1"; CTL="$2"
W="$(mktemp -d /tmp/orion-ctl-auth.XXXXXX)"
trap 'kill "${PID:-0}" 2>/dev/null; wait "${PID:-0}" 2>/dev/null; rm -rf "$W"' EXIT
printf 'operator alice op-0123456789abcdef0123\nreader grafana rd-0123456789abcdef0123\n' > "$W/tokens"
grep reader "$W/tokens" > "$W/reader"
grep operator "$W/tokens" > "$W/operator"
printf 'socket_path: %s/orion.sock\nadmin_address: 127.0.0.1:0\nmetrics_address: 127.0.0.1:0\nadmin_auth: {tokens_file: %s/tokens}\ngpus: [GPU-00000000-1111-2222-3333-444444444444]\n' \
  "$W" "$W" > "$W/s.yaml"
"$SERVER" --config "$W/s.yaml" > "$W/server.log" 2>&1 &
PID=$!
port=""
for _ in $(seq 600); do
  port="$(sed -n 's/.*(port \([0-9]*\); gRPC health.*/\1/p' "$W/server.log")"
  [[ -n "$port" ]] && break
  sleep 0.05
done
[[ -n "$port" ]] || { cat "$W/server.log"; echo "no admin port"; exit 1; }
ctl() { "$CTL" --server "127.0.0.1:$port" "$@"; }
fail() { echo "FAIL: $*"; cat "$W/server.log"; exit 1; }

out="$(ctl health 2>&1)" && fail "health without a token succeeded: $out"
grep -q "requires a token" <<< "$out" || fail "no clear refusal: $out"
out="$(ctl --token-file "$W/reader" health)" || fail "reader health: $out"
grep -q "^SERVING: 1 GPU(s), 0 client(s)$" <<< "$out" || fail "health said: $out"
out="$(ORION_TOKEN_FILE="$W/reader" ctl policy be_budget_us=123 2>&1)" && fail "reader changed the policy"
grep -q "grafana holds a reader token" <<< "$out" || fail "no clear denial: $out"
ctl --token-file "$W/operator" policy be_budget_us=123 > /dev/null || fail "operator could not set the policy"
ctl --token-file "$W/reader" --json policy | grep -q '"be_budget_us": "123"' || fail "the budget did not change"
grep -q "audit: SetPolicy by alice (operator)" "$W/server.log" || fail "no audit line naming alice"
grep -q "audit: SetPolicy by refused" "$W/server.log" || fail "no audit line for the refused call"
# A reader may export the timeline: Chrome trace JSON and the page, every GPU of the node.
ctl --token-file "$W/reader" timeline --last-ms 60000 --trace "$W/t.json" --html "$W/t.html" \
  > "$W/export.out" || fail "timeline export: $(cat "$W/export.out")"
grep -q "wrote $W/t.json: 0 spans of 1 GPU(s)" "$W/export.out" || fail "export said: $(cat "$W/export.out")"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["otherData"]["format"] == "orion-timeline/1"; assert abs(d["otherData"]["clock_offset_ns"]) < 1e9' "$W/t.json" ||
  fail "the export is not the trace format"
grep -q '<script type="application/json" id="trace">' "$W/t.html" || fail "no page"
out="$(ctl --token-file "$W/reader" timeline --since 200 --until 100 2>&1)" && fail "a reversed window was accepted"
grep -q "until is before" <<< "$out" || fail "no clear refusal of the window: $out"
# The recording window is an operator's call; a reader is refused, and a bad window is named.
out="$(ctl --token-file "$W/reader" recording --from 1 2>&1)" && fail "a reader set the recording window"
ctl --token-file "$W/operator" recording --from 1000 --until 2000 | grep -q '"until_unix_ms": "2000"' ||
  fail "the operator could not set the recording window"
out="$(ctl --token-file "$W/operator" recording --from 2000 --until 1000 2>&1)" && fail "a reversed window was accepted"
grep -q "until_unix_ms is before from_unix_ms" <<< "$out" || fail "no clear refusal: $out"
# --follow streams until interrupted (here: until the timeout ends it).
rc=0
timeout 1 "$CTL" --server "127.0.0.1:$port" --token-file "$W/reader" timeline --follow > /dev/null 2>&1 || rc=$?
[[ $rc == 124 ]] || fail "timeline --follow ended by itself (exit $rc)"
echo "orion-ctl auth: ok"
