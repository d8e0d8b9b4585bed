#!/usr/bin/env bash
# The timeline page as a browser draws it: two nodes' exports merged by `orion-ctl timeline
# merge ... --html`, opened in headless Chromium. Checks that the page drew one bar per span it
# was given (DOM after the script ran) and that the screenshot shows them in their colours (high
# priority blue, best-effort green, held at the gate red, paused grey), not a blank page. Skips (77) where no
# Chromium is installed; tools/setup-deps.sh installs it for CI.
#   timeline_html_test.sh ORION_CTL
set -euo pipefail
CTL="$1"
BROWSER=""
for b in chromium chromium-browser google-chrome; do
  command -v "$b" > /dev/null && { BROWSER="$(command -v "$b")"; break; }
done
[[ -n "$BROWSER" ]] || { echo "no Chromium installed: skipped"; exit 77; }
W="$(mktemp -d /tmp/orion-html.XXXXXX)"
trap 'rm -rf "$W"' EXIT

# Two exports as orion-ctl writes them: node a (GPU 0: a high-priority client and a best-effort
# one with held time) and node b (GPU 0: one best-effort client), node b's clock 1 ms ahead.
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
t0 = 1_700_000_000_000_000.0  # microseconds
def node(name, offset_ns, clients):
    ev = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": f"{name} GPU 0 (GPU-x)"}}]
    for tid, label, prio, spans in clients:
        ev.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": label}})
        for cat, start, dur in spans:
            ev.append({"ph": "X", "cat": cat, "name": cat, "pid": 0, "tid": tid, "ts": t0 + start,
                       "dur": dur, "args": {"priority": prio, "measured": True}})
    return {"traceEvents": ev, "otherData": {"node": name, "clock_offset_ns": offset_ns}}
a = node("node-a", 0, [
    (1, "ml/svc (client 1, high)", "high", [("kernel", 0, 3000), ("kernel", 6000, 3000)]),
    (2, "ml/train (client 2, best-effort)", "best-effort", [("kernel", 3000, 3000), ("kernel", 9000, 4000)]),
    (1000002, "ml/train held at gate", "best-effort",
     [("throttled", 0, 3000), ("throttled", 6000, 3000), ("paused", 13000, 3000)]),
])
b = node("node-b", 1_000_000, [
    (7, "batch/job (client 7, best-effort)", "best-effort", [("kernel", 1000, 5000), ("kernel", 8000, 5000)]),
])
json.dump(a, open(f"{w}/a.json", "w"))
json.dump(b, open(f"{w}/b.json", "w"))
PY
"$CTL" timeline merge "$W/a.json" "$W/b.json" --out "$W/all.json" --html "$W/all.html" > /dev/null
spans="$(python3 -c "import json,sys; print(sum(e['ph']=='X' for e in json.load(open(sys.argv[1]))['traceEvents']))" "$W/all.json")"
[[ "$spans" == 9 ]] || { echo "FAIL: merged trace has $spans spans, expected 9"; exit 1; }

run_browser() { timeout 60 "$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$W/profile" "$@" 2>> "$W/browser.log"; }
run_browser --dump-dom "file://$W/all.html" > "$W/dom.html"
bars="$(grep -o 'class="span"' "$W/dom.html" | wc -l)"
[[ "$bars" == "$spans" ]] || { echo "FAIL: the page drew $bars bars for $spans spans"; tail -5 "$W/browser.log"; exit 1; }
grep -q "node-b GPU 0" "$W/dom.html" || { echo "FAIL: node-b's row is missing"; exit 1; }

run_browser --window-size=1250,300 --screenshot="$W/shot.png" "file://$W/all.html" > /dev/null
python3 - "$W/shot.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, width = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), f"unexpected PNG format {depth}/{ctype}"
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw, stride = zlib.decompress(idat), width * bpp
rows, prev = [], bytearray(stride)
for y in range(height):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line); prev = line
want = {"high (blue)": (0x1f, 0x77, 0xb4), "best-effort (green)": (0x2c, 0xa0, 0x2c),
        "held (red)": (0xd6, 0x27, 0x28), "paused (grey)": (0x7f, 0x7f, 0x7f)}
counts = {k: 0 for k in want}
for line in rows:
    for x in range(0, stride, bpp):
        px = tuple(line[x:x + 3])
        for k, rgb in want.items():
            if px == rgb: counts[k] += 1
print("pixels per colour:", counts)
bad = [k for k, n in counts.items() if n < 500]
assert not bad, f"too few pixels of {bad}: the bars are not drawn"
PY
echo "timeline html: $bars bars drawn, screenshot shows all four colours: ok"
