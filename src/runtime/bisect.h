#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/pass.h"
#include "program/program.h"
#include "runtime/compare.h"
#include "runtime/reference_executor.h"

namespace npusim {

struct BisectStep {
  std::string pass;                        // the fusion enabled on top of the baseline ("" for the baseline)
  std::vector<Comparison> outputs;         // per graph output against the reference
  bool diverged = false;
  std::string first_node;                  // first node whose value diverges (when found)
  std::string first_node_op;
  std::optional<Comparison> first_node_comparison;
};

struct BisectResult {
  std::vector<BisectStep> steps;  // baseline, then one per fusion pass
  std::optional<size_t> first_bad;
};

struct BisectOptions {
  double min_pearson = 0.9999;
  double max_abs_relative = 1e-3;  // of the reference output's largest magnitude
  DType compute_dtype = DType::Float32;
};

// Weights for a compiled graph (derived weights included).
using BindWeights = std::function<std::vector<std::pair<ValueId, Tensor>>(const Graph&)>;

// Compiles with every fusion off (the baseline) and compares with the reference executor on the original graph;
// then enables each fusion of `passes` alone on top of the baseline and reports which diverge, and the first
// node (in program order, by value name) whose value differs from the reference.
BisectResult bisect_passes(const Graph& graph, const std::vector<compiler::Pass>& passes, const BindWeights& bind,
                           const std::map<std::string, Tensor>& inputs, const BisectOptions& options);

std::string format_bisect(const BisectResult& result);

}  // namespace npusim
