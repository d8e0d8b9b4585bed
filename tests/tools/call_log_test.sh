#!/usr/bin/env bash
# Log mode, on the CUDA driver test double: a sample service and a sample that allocates run
# under the interposer with ORION_LOG_DIR set and no server to register with; each writes its own
# call logs (every launch with its kernel's name; allocations, frees and memsets with their
# bytes), the metrics file counts the same calls, and `orion-ctl timeline --from-log` turns both
# processes' logs into one Chrome trace and a page.
#   call_log_test.sh ORION_CTL SAMPLE_INFER SAMPLE_ALLOC INTERPOSER CUDA_DOUBLE_DIR
set -euo pipefail
CTL="$1"; INFER="$2"; ALLOC="$3"; LIB="$4"; DOUBLE="$5"
W="$(mktemp -d /tmp/orion-call-log.XXXXXX)"
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
env ORION_SIM_DIR="$W" ORION_SIM_MEMORY=4Gi LD_LIBRARY_PATH="$DOUBLE" LD_PRELOAD="$LIB" \
  ORION_SOCKET="$W/nobody-listens.sock" ORION_LOG_DIR="$W/logs" \
  "$INFER" --rate 0 --requests 50 --kernels 3 --kernel-us 200 > "$W/infer.out" 2> "$W/infer.err" ||
  fail "the sample failed: $(cat "$W/infer.err")"
env ORION_SIM_DIR="$W" ORION_SIM_MEMORY=4Gi LD_LIBRARY_PATH="$DOUBLE" LD_PRELOAD="$LIB" \
  ORION_SOCKET="$W/nobody-listens.sock" ORION_LOG_DIR="$W/logs" ORION_QUIET=1 \
  "$ALLOC" --chunk 64Mi --max 256Mi --touch > "$W/alloc.out" 2>&1 || fail "alloc: $(cat "$W/alloc.out")"
grep -q "call log writing to $W/logs" "$W/infer.err" || fail "no note of the log: $(cat "$W/infer.err")"
grep -q "passing CUDA calls through unchanged" "$W/infer.err" || fail "no pass-through note"
shopt -s nullglob
logs=("$W"/logs/timeline.*.log)
[[ ${#logs[@]} == 2 ]] || fail "expected two timeline logs, found ${#logs[@]}"
log="$(grep -l "process=orion-sample-infer" "${logs[@]}")"
alloc_log="$(grep -l "process=orion-sample-alloc" "${logs[@]}")"
pid="${log##*/timeline.}"; pid="${pid%.log}"
head -n1 "$log" | grep -q "^# orion-call-log 1 pid=$pid process=" || fail "header: $(head -n1 "$log")"
launches="$(awk -F'\t' '$3 == "cuLaunchKernel"' "$log" | wc -l)"
[[ "$launches" -ge 150 ]] || fail "expected >= 150 launches (50 requests x 3 kernels), got $launches"
awk -F'\t' '$3 == "cuLaunchKernel" && $4 == "-"' "$log" | head -n1 | grep -q . &&
  fail "a launch without its kernel's name"
awk -F'\t' 'NR > 1 && (NF != 6 || $1 !~ /^[0-9]+$/ || $2 !~ /^[0-9]+$/) { bad = 1 } END { exit bad }' "$log" ||
  fail "a line is not 6 tab-separated fields"
[[ "$(grep -c "$(printf '\tcuMemAlloc_v2\t-\t67108864\t-')" "$alloc_log")" == 4 ]] ||
  fail "expected 4 allocations of 64 MiB: $(cat "$alloc_log")"
grep -q "$(printf '\tcuMemFree_v2\t')" "$alloc_log" || fail "no free logged"
grep -q "$(printf '\tcuMemsetD8_v2\t-\t67108864\t-')" "$alloc_log" || fail "no memset logged"
metrics="$W/logs/metrics.$pid.log"
[[ -f "$metrics" ]] || fail "no metrics file"
counted="$(awk '$1 == "cuLaunchKernel" { print $2 }' "$metrics")"
[[ "$counted" == "$launches" ]] || fail "metrics count $counted launches, the timeline $launches"
out="$("$CTL" timeline --from-log "$W/logs" --trace "$W/t.json" --html "$W/t.html")" ||
  fail "orion-ctl: $out"
grep -q "wrote $W/t.json: [0-9]* calls of 2 process(es)" <<< "$out" || fail "orion-ctl said: $out"
python3 - "$W/t.json" "$launches" <<'PY' || fail "the trace is not what the log holds"
import json, sys
trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"]
spans = [e for e in events if e["ph"] == "X"]
kernels = [e for e in spans if e["cat"] == "kernel"]
assert sum(1 for e in spans if e["cat"] == "alloc" and e["args"].get("bytes") == 67108864) == 4
assert len(kernels) == int(sys.argv[2]), (len(kernels), sys.argv[2])
assert all(e["dur"] >= 0 and e["ts"] > 1.6e15 for e in spans)  # Unix microseconds
assert all(not e["args"]["measured"] for e in spans)  # CPU-side call durations
names = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
assert any("(pid " in e["args"]["name"] for e in names), names
PY
grep -q '<script type="application/json" id="trace">' "$W/t.html" || fail "no page"
# Nothing to convert is said clearly.
out="$("$CTL" timeline --from-log "$W/empty" --trace "$W/x.json" 2>&1)" && fail "an empty folder converted"
grep -q "cannot read the call-log folder" <<< "$out" || fail "no clear error: $out"
echo "call log: ok ($launches launches)"
