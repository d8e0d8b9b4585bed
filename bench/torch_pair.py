"""One side of the priority benchmark with real PyTorch models (random weights, built from
torchvision configs; nothing is downloaded).

  serve: ResNet50 batch-4 inference (eager, or --graph for a CUDA graph replay) with Poisson
         arrivals at --rate requests/s; latency from the scheduled arrival. --rate 0 measures the
         capacity alone (closed loop). Last line: result p50_ms=.. p99_ms=.. p999_ms=.. ...
  train: ResNet50 batch-64 training steps for --seconds. Last line: result steps_per_s=..
"""
import argparse
import random
import time

import torch
import torchvision


def serve(args):
    model = torchvision.models.resnet50().cuda().eval()
    x = torch.randn(4, 3, 224, 224, device="cuda")
    stream = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(20):
            model(x)
        torch.cuda.synchronize()
        run = lambda: model(x)
        if args.graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                out = model(x)
            run = g.replay
        if args.rate <= 0:  # capacity: closed loop
            t0 = time.perf_counter()
            for _ in range(200):
                run()
                stream.synchronize()
            per = (time.perf_counter() - t0) / 200
            print(f"result capacity_rps={1.0 / per:.1f} latency_ms={per * 1e3:.3f}", flush=True)
            return
        rng = random.Random(args.seed)
        lat = []
        start = time.perf_counter() + 0.05
        arrival = start
        for _ in range(args.requests):
            arrival += rng.expovariate(args.rate)
            now = time.perf_counter()
            if arrival > now:
                time.sleep(max(0.0, arrival - now - 0.0002))
                while time.perf_counter() < arrival:
                    pass
            run()
            stream.synchronize()
            lat.append(time.perf_counter() - arrival)
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3
    wall = time.perf_counter() - start
    print(f"result requests={len(lat)} rate={args.rate} graph={int(args.graph)} "
          f"p50_ms={q(0.5):.3f} p99_ms={q(0.99):.3f} p999_ms={q(0.999):.3f} "
          f"mean_ms={sum(lat) / len(lat) * 1e3:.3f} wall_s={wall:.2f}", flush=True)


def train(args):
    model = torchvision.models.resnet50().cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    steps = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        step()
        torch.cuda.synchronize()
        steps += 1
    dt = time.perf_counter() - t0
    print(f"result steps={steps} seconds={dt:.2f} steps_per_s={steps / dt:.3f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["serve", "train"])
    p.add_argument("--rate", type=float, default=0)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--graph", action="store_true")
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    serve(args) if args.role == "serve" else train(args)


if __name__ == "__main__":
    main()
