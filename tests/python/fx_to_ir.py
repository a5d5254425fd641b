"""Writes a torchvision-style model as torch_ir IR JSON from a torch.fx trace, for tests and benchmarks of models
that have no fixture. Debian's torch 1.13 has no torch.export; the module types, functions and methods below are written as the ATen ops
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
        self.weight_values = {}  # get_attr node -> its weight's placeholder meta
        self.outputs = {}  # multi-output node -> its output metas, in order

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
        if node in self.weight_values:
            return self.weight_values[node]
        if node in self.outputs:
            raise SystemExit(f"fx_to_ir: node '{node.name}': a tuple used without getitem")
        return meta(self.names[node], node.meta["tensor_meta"], self.names[node])

    def alias(self, node, source):
        """`node` is `source` (a no-op in eval mode, or a copy torch.export leaves out)."""
        self.names[node] = self.names[source]
        if source in self.weight_values:
            self.weight_values[node] = self.weight_values[source]

    def emit(self, node, base, op_type, inputs, attrs):
        name = self.unique(base)
        self.names[node] = name
        out = node.meta["tensor_meta"]
        self.nodes.append({"name": name, "op_type": op_type, "inputs": inputs,
                           "outputs": [{"name": name, "shape": list(out.shape), "dtype": DTYPES[out.dtype]}],
                           "attrs": attrs})

    def emit_tuple(self, node, base, op_type, inputs, attrs):
        """A node with several outputs (<name>_0, <name>_1, ...); consumers go through getitem."""
        name = self.unique(base)
        self.names[node] = name
        metas = [meta(f"{name}_{i}", m) for i, m in enumerate(node.meta["tensor_meta"])]
        self.outputs[node] = [dict(m, producer_node=name, producer_output_idx=i) for i, m in enumerate(metas)]
        self.nodes.append({"name": name, "op_type": op_type, "inputs": inputs, "outputs": metas, "attrs": attrs})

    def get_attr(self, node):
        path, kind = node.target.rsplit(".", 1) if "." in node.target else ("", node.target)
        is_parameter = any(name == node.target for name, _ in self.model.named_parameters())
        self.weight_values[node] = self.weight(path, kind, "p" if is_parameter else "b")
        self.names[node] = self.weight_values[node]["name"]

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
        if isinstance(module, torch.nn.AvgPool2d):
            attrs = {"kernel_size": pair(module.kernel_size), "stride": pair(module.stride),
                     "padding": pair(module.padding), "ceil_mode": module.ceil_mode,
                     "count_include_pad": module.count_include_pad}
            if module.divisor_override is not None:
                attrs["divisor_override"] = module.divisor_override
            return self.emit(node, "avg_pool2d", "aten.avg_pool2d.default", [x], attrs)
        if isinstance(module, torch.nn.LayerNorm):
            inputs = [x] + ([self.weight(path, "weight", "p"), self.weight(path, "bias", "p")]
                            if module.elementwise_affine else [])
            attrs = {"normalized_shape": list(module.normalized_shape), "eps": module.eps}
            return self.emit(node, "layer_norm", "aten.layer_norm.default", inputs, attrs)
        if isinstance(module, torch.nn.GELU):
            return self.emit(node, "gelu", "aten.gelu.default", [x], {"approximate": module.approximate})
        if type(module).__name__ == "Permute":  # torchvision.ops.misc.Permute
            return self.emit(node, "permute", "aten.permute.default", [x], {"dims": list(module.dims)})
        if type(module).__name__ == "StochasticDepth":  # the identity in eval mode
            if module.training:
                raise SystemExit(f"fx_to_ir: node '{node.name}': stochastic depth in training mode")
            return self.alias(node, node.args[0])
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
        args, kwargs = node.args, node.kwargs
        if target is torch.cat:
            tensors = args[0]
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            return self.emit(node, "cat", "aten.cat.default", [self.value(t) for t in tensors], {"dim": dim})
        if target is operator.getitem and args[0] in self.outputs:
            return self.emit(node, "getitem", "<built-in function getitem>", self.outputs[args[0]], {"index": args[1]})
        if target in ("chunk", torch.chunk):
            dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
            return self.emit_tuple(node, "chunk", "aten.chunk.default", [self.value(args[0])],
                                   {"chunks": args[1], "dim": dim})
        if target in ("transpose", torch.transpose):
            return self.emit(node, "transpose", "aten.transpose.int", [self.value(args[0])],
                             {"dim0": args[1], "dim1": args[2]})
        if target in ("permute", torch.permute):
            dims = list(args[1]) if isinstance(args[1], (list, tuple)) else list(args[1:])
            return self.emit(node, "permute", "aten.permute.default", [self.value(args[0])], {"dims": dims})
        if target in ("view", "reshape", torch.reshape):
            # Sizes may come from x.size() at trace time; the static output shape is what they were.
            return self.emit(node, "view", "aten.view.default", [self.value(args[0])],
                             {"size": list(node.meta["tensor_meta"].shape)})
        if target in ("mean", torch.mean):
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            return self.emit(node, "mean", "aten.mean.dim", [self.value(args[0])],
                             {"dim": list(dims) if isinstance(dims, (list, tuple)) else [dims], "keepdim": keepdim})
        if target is torch.nn.functional.layer_norm:
            shape = args[1] if len(args) > 1 else kwargs["normalized_shape"]
            weight = args[2] if len(args) > 2 else kwargs.get("weight")
            bias = args[3] if len(args) > 3 else kwargs.get("bias")
            eps = args[4] if len(args) > 4 else kwargs.get("eps", 1e-5)
            inputs = [self.value(args[0])] + [self.value(t) for t in (weight, bias) if t is not None]
            return self.emit(node, "layer_norm", "aten.layer_norm.default", inputs,
                             {"normalized_shape": list(shape), "eps": eps})
        if target == "contiguous":
            return self.alias(node, args[0])
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
        elif node.op == "get_attr":
            writer.get_attr(node)
        elif node.op in ("call_function", "call_method"):
            if node.op == "call_method" and node.target == "flatten":
                node.target = torch.flatten
            if node.meta.get("tensor_meta") is None:
                continue  # a size or shape computed at trace time: its uses read static shapes
            writer.function_node(node)
        elif node.op == "output":
            result = node.args[0]
            graph_outputs.append(meta(writer.names[result], result.meta["tensor_meta"]))
        else:
            raise SystemExit(f"fx_to_ir: node '{node.name}': {node.op} is not written")
    return {"model_name": name, "pytorch_version": torch.__version__, "graph_inputs": graph_inputs,
            "graph_outputs": graph_outputs, "weights": writer.weights, "weight_name_mapping": writer.mapping,
            "nodes": writer.nodes}
