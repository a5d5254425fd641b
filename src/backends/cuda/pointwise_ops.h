#pragma once
// Pointwise ops whose kernels are generated and compiled with NVRTC at prepare time (pointwise_codegen.h).
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/pointwise_codegen.h"

namespace npusim::cuda {

// elementwise_chain, clamp with number bounds, pow with a number exponent, and the float unary ops that have no
// hand-written kernel.
void add_generated_pointwise_ops(std::map<std::string, OpFactory>& table);

// The steps of one pointwise node reading values `in` (one per node input): add, sub, rsub, mul and div (a tensor or
// a number operand), add_relu, silu_mul, masked_fill, where, "to" between float storages, and what float_steps_of
// takes. Each step's value follows the one before, the first being `first_value`. Nothing where the node is not
// pointwise here.
std::optional<std::vector<PointwiseStep>> pointwise_steps_of(const Node& node, const std::vector<int>& in,
                                                             int first_value);

// Whether a generated kernel reads input `input` of `node` in storage `elem`: floats, and the masks of masked_fill
// and where.
bool takes_elem(const Node& node, size_t input, cpu::Elem elem);

// One pointwise node (float storage throughout, inputs broadcast to its output) as a generated kernel, or nothing.
std::optional<Launch> generated_node(const OpContext& ctx);

// Whether a generated kernel may read `input` while writing `out`: it reads element i of an input only in the thread
// that writes element i of the output, so an input may share the output's memory only where it is read at the same
// index.
bool readable_beside(const DeviceValue& input, const DeviceValue& out);

// The fp32 steps of a one-input pointwise node (a unary op, clamp or pow with numbers, an elementwise_chain), or
// nothing.
std::optional<std::vector<cpu::UnaryStep>> float_steps_of(const Node& node);

// A launch of the generated kernel over `out` and `inputs` (in the kernel's order), or nothing where NVRTC is
// missing (the node then runs on the host). The kernel's lanes are chosen here from the addresses.
std::optional<Launch> generated_pointwise(const Node& node, PointwiseKernel kernel, const DeviceValue& out,
                                          const std::vector<DeviceValue>& inputs);

}  // namespace npusim::cuda
