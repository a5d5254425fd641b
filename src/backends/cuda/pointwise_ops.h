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

// The fp32 steps of a one-input pointwise node (a unary op, clamp or pow with numbers, an elementwise_chain), or
// nothing.
std::optional<std::vector<cpu::UnaryStep>> float_steps_of(const Node& node);

// A launch of the generated kernel over `out` and `inputs` (in the kernel's order), or nothing where NVRTC is
// missing (the node then runs on the host). The kernel's lanes are chosen here from the addresses.
std::optional<Launch> generated_pointwise(const Node& node, PointwiseKernel kernel, const DeviceValue& out,
                                          const std::vector<DeviceValue>& inputs);

}  // namespace npusim::cuda
