#!/usr/bin/env python3
"""Writes one seeded torchvision model for every runner: ONNX for ONNX Runtime, safetensors for npusim and PyTorch,
and its IR JSON for npusim.

    export_torchvision.py --arch resnet18 --out DIR [--seed 7]

DIR/ARCH.onnx                the model in eval mode, opset 13, input x [1, 3, 224, 224] float32, output logits
DIR/ARCH.safetensors         the same weights keyed by state_dict names (what `npusim bench --weights` reads)
DIR/ARCH_inputs.safetensors  x: one synthetic image
DIR/ARCH_logits.safetensors  PyTorch's logits for x, under the IR's output name (to check every runner)
DIR/ARCH_ir.json             the graph in torch_ir's format, written from a torch.fx trace
                             (tests/python/fx_to_ir.py); the ResNets also have fixtures written by torch_ir itself

The weights come from tests/python/make_resnet_case.py's recipe: torch.manual_seed, BatchNorm statistics from a
calibration batch plus seeded perturbations. Runs with Debian's torch 1.13 (/usr/bin/python3).
"""
import argparse
import json
import os
import sys

import torch
import torchvision

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import make_resnet_case as case  # noqa: E402
from fx_to_ir import model_ir  # noqa: E402

ARCHS = ["resnet18", "resnet34", "resnet50", "resnext50_32x4d", "regnet_y_400mf", "mobilenet_v2", "mobilenet_v3_large",
         "efficientnet_b0", "densenet121", "vgg11", "squeezenet1_1", "mnasnet1_0",
         "convnext_tiny"]


def build_model(arch, seed):
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    model = getattr(torchvision.models, arch)(weights=None)
    case.calibrate_batch_norms(model, generator)
    model.eval()
    return model, case.synthetic_images(1, generator).contiguous()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=ARCHS, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    model, image = build_model(args.arch, args.seed)
    os.makedirs(args.out, exist_ok=True)
    prefix = os.path.join(args.out, args.arch)
    with torch.no_grad():
        logits = model(image).contiguous()
        torch.onnx.export(model, (image,), prefix + ".onnx", input_names=["x"], output_names=["logits"],
                          opset_version=13, do_constant_folding=True)
        ir = model_ir(model, image, args.arch)
    with open(prefix + "_ir.json", "w") as f:
        json.dump(ir, f, indent=1)
    case.write_safetensors(prefix + ".safetensors", dict(model.state_dict()))
    case.write_safetensors(prefix + "_inputs.safetensors", {"x": image})
    case.write_safetensors(prefix + "_logits.safetensors", {ir["graph_outputs"][0]["name"]: logits})
    print(f"{args.arch}: wrote {prefix}.onnx and .safetensors; top-5 {torch.topk(logits[0], 5).indices.tolist()}")


if __name__ == "__main__":
    main()
