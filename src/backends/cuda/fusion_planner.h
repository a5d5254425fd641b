#pragma once
// Prepare-time fusion of the CUDA backend: runs of nodes that become one launch, the graph itself unchanged.
// Decode: linears reading one row run as one batched GEMV (a residual add that is a linear's only reader folded in,
// the rms_norm before them as its prologue), a gate and an up projection feeding a silu_mul as one gated GEMV, ropes
// and KV-cache writes as one launch. Prefill: the transposes around attention folded into the rope, the cache writes
// and the attention, and a residual add into the linear before it. Anywhere: runs of consecutive pointwise nodes as
// one generated kernel (pointwise_fusion.h).
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/cuda_ops.h"

namespace npusim::cuda {

// What the planner reads of a prepared program: its graph and where each value lives.
struct FusionSite {
  const Graph& graph;
  std::function<DeviceValue(ValueId)> value_at;
  std::function<bool(ValueId)> is_state;  // kept between runs and updated in place
  std::function<bool(ValueId)> is_view;   // aliases another value's memory
  std::function<OpContext(size_t)> context_of;
};

struct FusedLaunch {
  Launch launch;
  std::string label;  // the fused ops, e.g. "rms_norm+linear x3"
};

// By node: whether it runs inside another node's launch, and the fused launch that takes its place.
struct FusionPlan {
  std::vector<bool> fused_away;
  std::vector<std::optional<FusedLaunch>> launches;

  static FusionPlan none(size_t nodes) {
    return {std::vector<bool>(nodes, false), std::vector<std::optional<FusedLaunch>>(nodes)};
  }
};

// Plans every fusion over the whole graph (a fused GEMV can take in a normalization that comes before it).
FusionPlan plan_fusions(const FusionSite& site);

}  // namespace npusim::cuda
