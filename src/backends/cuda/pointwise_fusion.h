#pragma once
// Runs of consecutive pointwise nodes as one kernel generated at prepare time: the values passed between them stay
// in registers instead of making a round trip through memory, e.g. a GELU written out as pow, mul, add, tanh, mul.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/fusion_planner.h"

namespace npusim::cuda {

struct PointwiseRun {
  size_t last = 0;  // the run is nodes first..last; the launch takes the last one's place
  Launch launch;
  std::string label;  // the ops, e.g. "pow+mul+add+tanh"
};

// The longest run from node `first` on of at least two pointwise nodes, each the next node of the graph, all with
// the same output shape and float storage, whose values other than the last one's output are read only inside the
// run; nothing where there is none. `consumers` holds each value's readers (graph outputs as the node count);
// `taken` says which nodes another fusion already claimed.
std::optional<PointwiseRun> fuse_pointwise_run(const FusionSite& site, size_t first,
                                               const std::vector<std::vector<size_t>>& consumers,
                                               const std::function<bool(size_t)>& taken);

}  // namespace npusim::cuda
