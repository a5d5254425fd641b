"""Writes a torchvision-style model as torch_ir IR JSON from a torch.fx trace, for tests and benchmarks of models
that have no fixture. Debian's torch 1.13 has no torch.export; the module types and functions below are written as the ATen ops
torch.export names them (aten.conv2d.default, aten.batch_norm.default, ...), with the same weight naming
(p_<path>_weight -> <path>.weight, b_<path>_running_mean -> ...). Anything else is an error naming the fx node.

    from fx_to_ir import model_ir
    ir = model_ir(model, example_input, "mobilenet_v2")   # a dict, ready for json.dump
"""
import operator

import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp

DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.int64: "int64",
          torch.bool: "bool"}


def meta(name, tensor, producer=None):
    m = {"name": name, "shape": list(tensor.shape), "dtype": DTYPES[tensor.dtype]}
    if producer is not None:
        m["producer_node"], m["producer_output_idx"] = producer, 0
    return m


def pair(value):
    return list(value) if isinstance(value, (tuple, list)) else [value, value]


class Writer:
    def __init__(self, model):
        self.model = model
        self.nodes = []
        self.weights = []
        self.mapping = {}
        self.names = {}  # fx node -> IR value name
        self.used = set()

    def unique(self, base):
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name

    def weight(self, path, kind, prefix):
        key = f"{path}.{kind}" if path else kind
        tensor = self.model.get_parameter(key) if prefix == "p" else self.model.get_buffer(key)
        placeholder = f"{prefix}_{key.replace('.', '_')}"
        if placeholder not in self.mapping:
            self.mapping[placeholder] = key
            self.weights.append(meta(key, tensor))
        return meta(placeholder, tensor)

    def value(self, node):
        return meta(self.names[node], node.meta["tensor_meta"], self.names[node])

    def emit(self, node, base, op_type, inputs, attrs):
        name = self.unique(base)
        self.names[node] = name
        out = node.meta["tensor_meta"]
        self.nodes.append({"name": name, "op_type": op_type, "inputs": inputs,
                           "outputs": [{"name": name, "shape": list(out.shape), "dtype": DTYPES[out.dtype]}],
                           "attrs": attrs})

    def module_node(self, node, module):
        x = self.value(node.args[0])
        path = node.target
        if isinstance(module, torch.nn.Conv2d):
            inputs = [x, self.weight(path, "weight", "p")] + ([self.weight(path, "bias", "p")] if module.bias is not None else [])
            attrs = {"stride": pair(module.stride), "padding": pair(module.padding), "dilation": pair(module.dilation),
                     "groups": module.groups}
            return self.emit(node, "conv2d", "aten.conv2d.default", inputs, attrs)
        if isinstance(module, torch.nn.BatchNorm2d):
            inputs = [x, self.weight(path, "weight", "p"), self.weight(path, "bias", "p"),
                      self.weight(path, "running_mean", "b"), self.weight(path, "running_var", "b")]
            self.weight(path, "num_batches_tracked", "b")
            attrs = {"training": False, "momentum": module.momentum if module.momentum is not None else 0.1, "eps": module.eps, "cudnn_enabled": False}
            return self.emit(node, "batch_norm", "aten.batch_norm.default", inputs, attrs)
        if isinstance(module, torch.nn.ReLU):
            return self.emit(node, "relu", "aten.relu.default", [x], {})
        if isinstance(module, torch.nn.ReLU6):
            return self.emit(node, "hardtanh", "aten.hardtanh.default", [x], {"min_val": 0.0, "max_val": 6.0})
        if isinstance(module, torch.nn.Hardswish):
            return self.emit(node, "hardswish", "aten.hardswish.default", [x], {})
        if isinstance(module, torch.nn.Hardsigmoid):
            return self.emit(node, "hardsigmoid", "aten.hardsigmoid.default", [x], {})
        if isinstance(module, torch.nn.SiLU):
            return self.emit(node, "silu", "aten.silu.default", [x], {})
        if isinstance(module, torch.nn.Sigmoid):
            return self.emit(node, "sigmoid", "aten.sigmoid.default", [x], {})
        if isinstance(module, torch.nn.Dropout):
            return self.emit(node, "dropout", "aten.dropout.default", [x], {"p": module.p, "train": False})
        if isinstance(module, torch.nn.AdaptiveAvgPool2d):
            return self.emit(node, "adaptive_avg_pool2d", "aten.adaptive_avg_pool2d.default", [x],
                             {"output_size": pair(module.output_size)})
        if isinstance(module, torch.nn.MaxPool2d):
            attrs = {"kernel_size": pair(module.kernel_size), "stride": pair(module.stride),
                     "padding": pair(module.padding), "dilation": pair(module.dilation), "ceil_mode": module.ceil_mode}
            return self.emit(node, "max_pool2d", "aten.max_pool2d.default", [x], attrs)
        if isinstance(module, torch.nn.Flatten):
            return self.emit(node, "flatten", "aten.flatten.using_ints", [x],
                             {"start_dim": module.start_dim, "end_dim": module.end_dim})
        if isinstance(module, torch.nn.Linear):
            inputs = [x, self.weight(path, "weight", "p")] + ([self.weight(path, "bias", "p")] if module.bias is not None else [])
            return self.emit(node, "linear", "aten.linear.default", inputs, {})
        raise SystemExit(f"fx_to_ir: node '{node.name}': module {type(module).__name__} is not written")

    def function_node(self, node):
        target = node.target
        if target in (operator.add, torch.add):
            a, b = node.args
            if not isinstance(b, torch.fx.Node):
                raise SystemExit(f"fx_to_ir: node '{node.name}': only tensor + tensor is written")
            return self.emit(node, "add", "aten.add.Tensor", [self.value(a), self.value(b)], {})
        if target in (operator.mul, torch.mul):
            a, b = node.args
            return self.emit(node, "mul", "aten.mul.Tensor", [self.value(a), self.value(b)], {})
        if target is torch.flatten:
            start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
            return self.emit(node, "flatten", "aten.flatten.using_ints", [self.value(node.args[0])], {"start_dim": start})
        if target is torch.nn.functional.adaptive_avg_pool2d:
            return self.emit(node, "adaptive_avg_pool2d", "aten.adaptive_avg_pool2d.default",
                             [self.value(node.args[0])], {"output_size": pair(node.args[1])})
        if getattr(target, "__name__", "") == "stochastic_depth":  # torchvision.ops: the identity in eval mode
            if node.args[3] if len(node.args) > 3 else node.kwargs.get("training", True):
                raise SystemExit(f"fx_to_ir: node '{node.name}': stochastic depth in training mode")
            self.names[node] = self.names[node.args[0]]
            return None
        if target is torch.nn.functional.relu:
            return self.emit(node, "relu", "aten.relu.default", [self.value(node.args[0])], {})
        raise SystemExit(f"fx_to_ir: node '{node.name}': function {target} is not written")


def model_ir(model, example, name, input_name="x"):
    """The IR of `model` (eval mode) traced on `example` [N, C, H, W], as a dict."""
    graph = torch.fx.symbolic_trace(model)
    ShapeProp(graph).propagate(example)
    writer = Writer(model)
    graph_inputs, graph_outputs = [], []
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            writer.names[node] = input_name
            writer.used.add(input_name)
            graph_inputs.append(meta(input_name, node.meta["tensor_meta"]))
        elif node.op == "call_module":
            writer.module_node(node, graph.get_submodule(node.target))
        elif node.op in ("call_function", "call_method"):
            if node.op == "call_method" and node.target == "flatten":
                node.target = torch.flatten
            writer.function_node(node)
        elif node.op == "output":
            result = node.args[0]
            graph_outputs.append(meta(writer.names[result], result.meta["tensor_meta"]))
        else:
            raise SystemExit(f"fx_to_ir: node '{node.name}': {node.op} is not written")
    return {"model_name": name, "pytorch_version": torch.__version__, "graph_inputs": graph_inputs,
            "graph_outputs": graph_outputs, "weights": writer.weights, "weight_name_mapping": writer.mapping,
            "nodes": writer.nodes}
