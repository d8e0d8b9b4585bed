"""The models of the priority benchmark, one process per role (random weights built from configs;
nothing is downloaded). Used by the experiments of bench/orion_bench.py.

  serve MODEL [--graph] --rate R --requests N
      Poisson arrivals at R requests/s, latency measured from the scheduled arrival. Prints
      "serving" when the first arrival is scheduled, then
      "result requests=.. p50_ms=.. p99_ms=.. p999_ms=.. mean_ms=.. svc_p50_ms=.. svc_p99_ms=..
      svc_max_ms=.. busy=.. cpu_ms=.." (on SIGTERM, over the requests served so far), where svc
      is the service time (from the moment the request
      is taken up to its completion, queueing excluded), busy the fraction of the run spent
      serving and cpu_ms the CPU time of all the process's threads per request (with --wait poll
      that includes the spinning between arrivals). --rate 0 runs a closed loop instead (1 s of warm-up, then --seconds, default 3):
      "serving", then "result capacity_rps=.. latency_ms=.. svc_p50_ms=.. svc_p99_ms=..
      cpu_ms=.." (latency_ms: the mean; cpu_ms: CPU time of all the process's threads per
      request).
      MODEL: resnet50 (batch 4, 224x224), bert (BERT-base, batch 1, sequence 128), bert8
      (BERT-base fp16, batch 8, sequence 128), gpt2-decode (GPT-2-sized fp16 decoder, 8 tokens
      one by one after a 32-token prompt).
      --request-log F writes one JSON line per request to F (queue, launch, sync, the serving
      thread's CPU time and involuntary context switches: bench/orion_bench.py slow-requests reads them).
  train MODEL
      Training steps until killed. Prints "ready" after warm-up, then "step T" after each step
      (T = time.monotonic() when the step's GPU work finished), and on SIGTERM or after
      --steps steps (0: no limit) "result steps=.. cpu_ms=.." (CPU time per step).
      MODEL: resnet50 (batch 64), bert (BERT-base, batch 32, sequence 128),
             gpt2-large (36 layers, width 1280, batch 2, sequence 1024: long GEMM kernels),
             gptlm (12 layers, width 1024, batch 8, sequence 512, bf16 autocast, AdamW),
             gptlm-pad (the same with its vocabulary padded to 50304),
             llm (4 layers of d 4096, 4 x 4096 tokens, bf16, SDPA, AdamW: GEMMs and attention
             kernels of milliseconds),
             mm-short (no model: bf16 matmuls of about 30 us back to back; the GPU always busy
             with kernels too short to wait behind),
             mm-long (no model: bf16 matmuls of 8192 x 8192, over a millisecond each, back to
             back: long GEMMs and nothing else).

  serve MODEL --driven / train MODEL --driven
      Blocks of work on command, for an A/B of two processes served in turn
      (bench/orion_bench.py cpu-tax --interleave). After warm-up prints "ready", then reads stdin:
      "closed N" (serve: N requests back to back), "poisson N RATE SEED" (serve: N Poisson
      arrivals at RATE from now, latency from the scheduled arrival) or "steps N" (train);
      answers each with "block lat_ms=A,B,.. cpu_ms=C main_cpu_ms=.. orion_cpu_ms=..
      other_cpu_ms=.. main_wait_ms=.." (every request's or step's latency, the CPU time of all
      the process's threads per request or step over the block, and that split by thread as
      the closed loop's result splits it), requests adding "launch_ms=.. sync_ms=.." (the
      mean time of the forward pass's launches on the CPU, and of the wait for the GPU after
      them).
      "switch W" (under the interposer, with ORION_BENCH_SWITCH set) writes W (a 32-bit word)
      to the switch's word: the blocks after it are interposed as usual (0), pass the
      interposer by (1), hold no timed launch (2), time none (3), record no launch (4), leave
      the ring's next entry unprefetched (5), cut each launch's path short after the
      registration (6) or before the clock (7), read no clock (8) or publish nothing to the
      high-priority gate entry (9) (contract::BenchSwitch); answered "switched W".
      "quit" or end of input stops it.

  --nvtx       each request (serve) or step (train) is an NVTX range, "request" or "step".
  --profile N  (with --profile-out F): N requests/steps (after warm-up, or once the file
               --profile-when names exists; a service runs them back to back, or at their
               Poisson arrivals with --profile-at-arrivals) run under
               torch.profiler (one ProfilerStep per request/step, NVTX range inside it); F gets
               a JSON summary: each one's push/pop (time.time_ns), the profiler's step times and
               its GPU window (first kernel start to last kernel end, in the profiler's clock,
               with the offset to ours), the sum of its kernel durations, and this client's
               orion_client_gpu_busy_seconds_total before and after the window, scraped from
               --metrics URL (the series with priority="--priority-label").
"""
import argparse
import bisect
import contextlib
import gc
import json
import os
import random
import re
import resource
import signal
import statistics
import struct
import sys
import time
import urllib.request

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch


def build_serve(name):
    if name == "resnet50":
        import torchvision
        model = torchvision.models.resnet50().cuda().eval()
        x = torch.randn(4, 3, 224, 224, device="cuda")
        return lambda: model(x)
    if name == "bert":
        from transformers import BertConfig, BertModel
        model = BertModel(BertConfig()).cuda().eval()
        ids = torch.randint(0, 30522, (1, 128), device="cuda")
        mask = torch.ones_like(ids)
        return lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state
    if name == "bert8":
        # A BERT-base-sized encoder at batch 8 x 128 tokens in fp16: about 0.6 ms a request as
        # a CUDA graph on an H100, a short-request transformer service.
        from transformers import BertConfig, BertModel
        model = BertModel(BertConfig()).cuda().half().eval()
        ids = torch.randint(0, 30522, (8, 128), device="cuda")
        mask = torch.ones_like(ids)
        return lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state
    if name == "gpt2-decode":
        # A GPT-2-sized decoder (12 layers, d 768, fp16) generating 8 tokens one by one after a
        # 32-token prompt, with its KV cache: many small kernels launched from the CPU, eager
        # (about 60 ms a request on two cores of an H100 host).
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config()).cuda().half().eval()
        prompt = torch.randint(0, 50257, (1, 32), device="cuda")

        def generate():
            out = model(input_ids=prompt, use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(7):
                out = model(input_ids=token, past_key_values=past, use_cache=True)
                past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            return token
        return generate
    raise SystemExit(f"unknown serve model {name}")


def tiny_llm(layers, width, heads, vocab):
    """A decoder-only transformer built from torch primitives (no weights downloaded)."""

    class TinyLlm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = heads
            self.embed = torch.nn.Embedding(vocab, width)
            self.blocks = torch.nn.ModuleList(
                torch.nn.ModuleDict(dict(
                    norm1=torch.nn.LayerNorm(width), qkv=torch.nn.Linear(width, 3 * width),
                    proj=torch.nn.Linear(width, width), norm2=torch.nn.LayerNorm(width),
                    up=torch.nn.Linear(width, 4 * width), down=torch.nn.Linear(4 * width, width)))
                for _ in range(layers))
            self.norm = torch.nn.LayerNorm(width)
            self.head = torch.nn.Linear(width, vocab, bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            b, t, d = x.shape
            for blk in self.blocks:
                q, k, v = blk["qkv"](blk["norm1"](x)).view(b, t, 3, self.heads, d // self.heads) \
                    .permute(2, 0, 3, 1, 4)
                a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + blk["proj"](a.transpose(1, 2).reshape(b, t, d))
                x = x + blk["down"](torch.nn.functional.gelu(blk["up"](blk["norm2"](x))))
            return self.head(self.norm(x))

    return TinyLlm()


def build_train(name):
    optimizer = torch.optim.SGD  # AdamW for the language model
    if name == "resnet50":
        import torchvision
        model = torchvision.models.resnet50().cuda().train()
        x = torch.randn(64, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (64,), device="cuda")
        loss = lambda: torch.nn.functional.cross_entropy(model(x), y)
    elif name == "bert":
        from transformers import BertConfig, BertForSequenceClassification
        model = BertForSequenceClassification(BertConfig()).cuda().train()
        ids = torch.randint(0, 30522, (32, 128), device="cuda")
        y = torch.randint(0, 2, (32,), device="cuda")
        loss = lambda: model(input_ids=ids, labels=y).loss
    elif name == "gpt2-large":
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config(n_layer=36, n_embd=1280, n_head=20)).cuda().train()
        ids = torch.randint(0, 50257, (2, 1024), device="cuda")
        loss = lambda: model(input_ids=ids, labels=ids).loss
    elif name in ("gptlm", "gptlm-pad"):
        # A GPT-style language model (12 layers, d 1024) at 8 x 512 tokens, bf16 autocast, AdamW.
        # GPT-2's vocabulary (50257) is odd: cuBLAS runs the head's three GEMMs as align1
        # kernels of 2.9 to 4.4 ms on an H100. gptlm-pad pads it to 50304, a multiple of 64.
        from transformers import GPT2Config, GPT2LMHeadModel
        vocab = 50304 if name == "gptlm-pad" else 50257
        model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=1024, n_head=16, n_positions=512,
                                           vocab_size=vocab)).cuda().train()
        ids = torch.randint(0, 50257, (8, 512), device="cuda")

        def loss():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(input_ids=ids, labels=ids).loss
        optimizer = torch.optim.AdamW
    elif name == "llm":
        # An LLM-sized step: 4 pre-norm layers of d 4096 (32 heads, MLP 4x), 4 x 4096 tokens,
        # bf16 weights, scaled_dot_product_attention (causal), AdamW. Its GEMMs and attention
        # kernels run for milliseconds each, as in LLM training at realistic sizes.
        model = tiny_llm(layers=4, width=4096, heads=32, vocab=32000).cuda().bfloat16().train()
        ids = torch.randint(0, 32000, (4, 4096), device="cuda")
        loss = lambda: torch.nn.functional.cross_entropy(
            model(ids[:, :-1]).flatten(0, 1).float(), ids[:, 1:].flatten())
        optimizer = torch.optim.AdamW
    elif name in ("mm-short", "mm-long"):
        # No model: bf16 matmuls queued back to back, nothing else. mm-short: 400 of 2048 x 2048
        # a step (about 30 us each on an H200): the GPU is always busy with kernels too short to
        # wait behind, so what a request pays beside it is the switch from this context.
        # mm-long: 40 of 8192 x 8192 (over a millisecond each, so cut into pieces): long GEMMs
        # alone, with none of llm's attention, optimizer or memory traffic beside them.
        size, count = (2048, 400) if name == "mm-short" else (8192, 40)
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(a)

        def step():
            for _ in range(count):
                torch.mm(a, b, out=out)
        return step
    else:
        raise SystemExit(f"unknown train model {name}")
    opt = optimizer(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
    return step


def nvtx_range(args, name):
    """An NVTX range around a request or step with --nvtx, else nothing."""
    if not args.nvtx:
        return contextlib.nullcontext()
    return torch.cuda.nvtx.range(name)


def busy_seconds(args):
    """This client's busy seconds in orion-server's /metrics (summed over its series)."""
    if not args.metrics:
        return None
    text = urllib.request.urlopen(args.metrics, timeout=5).read().decode()
    total, found = 0.0, False
    for line in text.splitlines():
        m = re.match(r'orion_client_gpu_busy_seconds_total\{([^}]*)\} (\S+)$', line)
        if m and f'priority="{args.priority_label}"' in m.group(1):
            total += float(m.group(2))
            found = True
    return total if found else None


def thread_schedstat():
    """{tid: (comm, ns on the CPU, ns runnable but waiting)} of this process's threads
    (/proc/self/task/*/schedstat)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            comm = open(f"/proc/self/task/{tid}/comm").read().strip()
            run, wait = open(f"/proc/self/task/{tid}/schedstat").read().split()[:2]
            out[int(tid)] = (comm, int(run), int(wait))
        except (OSError, ValueError):
            continue  # the thread ended in between
    return out


def schedstat_split(before, after, requests):
    """main_cpu_ms, orion_cpu_ms, other_cpu_ms, main_wait_ms per request between two
    thread_schedstat() readings (a thread born in between counts from 0)."""
    main, orion, other, wait = 0, 0, 0, 0
    for tid, (comm, run, waited) in after.items():
        _, run0, waited0 = before.get(tid, (comm, 0, 0))
        if tid == os.getpid():
            main, wait = run - run0, waited - waited0
        elif comm.startswith("orion"):
            orion += run - run0
        else:
            other += run - run0
    per = 1e6 * requests
    return (f"main_cpu_ms={main / per:.4f} orion_cpu_ms={orion / per:.4f} "
            f"other_cpu_ms={other / per:.4f} main_wait_ms={wait / per:.4f}")


class ProfiledWindow:
    """--profile N: N iterations under torch.profiler (see the module's help)."""

    def __init__(self, args):
        self.args, self.marks, self.prof = args, [], None

    def __enter__(self):
        torch.cuda.synchronize()
        time.sleep(0.2)  # the server has drained what ran before
        self.busy0 = busy_seconds(self.args)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        # One cycle of exactly the window (each prof.step() marks an iteration ProfilerStep#k);
        # the trace is written when the cycle ends, at the window's last step.
        self.trace_path = self.args.profile_out + ".trace.json"
        self.prof = torch.profiler.profile(
            activities=acts,
            schedule=torch.profiler.schedule(wait=0, warmup=0, active=self.args.profile, repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(self.trace_path))
        self.prof.__enter__()
        return self

    def iteration(self, run_one):
        """run_one() inside an NVTX range (the caller's), timed on the CPU; then prof.step()."""
        push, push_mono = time.time_ns(), time.monotonic_ns()
        run_one()
        self.marks.append((push, time.time_ns(), push_mono))
        self.prof.step()

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.prof.__exit__(None, None, None)
        time.sleep(0.3)  # sampled launches' times and the last ranges reach the server
        busy1 = busy_seconds(self.args)
        path = self.trace_path
        events = json.load(open(path))["traceEvents"]
        os.remove(path)
        # ProfilerStep#k on the CPU; its GPU window: first kernel start to last kernel end of
        # the kernels that ran inside it (each request/step waits for its work before the next).
        steps = sorted({e["name"]: e for e in events if e.get("ph") == "X" and
                        e.get("cat") == "user_annotation" and
                        str(e.get("name", "")).startswith("ProfilerStep#")}.values(),
                       key=lambda e: e["ts"])
        kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"),
                         key=lambda e: e["ts"])
        starts = [k["ts"] for k in kernels]
        out = []
        for (push, pop, _), st in zip(self.marks, steps):
            ks = kernels[bisect.bisect_left(starts, st["ts"]):
                         bisect.bisect_right(starts, st["ts"] + st["dur"])]
            out.append({"push_ns": push, "pop_ns": pop, "torch_ts_us": st["ts"],
                        "torch_dur_us": st["dur"],
                        "torch_gpu_start_us": ks[0]["ts"] if ks else None,
                        "torch_gpu_end_us": max(k["ts"] + k["dur"] for k in ks) if ks else None})
        offset = statistics.median(o["push_ns"] / 1e3 - o["torch_ts_us"] for o in out)
        # Every kernel and launch call of the window, for bench/orion_bench.py timing-log --profile
        # (the interposer's timing samples against the profiler's kernels, on CLOCK_MONOTONIC).
        with open(self.args.profile_out + ".kernels.json", "w") as f:
            json.dump({
                "mono_offset_us": statistics.median(
                    m[2] / 1e3 - st["ts"] for m, st in zip(self.marks, steps)),
                "kernels": [[k["ts"], k["dur"], *k["args"].get("grid", [0, 0, 0]),
                             *k["args"].get("block", [0, 0, 0]), k["args"].get("correlation"),
                             k.get("name", "")]
                            for k in kernels],
                "launches": [[e["ts"], e["dur"], e["args"].get("correlation")] for e in events
                             if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                             and "Launch" in str(e.get("name", ""))],
            }, f)
        with open(self.args.profile_out, "w") as f:
            json.dump({"steps": out, "torch_clock_offset_us": offset,
                       "torch_kernel_sum_us": sum(k["dur"] for k in kernels),
                       "torch_kernels": len(kernels), "busy_before_s": self.busy0,
                       "busy_after_s": busy1, "priority": self.args.priority_label}, f)
        print(f"profiled {len(out)} into {self.args.profile_out}", flush=True)


def maybe_profile(args, run_one, wait=False):
    """Runs the --profile window once: at once when `wait` (no --profile-when), else at the
    first call after the --profile-when file exists. True if it ran now."""
    if not args.profile or args.profiled or (not wait and (
            args.profile_when is None or not os.path.exists(args.profile_when))):
        return False
    args.profiled = True
    with ProfiledWindow(args) as window:
        for _ in range(args.profile):
            window.iteration(run_one)
    return True


class RequestLog:
    """--request-log: one JSON line per served request, so that a slow request can be taken
    apart: queue_ms (scheduled arrival to start), launch_ms (the forward pass on the CPU: an
    eager model's launches), sync_ms (then until the GPU finished), thread_cpu_ms (the serving
    thread's own CPU time over launch and sync: the rest of that wall time it was off the CPU,
    preempted or asleep in the driver), nivcsw (the serving thread's involuntary context
    switches over the request: another thread took its core) and process_cpu_ms (every thread of
    the process, the interposer's and the driver's included). Written at the end (no file I/O
    between requests)."""

    def __init__(self, args, stream):
        self.args, self.path, self.stream, self.rows = args, args.request_log, stream, []
        self.t0 = time.perf_counter()

    def request(self, run, arrival, began):
        u0 = resource.getrusage(resource.RUSAGE_THREAD)
        c0, p0 = time.thread_time(), time.process_time()
        with nvtx_range(self.args, "request"):
            run()
            launched = time.perf_counter()
            self.stream.synchronize()
        done = time.perf_counter()
        c1, p1 = time.thread_time(), time.process_time()
        u1 = resource.getrusage(resource.RUSAGE_THREAD)
        ms = lambda s: round(s * 1e3, 4)
        self.rows.append({"t_ms": ms(arrival - self.t0), "queue_ms": ms(began - arrival),
                          "launch_ms": ms(launched - began), "sync_ms": ms(done - launched),
                          "thread_cpu_ms": ms(c1 - c0), "nivcsw": u1.ru_nivcsw - u0.ru_nivcsw,
                          "process_cpu_ms": ms(p1 - p0)})

    def close(self):
        with open(self.path, "w") as f:
            for row in self.rows:
                f.write(json.dumps(row) + "\n")


def no_collector_pauses():
    """Collects once, then keeps the garbage collector from pausing the measurement."""
    gc.collect()
    gc.freeze()
    gc.disable()


def quantile_ms(sorted_seconds, p):
    """The p-quantile of sorted durations in seconds, in milliseconds."""
    n = len(sorted_seconds)
    return sorted_seconds[min(n - 1, int(p * n))] * 1e3


def serve(args):
    stream = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(stream):
        forward = build_serve(args.model)
        for _ in range(20):
            forward()
        torch.cuda.synchronize()
        run = forward
        if args.graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                forward()
            run = g.replay
        for _ in range(10):
            run()
        stream.synchronize()
        # --driven: (launch s, sync s) of each request of the block being served
        phases = [] if args.driven else None

        def one_request():
            with nvtx_range(args, "request"):
                began = time.perf_counter()
                run()
                launched = time.perf_counter()
                stream.synchronize()
                if phases is not None:
                    phases.append((launched - began, time.perf_counter() - launched))
        maybe_profile(args, one_request, wait=args.profile_when is None)
        if args.driven:
            return driven(serve_block(one_request), phases)
        if args.rate <= 0:
            # Closed loop: one second to bring the clocks up, then at least --seconds and 200
            # requests
            # (200 requests alone, a fraction of a second, gave capacities 40% apart).
            def closed_loop(seconds, at_least):
                times, t0, cpu0 = [], time.perf_counter(), time.process_time()
                while len(times) < at_least or time.perf_counter() - t0 < seconds:
                    began = time.perf_counter()
                    one_request()
                    times.append(time.perf_counter() - began)
                return times, time.perf_counter() - t0, time.process_time() - cpu0
            closed_loop(1.0, 10)
            print("serving", flush=True)
            threads0 = thread_schedstat()
            times, took, cpu = closed_loop(args.seconds, 200)
            threads1 = thread_schedstat()
            n, per = len(times), took / len(times)
            times.sort()
            q = quantile_ms
            # cpu_ms: CPU time of the whole process (all its threads) per request; then the same
            # split by thread from the kernel's schedstat: the serving thread, the interposer's
            # threads (named orion-*), the rest, and the time the serving thread was runnable
            # but waited for the core.
            split = schedstat_split(threads0, threads1, n)
            print(f"result capacity_rps={1.0 / per:.1f} latency_ms={per * 1e3:.3f} "
                  f"svc_p50_ms={q(times, 0.5):.3f} svc_p99_ms={q(times, 0.99):.3f} "
                  f"cpu_ms={cpu / n * 1e3:.3f} {split}", flush=True)
            return
        rng = random.Random(args.seed)
        lat, svc = [], []
        log = RequestLog(args, stream) if args.request_log else None
        # A serving loop that polls for work: the CPU stays awake between requests (sleeping
        # lets it clock down and makes the latency of a CPU-bound eager model noisy), and no
        # garbage collection pauses in the middle of the measurement.
        no_collector_pauses()
        arrival = time.perf_counter() + 0.05
        cpu0 = time.process_time()
        print("serving", flush=True)
        # SIGTERM ends the run early; the result covers the requests served so far.
        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
        window, window_left = None, 0
        for _ in range(args.requests):
            if stopping and lat:
                break
            if args.profile_at_arrivals:
                if (window is None and not args.profiled and args.profile_when is not None
                        and os.path.exists(args.profile_when)):
                    args.profiled, window_left = True, args.profile
                    window = ProfiledWindow(args).__enter__()
                    arrival = time.perf_counter()  # its set-up paused arrivals: they go on now
            elif maybe_profile(args, one_request):
                arrival = time.perf_counter()  # the window ran back to back: arrivals go on now
            arrival += rng.expovariate(args.rate)
            began = time.perf_counter()
            if args.wait == "sleep" and began < arrival:
                time.sleep(arrival - began)
            while began < arrival:
                began = time.perf_counter()
            if window is not None:
                window.iteration(one_request)
                window_left -= 1
                if window_left == 0:
                    window.__exit__(None, None, None)
                    window = None
                    arrival = time.perf_counter()
            elif log:
                log.request(run, arrival, began)
            else:
                one_request()
            done = time.perf_counter()
            lat.append(done - arrival)
            svc.append(done - began)
        cpu_ms = (time.process_time() - cpu0) / len(lat) * 1e3
        if log:
            log.close()
    lat.sort()
    svc_sorted = sorted(svc)
    q = quantile_ms
    print(f"result requests={len(lat)} rate={args.rate} graph={int(args.graph)} "
          f"p50_ms={q(lat, 0.5):.3f} p99_ms={q(lat, 0.99):.3f} p999_ms={q(lat, 0.999):.3f} "
          f"mean_ms={sum(lat) / len(lat) * 1e3:.3f} svc_p50_ms={q(svc_sorted, 0.5):.3f} "
          f"svc_p99_ms={q(svc_sorted, 0.99):.3f} svc_max_ms={svc_sorted[-1] * 1e3:.3f} "
          f"busy={sum(svc) * args.rate / len(svc):.3f} cpu_ms={cpu_ms:.3f}",
          flush=True)


def back_to_back(run_one, n):
    """Runs run_one n times in a row: each one's duration (s)."""
    out = []
    for _ in range(n):
        began = time.perf_counter()
        run_one()
        out.append(time.perf_counter() - began)
    return out


def serve_block(one_request):
    """The serve side of --driven: a command's words to the latencies of its requests."""
    def block(words):
        if words[0] == "closed" and len(words) == 2:
            return back_to_back(one_request, int(words[1]))
        if words[0] == "poisson" and len(words) == 4:
            n, rate, rng = int(words[1]), float(words[2]), random.Random(int(words[3]))
            out, arrival = [], time.perf_counter()
            for _ in range(n):
                arrival += rng.expovariate(rate)
                while time.perf_counter() < arrival:
                    pass  # polls, as the Poisson serving loop does
                one_request()
                out.append(time.perf_counter() - arrival)
            return out
        return None
    return block


def driven(block, phases=None):
    """--driven: blocks of work on stdin's commands, one answer line each (see the module's
    help). The collector is off: a pause inside one arm's block is not the interposer's.
    `phases` (serve) collects each request's (launch, sync) seconds over a block."""
    no_collector_pauses()
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        # Any 32-bit word: the interposer takes one it does not know as 0.
        if words[0] == "switch" and len(words) == 2 and words[1].isascii() \
                and words[1].isdigit() \
                and int(words[1]) < 2 ** 32:
            # ORION_BENCH_SWITCH's word: what this process's next CUDA calls do
            path = os.environ.get("ORION_BENCH_SWITCH")
            if not path:
                print("error: switch needs ORION_BENCH_SWITCH", flush=True)
                continue
            with open(path, "r+b") as f:
                f.write(struct.pack("I", int(words[1])))
            print(f"switched {words[1]}", flush=True)
            continue
        if phases is not None:
            phases.clear()
        threads0 = thread_schedstat()
        cpu0 = time.process_time()
        try:
            lat = block(words)
        except ValueError:
            lat = None
        if not lat:
            print(f"error: cannot run {line.strip()!r}", flush=True)
            continue
        cpu_ms = (time.process_time() - cpu0) / len(lat) * 1e3
        # Where the block's time went: by thread (schedstat), and for requests the forward
        # pass's launches on the CPU against the wait for the GPU after them.
        split = schedstat_split(threads0, thread_schedstat(), len(lat))
        if phases:
            split += (f" launch_ms={sum(p[0] for p in phases) / len(phases) * 1e3:.4f}"
                      f" sync_ms={sum(p[1] for p in phases) / len(phases) * 1e3:.4f}")
        print("block lat_ms=" + ",".join(f"{x * 1e3:.4f}" for x in lat) +
              f" cpu_ms={cpu_ms:.4f} {split}", flush=True)


def train(args):
    step = build_train(args.model)
    for _ in range(3):
        step()
    torch.cuda.synchronize()

    def one_step():
        with nvtx_range(args, "step"):
            step()
            torch.cuda.synchronize()
    maybe_profile(args, one_step, wait=args.profile_when is None)
    if args.driven:
        return driven(lambda words: back_to_back(one_step, int(words[1]))
                      if words[0] == "steps" and len(words) == 2 else None)
    print("ready", flush=True)
    steps, cpu0 = 0, time.process_time()
    while args.steps == 0 or steps < args.steps:
        maybe_profile(args, one_step)
        one_step()
        steps += 1
        print(f"step {time.monotonic():.6f}", flush=True)
    print(f"result steps={steps} cpu_ms={(time.process_time() - cpu0) / steps * 1e3:.3f}",
          flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["serve", "train"])
    p.add_argument("model")
    p.add_argument("--rate", type=float, default=0)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--graph", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3.0,
                   help="--rate 0: how long the closed loop is measured (after 1 s of warm-up)")
    p.add_argument("--steps", type=int, default=0, help="train: stop after this many steps")
    p.add_argument("--wait", choices=["poll", "sleep"], default="poll",
                   help="how the serving loop waits for the next arrival")
    p.add_argument("--nvtx", action="store_true", help="NVTX range per request/step")
    p.add_argument("--driven", action="store_true",
                   help="blocks of requests or steps on stdin's commands (see above)")
    p.add_argument("--profile", type=int, default=0,
                   help="requests/steps under torch.profiler after warm-up (with --profile-out)")
    p.add_argument("--profile-out")
    p.add_argument("--profile-at-arrivals", action="store_true",
                   help="serve (Poisson): the --profile window's requests keep their Poisson "
                        "arrivals instead of running back to back")
    p.add_argument("--profile-when", help="run the --profile window once this file exists "
                   "(default: right after warm-up)")
    p.add_argument("--request-log", help="serve (Poisson): write one JSON line per request "
                   "to this file (queue, launch, sync, CPU time, context switches)")
    p.add_argument("--metrics", help="orion-server's /metrics URL (busy seconds of the window)")
    p.add_argument("--priority-label", default="high",
                   help="the priority label of this client's series in /metrics")
    args = p.parse_args()
    args.profiled = False
    if args.profile and not args.profile_out:
        p.error("--profile needs --profile-out")
    try:
        serve(args) if args.role == "serve" else train(args)
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)


if __name__ == "__main__":
    main()
