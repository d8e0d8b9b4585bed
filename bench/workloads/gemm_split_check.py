"""What splitting a GEMM into pieces (interpose/gemm_split.h) does to its results, under the
interposer with ORION_GEMM_SPLIT_NS set (pieces forced whatever shares the GPU).

  gemm_split_check.py exact
      One JSON line per case: a GEMM as PyTorch calls cuBLAS for it (mm, bmm, a Linear with a
      bias, addmm with GELU; fp32, tf32, bf16, fp16; every transpose), run 6 times with the same
      inputs. A shape's first three calls go whole (the interposer learns its duration from
      them), the later ones in pieces where the bound asks: "kernels" counts the GEMM kernels of the first
      and the last call (torch.profiler), "bitwise" the share of output elements equal bit for
      bit, "max_rel" the largest difference over the output's largest magnitude.
  gemm_split_check.py loss STEPS
      The gptlm trainer (bench/workloads/torch_models.py) from seed 0 for STEPS steps: one JSON
      line with the loss of each step.
"""
import json
import sys

import torch


def gemm_kernels(fn):
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    gemm = [n for n in names if any(w in n.lower() for w in ("gemm", "nvjet", "sm90", "sm80",
                                                             "cutlass", "xmma"))]
    return out, len(gemm)


def cases():
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, dtype):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    for dtype, name in ((torch.float32, "fp32"), (torch.float32, "tf32"), (torch.bfloat16, "bf16"),
                        (torch.float16, "fp16")):
        for ta in (False, True):
            for tb in (False, True):
                m, k, n = 4096, 2048, 3000 + 8 * (2 * ta + tb)  # distinct shapes: own samples
                a = rand(k, m, dtype=dtype).t() if ta else rand(m, k, dtype=dtype)
                b = rand(n, k, dtype=dtype).t() if tb else rand(k, n, dtype=dtype)
                yield f"mm {name} {'T' if ta else 'N'}{'T' if tb else 'N'}", name, \
                    lambda a=a, b=b: a @ b
        x = rand(16, 1024, 768, dtype=dtype)
        y = rand(16, 768, 1000, dtype=dtype)
        yield f"bmm {name}", name, lambda x=x, y=y: torch.bmm(x, y)
        w = rand(5000, 2048, dtype=dtype)
        bias = rand(5000, dtype=dtype)
        inp = rand(4096, 2048, dtype=dtype)
        yield f"linear+bias {name}", name, \
            lambda inp=inp, w=w, bias=bias: torch.nn.functional.linear(inp, w, bias)
        yield f"addmm+gelu {name}", name, \
            lambda inp=inp, w=w, bias=bias: torch._addmm_activation(bias, inp, w.t(),
                                                                    use_gelu=True)
    # GPT-2's vocabulary: the align1 head GEMMs of the gptlm trainer, bf16.
    h = rand(4096, 1024, dtype=torch.bfloat16)
    head = rand(50257, 1024, dtype=torch.bfloat16)
    yield "lm-head vocab 50257 bf16", "bf16", lambda: h @ head.t()
    dy = rand(4096, 50257, dtype=torch.bfloat16)
    yield "lm-head dW vocab 50257 bf16", "bf16", lambda: dy.t() @ h
    yield "lm-head dX vocab 50257 bf16", "bf16", lambda: dy @ head


def exact():
    for case, dtype_name, fn in cases():
        torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
        first, k_first = gemm_kernels(fn)
        for _ in range(4):
            fn()
            torch.cuda.synchronize()
        last, k_last = gemm_kernels(fn)
        a, b = first.float(), last.float()
        scale = a.abs().max().item() or 1.0
        row = {"case": case, "dtype": dtype_name, "shape": list(first.shape),
               "kernels": [k_first, k_last],
               "bitwise": (first.view(-1) == last.view(-1)).float().mean().item()
               if first.dtype == last.dtype else 0.0,
               "max_rel": (a - b).abs().max().item() / scale}
        print(json.dumps(row), flush=True)


def loss(steps):
    torch.manual_seed(0)
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=1024, n_head=16, n_positions=512,
                                       vocab_size=50257)).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 50257, (8, 512), device="cuda", generator=g)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids).loss
        out.backward()
        opt.step()
        losses.append(round(out.item(), 6))
    print(json.dumps({"losses": losses}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["exact"]:
        exact()
    elif sys.argv[1:2] == ["loss"] and len(sys.argv) == 3:
        loss(int(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
