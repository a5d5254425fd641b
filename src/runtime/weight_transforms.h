#pragma once
#include <span>
#include <utility>
#include <vector>

#include "npusim/graph.h"
#include "npusim/tensor.h"

namespace npusim {

// Computes one derived weight from its sources (undefined Tensors for absent optional sources). Kinds:
//   bn_fold_weight (W, gamma?, var; eps): W scaled along dim 0 by gamma / sqrt(var + eps)
//   bn_fold_bias (b?, gamma?, beta?, mean, var; eps): (b - mean) * gamma / sqrt(var + eps) + beta
// Results are fp32.
Tensor apply_weight_transform(const WeightTransform& transform, std::span<const Tensor> sources,
                              const std::string& name);

// Appends every derived weight a node or a graph output reads that `tensors` lacks, computed as resolve_weights
// computes it (sources from `tensors`, else the graph's constants; derived sources first). For executors that take
// a binding with every weight in it (the reference executor); backends call resolve_weights themselves.
void add_derived_weights(const Graph& graph, std::vector<std::pair<ValueId, Tensor>>& tensors);

// What a backend binds at prepare time: by ValueId, the value of every weight a node or a graph output reads (other
// entries undefined), taken from `binding`, else the graph's constants (by weight key or name), else computed by
// its transform. Fails naming the graph source and the weight (and who reads it) when a binding entry is not a
// weight or has the wrong shape, or a weight read has no value.
std::vector<Tensor> resolve_weights(const Graph& graph, const std::vector<std::pair<ValueId, Tensor>>& binding);

}  // namespace npusim
