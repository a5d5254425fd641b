#pragma once
#include <span>

#include "npusim/graph.h"
#include "npusim/tensor.h"

namespace npusim {

// Computes one derived weight from its sources (undefined Tensors for absent optional sources). Kinds:
//   bn_fold_weight (W, gamma?, var; eps): W scaled along dim 0 by gamma / sqrt(var + eps)
//   bn_fold_bias (b?, gamma?, beta?, mean, var; eps): (b - mean) * gamma / sqrt(var + eps) + beta
// Results are fp32.
Tensor apply_weight_transform(const WeightTransform& transform, std::span<const Tensor> sources,
                              const std::string& name);

}  // namespace npusim
