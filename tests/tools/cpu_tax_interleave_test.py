#!/usr/bin/env python3
"""bench/orion_bench.py cpu-tax --interleave, and the --driven protocol of
bench/workloads/torch_models.py it
drives, without a GPU.

Test doubles, named as such: a stand-in orion-server (creates its socket path and waits), a
stand-in orion-run (drops its options and marks the process interposed in its environment) and
a stand-in model that speaks the --driven protocol and makes each request 10% slower when
marked. The real torch_models.py is loaded with a stub `torch` module for its protocol loop.
Checked: the arms take turns block by block and swap cores every round; a 10% slower arm reads
about 1.10 in the table, an A/A control about 1.00; the block answers' other figures (the CPU
split by thread, the requests' launch and sync phases) are pooled per arm and tabled, and two runs' tables pool their rounds; with
--in-process one process a round serves both arms by the switch's word, and --cpu-samples folds
its samples per arm with the teardown in neither, and with several baselines (bypass and
no-timing) three arms take turns in one process, the order rotating, each baseline with its own
A/B, which --split puts side by side, and the as-usual baseline (the interposed arm's own word)
reads as an A/A control; a model that answers with an error stops the
run with a message naming the command and the answer; the protocol loop answers every command,
refuses a malformed one by name and stops at quit."""
import contextlib
import io
import json
import os
import stat
import sys
import tempfile
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "bench", "workloads"))

FAKE_MODEL = r'''
import json, os, struct, sys, time
arm = "i" if os.environ.get("FAKE_INTERPOSED") else "b"
switch = os.environ.get("ORION_BENCH_SWITCH")
def word():
    with open(switch, "rb") as f:
        return struct.unpack("I", f.read(4))[0]
log = open(os.environ["FAKE_LOG"], "a")
log.write(f"start {arm} {sorted(os.sched_getaffinity(0))}\n"); log.flush()
print("ready", flush=True)
served = {}  # --cpu-samples: the CPU ms each switch word served, as the sampler would count it
for line in sys.stdin:
    w = line.split()
    if w[0] == "quit":
        break
    if w[0] == "switch":  # --in-process: the word decides the arm, as the interposer does
        with open(switch, "r+b") as f:
            f.write(struct.pack("I", int(w[1])))
        print(f"switched {w[1]}", flush=True)
        continue
    if switch:
        arm = "b" if word() == 1 else "i"
    if os.environ.get("FAKE_FAIL"):
        print("error: cannot run it", flush=True)
        continue
    log.write(f"{arm} {line.strip()}" + (f" w{word()}" if switch else "") + "\n"); log.flush()
    lat = []
    for _ in range(int(w[1])):
        t = time.perf_counter()
        time.sleep(0.004 * (1.10 if arm == "i" else 1.0))
        lat.append((time.perf_counter() - t) * 1e3)
    sync = 0.5 if arm == "i" else 0.25
    if switch:
        served[word()] = served.get(word(), 0.0) + sum(lat)
    print("block lat_ms=" + ",".join(f"{x:.4f}" for x in lat) + " cpu_ms=0.0100" +
          f" orion_cpu_ms=0.0020 launch_ms=1.0000 sync_ms={sync:.4f}", flush=True)
if os.environ.get("ORION_CPU_SAMPLES"):  # the teardown under the word the switch ends on
    served[word()] = served.get(word(), 0.0) + 1000.0
    with open(os.environ["ORION_CPU_SAMPLES"] + f".{os.getpid()}.jsonl", "w") as f:
        for w, ms in served.items():
            f.write(json.dumps({"switch": w, "object": "model.so", "symbol": "serve",
                                "samples": 1, "cpu_ms": ms, "period_us": 1000}) + "\n")
'''

FAKE_SERVER = """#!/bin/sh
# test double of orion-server: keeps a copy of its config, creates its socket path and waits
sock=$(sed -n 's/^socket_path: //p' "$2")
cp "$2" "$(dirname "$FAKE_LOG")/server.yaml"
touch "$sock"
exec sleep 600
"""

FAKE_RUN = """#!/bin/sh
# test double of orion-run: drops its options, marks the process interposed
while [ "$1" != "--" ]; do shift; done
shift
FAKE_INTERPOSED=1 exec "$@"
"""


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def write_exec(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def run_bench(work, name, extra):
    from experiments import cpu_tax
    cpu_tax.MODELS = os.path.join(work, "fake_model.py")
    out = os.path.join(work, name)
    argv = ["--bundle", os.path.join(work, "bundle"), "--interleave", "3", "--warm-up", "12",
            "--blocks", "4", "--rounds", "2", "--jobs", "service-closed,service-poisson",
            "--cpus", "0,1", "--out", out] + extra
    with contextlib.redirect_stdout(io.StringIO()):
        cpu_tax.main(argv)
    rows = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))]
    return rows, open(os.path.join(out, "results.md")).read()


def median_ratio(rows, role, metric):
    ratios = []
    for rnd in sorted({r["round"] for r in rows}):
        pair = {r["interposer"]: r[metric] for r in rows if r["round"] == rnd and r["role"] == role}
        ratios.append(pair[True] / pair[False])
    ratios.sort()
    return ratios[len(ratios) // 2]


def check_bench(work):
    os.makedirs(os.path.join(work, "bundle"))
    write_exec(os.path.join(work, "bundle", "orion-server"), FAKE_SERVER)
    write_exec(os.path.join(work, "bundle", "orion-run"), FAKE_RUN)
    with open(os.path.join(work, "fake_model.py"), "w") as f:
        f.write(FAKE_MODEL)
    log = os.path.join(work, "model.log")
    os.environ["FAKE_LOG"] = log

    rows, table = run_bench(work, "ab", [])
    if len(rows) != 8 or {r["n"] for r in rows} != {12}:
        fail(f"expected 8 rows of 12 requests (2 rounds x 2 jobs x 2 arms): {rows}")
    ratio = median_ratio(rows, "service-closed", "svc_p50_ms")
    if not 1.04 < ratio < 1.16:
        fail(f"a 10% slower arm read {ratio:.3f}")
    if "interposer / bare" not in table or "served in turn in blocks of 3" not in table:
        fail(f"table:\n{table}")
    # The block answers' other figures are pooled per arm, and the requests' phases tabled.
    closed = [r for r in rows if r["role"] == "service-closed"]
    if any(abs(r["launch_ms"] - 1.0) > 1e-9 or abs(r["orion_cpu_ms"] - 0.002) > 1e-9 or
           abs(r["sync_ms"] - (0.5 if r["interposer"] else 0.25)) > 1e-9 for r in closed):
        fail(f"pooled block figures: {closed}")
    if "| sync_ms | 0.250 | 0.500 | 2.000 [2.000, 2.000] |" not in table:
        fail(f"the phases are not in the table:\n{table}")
    # Two runs of one A/B pool their rounds in one table.
    from experiments import cpu_tax
    ab = os.path.join(work, "ab", "results.jsonl")
    pooled = cpu_tax.render([ab, ab])
    if "4 rounds" not in pooled or "2 rounds" not in table:
        fail(f"two runs of 2 rounds did not pool into 4:\n{pooled}")
    # --interval: each figure's bootstrap interval of the median ratio, around its median.
    rows_ci = [l for l in cpu_tax.render([ab, ab], interval=True).splitlines()
               if l.startswith("| service-closed") and "| sync_ms |" in l]
    if len(rows_ci) != 1 or not rows_ci[0].endswith("| [2.000, 2.000] |"):
        fail(f"no interval of the median: {rows_ci}")
    lines = open(log).read().split("\n")
    starts = [l for l in lines if l.startswith("start ")]
    # Round 1: bare on core 0, interposed on core 1; round 2 swapped.
    first = {l.split()[1]: l.split()[2] for l in starts[0:2]}
    second = {l.split()[1]: l.split()[2] for l in starts[2:4]}
    if first != {"b": "[0]", "i": "[1]"} or second != {"b": "[1]", "i": "[0]"}:
        fail(f"the arms did not swap cores between rounds: {starts}")
    # Blocks alternate: in each pair of blocks both arms ran, the order flipping every block.
    blocks = [l.split()[0] for l in lines if l[:2] in ("b ", "i ")]
    pairs = [blocks[k:k + 2] for k in range(0, len(blocks), 2)]
    if any(sorted(p) != ["b", "i"] for p in pairs):
        fail(f"the arms did not take turns: {blocks}")
    if pairs[0] == pairs[1]:
        fail(f"the order did not alternate: {pairs[:4]}")
    poisson = [l for l in lines if l[:2] in ("b ", "i ") and " poisson " in l]
    by_arm = {a: [l.split(maxsplit=1)[1] for l in poisson if l.startswith(a)] for a in "bi"}
    if by_arm["b"] != by_arm["i"]:
        fail(f"the arms' Poisson blocks differ: {by_arm}")

    open(log, "w").close()
    rows, table = run_bench(work, "aa", ["--control",
                                         "--server-setting", "timeline_spans_per_gpu: 5000"])
    config = open(os.path.join(work, "server.yaml")).read()
    if "\ntimeline_spans_per_gpu: 5000\n" not in config:
        fail(f"--server-setting did not reach the server's config:\n{config}")
    if "orion-server with timeline_spans_per_gpu: 5000" not in table:
        fail(f"the table's heading does not name the server setting:\n{table}")
    ratio = median_ratio(rows, "service-closed", "svc_p50_ms")
    # Two rounds of four blocks on test doubles: one round of a loaded machine (the sanitizer
    # suites run two tests at once) read 1.078. The band catches an arm that does other work,
    # not the host's noise.
    if not 0.85 < ratio < 1.15:
        fail(f"A/A control read {ratio:.3f}")
    if "A/A control" not in table or any(l.startswith("start i") for l in open(log)):
        fail(f"control arm interposed, or the table does not say A/A:\n{table}")

    # --in-process: one process serves both arms by the switch's word; --cpu-samples folds its
    # samples per arm, the teardown (under the word the run ends on) in neither.
    open(log, "w").close()
    rows, table = run_bench(work, "inproc", ["--in-process", "--cpu-samples"])
    if sum(1 for l in open(log) if l.startswith("start ")) != 2:
        fail(f"--in-process did not run one process a round: {open(log).read()}")
    ratio = median_ratio(rows, "service-closed", "svc_p50_ms")
    if not 1.04 < ratio < 1.16:
        fail(f"in one process, the 10% slower arm read {ratio:.3f}")
    samples = [json.loads(l) for l in open(os.path.join(work, "inproc", "cpu-samples.jsonl"))]
    arms = {r["arm"] for r in samples}
    if arms != {"baseline", "interposed"} or any(r["cpu_ms"] >= 1000 for r in samples):
        fail(f"samples by arm, teardown left out: {samples}")
    # 4 recorded blocks of 3 after 4 unrecorded ones (--warm-up 12, in blocks of 3)
    if {r["requests"] for r in samples} != {(4 + 4) * 3}:
        fail(f"requests per arm and round: {samples}")

    # Several in-process baselines: the bypass (word 1, the fake's bare arm) and no-timing (word
    # 3, which the fake serves as slowly as the interposed arm) take turns with the interposed
    # arm in one process; each baseline has its A/B, the interposed rows written for each.
    open(log, "w").close()
    from experiments import cpu_tax
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rows, table = run_bench(work, "multi", ["--in-process",
                                                "--in-process-baseline", "bypass,no-timing"])
    # 12 unrecorded requests through the two arms that reach the clock: short of the learning.
    if "leaves 24 unrecorded requests" not in err.getvalue():
        fail(f"no note on a warm-up short of the learning: {err.getvalue()!r}")
    if sum(1 for l in open(log) if l.startswith("start ")) != 2:
        fail(f"several baselines did not run one process a round: {open(log).read()}")
    for name, lo, hi in (("in-process bypass", 1.04, 1.16),
                         ("in-process, no launch timed", 0.90, 1.10)):
        sub = [r for r in rows if r["baseline"] == name]
        if len(sub) != 8:  # 2 rounds x 2 jobs x (interposed, this baseline)
            fail(f"{name}: {len(sub)} rows: {rows}")
        ratio = median_ratio(sub, "service-closed", "svc_p50_ms")
        if not lo < ratio < hi:
            fail(f"{name}: the A/B read {ratio:.3f}, expected {lo} to {hi}")
        if f"against {name}" not in table:
            fail(f"no table for {name}:\n{table}")
    # --split: the run's arms side by side, one row each (the fake's CPU is a constant: its
    # service time column).
    split = cpu_tax.render_split([os.path.join(work, "multi", "results.jsonl")]).splitlines()
    by_arm = {l.split("|")[2].strip(): float(l.split("|")[5].split()[0]) for l in split[2:]}
    if set(by_arm) != {"bypass", "no launch timed"} or not 1.04 < by_arm["bypass"] < 1.16:
        fail(f"--split:\n" + "\n".join(split))
    words = [l.split()[-1] for l in open(log) if l[:2] in ("b ", "i ")]
    turns = [words[k:k + 3] for k in range(0, len(words), 3)]
    if any(sorted(t) != ["w0", "w1", "w3"] for t in turns):
        fail(f"the three arms did not take turns: {words}")
    if turns[0] == turns[1] or turns[1] == turns[2]:
        fail(f"the order did not change: {turns[:3]}")
    # The as-usual baseline (word 0, the interposed arm's own) is an A/A control in the same
    # process: it runs (one process, ready once) and reads about 1.00.
    with contextlib.redirect_stderr(io.StringIO()):
        rows, table = run_bench(work, "as-usual", ["--in-process",
                                                   "--in-process-baseline", "bypass,as-usual"])
    for name, lo, hi in (("in-process bypass", 1.04, 1.16),
                         ("in-process, as usual (an A/A control)", 0.95, 1.05)):
        sub = [r for r in rows if r["baseline"] == name]
        ratio = median_ratio(sub, "service-closed", "svc_p50_ms") if sub else 0
        if len(sub) != 8 or not lo < ratio < hi:
            fail(f"{name}: {len(sub)} rows, the A/B read {ratio:.3f}, expected {lo} to {hi}")
    # Over a Williams square of blocks every arm takes every place and follows every other arm
    # equally often; two arms alternate as they always did.
    for n in range(2, 9):
        keys = list(range(n))
        orders = [cpu_tax.turn_order(keys, i) for i in range(n if n % 2 == 0 else 2 * n)]
        places = {(k, o.index(k)) for o in orders for k in o}
        follows = [(a, b) for o in orders for a, b in zip(o, o[1:])]
        if any(sorted(o) != keys for o in orders) or len(places) != n * n or \
                len(set(follows)) != n * (n - 1) or \
                len({follows.count(f) for f in set(follows)}) != 1:
            fail(f"{n} arms: the order is not a balanced square: {orders}")
    if [cpu_tax.turn_order([True, False], i) for i in (-1, 0, 1)] != \
            [[False, True], [True, False], [False, True]]:
        fail("two arms do not alternate as before")
    for bad, why in ((["--in-process", "--in-process-baseline", "bypass,nothing"], "none of"),
                     (["--in-process", "--in-process-baseline", "bypass,bypass"], "twice"),
                     (["--in-process", "--in-process-baseline", "bypass,no-timing",
                       "--cpu-samples"], "one --in-process-baseline"),
                     (["--in-process", "--in-process-baseline", "as-usual",
                       "--cpu-samples"], "the as-usual baseline's"),
                     (["--split"], "--split goes with --table"),
                     (["--server-setting", "ring_poll_us"], "expected one 'KEY: VALUE' line"),
                     (["--server-setting", " mode: mps"], "expected one 'KEY: VALUE' line"),
                     (["--server-setting", "socket_path: /x"], "sets socket_path itself")):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                cpu_tax.main(["--bundle", work, "--interleave", "3"] + bad)
            fail(f"{bad} was accepted")
        except SystemExit:
            if why not in err.getvalue():
                fail(f"{bad}: unclear error {err.getvalue()!r}")

    os.environ["FAKE_FAIL"] = "1"
    try:
        run_bench(work, "fail", [])
        fail("a model answering with an error did not stop the run")
    except SystemExit as e:
        if "answered 'error: cannot run it'" not in str(e) or "closed 3" not in str(e):
            fail(f"unclear error: {e}")
    finally:
        del os.environ["FAKE_FAIL"]


def check_protocol():
    sys.modules.setdefault("torch", types.ModuleType("torch"))  # stub: the loop needs none of it
    import time
    import torch_models
    calls = []

    phases = []

    def one_request():
        calls.append(1)
        time.sleep(0.001)
        phases.append((0.002, 0.001))
    commands = "closed 3\npoisson 4 500 7\nbogus\nclosed x\n\nquit\nclosed 2\n"
    out = io.StringIO()
    old = sys.stdin
    sys.stdin = io.StringIO(commands)
    try:
        with contextlib.redirect_stdout(out):
            torch_models.driven(torch_models.serve_block(one_request), phases)
    finally:
        sys.stdin = old
        import gc
        gc.enable()
    lines = out.getvalue().splitlines()
    if lines[0] != "ready" or len(lines) != 5:
        fail(f"answers: {lines}")
    closed, poisson = (dict(kv.split("=") for kv in l.split()[1:]) for l in lines[1:3])
    if len(closed["lat_ms"].split(",")) != 3 or len(poisson["lat_ms"].split(",")) != 4:
        fail(f"latencies per block: {lines[1:3]}")
    if min(float(x) for x in closed["lat_ms"].split(",")) < 1.0:
        fail(f"a request shorter than its work: {lines[1]}")
    # Each answer splits its CPU by thread, and its requests' phases are their means (ms).
    for answer in (closed, poisson):
        if not {"cpu_ms", "main_cpu_ms", "orion_cpu_ms", "main_wait_ms"} <= answer.keys():
            fail(f"no thread split: {answer}")
    if closed["launch_ms"] != "2.0000" or closed["sync_ms"] != "1.0000":
        fail(f"phases of the block: {lines[1]}")
    if lines[3] != "error: cannot run 'bogus'" or lines[4] != "error: cannot run 'closed x'":
        fail(f"malformed commands: {lines[3:]}")
    if len(calls) != 7:
        fail(f"{len(calls)} requests run, 7 asked before quit")


def main():
    check_protocol()
    check_bench(tempfile.mkdtemp(prefix="cpu-tax-interleave-"))
    print("ok")


if __name__ == "__main__":
    main()
