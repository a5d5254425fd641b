"""The GELU block of CudaBench.PointwiseRun (tests/gpu/test_cuda_bench.cpp) with PyTorch: bias add, GELU written out
as pointwise ops, row scale, on bf16 [8192, 4096]; eager (one kernel per op) and torch.compile (Inductor fuses them),
median of CUDA-event timings, with the GB/s of reading x and writing the output once.

usage: python3 bench/peers/gpu_pointwise.py [--no-compile]
"""
import sys

import torch

from cuda_timing import median_ms


def gelu_block(x, bias, scale):
    h = x + bias
    inner = h + torch.pow(h, 3.0) * 0.044715
    return h * 0.5 * (torch.tanh(inner * 0.7978845608) + 1) * scale


def main():
    torch.manual_seed(0)
    rows, width = 8192, 4096
    x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(width, device="cuda", dtype=torch.bfloat16)
    scale = torch.randn(rows, 1, device="cuda", dtype=torch.bfloat16)
    moved = 2 * 2 * rows * width
    print(f"gpu_pointwise on {torch.cuda.get_device_name()} torch {torch.__version__}")
    with torch.inference_mode():
        eager = median_ms(gelu_block, x, bias, scale, iters=100, warmup=10)
        print(f"PEER gelu block bf16 [{rows}, {width}] torch eager: {eager:.4f} ms, {moved / eager / 1e6:.0f} GB/s")
        if "--no-compile" in sys.argv:
            return
        compiled = torch.compile(gelu_block)
        fused = median_ms(compiled, x, bias, scale, iters=100, warmup=10)
        print(f"PEER gelu block bf16 [{rows}, {width}] torch.compile: {fused:.4f} ms, {moved / fused / 1e6:.0f} GB/s")


if __name__ == "__main__":
    main()
