"""Two roles of the GPU-side gate probe (bench/diagnostics/gpu_gate.py): a service and a trainer
made of spin kernels (torch.cuda._sleep), sharing one word of host memory that the GPU reads.

  gate_probe.py calibrate                      -> {"cycles_per_us": ...}
  gate_probe.py service --word FILE --gate none|gpu --kernels K --kernel-us U --rate R
                        --seconds S --cycles-per-us C [--graph] [--blocking-event]
  gate_probe.py trainer --word FILE --gate none|gpu|cpu|blocked --kernel-us U --wait-every N
                        [--wait and|eq|geq|and-flush|eq64] [--queue Q] --stop FILE
                        --cycles-per-us C
                        [--behind sleep|sleep-waits|linear-bias|sdpa|copy-*|alloc|MODEL]
                        [--waits N] [--sync] [--poll-us U]

The word is a file of one page under /dev/shm, mapped by both processes and registered with the
driver (cuMemHostRegister, device-mapped), so a stream can wait on it (cuStreamWaitValue32,
"AND 1": the stream goes on once bit 0 is set). The service clears bit 0 before it launches a
request's kernels (a CPU store, no system call) and sets it when the request has completed; the
trainer with `--gate gpu` puts a stream wait on the word before every N-th kernel, so what it
queued stops at the next wait while the service has a request on the GPU and starts again the
moment the service's request ends, without its CPU thread ever waiting. `blocked`: the trainer
queues one wait on a word nobody sets and kernels behind it (does a stream waiting on host
memory cost another process's context anything?); `--behind` picks what it queues there: spin
kernels (`sleep`), spin kernels each behind a wait of its own, more than the channel's queue
holds, so that the launch call blocks (`sleep-waits`), cuBLASLt GEMMs with a bias epilogue
(`linear-bias`: a d-4096 layer over 16384 tokens, bf16), fused attention (`sdpa`: 4 x 32
heads x 4096 tokens, causal, bf16), copies on the copy engine (`copy-h2d` from pageable memory,
as a model's `.cuda()`; `copy-pinned`, queued from pinned memory; `copy-d2h`, as `.cpu()`),
fresh device memory (`alloc`: cuMemAlloc, as a first step's activations), or a
training step of a torch_models.py trainer (`llm`,
`mm-long`, `mm-short`, ...), each run once before the wait; `--poll-us U`: a thread of the
trainer asks the driver every U us whether the event recorded after that work is done
(cuEventQuery), as orion's completion poller follows a held trainer's records every 20 us.
`none`: plain time-slicing. `cpu`: the gate on the CPU, for comparison: the trainer's thread
spins on the word before every launch, so what it has queued drains and its stream goes idle while the service holds the word. `--wait` picks the
stream wait's comparison (all go on once bit 0 is set; `eq64` is the 64-bit wait), `--queue` how
many kernels the trainer keeps queued at most (default 192).

The service sends Poisson arrivals of K kernels of U us each, latency from the scheduled arrival,
and for each request the time from its launch to its completion less its kernels' own span on
the GPU (events around them): what it waited for the GPU. The trainer reports (time, kernels
completed) every 64 kernels. One JSON line on stdout each.
"""
import argparse
import ctypes
import json
import mmap
import os
import random
import struct
import sys
import threading
import time

import torch

PORTABLE, DEVICEMAP = 0x1, 0x2
# cuStreamWaitValue flags, and the value each waits for: all go on once bit 0 of the word is set.
WAITS = {"and": (0x2, 1), "eq": (0x1, 1), "geq": (0x0, 1), "and-flush": (0x2 | 1 << 30, 1),
         "eq64": (0x1, 1)}


def driver():
    cuda = ctypes.CDLL("libcuda.so.1")

    def fn(*names):
        for n in names:
            if hasattr(cuda, n):
                return getattr(cuda, n)
        sys.exit(f"gate_probe: libcuda has none of {names}")

    return {"register": fn("cuMemHostRegister_v2", "cuMemHostRegister"),
            "devptr": fn("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer"),
            "wait": fn("cuStreamWaitValue32_v2", "cuStreamWaitValue32"),
            "wait64": fn("cuStreamWaitValue64_v2", "cuStreamWaitValue64"),
            "alloc": fn("cuMemAlloc_v2", "cuMemAlloc")}


class Word:
    """One page of /dev/shm, mapped and registered; bit 0 of its first word is the gate."""

    def __init__(self, path, cu):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, 4096)
        self.map = mmap.mmap(fd, 4096)
        os.close(fd)
        self.buf = (ctypes.c_char * 4096).from_buffer(self.map)
        addr = ctypes.addressof(self.buf)
        rc = cu["register"](ctypes.c_void_p(addr), ctypes.c_size_t(4096),
                            ctypes.c_uint(PORTABLE | DEVICEMAP))
        if rc not in (0, 712):  # 712: already registered
            sys.exit(f"gate_probe: cuMemHostRegister: error {rc}")
        dptr = ctypes.c_uint64()
        rc = cu["devptr"](ctypes.byref(dptr), ctypes.c_void_p(addr), ctypes.c_uint(0))
        if rc != 0:
            sys.exit(f"gate_probe: cuMemHostGetDevicePointer: error {rc}")
        self.dptr = dptr.value
        self.cu = cu

    def set(self, value):
        struct.pack_into("<I", self.map, 0, value)

    def is_open(self):
        return struct.unpack_from("<I", self.map, 0)[0] & 1

    def wait_on(self, stream, kind="and"):
        flags, value = WAITS[kind]
        if kind == "eq64":
            rc = self.cu["wait64"](ctypes.c_void_p(stream), ctypes.c_uint64(self.dptr),
                                   ctypes.c_uint64(value), ctypes.c_uint(flags))
        else:
            rc = self.cu["wait"](ctypes.c_void_p(stream), ctypes.c_uint64(self.dptr),
                                 ctypes.c_uint32(value), ctypes.c_uint(flags))
        if rc != 0:
            sys.exit(f"gate_probe: cuStreamWaitValue32: error {rc}")


def calibrate():
    torch.cuda.init()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    torch.cuda.synchronize()
    s.record()
    torch.cuda._sleep(20_000_000)
    e.record()
    e.synchronize()
    return {"cycles_per_us": 20_000_000 / (s.elapsed_time(e) * 1e3)}


def service(a):
    torch.zeros(1, device="cuda")
    word = Word(a.word, driver()) if a.gate == "gpu" else None
    if word:
        word.set(1)
    cycles = int(a.kernel_us * a.cycles_per_us)

    def kernels():
        for _ in range(a.kernels):
            torch.cuda._sleep(cycles)

    request = kernels
    if a.graph:  # the request's kernels as one CUDA graph, replayed per request
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kernels()
        request = graph.replay
    done = torch.cuda.Event(blocking=True) if a.blocking_event else None
    for _ in range(20):  # warm-up
        request()
        torch.cuda.synchronize()
    rng = random.Random(1)
    lat, busy, waits = [], 0.0, []
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start = time.monotonic() + 0.2
    due = start
    end = start + a.seconds
    while due < end:
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        t0 = time.monotonic()
        if word:
            word.set(0)  # hold: what the trainer queued stops at its next wait
        first.record()
        request()
        last.record()
        if done is not None:  # waited for asleep, woken by the GPU's interrupt
            done.record()
            done.synchronize()
        torch.cuda.synchronize()
        if word:
            word.set(1)  # release: the trainer's queue runs on at once
        t1 = time.monotonic()
        busy += t1 - t0
        lat.append((t1 - due) * 1e3)
        # What the request's own kernels took on the GPU, and the rest of its time from launch
        # to completion: the wait for the GPU (the trainer's kernel, a context switch) and the
        # launch and synchronize calls.
        waits.append((t1 - t0) * 1e3 - first.elapsed_time(last))
        due += rng.expovariate(a.rate)
    lat.sort()
    waits.sort()
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))]
    return {"role": "service", "gate": a.gate, "graph": a.graph, "requests": len(lat),
            "p50_ms": round(q(lat, 0.5), 3), "p99_ms": round(q(lat, 0.99), 3),
            "mean_ms": round(sum(lat) / len(lat), 3),
            "wait_p50_us": round(q(waits, 0.5) * 1e3, 1),
            "wait_p90_us": round(q(waits, 0.9) * 1e3, 1),
            "wait_mean_us": round(sum(waits) / len(waits) * 1e3, 1),
            "busy": round(busy / (end - start), 3), "start": start, "end": end}


def behind_work(kind, cycles):
    """The work a blocked trainer queues behind its wait: a callable queuing one piece of it."""
    if kind == "sleep":
        return lambda: [torch.cuda._sleep(cycles) for _ in range(512)]
    if kind == "linear-bias":  # cuBLASLt with a bias epilogue, as a transformer's Linear layers
        x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
        return lambda: [torch.nn.functional.linear(x, w, b) for _ in range(16)]
    if kind in ("copy-h2d", "copy-pinned"):  # host-to-device copies: as a model's `.cuda()`
        src = torch.randn(16 << 20)  # 64 MB; pageable, or pinned (the copy queued, no staging)
        src = src.pin_memory() if kind == "copy-pinned" else src
        dst = torch.empty_like(src, device="cuda")
        return lambda: [dst.copy_(src, non_blocking=kind == "copy-pinned") for _ in range(4)]
    if kind == "copy-d2h":  # device-to-host copies, as `.item()` or `.cpu()` in a step loop
        src = torch.randn(16 << 20, device="cuda")
        return lambda: [src.cpu() for _ in range(4)]
    if kind == "alloc":  # fresh device memory (cuMemAlloc, 512 MB twice), as a first step's
        mem_alloc = driver()["alloc"]  # activations are allocated; never freed here

        def alloc():
            for _ in range(2):
                ptr = ctypes.c_uint64()
                rc = mem_alloc(ctypes.byref(ptr), ctypes.c_size_t(512 << 20))
                if rc != 0:
                    sys.exit(f"gate_probe: cuMemAlloc: error {rc}")
        return alloc
    if kind == "sdpa":
        q, k, v = (torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        return lambda: [torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                        for _ in range(8)]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_models
    return torch_models.build_train(kind)


def blocked(a, stream, cycles):
    """Queues a wait on a word nobody sets and --behind's work behind it; the word opens once
    the stop file appears (from a watcher thread: the work may wait for its stream on the CPU)."""
    word = Word(a.word + ".never", driver())
    if a.behind == "sleep-waits":  # a wait before every kernel, as orion's GPU hold queues them
        def work():
            for _ in range(a.waits):  # 8192: more than a channel's queue holds, the launches block
                word.wait_on(stream, a.wait)
                torch.cuda._sleep(cycles)
    else:
        work = behind_work(a.behind, cycles)
        if not a.cold:  # --cold: its first run behind the wait, as a trainer's first step held on
            work()  # the GPU; else once unblocked: libraries loaded, plans built, memory cached
    torch.cuda.synchronize()
    word.set(0)
    word.wait_on(stream, a.wait)  # never released: everything behind it waits

    def watch():
        while not os.path.exists(a.stop):
            time.sleep(0.02)
        word.set(1)  # let the queue drain before the process exits

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    open(a.stop + ".ready", "w").close()
    started = time.monotonic()
    work()  # may wait on the CPU for the blocked stream (a first step does): then until the stop
    queued_s = time.monotonic() - started
    polls = 0
    if a.poll_us is not None:  # as orion's poller follows records queued behind a hold
        done = torch.cuda.Event()
        done.record()

        def poll():
            nonlocal polls
            while not os.path.exists(a.stop) and not done.query():
                polls += 1
                time.sleep(a.poll_us / 1e6)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
    if a.sync:  # as a trainer's step loop: its thread waits in the driver for the stream
        torch.cuda.synchronize()
    watcher.join()
    torch.cuda.synchronize()
    return {"role": "trainer", "gate": a.gate, "behind": a.behind, "cold": a.cold,
            "kernel_us": a.kernel_us, "queued_s": round(queued_s, 3), "polls": polls, "marks": []}


def trainer(a):
    torch.zeros(1, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    cycles = int(a.kernel_us * a.cycles_per_us)
    if a.gate == "blocked":
        return blocked(a, stream, cycles)
    word = Word(a.word, driver()) if a.gate in ("gpu", "cpu") else None
    if word:
        word.set(1)  # open until a service holds it
    marks, pending, done, launched, launch_ns = [], [], 0, 0, 0
    queued = []  # with --queue under 64: an event after each kernel
    while not os.path.exists(a.stop):
        for _ in range(64):
            if a.gate == "cpu":
                while not word.is_open():
                    pass
            t = time.perf_counter_ns()
            if a.gate == "gpu" and launched % a.wait_every == 0:
                word.wait_on(stream, a.wait)
            torch.cuda._sleep(cycles)
            launch_ns += time.perf_counter_ns() - t
            launched += 1
            if a.queue < 64:
                ev = torch.cuda.Event()
                ev.record()
                queued.append(ev)
                while len(queued) > a.queue:
                    queued.pop(0).synchronize()
        ev = torch.cuda.Event()
        ev.record()
        pending.append(ev)
        while len(pending) > max(1, a.queue // 64 - 1):  # 64 to 192 kernels queued by default
            pending.pop(0).synchronize()
            done += 64
            marks.append((time.monotonic(), done))
    return {"role": "trainer", "gate": a.gate, "kernel_us": a.kernel_us,
            "wait_every": a.wait_every, "wait": a.wait, "queue": a.queue, "launched": launched,
            "launch_us": round(launch_ns / max(launched, 1) / 1e3, 2), "marks": marks}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["calibrate", "service", "trainer"])
    p.add_argument("--word", default="/dev/shm/orion-gate-probe")
    p.add_argument("--gate", default="none", choices=["none", "gpu", "cpu", "blocked"])
    p.add_argument("--wait", default="and", choices=sorted(WAITS))
    p.add_argument("--queue", type=int, default=192)
    p.add_argument("--kernels", type=int, default=10)
    p.add_argument("--kernel-us", type=float, default=100)
    p.add_argument("--rate", type=float, default=500)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--wait-every", type=int, default=1)
    p.add_argument("--stop", default="/tmp/orion-gate-probe.stop")
    p.add_argument("--waits", type=int, default=8192,
                   help="blocked, --behind sleep-waits: how many kernels, each behind a wait")
    p.add_argument("--sync", action="store_true",
                   help="blocked: wait for the stream in the driver (cuCtxSynchronize) meanwhile")
    p.add_argument("--poll-us", type=float,
                   help="blocked: a thread queries the event after the queued work every U us")
    p.add_argument("--cold", action="store_true",
                   help="blocked: --behind's work first run behind the wait (a first step)")
    p.add_argument("--blocking-event", action="store_true",
                   help="service: wait for each request on a blocking-sync event")
    p.add_argument("--graph", action="store_true", help="service: each request one CUDA graph")
    p.add_argument("--behind", default="sleep",
                   help="blocked: what waits behind the wait (sleep, linear-bias, sdpa, or a "
                        "torch_models.py trainer)")
    p.add_argument("--cycles-per-us", type=float, default=1800)
    a = p.parse_args()
    roles = {"service": service, "trainer": trainer}
    out = calibrate() if a.role == "calibrate" else roles[a.role](a)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
