"""Where the serving thread's CPU goes in each arm of an in-process A/B, by shared object.

  orion_bench.py cpu-tax ... --in-process --cpu-samples      (records docs rows: cpu-samples.jsonl)
  orion_bench.py cpu-samples --table ROWS.jsonl [ROWS.jsonl ...] [--symbols N] [--lines N]
                             [--resolve LIB]

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
heaviest functions of liborion_interpose.so; --lines N its heaviest source lines (cpu-tax
--cpu-samples samples the interposer by address); --resolve LIB names hidden functions and
lines from the build that was sampled (its debug info).
"""
import argparse
import glob
import json
import os
import re
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
        requests[r["round"]] = r["requests"]
    total = sum(requests.values()) or 1
    return {k: v / total for k, v in cpu.items()}


def function(frame):
    """A demangled frame's function without its parameter list (and const)."""
    return re.sub(r"\((?:[^()]|\([^()]*\))*\)( const)?$", "", frame)


def locate(library, offsets):
    """{offset: (function, innermost "file:line")} of `library` (addr2line, inlined frames
    unwound); offsets it cannot place are left out."""
    if not library or not offsets:
        return {}
    r = subprocess.run(["addr2line", "-a", "-f", "-C", "-i", "-e", library,
                        *[hex(o) for o in offsets]], capture_output=True, text=True)
    found, group = {}, None
    for line in r.stdout.splitlines() + ["0x"]:
        if line.startswith("0x"):
            if group and len(group[1]) >= 2 and group[1][0] != "??":
                frames = group[1]
                where = frames[1].split(" (")[0]
                found[group[0]] = (function(frames[-2]),
                                   f"{os.path.basename(where.split(':')[0])}:"
                                   f"{where.rsplit(':', 1)[-1]} ({function(frames[0])})")
            group = (int(line, 16), []) if len(line) > 2 else None
        elif group is not None:
            group[1].append(line)
    return found


def split_symbol(symbol):
    """("cuLaunchKernel", 0x1234) from "cuLaunchKernel@0x1234", (symbol, None) without one."""
    if symbol.startswith("?+0x"):  # the first sampled runs' spelling of a hidden function
        return "?", int(symbol[4:], 16)
    name, at, offset = symbol.partition("@0x")
    return name, int(offset, 16) if at else None


def render(paths, symbols=0, resolve=None, lines_shown=0):
    rows = harness.read_runs(paths, "cpu-samples")
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
    if symbols or lines_shown:
        mine_rows = [r for r in rows if r["object"] == "liborion_interpose.so"]
        cpu = per_request(mine_rows, mine, "symbol")
        places = locate(resolve, [o for _, o in map(split_symbol, cpu) if o])
        functions, source = {}, {}
        for symbol, ms in cpu.items():
            name, offset = split_symbol(symbol)
            place = places.get(offset)
            if place and name == "?":
                name = f"{place[0]} (hidden)"
            functions[name] = functions.get(name, 0.0) + ms
            line = place[1] if place else symbol
            source[line] = source.get(line, 0.0) + ms
        if symbols:
            lines += ["", f"| {mine}: function of liborion_interpose.so | us/request |",
                      "|---|---|"]
            for name, ms in sorted(functions.items(), key=lambda kv: -kv[1])[:symbols]:
                lines.append(f"| `{name}` | {1e3 * ms:.2f} |")
        if lines_shown:
            lines += ["", f"| {mine}: source line of liborion_interpose.so (innermost function) "
                          f"| us/request |", "|---|---|"]
            for name, ms in sorted(source.items(), key=lambda kv: -kv[1])[:lines_shown]:
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
                   help="name the interposer's hidden functions and lines from this build of it "
                        "(addr2line; the build sampled, with its debug info)")
    p.add_argument("--lines", type=int, default=0, metavar="N",
                   help="also the interposed arm's N heaviest source lines of the interposer "
                        "(rows sampled with ORION_CPU_SAMPLE_DETAIL=liborion_interpose.so; "
                        "needs --resolve)")
    args = p.parse_args(argv)
    print(render(args.table, args.symbols, args.resolve, args.lines))
