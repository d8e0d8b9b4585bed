"""The models of the priority benchmark, one process per role (random weights built from configs;
nothing is downloaded). Used by bench/priority_bench.py.

  serve MODEL [--graph] --rate R --requests N
      Poisson arrivals at R requests/s, latency measured from the scheduled arrival. Prints
      "serving" when the first arrival is scheduled, then
      "result requests=.. p50_ms=.. p99_ms=.. p999_ms=.. mean_ms=.. svc_p50_ms=.. svc_p99_ms=..
      svc_max_ms=.. busy=.. cpu_ms=..", where svc is the service time (from the moment the request
      is taken up to its completion, queueing excluded), busy the fraction of the run spent
      serving and cpu_ms the CPU time of all the process's threads per request (with --wait poll
      that includes the spinning between arrivals). --rate 0 runs a closed loop instead (1 s of warm-up, then --seconds, default 3):
      "serving", then "result capacity_rps=.. latency_ms=.. svc_p50_ms=.. svc_p99_ms=..
      cpu_ms=.." (latency_ms: the mean; cpu_ms: CPU time of all the process's threads per
      request).
      MODEL: resnet50 (batch 4, 224x224), bert (BERT-base, batch 1, sequence 128).
  train MODEL
      Training steps until killed. Prints "ready" after warm-up, then "step T" after each step
      (T = time.monotonic() when the step's GPU work finished), and on SIGTERM or after
      --steps steps (0: no limit) "result steps=.. cpu_ms=.." (CPU time per step).
      MODEL: resnet50 (batch 64), bert (BERT-base, batch 32, sequence 128),
             gpt2-large (36 layers, width 1280, batch 2, sequence 1024: long GEMM kernels).
"""
import argparse
import gc
import os
import random
import sys
import time

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
    raise SystemExit(f"unknown serve model {name}")


def build_train(name):
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
    else:
        raise SystemExit(f"unknown train model {name}")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
    return step


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
        if args.rate <= 0:
            # Closed loop: one second to bring the clocks up, then at least --seconds and 200
            # requests
            # (200 requests alone, a fraction of a second, gave capacities 40% apart).
            def closed_loop(seconds, at_least):
                times, t0, cpu0 = [], time.perf_counter(), time.process_time()
                while len(times) < at_least or time.perf_counter() - t0 < seconds:
                    began = time.perf_counter()
                    run()
                    stream.synchronize()
                    times.append(time.perf_counter() - began)
                return times, time.perf_counter() - t0, time.process_time() - cpu0
            closed_loop(1.0, 10)
            print("serving", flush=True)
            times, took, cpu = closed_loop(args.seconds, 200)
            n, per = len(times), took / len(times)
            times.sort()
            q = quantile_ms
            # cpu_ms: CPU time of the whole process (all its threads) per request.
            print(f"result capacity_rps={1.0 / per:.1f} latency_ms={per * 1e3:.3f} "
                  f"svc_p50_ms={q(times, 0.5):.3f} svc_p99_ms={q(times, 0.99):.3f} "
                  f"cpu_ms={cpu / n * 1e3:.3f}", flush=True)
            return
        rng = random.Random(args.seed)
        lat, svc = [], []
        # A serving loop that polls for work: the CPU stays awake between requests (sleeping
        # lets it clock down and makes the latency of a CPU-bound eager model noisy), and no
        # garbage collection pauses in the middle of the measurement.
        gc.collect()
        gc.freeze()
        gc.disable()
        arrival = time.perf_counter() + 0.05
        cpu0 = time.process_time()
        print("serving", flush=True)
        for _ in range(args.requests):
            arrival += rng.expovariate(args.rate)
            began = time.perf_counter()
            if args.wait == "sleep" and began < arrival:
                time.sleep(arrival - began)
            while began < arrival:
                began = time.perf_counter()
            run()
            stream.synchronize()
            done = time.perf_counter()
            lat.append(done - arrival)
            svc.append(done - began)
        cpu_ms = (time.process_time() - cpu0) / len(lat) * 1e3
    lat.sort()
    svc_sorted = sorted(svc)
    q = quantile_ms
    print(f"result requests={len(lat)} rate={args.rate} graph={int(args.graph)} "
          f"p50_ms={q(lat, 0.5):.3f} p99_ms={q(lat, 0.99):.3f} p999_ms={q(lat, 0.999):.3f} "
          f"mean_ms={sum(lat) / len(lat) * 1e3:.3f} svc_p50_ms={q(svc_sorted, 0.5):.3f} "
          f"svc_p99_ms={q(svc_sorted, 0.99):.3f} svc_max_ms={svc_sorted[-1] * 1e3:.3f} "
          f"busy={sum(svc) * args.rate / len(svc):.3f} cpu_ms={cpu_ms:.3f}",
          flush=True)


def train(args):
    step = build_train(args.model)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print("ready", flush=True)
    steps, cpu0 = 0, time.process_time()
    while args.steps == 0 or steps < args.steps:
        step()
        torch.cuda.synchronize()
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
    args = p.parse_args()
    try:
        serve(args) if args.role == "serve" else train(args)
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)


if __name__ == "__main__":
    main()
