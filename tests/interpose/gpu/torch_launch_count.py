"""Counts the kernels a PyTorch program launches, as CUPTI (torch.profiler) sees them, so that the
interposer's count (orion_test_registrar's `launches=`) can be compared with it on a real GPU.

Phases: ResNet50 eager inference at batch 4, a ResNet50 training step, and CUDA graph replays of
the inference. Prints `profiler_kernels=N` and per-phase timings (ms per iteration).

Usage: LD_PRELOAD=liborion_interpose.so orion_test_registrar -- python3 torch_launch_count.py
"""
import sys
import time

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile


def timed(fn, iters):
    for _ in range(iters):  # warm-up: allocator, cuDNN/cuBLAS handles, lazy module loading
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000.0 / iters


def main():
    profiled = "--no-profile" not in sys.argv
    torch.backends.cudnn.benchmark = False
    activities = [ProfilerActivity.CUDA]
    ctx = profile(activities=activities) if profiled else None
    if ctx:
        ctx.__enter__()
    model = torchvision.models.resnet50().cuda().eval()
    x = torch.randn(4, 3, 224, 224, device="cuda")
    with torch.no_grad():
        eager_ms = timed(lambda: model(x), 20)
    train_model = torchvision.models.resnet50().cuda().train()
    opt = torch.optim.SGD(train_model.parameters(), lr=0.01)
    xb = torch.randn(16, 3, 224, 224, device="cuda")
    yb = torch.randint(0, 1000, (16,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(train_model(xb), yb).backward()
        opt.step()

    train_ms = timed(step, 5)
    static_x = torch.randn(4, 3, 224, 224, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_y = model(static_x)
    graph_ms = timed(graph.replay, 20)
    torch.cuda.synchronize()
    if ctx:
        ctx.__exit__(None, None, None)
        kernels = 0
        for evt in ctx.events():
            if evt.device_type == torch.autograd.DeviceType.CUDA:
                name = evt.name
                if name.startswith("Memcpy") or name.startswith("Memset"):
                    continue
                kernels += 1
        print(f"profiler_kernels={kernels}")
    print(f"eager_ms={eager_ms:.3f} train_ms={train_ms:.3f} graph_ms={graph_ms:.3f}")
    print(f"checksum={float(static_y.float().sum()):.3f}")


if __name__ == "__main__":
    main()
