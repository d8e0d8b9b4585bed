"""PyTorch under a memory limit (orion-run --memory-limit): allocates 256 MiB tensors until the
first out-of-memory error, then checks that the process still works (a matmul, a fresh
allocation after freeing). With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True the caching
allocator maps VMM handles and releases them at once: the quota must count them until unmapped.

  orion-run --memory-limit 1Gi --priority best-effort -- python3 quota_probe.py

Prints key=value lines: held (tensors allocated), held_mib, oom (1 if the error came as
torch.OutOfMemoryError), driver_free_mib / driver_total_mib (what cuMemGetInfo reports), and
after (1 if the matmul and a new tensor worked after the error).
"""
import os

import torch

CHUNK = 256 << 20


def main():
    torch.cuda.init()
    kept, oom = [], 0
    try:
        for _ in range(64):  # 16 GiB at most
            kept.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
            kept[-1].fill_(1)
    except torch.OutOfMemoryError:
        oom = 1
    free, total = torch.cuda.mem_get_info()
    print(f"alloc_conf={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}")
    print(f"held={len(kept)} held_mib={len(kept) * CHUNK >> 20} oom={oom}")
    print(f"driver_free_mib={free >> 20} driver_total_mib={total >> 20}")
    print(f"reserved_mib={torch.cuda.memory_reserved() >> 20}")
    kept.clear()
    torch.cuda.empty_cache()
    a = torch.randn(1024, 1024, device="cuda")
    b = (a @ a).sum().item()
    again = torch.empty(CHUNK, dtype=torch.uint8, device="cuda")
    again.fill_(2)
    torch.cuda.synchronize()
    print(f"after={int(b == b and again[0].item() == 2)}", flush=True)


if __name__ == "__main__":
    main()
