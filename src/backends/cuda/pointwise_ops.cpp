#include "backends/cuda/pointwise_ops.h"

#include <limits>

#include "backends/cuda/generated_kernels.h"
#include "core/nvrtc_compiler.h"
#include "ops/op_util.h"

namespace npusim::cuda {

namespace {

constexpr size_t kMaxGeneratedInputs = kMaxGeneratedPointers - 1;

using cpu::UnaryKind;
using cpu::UnaryStep;

PointwiseStep unary(UnaryStep step, int a) {
  PointwiseStep made;
  made.unary = step;
  made.a = a;
  return made;
}

PointwiseStep binary(PointwiseBinary op, int a, int b, float alpha = 1.0f) {
  PointwiseStep made;
  made.binary = op;
  made.a = a;
  made.b = b;
  made.alpha = alpha;
  return made;
}

bool broadcasts_to(const Shape& shape, const Shape& target) {
  if (shape.size() > target.size()) return false;
  const size_t lead = target.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1 && shape[d] != target[lead + d]) return false;
  return true;
}

}  // namespace

bool takes_elem(const Node& node, size_t input, cpu::Elem elem) {
  if (cpu::is_float_elem(elem)) return true;
  return elem == cpu::Elem::Bool && ((node.op == "masked_fill" && input == 1) || (node.op == "where" && input == 0));
}

std::optional<std::vector<PointwiseStep>> pointwise_steps_of(const Node& node, const std::vector<int>& in,
                                                             int first_value) {
  const Attrs& a = node.attrs;
  const std::string& op = node.op;
  const size_t inputs = in.size();
  const auto alpha = static_cast<float>(a.get_float("alpha", 1.0));
  if (op == "add" || op == "sub") {
    const bool add = op == "add";
    if (inputs == 2) return std::vector{binary(add ? PointwiseBinary::Add : PointwiseBinary::Sub, in[0], in[1], alpha)};
    if (inputs == 1 && !a.is_none("other")) {
      const auto other = static_cast<float>(a.get_float("other")) * alpha;
      return std::vector{unary({UnaryKind::AddScalar, add ? other : -other}, in[0])};
    }
    return std::nullopt;
  }
  if (op == "rsub") {  // other - alpha * self
    if (inputs == 2) return std::vector{binary(PointwiseBinary::Sub, in[1], in[0], alpha)};
    if (inputs == 1 && !a.is_none("other"))
      return std::vector{unary({UnaryKind::MulScalar, -alpha}, in[0]),
                         unary({UnaryKind::AddScalar, static_cast<float>(a.get_float("other"))}, first_value)};
    return std::nullopt;
  }
  if (op == "masked_fill") {  // mask ? value : self
    PointwiseStep select = binary(PointwiseBinary::Select, in[1], -1);
    select.c = in[0];
    if (inputs == 3) {
      select.b = in[2];
      return std::vector{select};
    }
    if (inputs != 2 || a.is_none("value")) return std::nullopt;
    PointwiseStep value;
    value.constant = static_cast<float>(a.get_float("value"));
    select.b = first_value;
    return std::vector{value, select};
  }
  if (op == "where") {  // condition ? self : other
    if (inputs == 3) {
      PointwiseStep select = binary(PointwiseBinary::Select, in[0], in[1]);
      select.c = in[2];
      return std::vector{select};
    }
    if (inputs != 2 || a.is_none("other") || !a.is_none("self")) return std::nullopt;
    PointwiseStep other;
    other.constant = static_cast<float>(a.get_float("other"));
    PointwiseStep select = binary(PointwiseBinary::Select, in[0], in[1]);
    select.c = first_value;
    return std::vector{other, select};
  }
  if (op == "mul" || op == "div") {
    if (!a.is_none("alpha") || (op == "div" && !a.is_none("rounding_mode"))) return std::nullopt;
    const bool mul = op == "mul";
    if (inputs == 2) return std::vector{binary(mul ? PointwiseBinary::Mul : PointwiseBinary::Div, in[0], in[1])};
    if (inputs == 1 && !a.is_none("other"))
      return std::vector{
          unary({mul ? UnaryKind::MulScalar : UnaryKind::DivScalar, static_cast<float>(a.get_float("other"))}, in[0])};
    return std::nullopt;
  }
  if (op == "add_relu" && inputs == 2)
    return std::vector{binary(PointwiseBinary::Add, in[0], in[1]), unary({UnaryKind::Relu}, first_value)};
  if (op == "silu_mul" && inputs == 2)
    return std::vector{unary({UnaryKind::Silu}, in[0]), binary(PointwiseBinary::Mul, first_value, in[1])};
  if (inputs != 1) return std::nullopt;
  std::vector<UnaryStep> chain{{UnaryKind::Identity}};  // "to" between float storages
  if (op != "to") {
    std::optional<std::vector<UnaryStep>> steps = float_steps_of(node);
    if (!steps) return std::nullopt;
    chain = std::move(*steps);
  }
  std::vector<PointwiseStep> steps;
  for (size_t s = 0; s < chain.size(); ++s)
    steps.push_back(unary(chain[s], s == 0 ? in[0] : first_value + static_cast<int>(s) - 1));
  return steps;
}

bool readable_beside(const DeviceValue& input, const DeviceValue& out) {
  const std::byte* in_begin = input.data;
  const std::byte* in_end = input.data + input.bytes();
  const std::byte* out_begin = out.data;
  const std::byte* out_end = out.data + out.bytes();
  if (in_end <= out_begin || out_end <= in_begin) return true;
  return in_begin == out_begin && input.elem == out.elem && input.meta.shape == out.meta.shape;
}

std::optional<Launch> generated_node(const OpContext& ctx) {
  if (ctx.outputs.size() != 1 || ctx.inputs.empty() || ctx.inputs.size() > kMaxGeneratedInputs) return std::nullopt;
  const DeviceValue& out = ctx.outputs[0];
  if (!cpu::is_float_elem(out.elem)) return std::nullopt;
  PointwiseKernel kernel;
  kernel.shape = out.meta.shape;
  kernel.out_elem = out.elem;
  std::vector<int> values;
  for (const DeviceValue& in : ctx.inputs) {
    if (!takes_elem(ctx.node, static_cast<size_t>(&in - ctx.inputs.data()), in.elem) || !readable_beside(in, out))
      return std::nullopt;
    std::vector<int64_t> strides;
    if (in.meta.shape == out.meta.shape || in.numel() != out.numel()) {
      if (!broadcasts_to(in.meta.shape, out.meta.shape)) return std::nullopt;
      strides = ops::broadcast_strides(in.meta.shape, out.meta.shape);
    } else {
      strides = contiguous_strides(out.meta.shape);  // the same elements in another shape
    }
    values.push_back(static_cast<int>(kernel.inputs.size()));
    kernel.inputs.push_back({in.elem, std::move(strides)});
  }
  std::optional<std::vector<PointwiseStep>> steps =
      pointwise_steps_of(ctx.node, values, static_cast<int>(kernel.inputs.size()));
  if (!steps) return std::nullopt;
  kernel.steps = std::move(*steps);
  return generated_pointwise(ctx.node, std::move(kernel), out, ctx.inputs);
}

std::optional<std::vector<cpu::UnaryStep>> float_steps_of(const Node& node) {
  const Attrs& a = node.attrs;
  if (node.op == "elementwise_chain") return cpu::chain_steps(a);
  if (node.op == "clamp") {
    if (std::optional<cpu::UnaryStep> step = cpu::clamp_step(a)) return std::vector{*step};
    return std::nullopt;
  }
  if (node.op == "pow") {
    if (a.is_none("exponent") || !a.is_none("base")) return std::nullopt;
    return std::vector<cpu::UnaryStep>{{cpu::UnaryKind::PowScalar, static_cast<float>(a.get_float("exponent"))}};
  }
  if (std::optional<cpu::UnaryStep> step = cpu::unary_step(node.op, a)) return std::vector{*step};
  return std::nullopt;
}

std::optional<Launch> generated_pointwise(const Node& node, PointwiseKernel kernel, const DeviceValue& out,
                                          const std::vector<DeviceValue>& inputs) {
  if (inputs.size() != kernel.inputs.size() || inputs.size() > kMaxGeneratedInputs) return std::nullopt;
  if (!nvrtc::available(nullptr)) return std::nullopt;
  std::vector<const void*> addresses{out.data};
  for (const DeviceValue& in : inputs) addresses.push_back(in.data);
  kernel.lanes = vector_lanes(kernel, addresses);
  if (out.numel() == 0) return generated_launch(node, nullptr, 0, kPointwiseThreads, addresses);
  const cudaKernel_t function = generated_kernel(pointwise_source(kernel), kPointwiseKernelName, describe_node(node));
  return generated_launch(node, function, pointwise_blocks(kernel), kPointwiseThreads, addresses);
}

void add_generated_pointwise_ops(std::map<std::string, OpFactory>& table) {
  for (const char* op :
       {"log",   "log2",     "log10",     "log1p",       "expm1",      "sqrt", "rsqrt",    "reciprocal", "sin",
        "cos",   "tan",      "atan",      "erf",         "abs",        "sign", "floor",    "ceil",       "trunc",
        "round", "hardtanh", "hardswish", "hardsigmoid", "leaky_relu", "elu",  "softplus", "mish"})
    table.emplace(op, generated_node);
  for (const char* op : {"clamp", "pow", "elementwise_chain", "rsub", "masked_fill"}) table.emplace(op, generated_node);
}

}  // namespace npusim::cuda
