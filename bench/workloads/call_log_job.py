"""A small PyTorch training loop for the call-log experiment: 5 warm-up steps, then 50 under
torch.profiler; writes what CUPTI saw on the GPU (kernels, host-to-device and device-to-host
copies) as JSON to argv[1]."""
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

m = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                        torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(64, 1024)


def step():
    y = m(x.cuda())
    y.sum().backward()
    opt.step()
    opt.zero_grad()
    return y.cpu()


for _ in range(5):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(50):
        step()
    torch.cuda.synchronize()
kinds = {"kernel": 0, "h2d": 0, "d2h": 0}
for e in p.events():
    if e.device_type != torch.autograd.DeviceType.CUDA:
        continue
    if "Memcpy HtoD" in e.name:
        kinds["h2d"] += 1
    elif "Memcpy DtoH" in e.name:
        kinds["d2h"] += 1
    elif "Memcpy" not in e.name and "Memset" not in e.name:
        kinds["kernel"] += 1
with open(sys.argv[1], "w") as f:
    json.dump(kinds, f)
