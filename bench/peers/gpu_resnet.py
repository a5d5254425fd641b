"""ResNet-18/50 fp16 on the GPU with PyTorch: eager, and torch.compile(mode="reduce-overhead") (CUDA graphs) when
it compiles within the time limit. Random weights; median of CUDA-event timings; with --batch N also images/s.

usage: python3 bench/peers/gpu_resnet.py [--no-compile] [--batch N]
"""
import sys
import time

import torch
import torchvision

from cuda_timing import median_ms


def main():
    batch = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 1
    torch.manual_seed(0)
    print(f"gpu_resnet on {torch.cuda.get_device_name()} torch {torch.__version__}")
    for name in ("resnet18", "resnet50"):
        model = getattr(torchvision.models, name)().eval().half().cuda()
        x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16)
        with torch.inference_mode():
            eager = median_ms(model, x)
            print(f"PEER {name} fp16 batch {batch} torch eager: {eager:.3f} ms, {batch * 1000 / eager:.0f} images/s")
            if "--no-compile" in sys.argv:
                continue
            start = time.time()
            compiled = torch.compile(model, mode="reduce-overhead")
            for _ in range(3):
                compiled(x)
            torch.cuda.synchronize()
            print(f"  compile took {time.time() - start:.0f} s")
            graphed = median_ms(compiled, x)
            print(f"PEER {name} fp16 batch {batch} torch.compile reduce-overhead: {graphed:.3f} ms, "
                  f"{batch * 1000 / graphed:.0f} images/s")


if __name__ == "__main__":
    main()
