"""Where the serving thread's CPU goes in each arm of an in-process A/B, by shared object.

  orion_bench.py cpu-tax ... --in-process --cpu-samples      (records docs rows: cpu-samples.jsonl)
  orion_bench.py cpu-samples --table ROWS.jsonl [ROWS.jsonl ...] [--symbols N [--resolve LIB]]

cpu-tax --cpu-samples preloads liborion_cpu_sampler.so (bench/cpu_sampler.cc, in the bundle) into
the one process that serves both arms: a CPU-time timer of its serving thread records the
instruction each tick interrupts, weighted by the thread's CPU time since the tick before, and
the switch's word then (which arm's block was being served). So the arms' difference in CPU per
request splits by object (the interposer, the driver, PyTorch, Python, the vDSO's clock, the
kernel), each figure an in-process measurement of the same requests the A/B times, with no
hardware counter. A sample counts for its leaf function only: the clock the interposer reads
is the vDSO's, a driver call it makes is the driver's. What the interposer costs other code
(caches it leaves cold) shows as that code's difference.

The table pools the rounds' samples per arm: CPU per request (the arm's CPU in that object over
the requests it served, the unrecorded first block included) and the interposed arm's excess,
with the median and range of the per-round excess. --symbols N adds the interposed arm's N
heaviest symbols of liborion_interpose.so; --resolve LIB names its hidden functions from that
build of it.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess

import harness

ANSWERS = ("where the serving thread's CPU goes in each arm of an in-process A/B, by shared "
           "object (rows of cpu-tax --cpu-samples)")

# The switch word the process starts and ends with under --cpu-samples: its startup (model load,
# warm-up) and its teardown are sampled under it and left out; the interposer treats an unknown
# word as interposed.
UNSAMPLED_WORD = 0xFFFFFFFF


def collect(prefix, rnd, words, requests, rows_path):
    """Folds the sampler's files `prefix`.<pid>.jsonl of round `rnd` into rows_path, one row per
    arm and object/symbol; `words` maps a switch word to its arm's name, `requests` is how many
    requests each arm served. Returns the rows (none where the sampler wrote nothing)."""
    rows = []
    for path in sorted(glob.glob(prefix + ".*.jsonl")):
        for line in open(path):
            s = json.loads(line)
            arm = words.get(s["switch"])
            if arm is None:
                continue  # startup or teardown, or a word no arm of this run sets
            row = {"round": rnd, "arm": arm, "object": s["object"], "symbol": s["symbol"],
                   "samples": s["samples"], "cpu_ms": s["cpu_ms"], "requests": requests}
            rows.append(row)
            harness.append_row(rows_path, row)
        os.remove(path)
    return rows


def per_request(rows, arm, key):
    """{key value: CPU ms per request} of one arm, pooled over rounds."""
    cpu, requests = {}, {}
    for r in rows:
        if r["arm"] != arm:
            continue
        cpu[r[key]] = cpu.get(r[key], 0.0) + r["cpu_ms"]
        requests[(r["round"])] = r["requests"]
    total = sum(requests.values()) or 1
    return {k: v / total for k, v in cpu.items()}


def resolved(symbol, library):
    """A hidden function's "?+0xOFFSET" named by addr2line from `library` (the build of the
    interposer that was sampled), as "name (hidden)"; anything else as it is."""
    if not library or not symbol.startswith("?+0x"):
        return symbol
    r = subprocess.run(["addr2line", "-f", "-C", "-e", library, symbol[2:]],
                       capture_output=True, text=True)
    name = r.stdout.splitlines()[0] if r.returncode == 0 and r.stdout else "??"
    return symbol if name == "??" else f"{name.split('(')[0]} (hidden)"


def render(paths, symbols=0, resolve=None):
    rows = []
    for path in paths:
        offset = max((r["round"] for r in rows), default=0)
        for r in harness.read_rows(path, "cpu-samples"):
            rows.append(dict(r, round=r["round"] + offset))
    arms = sorted({r["arm"] for r in rows}, key=lambda a: a != "baseline")
    if len(arms) != 2 or arms[0] != "baseline":
        raise SystemExit(f"cpu-samples: rows of two arms, 'baseline' and another, wanted; "
                         f"found {arms}")
    base, mine = arms
    rounds = sorted({r["round"] for r in rows})
    pooled = {a: per_request(rows, a, "object") for a in arms}
    by_round = {n: {a: per_request([r for r in rows if r["round"] == n], a, "object")
                    for a in arms} for n in rounds}
    objects = sorted(set(pooled[base]) | set(pooled[mine]),
                     key=lambda o: -max(pooled[base].get(o, 0), pooled[mine].get(o, 0)))
    samples = {a: sum(r["samples"] for r in rows if r["arm"] == a) for a in arms}
    lines = [f"**Serving thread's CPU by object, {len(rounds)} rounds "
             f"({samples[base]} and {samples[mine]} samples): {base} and {mine}**", "",
             f"| object | {base}, us/request | {mine}, us/request | excess, us/request | "
             f"excess per round: median [min, max] |", "|---|---|---|---|---|"]
    total = {a: sum(pooled[a].values()) for a in arms}
    shown = [o for o in objects
             if max(pooled[base].get(o, 0), pooled[mine].get(o, 0)) >= 0.001 * total[base]]
    for o in shown + ["all"]:
        def cell(a, n=None):
            d = by_round[n][a] if n is not None else pooled[a]
            return sum(d.values()) if o == "all" else d.get(o, 0.0)
        excess = [1e3 * (cell(mine, n) - cell(base, n)) for n in rounds]
        lines.append(f"| {o} | {1e3 * cell(base):.1f} | {1e3 * cell(mine):.1f} | "
                     f"{1e3 * (cell(mine) - cell(base)):+.1f} | "
                     f"{statistics.median(excess):+.1f} [{min(excess):+.1f}, {max(excess):+.1f}] |")
    if symbols:
        syms = {}
        for name, ms in per_request([r for r in rows if r["object"] == "liborion_interpose.so"],
                                    mine, "symbol").items():
            name = resolved(name, resolve)
            syms[name] = syms.get(name, 0.0) + ms
        lines += ["", f"| {mine}: symbol of liborion_interpose.so | us/request |", "|---|---|"]
        for name, ms in sorted(syms.items(), key=lambda kv: -kv[1])[:symbols]:
            lines.append(f"| `{name}` | {1e3 * ms:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", nargs="+", required=True, metavar="ROWS_JSONL",
                   help="cpu-samples.jsonl of one or more cpu-tax --cpu-samples runs (pooled)")
    p.add_argument("--symbols", type=int, default=0, metavar="N",
                   help="also the interposed arm's N heaviest symbols of the interposer")
    p.add_argument("--resolve", metavar="LIB",
                   help="name the interposer's hidden functions from this build of it (addr2line)")
    args = p.parse_args(argv)
    print(render(args.table, args.symbols, args.resolve))
