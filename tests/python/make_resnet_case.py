#!/usr/bin/env python3
"""Writes a torchvision test case (ResNet, MobileNetV2): seeded random weights, a synthetic image and PyTorch's logits.

    make_resnet_case.py --arch resnet18 --seed 7 --out DIR --output-name linear [--weight-dtype bfloat16] [--batch 1]
                        [--ir FILE]

DIR/weights.safetensors    the torchvision state_dict (float tensors in --weight-dtype, num_batches_tracked int64)
DIR/inputs.safetensors     x: [batch, 3, 224, 224] float32
DIR/reference.safetensors  NAME: [batch, 1000] float32 logits of model.eval() in fp32 with the stored weights
FILE (--ir)                the model in torch_ir's IR format, written from a torch.fx trace (fx_to_ir.py), for
                           models without a fixture

Every BatchNorm gets statistics from a calibration batch, then seeded perturbations of its running mean and
variance and a non-trivial affine weight and bias, so a wrong BatchNorm fold (for example a lost bias on a
bias-free convolution) changes the logits. The classifier is scaled so that the logits are well spread, and the
top-6 classes of the first image are pushed apart through the fc bias so that top-5 comparisons are stable.
Runs with Debian's torch 1.13 / torchvision 0.14 (/usr/bin/python3); no safetensors package is needed.
"""
import argparse
import json
import os
import struct
import sys

import torch
import torchvision

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SAFETENSORS_NAMES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
LOGIT_STD = 4.0
TOP_GAP = 0.5  # minimum distance between consecutive top-6 logits of the first image


def tensor_bytes(tensor):
    tensor = tensor.detach().contiguous().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().tobytes()
    if tensor.dtype == torch.bool:
        return tensor.to(torch.uint8).numpy().tobytes()
    return tensor.numpy().tobytes()


def write_safetensors(path, tensors):
    """Same layout as the safetensors library: widest dtype first, header padded with spaces to 8 bytes."""
    items = sorted(tensors.items(), key=lambda item: -item[1].element_size())
    header, blobs, offset = {}, [], 0
    for name, tensor in items:
        data = tensor_bytes(tensor)
        header[name] = {
            "dtype": SAFETENSORS_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    temporary = path + ".tmp"
    with open(temporary, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for blob in blobs:
            out.write(blob)
    os.replace(temporary, path)


def synthetic_images(batch, generator):
    """Smooth colour fields with a little noise, normalised like ImageNet inputs."""
    coarse = torch.rand(batch, 3, 7, 7, generator=generator)
    image = torch.nn.functional.interpolate(coarse, size=(224, 224), mode="bilinear", align_corners=False)
    image = (image + 0.05 * torch.randn(batch, 3, 224, 224, generator=generator)).clamp(0.0, 1.0)
    return (image - IMAGENET_MEAN) / IMAGENET_STD


def calibrate_batch_norms(model, generator):
    batch_norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in batch_norms:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average: one batch sets the statistics
    model.train()
    with torch.no_grad():
        calibration = synthetic_images(2, generator)
        model(torch.nn.functional.interpolate(calibration, size=(112, 112), mode="bilinear", align_corners=False))
    model.eval()
    with torch.no_grad():
        for bn in batch_norms:
            channels = bn.num_features
            std = bn.running_var.sqrt()
            bn.running_mean.add_(0.1 * std * torch.randn(channels, generator=generator))
            bn.running_var.mul_(0.8 + 0.45 * torch.rand(channels, generator=generator))
            bn.weight.copy_(0.5 + torch.rand(channels, generator=generator))
            bn.bias.copy_(0.2 * torch.randn(channels, generator=generator))
            bn.momentum = 0.1


def round_to(model, dtype):
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(tensor.to(dtype).to(torch.float32))


def classifier_of(model):
    """The last linear layer: (its parent module, its attribute name)."""
    if isinstance(getattr(model, "fc", None), torch.nn.Linear):
        return model, "fc"
    return model.classifier, str(len(model.classifier) - 1)


def pooled_features(model, image):
    """The classifier's input: the forward pass with the last linear layer replaced by the identity."""
    parent, name = classifier_of(model)
    classifier = getattr(parent, name)
    setattr(parent, name, torch.nn.Identity())
    try:
        with torch.no_grad():
            return model(image)
    finally:
        setattr(parent, name, classifier)


def spread_logits(fc, features):
    """Scales the classifier to LOGIT_STD and separates the leading classes of the first image."""
    with torch.no_grad():
        scale = LOGIT_STD / fc(features).std().item()
        fc.weight.mul_(scale)
        fc.bias.mul_(scale)
        first = fc(features)[0]
        order = torch.argsort(first, descending=True)
        raised = first[order[6]].item()
        for rank in range(5, -1, -1):
            cls = order[rank].item()
            target = max(first[cls].item(), raised + TOP_GAP)
            fc.bias[cls] += target - first[cls].item()
            raised = target


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=["resnet18", "resnet50", "mobilenet_v2", "convnext_tiny"], required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--output-name", required=True)
    parser.add_argument("--weight-dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--ir")
    args = parser.parse_args()
    if args.batch < 1:
        parser.error("--batch must be at least 1")

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed + 1)
    model = getattr(torchvision.models, args.arch)(weights=None)
    calibrate_batch_norms(model, generator)
    image = synthetic_images(args.batch, generator)
    round_to(model, DTYPES[args.weight_dtype])
    # Only the classifier changes from here on, so one pass through the convolutions is enough.
    features = pooled_features(model, image)
    classifier = getattr(*classifier_of(model))
    spread_logits(classifier, features)
    round_to(model, DTYPES[args.weight_dtype])
    with torch.no_grad():
        logits = classifier(features).contiguous()
    if args.ir:
        from fx_to_ir import model_ir

        os.makedirs(os.path.dirname(os.path.abspath(args.ir)), exist_ok=True)
        with open(args.ir, "w") as f:
            json.dump(model_ir(model, image, args.arch), f)

    os.makedirs(args.out, exist_ok=True)
    weight_dtype = DTYPES[args.weight_dtype]
    state = {
        name: (tensor.to(weight_dtype) if tensor.is_floating_point() else tensor)
        for name, tensor in model.state_dict().items()
    }
    write_safetensors(os.path.join(args.out, "weights.safetensors"), state)
    write_safetensors(os.path.join(args.out, "inputs.safetensors"), {"x": image.contiguous()})
    write_safetensors(os.path.join(args.out, "reference.safetensors"), {args.output_name: logits})
    top6 = torch.topk(logits[0], 6)
    print(
        f"{args.arch} seed {args.seed} {args.weight_dtype}: logits std {logits.std().item():.3f}, "
        f"top-5 {top6.indices[:5].tolist()}, smallest top-6 gap {(-top6.values.diff()).min().item():.3f}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
