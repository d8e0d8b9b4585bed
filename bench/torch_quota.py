"""Memory quota check with PyTorch: allocates 256 MiB tensors until PyTorch reports out of memory,
then prints how much it got and the error's first line. Run under
`orion-run --memory-limit 2Gi` with PYTORCH_CUDA_ALLOC_CONF unset, `expandable_segments:True`
or `backend:cudaMallocAsync`. Last line: result allocated_mib=.. error=..
"""
import os

import torch

chunks = []
err = "none"
try:
    for _ in range(400):  # at most 100 GiB
        chunks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as e:
    err = str(e).splitlines()[0][:90].replace(" ", "_")
free, total = torch.cuda.mem_get_info()
print(f"result alloc_conf={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', 'default')} "
      f"allocated_mib={len(chunks) * 256} mem_get_info_total_mib={total >> 20} error={err}",
      flush=True)
