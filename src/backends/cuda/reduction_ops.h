#pragma once
// sum, mean, amax and amin over any dims of a float tensor, and avg_pool2d, as kernels generated and compiled with
// NVRTC at prepare time (shapes and strides baked in): for the reductions one warp per output element, its lanes
// striding over the reduced elements; for the pooling a thread per output element summing its window.
#include <map>
#include <string>

#include "backends/cuda/cuda_ops.h"

namespace npusim::cuda {

void add_generated_reduction_ops(std::map<std::string, OpFactory>& table);

}  // namespace npusim::cuda
