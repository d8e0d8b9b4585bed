"""Does a GPU-side gate hold a trainer without a CPU round trip? A probe of the mechanism alone,
no orion: a spin-kernel service and a spin-kernel trainer (bench/workloads/gate_probe.py) share
one word of host memory that the trainer's stream waits on (cuStreamWaitValue32).

  orion_bench.py gpu-gate [--rounds 2] [--seconds 8] [--kernels 10] [--kernel-us 100]
                          [--be-kernel-us 100,500] [--arms KIND,...] [--load 0.5] [--out DIR]
  orion_bench.py gpu-gate --table ROWS.jsonl [ROWS.jsonl ...] [--summary]

Arms, one process pair each, order rotating between rounds: the service alone; for each trainer
kernel length the trainer alone and the arms --arms names: `wait-alone` (the trainer alone with
a wait before every kernel: what the waits cost it); then together:
`timeslice` (no gate), `gpu-gate` (the service clears the word before a request and sets it when
the request completes; the trainer waits on it before every kernel), `gpu-gate/4` (a wait every
4 kernels), `blocked` (the trainer's stream waits on a word nobody sets: does a context
blocked on host memory cost the service anything?) and `blocked-graph` (the same beside a
service whose request is one CUDA graph, against `graph-alone`; `-two`: two blocked trainers, each
its own process; `-sync`: the trainer's thread
meanwhile waits for its stream in the driver,
as a step loop does; `-poll`: a thread of the trainer queries the event after its queued work
every 20 us, as orion's completion poller follows a held trainer's records; `-irq`: the
service waits for each request on a blocking-sync event, as orion's completion poller does), `blocked-WORK` (the same with WORK queued
behind the wait instead of spin kernels: `linear-bias`, `sdpa`, copies for the copy engine or
fresh memory (`copy-h2d`, `copy-pinned`, `copy-d2h`, `alloc`: beside a graph service,
`blocked-graph-copy-h2d`...), a torch_models.py trainer's step, `llm`, `mm-long`, `mm-short`,
or `sleep-waits`, spin kernels each behind a wait, more than the channel's queue holds: the
trainer's launch call blocks; `blocked-few-waits`: 200 of them, the queue not full;
`blocked-graph-few-waits`, `-sleep-waits`: both beside a graph service;
`blocked-graph-cold-WORK`: WORK (`llm`, `linear-bias`, `sdpa`, `resnet50`) built, then run for
the first time behind the wait, as a trainer's first step held on the GPU: modules loaded at a
kernel's first launch, libraries set up, fresh memory),
`cpu-gate` (the trainer's thread holds its
launches while the word is clear, at most 2 kernels queued: its stream goes idle), and the
gpu-gate's variants: `gpu-gate-q2` (at most 2 kernels queued), `gpu-gate-eq`, `-geq`, `-flush`,
`-64` (the stream wait's other comparisons, the flush flag, the 64-bit wait). The service runs
Poisson arrivals at --load of its capacity and reports what each request waited for the GPU (its
time from launch to completion less its kernels' span); the trainer's speed is counted inside
the service's window. One JSON row per arm to gpu-gate.jsonl.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import harness

ANSWERS = ("the GPU-side gate alone: a service's latency, what it waited for the GPU, and a "
           "trainer's speed with the trainer's stream waiting on host memory the service flips, "
           "or held on the CPU (no orion)")
PROBE = os.path.join(harness.BENCH, "workloads", "gate_probe.py")
STOP = "/tmp/orion-gate-probe.stop"
WORD = "/dev/shm/orion-gate-probe"


def open_word():
    """Sets the gate's bit from outside (a trainer must never be left waiting at the end), and
    the blocked trainer's word (whose thread may be stuck in a launch call)."""
    for path in (WORD, WORD + ".never"):
        if os.path.exists(path):
            fd = os.open(path, os.O_WRONLY)
            os.pwrite(fd, (1).to_bytes(4, "little"), 0)
            os.close(fd)


def probe(role, *args, cpus):
    return harness.taskset(cpus) + [sys.executable, PROBE, role, *args]


def rate_between(marks, start, end):
    """Kernels per second completed between start and end, from (time, count) marks."""
    inside = [m for m in marks if start <= m[0] <= end]
    if len(inside) < 2:
        return 0.0
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def run_arm(arm, a, cpu):
    """One arm: returns its row."""
    stops = [STOP + ("" if i == 0 else str(i + 1)) for i in range(arm.get("trainers", 1))]
    for stop in stops:
        for path in (stop, stop + ".ready"):
            if os.path.exists(path):
                os.remove(path)
    open_word()
    common = ["--cycles-per-us", str(cpu), "--word", WORD]
    service_args = ["--kernels", str(a.kernels), "--kernel-us", str(a.kernel_us),
                    "--rate", str(a.rate), "--seconds", str(a.seconds), *common]
    trainers = []
    if arm["trainer"]:
        gate, every, kus, *extra = arm["trainer"]
        for stop in stops:  # several: each its own process and context, blocked alike
            trainers.append(subprocess.Popen(
                probe("trainer", "--gate", gate, "--wait-every", str(every), "--kernel-us",
                      str(kus), "--stop", stop, *(extra[0] if extra else []), *common,
                      cpus=a.trainer_cpus),
                stdout=subprocess.PIPE, text=True))
        deadline = time.monotonic() + (90 if gate == "blocked" else 4)
        while time.monotonic() < deadline and not (
                gate == "blocked" and all(os.path.exists(s + ".ready") for s in stops)):
            time.sleep(0.05)  # its import and first kernels (a blocked one says when it waits)
    row = {"arm": arm["name"]}
    if arm["service"]:
        out = subprocess.run(probe("service", "--gate", arm["service"], *service_args,
                                   *arm.get("service_args", []),
                                   cpus=a.service_cpus),
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"gpu-gate: {arm['name']}: the service failed:\n{out.stderr[-2000:]}")
        row.update(json.loads(out.stdout.strip().splitlines()[-1]))
    else:
        t0 = time.monotonic()
        time.sleep(a.seconds)
        row.update({"start": t0, "end": time.monotonic()})
    if trainers:
        for stop in stops:
            open(stop, "w").close()
        open_word()
        results = []
        for trainer in trainers:
            try:
                text, _ = trainer.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                trainer.kill()
                trainer.communicate()
                row["error"] = "a trainer did not stop within 60 s"
                return row
            if trainer.returncode != 0:
                row["error"] = f"a trainer failed (exit {trainer.returncode})"
                return row
            results.append(json.loads(text.strip().splitlines()[-1]))
        t = results[0]
        row["trainer_kernels_per_s"] = round(rate_between(t.pop("marks"), row["start"],
                                                          row["end"]), 1)
        row["trainer"] = t
    row.pop("role", None)
    return row


BEHIND = ("linear-bias", "sdpa", "llm", "mm-long", "mm-short", "sleep-waits")
COPIES = ("copy-h2d", "copy-pinned", "copy-d2h", "alloc")  # copies, or memory, behind the wait
COLD = ("llm", "linear-bias", "sdpa", "resnet50")  # a first step's setup behind the wait
TWO_TRAINERS = ("blocked-graph-two", "blocked-graph-two-sync")  # two blocked processes, not one
# The arms that vary the service or what the blocked trainer does: kind, name ({kus}: the
# trainer's kernel length), the service's arguments, the trainer's (None: no trainer).
VARIANTS = (
    ("graph-alone", "service alone, a CUDA graph a request", ["--graph"], None),
    ("blocked-graph", "blocked ({kus:g} us), the service a CUDA graph", ["--graph"], []),
    ("blocked-graph-eq", "blocked ({kus:g} us, wait eq), the service a CUDA graph", ["--graph"],
     ["--wait", "eq"]),
    ("graph-irq-alone",
     "service alone, a CUDA graph a request, waited for on a blocking event",
     ["--graph", "--blocking-event"], None),
    ("blocked-graph-irq",
     "blocked ({kus:g} us), its thread in cuCtxSynchronize, the service a CUDA graph waited for "
     "on a blocking event", ["--graph", "--blocking-event"], ["--sync"]),
    ("blocked-graph-sync",
     "blocked ({kus:g} us), its thread in cuCtxSynchronize, the service a CUDA graph",
     ["--graph"], ["--sync"]),
    ("blocked-graph-two",
     "two blocked ({kus:g} us), each its own process, the service a CUDA graph", ["--graph"], []),
    ("blocked-graph-two-sync",
     "two blocked ({kus:g} us), each its own process in cuCtxSynchronize, the service a CUDA graph",
     ["--graph"], ["--sync"]),
    ("blocked-graph-poll",
     "blocked ({kus:g} us), its queued work's event queried every 20 us, the service a CUDA graph",
     ["--graph"], ["--poll-us", "20"]),
    ("blocked-llm-sync",
     "blocked, llm behind, its thread in cuCtxSynchronize, the service a CUDA graph",
     ["--graph"], ["--behind", "llm", "--sync"]),
    ("blocked-few-waits", "blocked, 200 spin kernels each behind a wait (the queue not full)", [],
     ["--behind", "sleep-waits", "--waits", "200"]),
    ("blocked-graph-few-waits",
     "blocked, 200 spin kernels each behind a wait (the queue not full), the service a CUDA graph",
     ["--graph"], ["--behind", "sleep-waits", "--waits", "200"]),
    ("blocked-graph-sleep-waits",
     "blocked, 8,192 spin kernels each behind a wait (the queue full), the service a CUDA graph",
     ["--graph"], ["--behind", "sleep-waits"]),
    *((f"blocked-{w}", f"blocked, {w} behind", [], ["--behind", w]) for w in BEHIND),
    *((f"blocked-graph-{w}", f"blocked, {w} behind, the service a CUDA graph", ["--graph"],
       ["--behind", w]) for w in COPIES),
    *((f"blocked-graph-cold-{w}",
       f"blocked, {w}'s first run behind the wait (a first step), the service a CUDA graph",
       ["--graph"], ["--behind", w, "--cold"]) for w in COLD),
)
ARM_KINDS = ("wait-alone", "timeslice", "gpu-gate", "gpu-gate/4", "blocked", "cpu-gate",
             "gpu-gate-q2", "gpu-gate-eq", "gpu-gate-geq", "gpu-gate-flush", "gpu-gate-64",
             *(kind for kind, *_ in VARIANTS))


def arms(be_kernel_us, kinds=ARM_KINDS):
    """The service alone, and for each trainer kernel length the trainer alone (every ratio's
    baseline) and the arms of `kinds`."""
    out = [{"name": "service alone", "service": "none", "trainer": None}]
    for kus in be_kernel_us:
        every = {
            "wait-alone": {"name": f"trainer alone, wait per kernel ({kus:g} us)",
                           "service": None, "trainer": ("gpu", 1, kus)},
            "timeslice": {"name": f"timeslice ({kus:g} us)", "service": "none",
                          "trainer": ("none", 1, kus)},
            "gpu-gate": {"name": f"gpu-gate ({kus:g} us)", "service": "gpu",
                         "trainer": ("gpu", 1, kus)},
            "gpu-gate/4": {"name": f"gpu-gate/4 ({kus:g} us)", "service": "gpu",
                           "trainer": ("gpu", 4, kus)},
            "blocked": {"name": f"blocked ({kus:g} us)", "service": "none",
                        "trainer": ("blocked", 1, kus)},
            "cpu-gate": {"name": f"cpu-gate, 2 queued ({kus:g} us)", "service": "gpu",
                         "trainer": ("cpu", 1, kus, ["--queue", "2"])},
            "gpu-gate-q2": {"name": f"gpu-gate, 2 queued ({kus:g} us)", "service": "gpu",
                            "trainer": ("gpu", 1, kus, ["--queue", "2"])},
        }
        for kind, name, service_args, trainer_args in VARIANTS:
            every[kind] = {"name": name.format(kus=kus), "service": "none",
                           "trainers": 2 if kind in TWO_TRAINERS else 1,
                           "service_args": service_args,
                           "trainer": None if trainer_args is None else
                           ("blocked", 1, kus, trainer_args)}
        for wait in ("eq", "geq", "flush", "64"):
            every[f"gpu-gate-{wait}"] = {
                "name": f"gpu-gate, wait {wait} ({kus:g} us)", "service": "gpu",
                "trainer": ("gpu", 1, kus, ["--wait", {"flush": "and-flush",
                                                       "64": "eq64"}.get(wait, wait)])}
        out.append({"name": f"trainer alone ({kus:g} us)", "service": None,
                    "trainer": ("none", 1, kus)})
        out += [every[k] for k in kinds]
    return out


def summarize(rows):
    """Each row against its round's service alone and trainer alone (same kernel length)."""
    alone = {(r["round"], "service"): r for r in rows if r["arm"] == "service alone"}
    for r in rows:
        if r["arm"].startswith("trainer alone ("):
            alone[(r["round"], "trainer", r["trainer"]["kernel_us"])] = r
    out = []
    for r in rows:
        s = alone.get((r["round"], "service"))
        t = alone.get((r["round"], "trainer", r.get("trainer", {}).get("kernel_us")))
        cell = dict(r)
        if s and "p50_ms" in r:
            cell["p50_x"] = r["p50_ms"] / s["p50_ms"]
            cell["p99_x"] = r["p99_ms"] / s["p99_ms"]
        if t and r.get("trainer_kernels_per_s") is not None and t["trainer_kernels_per_s"]:
            cell["trainer_x"] = r["trainer_kernels_per_s"] / t["trainer_kernels_per_s"]
            if s and "p50_ms" in r:
                cell["harvest"] = cell["trainer_x"] / max(1e-9, 1 - s["busy"])
        out.append(cell)
    return out


def table(rows, summary_only=False):
    cells = summarize(rows)
    body = []
    for c in cells:
        body.append([c["round"], c["arm"],
                     f"{c['p50_ms']:.2f} ms" if "p50_ms" in c else "-",
                     f"{c['p99_ms']:.2f} ms" if "p99_ms" in c else "-",
                     f"{c['wait_p50_us']:.0f} / {c['wait_mean_us']:.0f} us"
                     if "wait_p50_us" in c else "-",
                     f"{c['p50_x']:.2f}x / {c['p99_x']:.2f}x" if "p50_x" in c else "-",
                     f"{c['trainer_kernels_per_s']:.0f}/s" if c.get("trainer") else "-",
                     f"{c['trainer_x']:.2f}x" if "trainer_x" in c else "-",
                     f"{c['harvest']:.2f}" if "harvest" in c else "-",
                     f"{c['trainer']['launch_us']:.1f} us" if c.get("trainer", {}).get(
                         "launch_us") else "-"])
    text = harness.markdown_table(
        ["round", "arm", "service p50", "p99", "waited for the GPU: p50 / mean",
         "p50 / p99 vs alone", "trainer kernels",
         "trainer vs alone", "harvest", "trainer CPU per launch"], body)
    groups = {}
    for c in cells:
        if "p50_x" in c or "trainer_x" in c:
            groups.setdefault(c["arm"], []).append(c)
    summary = []
    for arm, cs in groups.items():
        def med(key, suffix="x", digits=2):
            vals = [c[key] for c in cs if key in c]
            return harness.spread(vals, digits, suffix) if vals else "-"
        summary.append([arm, len(cs), med("p50_x"), med("p99_x"), med("wait_p50_us", " us", 0),
                        med("trainer_x"), med("harvest", "")])
    pooled = harness.markdown_table(
        ["arm", "rounds", "p50 vs alone", "p99 vs alone", "waited for the GPU, p50",
         "trainer vs alone", "harvest"], summary)
    if summary_only:
        return pooled
    return text + "\n\nOver the rounds: median [min, max]\n\n" + pooled


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--kernels", type=int, default=10)
    p.add_argument("--kernel-us", type=float, default=100)
    p.add_argument("--be-kernel-us", default="100,500")
    p.add_argument("--arms", default=",".join(ARM_KINDS),
                   help=f"which arms beside the alone ones (of {', '.join(ARM_KINDS)})")
    p.add_argument("--load", type=float, default=0.5)
    p.add_argument("--service-cpus", default="0-1")
    p.add_argument("--trainer-cpus", default="2-3")
    p.add_argument("--out")
    p.add_argument("--table", metavar="ROWS_JSONL", nargs="+")
    p.add_argument("--summary", action="store_true",
                   help="with --table: only the arms over the rounds (median [min, max])")
    a = p.parse_args(argv)
    if a.table:
        print(table([r for path in a.table for r in harness.read_rows(path, "gpu-gate")],
                    a.summary))
        return
    out = a.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="orion-gpu-gate-")
    os.makedirs(out, exist_ok=True)
    cal = subprocess.run([sys.executable, PROBE, "calibrate"], capture_output=True, text=True)
    if cal.returncode != 0:
        sys.exit(f"gpu-gate: calibration failed:\n{cal.stderr[-2000:]}")
    cpu = json.loads(cal.stdout)["cycles_per_us"]
    a.rate = a.load / (a.kernels * a.kernel_us * 1e-6)
    kinds = [k for k in a.arms.split(",") if k]
    if any(k not in ARM_KINDS for k in kinds):
        sys.exit(f"gpu-gate: --arms: each of {', '.join(ARM_KINDS)}")
    plan = arms([float(x) for x in a.be_kernel_us.split(",")], kinds)
    rows = []
    for rnd in range(a.rounds):
        for arm in harness.rotated(plan, rnd):
            row = {"round": rnd, "cycles_per_us": round(cpu, 1), "load": a.load,
                   **run_arm(arm, a, cpu)}
            rows.append(row)
            harness.append_row(os.path.join(out, "gpu-gate.jsonl"), row)
            print(json.dumps(row), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
