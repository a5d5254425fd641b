#include "backends/cuda/pointwise_ops.h"

#include <array>
#include <limits>

#include "backends/cuda/generated_kernels.h"
#include "core/nvrtc_compiler.h"
#include "ops/op_util.h"

namespace npusim::cuda {

namespace {

constexpr size_t kMaxGeneratedInputs = 8;

// The same unary steps applied in order to the node's one input, as a generated kernel.
std::optional<Launch> unary_chain(const OpContext& ctx, const std::vector<cpu::UnaryStep>& steps) {
  if (ctx.inputs.size() != 1 || ctx.outputs.size() != 1 || steps.empty()) return std::nullopt;
  const DeviceValue& in = ctx.inputs[0];
  const DeviceValue& out = ctx.outputs[0];
  if (!cpu::is_float_elem(in.elem) || !cpu::is_float_elem(out.elem) || in.numel() != out.numel()) return std::nullopt;
  PointwiseKernel kernel;
  kernel.shape = out.meta.shape;
  kernel.out_elem = out.elem;
  kernel.inputs.push_back({in.elem, contiguous_strides(out.meta.shape)});
  for (size_t s = 0; s < steps.size(); ++s) {
    PointwiseStep step;
    step.unary = steps[s];
    step.a = static_cast<int>(s);  // the input, then each step's value
    kernel.steps.push_back(step);
  }
  return generated_pointwise(ctx.node, std::move(kernel), out, {in});
}

std::optional<Launch> generated_unary_op(const OpContext& ctx) {
  const std::optional<std::vector<cpu::UnaryStep>> steps = float_steps_of(ctx.node);
  if (!steps) return std::nullopt;
  return unary_chain(ctx, *steps);
}

}  // namespace

std::optional<std::vector<cpu::UnaryStep>> float_steps_of(const Node& node) {
  const Attrs& a = node.attrs;
  if (node.op == "elementwise_chain") return cpu::chain_steps(a);
  if (node.op == "clamp") {
    const bool has_low = !a.is_none("min"), has_high = !a.is_none("max");
    if (!has_low && !has_high) return std::nullopt;
    constexpr float kInfinity = std::numeric_limits<float>::infinity();
    return std::vector<cpu::UnaryStep>{{cpu::UnaryKind::Clamp,
                                        has_low ? static_cast<float>(a.get_float("min")) : -kInfinity,
                                        has_high ? static_cast<float>(a.get_float("max")) : kInfinity}};
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
  const auto nothing = [](cudaStream_t) {};
  if (out.numel() == 0) return Launch(nothing);
  std::vector<const void*> addresses{out.data};
  for (const DeviceValue& in : inputs) addresses.push_back(in.data);
  kernel.lanes = vector_lanes(kernel, addresses);
  const cudaKernel_t function = generated_kernel(pointwise_source(kernel), kPointwiseKernelName, describe_node(node));
  const int64_t blocks = pointwise_blocks(kernel);
  if (blocks > std::numeric_limits<int32_t>::max()) return std::nullopt;
  std::array<void*, kMaxGeneratedInputs + 1> pointers{};
  pointers[0] = out.data;
  for (size_t k = 0; k < inputs.size(); ++k) pointers[k + 1] = inputs[k].data;
  return [node = &node, function, blocks, pointers](cudaStream_t stream) {
    std::array<void*, kMaxGeneratedInputs + 1> values = pointers;
    std::array<void*, kMaxGeneratedInputs + 1> arguments{};
    for (size_t k = 0; k < values.size(); ++k) arguments[k] = &values[k];
    check_launch(cudaLaunchKernel(reinterpret_cast<const void*>(function), dim3(static_cast<unsigned>(blocks)),
                                  dim3(kPointwiseThreads), arguments.data(), 0, stream),
                 "the generated pointwise kernel", *node);
  };
}

void add_generated_pointwise_ops(std::map<std::string, OpFactory>& table) {
  for (const char* op :
       {"log",   "log2",     "log10",     "log1p",       "expm1",      "sqrt", "rsqrt",    "reciprocal", "sin",
        "cos",   "tan",      "atan",      "erf",         "abs",        "sign", "floor",    "ceil",       "trunc",
        "round", "hardtanh", "hardswish", "hardsigmoid", "leaky_relu", "elu",  "softplus", "mish"})
    table.emplace(op, generated_unary_op);
  for (const char* op : {"clamp", "pow", "elementwise_chain"}) table.emplace(op, generated_unary_op);
}

}  // namespace npusim::cuda
