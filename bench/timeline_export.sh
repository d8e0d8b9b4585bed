#!/usr/bin/env bash
# On a GPU machine: orion-server, a high-priority sample service (100 req/s, 4 x 250 us kernels)
# beside a best-effort sample trainer (20 x 1 ms kernels per step) for 4 s, then the timeline
# exported as Chrome trace JSON and as the HTML page into $OUT (default ./timeline-out).
#   tools/bundle.sh build .bundle   # on the build machine
#   bash bench/timeline_export.sh   # on the GPU machine, in the folder holding .bundle
# The README's timeline picture is a headless Chromium screenshot of $OUT/h100.html:
#   chromium --headless --window-size=1250,200 --screenshot=shot.png file://$OUT/h100.html
set -u
B="$PWD/.bundle"; W="$(mktemp -d)"; OUT="${OUT:-$PWD/timeline-out}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib"
printf 'socket_path: %s/orion.sock\nadmin_address: 127.0.0.1:50071\nmetrics_address: 127.0.0.1:0\nmode: priority\n' \
  "$W" > "$W/s.yaml"
"$B/orion-server" --config "$W/s.yaml" > "$OUT/server.log" 2>&1 &
S=$!
sleep 1
export ORION_SOCKET="$W/orion.sock" ORION_ADMIN=127.0.0.1:50071
LD_PRELOAD="$B/liborion_interpose.so" ORION_PRIORITY=best-effort \
  "$B/orion-sample-train" --seconds 4 --kernels 20 --kernel-us 1000 > "$OUT/train.txt" 2>&1 &
T=$!
sleep 0.5
LD_PRELOAD="$B/liborion_interpose.so" ORION_PRIORITY=high \
  "$B/orion-sample-infer" --rate 100 --requests 250 --kernels 4 --kernel-us 250 > "$OUT/infer.txt" 2>&1
wait "$T"
"$B/orion-ctl" timeline --last-ms 10000 --trace "$OUT/h100.json" --html "$OUT/h100.html"
kill "$S"; wait "$S"
tail -n 3 "$OUT/infer.txt" "$OUT/train.txt"
