#pragma once
// sum, mean, amax and amin over any dims of a float tensor, as kernels generated and compiled with NVRTC at prepare
// time: one warp per output element, its lanes striding over the reduced elements, shapes and strides baked in.
#include <map>
#include <string>

#include "backends/cuda/cuda_ops.h"

namespace npusim::cuda {

void add_generated_reduction_ops(std::map<std::string, OpFactory>& table);

}  // namespace npusim::cuda
