"""Timing of GPU work for the PyTorch peers: the median of CUDA-event timings of single calls after a warm-up."""
import torch


def median_ms(fn, *args, iters=200, warmup=20):
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]
