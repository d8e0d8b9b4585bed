#!/usr/bin/env python3
"""bench/orion_bench.py wait-behind on made-up profiles of one window with known parts: 40
requests 1 ms apart, each launched 100 us into its ProfilerStep and started on the GPU 300 us
after its launch. The trainer's profiler clock runs 2,000 us ahead of the service's: its kernels
of 200 us back to back then run 100 us into the request's wait (so 100 us left of the one
running at the launch, 200 us of the next one queued), and a gap of 10 us in every tenth spot
leaves the GPU idle. The clocks must be aligned from the step ends, the parts must come out as
made, the labels must name the rows, and a window without a request is refused. A trainer with
one iteration in the window (one that stalled) is placed through the pushes' offsets
(mono_offset_us) instead, and comes out the same; without them it is refused. Two trainers, each
on a clock of its own, one's kernel running at each launch and the other's queued after it:
each one's part, and every request behind both; a long kernel running at each launch
found behind ten short ones of the other trainer; the same model twice, told apart."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "orion_bench.py")
SHIFT_US = 2000.0           # trainer clock minus service clock
EPOCH_US = 1_700_000_000_000_000.0  # system clock minus the service's profiler clock


def write(directory, trainer_start_us=0.0, trainer_steps=20, push_offsets=True):
    os.makedirs(directory, exist_ok=True)
    steps, launches = [], []
    for i in range(1, 41):
        ts, launch = 1000.0 * i, 1000.0 * i + 100
        steps.append({"push_ns": int((EPOCH_US + launch - 5) * 1e3),
                      "pop_ns": int((EPOCH_US + ts + 950) * 1e3), "torch_ts_us": ts,
                      "torch_dur_us": 1000.0, "torch_gpu_start_us": launch + 300,
                      "torch_gpu_end_us": launch + 800})
        launches.append([launch, 8.0, i])
    # The service's steps end 50 us before the next one starts (pop, then prof.step()); so do
    # the trainer's, on a clock SHIFT_US ahead.
    for i, st in enumerate(steps[:-1]):
        st["pop_ns"] = int((EPOCH_US + steps[i + 1]["torch_ts_us"] - 50) * 1e3)
    json.dump({"steps": steps}, open(os.path.join(directory, "service.json"), "w"))
    offsets = {"mono_offset_us": EPOCH_US} if push_offsets else {}
    json.dump({**offsets, "kernels": [], "launches": launches},
              open(os.path.join(directory, "service.kernels.json"), "w"))
    # Kernels on the service's clock start at 1000 i + 200 (+ 200 k): the launch at 1000 i + 100
    # finds the one of [1000 i, 1000 i + 200) running.
    spans, t = [], trainer_start_us
    while t < trainer_start_us + 42000:
        gap = 10.0 if int(t) % 2000 == 1400 else 0.0
        spans.append((t + gap, 200.0 - gap,
                      "gemm_piece" if int(t) % 1000 != 200 else "attention_bprop"))
        t += 200.0
    write_trainer(directory, "trainer", spans, SHIFT_US, trainer_steps, trainer_start_us,
                  push_offsets)


def write_trainer(directory, role, spans, shift_us, steps=20, start_us=0.0, push_offsets=True):
    """A trainer's profile: `spans` (start on the service's clock, duration, name) on a profiler
    clock shift_us ahead of the service's, and its steps of 2,000 us from start_us."""
    tsteps = []
    for i in range(steps):
        ts = start_us + shift_us + 2000.0 * i
        tsteps.append({"push_ns": 0, "torch_ts_us": ts,
                       "pop_ns": int((EPOCH_US + ts + 2000.0 - shift_us - 50) * 1e3)})
    kernels = [[t + shift_us, dur, 1, 1, 1, 1, 1, 1, 0, name] for t, dur, name in spans]
    json.dump({"steps": tsteps}, open(os.path.join(directory, f"{role}.json"), "w"))
    offsets = {"mono_offset_us": EPOCH_US - shift_us} if push_offsets else {}
    json.dump({**offsets, "kernels": kernels, "launches": []},
              open(os.path.join(directory, f"{role}.kernels.json"), "w"))


def write_group(directory):
    """Two trainers on clocks of their own: the first's kernel of [1000 i, 1000 i + 200) is
    running at each launch (100 us left), the second's of [1000 i + 250, 1000 i + 350) queued
    behind it (100 us): 100 us of each wait idle, every request behind both."""
    write(directory)
    write_trainer(directory, "trainer", [(1000.0 * i, 200.0, "gemm_piece") for i in range(43)],
                  SHIFT_US)
    write_trainer(directory, "trainer2", [(1000.0 * i + 250, 100.0, "conv") for i in range(43)],
                  -3000.0)
    json.dump({"trainer": "llm", "trainer2": "resnet50"},
              open(os.path.join(directory, "trainers.json"), "w"))


def write_crowded(directory):
    """Two trainers: the first's long kernel of [1000 i - 500, 1000 i + 200) running at each
    launch (100 us left), the second's ten short kernels started since, all ended before it."""
    write(directory)
    write_trainer(directory, "trainer",
                  [(1000.0 * i - 500, 700.0, "gemm_long") for i in range(1, 43)], SHIFT_US)
    write_trainer(directory, "trainer2", [(1000.0 * i - 400 + 30 * k, 10.0, "short")
                                          for i in range(1, 43) for k in range(10)], -3000.0)


def rows_of(work, directory, name, failures, *args):
    """wait-behind on `directory` (its row to NAME.jsonl): the run and its row, or None where it
    failed (said in `failures`)."""
    out = os.path.join(work, f"{name}.jsonl")
    run = subprocess.run([sys.executable, SCRIPT, "wait-behind", directory, *args, "--out", out],
                         capture_output=True, text=True)
    if run.returncode != 0:
        failures.append(f"{name}: {run.stdout + run.stderr}")
        return run, None
    return run, json.loads(open(out).read().splitlines()[0])


def main():
    failures = []
    with tempfile.TemporaryDirectory() as work:
        good, apart = os.path.join(work, "good"), os.path.join(work, "apart")
        write(good)
        write(apart, trainer_start_us=1_000_000.0)
        run, row = rows_of(work, good, "made-up", failures, "--labels", "made up")
        if row is None:
            print(failures[0])
            return 1
        expect = {"requests": 40, "label": "made up", "clock_shift_us": -SHIFT_US,
                  "wait_p50_us": 300.0, "running_p50_us": 100.0, "queued_p50_us": 200.0,
                  "found_running": 1.0}
        for key, want in expect.items():
            if row.get(key) != want:
                failures.append(f"{key}: {row.get(key)} (want {want})")
        if row["top"][0]["name"] != "attention_bprop":
            failures.append(f"largest share: {row['top'][0]} (want attention_bprop, the queued one)")
        if "made up" not in run.stdout:
            failures.append("the table does not name the row by its label")
        if row.get("clock") != "step ends":
            failures.append(f"clock: {row.get('clock')} (want step ends)")
        # One trainer iteration: placed through the pushes, the same parts.
        stalled, bare = os.path.join(work, "stalled"), os.path.join(work, "bare")
        write(stalled, trainer_steps=1)
        write(bare, trainer_steps=1, push_offsets=False)
        _, r1 = rows_of(work, stalled, "one-iteration", failures)
        if r1 is not None:
            for key, want in {**expect, "label": None, "clock": "pushes"}.items():
                if r1.get(key) != want:
                    failures.append(f"one iteration: {key}: {r1.get(key)} (want {want})")
        no_push = subprocess.run([sys.executable, SCRIPT, "wait-behind", bare],
                                 capture_output=True, text=True)
        if no_push.returncode == 0 or "fewer than two iterations" not in no_push.stderr:
            failures.append(f"one iteration without push offsets was not refused: "
                            f"{no_push.returncode} {no_push.stderr}")
        refused = subprocess.run([sys.executable, SCRIPT, "wait-behind", apart],
                                 capture_output=True, text=True)
        if refused.returncode == 0 or "no request inside the trainer's window" not in refused.stderr:
            failures.append(f"a window apart was not refused: {refused.returncode} {refused.stderr}")
        # Two trainers: each one's part, and the requests behind both.
        group = os.path.join(work, "group")
        write_group(group)
        two, r2 = rows_of(work, group, "two-trainers", failures)
        if r2 is not None:
            for key, want in {"requests": 40, "wait_p50_us": 300.0, "running_p50_us": 100.0,
                              "queued_p50_us": 100.0, "idle_p50_us": 100.0,
                              "behind_several": 1.0}.items():
                if r2.get(key) != want:
                    failures.append(f"two trainers: {key}: {r2.get(key)} (want {want})")
            parts = {t["name"]: (t["running_mean_us"], t["queued_mean_us"], t["behind"],
                                 t["clock_shift_us"]) for t in r2.get("trainers", [])}
            want = {"llm": (100.0, 0.0, 1.0, -SHIFT_US), "resnet50": (0.0, 100.0, 1.0, 3000.0)}
            if parts != want:
                failures.append(f"two trainers: parts {parts} (want {want})")
            if "resnet50: conv" not in [t["name"] for t in r2["top"]]:
                failures.append(f"two trainers: kernels not named by trainer: {r2['top']}")
            if "waited behind work of two trainers or more" not in two.stdout:
                failures.append("two trainers: the table has no trainers' parts")
        # A long kernel running at the launch, another trainer's short ones started since.
        crowded = os.path.join(work, "crowded")
        write_crowded(crowded)
        _, r4 = rows_of(work, crowded, "crowded", failures)
        if r4 is not None:
            got = {k: r4.get(k) for k in ("running_p50_us", "queued_p50_us", "idle_p50_us",
                                          "found_running")}
            want = {"running_p50_us": 100.0, "queued_p50_us": 0.0, "idle_p50_us": 200.0,
                    "found_running": 1.0}
            if got != want:
                failures.append(f"a long kernel behind another trainer's short ones: {got} "
                                f"(want {want})")
        # The same model twice: two trainers still, told apart.
        json.dump({"trainer": "resnet50", "trainer2": "resnet50"},
                  open(os.path.join(group, "trainers.json"), "w"))
        _, r3 = rows_of(work, group, "one-model-twice", failures)
        if r3 is not None:
            got = [(t["name"], t["queued_mean_us"]) for t in r3.get("trainers", [])]
            if got != [("resnet50", 0.0), ("resnet50#2", 100.0)]:
                failures.append(f"one model twice: {got} (want resnet50 and resnet50#2)")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
