#!/usr/bin/env python3
"""Times a torchvision ResNet in eager PyTorch on the CPU (Debian's torch 1.13, /usr/bin/python3).

    bench_torch.py --arch resnet18 --weights W.safetensors --inputs X.safetensors [--threads 1,2] [--iters N]
        [--warmup N]

Loads the same state_dict that npusim and ONNX Runtime run, then for each thread count: torch.set_num_threads,
torch.no_grad, no TorchScript. Prints one JSON object per line: threads, min_ms, median_ms, max_ms.
"""
import argparse
import json
import struct
import time

import numpy
import torch
import torchvision

NUMPY_DTYPES = {"F32": numpy.float32, "F16": numpy.float16, "I64": numpy.int64}


def read_safetensors(path):
    with open(path, "rb") as file:
        header_length = struct.unpack("<Q", file.read(8))[0]
        header = json.loads(file.read(header_length))
        data = file.read()
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        array = numpy.frombuffer(data[begin:end], dtype=NUMPY_DTYPES[entry["dtype"]]).reshape(entry["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors


def time_model(model, image, threads, iters, warmup):
    torch.set_num_threads(threads)
    with torch.no_grad():
        for _ in range(warmup):
            model(image)
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            model(image)
            times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return {"runner": "pytorch", "version": torch.__version__, "threads": threads, "iters": iters,
            "min_ms": times[0], "median_ms": times[len(times) // 2], "max_ms": times[-1]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=["resnet18", "resnet34", "resnet50", "resnext50_32x4d", "regnet_y_400mf",
                                           "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0"], required=True)
    parser.add_argument("--weights", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    model = getattr(torchvision.models, args.arch)(weights=None)
    model.load_state_dict(read_safetensors(args.weights))
    model.eval()
    image = read_safetensors(args.inputs)["x"]
    for threads in [int(t) for t in args.threads.split(",")]:
        print(json.dumps(time_model(model, image, threads, args.iters, args.warmup)), flush=True)


if __name__ == "__main__":
    main()
