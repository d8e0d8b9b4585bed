"""Launch-path overhead: time per tiny-kernel launch from PyTorch (an in-place add on a 1-element
tensor, 200k launches), to compare without and with the interposer. Last line: result us_per_launch=..
"""
import time

import torch

x = torch.zeros(1, device="cuda")
for _ in range(10000):
    x.add_(1)
torch.cuda.synchronize()
best = 1e9
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(40000):
        x.add_(1)
    torch.cuda.synchronize()
    best = min(best, (time.perf_counter() - t0) / 40000)
print(f"result us_per_launch={best * 1e6:.3f}", flush=True)
