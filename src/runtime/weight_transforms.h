#pragma once
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "npusim/graph.h"
#include "npusim/tensor.h"

namespace npusim {

// Computes one derived weight from its sources (undefined Tensors for absent optional sources). Kinds:
//   bn_fold_weight (W, gamma?, var; eps): W scaled along dim 0 by gamma / sqrt(var + eps)
//   bn_fold_bias (b?, gamma?, beta?, mean, var; eps): (b - mean) * gamma / sqrt(var + eps) + beta
// Results are fp32. Large results are written by `threads` threads (0: one per hardware thread).
Tensor apply_weight_transform(const WeightTransform& transform, std::span<const Tensor> sources,
                              const std::string& name, int threads = 0);

// The factor of each output channel (along dim 0 of W) of a bn_fold_weight transform, gamma / sqrt(var + eps), from
// its sources as apply_weight_transform takes them; fails naming `name` when var does not match the channels.
std::vector<double> bn_fold_scales(const WeightTransform& transform, std::span<const Tensor> sources, int64_t channels,
                                   const std::string& name);

// Row r of `weight` (fp32, rows along dim 0) multiplied by scales[r], each element rounded once from double:
// float(w * scale). What bn_fold_weight computes, for callers that fold a weight whose scales they already have.
Tensor scale_rows(const Tensor& weight, std::span<const double> scales, int threads = 0);

// Appends every derived weight a node or a graph output reads that `tensors` lacks, computed as resolve_weights
// computes it (sources from `tensors`, else the graph's constants; derived sources first). For executors that take
// a binding with every weight in it (the reference executor); backends call resolve_weights themselves.
void add_derived_weights(const Graph& graph, std::vector<std::pair<ValueId, Tensor>>& tensors);

struct ResolveOptions {
  int threads = 0;  // for computing derived weights; 0: one per hardware thread
  // Derived weights (not bound) to leave uncomputed: their entries stay undefined and the entries of their sources
  // are filled instead, so that a backend can fold them into a layout of its own while it copies the sources once.
  std::function<bool(ValueId)> leave_derived;
};

// What a backend binds at prepare time: by ValueId, the value of every weight a node or a graph output reads (other
// entries undefined), taken from `binding`, else the graph's constants (by weight key or name), else computed by
// its transform. Fails naming the graph source and the weight (and who reads it) when a binding entry is not a
// weight or has the wrong shape, or a weight read has no value.
std::vector<Tensor> resolve_weights(const Graph& graph, const std::vector<std::pair<ValueId, Tensor>>& binding,
                                    const ResolveOptions& options = {});

}  // namespace npusim
